"""Factorized position embeddings (NaViT section 3.1): one learned table per axis, a patch's
embedding the sum of its row's and its column's."""

import keras
import numpy as np
from keras import ops

from keras_vit.interpolation import check_interpolation, resize_matrix
from keras_vit.layers.initial import initial
from keras_vit.layers.position_embedding import (naflex_grids, resize_sizes, resize_weights, runtime_grid,
                                                  valid_coordinates)


@keras.saving.register_keras_serializable(package="keras_vit")
class AddFactorizedPositionEmbs(keras.layers.Layer):
    """Adds `rows[r] + cols[c]` to the patch at (r, c), tables `pos_embed_y` (gh, D) and
    `pos_embed_x` (gw, D) (timm's `pos_embed="factorized"`: its NaFlex "parfac" models).

    For another grid each table is resized along its axis by `interpolation` (timm's is linear on
    cell centres, "bilinear_half_pixel"), both to the longer side when `aspect_preserving`, a grid
    then reading the first rows and columns. No prefix tokens: they are added after it.

    Args:
        grid_size: (gh, gw), the grid the tables are laid out on.
        stride: None (images of the one grid), or the pixels per token of the images passed as
            the second argument, whose grid the tables are resized to at call time.
        interpolation: a name of `keras_vit.interpolation.POSITION_INTERPOLATIONS`.
        aspect_preserving: resize both tables to the grid's longer side (timm's "par").
    Call args:
        tokens: (B, gh * gw, D), or a NaFlex batch's patch tokens (B, N, D).
        images: with `stride`, the images whose grid the tokens are.
        patch_coord, patch_valid: a NaFlex batch's (B, N, 2) (row, col) and (B, N) validity: each
            patch takes its embedding in its own image's grid (see `naflex_grids`).
    """

    num_prefix_tokens = 0  # the prefix tokens come after it

    def __init__(self, grid_size, stride=None, interpolation="bilinear_half_pixel", aspect_preserving=False, **kwargs):
        super().__init__(**kwargs)
        self.grid_size = tuple(int(v) for v in grid_size)
        self.stride = None if stride is None else int(stride)
        self.interpolation = check_interpolation(interpolation, what="AddFactorizedPositionEmbs interpolation")
        self.aspect_preserving = bool(aspect_preserving)

    def build(self, tokens_shape, images_shape=None, patch_coord_shape=None, patch_valid_shape=None):
        init = initial(keras.initializers.RandomNormal(stddev=0.02))
        dim = tokens_shape[-1]
        self.pos_embed_y = self.add_weight(name="pos_embed_y", shape=(self.grid_size[0], dim), initializer=init)
        self.pos_embed_x = self.add_weight(name="pos_embed_x", shape=(self.grid_size[1], dim), initializer=init)

    def _weights(self, indices, sizes):
        """(row weights, column weights) reading the tables at `indices` (a (row, col) pair) of grids of `sizes`."""
        return tuple(resize_weights(old, index, size, self.interpolation)
                     for old, index, size in zip(self.grid_size, indices, sizes))

    def call(self, tokens, images=None, patch_coord=None, patch_valid=None):
        tables = [ops.cast(t, "float32") for t in (self.pos_embed_y, self.pos_embed_x)]
        if patch_coord is not None:
            grids = resize_sizes(naflex_grids(patch_coord, patch_valid), self.aspect_preserving)
            coord = valid_coordinates(patch_coord, patch_valid)
            rows, cols = self._weights((coord[..., 0], coord[..., 1]), (grids[:, None, 0], grids[:, None, 1]))
            return tokens + ops.cast(ops.matmul(rows, tables[0]) + ops.matmul(cols, tables[1]), tokens.dtype)
        if self.stride is None:  # the tables are laid out on the one grid
            pos = tables[0][:, None] + tables[1][None]
        else:
            grid = runtime_grid(images, self.stride)
            rows, cols = self._weights(tuple(ops.arange(n) for n in grid), resize_sizes(grid, self.aspect_preserving))
            pos = ops.matmul(rows, tables[0])[:, None] + ops.matmul(cols, tables[1])[None]
        return tokens + ops.cast(ops.reshape(pos, (1, -1, ops.shape(pos)[-1])), tokens.dtype)

    def compute_output_shape(self, tokens_shape, images_shape=None, patch_coord_shape=None, patch_valid_shape=None):
        return tokens_shape

    def official_weights(self):
        return {"pos_embed_y": self.pos_embed_y, "pos_embed_x": self.pos_embed_x}

    def resize_official(self, name, value):
        """`value` (n, D) of the table `name` from another grid, resized to this layer's."""
        axis = 0 if name == "pos_embed_y" else 1
        target = self.grid_size[axis]
        size = max(self.grid_size) if self.aspect_preserving else target
        value = np.asarray(value)
        if value.shape[0] == target:
            return value
        return (resize_matrix(value.shape[0], size, self.interpolation)[:target] @ value).astype(value.dtype)

    def get_config(self):
        return {**super().get_config(), "grid_size": self.grid_size, "stride": self.stride,
                "interpolation": self.interpolation, "aspect_preserving": self.aspect_preserving}
