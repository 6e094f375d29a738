"""RandAugment (keras_vit.data.rand_augment) against timm's on real photographs: each op equals timm's op at
the same argument, the steps carried through tf.data give the Pillow path's images, the
draws are timm's (the op choices draw for draw; the rest, which timm draws from Python's `random`, in
distribution), and the language parses as timm's does, its bad parts named."""

import os
import random
import sys

import numpy as np
import pytest
from conftest import photos

from keras_vit.data import rand_augment as ra

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
pytestmark = pytest.mark.backend_independent  # numpy, Pillow and TensorFlow's own ops: no Keras backend
NAMES = list(dict.fromkeys(ra.INCREASING_OPS + ra.DEFAULT_OPS))  # both of timm's sets: 20 ops
FILL = ra.fill_color("imagenet")  # as timm's create_transform passes img_mean: not the default grey


def _timm_aa():
    pytest.importorskip("torch")
    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    from timm_peer import import_timm  # timm without torchvision installed

    import_timm()
    from timm.data import auto_augment

    return auto_augment


def _cases():
    """(op, magnitude, sign, bicubic): each op at magnitude 9 and two others, both signs of signed ops, both
    interpolations of geometric ones."""
    cases = []
    for name in NAMES:
        signed, geometric = ra.OPS[name][2], name in ra.GEOMETRIC
        for m in (9, 4, 10):
            for sign in (1.0, -1.0) if signed else (1.0,):
                cases += [(name, m, sign, bicubic) for bicubic in ((False, True) if geometric else (False,))]
    return cases


def _step(name, m, sign, bicubic):
    _, level, _ = ra.OPS[name]
    return ra.Step(name, float(level(m, sign)) if level else 0.0, bicubic)


@pytest.mark.parametrize("name", NAMES)
def test_each_op_equals_timms_op_at_the_same_argument(name):
    from PIL import Image

    aa = _timm_aa()
    images = photos((72, 96))
    for case in [c for c in _cases() if c[0] == name]:
        step = _step(*case)
        # timm's argument for the same magnitude is ours up to its random sign
        timm_args = set()
        for k in range(40):
            random.seed(k)
            timm_args.add(tuple(aa.LEVEL_TO_ARG[name](case[1], {})) if aa.LEVEL_TO_ARG[name] else ())
        ours = {(step.arg,) if ra.OPS[name][1] else (), (_step(name, case[1], -case[2], case[3]).arg,)
                if ra.OPS[name][2] else ()}
        assert {tuple(np.round(a, 12)) for a in timm_args} == {tuple(np.round(a, 12)) for a in ours if a or not
                                                               ra.OPS[name][1]}
        args = (int(step.arg),) if step.kernel in ("Posterize", "Solarize", "SolarizeAdd") else (step.arg,)
        resample = Image.Resampling.BICUBIC if step.bicubic else Image.Resampling.BILINEAR
        changed = False
        for image in images:
            mine = ra.apply_pillow(image, [step], FILL)
            assert mine.dtype == np.uint8 and mine.shape == image.shape
            changed |= not np.array_equal(mine, image)
            try:
                theirs = aa.NAME_TO_OP[name](Image.fromarray(image), *args[:1 if ra.OPS[name][1] else 0],
                                             fillcolor=FILL, resample=resample)
            except ValueError:
                # timm's posterize with 0 bits (PosterizeIncreasing at magnitude 10, Posterize below 2.5):
                # Pillow >= 11 refuses it; older Pillow, which timm was written for, made the image black
                assert step.kernel == "Posterize" and int(step.arg) == 0 and not mine.any()
                continue
            np.testing.assert_array_equal(mine, np.asarray(theirs))
        assert changed or step.arg == 256.0  # the op did something (but Solarize with threshold 256)


@pytest.mark.parametrize("spec", ["rand-n3-m9-mstd0.5-inc1", "rand-m7-mstd101-p0.7"])
def test_planned_steps_through_tf_data_are_the_pillow_path(spec):
    """tf.data carries each image's steps as `plan_arrays` rows to `apply_planned` (in its threads): the images
    are `apply_pillow`'s, bit for bit."""
    tf = pytest.importorskip("tensorflow")
    config = ra.parse(spec, fill=FILL)
    images = photos((40, 56))
    plans = [ra.draw(config, np.random.default_rng([5, 1, i])) for i in range(48)]
    assert sum(map(len, plans)) > 40  # most images get ops
    kernels, args, bicubic = (np.stack(c) for c in zip(*[ra.plan_arrays(p, config.num_ops) for p in plans]))
    ds = tf.data.Dataset.from_tensor_slices((np.stack([images[i % 3] for i in range(48)]), kernels, args, bicubic))
    ds = ds.map(lambda image, k, a, b: tf.numpy_function(ra.apply_planned, [image, k, a, b, FILL], tf.uint8),
                num_parallel_calls=2, deterministic=True)
    pillow = np.stack([ra.apply_pillow(images[i % 3], p, FILL) for i, p in enumerate(plans)])
    np.testing.assert_array_equal(np.stack(list(ds.as_numpy_iterator())), pillow)


def test_the_op_choices_are_timms_draw_for_draw():
    """timm picks the ops with numpy's global generator: a RandomState seeded alike picks the same."""
    aa = _timm_aa()
    transform = aa.rand_augment_transform("rand-n3-m9-p1.0-inc1", {"translate_const": 100, "img_mean": FILL})
    picked = []
    for op in transform.ops:
        op.aug_fn = lambda image, *args, _name=op.name, **kwargs: picked.append(_name)
    config = ra.parse("rand-n3-m9-p1.0-inc1")
    for seed in range(20):
        np.random.seed(seed)
        picked.clear()
        transform(None)
        assert [step.op for step in ra.draw(config, np.random.RandomState(seed))] == picked


def _timm_draws(aa, spec, count):
    """timm's own draws for `count` images: per image a list of (op, argument, bicubic)."""
    from PIL import Image

    transform = aa.rand_augment_transform(spec, {"translate_const": 100, "img_mean": FILL})
    images = []

    def record(image, *args, _name, **kwargs):
        if _name in ra.GEOMETRIC:
            aa._check_args_tf(kwargs)  # timm's random interpolation, drawn where timm draws it
        images[-1].append((_name, float(args[0]) if args else 0.0, kwargs.get("resample") == Image.BICUBIC))

    for op in transform.ops:
        op.aug_fn = lambda image, *args, _name=op.name, **kwargs: record(image, *args, _name=_name, **kwargs)
    random.seed(0)
    np.random.seed(0)
    for _ in range(count):
        images.append([])
        transform(None)
    return images


def _magnitude(op, arg):
    """The magnitude behind a signed linear op's argument."""
    scale = {"Rotate": 3.0, "ShearX": 0.03, "ShearY": 0.03, "TranslateXRel": 0.045, "TranslateYRel": 0.045}
    return abs(arg) / scale[op] if op in scale else abs(arg - 1.0) / 0.09


def test_the_draws_follow_timms_distributions():
    """timm draws whether an op applies, the magnitude noise, the sign and the interpolation from Python's
    `random`, which no numpy generator reproduces: 3000 images of each, compared by rates (within four
    standard errors) and the magnitudes by a two-sample Kolmogorov-Smirnov test."""
    from scipy import stats

    aa = _timm_aa()
    spec, count = "rand-m9-mstd0.5-inc1", 3000
    theirs = [s for image in _timm_draws(aa, spec, count) for s in image]
    config = ra.parse(spec)
    ours = [(s.op, s.arg, s.bicubic) for i in range(count) for s in ra.draw(config, np.random.default_rng([0, 0, i]))]
    signed = [name for name in config.ops if ra.OPS[name][2]]

    def summary(steps):
        moves = [s for s in steps if s[0] in signed]
        geometric = [s for s in steps if s[0] in ra.GEOMETRIC]
        return (len(steps) / (2 * count), np.mean([(s[1] < 0) if s[0] in ra.GEOMETRIC else (s[1] < 1) for s in moves]),
                np.mean([s[2] for s in geometric]), [_magnitude(s[0], s[1]) for s in moves])

    (applied, negative, bicubic, magnitudes), (t_applied, t_negative, t_bicubic, t_magnitudes) = (
        summary(ours), summary(theirs))
    for mine, timms in ((applied, t_applied), (negative, t_negative), (bicubic, t_bicubic)):
        assert abs(mine - timms) < 4 * np.sqrt(2 * 0.25 / 2000), (mine, timms)
    assert abs(applied - 0.5) < 0.05 and abs(bicubic - 0.5) < 0.05
    assert stats.ks_2samp(magnitudes, t_magnitudes).pvalue > 1e-3
    assert max(magnitudes) == pytest.approx(10.0) and min(magnitudes) < 8.5  # noisy, clipped at mmax (10)


def test_parses_as_timm_does():
    aa = _timm_aa()
    for spec in ("rand-m9-mstd0.5-inc1", "rand-m7-n3-mstd101-mmax12", "rand-n1-m5-p0.3", "rand"):
        config = ra.parse(spec)
        timm = aa.rand_augment_transform(spec, {"translate_const": 100, "img_mean": FILL})
        assert config.num_ops == timm.num_layers and list(config.ops) == [op.name for op in timm.ops]
        op = timm.ops[0]
        assert (config.magnitude, config.prob, config.magnitude_std, config.magnitude_max) == (
            op.magnitude, op.prob, op.magnitude_std, op.magnitude_max)
    assert ra.fill_color("vit") == aa._FILL
    from timm.data import IMAGENET_DEFAULT_MEAN

    assert FILL == tuple(min(255, round(255 * x)) for x in IMAGENET_DEFAULT_MEAN)


@pytest.mark.parametrize("spec, named", [
    ("rond-m9", "'rond'"), ("rand-m9-x3", "'x3'"), ("rand-m9.5", "'m9.5'"), ("rand-p1.5", "'p1.5'"),
    ("rand-m9-m8", "'m' given twice"), ("rand-tweights", "'tweights'"), ("rand-inc2", "'inc2'"),
    ("rand--m9", "section ''"), ("rand-mstd-1", "section 'mstd'"), (9, "9"),
])
def test_a_string_that_does_not_parse_names_the_bad_part(spec, named):
    with pytest.raises(ValueError, match="RandAugment") as error:
        ra.parse(spec)
    assert named in str(error.value)


def test_bad_ops_fill_and_images_are_refused():
    with pytest.raises(ValueError, match="unknown RandAugment op 'Blur'"):
        ra.parse("rand-m9", ops=("Rotate", "Blur"))
    with pytest.raises(ValueError, match="`fill` must be 3 integers"):
        ra.parse("rand-m9", fill=(0, 0))
    with pytest.raises(ValueError, match="`interpolation` must be one of"):
        ra.parse("rand-m9", interpolation="nearest")
    with pytest.raises(ValueError, match="uint8 \\(height, width, 3\\) image; got float32"):
        ra.apply_pillow(np.zeros((8, 8, 3), np.float32), ())


def test_three_augment_ops_are_timms_policy_3a():
    """DeiT III's 3-Augment (`--aa 3a`): each of timm's three ops (its AutoAugment policy "3a") equals ours on
    real photographs, the blur at the radius timm draws; the jitter's ops are Pillow's enhancers, as
    torchvision's ColorJitter applies them to a Pillow image."""
    from PIL import Image

    from keras_vit.data import three_augment

    aa = _timm_aa()
    policy = aa.auto_augment_policy("3a", {})
    images = photos((48, 64))
    for image in images:
        for (op,), seed in zip(policy, (0, 1, 2)):
            random.seed(seed)
            theirs = np.asarray(op(Image.fromarray(image)))
            random.seed(seed)
            ours = {"Solarize": ra.Step("Solarize", 128.0), "Desaturate": ra.Step("Color", 0.0),
                    "GaussianBlurRand": ra.Step("GaussianBlur", random.uniform(*three_augment.BLUR_RADIUS))}[op.name]
            np.testing.assert_array_equal(ra.apply_pillow(image, [ours]), theirs, err_msg=op.name)
    config = three_augment.ThreeAugment(color_jitter=0.3)
    draws = [config.draw(np.random.default_rng([3, i])) for i in range(600)]
    first = [steps[0].kernel for steps in draws]
    assert {k: first.count(k) for k in set(first)}.keys() == {"Solarize", "Color", "GaussianBlur"}
    assert all(150 < first.count(k) < 250 for k in set(first))  # uniform over three: 200 +- 5 sigma
    assert {steps[0].arg for steps in draws if steps[0].kernel == "Solarize"} == {128.0}
    radii = [steps[0].arg for steps in draws if steps[0].kernel == "GaussianBlur"]
    assert 0.1 <= min(radii) and max(radii) <= 2.0
    assert all(sorted(s.kernel for s in steps[1:]) == ["Brightness", "Color", "Contrast"] for steps in draws)
    assert all(0.7 <= s.arg <= 1.3 for steps in draws for s in steps[1:])
    assert len({tuple(s.kernel for s in steps[1:]) for steps in draws}) == 6  # every order of the three
    assert [len(s) for s in (three_augment.ThreeAugment(color_jitter=0).draw(np.random.default_rng(0)),)] == [1]
    with pytest.raises(ValueError, match="color_jitter"):
        three_augment.ThreeAugment(color_jitter=1.5)


def test_three_augment_runs_in_both_feeds_alike():
    """`Augment(auto_augment="3a")`: the numpy path and the tf.data path (plan rows through Pillow) give the same
    images."""
    tf = pytest.importorskip("tensorflow")
    from keras_vit.data.augment import Augment

    augment = Augment(auto_augment="3a", color_jitter=0.3)
    image = photos((40, 56))[0].astype(np.float32)
    plans = augment.plan(7, 0, np.arange(12), 40, 56)
    for i in range(12):
        numpy_path = augment.finish_image(image, "uint8", 7, 0, i)
        tf_path = augment.finish_tensor(tf, tf.constant(image), "uint8", *(p[i] for p in plans))
        np.testing.assert_array_equal(numpy_path, tf_path.numpy())
    with pytest.raises(ValueError, match="color_jitter"):
        Augment(auto_augment="3a", color_jitter=-1)
