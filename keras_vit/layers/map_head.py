"""Multihead attention pooling (MAP, Lee et al. 2019), SigLIP's head: a learned probe attends over
the tokens, then a residual MLP (none in AIMv2's head); its output is the pooled representation."""

import math

import keras
from keras import ops

from keras_vit.layers.attention import mask_keys
from keras_vit.layers.initial import initial
from keras_vit.layers.mlp import activate, check_mlp_activation
from keras_vit.layers.norms import check_normalization, make_norm, norm_weights


@keras.saving.register_keras_serializable(package="keras_vit")
class MAPHead(keras.layers.Layer):
    """(B, T, D) -> (B, D): `y = attend(probe, tokens); y + MLP(LN(y))` (big_vision's `MAPHead`).

    Parameters in big_vision's layout under `MAPHead_0`: `probe` (1, 1, D), the attention's
    `query`/`key`/`value` kernels (D, heads, head_dim) and biases (heads, head_dim), `out` kernel
    (heads, head_dim, D), `LayerNorm_0` and the MLP's `Dense_0`/`Dense_1`.

    Args:
        num_heads: attention heads.
        mlp_dim: hidden width of the MLP; 0: no norm and no MLP after the attention (AIMv2's head).
        num_prefix_tokens: leading tokens the probe does not attend to (timm's VisionTransformer pools patch
            tokens only; its Eva, Perception Encoder's, every token: 0).
        layer_norm_epsilon, approximate_gelu, mlp_activation, normalization: as the encoder blocks'.
    Call args:
        tokens: (B, T, D).
        valid: None, or (B, T) bool: the tokens the probe attends to (a NaFlex batch's padding is False).
    """

    def __init__(self, num_heads, mlp_dim, num_prefix_tokens=0, layer_norm_epsilon=1e-6, approximate_gelu=True,
                 mlp_activation="gelu", normalization="layer_norm", **kwargs):
        super().__init__(**kwargs)
        self.normalization = check_normalization(normalization)
        self.num_heads, self.mlp_dim = int(num_heads), int(mlp_dim)
        self.num_prefix_tokens = int(num_prefix_tokens)
        self.layer_norm_epsilon = float(layer_norm_epsilon)
        self.approximate_gelu = bool(approximate_gelu)
        self.mlp_activation = check_mlp_activation(mlp_activation)
        if self.mlp_dim < 0:
            raise ValueError(f"MAPHead's mlp_dim must be positive, or 0 for no MLP, got {mlp_dim!r}")
        if self.mlp_activation == "swiglu" and self.mlp_dim:
            raise ValueError("MAPHead's MLP is a plain two-layer MLP; mlp_activation='swiglu' has no such head")
        self.input_spec = keras.InputSpec(ndim=3)

    def build(self, input_shape):
        dim = input_shape[-1]
        if dim % self.num_heads:
            raise ValueError(f"hidden size {dim} is not divisible by num_heads {self.num_heads}")
        heads, head_dim, policy = self.num_heads, dim // self.num_heads, self.dtype_policy
        self.probe = self.add_weight(name="probe", shape=(1, 1, dim), initializer=initial("glorot_uniform"))
        init = dict(kernel_initializer=initial("glorot_uniform"), dtype=policy)
        proj = dict(equation="btd,dnh->btnh", output_shape=(None, heads, head_dim), bias_axes="nh", **init)
        self.query, self.key, self.value = (keras.layers.EinsumDense(**proj, name=n) for n in ("query", "key", "value"))
        self.out = keras.layers.EinsumDense("btnh,nhd->btd", output_shape=(None, dim), bias_axes="d", name="out", **init)
        for layer in (self.query, self.key, self.value):
            layer.build((None, None, dim))
        self.out.build((None, 1, heads, head_dim))
        if self.mlp_dim:
            self.norm = make_norm(self.normalization, self.layer_norm_epsilon, "LayerNorm_0", policy)
            self.mlp_0 = keras.layers.Dense(self.mlp_dim, name="Dense_0", **init)
            self.mlp_1 = keras.layers.Dense(dim, name="Dense_1", **init)
            self.norm.build((None, 1, dim))
            self.mlp_0.build((None, 1, dim))
            self.mlp_1.build((None, 1, self.mlp_dim))

    def call(self, tokens, valid=None):
        tokens = tokens[:, self.num_prefix_tokens:]
        valid = None if valid is None else valid[:, self.num_prefix_tokens:]
        probe = ops.broadcast_to(ops.cast(self.probe, tokens.dtype), (ops.shape(tokens)[0], 1, tokens.shape[-1]))
        q, k, v = self.query(probe), self.key(tokens), self.value(tokens)
        scale = ops.cast(1.0 / math.sqrt(q.shape[-1]), q.dtype)
        logits = ops.einsum("bqnh,bknh->bnqk", q * scale, k)
        weights = ops.cast(ops.softmax(mask_keys(ops.cast(logits, "float32"), valid), axis=-1), v.dtype)
        y = self.out(ops.einsum("bnqk,bknh->bqnh", weights, v))
        if self.mlp_dim:
            y = y + self.mlp_1(activate(self.mlp_0(self.norm(y)), self.mlp_activation, self.approximate_gelu))
        return y[:, 0]

    def compute_output_shape(self, input_shape):
        return (input_shape[0], input_shape[2])

    def official_weights(self):
        params = {"probe": self.probe}
        for name in ("query", "key", "value", "out"):
            layer = getattr(self, name)
            params |= {f"MultiHeadDotProductAttention_0/{name}/{w}": getattr(layer, w) for w in ("kernel", "bias")}
        if self.mlp_dim:
            params |= {f"LayerNorm_0/{k}": v for k, v in norm_weights(self.norm).items()}
            for name, layer in (("Dense_0", self.mlp_0), ("Dense_1", self.mlp_1)):
                params |= {f"MlpBlock_0/{name}/kernel": layer.kernel, f"MlpBlock_0/{name}/bias": layer.bias}
        return params

    def get_config(self):
        return {**super().get_config(), "num_heads": self.num_heads, "mlp_dim": self.mlp_dim,
                "num_prefix_tokens": self.num_prefix_tokens, "layer_norm_epsilon": self.layer_norm_epsilon,
                "approximate_gelu": self.approximate_gelu, "mlp_activation": self.mlp_activation,
                "normalization": self.normalization}
