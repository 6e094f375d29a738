"""Differential attention (Ye et al. 2024, "Differential Transformer"; timm's DiffAttention): each head's output
is the difference of two softmax maps' readings of its values, normalised."""

import math

import keras
from keras import ops

from keras_vit.layers.attention import MultiHeadDotProductAttention, _fused_attention, _matmul_attention, mask_keys
from keras_vit.layers.initial import initial

SUB_NORM_EPSILON = 1e-5  # the paper's (and timm's) RMSNorm on each head's output


def lambda_init(depth):
    """The paper's initial lambda of the block at `depth` (0 for the first): 0.8 - 0.6 exp(-0.3 depth), also the
    output's scale 1 - lambda_init."""
    return 0.8 - 0.6 * math.exp(-0.3 * depth)


@keras.saving.register_keras_serializable(package="keras_vit")
class DifferentialAttention(MultiHeadDotProductAttention):
    """`MultiHeadDotProductAttention` whose heads each read their values with two maps: each head's queries and keys
    split in two halves (q1, k1 and q2, k2, of half the head size, scaled by its inverse square root), its output
    (softmax(q1 k1) - lambda softmax(q2 k2)) v, then an RMSNorm over the head (`sub_norm`, shared by the heads,
    epsilon 1e-5) and the scale 1 - lambda_init, before the output projection.
    lambda = exp(lambda_q1 . lambda_k1) - exp(lambda_q2 . lambda_k2) + lambda_init, from four learned vectors of half
    the head size (timm's and the paper's parameterisation), lambda_init = `lambda_init(depth)`.

    Args:
        num_heads: the heads (each of two maps).
        depth: the block's index (0 for the first), which sets lambda_init.
        **kwargs: `MultiHeadDotProductAttention`'s.
    Call args: `MultiHeadDotProductAttention`'s; `return_attention` returns each head's difference of maps
        (B, heads, T, T), the one its values are read with. No rotary positions.
    """

    def __init__(self, num_heads, depth=0, **kwargs):
        super().__init__(num_heads, **kwargs)
        if self.qk_norm:
            raise ValueError("DifferentialAttention: qk_norm is not taken (the norms would span half a head)")
        if isinstance(depth, bool) or not isinstance(depth, int) or depth < 0:
            raise ValueError(f"DifferentialAttention: depth must be a non-negative int, got {depth!r}")
        self.depth = depth

    def build(self, input_shape):
        super().build(input_shape)
        if self.head_dim % 2:
            raise ValueError(f"{self.name}: differential attention splits each head in two, got a head size of "
                             f"{self.head_dim}")
        half = self.head_dim // 2
        init = initial(keras.initializers.RandomNormal(stddev=0.1))
        self.lambdas = [self.add_weight(name=name, shape=(half,), initializer=init)
                        for name in ("lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2")]
        self.sub_norm = keras.layers.RMSNormalization(epsilon=SUB_NORM_EPSILON, name="sub_norm", dtype=self.dtype_policy)
        self.sub_norm.build((*input_shape[:-1], self.num_heads, self.head_dim))

    def _lambda(self, dtype):
        q1, k1, q2, k2 = (ops.cast(w, "float32") for w in self.lambdas)
        return ops.cast(ops.exp(ops.sum(q1 * k1)) - ops.exp(ops.sum(q2 * k2)) + lambda_init(self.depth), dtype)

    def call(self, x, training=None, return_attention=False, valid=None, rope=None, rope_prefix_tokens=0):
        if rope is not None:
            raise ValueError(f"{self.name}: differential attention takes no rotary positions")
        q, k, v = self._qkv(x)
        half = self.head_dim // 2
        scale, lam = 1.0 / math.sqrt(half), self._lambda(v.dtype)
        halves = [(q[..., i * half:(i + 1) * half], k[..., i * half:(i + 1) * half]) for i in range(2)]
        if not return_attention and not (training and self.dropout_rate > 0):
            # values twice the queries' size: torch's SDPA takes them, XLA's attention (the other backends' fused
            # path off the CPU) does not, so those run the batched matmuls their CPU path runs
            attend = _fused_attention if keras.backend.backend() == "torch" else _matmul_attention
            y = attend(*halves[0], v, scale, valid=valid) - lam * attend(*halves[1], v, scale, valid=valid)
            weights = None
        else:
            maps = [ops.softmax(mask_keys(ops.cast(ops.einsum("bqnh,bknh->bnqk", qi * ops.cast(scale, qi.dtype), ki),
                                                   "float32"), valid), axis=-1) for qi, ki in halves]
            weights = maps[0] - ops.cast(lam, "float32") * maps[1]
            dropped = [self.attention_dropout(m, training=training) for m in maps]  # each map's, as timm drops them
            y = ops.einsum("bnqk,bknh->bqnh", ops.cast(dropped[0] - ops.cast(lam, "float32") * dropped[1], v.dtype), v)
        y = self._out(self.sub_norm(y) * ops.cast(1.0 - lambda_init(self.depth), y.dtype))
        return (y, weights) if return_attention else y

    def official_weights(self):
        params = super().official_weights() | {"sub_norm/scale": self.sub_norm.scale}
        return params | {w.name: w for w in self.lambdas}

    def get_config(self):
        return {**super().get_config(), "depth": self.depth}
