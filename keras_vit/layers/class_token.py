"""The learnable [class] embedding prepended to the patch tokens (paper 3.1)."""

import keras
from keras import ops


@keras.saving.register_keras_serializable(package="keras_vit")
class ClassToken(keras.layers.Layer):
    """Prepends one learnable token (official param `cls`, shape (1, 1, D), zero-initialised)."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.input_spec = keras.InputSpec(ndim=3)

    def build(self, input_shape):
        self.cls = self.add_weight(name="cls", shape=(1, 1, input_shape[-1]), initializer="zeros")

    def call(self, tokens):
        batch = ops.shape(tokens)[0]
        cls = ops.broadcast_to(ops.cast(self.cls, tokens.dtype), (batch, 1, tokens.shape[-1]))
        return ops.concatenate([cls, tokens], axis=1)

    def compute_output_shape(self, input_shape):
        b, n, d = input_shape
        return (b, None if n is None else n + 1, d)

    def official_weights(self):
        return {"": self.cls}
