"""Multi-head dot-product self-attention with the official per-head parameter layout."""

import math

import keras
from keras import ops

from keras_vit.runtime import on_cpu


def _plain(layer):
    """True when `layer`'s weights are plain float kernels (not quantized, no LoRA): the fused paths
    below read them directly; otherwise the layer's own call runs."""
    return layer.quantization_mode is None and not getattr(layer, "lora_enabled", False)


def dense(x, kernel, bias, gelu=False, approximate=True):
    """`x @ kernel + bias` over the last axis of `x` (then GELU if `gelu`: the tanh approximation,
    or the exact erf form with `approximate=False`),
    `kernel` 2-D (K, N), as one fused library call where the backend has one.

    torch: `linear` (one `addmm` with the bias, instead of `mm` then `add`); tensorflow: a 2-D
    `MatMul` + `BiasAdd` (+ GELU), the pattern grappler's remapper fuses into one oneDNN
    `_FusedMatMul`, instead of a batched matmul and a broadcast add; jax: matmul + add (+ GELU),
    which XLA fuses itself.
    """
    backend = keras.backend.backend()
    if backend == "torch":
        import torch

        y = torch.nn.functional.linear(x, kernel.T, bias)
        return torch.nn.functional.gelu(y, approximate="tanh" if approximate else "none") if gelu else y
    if backend == "tensorflow":
        import tensorflow as tf

        k, n = kernel.shape
        lead = tf.shape(x)[:-1]
        y = tf.nn.bias_add(tf.matmul(tf.reshape(x, (-1, k)), kernel), bias)
        if gelu:
            y = tf.nn.gelu(y, approximate=approximate)
        return tf.reshape(y, tf.concat([lead, [n]], axis=0))
    y = ops.matmul(x, kernel) + bias
    return ops.gelu(y, approximate=approximate) if gelu else y


# q/k/v as one (D, 3D) matmul where it measured faster (torch: one addmm; tensorflow without XLA);
# on jax, XLA:CPU ran the three einsums faster than the concatenated kernel and its slices
# (benchmarks/README.md).
_FUSED_QKV = {"torch": True, "tensorflow": True}


def _matmul_attention(q, k, v, scale):
    """Attention as two batched matmuls in (B, heads, T, head_dim) layout with a float32 softmax.

    On XLA:CPU and oneDNN this ran faster than einsums in (B, T, heads, head_dim) layout, with
    identical outputs (benchmarks/README.md).
    """
    q, k, v = (ops.swapaxes(t, 1, 2) for t in (q, k, v))
    logits = ops.matmul(q * ops.cast(scale, q.dtype), ops.swapaxes(k, -1, -2))
    weights = ops.cast(ops.softmax(ops.cast(logits, "float32"), axis=-1), v.dtype)
    return ops.swapaxes(ops.matmul(weights, v), 1, 2)


def _fused_attention(q, k, v, scale, training=False):
    """softmax(q k^T * scale) v for q, k, v (B, T, heads, head_dim), the backend's fused kernel."""
    backend = keras.backend.backend()
    if backend == "torch":
        import torch

        # (B, heads, T, head_dim) views straight into SDPA (flash / memory-efficient kernels where
        # the device has them): no contiguous copies of q, k, v as keras.ops makes
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, scale=scale).transpose(1, 2)
    if on_cpu():
        # batched matmuls in (B, heads, T, head_dim) layout: faster on oneDNN and XLA:CPU
        return _matmul_attention(q, k, v, scale)
    if backend == "jax" and training:
        # cuDNN's fused attention rejects ViT's sequence lengths (197, 577, ...) in training
        # ("Unsupported sequence length"); Keras checks the inference case only,
        # and under remat the failure escapes its fallback. XLA's attention trains at any length.
        return ops.dot_product_attention(q, k, v, scale=scale, flash_attention=False)
    return ops.dot_product_attention(q, k, v, scale=scale)


@keras.saving.register_keras_serializable(package="keras_vit")
class MultiHeadDotProductAttention(keras.layers.Layer):
    """Self-attention as the official `MultiHeadDotProductAttention_1` (paper Eq. 5-8, Appendix A).

    q, k, v kernels are (D, heads, head_dim) with biases (heads, head_dim); the output kernel is
    (heads, head_dim, D) with bias (D,); queries are scaled by 1/sqrt(head_dim). The three
    projections run as one (D, 3D) matmul, their kernels concatenated at call time (one pass over
    the input, one larger GEMM; the parameters keep the official layout) on the backends where
    that measured faster (torch, tensorflow). Without attention
    dropout in training and without `return_attention`, the fused attention path runs
    (`torch.nn.functional.scaled_dot_product_attention` on torch, `keras.ops.dot_product_attention`
    elsewhere); otherwise the softmax weights are formed explicitly.

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

    def _qkv(self, x):
        """q, k, v, each (B, T, heads, head_dim)."""
        layers = (self.query, self.key, self.value)
        if not _FUSED_QKV.get(keras.backend.backend()) or not all(_plain(layer) for layer in layers):
            return tuple(layer(x) for layer in layers)
        dim, n, h = x.shape[-1], self.num_heads, self.head_dim
        kernel = ops.concatenate([ops.reshape(layer.kernel, (dim, n * h)) for layer in layers], axis=-1)
        bias = ops.concatenate([ops.reshape(layer.bias, (n * h,)) for layer in layers], axis=0)
        qkv = dense(x, ops.cast(kernel, x.dtype), ops.cast(bias, x.dtype))
        qkv = ops.reshape(qkv, (-1, x.shape[1] if x.shape[1] is not None else ops.shape(x)[1], 3, n, h))
        return qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]

    def _out(self, y):
        """The output projection of y (B, T, heads, head_dim) -> (B, T, D)."""
        if not _FUSED_QKV.get(keras.backend.backend()) or not _plain(self.out):
            return self.out(y)
        dim = self.num_heads * self.head_dim
        y = ops.reshape(y, (-1, y.shape[1] if y.shape[1] is not None else ops.shape(y)[1], dim))
        kernel = ops.reshape(self.out.kernel, (dim, self.out.kernel.shape[-1]))
        return dense(y, ops.cast(kernel, y.dtype), ops.cast(self.out.bias, y.dtype))

    def logit_bias(self, q, scale):
        """A term added to the attention logits (B or 1, heads, T, T), or None (the default: the
        fused path runs). A hook for subclasses, e.g. relative position attention."""
        return None

    def call(self, x, training=None, return_attention=False):
        q, k, v = self._qkv(x)
        scale = 1.0 / math.sqrt(self.head_dim)
        bias = self.logit_bias(q, scale)
        if bias is None and not return_attention and not (training and self.dropout_rate > 0):
            return self._out(_fused_attention(q, k, v, scale, training=bool(training)))
        logits = ops.einsum("bqnh,bknh->bnqk", q * ops.cast(scale, q.dtype), k)
        if bias is not None:
            logits = logits + ops.cast(bias, logits.dtype)
        weights = ops.softmax(ops.cast(logits, "float32"), axis=-1)
        dropped = ops.cast(self.attention_dropout(weights, training=training), v.dtype)
        y = self._out(ops.einsum("bnqk,bknh->bqnh", dropped, v))
        return (y, weights) if return_attention else y

    def official_weights(self):
        return {
            f"{name}/{w}": getattr(layer, w)
            for name, layer in (("query", self.query), ("key", self.key), ("value", self.value), ("out", self.out))
            for w in ("kernel", "bias")
        }

    def get_config(self):
        return {**super().get_config(), "num_heads": self.num_heads, "dropout_rate": self.dropout_rate}
