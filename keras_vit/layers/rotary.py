"""2-D rotary position embedding (RoPE) of the patch tokens' queries and keys, in DINOv3's form
(Simeoni et al. 2025; timm's `RotaryEmbeddingDinoV3`, transformers' `DINOv3ViTRopePositionEmbedding`).

Each patch at row i, column j of an (h, w) grid has the coordinates y = 2 (i + 0.5) / h - 1 and
x = 2 (j + 0.5) / w - 1 in [-1, 1]. A head of size d is cut into d / 4 frequencies per axis, of periods
`temperature ** (2 k / (d / 2))`, k < d / 4; the angles are 2 pi y / period and 2 pi x / period, the
y ones first, (h w, d / 2), laid out twice along the head ("rotate half": the first and second halves
of a head rotate as pairs). A query or key q of a patch becomes `q cos + rotate_half(q) sin` with
`rotate_half(q) = [-q2, q1]`; the prefix tokens (class, registers) are left as they are. The tables
depend on the grid only, so a model of another image size reads them for its own grid: the
coordinates are normalised by the grid, which is what lets DINOv3 run at any resolution."""

import math

from keras import ops

ROPE_KINDS = ("dinov3",)
ROPE_KEYS = ("kind", "temperature")


def check_rope(rope, what="rope"):
    """`rope` as a dict {"kind": one of ROPE_KINDS, "temperature": float > 0}, or None; a ValueError
    naming what was expected otherwise."""
    if rope is None:
        return None
    if not isinstance(rope, dict) or set(rope) - set(ROPE_KEYS) or "kind" not in rope:
        raise ValueError(f"{what} must be None or a dict with the keys {ROPE_KEYS} (e.g. {{'kind': 'dinov3', "
                         f"'temperature': 100.0}}), got {rope!r}")
    if rope["kind"] not in ROPE_KINDS:
        raise ValueError(f"{what}: unknown kind {rope['kind']!r}; expected one of {ROPE_KINDS}")
    temperature = rope.get("temperature", 100.0)
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or not temperature > 0:
        raise ValueError(f"{what}: temperature must be a positive number, got {temperature!r}")
    return {"kind": rope["kind"], "temperature": float(temperature)}


def check_rope_head_dim(head_dim):
    """Raises unless heads of size `head_dim` can be rotated (d / 4 frequencies per axis)."""
    if head_dim % 4:
        raise ValueError(f"rotary position embedding cuts each head into 4 quarters (2 axes x sin/cos pairs); "
                         f"head size {head_dim} is not a multiple of 4")


def _axis(n):
    """DINOv3's coordinates of `n` positions along one axis (a Python int or a scalar tensor), in [-1, 1]."""
    positions = ops.cast(ops.arange(n), "float32")  # before the cast of n: JAX needs a concrete stop
    return 2.0 * ((positions + 0.5) / ops.cast(n, "float32")) - 1.0


def rope_tables(grid_h, grid_w, head_dim, temperature):
    """(sin, cos), each (grid_h * grid_w, head_dim) float32, of the patches of a `grid_h` x `grid_w` grid in
    raster order, for heads of `head_dim` and periods of base `temperature`; the grid sides may be tensors (a
    grid read off the images at call time)."""
    quarter = head_dim // 4
    periods = ops.power(float(temperature), 2.0 * ops.cast(ops.arange(quarter), "float32") / (head_dim // 2))
    rows = 2.0 * math.pi * _axis(grid_h)[:, None] / periods[None, :]  # (h, d/4)
    cols = 2.0 * math.pi * _axis(grid_w)[:, None] / periods[None, :]  # (w, d/4)
    shape = (ops.shape(rows)[0], ops.shape(cols)[0], quarter)
    angles = ops.concatenate([ops.broadcast_to(rows[:, None, :], shape), ops.broadcast_to(cols[None, :, :], shape)],
                             axis=-1)
    angles = ops.reshape(angles, (-1, 2 * quarter))
    sin, cos = ops.sin(angles), ops.cos(angles)
    return ops.concatenate([sin, sin], axis=-1), ops.concatenate([cos, cos], axis=-1)


def rotate_patches(x, sin, cos, num_prefix_tokens):
    """`x` (B, T, heads, head_dim) with its tokens after the first `num_prefix_tokens` rotated by the
    tables `sin` and `cos` (T - prefix, head_dim), computed in float32 and cast back to x's dtype."""
    prefix, patches = x[:, :num_prefix_tokens], x[:, num_prefix_tokens:]
    half = patches.shape[-1] // 2
    p = ops.cast(patches, "float32")
    rotated = ops.concatenate([-p[..., half:], p[..., :half]], axis=-1)
    p = p * cos[None, :, None, :] + rotated * sin[None, :, None, :]
    return ops.concatenate([prefix, ops.cast(p, x.dtype)], axis=1)
