"""Images of any size resized to one size inside the model (a served artefact's `--resize-to`)."""

import keras
from keras import ops

from keras_vit.configs import pair
from keras_vit.layers.position_embedding import antialias_bicubic_matrix


@keras.saving.register_keras_serializable(package="keras_vit")
class ResizeImages(keras.layers.Layer):
    """Resizes a batch of images (B, H, W, C) of any H and W to `size`: bicubic, antialiased when
    shrinking, half-pixel centres (torch's `interpolate(mode="bicubic", antialias=True)`, the filter
    of PIL's BICUBIC), as one matrix product per axis whose weights are computed from the input's
    size when called, so that every exporter expresses it (ONNX's `Resize` has antialiasing only
    from opset 18, which tf2onnx and jax2onnx do not write; `tf.image.resize(antialias=True)` is
    `ScaleAndTranslate`, which tf2onnx cannot convert).

    Args:
        size: int or (h, w), the output's height and width.
    """

    def __init__(self, size, **kwargs):
        super().__init__(**kwargs)
        self.size = pair(size, "size")
        self.input_spec = keras.InputSpec(ndim=4)

    def call(self, images):
        h, w = self.size
        shape = ops.shape(images)
        x = ops.cast(images, self.compute_dtype)
        rows = ops.cast(antialias_bicubic_matrix(shape[1], h), x.dtype)
        cols = ops.cast(antialias_bicubic_matrix(shape[2], w), x.dtype)
        return ops.einsum("ih,bhwc,jw->bijc", rows, x, cols)

    def compute_output_shape(self, input_shape):
        return (input_shape[0], *self.size, input_shape[3])

    def get_config(self):
        return {**super().get_config(), "size": self.size}
