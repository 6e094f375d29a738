"""Repeated augmentation (Hoffer et al. 2020; DeiT's `RASampler`, timm's `RepeatAugSampler`, `--aug-repeats`):
each image k times in a row of a pass, every copy with its own augmentation draws.

A pass of `plan_pass` (keras_vit.data.stream) with ``aug_repeats=k`` is the pass's permutation of the n
training images with each image repeated k times in place (``[a, a, a, b, b, b, ...]``), cut to its first
n positions: a pass keeps the length of a pass without repeats (n examples), as timm and DeiT keep their
epoch's, so ``floor(n / k)`` images appear k times (and the next one ``n mod k`` times) and the others wait
for a later pass, in a new permutation. timm's sampler picks the same first positions (``selected_round=0``;
its default ``selected_round=256``, DeiT's rule, also rounds the pass down to a multiple of 256 images,
which on a folder of a few hundred images would drop up to half of them: not done here), and every global
batch holds the same examples as timm's batches of all ranks at that step: timm hands position j to rank
j mod R, keras-vit's `Stream` hands each process a block of rows of every global batch (`this_process`);
the global batch, and so the averaged gradient, is the same. The copies of an image mostly land in one
process's rows rather than on k ranks; nothing in a ViT (no batch norm) depends on that.

The copies differ because every draw is keyed on the position in the pass, not on the image: the crop
and flip of position j are `plan_pass`'s j-th draws, and an augmentation drawn per image (random erasing,
RandAugment) takes the generator `position_rng(seed, pass, j, stream)`. Since the length of a pass does
not change, `skip_batches` and `--resume` find their place in the stream as without repeats, and the plan
of pass e stays a pure function of (seed, e). ``aug_repeats=1`` is the plan without repeats, bit for bit.
"""

import numpy as np


def repeat_order(order, aug_repeats):
    """The first ``len(order)`` positions of `order` (a pass's permutation) with each entry repeated
    `aug_repeats` times in place; `aug_repeats` a positive integer (checked by the caller)."""
    order = np.asarray(order)
    return order if aug_repeats == 1 else np.repeat(order, aug_repeats)[:len(order)]


__all__ = ["repeat_order"]
