"""Patch tokens back on their 2D grid: (B, prefix + gh*gw, D) -> (B, gh, gw, D)."""

import keras
from keras import ops

from keras_vit.layers.position_embedding import runtime_grid


@keras.saving.register_keras_serializable(package="keras_vit")
class TokensToMap(keras.layers.Layer):
    """Drops the prefix tokens and lays the patch tokens out row-major on the patch grid.

    Args:
        grid_size: (gh, gw) of a fixed-resolution model; None for one that takes any resolution,
            which is then called as `layer(tokens, images)` and reads the grid off the images.
        num_prefix_tokens: tokens before the grid (1 for the [class] token, 0 for "gap" models).
        stride: with grid_size None, the pixels per token of `images` (patch size x ResNet stride).
    """

    def __init__(self, grid_size=None, num_prefix_tokens=1, stride=None, **kwargs):
        super().__init__(**kwargs)
        if (grid_size is None) == (stride is None):
            raise ValueError(f"pass exactly one of grid_size and stride, got grid_size={grid_size!r}, stride={stride!r}")
        self.grid_size = None if grid_size is None else tuple(int(v) for v in grid_size)
        self.num_prefix_tokens = int(num_prefix_tokens)
        self.stride = None if stride is None else int(stride)

    def call(self, tokens, images=None):
        if self.stride is not None and images is None:
            raise ValueError("TokensToMap with a stride is called as layer(tokens, images)")
        gh, gw = self.grid_size or runtime_grid(images, self.stride)
        return ops.reshape(tokens[:, self.num_prefix_tokens:], (-1, gh, gw, tokens.shape[-1]))

    def compute_output_shape(self, tokens_shape, images_shape=None):
        if self.grid_size is not None:
            return (tokens_shape[0], *self.grid_size, tokens_shape[-1])
        grid = tuple(None if s is None else s // self.stride for s in images_shape[1:3])
        return (tokens_shape[0], *grid, tokens_shape[-1])

    def get_config(self):
        return {**super().get_config(), "grid_size": self.grid_size, "num_prefix_tokens": self.num_prefix_tokens,
                "stride": self.stride}
