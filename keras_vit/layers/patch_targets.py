"""The targets of masked patch prediction (paper appendix B.1.2), computed from the images."""

import keras
from keras import ops

TARGETS = ("mean_color", "downsized_color", "pixels")


@keras.saving.register_keras_serializable(package="keras_vit")
class MaskedPatchTargets(keras.layers.Layer):
    """Images (B, H, W, C) in [-1, 1] -> per-patch targets, patches row-major as `PatchEncoder`'s.

    - "mean_color": (B, N, 1) int, the patch's mean colour with `bits` bits a channel, one class of
      2**(bits * C) (512 for 3-bit RGB): class = sum_c bin_c * 2**(bits * (C - 1 - c)).
    - "downsized_color": (B, N, size*size) int, the same classes of the patch average-pooled to
      size x size cells, row-major.
    - "pixels": (B, N, P*P*C) float, the patch's pixels (row, column, channel), for L2 regression.
    A value x falls in bin floor((x + 1) / 2 * 2**bits), clipped to [0, 2**bits - 1]. The numpy
    reference is `keras_vit.masked_patch.patch_targets`.

    Args:
        patch_size: P in pixels.
        target: one of "mean_color", "downsized_color", "pixels".
        bits: bits a channel for the colour classes.
        size: cells a side of "downsized_color"; must divide P.
    """

    def __init__(self, patch_size, target="mean_color", bits=3, size=4, **kwargs):
        super().__init__(**kwargs)
        if target not in TARGETS:
            raise ValueError(f"unknown target {target!r}; expected one of {TARGETS}")
        self.patch_size, self.target, self.bits, self.size = int(patch_size), target, int(bits), int(size)
        if target == "downsized_color" and self.patch_size % self.size:
            raise ValueError(f"downsized_color needs size {self.size} to divide the patch size {self.patch_size}")
        self.input_spec = keras.InputSpec(ndim=4)

    def _classes(self, colours):
        levels = 2 ** self.bits
        bins = ops.clip(ops.floor((colours + 1.0) / 2.0 * levels), 0, levels - 1)
        channels = colours.shape[-1]
        weights = ops.convert_to_tensor([levels ** (channels - 1 - c) for c in range(channels)], dtype=bins.dtype)
        return ops.cast(ops.sum(bins * weights, axis=-1), "int32")

    def call(self, images):
        images = ops.cast(images, "float32")
        _, h, w, c = images.shape
        p = self.patch_size
        gh, gw = h // p, w // p
        x = ops.transpose(ops.reshape(images, (-1, gh, p, gw, p, c)), (0, 1, 3, 2, 4, 5))
        x = ops.reshape(x, (-1, gh * gw, p, p, c))
        if self.target == "pixels":
            return ops.reshape(x, (-1, gh * gw, p * p * c))
        if self.target == "mean_color":
            return self._classes(ops.mean(x, axis=(2, 3)))[:, :, None]
        s, k = self.size, p // self.size
        cells = ops.mean(ops.reshape(x, (-1, gh * gw, s, k, s, k, c)), axis=(3, 5))
        return ops.reshape(self._classes(cells), (-1, gh * gw, s * s))

    def get_config(self):
        return {**super().get_config(), "patch_size": self.patch_size, "target": self.target, "bits": self.bits,
                "size": self.size}
