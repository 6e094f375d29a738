"""BEiT's 2-D relative position bias (Bao et al. 2021): each block's attention adds to the logit of query i and key
j a learned per-head bias of the offset between their patches on the grid, and three more for the class token
(class to patch, patch to class, class to class). A table of (2h - 1)(2w - 1) + 3 biases a head, read through an
index of the grid: `resize_relative_position_bias` lays a table out for another grid once, and a layer given the
grid of each call (`grid=`, a model that takes any size) resizes its table to it there, as transformers'
`interpolate_pos_encoding` resizes its square tables."""

import keras
import numpy as np
from keras import ops

from keras_vit.interpolation import geometric_resize_matrix, resize_2d
from keras_vit.layers.attention import MultiHeadDotProductAttention
from keras_vit.layers.position_embedding import is_grid, resize_weights

RELATIVE_RESIZES = ("geometric", "bilinear")


def relative_position_index(grid_h, grid_w):
    """(T, T) int32, T = 1 + grid_h * grid_w (the class token first, the patches in raster order): entry (i, j) the
    row of the bias table for query i and key j. Patch offsets (dy, dx) take rows (dy + h - 1) (2w - 1) + dx + w - 1;
    the last three rows are class to patch, patch to class and class to class."""
    rows, cols = np.meshgrid(np.arange(grid_h), np.arange(grid_w), indexing="ij")
    rows, cols = rows.reshape(-1), cols.reshape(-1)
    offsets = (rows[:, None] - rows[None, :] + grid_h - 1) * (2 * grid_w - 1) + (cols[:, None] - cols[None, :] + grid_w - 1)
    patches = (2 * grid_h - 1) * (2 * grid_w - 1)
    index = np.empty((1 + grid_h * grid_w,) * 2, "int32")
    index[1:, 1:] = offsets
    index[0, :] = patches  # the class token's query
    index[:, 0] = patches + 1  # the class token's key
    index[0, 0] = patches + 2
    return index


def offset_index(grid_h, grid_w):
    """(N, N) int32 tensor, N = grid_h * grid_w (the patches in raster order): entry (i, j) the row of the offset
    (dy, dx) from patch i to patch j in a table of the offsets laid out (2h, 2w) row-major, dy + h - 1 and
    dx + w - 1 from 0, the last row and column unused (a size of 4hw, where (2h - 1)(2w - 1) is one that JAX's
    symbolic shapes cannot prove nonnegative); with keras.ops, the sides ints or scalar tensors (a grid read off
    the images at call time)."""
    rows, cols = ops.arange(grid_h, dtype="int32"), ops.arange(grid_w, dtype="int32")
    h, w = ops.shape(rows)[0], ops.shape(cols)[0]
    r = ops.reshape(ops.broadcast_to(rows[:, None], (h, w)), (-1,))
    c = ops.reshape(ops.broadcast_to(cols[None, :], (h, w)), (-1,))
    return (r[:, None] - r[None, :] + (h - 1)) * (2 * w) + (c[:, None] - c[None, :] + (w - 1))


def relative_index_of(grid_h, grid_w):
    """(T, T) int32 tensor, T = 1 + grid_h * grid_w: `relative_position_index` with keras.ops for a table of
    `offset_index`'s layout, its 4hw rows of offsets and then the class token's three."""
    offsets = offset_index(grid_h, grid_w)
    patches = 4 * grid_h * grid_w
    tokens = ops.arange(ops.shape(offsets)[0] + 1, dtype="int32")
    query, key = tokens[:, None], tokens[None, :]
    padded = ops.pad(offsets, ((1, 0), (1, 0)))
    return ops.where(query == 0, ops.where(key == 0, patches + 2, patches), ops.where(key == 0, patches + 1, padded))


def resize_relative_position_bias(table, old_grid, new_grid, method="geometric"):
    """BEiT's relative position bias `table` ((2h - 1)(2w - 1) + 3, heads) of the grid `old_grid` (h, w), laid out
    for `new_grid`: each head's plane of patch offsets resized, the class token's three rows kept; the table itself
    where the grids are equal. Pure numpy, float32 out.

    Args:
        table: the table, as `RelativeBiasAttention` holds it (the offsets' rows first, then the class token's).
        old_grid: (h, w), the patch grid the table is laid out for.
        new_grid: (h, w), the grid to lay it out for.
        method: "geometric" (BEiT's fine-tuning code and timm's loader: `geometric_resize_matrix` on both axes)
            or "bilinear" (transformers' `interpolate_pos_encoding`: torch's half-pixel bilinear on the plane as
            transformers reshapes it, (2w - 1, 2h - 1) for (2h - 1, 2w - 1): the same for a square file).
    """
    if method not in RELATIVE_RESIZES:
        raise ValueError(f"method must be one of {RELATIVE_RESIZES}, got {method!r}")
    table = np.asarray(table)
    (h, w), (new_h, new_w) = (tuple(int(v) for v in g) for g in (old_grid, new_grid))
    if table.ndim != 2 or table.shape[0] != (2 * h - 1) * (2 * w - 1) + 3:
        raise ValueError(f"a relative position table of a {h}x{w} grid has {(2 * h - 1) * (2 * w - 1) + 3} rows "
                         f"(offsets and the class token's 3) and one column a head, got shape {table.shape}")
    if (h, w) == (new_h, new_w):
        return table.astype(np.float32)
    plane, size = table[:-3].astype(np.float64), (2 * new_h - 1, 2 * new_w - 1)
    if method == "geometric":
        rows, cols = (geometric_resize_matrix(n, m) for n, m in zip((2 * h - 1, 2 * w - 1), size))
        resized = np.einsum("ih,hwk,jw->ijk", rows, plane.reshape(2 * h - 1, 2 * w - 1, -1), cols)
    else:  # transformers reads the plane's rows as 2w - 1 long
        resized = resize_2d(plane.reshape(2 * w - 1, 2 * h - 1, -1), size, method="bilinear_half_pixel")
    return np.concatenate([resized.reshape(-1, table.shape[1]), table[-3:]]).astype(np.float32)


@keras.saving.register_keras_serializable(package="keras_vit")
class RelativeBiasAttention(MultiHeadDotProductAttention):
    """`MultiHeadDotProductAttention` plus BEiT's relative position bias on the logits, a table
    `relative_position_bias_table` ((2h - 1)(2w - 1) + 3, heads) for the tokens of a class token and an (h, w)
    grid (`relative_position_index`). The explicit softmax path runs (the bias is one more logit term). Called with
    `grid=` (h, w) of another grid, the table is resized to it there (`table_for`).

    Args:
        grid_size: (h, w), the patch grid the table is laid out for.
        num_heads, dropout_rate, ...: as `MultiHeadDotProductAttention`.
    """

    def __init__(self, num_heads, grid_size, **kwargs):
        super().__init__(num_heads, **kwargs)
        self.grid_size = tuple(int(v) for v in grid_size)

    def build(self, input_shape):
        super().build(input_shape)
        h, w = self.grid_size
        if input_shape[1] is not None and input_shape[1] != 1 + h * w:
            raise ValueError(f"{self.name}: BEiT's relative position bias is laid out for a class token and a {h}x{w} "
                             f"grid ({1 + h * w} tokens), got {input_shape[1]} tokens")
        self.relative_position_bias_table = self.add_weight(
            name="relative_position_bias_table", shape=((2 * h - 1) * (2 * w - 1) + 3, self.num_heads),
            initializer="zeros")
        self.index = relative_position_index(h, w).reshape(-1)

    def logit_bias(self, q, scale, training=None, grid=None):
        if grid is None or is_grid(grid, self.grid_size):
            grid, table, index = self.grid_size, self.relative_position_bias_table, self.index
        else:  # another grid, known when called: the table resized to it, read through its index
            table, index = self.table_for(grid), ops.reshape(relative_index_of(*grid), (-1,))
        tokens = 1 + grid[0] * grid[1]
        bias = ops.take(table, index, axis=0)  # (T * T, heads)
        return ops.transpose(ops.reshape(bias, (tokens, tokens, self.num_heads)), (2, 0, 1))[None]

    def table_for(self, grid):
        """The table for the grid `grid` (ints or scalar tensors) with keras.ops, in `relative_index_of`'s layout:
        the plane of offsets resized by torch's half-pixel bilinear rule, as transformers' `interpolate_pos_encoding`
        resizes its (square) tables, then the class token's three rows. A table of a grid that is not square (timm's)
        is read as its index lays it out, (2h - 1, 2w - 1), not transposed as transformers would read it: at its own
        grid, the table itself."""
        (h, w), table = self.grid_size, ops.cast(self.relative_position_bias_table, "float32")
        plane = ops.reshape(table[:-3], (2 * h - 1, 2 * w - 1, self.num_heads))
        # (2 new_h, 2 new_w): the resize's (2 new_h - 1, 2 new_w - 1) and a row and a column past it, unread
        rows, cols = (resize_weights(2 * old - 1, ops.arange(2 * new), 2 * new - 1, "bilinear_half_pixel")
                      for old, new in zip(self.grid_size, grid))
        resized = ops.einsum("ia,abk,jb->ijk", rows, plane, cols)
        return ops.concatenate([ops.reshape(resized, (-1, self.num_heads)), table[-3:]], axis=0)

    def official_weights(self):
        return {**super().official_weights(), "relative_position_bias_table": self.relative_position_bias_table}

    def get_config(self):
        return {**super().get_config(), "grid_size": self.grid_size}
