"""The pixels a patch convolution without padding never reads, dropped before the patches are cut."""

import keras
from keras import ops


@keras.saving.register_keras_serializable(package="keras_vit")
class CropToPatches(keras.layers.Layer):
    """Crops images (B, H, W, C) to (B, floor(H / stride) * stride, floor(W / stride) * stride, C): the
    bottom rows and right columns that fill no whole patch are dropped, as timm's, Hugging Face's and
    keras-hub's patch convolution (stride P, no padding) leaves them unread: SigLIP so400m/14 cuts its
    384 px images into 27 x 27 patches of 14 and never reads the last 6 rows and columns. Images whose
    sides are multiples of `stride` pass unchanged; the size may be known only when run.

    Args:
        stride: the pixels per token along each axis (the patch size).
    """

    def __init__(self, stride, **kwargs):
        super().__init__(**kwargs)
        self.stride = int(stride)
        if self.stride < 1:
            raise ValueError(f"CropToPatches: stride must be a positive int, got {stride!r}")
        self.input_spec = keras.InputSpec(ndim=4)

    def call(self, images):
        s = self.stride
        h, w = images.shape[1], images.shape[2]
        if isinstance(h, int) and isinstance(w, int):  # known when traced: a static slice, or none
            return images if not (h % s or w % s) else images[:, : h // s * s, : w // s * s, :]
        shape = ops.shape(images)
        return images[:, : shape[1] // s * s, : shape[2] // s * s, :]

    def compute_output_shape(self, input_shape):
        b, h, w, c = input_shape
        return (b, *(None if v is None else v // self.stride * self.stride for v in (h, w)), c)

    def get_config(self):
        return {**super().get_config(), "stride": self.stride}
