"""The Transformer encoder block of ViT (paper Eq. 2-3): pre-LN attention and MLP with residuals."""

import keras
from keras import ops

from keras_vit.layers.attention import MultiHeadDotProductAttention

LAYER_NORM_EPSILON = 1e-6


def _norm_params(layer):
    return {"scale": layer.gamma, "bias": layer.beta}


@keras.saving.register_keras_serializable(package="keras_vit")
class TransformerBlock(keras.layers.Layer):
    """`x + Dropout(MSA(LN(x)))`, then `x + MLP(LN(x))`; as the official `encoderblock_i`.

    Numerics follow the official model: LayerNorm epsilon 1e-6, tanh-approximate GELU, biases on
    every projection, dropout after every dense layer except q/k/v, dropout on the attention
    weights.

    Args:
        num_heads: attention heads.
        mlp_dim: hidden width of the MLP.
        dropout_rate: dropout after the attention output and each MLP dense layer.
        attention_dropout_rate: dropout on the attention weights.
    Call args:
        x: tokens (B, T, D).
        return_attention: also return the softmax attention weights (B, heads, T, T).
    """

    def __init__(self, num_heads, mlp_dim, dropout_rate=0.0, attention_dropout_rate=0.0, **kwargs):
        super().__init__(**kwargs)
        self.num_heads = int(num_heads)
        self.mlp_dim = int(mlp_dim)
        self.dropout_rate = float(dropout_rate)
        self.attention_dropout_rate = float(attention_dropout_rate)
        self.input_spec = keras.InputSpec(ndim=3)

    def build(self, input_shape):
        dim = input_shape[-1]
        policy = self.dtype_policy
        self.norm_0 = keras.layers.LayerNormalization(epsilon=LAYER_NORM_EPSILON, name="LayerNorm_0", dtype=policy)
        self.attention = MultiHeadDotProductAttention(
            self.num_heads, self.attention_dropout_rate, name="MultiHeadDotProductAttention_1", dtype=policy
        )
        self.norm_2 = keras.layers.LayerNormalization(epsilon=LAYER_NORM_EPSILON, name="LayerNorm_2", dtype=policy)
        init = dict(kernel_initializer="glorot_uniform", bias_initializer=keras.initializers.RandomNormal(stddev=1e-6))
        self.mlp_0 = keras.layers.Dense(self.mlp_dim, name="Dense_0", dtype=policy, **init)
        self.mlp_1 = keras.layers.Dense(dim, name="Dense_1", dtype=policy, **init)
        self.dropout = keras.layers.Dropout(self.dropout_rate)
        for layer in (self.norm_0, self.attention, self.norm_2, self.mlp_0):
            layer.build(input_shape)
        self.mlp_1.build((*input_shape[:-1], self.mlp_dim))

    def call(self, x, training=None, return_attention=False):
        y = self.attention(self.norm_0(x), training=training, return_attention=return_attention)
        if return_attention:
            y, weights = y
        x = x + self.dropout(y, training=training)
        y = ops.gelu(self.mlp_0(self.norm_2(x)), approximate=True)
        y = self.mlp_1(self.dropout(y, training=training))
        x = x + self.dropout(y, training=training)
        return (x, weights) if return_attention else x

    def compute_output_shape(self, input_shape):
        return input_shape

    def official_weights(self):
        params = {f"LayerNorm_0/{k}": v for k, v in _norm_params(self.norm_0).items()}
        params |= {f"MultiHeadDotProductAttention_1/{k}": v for k, v in self.attention.official_weights().items()}
        params |= {f"LayerNorm_2/{k}": v for k, v in _norm_params(self.norm_2).items()}
        for name, layer in (("Dense_0", self.mlp_0), ("Dense_1", self.mlp_1)):
            params |= {f"MlpBlock_3/{name}/kernel": layer.kernel, f"MlpBlock_3/{name}/bias": layer.bias}
        return params

    def get_config(self):
        return {
            **super().get_config(),
            "num_heads": self.num_heads,
            "mlp_dim": self.mlp_dim,
            "dropout_rate": self.dropout_rate,
            "attention_dropout_rate": self.attention_dropout_rate,
        }
