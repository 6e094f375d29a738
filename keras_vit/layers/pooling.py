"""Sequence pooling: the [class] token (`classifier="token"`), the mean of the tokens ("gap"), or both side by
side ("token_gap": DINOv2's linear classifiers, transformers' `Dinov2ForImageClassification`)."""

import keras
from keras import ops

POOLING_METHODS = ("token", "gap", "token_gap")


@keras.saving.register_keras_serializable(package="keras_vit")
class SequencePooling(keras.layers.Layer):
    """(B, T, D) -> (B, D): token 0 for "token", the mean over tokens for "gap"; (B, 2D) for "token_gap", the
    token and the mean concatenated.

    Args:
        method: "token", "gap" or "token_gap".
        num_prefix_tokens: tokens "gap" leaves out of the mean (1 to average only the patch tokens
            of a class-token model).
        token_index: the token "token" takes (1: DeiT's distillation token).
    Call args:
        tokens: (B, T, D).
        valid: None, or (B, T) bool: "gap" averages the valid tokens only (a NaFlex batch's padding
            is False).
    """

    def __init__(self, method="token", num_prefix_tokens=0, token_index=0, **kwargs):
        super().__init__(**kwargs)
        if method not in POOLING_METHODS:
            raise ValueError(f"unknown pooling/classifier {method!r}; expected one of {POOLING_METHODS}")
        self.method = method
        self.num_prefix_tokens = int(num_prefix_tokens)
        self.token_index = int(token_index)
        self.input_spec = keras.InputSpec(ndim=3)

    def call(self, tokens, valid=None):
        if self.method == "token":
            return tokens[:, self.token_index]
        if self.method == "token_gap":
            return ops.concatenate([tokens[:, self.token_index], self._mean(tokens, valid)], axis=-1)
        return self._mean(tokens, valid)

    def _mean(self, tokens, valid):
        tokens = tokens[:, self.num_prefix_tokens:]
        if valid is None:
            return ops.mean(tokens, axis=1)
        valid = valid[:, self.num_prefix_tokens:, None]
        total = ops.sum(ops.where(valid, tokens, ops.zeros_like(tokens)), axis=1)
        return total / ops.maximum(ops.sum(ops.cast(valid, tokens.dtype), axis=1), 1)

    def compute_output_shape(self, input_shape):
        return (input_shape[0], input_shape[2] * (2 if self.method == "token_gap" else 1))

    def get_config(self):
        return {**super().get_config(), "method": self.method, "num_prefix_tokens": self.num_prefix_tokens,
                "token_index": self.token_index}
