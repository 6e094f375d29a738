"""Multi-head dot-product self-attention with the official per-head parameter layout."""

import logging
import math

import keras
from keras import ops

from keras_vit.layers.initial import initial
from keras_vit.layers.norms import check_normalization, make_norm, norm_weights, normalize
from keras_vit.layers.rotary import rotate_patches
from keras_vit.runtime import per_platform

# "flash": the device's fused attention kernel (cuDNN's on JAX, flash/cuDNN SDPA on torch);
# "standard": the path without it; "auto": flash where `flash_unavailable` finds nothing against it
ATTENTION_IMPLEMENTATIONS = ("auto", "flash", "standard")
FLASH_DTYPES = ("bfloat16", "float16")
FLASH_MAX_HEAD_DIM = 128  # cuDNN's fused attention: head sizes that are multiples of 8, up to 128
# JAX training on cuDNN's kernel: the sequence padded to a multiple of this, the padding masked
# (cuDNN's backward refused ViT's 197 tokens)
CUDNN_TRAINING_MULTIPLE = 64
_LOGGED = set()


def flash_unavailable(head_dim, dtype):
    """Why the fused (flash) attention kernel cannot run on this backend and device for heads of
    `head_dim` computed in `dtype`, or None when it can."""
    backend = keras.backend.backend()
    if backend == "tensorflow":
        return "the tensorflow backend has no fused attention kernel"
    if backend == "jax":
        import jax

        if jax.default_backend() != "gpu":
            return f"JAX computes on {jax.default_backend()!r}; cuDNN's fused attention needs an NVIDIA GPU"
    elif backend == "torch":
        import torch

        if not torch.cuda.is_available():
            return "torch has no CUDA device; the fused attention kernels need an NVIDIA GPU"
    else:
        return f"no fused attention kernel is wired for the {backend} backend"
    if dtype not in FLASH_DTYPES:
        return f"it needs bfloat16 or float16, the layer computes in {dtype} (use the 'mixed_bfloat16' policy)"
    if head_dim % 8 or head_dim > FLASH_MAX_HEAD_DIM:
        return f"head size {head_dim} is not a multiple of 8 up to {FLASH_MAX_HEAD_DIM}"
    return None


def _log_once(message):
    if message not in _LOGGED:
        _LOGGED.add(message)
        logging.getLogger("keras_vit").info(message)


def _plain(layer):
    """True when `layer`'s kernel is a float kernel (not quantized): the fused paths below read it as
    `layer.kernel`, which with LoRA on is Keras' `W + (alpha / rank) * A @ B`; otherwise the layer's
    own call runs."""
    return layer.quantization_mode is None


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


def _torch(value, dtype):
    """A Keras variable's torch tensor (or a torch tensor: a LoRA kernel), as `dtype`."""
    value = value.value if isinstance(value, keras.Variable) else value
    return value if value.dtype == dtype else value.to(dtype)


def mask_keys(logits, valid):
    """float32 `logits` (B, heads, Tq, Tk) with the keys that are not `valid` (B, Tk) bool, or None
    for all, taken out of the softmax (a NaFlex batch's padding)."""
    if valid is None:
        return logits
    return ops.where(valid[:, None, None, :], logits, ops.full_like(logits, -1e30))


def _matmul_attention(q, k, v, scale, valid=None, bias=None):
    """Attention as two batched matmuls in (B, heads, T, head_dim) layout with a float32 softmax, `bias`
    (B or 1, heads, T, T) or None added to the logits.

    On XLA:CPU and oneDNN this ran faster than einsums in (B, T, heads, head_dim) layout, with
    identical outputs (benchmarks/README.md).
    """
    q, k, v = (ops.swapaxes(t, 1, 2) for t in (q, k, v))
    logits = ops.matmul(q * ops.cast(scale, q.dtype), ops.swapaxes(k, -1, -2))
    if bias is not None:
        logits = logits + ops.cast(bias, logits.dtype)
    weights = ops.cast(ops.softmax(mask_keys(ops.cast(logits, "float32"), valid), axis=-1), v.dtype)
    return ops.swapaxes(ops.matmul(weights, v), 1, 2)


def padded_attention(q, k, v, scale, multiple=CUDNN_TRAINING_MULTIPLE, implementation="cudnn", valid=None):
    """JAX: softmax(q k^T * scale) v for q, k, v (B, T, heads, head_dim), with T padded to a
    multiple of `multiple` and the padded keys and queries masked out (`jax.nn.dot_product_attention`'s
    sequence lengths), the padding sliced off after: the same values and gradients as unpadded
    attention. `implementation="xla"` runs it anywhere (the tests); "cudnn" is the GPU kernel.
    `valid` (B, T) bool: a NaFlex batch's tokens, the valid ones first; the others are masked too."""
    import jax
    import jax.numpy as jnp

    batch, tokens = q.shape[0], q.shape[1]
    pad = -tokens % multiple
    lengths = jnp.full((batch,), tokens, "int32") if valid is None else jnp.sum(valid, axis=1, dtype="int32")
    if not pad and valid is None:
        return jax.nn.dot_product_attention(q, k, v, scale=scale, implementation=implementation)
    q, k, v = (jnp.pad(t, ((0, 0), (0, pad), (0, 0), (0, 0))) for t in (q, k, v))
    y = jax.nn.dot_product_attention(q, k, v, scale=scale, query_seq_lengths=lengths,
                                     key_value_seq_lengths=lengths, implementation=implementation)
    return y[:, :tokens]


def _flash_attention(q, k, v, scale, training=False, valid=None):
    """softmax(q k^T * scale) v for q, k, v (B, T, heads, head_dim) through the GPU's fused kernel
    (`flash_unavailable` has said it runs here); JAX training takes `padded_attention`.

    With `valid` (a NaFlex batch: the valid tokens first, the padding after), JAX's kernel takes the
    number of valid tokens as its sequence lengths; torch's flash kernel takes no mask, so SDPA picks
    among its kernels that do."""
    if keras.backend.backend() == "torch":
        import torch
        from torch.nn.attention import SDPBackend, sdpa_kernel

        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        if valid is not None:
            mask = valid[:, None, None, :]
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale).transpose(1, 2)
        with sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.CUDNN_ATTENTION]):
            y = torch.nn.functional.scaled_dot_product_attention(q, k, v, scale=scale)
        return y.transpose(1, 2)
    if training:
        return padded_attention(q, k, v, scale, valid=valid)
    import jax

    lengths = None if valid is None else ops.sum(ops.cast(valid, "int32"), axis=1)
    return jax.nn.dot_product_attention(q, k, v, scale=scale, query_seq_lengths=lengths,
                                        key_value_seq_lengths=lengths, implementation="cudnn")


def _fused_attention(q, k, v, scale, valid=None, bias=None):
    """softmax(q k^T * scale + bias) v for q, k, v (B, T, heads, head_dim), the backend's standard path;
    keys not `valid` (B, T) bool, when given, masked; `bias` (B or 1, heads, T, T), when given (not with
    `valid`), added to the logits (a relative position bias)."""
    backend = keras.backend.backend()
    if bias is not None and valid is not None:
        raise ValueError("_fused_attention takes a logit bias or a key mask, not both")
    if backend == "torch":
        import torch

        # (B, heads, T, head_dim) views straight into SDPA (flash / memory-efficient kernels where
        # the device has them): no contiguous copies of q, k, v as keras.ops makes
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        mask = bias.to(q.dtype) if bias is not None else None if valid is None else valid[:, None, None, :]
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale).transpose(1, 2)
    # batched matmuls in (B, heads, T, head_dim) layout on a CPU: faster on oneDNN and XLA:CPU;
    # elsewhere XLA's attention (cuDNN's fused kernel is `_flash_attention`, chosen in the layer's build)
    return per_platform(q, k, v, valid, bias,
                        cpu=lambda q, k, v, valid, bias: _matmul_attention(q, k, v, scale, valid, bias),
                        default=lambda q, k, v, valid, bias: ops.dot_product_attention(
                            q, k, v, bias=None if bias is None else ops.cast(bias, q.dtype),
                            mask=None if valid is None else valid[:, None, None, :], scale=scale,
                            flash_attention=False))


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
    elsewhere; a subclass's `logit_bias` goes in as the kernels' additive mask or bias, except beside a
    NaFlex key mask); otherwise the softmax weights are formed explicitly.

    Args:
        num_heads: number of heads; must divide the input width.
        dropout_rate: dropout on the attention weights (training only).
        attention_implementation: "auto" (the default): the GPU's fused (flash) attention kernel
            where the backend, device, dtype (bfloat16/float16) and head size allow it (JAX training
            through `padded_attention`: the sequence padded to a multiple of 64, the padding
            masked), else the standard path, saying why in one log line; "flash": that kernel, a
            ValueError when the layer is built where it cannot run; "standard": never that kernel.
        inner_norm: a LayerNorm `inner_norm` (epsilon `layer_norm_epsilon`; an RMSNorm with
            `normalization="rms_norm"`) on the heads' concatenated outputs before the output projection (EVA-02
            CLIP's; timm's `scale_attn_inner`); False by default.
        qk_norm: a norm of the same kind (`q_norm`, `k_norm`) on each head's queries and keys, over the head's
            size, its parameters shared by the heads, before any rotation (timm's `qk_norm`, ViT-22B's); False by
            default.
    Call args:
        x: tokens (B, T, D).
        return_attention: also return the softmax weights (B, heads, T, T).
        valid: None, or (B, T) bool: the keys that take part (a NaFlex batch's padding is False,
            after the valid tokens); every path masks the others, the fused GPU kernels as sequence
            lengths.
        rope: None, or (sin, cos): the queries and keys of the tokens after the first
            `rope_prefix_tokens` rotated by these tables (T - prefix, head_dim) before the attention
            (`keras_vit.layers.rotary`); every path, the fused ones included, then runs as without.
        grid: None, or the (h, w) patch grid of this call, passed to `logit_bias` (a relative position
            bias computed for the grid of each call's images).
    """

    def __init__(self, num_heads, dropout_rate=0.0, attention_implementation="auto", inner_norm=False,
                 layer_norm_epsilon=1e-6, normalization="layer_norm", qk_norm=False, **kwargs):
        super().__init__(**kwargs)
        self.inner_norm, self.layer_norm_epsilon = bool(inner_norm), float(layer_norm_epsilon)
        self.qk_norm = bool(qk_norm)
        self.normalization = check_normalization(normalization)
        self.num_heads = int(num_heads)
        self.dropout_rate = float(dropout_rate)
        self.attention_implementation = check_attention_implementation(attention_implementation)

    def build(self, input_shape):
        dim = input_shape[-1]
        if dim % self.num_heads:
            raise ValueError(f"hidden size {dim} is not divisible by num_heads {self.num_heads}")
        self.head_dim = dim // self.num_heads
        kernel = initial("glorot_uniform")
        proj = dict(equation="btd,dnh->btnh", output_shape=(None, self.num_heads, self.head_dim), bias_axes="nh",
                    kernel_initializer=kernel)
        self.query = keras.layers.EinsumDense(**proj, name="query", dtype=self.dtype_policy)
        self.key = keras.layers.EinsumDense(**proj, name="key", dtype=self.dtype_policy)
        self.value = keras.layers.EinsumDense(**proj, name="value", dtype=self.dtype_policy)
        self.out = keras.layers.EinsumDense(
            "btnh,nhd->btd", output_shape=(None, dim), bias_axes="d", name="out", dtype=self.dtype_policy,
            kernel_initializer=kernel,
        )
        for layer in (self.query, self.key, self.value):
            layer.build(input_shape)
        self.out.build((*input_shape[:-1], self.num_heads, self.head_dim))
        self.norm = None
        if self.inner_norm:
            self.norm = make_norm(self.normalization, self.layer_norm_epsilon, "inner_norm", self.dtype_policy)
            self.norm.build((*input_shape[:-1], dim))
        self.qk_norms = ()
        if self.qk_norm:
            self.qk_norms = tuple(make_norm(self.normalization, self.layer_norm_epsilon, name, self.dtype_policy)
                                  for name in ("q_norm", "k_norm"))
            for norm in self.qk_norms:
                norm.build((*input_shape[:-1], self.num_heads, self.head_dim))
        self.attention_dropout = keras.layers.Dropout(self.dropout_rate)
        self.flash = self.attention_implementation != "standard" and self._flash_possible()

    def _flash_possible(self):
        why = flash_unavailable(self.head_dim, keras.backend.standardize_dtype(self.compute_dtype))
        if why and self.attention_implementation == "flash":
            raise ValueError(f"{self.name}: attention_implementation='flash' cannot run here: {why}; "
                             "use 'auto' (the fused kernel where it runs) or 'standard'")
        if why:
            _log_once(f"keras_vit: fused (flash) attention off, the standard path runs: {why}")
        return not why

    def _qkv(self, x):
        """q, k, v, each (B, T, heads, head_dim)."""
        layers = (self.query, self.key, self.value)
        if not _FUSED_QKV.get(keras.backend.backend()) or not all(_plain(layer) for layer in layers):
            return tuple(layer(x) for layer in layers)
        dim, n, h = x.shape[-1], self.num_heads, self.head_dim
        if keras.backend.backend() == "torch":  # torch's own ops: Keras' converts each argument once more
            import torch

            kernel = torch.cat([_torch(layer.kernel, x.dtype).reshape(dim, n * h) for layer in layers], dim=-1)
            bias = torch.cat([_torch(layer.bias, x.dtype).reshape(n * h) for layer in layers])
            # the layout keras_vit.export.onnx_rewrites finds in the ONNX file to split the projection again
            qkv = torch.nn.functional.linear(x, kernel.T, bias).reshape(-1, x.shape[1], 3, n, h)
            return qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
        kernel = ops.concatenate([ops.reshape(layer.kernel, (dim, n * h)) for layer in layers], axis=-1)
        bias = ops.concatenate([ops.reshape(layer.bias, (n * h,)) for layer in layers], axis=0)
        qkv = dense(x, ops.cast(kernel, x.dtype), ops.cast(bias, x.dtype))
        qkv = ops.reshape(qkv, (-1, x.shape[1] if x.shape[1] is not None else ops.shape(x)[1], 3, n, h))
        return qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]

    def _out(self, y):
        """The output projection of y (B, T, heads, head_dim) -> (B, T, D), after the inner norm if any."""
        if self.norm is not None:
            tokens = y.shape[1] if y.shape[1] is not None else ops.shape(y)[1]
            y = normalize(self.norm, ops.reshape(y, (-1, tokens, self.num_heads * self.head_dim)))
            y = ops.reshape(y, (-1, tokens, self.num_heads, self.head_dim))
        if not _FUSED_QKV.get(keras.backend.backend()) or not _plain(self.out):
            return self.out(y)
        dim = self.num_heads * self.head_dim
        if keras.backend.backend() == "torch":
            import torch

            kernel = _torch(self.out.kernel, y.dtype).reshape(dim, -1)
            return torch.nn.functional.linear(y.flatten(-2), kernel.T, _torch(self.out.bias, y.dtype))
        y = ops.reshape(y, (-1, y.shape[1] if y.shape[1] is not None else ops.shape(y)[1], dim))
        kernel = ops.reshape(self.out.kernel, (dim, self.out.kernel.shape[-1]))
        return dense(y, ops.cast(kernel, y.dtype), ops.cast(self.out.bias, y.dtype))

    def logit_bias(self, q, scale, training=None, grid=None):
        """A term added to the attention logits (B or 1, heads, T, T), or None (the default: the
        fused path runs). A hook for subclasses, e.g. relative position attention; `grid`: None, or
        the (h, w) patch grid of this call (ints or scalar tensors), for a bias that reads it."""
        return None

    def call(self, x, training=None, return_attention=False, valid=None, rope=None, rope_prefix_tokens=0, grid=None):
        q, k, v = self._qkv(x)
        if self.qk_norms:
            q, k = (normalize(norm, t) for norm, t in zip(self.qk_norms, (q, k)))
        if rope is not None:
            q, k = (rotate_patches(t, *rope, rope_prefix_tokens) for t in (q, k))
        scale = 1.0 / math.sqrt(self.head_dim)
        bias = self.logit_bias(q, scale, training, grid)
        if not return_attention and not (training and self.dropout_rate > 0) and (bias is None or valid is None):
            if self.flash and bias is None:
                return self._out(_flash_attention(q, k, v, scale, training=bool(training), valid=valid))
            return self._out(_fused_attention(q, k, v, scale, valid, bias))
        logits = ops.einsum("bqnh,bknh->bnqk", q * ops.cast(scale, q.dtype), k)
        if bias is not None:
            logits = logits + ops.cast(bias, logits.dtype)
        weights = ops.softmax(mask_keys(ops.cast(logits, "float32"), valid), axis=-1)
        dropped = ops.cast(self.attention_dropout(weights, training=training), v.dtype)
        y = self._out(ops.einsum("bnqk,bknh->bqnh", dropped, v))
        return (y, weights) if return_attention else y

    def official_weights(self):
        params = {
            f"{name}/{w}": getattr(layer, w)
            for name, layer in (("query", self.query), ("key", self.key), ("value", self.value), ("out", self.out))
            for w in ("kernel", "bias")
        }
        if self.norm is not None:
            params |= {f"inner_norm/{k}": v for k, v in norm_weights(self.norm).items()}
        for norm in self.qk_norms:
            params |= {f"{norm.name}/{k}": v for k, v in norm_weights(norm).items()}
        return params

    def get_config(self):
        return {**super().get_config(), "num_heads": self.num_heads, "dropout_rate": self.dropout_rate,
                "attention_implementation": self.attention_implementation, "inner_norm": self.inner_norm,
                "layer_norm_epsilon": self.layer_norm_epsilon, "normalization": self.normalization,
                "qk_norm": self.qk_norm}


def check_attention_implementation(value):
    """`value` if it names an attention implementation, else a ValueError listing them."""
    if value not in ATTENTION_IMPLEMENTATIONS:
        raise ValueError(f"unknown attention_implementation {value!r}; expected one of {ATTENTION_IMPLEMENTATIONS}")
    return value
