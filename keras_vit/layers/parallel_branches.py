"""A block of several attentions side by side, then several MLPs side by side (Touvron et al. 2022, "Three things
everyone should know about Vision Transformers"; timm's ParallelThingsBlock, its `*_18x2_*` ViTs)."""

import keras

from keras_vit.layers.drop_path import drop_path_keep
from keras_vit.layers.norms import normalize
from keras_vit.layers.transformer_block import TransformerBlock


@keras.saving.register_keras_serializable(package="keras_vit")
class ParallelBranchesBlock(TransformerBlock):
    """`branches` pre-norm blocks' branches summed: x + sum_i attention_i(norm_i(x)), then the same sum of the MLPs
    on its result, each branch with its own norm, weights and layer scale: two blocks of half the depth side by side.

    Each branch is a `TransformerBlock` of this block's options (`branch_{i}`, its weights under that name in the
    official layout); the block's own call runs their parts. Not with rotary or relative positions, `post_norm`,
    `parallel` or `remat`.

    Args:
        num_heads, mlp_dim: each branch's (see `TransformerBlock`, with the other options).
        branches: how many attentions (and MLPs) side by side, at least 2.
    Call args:
        x: tokens (B, T, D).
        return_attention: also return the attention weights of every branch's heads, branch 0's first
            (B, branches * heads, T, T).
        valid: None, or (B, T) bool, the tokens attention reads.
        images: unused (no rotary positions).
    """

    def __init__(self, num_heads, mlp_dim, *args, branches=2, **kwargs):
        super().__init__(num_heads, mlp_dim, *args, **kwargs)
        if isinstance(branches, bool) or not isinstance(branches, int) or branches < 2:
            raise ValueError(f"ParallelBranchesBlock: branches must be an int of at least 2, got {branches!r}")
        unsupported = [k for k, on in (("rope", self.rope), ("relative_bias_grid", self.relative_bias_grid),
                                       ("relative_mlp", self.relative_mlp), ("post_norm", self.post_norm),
                                       ("parallel", self.parallel), ("remat", self.remat)) if on]
        if unsupported:
            raise ValueError(f"ParallelBranchesBlock: {', '.join(unsupported)} is not taken by a block of branches")
        self.branches = branches

    def build(self, input_shape):
        config = {k: v for k, v in super().get_config().items() if k not in ("name", "trainable", "dtype")}
        self.branch_blocks = [TransformerBlock(**config, name=f"branch_{i}", dtype=self.dtype_policy)
                              for i in range(self.branches)]
        for block in self.branch_blocks:
            block.build(input_shape)

    def call(self, x, training=None, return_attention=False, valid=None, images=None):
        paths = [[drop_path_keep(x, self.drop_path_rate, b.drop_path_seed) for _ in range(2)]
                 if training and self.drop_path_rate else () for b in self.branch_blocks]
        ys, maps = [], []
        for b, path in zip(self.branch_blocks, paths):
            y = b.attention(normalize(b.norm_0, x), training=training, return_attention=return_attention, valid=valid)
            if return_attention:
                y, weights = y
                maps.append(weights)
            ys.append(b._drop_branch(b._drop(b._scaled(y, 0), training, (), 0), path, 0))
        x = x + sum(ys[1:], ys[0])
        ys = [b._drop_branch(b._drop(b._scaled(b._mlp(normalize(b.norm_2, x), training, ()), 1), training, (), 2), path, 1)
              for b, path in zip(self.branch_blocks, paths)]
        x = x + sum(ys[1:], ys[0])
        return (x, keras.ops.concatenate(maps, axis=1)) if return_attention else x

    def official_weights(self):
        return {f"branch_{i}/{k}": v for i, b in enumerate(self.branch_blocks) for k, v in b.official_weights().items()}

    def get_config(self):
        return {**super().get_config(), "branches": self.branches}
