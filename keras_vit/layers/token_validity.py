"""Which tokens of a NaFlex sequence are real: the prefix tokens always, the patches as the input says."""

import keras
from keras import ops


@keras.saving.register_keras_serializable(package="keras_vit")
class TokenValidity(keras.layers.Layer):
    """(B, N) bool patch validity -> (B, num_prefix_tokens + N) bool: True for every prefix token
    (class, distillation, register tokens), then the patches' own (False on a NaFlex batch's padding).

    Args:
        num_prefix_tokens: tokens before the patches.
    """

    def __init__(self, num_prefix_tokens=0, **kwargs):
        super().__init__(**kwargs)
        self.num_prefix_tokens = int(num_prefix_tokens)

    def call(self, patch_valid):
        valid = ops.cast(patch_valid, "bool")
        if not self.num_prefix_tokens:
            return valid
        prefix = ops.ones((ops.shape(valid)[0], self.num_prefix_tokens), "bool")
        return ops.concatenate([prefix, valid], axis=1)

    def compute_output_shape(self, input_shape):
        n = input_shape[1]
        return (input_shape[0], None if n is None else n + self.num_prefix_tokens)

    def compute_output_spec(self, patch_valid):
        return keras.KerasTensor(self.compute_output_shape(patch_valid.shape), dtype="bool")

    def get_config(self):
        return {**super().get_config(), "num_prefix_tokens": self.num_prefix_tokens}
