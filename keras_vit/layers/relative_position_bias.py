"""BEiT's 2-D relative position bias (Bao et al. 2021): each block's attention adds to the logit of query i and key
j a learned per-head bias of the offset between their patches on the grid, and three more for the class token
(class to patch, patch to class, class to class). A table of (2h - 1)(2w - 1) + 3 biases a head, read through a
fixed index, so the layer is laid out for one grid."""

import keras
import numpy as np
from keras import ops

from keras_vit.layers.attention import MultiHeadDotProductAttention


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


@keras.saving.register_keras_serializable(package="keras_vit")
class RelativeBiasAttention(MultiHeadDotProductAttention):
    """`MultiHeadDotProductAttention` plus BEiT's relative position bias on the logits, a table
    `relative_position_bias_table` ((2h - 1)(2w - 1) + 3, heads) for the tokens of a class token and an (h, w)
    grid (`relative_position_index`). The explicit softmax path runs (the bias is one more logit term).

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

    def logit_bias(self, q, scale, training=None):
        tokens = 1 + self.grid_size[0] * self.grid_size[1]
        bias = ops.take(self.relative_position_bias_table, self.index, axis=0)  # (T * T, heads)
        return ops.transpose(ops.reshape(bias, (tokens, tokens, self.num_heads)), (2, 0, 1))[None]

    def official_weights(self):
        return {**super().official_weights(), "relative_position_bias_table": self.relative_position_bias_table}

    def get_config(self):
        return {**super().get_config(), "grid_size": self.grid_size}
