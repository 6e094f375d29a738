"""Interpolation as matrices (pure numpy): resizing along one axis is a product with an
(n_out, n_in) matrix, and 2-D resizing is one such product per axis.

Position embeddings are resized by different rules depending on where the weights come from; each
rule is one name of `POSITION_INTERPOLATIONS`, and `resize_matrix` builds its matrix:

- "bilinear": the official ViT rule, linear with the corners aligned (`scipy.ndimage.zoom(order=1)`).
- "bilinear_half_pixel": linear on cell centres, edges clamped (torch `F.interpolate(mode="bilinear",
  align_corners=False)`, timm's loader of official .npz files).
- "bicubic": torch `F.interpolate(mode="bicubic", align_corners=False)`: Keys' cubic with A=-0.75
  on cell centres, taps past an edge clamped to it (Hugging Face ViT, DeiT, DINOv2, CLIP, SigLIP).
- "bicubic_antialias": the same call with `antialias=True` (timm's default, Hugging Face's
  DINOv2-with-registers): a PIL-style filter, A=-0.5, widened by the factor when downsampling, its
  taps cut off at the edges and the remaining weights renormalised.
- "bilinear_antialias": torch `F.interpolate(mode="bilinear", align_corners=False, antialias=True)`
  (Hugging Face's SigLIP 2): the same filter with the triangle for the cubic.
"""

import numpy as np

POSITION_INTERPOLATIONS = ("bilinear", "bilinear_half_pixel", "bicubic", "bicubic_antialias", "bilinear_antialias")


def check_interpolation(method, what="interpolation"):
    """`method` if it names a rule of `POSITION_INTERPOLATIONS`, else a ValueError listing them."""
    if method not in POSITION_INTERPOLATIONS:
        choices = ", ".join(repr(m) for m in POSITION_INTERPOLATIONS)
        raise ValueError(f"{what} must be one of {choices}; got {method!r}")
    return method


def linear_resize_matrix(n_in, n_out, align_corners=True, method="linear"):
    """(n_out, n_in) matrix that resamples a 1-D signal of `n_in` samples to `n_out`.

    align_corners=True puts the first and last samples of both grids on each other (what
    `scipy.ndimage.zoom(order=1)` and the official position-embedding resize do); False treats
    samples as cell centres (half-pixel, edges clamped), as image resizing does. method "nearest"
    (half-pixel only) picks the nearest input sample.
    """
    if method not in ("linear", "nearest"):
        raise ValueError(f"method must be 'linear' or 'nearest', got {method!r}")
    matrix = np.zeros((n_out, n_in), dtype=np.float64)
    rows = np.arange(n_out)
    if align_corners:
        pos = rows * ((n_in - 1) / (n_out - 1)) if n_out > 1 else np.zeros(1)
    else:
        pos = (rows + 0.5) * (n_in / n_out) - 0.5
    if method == "nearest":
        matrix[rows, np.clip(np.floor(pos + 0.5).astype(int), 0, n_in - 1)] = 1.0
        return matrix
    pos = np.clip(pos, 0.0, n_in - 1)
    lo = np.floor(pos).astype(int)
    hi = np.minimum(lo + 1, n_in - 1)
    frac = pos - lo
    np.add.at(matrix, (rows, lo), 1.0 - frac)
    np.add.at(matrix, (rows, hi), frac)
    return matrix


def geometric_resize_matrix(n_in, n_out):
    """(n_out, n_in) matrix of BEiT's resize of a relative-offset axis (its fine-tuning code, timm's
    `resize_rel_pos_bias_table` without scipy): the n_in source offsets sit at 0, +-1, +-(1 + q),
    +-(1 + q + q^2), ..., q found by bisection in [1.01, 1.5] so that the progression reaches the target's
    last offset n_out // 2; each target offset -(n_out // 2) ... n_out // 2 is interpolated linearly between
    the two source offsets around it, clamped at the ends. Positions and distances in float32, as timm's."""
    left, right = 1.01, 1.5
    while right - left > 1e-6:  # timm's loop, in float64: its last midpoint is the ratio
        q = (left + right) / 2.0
        if (1.0 - q ** (n_in // 2)) / (1.0 - q) > n_out // 2:
            right = q
        else:
            left = q
    steps = np.cumsum([1.0] + [q ** (i + 1) for i in range(n_in // 2 - 1)]) if n_in // 2 else np.zeros(0)
    source = np.concatenate([-steps[::-1], [0.0], steps]).astype(np.float32)
    target = np.arange(-(n_out // 2), n_out // 2 + 0.1, 1.0, dtype=np.float32)
    hi = np.minimum(np.searchsorted(source, target, side="left"), n_in - 1)
    lo = np.clip(hi - 1, 0, n_in - 1)
    to_lo, to_hi = np.maximum(target - source[lo], 0), np.maximum(source[hi] - target, 0)
    same = (to_lo == 0) & (to_hi == 0)
    to_lo[same] = to_hi[same] = 1.0
    matrix = np.zeros((n_out, n_in), dtype=np.float64)
    rows = np.arange(n_out)
    np.add.at(matrix, (rows, lo), to_hi / (to_lo + to_hi))
    np.add.at(matrix, (rows, hi), to_lo / (to_lo + to_hi))
    return matrix


def cubic_kernel(x, a):
    """Keys' cubic convolution kernel with parameter `a` at offsets `x` (zero from |x| = 2 on)."""
    x = np.abs(np.asarray(x, dtype=np.float64))
    near = ((a + 2) * x - (a + 3)) * x * x + 1
    far = ((a * x - 5 * a) * x + 8 * a) * x - 4 * a
    return np.where(x < 1, near, np.where(x < 2, far, 0.0))


def resize_matrix(n_in, n_out, method="bilinear"):
    """(n_out, n_in) matrix of the position-embedding rule `method` (see `POSITION_INTERPOLATIONS`)."""
    check_interpolation(method)
    n_in, n_out = int(n_in), int(n_out)
    if n_in < 1 or n_out < 1:
        raise ValueError(f"sizes must be positive, got {n_in} -> {n_out}")
    if method in ("bilinear", "bilinear_half_pixel"):
        return linear_resize_matrix(n_in, n_out, align_corners=method == "bilinear")
    scale = n_in / n_out
    rows = np.arange(n_out)
    if method.endswith("_antialias"):
        # every input sample j sits at j + 0.5, output i covers [i, i + 1) * scale around its centre
        stretch = max(scale, 1.0)
        offsets = (np.arange(n_in)[None, :] + 0.5 - (rows[:, None] + 0.5) * scale) / stretch
        weights = cubic_kernel(offsets, -0.5) if method == "bicubic_antialias" else np.maximum(1 - np.abs(offsets), 0)
        return weights / weights.sum(axis=1, keepdims=True)
    pos = (rows + 0.5) * scale - 0.5
    taps = np.floor(pos).astype(int)[:, None] + np.arange(-1, 3)[None, :]
    matrix = np.zeros((n_out, n_in), dtype=np.float64)
    np.add.at(matrix, (np.repeat(rows, 4), np.clip(taps, 0, n_in - 1).ravel()),
              cubic_kernel(pos[:, None] - taps, -0.75).ravel())
    return matrix


def resize_2d(grid, size, align_corners=None, method="linear"):
    """Resizes the two leading axes of `grid` ((h, w, ...) array) to `size` = (new_h, new_w).

    method "linear" or "nearest" resamples images (`linear_resize_matrix`, align_corners True when
    None); a name of `POSITION_INTERPOLATIONS` applies that rule, which fixes its own alignment.
    """
    grid = np.asarray(grid, dtype=np.float64)
    if method in POSITION_INTERPOLATIONS:
        if align_corners is not None:
            raise ValueError(f"interpolation {method!r} fixes its own alignment; leave align_corners=None")
        rows, cols = (resize_matrix(n, m, method) for n, m in zip(grid.shape[:2], size))
    else:
        align_corners = True if align_corners is None else align_corners
        rows, cols = (linear_resize_matrix(n, m, align_corners, method) for n, m in zip(grid.shape[:2], size))
    return np.einsum("ih,hw...,jw->ij...", rows, grid, cols)
