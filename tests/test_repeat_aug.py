"""Repeated augmentation (keras_vit.data.repeat_aug, plan_pass's `aug_repeats`): each image k times in a row of
a pass as long as before, the global batches of timm's `RepeatAugSampler`, the processes' shards disjoint and
covering the pass, the copies drawn apart, `aug_repeats=1` today's plan bit for bit, bad k refused."""

import collections
import os
import sys

import numpy as np
import pytest

from keras_vit.data.repeat_aug import repeat_order
from keras_vit.data.stream import ERASE_STREAM, crop_boxes, plan_pass, position_rng, this_process

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
pytestmark = pytest.mark.backend_independent  # numpy, and TensorFlow's tf.data on any lane


def _records(n, seed=0):
    """plan_pass's view of a folder's training records: (path, label, height, width, decoder)."""
    sizes = np.random.default_rng(seed).integers(24, 300, size=(n, 2))
    return [(f"{i}.jpg", i % 5, int(h), int(w), 1) for i, (h, w) in enumerate(sizes)]


def _runs(order):
    """`order` as (image, run length) of its runs of one image."""
    runs = []
    for image in order:
        if runs and runs[-1][0] == image:
            runs[-1][1] += 1
        else:
            runs.append([image, 1])
    return runs


@pytest.mark.parametrize("n, k", [(60, 3), (62, 3), (50, 2), (7, 4)])
def test_each_image_k_times_in_a_row_in_a_pass_as_long_as_before(n, k):
    for pass_index in range(3):
        order, boxes, flips = plan_pass(_records(n), 1, pass_index, aug_repeats=k)
        assert len(order) == len(boxes) == len(flips) == n  # a pass keeps its length: the stream's arithmetic holds
        runs = _runs(order.tolist())
        assert [length for _, length in runs] == [k] * (n // k) + ([n % k] if n % k else [])
        assert len({image for image, _ in runs}) == len(runs)  # each image in one run


def _timm_sampler():
    pytest.importorskip("torch")
    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    from timm_peer import import_timm  # timm without torchvision installed

    import_timm()
    from timm.data.distributed_sampler import RepeatAugSampler

    return RepeatAugSampler


@pytest.mark.parametrize("n, k, processes, rows", [(48, 3, 1, 8), (48, 3, 2, 4), (64, 2, 4, 4), (40, 4, 2, 5)])
def test_global_batches_hold_timms_examples_of_all_ranks(n, k, processes, rows):
    """Given the same permutation (timm's shuffle=False, an identity one), each global batch holds the examples
    of timm's batches of every rank at that step."""
    sampler = _timm_sampler()
    ours = repeat_order(np.arange(n), k)
    ranks = [list(sampler(list(range(n)), num_replicas=processes, rank=r, shuffle=False, num_repeats=k,
                          selected_round=0)) for r in range(processes)]
    assert sum(map(len, ranks)) == n == len(ours)
    batch = rows * processes
    for step in range(n // batch):
        theirs = sorted(x for rank in ranks for x in rank[step * rows:(step + 1) * rows])
        assert sorted(ours[step * batch:(step + 1) * batch].tolist()) == theirs


@pytest.mark.parametrize("processes", [2, 4])
def test_the_processes_shards_are_disjoint_and_cover_the_pass(processes):
    tf = pytest.importorskip("tensorflow")
    n, batch = 48, 8
    order, _, _ = plan_pass(_records(n), 2, 0, aug_repeats=3)
    positions = tf.data.Dataset.range(n)
    shards = [list(this_process(positions, batch, p, processes).as_numpy_iterator()) for p in range(processes)]
    taken = [position for shard in shards for position in shard]
    assert sorted(taken) == list(range(n))  # disjoint, and every position of the pass
    rows = batch // processes
    for p, shard in enumerate(shards):  # a block of rows of every global batch
        assert shard == [b * batch + p * rows + r for b in range(n // batch) for r in range(rows)]
    assert collections.Counter(order[taken].tolist()) == collections.Counter(order.tolist())


def test_one_repeat_is_todays_plan_bit_for_bit():
    records = _records(57)
    heights, widths = np.asarray([r[2] for r in records]), np.asarray([r[3] for r in records])
    for seed, pass_index in ((0, 0), (7, 3)):
        # today's plan: the permutation, the crop boxes and the flips from one generator of (seed, pass)
        rng = np.random.default_rng([seed, pass_index])
        order = rng.permutation(len(records))
        today = order, crop_boxes(heights[order], widths[order], rng), rng.uniform(size=len(records)) < 0.5
        for plan in (plan_pass(records, seed, pass_index), plan_pass(records, seed, pass_index, aug_repeats=1)):
            for ours, theirs in zip(plan, today):
                assert ours.dtype == theirs.dtype and ours.tobytes() == theirs.tobytes()


def test_the_copies_of_an_image_draw_apart_and_a_pass_is_drawn_again_the_same():
    records = _records(60)
    order, boxes, flips = plan_pass(records, 4, 2, aug_repeats=3)
    again = plan_pass(records, 4, 2, aug_repeats=3)
    assert all(a.tobytes() == b.tobytes() for a, b in zip((order, boxes, flips), again))  # resumes exactly
    for start in range(0, 60, 3):  # the three copies: one image, three crops
        assert len(set(order[start:start + 3].tolist())) == 1
        assert len({tuple(box) for box in boxes[start:start + 3]}) == 3
    keys = {position_rng(4, 2, j, ERASE_STREAM).integers(2**32) for j in range(60)}
    assert len(keys) == 60  # the per-position generators (random erasing's) differ between copies
    plan_generator = np.random.default_rng([4, 2]).integers(2**32)
    assert position_rng(4, 2, 0, ERASE_STREAM).integers(2**32) != plan_generator


@pytest.mark.parametrize("k", [0, -2, 2.0, 1.5, True, "3", None])
def test_bad_repeats_are_refused(k):
    with pytest.raises(ValueError, match=f"`aug_repeats` must be a positive integer; got {k!r}"):
        plan_pass(_records(10), 0, 0, aug_repeats=k)


def test_an_augmentation_stream_zero_is_refused():
    with pytest.raises(ValueError, match="`stream` must be an integer >= 1; got 0"):
        position_rng(0, 0, 0, 0)
