"""Learned tokens inserted into the sequence: DeiT's distillation token, DINOv2's registers."""

import keras
from keras import ops

from keras_vit.layers.initial import initial


@keras.saving.register_keras_serializable(package="keras_vit")
class PrefixTokens(keras.layers.Layer):
    """Inserts `num_tokens` learnable tokens (parameter `tokens`, (1, num_tokens, D)) after the first
    `index` tokens of the sequence.

    The [class] token is `ClassToken` (the paper's, zero-initialised); this layer adds the others:
    DeiT's distillation token right after it (`index=1`), or register tokens (Darcet et al., 2023)
    after the class token. They start from a truncated normal (std 0.02), so that register tokens,
    which carry no position embedding, do not start equal and stay so.

    Args:
        num_tokens: how many tokens to insert.
        index: how many tokens of the input stay before them.
    """

    def __init__(self, num_tokens=1, index=0, **kwargs):
        super().__init__(**kwargs)
        if isinstance(num_tokens, bool) or not isinstance(num_tokens, int) or num_tokens < 1:
            raise ValueError(f"num_tokens must be a positive int, got {num_tokens!r}")
        if isinstance(index, bool) or not isinstance(index, int) or index < 0:
            raise ValueError(f"index must be a non-negative int, got {index!r}")
        self.num_tokens, self.index = num_tokens, index
        self.input_spec = keras.InputSpec(ndim=3)

    def build(self, input_shape):
        self.tokens = self.add_weight(name="tokens", shape=(1, self.num_tokens, input_shape[-1]),
                                      initializer=initial(keras.initializers.TruncatedNormal(stddev=0.02)))

    def call(self, x):
        tokens = ops.broadcast_to(ops.cast(self.tokens, x.dtype), (ops.shape(x)[0], self.num_tokens, x.shape[-1]))
        if not self.index:  # no empty slice: LiteRT's XNNPack delegate fails to reshape one at a new batch size
            return ops.concatenate([tokens, x], axis=1)
        return ops.concatenate([x[:, :self.index], tokens, x[:, self.index:]], axis=1)

    def compute_output_shape(self, input_shape):
        b, n, d = input_shape
        return (b, None if n is None else n + self.num_tokens, d)

    def official_weights(self):
        return {"": self.tokens}

    def get_config(self):
        return {**super().get_config(), "num_tokens": self.num_tokens, "index": self.index}
