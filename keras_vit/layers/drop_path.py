"""Stochastic depth (Huang et al. 2016, "Deep Networks with Stochastic Depth"; DeiT's and timm's
`drop_path`): in training, each residual branch of a block is dropped for whole samples, the kept
ones scaled by 1 / keep, so that the expected output is the branch's; the rate rises linearly with depth."""

import keras
from keras import ops


def check_drop_path_rate(rate, what="drop_path_rate"):
    """`rate` as a float, or a ValueError naming `what` and the range [0, 1) (TypeError for no number)."""
    if isinstance(rate, bool) or not isinstance(rate, (int, float)):
        raise TypeError(f"{what} must be a float in [0, 1), got {rate!r} ({type(rate).__name__})")
    if not 0.0 <= rate < 1.0:  # NaN included
        raise ValueError(f"{what} must be in [0, 1) (the probability of dropping a residual branch for a "
                         f"sample; 1 would drop it always), got {rate!r}")
    return float(rate)


def drop_path_rates(drop_path_rate, depth):
    """The rate of each of `depth` blocks: rising linearly from 0 (the first block) to `drop_path_rate`
    (the last), block i at i * drop_path_rate / (depth - 1); one block gets 0. timm's rule (its
    `torch.linspace(0, drop_path_rate, depth)`, here in float64).

    Args:
        drop_path_rate: the last block's rate, in [0, 1).
        depth: the number of blocks.
    """
    rate = check_drop_path_rate(drop_path_rate)
    if isinstance(depth, bool) or not isinstance(depth, int) or depth < 1:
        raise ValueError(f"depth must be a positive int, got {depth!r}")
    return [rate * (i / (depth - 1)) if depth > 1 else 0.0 for i in range(depth)]


def drop_path_keep(x, rate, seed=None):
    """Which samples of `x` keep a residual branch: a (B, 1, ..., 1) bool tensor, each entry True with
    probability 1 - `rate`, drawn with Keras' random ops from `seed` (a `keras.random.SeedGenerator`,
    as `keras.layers.Dropout` draws its masks)."""
    shape = (ops.shape(x)[0],) + (1,) * (len(x.shape) - 1)
    return keras.random.uniform(shape, seed=seed) >= rate


def drop_path(branch, keep, rate):
    """`branch` (B, ...) with the samples where `keep` is False set to zero and the others scaled by
    1 / (1 - rate), as timm's `drop_path(x, rate, training=True)` with the same draw.

    Args:
        branch: a residual branch's output, (B, ...).
        keep: (B, 1, ..., 1) bool, True for the samples that keep it (`drop_path_keep`).
        rate: the probability with which `keep` was drawn False, in [0, 1).
    """
    if not rate:
        return branch
    scale = ops.cast(1.0 / (1.0 - rate), branch.dtype)
    return ops.where(keep, branch * scale, ops.zeros_like(branch))

