"""Patch embedding: image (or CNN feature map) -> flattened patches -> linear projection (paper Eq. 1)."""

import keras
from keras import ops

from keras_vit.layers.initial import initial


def check_channels(layer, shape, channels):
    """Raises when an input batch of `shape` does not have the `channels` the layer's kernel takes."""
    if shape[-1] is not None and shape[-1] != channels:
        rgb = " (RGB)" if channels == 3 else ""
        raise ValueError(
            f"{layer.name}: the model takes images with {channels} channels{rgb} on the last axis, got a batch "
            f"of shape {tuple(shape)} with {shape[-1]}; e.g. repeat a grayscale channel 3 times "
            "(np.repeat(x, 3, axis=-1)) or build the model on `input_tensor=keras.Input((h, w, c))`."
        )


@keras.saving.register_keras_serializable(package="keras_vit")
class PatchEncoder(keras.layers.Layer):
    """Splits the input into non-overlapping `patch_size` patches and projects each to `hidden_size`.

    Equal to the official `embedding` convolution (kernel (P, P, C, D), stride P, VALID, with bias),
    computed as one matmul over the flattened patches. Output tokens are row-major over the
    (H / P, W / P) grid, so non-square inputs work.

    Called on a NaFlex batch of patches (B, N, P * P * C), each patch flattened row-major with the
    channels fastest (timm's and Hugging Face's layout), it projects them with the same kernel.

    Args:
        patch_size: P, the side of a square patch in pixels (1 on a hybrid's feature map).
        hidden_size: D, the width of each token.
    """

    def __init__(self, patch_size, hidden_size, **kwargs):
        super().__init__(**kwargs)
        self.patch_size = int(patch_size)
        self.hidden_size = int(hidden_size)
        self.input_spec = keras.InputSpec(min_ndim=3, max_ndim=4)

    def _patch_channels(self, shape, channels=None):
        """The channels of patches of `shape` (B, N, P * P * C); a ValueError when they are not P x P."""
        p, width = self.patch_size, shape[-1]
        if width is None or width % (p * p) or (channels is not None and width != p * p * channels):
            what = f"{p * p * channels} values ({p}x{p} pixels x {channels} channels)" if channels \
                else f"a multiple of {p * p} values ({p}x{p} pixels x channels)"
            raise ValueError(f"{self.name}: the model's patches are {what}, got patches of shape {tuple(shape)}; "
                             f"cut the images into the model's patch size {p}")
        return width // (p * p)

    def build(self, input_shape):
        if len(input_shape) == 3:  # NaFlex patches
            input_shape = (None, None, None, self._patch_channels(input_shape))
        _, h, w, c = input_shape
        p = self.patch_size
        for axis, size in (("height", h), ("width", w)):
            if size is not None and size % p:
                raise ValueError(
                    f"PatchEncoder: input {axis} {size} is not divisible by patch_size {p} "
                    f"(input shape {tuple(input_shape)})."
                )
        if c is None:
            raise ValueError(f"PatchEncoder needs a known channel count, got input shape {tuple(input_shape)}.")
        self.kernel = self.add_weight(
            name="kernel", shape=(p, p, c, self.hidden_size), initializer=initial("lecun_normal")
        )
        self.bias = self.add_weight(name="bias", shape=(self.hidden_size,), initializer="zeros")

    def call(self, images):
        p, d = self.patch_size, self.hidden_size
        if len(images.shape) == 3:  # NaFlex patches (B, N, P * P * C)
            c = self._patch_channels(images.shape, self.kernel.shape[2])
            kernel = ops.reshape(self.kernel, (p * p * c, d))
            return ops.matmul(images, ops.cast(kernel, images.dtype)) + ops.cast(self.bias, images.dtype)
        check_channels(self, images.shape, self.kernel.shape[2])
        c = images.shape[-1]
        shape = ops.shape(images)
        for axis, size in (("height", images.shape[1]), ("width", images.shape[2])):
            if isinstance(size, int) and size % p:  # not a size only known when run (None, or JAX's symbolic)
                raise ValueError(f"PatchEncoder: input {axis} {size} is not divisible by patch_size {p} "
                                 f"(input shape {tuple(images.shape)}).")
        gh, gw = shape[1] // p, shape[2] // p
        if p == 1:
            patches = ops.reshape(images, (-1, gh * gw, c))
        else:
            x = ops.reshape(images, (-1, gh, p, gw, p, c))
            x = ops.transpose(x, (0, 1, 3, 2, 4, 5))
            patches = ops.reshape(x, (-1, gh * gw, p * p * c))
        kernel = ops.reshape(self.kernel, (p * p * c, d))
        return ops.matmul(patches, ops.cast(kernel, patches.dtype)) + ops.cast(self.bias, patches.dtype)

    def compute_output_shape(self, input_shape):
        if len(input_shape) == 3:
            return (*input_shape[:2], self.hidden_size)
        b, h, w, _ = input_shape
        tokens = None if h is None or w is None else (h // self.patch_size) * (w // self.patch_size)
        return (b, tokens, self.hidden_size)

    def official_weights(self):
        return {"kernel": self.kernel, "bias": self.bias}

    def get_config(self):
        return {**super().get_config(), "patch_size": self.patch_size, "hidden_size": self.hidden_size}
