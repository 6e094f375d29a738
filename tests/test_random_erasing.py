"""Random erasing (keras_vit.data.random_erasing): the boxes timm's `RandomErasing` erases for the same draws, and
statistically beside timm's own (Python `random`) draws; the bounds, the retry rule and the count; the noise's
distribution; the numpy and tf.data paths equal; probability 0 a no-op; bad options refused."""

import math
import os
import sys

import numpy as np
import pytest
from conftest import photos

from keras_vit.data.random_erasing import ATTEMPTS, RandomErasing, counter_normal
from keras_vit.data.stream import ERASE_STREAM, position_rng

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
pytestmark = pytest.mark.backend_independent  # numpy, and TensorFlow's tf.data on any lane
CASES = {  # RandomErasing arguments: DeiT's, several boxes, other bounds
    "deit": dict(probability=0.25),
    "count 1-3": dict(probability=0.8, max_count=3),
    "count 2": dict(probability=1.0, min_count=2, min_area=0.1, max_area=0.6, min_aspect=0.5, max_aspect=4.0),
}


def _timm_erasing():
    pytest.importorskip("torch")
    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    from timm_peer import import_timm  # timm without torchvision installed

    import_timm()
    from timm.data import random_erasing

    return random_erasing


class _AsPythonRandom:
    """Python's `random` functions that timm calls, drawn from a numpy Generator as RandomErasing.draw draws."""

    def __init__(self, rng):
        self.rng = rng

    def random(self):
        return self.rng.random()

    def uniform(self, a, b):
        return self.rng.uniform(a, b)

    def randint(self, a, b):
        return int(self.rng.integers(a, b + 1))


def _normalised(size, n=3):
    return (photos(size, n).astype(np.float32) - 127.5) / 127.5


def _mask(draws, height, width):
    mask = np.zeros((height, width), bool)
    for top, left, h, w, _ in draws:
        mask[top:top + h, left:left + w] = True
    return mask


@pytest.mark.parametrize("case", CASES)
def test_erases_timms_boxes_for_the_same_draws(case, monkeypatch):
    import torch

    timm_erasing = _timm_erasing()
    ours = RandomErasing(mode="const", **CASES[case])
    theirs = timm_erasing.RandomErasing(mode="const", device="cpu", **CASES[case])
    erased = 0
    for seed in range(60):
        for height, width in ((32, 32), (24, 40), (7, 5)):
            draws = ours.draw(np.random.default_rng(seed), height, width)
            monkeypatch.setattr(timm_erasing, "random", _AsPythonRandom(np.random.default_rng(seed)))
            image = torch.ones((3, height, width))
            theirs(image)
            np.testing.assert_array_equal(image[0].numpy() == 0, _mask(draws, height, width))
            erased += int(_mask(draws, height, width).any())
    assert erased > 10  # the cases erase


def test_boxes_as_timms_own_draws_statistically():
    """timm draws from Python's `random`: the share of images erased, the boxes' area and aspect, the count of
    boxes agree with timm's over 3000 images, within 6 standard errors."""
    import random

    import torch

    timm_erasing = _timm_erasing()
    random.seed(0)
    height, width, n = 40, 48, 3000
    kwargs = dict(probability=0.6, max_count=2, min_aspect=0.4)
    theirs = timm_erasing.RandomErasing(mode="const", device="cpu", **kwargs)
    ours = RandomErasing(mode="const", **kwargs)
    rng = np.random.default_rng(1)
    stats = {"ours": [], "timm": []}
    for _ in range(n):
        image = torch.ones((1, height, width))
        theirs(image)
        stats["timm"].append((image[0].numpy() == 0).mean())
        stats["ours"].append(_mask(ours.draw(rng, height, width), height, width).mean())
    ours_area, timm_area = np.asarray(stats["ours"]), np.asarray(stats["timm"])
    for statistic in (lambda a: a > 0, lambda a: a, lambda a: a**2):
        x, y = statistic(ours_area).astype(float), statistic(timm_area).astype(float)
        se = math.sqrt(x.var() / n + y.var() / n)
        assert abs(x.mean() - y.mean()) < 6 * se, (x.mean(), y.mean(), se)
    assert 0.55 < (ours_area > 0).mean() < 0.65


def test_boxes_keep_to_their_bounds_and_count():
    height, width = 60, 80
    eraser = RandomErasing(1.0, min_area=0.05, max_area=0.4, min_aspect=0.5, max_aspect=3.0, min_count=2, max_count=4)
    counts = set()
    for seed in range(300):
        draws = eraser.draw(np.random.default_rng(seed), height, width)
        boxes = [d for d in draws if d[2] and d[3]]
        assert draws.shape == (4, 5) and len(boxes) >= 2  # each box of <= 0.2 of the image always fits
        counts.add(len(boxes))
        for top, left, h, w, key in boxes:
            assert 0 <= top and top + h <= height and 0 <= left and left + w <= width and h < height and w < width
            # the area drawn, (h, w) being its rounded sides: in [min, max] x image / count for count 2..4
            area = height * width
            assert (h - 0.5) * (w - 0.5) <= 0.4 * area / 2 and (h + 0.5) * (w + 0.5) >= 0.05 * area / 4
            assert (h - 0.5) / (w + 0.5) <= 3.0 and (h + 0.5) / (w - 0.5) >= 0.5
            assert 0 <= key < 2**32
    assert counts == {2, 3, 4}
    fixed = RandomErasing(1.0, min_count=3, max_count=3)
    assert all(sum(1 for d in fixed.draw(np.random.default_rng(s), 224, 224) if d[2] and d[3]) == 3 for s in range(50))


class _Counting:
    """A numpy Generator that counts the calls of each kind."""

    def __init__(self, seed):
        self.rng, self.calls = np.random.default_rng(seed), {}

    def __getattr__(self, name):
        def call(*args, **kwargs):
            self.calls[name] = self.calls.get(name, 0) + 1
            return getattr(self.rng, name)(*args, **kwargs)

        return call


def test_a_box_that_never_fits_is_given_up_after_ten_attempts():
    # any box of the whole 2 x 2 image's area with an aspect in [0.3, 3.3] rounds to a side >= 2: none fits
    rng = _Counting(0)
    draws = RandomErasing(1.0, min_area=1.0, max_area=1.0, max_count=1).draw(rng, 2, 2)
    assert not draws.any()
    assert rng.calls == {"random": 1, "uniform": 2 * ATTEMPTS, "integers": 1}  # the last: the unused noise keys
    rng = _Counting(1)
    assert not RandomErasing(1.0, min_area=1.0, max_area=1.0).draw(rng, 1, 1).any()  # sides round to >= 1
    assert rng.calls["uniform"] == 2 * ATTEMPTS


@pytest.mark.parametrize("mode", ["pixel", "rand"])
def test_the_noise_is_standard_normal(mode):
    height, width = 200, 220
    eraser = RandomErasing(1.0, mode=mode, min_area=0.3, max_area=0.3, min_aspect=1.0, max_aspect=1.0)
    image = np.full((height, width, 3), 7.0, np.float32)  # no normal value is 7
    values = []
    for seed in range(1 if mode == "pixel" else 400):
        erased = eraser.apply(image, eraser.draw(np.random.default_rng(seed), height, width))
        noise = erased[erased[..., 0] != 7.0]
        values.append(noise if mode == "pixel" else noise[:1])
        if mode == "rand":  # one colour a box
            assert len(noise) > 1000 and (noise == noise[0]).all()
    values = np.concatenate(values).ravel()
    n = values.size
    assert n > 1000
    assert abs(values.mean()) < 5 / math.sqrt(n) and abs(values.std() - 1) < 5 * math.sqrt(0.5 / n)
    assert abs((abs(values) < 1).mean() - 0.6827) < 5 * math.sqrt(0.22 / n)
    z = counter_normal(np.uint32(12345), np.arange(200_000, dtype=np.uint32))
    assert abs(np.corrcoef(z[:-1], z[1:])[0, 1]) < 5 / math.sqrt(z.size)  # neighbours independent
    other = counter_normal(np.uint32(12346), np.arange(200_000, dtype=np.uint32))
    assert abs(np.corrcoef(z, other)[0, 1]) < 5 / math.sqrt(z.size)  # keys independent


@pytest.mark.parametrize("mode", ["pixel", "rand", "const"])
def test_the_tf_data_path_erases_as_the_numpy_path(mode):
    tf = pytest.importorskip("tensorflow")
    eraser = RandomErasing(0.7, mode=mode, max_count=3)
    images = _normalised((40, 56))
    draws = eraser.plan(seed=3, pass_index=2, positions=range(len(images) * 4), height=40, width=56)
    images = np.concatenate([images] * 4)
    ds = tf.data.Dataset.from_tensor_slices((images, draws)).map(lambda x, d: eraser.apply_tensor(tf, x, d))
    erased = np.stack(list(ds.as_numpy_iterator()))
    expected = np.stack([eraser.apply(x, d) for x, d in zip(images, draws)])
    assert (draws[:, :, 2] > 0).any() and (expected != images).any()
    np.testing.assert_allclose(erased, expected, atol=1e-6, rtol=0)


def test_probability_zero_leaves_images_bit_identical():
    tf = pytest.importorskip("tensorflow")
    eraser = RandomErasing(0.0, max_count=2)
    images = _normalised((32, 32))
    draws = eraser.plan(0, 0, range(3), 32, 32)
    assert not draws.any()
    for image, d in zip(images, draws):
        assert eraser.apply(image, d).tobytes() == image.tobytes()
        assert eraser.apply_tensor(tf, tf.constant(image), tf.constant(d)).numpy().tobytes() == image.tobytes()


def test_the_plan_draws_per_position_and_again_the_same():
    eraser = RandomErasing(1.0)
    first = eraser.plan(5, 3, range(40), 32, 32)
    np.testing.assert_array_equal(first, eraser.plan(5, 3, range(40), 32, 32))  # a pure function: resumes exactly
    np.testing.assert_array_equal(first[7], eraser.draw(position_rng(5, 3, 7, ERASE_STREAM), 32, 32))
    assert len({tuple(d.ravel()) for d in first}) == 40  # positions (the repeats of an image) drawn apart
    assert not np.array_equal(first, eraser.plan(5, 4, range(40), 32, 32))


@pytest.mark.parametrize("kwargs, message", [
    (dict(probability=1.5), "`probability` must be a number in \\[0, 1\\]; got 1.5"),
    (dict(probability=0.5, mode="noise"), "`mode` must be one of"),
    (dict(probability=0.5, min_area=0.0), "`min_area` must be a number in \\(0, 1\\]"),
    (dict(probability=0.5, max_area=0.01), "`max_area` must be a number in \\[0.02, 1\\]; got 0.01"),
    (dict(probability=0.5, min_aspect=-1), "`min_aspect` must be a number > 0"),
    (dict(probability=0.5, max_aspect=0.1), "`max_aspect` must be a number >= 0.3"),
    (dict(probability=0.5, min_count=0), "`min_count` must be an integer >= 1; got 0"),
    (dict(probability=0.5, min_count=2, max_count=1), "`max_count` must be an integer >= 2; got 1"),
])
def test_bad_options_are_refused_by_name(kwargs, message):
    with pytest.raises(ValueError, match=message):
        RandomErasing(**kwargs)


def test_uint8_images_are_refused():
    with pytest.raises(ValueError, match="after normalisation, on a float32 image .* got a uint8 array"):
        RandomErasing(1.0).apply(photos(32)[0], np.zeros((1, 5), np.int64))
