"""Learnable 1D position embeddings, and their 2D resize for another resolution (paper 3.2)."""

import math

import keras
import numpy as np
from keras import ops

from keras_vit.interpolation import check_interpolation, resize_2d
from keras_vit.layers.initial import initial


def resize_position_embeddings(posemb, new_grid, old_grid=None, num_prefix_tokens=1, method="bilinear",
                               aspect_preserving=False):
    """Resizes (1, prefix + gh*gw, D) position embeddings to a (new_h, new_w) patch grid.

    The prefix ([class] token) entries are kept as they are; the grid part is resampled, each axis
    by its own factor, and flattened row-major again. method "bilinear" is the official rule
    (corners aligned, what `scipy.ndimage.zoom(order=1)` does); the other names of
    `keras_vit.interpolation.POSITION_INTERPOLATIONS` are the rules of timm ("bicubic_antialias")
    and Hugging Face ("bicubic"; DINOv2 with registers: "bicubic_antialias"), exact to theirs.

    Args:
        posemb: array (1, T, D).
        new_grid: (new_h, new_w) patch grid of the target model.
        old_grid: (gh, gw) of `posemb`; inferred as square when None.
        num_prefix_tokens: 1 with a class token, 0 for `classifier="gap"` models.
        method: a name of `POSITION_INTERPOLATIONS`, the rule of the weights' source.
        aspect_preserving: resize the grid to a square of the longer side, then keep its top-left
            (new_h, new_w) (timm's `pos_embed_ar_preserving`, its NaFlex "par" models).
    Returns:
        float array (1, num_prefix_tokens + new_h * new_w, D) in posemb's dtype.
    """
    check_interpolation(method, what="method")
    posemb = np.asarray(posemb)
    if posemb.ndim != 3 or posemb.shape[0] != 1:
        raise ValueError(f"position embeddings must have shape (1, T, D), got {posemb.shape}")
    prefix, grid = posemb[:, :num_prefix_tokens], posemb[0, num_prefix_tokens:]
    n = grid.shape[0]
    if old_grid is None:
        side = math.isqrt(n)
        if side * side != n:
            raise ValueError(
                f"cannot infer the patch grid of {n} position embeddings (not a square); pass old_grid=(h, w)"
            )
        old_grid = (side, side)
    gh, gw = (int(v) for v in old_grid)
    nh, nw = (int(v) for v in new_grid)
    if gh * gw != n:
        raise ValueError(f"old_grid {old_grid} holds {gh * gw} positions but the embeddings have {n}")
    if (gh, gw) == (nh, nw):
        return posemb.copy()
    side = max(nh, nw)
    out = resize_2d(grid.reshape(gh, gw, -1), (side, side) if aspect_preserving else (nh, nw), method=method)
    out = out[:nh, :nw].reshape(1, nh * nw, -1).astype(posemb.dtype)
    return np.concatenate([prefix, out], axis=1)


def _linear_taps_ops(pos, old):
    """(..., old) weights that read each position of `pos` (float32, in [0, old - 1]) linearly
    between its two neighbouring inputs."""
    # clipped as floats: TensorFlow's converter makes a clip of int32 to [0, 6] a Relu6, which LiteRT runs on
    # floats only
    lo = ops.cast(ops.floor(ops.clip(pos, 0.0, float(old - 1))), "int32")
    hi = ops.minimum(lo + 1, old - 1)
    frac = ops.expand_dims(pos - ops.cast(lo, "float32"), -1)
    return ops.one_hot(lo, old) * (1.0 - frac) + ops.one_hot(hi, old) * frac


def _cubic_kernel_ops(x, a):
    """`keras_vit.interpolation.cubic_kernel` with keras.ops."""
    x = ops.abs(x)
    near = ((a + 2) * x - (a + 3)) * x * x + 1
    far = ((a * x - 5 * a) * x + 8 * a) * x - 4 * a
    return ops.where(x < 1, near, ops.where(x < 2, far, ops.zeros_like(x)))


def resize_weights(old, rows, new, method):
    """The rows `rows` of `keras_vit.interpolation.resize_matrix(old, new, method)`, with keras.ops
    (float32): `old` an int (the antialiased rules: or a scalar tensor), `rows` a tensor of output indices (any shape), `new` the output size, an
    int or a tensor broadcastable to `rows` (each row its own size: a NaFlex batch's images).
    Returns (*rows.shape, old)."""
    rows = ops.cast(rows, "float32")
    scale = ops.cast(old, "float32") / ops.cast(new, "float32")
    if method == "bilinear":  # corners aligned
        step = ops.cast(old - 1, "float32") / ops.maximum(ops.cast(new, "float32") - 1.0, 1.0)
        return _linear_taps_ops(rows * step, old)
    if method.endswith("_antialias"):  # the filter at every input, stretched when shrinking, rows normalised
        scale = ops.expand_dims(scale * ops.ones_like(rows), -1)
        inputs = ops.cast(ops.arange(old), "float32")
        offsets = (inputs + 0.5 - (ops.expand_dims(rows, -1) + 0.5) * scale) / ops.maximum(scale, 1.0)
        weights = _cubic_kernel_ops(offsets, -0.5) if method == "bicubic_antialias" \
            else ops.maximum(1.0 - ops.abs(offsets), 0.0)
        return weights / ops.sum(weights, axis=-1, keepdims=True)
    pos = (rows + 0.5) * scale - 0.5
    if method == "bilinear_half_pixel":
        return _linear_taps_ops(ops.clip(pos, 0.0, float(old - 1)), old)
    floor = ops.floor(pos)  # "bicubic": four taps around pos, the ones past an edge clamped onto it
    weights = 0.0
    for k in range(4):
        weight = ops.expand_dims(_cubic_kernel_ops(pos - floor + float(1 - k), -0.75), -1)
        tap = ops.cast(ops.clip(floor + float(k - 1), 0.0, float(old - 1)), "int32")  # as floats: see _linear_taps_ops
        weights = weights + ops.one_hot(tap, old) * weight
    return weights


def antialias_bicubic_matrix(old, new):
    """(new, old) float32 matrix of bicubic resizing (a = -0.5, half-pixel centres), antialiased when
    shrinking (the kernel stretched by the factor): torch's `interpolate(mode="bicubic", antialias=True)`,
    with keras.ops; `old` and `new` ints or scalar tensors known only at call time. Dense: the kernel at
    every input, zero outside its support, each row normalised to sum 1."""
    return _resize_matrix_ops(old, new, "bicubic_antialias")


def _resize_matrix_ops(old, new, method):
    """`keras_vit.interpolation.resize_matrix(old, new, method)` with keras.ops (float32): `old` is an
    int, `new` an int or a scalar tensor known only at call time."""
    return resize_weights(old, ops.arange(new), new, method)


def valid_coordinates(patch_coord, patch_valid=None):
    """`patch_coord` (B, N, 2) as int32, (0, 0) where `patch_valid` (B, N) is False: the padding reads
    the first position, whatever its coordinates held."""
    coord = ops.cast(patch_coord, "int32")
    if patch_valid is None:
        return coord
    return ops.where(ops.expand_dims(patch_valid, -1), coord, ops.zeros_like(coord))


def naflex_grids(patch_coord, patch_valid=None):
    """(B, 2) int32: each NaFlex image's (rows, cols) of patches, one more than its largest valid
    (row, col) in `patch_coord` (B, N, 2); `patch_valid` (B, N) bool, None: all valid."""
    return ops.max(valid_coordinates(patch_coord, patch_valid), axis=1) + 1


def resize_sizes(grid, aspect_preserving):
    """The sizes a (h, w) grid is resized to, per axis: (h, w), or the longer side twice with
    `aspect_preserving` (the grid then the top-left of that square). `grid`: a pair of ints or
    scalars, or a (..., 2) tensor."""
    if isinstance(grid, (tuple, list)):
        return (max(grid),) * 2 if aspect_preserving and all(isinstance(v, int) for v in grid) \
            else (ops.maximum(*grid),) * 2 if aspect_preserving else tuple(grid)
    return ops.repeat(ops.max(grid, axis=-1, keepdims=True), 2, axis=-1) if aspect_preserving else grid


def runtime_grid(images, stride):
    """(gh, gw) of `images` (B, H, W, C) cut into `stride`-pixel tokens: ints where the size is known
    when traced, scalar tensors where it is not; a clear error when a known side does not tile."""
    shape = ops.shape(images)
    for axis, size in (("height", images.shape[1]), ("width", images.shape[2])):
        if isinstance(size, int) and size % stride:  # not a size only known when run (None, or JAX's symbolic)
            raise ValueError(
                f"image {axis} {size} is not divisible by {stride} pixels per token (patch size x ResNet "
                f"stride); got images of shape {tuple(images.shape)}, use a multiple of {stride}"
            )
    return tuple(d // stride if isinstance(d, int) else s // stride for d, s in zip(images.shape[1:3], shape[1:3]))


def is_grid(grid, grid_size):
    """Whether `grid` (ints, or scalar tensors where a call's size is known only when run) is known, when traced,
    to be the (h, w) `grid_size`: a table laid out for it is read as it is."""
    return all(isinstance(v, int) for v in grid) and tuple(grid) == tuple(grid_size)


@keras.saving.register_keras_serializable(package="keras_vit")
class AddPositionEmbs(keras.layers.Layer):
    """Adds learnable position embeddings (official `Transformer/posembed_input/pos_embedding`).

    With `stride` set, the layer serves any resolution: called as `layer(tokens, images)`, it
    resizes the stored (gh, gw) grid at call time to the images' (H / stride, W / stride) grid by
    the rule `interpolation` of `resize_position_embeddings` (prefix entries kept, each axis by its
    own factor), as two interpolation matrices applied with keras.ops.

    Args:
        grid_size: (gh, gw), the patch grid the embeddings are laid out on (the trained grid).
        num_prefix_tokens: tokens before the grid (1 for the [class] token, 0 for "gap" models).
        stride: None (fixed resolution), or the pixels per token along each axis of the images
            passed as the second argument (patch size times the ResNet stride).
        interpolation: how the grid is resized, at load time (`resize_official`) and at call time:
            a name of `keras_vit.interpolation.POSITION_INTERPOLATIONS`, the rule of the source of
            the weights ("bilinear": official; "bicubic_antialias": timm; "bicubic": Hugging Face).
        aspect_preserving: resize to a square of the longer side and keep the top-left grid (timm's
            `pos_embed_ar_preserving`), instead of each axis by its own factor.

    Called as `layer(tokens, patch_coord=..., patch_valid=...)` on a NaFlex batch (prefix tokens,
    then N patch tokens of images of different grids, padded), it adds to each patch the embedding
    of its (row, col) in its own image's grid, (max row + 1, max col + 1) of its valid patches, by
    the same rule: the embeddings a model built at that image's size adds.
    """

    def __init__(self, grid_size, num_prefix_tokens=1, stride=None, interpolation="bilinear", aspect_preserving=False,
                 **kwargs):
        super().__init__(**kwargs)
        self.interpolation = check_interpolation(interpolation, what="AddPositionEmbs interpolation")
        self.aspect_preserving = bool(aspect_preserving)
        self.grid_size = tuple(int(v) for v in grid_size)
        self.num_prefix_tokens = int(num_prefix_tokens)
        self.stride = None if stride is None else int(stride)
        if self.stride is not None and self.stride < 1:
            raise ValueError(f"stride must be None or a positive int, got {stride!r}")
        self.input_spec = None if self.stride else keras.InputSpec(ndim=3)

    @property
    def num_tokens(self):
        return self.num_prefix_tokens + self.grid_size[0] * self.grid_size[1]

    def _check(self, shape):
        if shape[1] is not None and shape[1] != self.num_tokens:
            raise ValueError(
                f"AddPositionEmbs expects {self.num_tokens} tokens ({self.num_prefix_tokens} prefix + "
                f"{self.grid_size[0]}x{self.grid_size[1]} grid), got input shape {tuple(shape)}: the image "
                "size differs from the model's image_size (resize the images, or build the model at this "
                "size; weights= resizes the position embeddings)."
            )

    def build(self, tokens_shape, images_shape=None, patch_coord_shape=None, patch_valid_shape=None):
        if patch_coord_shape is not None:
            pass
        elif self.stride is None:
            self._check(tokens_shape)
        elif images_shape is None:
            raise ValueError("AddPositionEmbs with a stride is called as layer(tokens, images)")
        self.pos_embedding = self.add_weight(
            name="pos_embedding",
            shape=(1, self.num_tokens, tokens_shape[-1]),
            initializer=initial(keras.initializers.RandomNormal(stddev=0.02)),
        )

    def call(self, tokens, images=None, patch_coord=None, patch_valid=None):
        if patch_coord is not None:
            return tokens + ops.cast(self.at(patch_coord, patch_valid), tokens.dtype)
        if self.stride is None:
            self._check(tokens.shape)
            return tokens + ops.cast(self.pos_embedding, tokens.dtype)
        if images is None:
            raise ValueError("AddPositionEmbs with a stride is called as layer(tokens, images)")
        return tokens + ops.cast(self.resized(runtime_grid(images, self.stride)), tokens.dtype)

    def _table(self):
        """(prefix entries (1, prefix, D), the grid (gh, gw, D)) in float32."""
        posemb = ops.cast(self.pos_embedding, "float32")
        return posemb[:, :self.num_prefix_tokens], ops.reshape(posemb[0, self.num_prefix_tokens:], (*self.grid_size, -1))

    def resized(self, grid):
        """The embeddings for a (new_h, new_w) grid (ints or scalar tensors), computed with ops."""
        if is_grid(grid, self.grid_size):
            return self.pos_embedding
        prefix, table = self._table()
        sizes = resize_sizes(grid, self.aspect_preserving)
        rows, cols = (resize_weights(old, ops.arange(new), size, self.interpolation)
                      for old, new, size in zip(self.grid_size, grid, sizes))
        table = ops.einsum("ih,hwd,jw->ijd", rows, table, cols)
        return ops.concatenate([prefix, ops.reshape(table, (1, -1, ops.shape(table)[-1]))], axis=1)

    def at(self, patch_coord, patch_valid=None):
        """(B, prefix + N, D): the prefix entries, then the embedding of each patch at `patch_coord`
        (B, N, 2) (row, col) in its image's grid (see `naflex_grids`), for a NaFlex batch."""
        prefix, table = self._table()
        grids = naflex_grids(patch_coord, patch_valid)
        if self.aspect_preserving:  # an image on the table's own grid takes it as it is (timm's rule)
            own = ops.all(grids == ops.convert_to_tensor(self.grid_size, "int32"), axis=-1, keepdims=True)
            grids = ops.where(own, grids, resize_sizes(grids, True))
        coord = valid_coordinates(patch_coord, patch_valid)
        rows, cols = (resize_weights(old, coord[..., i], grids[..., i:i + 1], self.interpolation)
                      for i, old in enumerate(self.grid_size))
        both = ops.reshape(rows[..., :, None] * cols[..., None, :], (*ops.shape(rows)[:2], -1))
        patches = ops.matmul(both, ops.reshape(table, (-1, ops.shape(table)[-1])))
        prefix = ops.broadcast_to(prefix, (ops.shape(patches)[0], self.num_prefix_tokens, ops.shape(patches)[-1]))
        return ops.concatenate([prefix, patches], axis=1)

    def compute_output_shape(self, tokens_shape, images_shape=None, patch_coord_shape=None, patch_valid_shape=None):
        return tokens_shape

    def official_weights(self):
        return {"pos_embedding": self.pos_embedding}

    def resize_official(self, name, value):
        """`value` of the official array `name` from another grid, resized to this layer's grid."""
        return resize_position_embeddings(value, self.grid_size, num_prefix_tokens=self.num_prefix_tokens,
                                          method=self.interpolation, aspect_preserving=self.aspect_preserving)

    def get_config(self):
        return {
            **super().get_config(),
            "grid_size": self.grid_size,
            "num_prefix_tokens": self.num_prefix_tokens,
            "stride": self.stride,
            "interpolation": self.interpolation,
            "aspect_preserving": self.aspect_preserving,
        }
