"""Linear interpolation as matrices (pure numpy): resizing along one axis is a product with an
(n_out, n_in) matrix, and 2-D bilinear resizing is one such product per axis."""

import numpy as np


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


def resize_2d(grid, size, align_corners=True, method="linear"):
    """Resizes the two leading axes of `grid` ((h, w, ...) array) to `size` = (new_h, new_w)."""
    grid = np.asarray(grid, dtype=np.float64)
    rows = linear_resize_matrix(grid.shape[0], size[0], align_corners, method)
    cols = linear_resize_matrix(grid.shape[1], size[1], align_corners, method)
    return np.einsum("ih,hw...,jw->ij...", rows, grid, cols)
