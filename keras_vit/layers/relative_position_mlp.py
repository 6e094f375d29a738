"""timm's relative position MLP (`vision_transformer_relpos.py`'s RelPosMlp in its "cr" mode, after Swin-V2's
log-spaced coordinates): a two-layer MLP maps each offset (dy, dx) between two patches, as sign(d) log(1 + |d|), to a
bias per head on their attention logit; prefix tokens get none. The bias is computed from the grid, so the same
weights serve a model built at another grid, and a layer given the grid of each call (`grid=`, a model that takes
any size) computes it for that grid there."""

import keras
import numpy as np
from keras import ops

from keras_vit.layers.attention import MultiHeadDotProductAttention
from keras_vit.layers.initial import initial
from keras_vit.layers.position_embedding import is_grid
from keras_vit.layers.relative_position_bias import offset_index, relative_position_index

MLP_DROPOUT = 0.125  # timm's, after the MLP's ReLU, in training


def log_offsets(grid_h, grid_w):
    """((2h - 1)(2w - 1), 2) float32: every offset (dy, dx) between two patches of an (h, w) grid, row-major (the rows
    of `relative_position_index`), as sign(d) log(1 + |d|)."""
    dy, dx = np.meshgrid(np.arange(1 - grid_h, grid_h), np.arange(1 - grid_w, grid_w), indexing="ij")
    offsets = np.stack([dy, dx], -1).reshape(-1, 2).astype("float32")
    return (np.sign(offsets) * np.log1p(np.abs(offsets))).astype("float32")


def log_offsets_of(grid_h, grid_w):
    """`log_offsets` with keras.ops in `offset_index`'s layout ((2h)(2w) rows, the last row and column past the
    offsets unread), the sides ints or scalar tensors (a grid read off the images at call time)."""
    dy, dx = (ops.cast(ops.arange(2 * n, dtype="int32") - (n - 1), "float32") for n in (grid_h, grid_w))
    shape = (ops.shape(dy)[0], ops.shape(dx)[0])
    offsets = ops.stack([ops.broadcast_to(dy[:, None], shape), ops.broadcast_to(dx[None, :], shape)], axis=-1)
    offsets = ops.reshape(offsets, (-1, 2))
    return ops.sign(offsets) * ops.log(1.0 + ops.abs(offsets))  # as timm writes it (ONNX has no log1p)


@keras.saving.register_keras_serializable(package="keras_vit")
class RelativeMlpAttention(MultiHeadDotProductAttention):
    """`MultiHeadDotProductAttention` plus timm's relative position MLP on the logits: `Dense_0` (2 -> hidden_dim,
    ReLU, dropout 0.125 in training) and `Dense_1` (-> heads) under `RelPosMlp`, evaluated on the log offsets of an
    (h, w) grid and read through `relative_position_index`; the `num_prefix_tokens` leading tokens get no bias. The
    explicit softmax path runs (the bias is one more logit term). Called with `grid=` (h, w) of another grid, the
    bias is computed for it there.

    Args:
        num_heads: attention heads.
        grid_size: (h, w), the patch grid the bias is computed for.
        hidden_dim: the MLP's hidden width (timm's rel_pos_dim; 128 where it sets none).
        num_prefix_tokens: leading tokens (a class token) before the grid.
        dropout_rate, ...: as `MultiHeadDotProductAttention`.
    """

    def __init__(self, num_heads, grid_size, hidden_dim=128, num_prefix_tokens=0, **kwargs):
        super().__init__(num_heads, **kwargs)
        self.grid_size = tuple(int(v) for v in grid_size)
        self.hidden_dim, self.num_prefix_tokens = int(hidden_dim), int(num_prefix_tokens)

    def build(self, input_shape):
        super().build(input_shape)
        h, w = self.grid_size
        tokens = self.num_prefix_tokens + h * w
        if input_shape[1] is not None and input_shape[1] != tokens:
            raise ValueError(f"{self.name}: the relative position MLP is computed for {self.num_prefix_tokens} prefix "
                             f"tokens and a {h}x{w} grid ({tokens} tokens), got {input_shape[1]} tokens")
        init = dict(kernel_initializer=initial("glorot_uniform"), dtype=self.dtype_policy)
        self.mlp_0 = keras.layers.Dense(self.hidden_dim, name="Dense_0", **init)
        self.mlp_1 = keras.layers.Dense(self.num_heads, name="Dense_1", **init)
        self.mlp_0.build((None, 2))
        self.mlp_1.build((None, self.hidden_dim))
        self.mlp_dropout = keras.layers.Dropout(MLP_DROPOUT, dtype=self.dtype_policy)
        self.offsets = log_offsets(h, w)
        self.index = relative_position_index(h, w)[1:, 1:].reshape(-1)  # the patches' rows: no class token here

    def logit_bias(self, q, scale, training=None, grid=None):
        if grid is None or is_grid(grid, self.grid_size):
            grid, offsets, index = self.grid_size, self.offsets, self.index
        else:  # another grid, known when called
            offsets, index = log_offsets_of(*grid), ops.reshape(offset_index(*grid), (-1,))
        hidden = self.mlp_dropout(ops.relu(self.mlp_0(ops.cast(offsets, q.dtype))), training=training)
        patches = grid[0] * grid[1]
        bias = ops.take(self.mlp_1(hidden), index, axis=0)  # (N * N, heads)
        bias = ops.transpose(ops.reshape(bias, (patches, patches, self.num_heads)), (2, 0, 1))
        p = self.num_prefix_tokens
        return ops.pad(bias, ((0, 0), (p, 0), (p, 0)))[None] if p else bias[None]

    def official_weights(self):
        return {**super().official_weights(),
                **{f"RelPosMlp/{name}/{w}": getattr(layer, w) for name, layer in (("Dense_0", self.mlp_0),
                                                                                  ("Dense_1", self.mlp_1))
                   for w in ("kernel", "bias")}}

    def get_config(self):
        return {**super().get_config(), "grid_size": self.grid_size, "hidden_dim": self.hidden_dim,
                "num_prefix_tokens": self.num_prefix_tokens}
