"""2-D rotary position embedding (RoPE) of the patch tokens' queries and keys, in the two forms the released
ViTs use: DINOv3's (Simeoni et al. 2025; timm's `RotaryEmbeddingDinoV3`, transformers'
`DINOv3ViTRopePositionEmbedding`) and EVA-02's (Fang et al. 2023; timm's `RotaryEmbeddingCat`, also its
`vit_*_rope_*` models and Perception Encoder).

A head of size d is cut into d / 4 frequencies per axis, band k < d / 4 of frequency
`temperature ** (-k / (d / 4))` (DINOv3 names its inverse the period). A patch at row i, column j of an (h, w) grid has one coordinate per axis:
- "dinov3": y = 2 (i + 0.5) / h - 1 and x = 2 (j + 0.5) / w - 1 in [-1, 1], and the angles are
  2 pi y and 2 pi x times each band; the coordinates are normalised by the grid, so a model reads any size.
  In training they may be moved by DINOv3's shift / jitter / rescale (`keras_vit.layers.rotary_augment`).
- "eva": y = i + offset and x = j + offset, rescaled by `reference_grid` / (h, w) when given (the grid the
  model was pre-trained on: EVA-02's way of fine-tuning at another size), and the angles are y and x times
  each band.
The angles of one patch are (d / 2) values, one axis's bands after the other's (rows first, or columns first
with `axes="xy"`), laid out twice along the head ("rotate half": the first and second halves of a head rotate
as pairs). A query or key q of a patch becomes `q cos + rotate_half(q) sin` with `rotate_half(q) = [-q2, q1]`;
the prefix tokens (class, registers) are left as they are. EVA-02 pairs neighbouring channels instead
(2c, 2c + 1); its loader lays each head's query and key channels out as halves, which leaves q . k and so
the model unchanged (`keras_vit.weights.timm`)."""

import math

import keras
from keras import ops

ROPE_KINDS = ("dinov3", "eva", "mixed")
# each kind's keys and their defaults (the sources' own); "mixed": RoPE-Mixed's temperature sets the learned
# frequencies' first values only; "dinov3": shift, jitter and rescale are its training-time augmentation of the
# coordinates (`keras_vit.layers.rotary_augment`), None each (timm's; transformers' config rescales by 2)
ROPE_DEFAULTS = {"dinov3": {"temperature": 100.0, "shift": None, "jitter": None, "rescale": None},
                 "eva": {"temperature": 10000.0, "reference_grid": None, "offset": 0.0, "axes": "ij"},
                 "mixed": {"temperature": 10.0, "axes": "xy"}}
AUGMENTATION_KEYS = ("shift", "jitter", "rescale")  # a "dinov3" rope's training-time ones, in the sources' order


def _number(value, what, positive=True):
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (positive and not value > 0):
        raise ValueError(f"{what} must be a {'positive ' if positive else ''}number, got {value!r}")
    return float(value)


def check_rope(rope, what="rope"):
    """`rope` as a dict of its kind's keys (ROPE_DEFAULTS, the missing ones filled in), or None; a ValueError
    naming what was expected otherwise."""
    if rope is None:
        return None
    if not isinstance(rope, dict) or "kind" not in rope:
        raise ValueError(f"{what} must be None or a dict with the keys 'kind' and its kind's (e.g. {{'kind': 'dinov3', "
                         f"'temperature': 100.0}}), got {rope!r}")
    kind = rope["kind"]
    if kind not in ROPE_KINDS:
        raise ValueError(f"{what}: unknown kind {kind!r}; expected one of {ROPE_KINDS}")
    keys = ROPE_DEFAULTS[kind]
    if set(rope) - {"kind", *keys}:
        raise ValueError(f"{what}: the {kind!r} rotary embedding takes the keys {('kind', *keys)}, got {rope!r}")
    out = {"kind": kind, **keys, **{k: v for k, v in rope.items() if k != "kind"}}
    out["temperature"] = _number(out["temperature"], f"{what}: temperature")
    if kind in ("eva", "mixed") and out["axes"] not in ("ij", "xy"):
        raise ValueError(f"{what}: axes must be 'ij' (rows first) or 'xy' (columns first), got {out['axes']!r}")
    if kind == "dinov3":
        for key, least in zip(AUGMENTATION_KEYS, (0.0, 1.0, 1.0)):
            value = out[key]
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                      or not least <= value < math.inf):
                raise ValueError(f"{what}: {key} must be None or a finite number >= {least:g}, got {value!r}")
            out[key] = None if value is None else float(value)
    if kind == "eva":
        out["offset"] = _number(out["offset"], f"{what}: offset", positive=False)
        if out["axes"] not in ("ij", "xy"):
            raise ValueError(f"{what}: axes must be 'ij' (rows first) or 'xy' (columns first), got {out['axes']!r}")
        grid = out["reference_grid"]
        if grid is not None:
            if not isinstance(grid, (list, tuple)) or len(grid) != 2 or not all(
                    isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in grid):
                raise ValueError(f"{what}: reference_grid must be None or an (h, w) pair of positive ints, "
                                 f"got {grid!r}")
            out["reference_grid"] = tuple(grid)
    return out


def check_rope_head_dim(head_dim):
    """Raises unless heads of size `head_dim` can be rotated (d / 4 frequencies per axis)."""
    if head_dim % 4:
        raise ValueError(f"rotary position embedding cuts each head into 4 quarters (2 axes x sin/cos pairs); "
                         f"head size {head_dim} is not a multiple of 4")


def rope_augmented(rope):
    """Whether `rope` (`check_rope`'s dict, or None) moves its coordinates in training (DINOv3's shift, jitter or
    rescale)."""
    return rope is not None and any(rope.get(key) is not None for key in AUGMENTATION_KEYS)


def without_augmentation(rope):
    """`rope` (`check_rope`'s dict, or None) without its training-time augmentation: what a model computes in
    evaluation, and so what its weights are for."""
    return None if rope is None else {k: v for k, v in rope.items() if k not in AUGMENTATION_KEYS}


def _axis(n, rope, reference=None, moved=None):
    """The coordinates of `n` positions along one axis (a Python int or a scalar tensor) by `rope`'s kind, with
    `reference` that axis's side of an "eva" rope's reference grid and `moved` (3,) that axis's (shift, jitter,
    rescale) of a "dinov3" rope in training (`RotaryAugment`)."""
    positions = ops.cast(ops.arange(n), "float32")  # before the cast of n: JAX needs a concrete stop
    if rope["kind"] == "dinov3":
        coords = 2.0 * ((positions + 0.5) / ops.cast(n, "float32")) - 1.0
        return coords if moved is None else (coords + moved[0]) * moved[1] * moved[2]  # the sources' order
    positions = positions + rope["offset"]
    return positions if reference is None else positions / ops.cast(n, "float32") * float(reference)


def rope_tables(grid_h, grid_w, head_dim, rope, moved=None):
    """(sin, cos), each (grid_h * grid_w, head_dim) float32, of the patches of a `grid_h` x `grid_w` grid in
    raster order, for heads of `head_dim` and the rotary embedding `rope` (`check_rope`'s dict); the grid sides
    may be tensors (a grid read off the images at call time). `moved`: None, or a "dinov3" rope's draw of its
    training-time augmentation, (3, 2) float32 (`RotaryAugment`): the rows' and the columns' coordinates c
    become (c + shift) * jitter * rescale."""
    quarter = head_dim // 4
    k = ops.cast(ops.arange(quarter), "float32")
    if rope["kind"] == "dinov3":  # in each source's order of operations: the same float32 roundings
        periods = ops.power(rope["temperature"], 2.0 * k / (head_dim // 2))
        angles = lambda coords: 2.0 * math.pi * coords[:, None] / periods[None, :]  # noqa: E731
    else:
        bands = 1.0 / ops.power(rope["temperature"], k / quarter)
        angles = lambda coords: coords[:, None] * bands[None, :]  # noqa: E731
    reference = rope.get("reference_grid") or (None, None)
    moved = (None, None) if moved is None else (moved[:, 0], moved[:, 1])
    rows = angles(_axis(grid_h, rope, reference[0], moved[0]))  # (h, d/4)
    cols = angles(_axis(grid_w, rope, reference[1], moved[1]))
    shape = (ops.shape(rows)[0], ops.shape(cols)[0], quarter)
    rows, cols = ops.broadcast_to(rows[:, None, :], shape), ops.broadcast_to(cols[None, :, :], shape)
    first, second = (cols, rows) if rope.get("axes") == "xy" else (rows, cols)
    angles = ops.reshape(ops.concatenate([first, second], axis=-1), (-1, 2 * quarter))
    sin, cos = ops.sin(angles), ops.cos(angles)
    return ops.concatenate([sin, sin], axis=-1), ops.concatenate([cos, cos], axis=-1)


def mixed_rope_tables(grid_h, grid_w, freqs, axes="xy"):
    """(sin, cos), each (grid_h * grid_w, heads, head_dim) float32, of RoPE-Mixed (Heo et al. 2024; timm's
    `RotaryEmbeddingMixed`): each head's angles are x fx + y fy of the patch's column x and row y (grid indices) and
    its learned frequencies `freqs` (2, heads, head_dim / 2), the x ones first; laid out twice along the head as the
    other kinds' ("rotate half")."""
    rows = ops.cast(ops.arange(grid_h), "float32")
    cols = ops.cast(ops.arange(grid_w), "float32")
    shape = (ops.shape(rows)[0], ops.shape(cols)[0])
    y = ops.reshape(ops.broadcast_to(rows[:, None], shape), (-1,))
    x = ops.reshape(ops.broadcast_to(cols[None, :], shape), (-1,))
    if axes == "ij":  # the first frequencies read the rows
        x, y = y, x
    freqs = ops.cast(freqs, "float32")
    angles = x[:, None, None] * freqs[0][None] + y[:, None, None] * freqs[1][None]  # (N, heads, head_dim / 2)
    sin, cos = ops.sin(angles), ops.cos(angles)
    return ops.concatenate([sin, sin], axis=-1), ops.concatenate([cos, cos], axis=-1)


def mixed_rope_frequencies(heads, head_dim, temperature, angles):
    """RoPE-Mixed's first frequencies (2, heads, head_dim / 2): band k < head_dim / 4 of magnitude
    temperature^(-4k / head_dim), turned by each head's angle `angles` (heads,) and by a further right angle for
    the second half, as its paper's initialisation."""
    bands = 1.0 / ops.power(float(temperature), ops.cast(ops.arange(0, head_dim, 4), "float32") / head_dim)
    turn = ops.reshape(ops.cast(angles, "float32"), (heads, 1))
    fx = ops.concatenate([bands * ops.cos(turn), bands * ops.cos(turn + math.pi / 2)], axis=-1)
    fy = ops.concatenate([bands * ops.sin(turn), bands * ops.sin(turn + math.pi / 2)], axis=-1)
    return ops.stack([fx, fy])


def rotate_patches(x, sin, cos, num_prefix_tokens):
    """`x` (B, T, heads, head_dim) with its tokens after the first `num_prefix_tokens` rotated by the
    tables `sin` and `cos` (T - prefix, head_dim), or per head (T - prefix, heads, head_dim), computed in float32
    and cast back to x's dtype."""
    if num_prefix_tokens and keras.backend.backend() == "tensorflow":
        # the prefix tokens turned by no angle (cos 1, sin 0), the same values, instead of sliced off and joined
        # again: TensorFlow's gradients of that slice and join cost more than the rotation (benchmarks/README.md)
        sin, cos = (ops.concatenate([ops.full((num_prefix_tokens, *t.shape[1:]), fill, t.dtype), t], axis=0)
                    for t, fill in ((sin, 0.0), (cos, 1.0)))
        return _rotated(x, sin, cos)
    return ops.concatenate([x[:, :num_prefix_tokens], _rotated(x[:, num_prefix_tokens:], sin, cos)], axis=1)


def _rotated(x, sin, cos):
    """`x` (B, T, heads, head_dim) rotated by the tables (T, head_dim) or (T, heads, head_dim), in float32."""
    half = x.shape[-1] // 2
    p = ops.cast(x, "float32")
    rotated = ops.concatenate([-p[..., half:], p[..., :half]], axis=-1)
    if len(cos.shape) == 2:  # one table for every head
        sin, cos = sin[:, None, :], cos[:, None, :]
    return ops.cast(p * cos[None] + rotated * sin[None], x.dtype)
