"""Multi-head dot-product self-attention with the official per-head parameter layout."""

import math

import keras
from keras import ops


@keras.saving.register_keras_serializable(package="keras_vit")
class MultiHeadDotProductAttention(keras.layers.Layer):
    """Self-attention as the official `MultiHeadDotProductAttention_1` (paper Eq. 5-8, Appendix A).

    q, k, v kernels are (D, heads, head_dim) with biases (heads, head_dim); the output kernel is
    (heads, head_dim, D) with bias (D,); queries are scaled by 1/sqrt(head_dim). Without attention
    dropout in training and without `return_attention`, the fused `keras.ops.dot_product_attention`
    path runs; otherwise the softmax weights are formed explicitly.

    Args:
        num_heads: number of heads; must divide the input width.
        dropout_rate: dropout on the attention weights (training only).
    """

    def __init__(self, num_heads, dropout_rate=0.0, **kwargs):
        super().__init__(**kwargs)
        self.num_heads = int(num_heads)
        self.dropout_rate = float(dropout_rate)

    def build(self, input_shape):
        dim = input_shape[-1]
        if dim % self.num_heads:
            raise ValueError(f"hidden size {dim} is not divisible by num_heads {self.num_heads}")
        self.head_dim = dim // self.num_heads
        proj = dict(equation="btd,dnh->btnh", output_shape=(None, self.num_heads, self.head_dim), bias_axes="nh")
        self.query = keras.layers.EinsumDense(**proj, name="query", dtype=self.dtype_policy)
        self.key = keras.layers.EinsumDense(**proj, name="key", dtype=self.dtype_policy)
        self.value = keras.layers.EinsumDense(**proj, name="value", dtype=self.dtype_policy)
        self.out = keras.layers.EinsumDense(
            "btnh,nhd->btd", output_shape=(None, dim), bias_axes="d", name="out", dtype=self.dtype_policy
        )
        for layer in (self.query, self.key, self.value):
            layer.build(input_shape)
        self.out.build((*input_shape[:-1], self.num_heads, self.head_dim))
        self.attention_dropout = keras.layers.Dropout(self.dropout_rate)

    def call(self, x, training=None, return_attention=False):
        q, k, v = self.query(x), self.key(x), self.value(x)
        scale = 1.0 / math.sqrt(self.head_dim)
        if not return_attention and not (training and self.dropout_rate > 0):
            return self.out(ops.dot_product_attention(q, k, v, scale=scale))
        logits = ops.einsum("bqnh,bknh->bnqk", q * ops.cast(scale, q.dtype), k)
        weights = ops.softmax(ops.cast(logits, "float32"), axis=-1)
        dropped = ops.cast(self.attention_dropout(weights, training=training), v.dtype)
        y = self.out(ops.einsum("bnqk,bknh->bqnh", dropped, v))
        return (y, weights) if return_attention else y

    def official_weights(self):
        return {
            f"{name}/{w}": getattr(layer, w)
            for name, layer in (("query", self.query), ("key", self.key), ("value", self.value), ("out", self.out))
            for w in ("kernel", "bias")
        }

    def get_config(self):
        return {**super().get_config(), "num_heads": self.num_heads, "dropout_rate": self.dropout_rate}
