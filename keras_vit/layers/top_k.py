"""The k most probable classes of each row, for serving signatures."""

import keras
from keras import ops


@keras.saving.register_keras_serializable(package="keras_vit")
class TopK(keras.layers.Layer):
    """(B, classes) probabilities -> ((B, k) scores, (B, k) int32 class indices), best first.

    Args:
        k: how many classes to keep.
    """

    def __init__(self, k, **kwargs):
        super().__init__(**kwargs)
        if not isinstance(k, int) or k < 1:
            raise ValueError(f"TopK: k must be a positive int, got {k!r}")
        self.k = k

    def call(self, probabilities):
        if keras.backend.backend() == "jax":
            # JAX lowers top_k to a StableHLO composite that TensorFlow cannot read back from a
            # SavedModel exported from JAX (jax2tf); a sort exports
            classes = ops.argsort(-probabilities, axis=-1)[:, : self.k]
            return ops.take_along_axis(probabilities, classes, axis=-1), ops.cast(classes, "int32")
        scores, classes = ops.top_k(probabilities, self.k)
        return scores, ops.cast(classes, "int32")

    def compute_output_spec(self, probabilities):
        shape = (probabilities.shape[0], self.k)
        return keras.KerasTensor(shape, probabilities.dtype), keras.KerasTensor(shape, "int32")

    def get_config(self):
        return {**super().get_config(), "k": self.k}
