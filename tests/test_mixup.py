"""MixUp and CutMix (keras_vit.data.mixup) against timm's `Mixup` on real photographs: the same draws from the
same seed, the same mixed images and soft targets, in every mode; resumable by step; bad options refused."""

import os
import sys

import numpy as np
import pytest
from conftest import photos

from keras_vit.data.mixup import MixedBatches, MixUp

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
pytestmark = pytest.mark.backend_independent  # numpy only
CASES = {  # timm's Mixup arguments: DeiT's recipe, and each of its parts alone
    "deit batch": dict(mixup_alpha=0.8, cutmix_alpha=1.0, label_smoothing=0.1, mode="batch"),
    "mixup pair": dict(mixup_alpha=0.8, cutmix_alpha=0.0, label_smoothing=0.0, mode="pair"),
    "cutmix elem": dict(mixup_alpha=0.0, cutmix_alpha=1.0, label_smoothing=0.1, mode="elem", prob=0.7),
    "both elem": dict(mixup_alpha=0.4, cutmix_alpha=1.0, switch_prob=0.3, mode="elem"),
}


def _timm_mixup():
    pytest.importorskip("torch")
    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    from timm_peer import import_timm  # timm without torchvision installed

    import_timm()
    from timm.data import mixup

    return mixup


@pytest.mark.parametrize("case", CASES)
def test_equals_timms_mixup_for_the_same_draws(case):
    import torch

    timm_mixup = _timm_mixup()
    images = np.concatenate([photos((48, 64)), photos((48, 64))[::-1], photos((48, 64))[:2]]).astype(np.float32)
    labels = np.array([0, 1, 2, 3, 4, 5, 6, 7])
    ours = MixUp(num_classes=10, seed=3, **CASES[case])
    for step in range(6):
        mixed, targets = ours(images, labels, step)
        np.random.seed([3, step])  # timm draws from numpy's global generator: the same seed, the same draws
        x, y = timm_mixup.Mixup(num_classes=10, **CASES[case])(torch.from_numpy(images.transpose(0, 3, 1, 2).copy()),
                                                                torch.from_numpy(labels))
        np.testing.assert_allclose(mixed, x.numpy().transpose(0, 2, 3, 1), atol=1e-4)
        np.testing.assert_allclose(targets, y.numpy(), atol=1e-6)
    params = ours.params(0, 8, 48, 64)
    assert len(set(params.lam.tolist())) >= 1 and params.lam.shape == (8,)


def test_cutmix_pastes_the_partners_box_and_lam_is_the_area_kept():
    images = np.stack([np.full((32, 40, 3), i, np.uint8) for i in range(4)])
    mix = MixUp(num_classes=4, mixup_alpha=0.0, cutmix_alpha=1.0, label_smoothing=0.0, mode="elem", seed=1)
    p = mix.params(0, 4, 32, 40)
    mixed, targets = mix(images, np.arange(4), 0)
    assert mixed.dtype == np.uint8
    for i, (top, bottom, left, right) in enumerate(p.boxes):
        inside = np.zeros((32, 40), bool)
        inside[top:bottom, left:right] = True
        assert (mixed[i][inside] == 3 - i).all() and (mixed[i][~inside] == i).all()
        assert p.lam[i] == pytest.approx(1 - inside.mean())
        assert targets[i, i] == pytest.approx(p.lam[i]) and targets[i, 3 - i] == pytest.approx(1 - p.lam[i])


def test_uint8_images_are_mixed_in_float_and_rounded():
    images = photos((24, 24), n=2)
    mix = MixUp(num_classes=2, mixup_alpha=1.0, cutmix_alpha=0.0, seed=0)
    mixed, _ = mix(images, [0, 1], 0)
    lam = mix.params(0, 2, 24, 24).lam[0]
    want = np.rint(images[0] * np.float32(lam) + images[1].astype(np.float32) * (1 - np.float32(lam)))
    assert mixed.dtype == np.uint8 and np.array_equal(mixed[0], want.astype(np.uint8))


def test_a_resumed_stream_mixes_as_the_uninterrupted_one():
    batches = [(photos((16, 16)).repeat(2, 0)[:4], np.array([0, 1, 2, 0])) for _ in range(6)]
    mix = MixUp(num_classes=3, seed=7)
    whole = MixedBatches(batches, mix)
    resumed = MixedBatches(batches[2:], mix, skip_batches=2)
    for k in range(4):
        for a, b in zip(whole[k + 2], resumed[k]):
            np.testing.assert_array_equal(a, b)
    assert not np.array_equal(whole[0][0], whole[1][0])  # each step its own draws


BAD = {
    "negative mixup": (dict(mixup_alpha=-0.1), r"mixup_alpha must be a number >= 0 \(0: off\); got -0.1"),
    "negative cutmix": (dict(cutmix_alpha=-1), r"cutmix_alpha must be a number >= 0"),
    "nothing to mix": (dict(mixup_alpha=0, cutmix_alpha=0), r"needs mixup_alpha > 0 or cutmix_alpha > 0"),
    "switch prob": (dict(switch_prob=1.5), r"switch_prob must be a number in \[0.0, 1.0\]; got 1.5"),
    "prob": (dict(prob=-0.5), r"prob must be a number in \[0.0, 1.0\]"),
    "mode": (dict(mode="pairs"), r"mode must be one of \('batch', 'pair', 'elem'\); got 'pairs'"),
}


@pytest.mark.parametrize("case", BAD)
def test_bad_options_are_refused_by_name(case):
    options, message = BAD[case]
    with pytest.raises(ValueError, match=message):
        MixUp(num_classes=10, **options)


def test_bad_batches_are_refused():
    mix = MixUp(num_classes=3)
    with pytest.raises(ValueError, match="the batch size must be even; got 3"):
        mix(photos(16), [0, 1, 2], 0)
    with pytest.raises(ValueError, match="integer class labels"):
        mix(photos(16, n=2), np.eye(3)[:2], 0)  # one-hot labels: MixUp makes the soft targets itself
    with pytest.raises(ValueError, match=r"labels must be in \[0, 3\)"):
        mix(photos(16, n=2), [0, 5], 0)


@pytest.mark.parametrize("pipeline", ["pydataset", "tf.data"])
def test_the_folder_feeds_mix_their_batches_by_step(tmp_path, pipeline):
    """mixed_feeds on from_directory's feeds: batch k is MixUp of the plain feed's batch k at step skip + k;
    the validation labels one-hot."""
    if pipeline == "tf.data":
        pytest.importorskip("tensorflow")
    from conftest import photo_folder

    from keras_vit import data
    from keras_vit.data.mixup import mixed_feeds

    folder = photo_folder(tmp_path / "photos", per_class=4)
    plain, validation = data.from_directory(folder, 24, 4, skip_batches=3, image_dtype="uint8", pipeline=pipeline,
                                            validation_split=0.25)
    mix = MixUp(num_classes=3, seed=5)
    mixed, one_hot = mixed_feeds(plain, validation, mix, skip_batches=3)
    take = (lambda ds, n: list(ds.take(n).as_numpy_iterator())) if pipeline == "tf.data" else \
        (lambda ds, n: [ds[i] for i in range(n)])
    for k, ((x, y), (px, py)) in enumerate(zip(take(mixed, 2), take(plain, 2))):
        want_x, want_y = mix(px, py, 3 + k)
        np.testing.assert_array_equal(x, want_x)
        np.testing.assert_allclose(y, want_y)
    (vx, vy), = take(one_hot, 1)
    assert vy.shape == (len(vx), 3) and (vy.sum(-1) == 1).all()
    if pipeline == "pydataset":  # the wrappers keep the feed's threads: Keras prefetches them as it did the feed
        for wrapper, feed in ((mixed, plain), (one_hot, validation)):
            assert feed.workers > 1 and (wrapper.workers, wrapper.max_queue_size) == (feed.workers, feed.max_queue_size)
