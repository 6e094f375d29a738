"""Learned 2-D position embeddings: a row and a column table of D/2 each, concatenated (paper D.4)."""

import keras
import numpy as np
from keras import ops

from keras_vit.interpolation import linear_resize_matrix
from keras_vit.layers.initial import initial
from keras_vit.layers.position_embedding import AddPositionEmbs


@keras.saving.register_keras_serializable(package="keras_vit")
class AddPositionEmbs2D(AddPositionEmbs):
    """Adds `concat(row[i], col[j])` to the token of grid cell (i, j), and a learned (prefix, D)
    embedding to the prefix ([class]) tokens, which have no grid coordinate.

    Parameters: gh * D/2 + gw * D/2 + prefix * D (official-style keys `row_embedding`,
    `col_embedding`, `prefix_embedding`). Resizing to another grid interpolates each table
    linearly with its end points aligned, the 1-D rule of `resize_position_embeddings` per axis.

    Args:
        grid_size: (gh, gw), the patch grid.
        num_prefix_tokens: tokens before the grid (1 for the [class] token, 0 for "gap" models).
    """

    def build(self, input_shape):
        self._check(input_shape)
        dim = input_shape[-1]
        if dim % 2:
            raise ValueError(f"AddPositionEmbs2D needs an even hidden size (D/2 per axis), got {dim}")
        init = initial(keras.initializers.RandomNormal(stddev=0.02))
        gh, gw = self.grid_size
        self.row_embedding = self.add_weight(name="row_embedding", shape=(gh, dim // 2), initializer=init)
        self.col_embedding = self.add_weight(name="col_embedding", shape=(gw, dim // 2), initializer=init)
        self.prefix_embedding = None
        if self.num_prefix_tokens:
            self.prefix_embedding = self.add_weight(
                name="prefix_embedding", shape=(self.num_prefix_tokens, dim), initializer=init
            )

    @property
    def pos_embedding(self):
        """The (1, T, D) table the layer adds, prefix first, the grid row-major."""
        gh, gw = self.grid_size
        half = self.row_embedding.shape[-1]
        rows = ops.broadcast_to(self.row_embedding[:, None, :], (gh, gw, half))
        cols = ops.broadcast_to(self.col_embedding[None, :, :], (gh, gw, half))
        table = ops.reshape(ops.concatenate([rows, cols], axis=-1), (gh * gw, 2 * half))
        if self.prefix_embedding is not None:
            table = ops.concatenate([ops.convert_to_tensor(self.prefix_embedding), table], axis=0)
        return table[None]

    def call(self, tokens, images=None):  # images: the parent's signature (runtime resolution), unused
        self._check(tokens.shape)
        return tokens + ops.cast(self.pos_embedding, tokens.dtype)

    def compute_output_shape(self, tokens_shape, images_shape=None):
        return tokens_shape

    def official_weights(self):
        params = {"row_embedding": self.row_embedding, "col_embedding": self.col_embedding}
        if self.prefix_embedding is not None:
            params["prefix_embedding"] = self.prefix_embedding
        return params

    def resize_official(self, name, value):
        """`value` of the official array `name` from another grid, resized to this layer's grid."""
        value = np.asarray(value)
        axis = {"row_embedding": 0, "col_embedding": 1}.get(name)
        if axis is None or value.ndim != 2:
            raise ValueError(f"{name}: no resize rule for an array of shape {value.shape}")
        matrix = linear_resize_matrix(value.shape[0], self.grid_size[axis])
        return (matrix @ value.astype(np.float64)).astype(value.dtype)
