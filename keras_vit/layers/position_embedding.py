"""Learnable 1D position embeddings, and their 2D resize for another resolution (paper 3.2)."""

import math

import keras
import numpy as np
from keras import ops

from keras_vit.interpolation import resize_2d


def resize_position_embeddings(posemb, new_grid, old_grid=None, num_prefix_tokens=1):
    """Resizes (1, prefix + gh*gw, D) position embeddings to a (new_h, new_w) patch grid.

    The official rule: the prefix ([class] token) entries are kept as they are; the grid part is
    zoomed bilinearly with corners aligned, each axis by its own factor (what
    `scipy.ndimage.zoom(order=1)` does), and flattened row-major again.

    Args:
        posemb: array (1, T, D).
        new_grid: (new_h, new_w) patch grid of the target model.
        old_grid: (gh, gw) of `posemb`; inferred as square when None.
        num_prefix_tokens: 1 with a class token, 0 for `classifier="gap"` models.
    Returns:
        float array (1, num_prefix_tokens + new_h * new_w, D) in posemb's dtype.
    """
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
    out = resize_2d(grid.reshape(gh, gw, -1), (nh, nw))
    out = out.reshape(1, nh * nw, -1).astype(posemb.dtype)
    return np.concatenate([prefix, out], axis=1)


@keras.saving.register_keras_serializable(package="keras_vit")
class AddPositionEmbs(keras.layers.Layer):
    """Adds learnable position embeddings (official `Transformer/posembed_input/pos_embedding`).

    Args:
        grid_size: (gh, gw), the patch grid the embeddings are laid out on.
        num_prefix_tokens: tokens before the grid (1 for the [class] token, 0 for "gap" models).
    """

    def __init__(self, grid_size, num_prefix_tokens=1, **kwargs):
        super().__init__(**kwargs)
        self.grid_size = tuple(int(v) for v in grid_size)
        self.num_prefix_tokens = int(num_prefix_tokens)
        self.input_spec = keras.InputSpec(ndim=3)

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

    def build(self, input_shape):
        self._check(input_shape)
        self.pos_embedding = self.add_weight(
            name="pos_embedding",
            shape=(1, self.num_tokens, input_shape[-1]),
            initializer=keras.initializers.RandomNormal(stddev=0.02),
        )

    def call(self, tokens):
        self._check(tokens.shape)
        return tokens + ops.cast(self.pos_embedding, tokens.dtype)

    def official_weights(self):
        return {"pos_embedding": self.pos_embedding}

    def resize_official(self, name, value):
        """`value` of the official array `name` from another grid, resized to this layer's grid."""
        return resize_position_embeddings(value, self.grid_size, num_prefix_tokens=self.num_prefix_tokens)

    def get_config(self):
        return {
            **super().get_config(),
            "grid_size": self.grid_size,
            "num_prefix_tokens": self.num_prefix_tokens,
        }
