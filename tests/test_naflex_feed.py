"""The NaFlex feed (issue 37, item 3; keras_vit.data.naflex_feed): the size rule against timm's and Hugging
Face's, the patch layout and padding against timm's batch_patchify, Patchify and NaFlexCollator, the
resize against the project's antialiased bilinear rule and tf.image.resize, the bucketed plan (batch
sizes, schedule, determinism), the tf.data and PyDataset feeds (one shape per bucket, labels and flips
carried, an image folder), model.fit on each backend (on JAX one trace per bucket), and each bad input."""

import functools
import os
import sys

import keras
import numpy as np
import pytest
from conftest import backend, photo_folder

from keras_vit.data import naflex_feed as nf
from keras_vit.data import naflex_sequence
from keras_vit.interpolation import resize_matrix
from keras_vit.data.naflex_feed import NaFlexBatches, NaFlexPlan, naflex_grid, patchify
from keras_vit.preprocessing import preprocess_input

try:  # before timm's torchvision stand-in: transformers notes torchvision's presence on import
    from transformers.models.siglip2.image_processing_pil_siglip2 import get_image_size_for_max_num_patches
except ImportError:
    get_image_size_for_max_num_patches = None

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# numpy, Pillow and tf.data: the same on every Keras backend (the torch runs have them); the fit runs everywhere
independent = pytest.mark.backend_independent
# small buckets: batch sizes 16, 7 and 4, evaluation 7 of 36 tokens; seed 1 schedules all three for 12 images
SMALL = dict(patch_size=16, seq_lens=(64, 16, 36), max_tokens_per_batch=256, eval_seq_len=36, seed=1)


def _timm():
    pytest.importorskip("torch")
    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    from timm_peer import import_timm  # timm without torchvision installed

    return import_timm()


@functools.lru_cache(maxsize=1)
def _photos():
    """scikit-image's photographs (512x512, 300x451, 400x600, 427x640) and two thin random images."""
    pytest.importorskip("skimage")
    from skimage import data

    rng = np.random.default_rng(0)
    thin = [rng.integers(0, 256, size, dtype=np.uint8) for size in ((23, 700, 3), (900, 17, 3))]
    return [data.astronaut(), data.chelsea(), data.coffee(), data.rocket(), *thin]


def _sizes():
    rng = np.random.default_rng(1)
    edges = [(1, 1), (1, 2), (2, 1), (3, 4), (15, 16), (16, 16), (17, 16), (224, 224), (480, 640), (640, 480),
             (1, 10_000), (10_000, 1), (7, 5_000), (5_000, 7), (100_000, 100_000), (3, 2_000_000),
             (2_000_000, 2_000_000), (50_000_000, 1)]
    drawn = np.exp(rng.uniform(0, np.log(20_000), (300, 2))).astype(int)
    return edges + [tuple(int(v) for v in s) for s in drawn]


# --------------------------------------------------------------------------
# the size rule
# --------------------------------------------------------------------------
@independent
def test_size_rule_equals_timms_and_hugging_faces():
    _timm()
    from timm.data.naflex_transforms import get_image_size_for_seq

    refused = 0
    for height, width in _sizes():
        for patch in (8, 14, 16, 32):
            for budget in (1, 2, 3, 7, 64, 128, 256, 576, 784, 1024, 4096):
                try:
                    expected = get_image_size_for_seq((height, width), patch, budget)[1]
                except ValueError:  # timm: the image would shrink below 1e-5 of its size
                    refused += 1
                    with pytest.raises(ValueError, match="timm's"):
                        naflex_grid(height, width, patch, budget)
                    continue
                rows, cols = naflex_grid(height, width, patch, budget)
                assert (rows * patch, cols * patch) == expected, (height, width, patch, budget)
                assert 1 <= rows * cols <= budget
                if get_image_size_for_max_num_patches is not None:  # Hugging Face: the same sizes
                    assert get_image_size_for_max_num_patches(height, width, patch, budget) == expected
    assert 0 < refused < 100  # the refusals are the enormous images only
    assert naflex_grid(1, 1, 1, 1000) == (31, 31)  # both sides rounded up: 961 of 1000 tokens
    assert naflex_grid(1, 1, 1, 10**6) == (100, 100)  # enlarged at most ~100 times
    assert naflex_grid(np.int64(480), 640, 16, 256) == (14, 18)


# --------------------------------------------------------------------------
# one image
# --------------------------------------------------------------------------
def _exact(image, patch, budget):
    """`image` resized (by Pillow, any resize) to its NaFlex size, uint8: patchify keeps it as it is."""
    from PIL import Image

    rows, cols = naflex_grid(image.shape[0], image.shape[1], patch, budget)
    exact = np.asarray(Image.fromarray(image).resize((cols * patch, rows * patch), Image.BILINEAR))
    assert naflex_grid(*exact.shape[:2], patch, rows * cols) == (rows, cols)
    return exact, rows * cols


@independent
def test_patch_layout_and_padding_equal_timms():
    _timm()
    import torch
    from timm.data.naflex_dataset import NaFlexCollator
    from timm.data.naflex_transforms import Patchify
    from timm.models.naflexvit import batch_patchify

    for image in _photos():
        exact, count = _exact(image, 16, 256)
        mine = patchify(exact, 16, count)
        scaled = torch.from_numpy(preprocess_input(exact)).permute(2, 0, 1)[None]
        assert np.array_equal(mine["patches"], batch_patchify(scaled, (16, 16))[0][0].numpy())  # bit-equal
        raw = patchify(exact, 16, count, image_dtype="uint8")["patches"]
        assert raw.dtype == np.uint8
        pixels = torch.from_numpy(exact.copy()).permute(2, 0, 1)[None]
        assert np.array_equal(raw, batch_patchify(pixels, (16, 16))[0][0].numpy())
        # padded as timm's collator pads: zero patches at coordinate (0, 0), not valid
        padded = patchify(exact, 16, count, seq_len=300)
        theirs = NaFlexCollator(300)([(Patchify(16)(scaled[0]), 0)])[0]
        for key in ("patches", "patch_coord", "patch_valid"):
            assert np.array_equal(padded[key], theirs[key][0].numpy()), key


@independent
def test_resize_is_the_antialiased_bilinear_rule():
    tf = pytest.importorskip("tensorflow")
    for image in _photos()[:4]:
        for size in ((224, 288), (48, 64), (700, 900)):
            mine = naflex_sequence.resize_antialiased(image, size)
            assert mine.dtype == np.float32 and mine.shape == (*size, 3)
            # the project's rule, keras_vit.interpolation's matrices
            rows, cols = (resize_matrix(n, m, "bilinear_antialias") for n, m in zip(image.shape, size))
            rule = np.einsum("ih,hwc,jw->ijc", rows, image.astype(np.float64), cols, optimize=True)
            np.testing.assert_allclose(mine, rule, atol=1e-3)
            theirs = tf.image.resize(image, size, "bilinear", antialias=True).numpy()
            np.testing.assert_allclose(mine, theirs, atol=2e-2)


@independent
def test_sequence_padding_coordinates_and_scaling():
    image = _photos()[1]  # 300 x 451
    rows, cols = naflex_grid(300, 451, 16, 64)
    count = rows * cols
    out = patchify(image, 16, 64, seq_len=80)
    assert {k: (v.shape, v.dtype) for k, v in out.items()} == {
        "patches": ((80, 768), np.float32), "patch_coord": ((80, 2), np.int32), "patch_valid": ((80,), np.bool_)}
    assert (rows, cols) == (6, 10) and count == 60
    assert out["patch_valid"].tolist() == [True] * count + [False] * (80 - count)
    assert out["patch_coord"][:count].tolist() == [[r, c] for r in range(rows) for c in range(cols)]
    assert not out["patch_coord"][count:].any() and not out["patches"][count:].any()
    assert -1 <= out["patches"][:count].min() < 0 < out["patches"][:count].max() <= 1  # "vit": [-1, 1]
    own = patchify(image, 16, 64)  # default: the image's own length
    assert own["patches"].shape == (count, 768) and own["patch_valid"].all()
    np.testing.assert_array_equal(own["patches"], out["patches"][:count])
    as_float = patchify(image.astype(np.float32), 16, 64, seq_len=80)
    np.testing.assert_array_equal(as_float["patches"], out["patches"])
    raw = patchify(image, 16, 64, seq_len=80, image_dtype="uint8")["patches"]
    np.testing.assert_allclose(preprocess_input(raw[:count].reshape(-1, 1, 3)).reshape(count, -1),
                               out["patches"][:count], atol=0.5 / 127.5 + 1e-6)  # rounded to the nearest level
    imagenet = patchify(image, 16, 64, mode="imagenet")["patches"]
    np.testing.assert_allclose(imagenet, preprocess_input(raw[:count].reshape(-1, 1, 3), "imagenet").reshape(count, -1),
                               atol=0.6 / 255 / 0.224)


# --------------------------------------------------------------------------
# the plan
# --------------------------------------------------------------------------
@independent
def test_plan_batch_sizes_are_timms():
    _timm()
    from timm.data.naflex_dataset import calculate_naflex_batch_size

    plan = NaFlexPlan()
    assert plan.seq_lens == (128, 256, 576, 784, 1024) and plan.max_tokens_per_batch == 16384
    assert plan.batch_sizes == (128, 64, 28, 20, 16) and plan.eval_batch_size == 28
    divisible = NaFlexPlan(batch_divisor=8)
    for seq_len in divisible.seq_lens:
        assert divisible.batch_size(seq_len) == calculate_naflex_batch_size(16384, seq_len, divisor=8)
    assert NaFlexPlan(seq_lens=[576, 128, 128]).seq_lens == (128, 576)  # sorted, without repeats


@independent
def test_plan_schedule_passes_and_determinism():
    plan = NaFlexPlan(**SMALL)
    assert plan.seq_lens == (16, 36, 64) and plan.batch_sizes == (16, 7, 4) and plan.eval_batch_size == 7
    for n in (1, 6, 100, 1000):
        sizes = [plan.batch_size(v) for v in plan.schedule(n)]
        assert sum(sizes) >= n > sum(sizes[:-1])  # as many batches as hold every image
    assert np.array_equal(plan.schedule(1000)[:len(plan.schedule(100))], plan.schedule(100))
    assert set(plan.schedule(1000)) == {16, 36, 64}
    first, second = plan.epoch(100, 0), plan.epoch(100, 1)
    assert len(first.seq_lens) == plan.steps_per_epoch(100) and first.starts[-1] == len(first.order)
    assert sorted(first.seq_lens) == sorted(plan.schedule(100))  # the schedule, shuffled
    assert set(first.order[:100]) == set(range(100))  # every image, then the start again
    np.testing.assert_array_equal(first.order[100:], first.order[:len(first.order) - 100])
    assert 0.3 < first.flips.mean() < 0.7
    same = NaFlexPlan(**SMALL).epoch(100, 0)
    for a, b in zip(first, same):
        np.testing.assert_array_equal(a, b)
    assert not np.array_equal(first.order, second.order)
    assert not np.array_equal(NaFlexPlan(**{**SMALL, "seed": 4}).epoch(100, 0).order, first.order)


# --------------------------------------------------------------------------
# the feeds
# --------------------------------------------------------------------------
def _expected(image, plan, seq_len, flip):
    grid = naflex_grid(image.shape[0], image.shape[1], plan.patch_size, seq_len)
    return naflex_sequence.image_sequence(image, plan.patch_size, grid, seq_len, flip)


@independent
def test_pydataset_batches_follow_the_plan():
    images, labels = _photos() * 2, list(range(10, 22))
    plan = NaFlexPlan(**SMALL)
    train = NaFlexBatches(images, labels, plan)
    assert len(train) == plan.steps_per_epoch(12) == 3
    shapes = set()
    for epoch in range(3):
        pass_plan = plan.epoch(12, epoch)
        for k in range(len(train)):
            inputs, y = train[k]
            seq_len, rows, flips = train.batch_plan(k)
            assert seq_len == pass_plan.seq_lens[k]
            assert inputs["patches"].shape == (plan.batch_size(seq_len), seq_len, 768)
            assert y.dtype == np.int32 and y.tolist() == [labels[r] for r in rows]
            for i, (row, flip) in enumerate(zip(rows, flips)):
                want = _expected(images[row], plan, seq_len, flip)
                for key in want:
                    np.testing.assert_array_equal(inputs[key][i], want[key])
            shapes.add(inputs["patches"].shape)
        train.on_epoch_end()
    assert shapes == {(plan.batch_size(v), v, 768) for v in plan.seq_lens}  # one shape per bucket
    # a flip is the image's mirror (flipping before or after the resize: the same to float rounding)
    seq_len, rows, flips = NaFlexBatches(images, labels, plan).batch_plan(0)
    i = int(np.argmax(flips))
    assert flips[i]
    mirrored = patchify(images[rows[i]][:, ::-1], 16, seq_len, seq_len)["patches"]
    np.testing.assert_allclose(NaFlexBatches(images, labels, plan)[0][0]["patches"][i], mirrored, atol=1e-5)
    evaluation = NaFlexBatches(images, labels, plan, training=False)
    assert len(evaluation) == 2
    inputs, y = evaluation[1]  # the last evaluation batch holds the rest
    assert inputs["patches"].shape == (5, 36, 768) and y.tolist() == labels[7:]
    np.testing.assert_array_equal(inputs["patches"][3], patchify(images[10], 16, 36, 36)["patches"])


@independent
def test_an_endless_pydataset_is_the_passes_one_after_another_from_any_batch():
    images, labels = _photos() * 2, list(range(10, 22))
    plan = NaFlexPlan(**SMALL)
    passes = NaFlexBatches(images, labels, plan)  # one pass a len(), moved on by on_epoch_end
    wanted = []
    for _ in range(3):
        wanted += [passes.batch_plan(k) for k in range(len(passes))]
        passes.on_epoch_end()
    for skip in (0, 2, 4):  # a resumed run's done steps, past a pass's end
        stream = NaFlexBatches(images, labels, plan, repeat=True, skip_batches=skip)
        assert stream.num_batches is None
        for k in range(len(wanted) - skip):
            seq_len, rows, flips = stream.batch_plan(k)
            assert seq_len == wanted[skip + k][0]
            np.testing.assert_array_equal(rows, wanted[skip + k][1])
            np.testing.assert_array_equal(flips, wanted[skip + k][2])
        stream.on_epoch_end()  # fit's epochs need not be passes: the stream counts its batches
        assert stream.batch_plan(0)[1].tolist() == wanted[skip][1].tolist()
    with pytest.raises(TypeError, match="endless"):
        len(stream)
    with pytest.raises(ValueError, match="repeat and skip_batches are for an endless training stream"):
        NaFlexBatches(images, labels, plan, training=False, repeat=True)


def _tf_source(tf, images, labels, encoded=False):
    if encoded:
        images = [tf.io.encode_png(image).numpy() for image in images]
        spec = tf.TensorSpec([], tf.string)
    else:
        spec = tf.TensorSpec([None, None, 3], tf.uint8)
    return tf.data.Dataset.from_generator(lambda: iter(zip(images, labels)),
                                          output_signature=(spec, tf.TensorSpec([], tf.int64)))


@independent
def test_tf_dataset_one_shape_per_bucket_and_the_plans_choices():
    tf = pytest.importorskip("tensorflow")
    images, labels = _photos() * 2, list(range(10, 22))
    plan = NaFlexPlan(**SMALL)
    train = nf.tf_dataset(_tf_source(tf, images, labels), plan, num_images=12, shuffle_buffer=1)
    inputs_spec, labels_spec = train.element_spec
    assert inputs_spec["patches"].shape.as_list() == [None, None, 768] and inputs_spec["patches"].dtype == tf.float32
    assert inputs_spec["patch_coord"].dtype == tf.int32 and inputs_spec["patch_valid"].dtype == tf.bool
    assert labels_spec.dtype == tf.int32
    steps = plan.steps_per_epoch(12)
    batches = list(train.take(3 * steps).as_numpy_iterator())
    shapes = {inputs["patches"].shape for inputs, _ in batches}
    assert shapes == {(plan.batch_size(v), v, 768) for v in plan.seq_lens}  # one shape per bucket
    for epoch in range(3):  # shuffle_buffer=1: position j of a pass is image j % 12
        pass_plan = plan.epoch(12, epoch)
        for k, (inputs, y) in enumerate(batches[epoch * steps:(epoch + 1) * steps]):
            positions = range(pass_plan.starts[k], pass_plan.starts[k + 1])
            assert y.tolist() == [labels[j % 12] for j in positions]
            for i, j in enumerate(positions):
                want = _expected(images[j % 12], plan, int(pass_plan.seq_lens[k]), pass_plan.flips[j])
                np.testing.assert_allclose(inputs["patches"][i], want["patches"], atol=1e-3)
                np.testing.assert_array_equal(inputs["patch_coord"][i], want["patch_coord"])
                np.testing.assert_array_equal(inputs["patch_valid"][i], want["patch_valid"])


@independent
def test_tf_dataset_shuffled_is_deterministic_and_evaluation_is_static():
    tf = pytest.importorskip("tensorflow")
    images, labels = _photos(), list(range(6))
    plan = NaFlexPlan(**SMALL)

    def labels_of(ds, n):
        return [y.tolist() for _, y in ds.take(n).as_numpy_iterator()]

    shuffled = labels_of(nf.tf_dataset(_tf_source(tf, images, labels), plan, shuffle_buffer=6), 8)
    assert shuffled == labels_of(nf.tf_dataset(_tf_source(tf, images, labels), plan, shuffle_buffer=6), 8)
    one_pass = nf.tf_dataset(_tf_source(tf, images, labels), plan, repeat=False)
    assert int(one_pass.cardinality()) == len(list(one_pass)) == plan.steps_per_epoch(6)  # counted once
    evaluation = nf.tf_dataset(_tf_source(tf, images, labels, encoded=True), plan, training=False)
    assert evaluation.element_spec[0]["patches"].shape.as_list() == [None, 36, 768]
    assert evaluation.element_spec[0]["patch_valid"].shape.as_list() == [None, 36]
    got = list(evaluation.as_numpy_iterator())
    assert [inputs["patches"].shape for inputs, _ in got] == [(6, 36, 768)]
    mine = NaFlexBatches(images, labels, plan, training=False)[0]
    np.testing.assert_allclose(got[0][0]["patches"], mine[0]["patches"], atol=1e-3)
    assert got[0][1].tolist() == labels
    raw = nf.tf_dataset(_tf_source(tf, images, labels), plan, training=False, image_dtype="uint8")
    assert raw.element_spec[0]["patches"].dtype == tf.uint8


@independent
def test_tf_dataset_of_a_tfds_dataset(tmp_path, cifar10_mirror):
    """tensorflow-datasets' own CIFAR-10 (prepared from a loopback mirror of the archive), as users load it."""
    tfds = pytest.importorskip("tensorflow_datasets")
    _, test_images, test_labels = cifar10_mirror
    plan = NaFlexPlan(**SMALL)
    test = tfds.load("cifar10", split="test", as_supervised=True, data_dir=str(tmp_path / "tfds"))
    (inputs, labels), = nf.tf_dataset(test, plan, training=False).as_numpy_iterator()
    assert sorted(labels.tolist()) == test_labels and inputs["patches"].shape == (3, 36, 768)
    stored = [test_images[test_labels.index(label)] for label in labels]  # in the order tfds stores them
    want = NaFlexBatches(stored, labels, plan, training=False)[0][0]
    np.testing.assert_allclose(inputs["patches"], want["patches"], atol=1e-3)
    train = tfds.load("cifar10", split="train", as_supervised=True, data_dir=str(tmp_path / "tfds"))
    batches = list(nf.tf_dataset(train, plan, repeat=False).as_numpy_iterator())
    assert len(batches) == plan.steps_per_epoch(10)
    assert {b[0]["patches"].shape for b in batches} == {(plan.batch_size(v), v, 768) for v in plan.schedule(10)}
    assert set(np.concatenate([b[1] for b in batches]).tolist()) == set(range(1, 7))  # the 10 images' labels


@independent
def test_folder_batches(tmp_path):
    root = photo_folder(tmp_path / "photos", per_class=4, size=(60, 90))
    plan = NaFlexPlan(**SMALL)
    train, validation = nf.folder_batches(root, plan, validation_split=0.25, workers=2)
    assert train.class_names == validation.class_names == ("astronaut", "cat", "coffee")
    assert len(train.images) == 9 and len(validation.images) == 3
    inputs, y = train[0]
    seq_len = plan.epoch(9, 0).seq_lens[0]
    assert inputs["patches"].shape == (plan.batch_size(seq_len), seq_len, 768) and set(y) <= {0, 1, 2}
    inputs, y = validation[0]
    assert inputs["patches"].shape == (3, 36, 768) and y.tolist() == [0, 1, 2]
    assert nf.folder_batches(train.image_folder, plan, validation_split=0)[1] is not None  # the folder's own split


# --------------------------------------------------------------------------
# model.fit on this backend
# --------------------------------------------------------------------------
class _Traces(keras.layers.Layer):
    """Records the input shape of each trace of a jitted step (a call on JAX tracers)."""

    shapes = []

    def call(self, x):
        if type(x).__module__.startswith("jax") and "Tracer" in type(x).__name__:
            _Traces.shapes.append(tuple(x.shape))
        return x


def _toy_model(features):
    inputs = {"patches": keras.Input((None, features), name="patches"),
              "patch_coord": keras.Input((None, 2), dtype="int32", name="patch_coord"),
              "patch_valid": keras.Input((None,), dtype="bool", name="patch_valid")}
    tokens = keras.layers.Dense(8)(_Traces()(inputs["patches"]))
    mask = keras.ops.expand_dims(keras.ops.cast(inputs["patch_valid"], "float32"), -1)
    rows = keras.ops.cast(inputs["patch_coord"][..., :1], "float32") * mask
    pooled = keras.ops.sum(tokens * mask + rows, axis=1) / keras.ops.maximum(keras.ops.sum(mask, axis=1), 1.0)
    model = keras.Model(inputs, keras.layers.Dense(3)(pooled))
    model.compile(optimizer="sgd", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def test_fit_on_this_backend_compiles_once_per_bucket():
    images, labels = _photos() * 2, [0, 1, 2] * 4
    plan = NaFlexPlan(**{**SMALL, "patch_size": 8})
    model = _toy_model(8 * 8 * 3)
    _Traces.shapes = []
    history = model.fit(NaFlexBatches(images, labels, plan), epochs=3, shuffle=False, verbose=0,
                        validation_data=NaFlexBatches(images, labels, plan, training=False))
    assert np.isfinite(history.history["loss"]).all() and len(history.history["val_loss"]) == 3
    buckets = {(plan.batch_size(v), v, 192) for v in plan.seq_lens}
    evaluation = {(7, 36, 192), (5, 36, 192)}  # 12 images: a batch of 7, the rest
    if backend() == "jax":  # one trace per shape; the first training shape twice (Keras' symbolic build)
        assert set(_Traces.shapes) == buckets | evaluation
        assert len(_Traces.shapes) == len(buckets) + len(evaluation) + 1
    tf = pytest.importorskip("tensorflow")
    stream = nf.tf_dataset(_tf_source(tf, images, labels), plan, shuffle_buffer=12)
    _Traces.shapes = []
    history = model.fit(stream, steps_per_epoch=plan.steps_per_epoch(12), epochs=2, shuffle=False, verbose=0)
    assert np.isfinite(history.history["loss"]).all()
    if backend() == "jax":  # compiled already: no new trace
        assert _Traces.shapes == []


# --------------------------------------------------------------------------
# bad input
# --------------------------------------------------------------------------
IMAGE = np.zeros((30, 40, 3), np.uint8)
BAD = {
    "grayscale": (lambda: patchify(np.zeros((30, 40)), 16, 64), r"\(height, width, 3\).*got shape \(30, 40\)"),
    "four channels": (lambda: patchify(np.zeros((30, 40, 4)), 16, 64), r"got shape \(30, 40, 4\)"),
    "a batch": (lambda: patchify(np.zeros((2, 30, 40, 3)), 16, 64), r"got shape \(2, 30, 40, 3\)"),
    "strings": (lambda: patchify(np.full((3, 4, 3), "a"), 16, 64), r"uint8 or float.*got dtype <U1"),
    "seq_len short": (lambda: patchify(_photos()[1], 16, 256, seq_len=128),
                      r"13x19 grid is 247 patches, longer than seq_len=128; expected seq_len >= 247"),
    "max_tokens 0": (lambda: patchify(IMAGE, 16, 0), r"max_tokens must be an integer >= 1; got 0"),
    "patch 0": (lambda: patchify(IMAGE, 0, 64), r"patch_size must be an integer >= 1; got 0"),
    "patch negative": (lambda: naflex_grid(30, 40, -16, 64), r"patch_size must be an integer >= 1; got -16"),
    "patch float": (lambda: naflex_grid(30, 40, 2.5, 64), r"patch_size must be an integer >= 1; got 2.5"),
    "height 0": (lambda: naflex_grid(0, 40, 16, 64), r"height must be an integer >= 1; got 0"),
    "too large": (lambda: naflex_grid(2_000_000, 2_000_000, 8, 1), r"2000000x2000000 image fits 1 token"),
    "mode": (lambda: patchify(IMAGE, 16, 64, mode="bogus"), r"mode must be one of \('vit', 'imagenet', 'clip'\)"),
    "image_dtype": (lambda: patchify(IMAGE, 16, 64, image_dtype="float16"), r"image_dtype must be one of"),
    "no seq_lens": (lambda: NaFlexPlan(seq_lens=()), r"seq_lens must be a non-empty sequence.*got \(\)"),
    "seq_len negative": (lambda: NaFlexPlan(seq_lens=(128, -1)), r"each of seq_lens must be an integer >= 1; got -1"),
    "budget 0": (lambda: NaFlexPlan(max_tokens_per_batch=0), r"max_tokens_per_batch must be an integer >= 1; got 0"),
    "batch of 0": (lambda: NaFlexPlan(max_tokens_per_batch=1000),
                   r"gives sequences of 1024 tokens a batch of 0 images.*expected max_tokens_per_batch >= 1024"),
    "divisor": (lambda: NaFlexPlan(max_tokens_per_batch=4096, batch_divisor=8),
                r"576 tokens a batch of 0 images \(batch_divisor=8\); expected max_tokens_per_batch >= 4608"),
    "eval batch of 0": (lambda: NaFlexPlan(seq_lens=(16,), max_tokens_per_batch=100, eval_seq_len=576),
                        r"sequences of 576 tokens a batch of 0 images"),
    "plan patch": (lambda: NaFlexPlan(patch_size=0), r"patch_size must be an integer >= 1; got 0"),
    "seed": (lambda: NaFlexPlan(seed=1.5), r"seed must be an integer >= 0; got 1.5"),
    "seed negative": (lambda: NaFlexPlan(seed=-1), r"seed must be an integer >= 0; got -1"),
    "labels": (lambda: NaFlexBatches([IMAGE], [0, 1], NaFlexPlan()), r"one label per image: 1 images, 2 labels"),
    "no images": (lambda: NaFlexBatches([], [], NaFlexPlan()), r"at least one image"),
    "not a plan": (lambda: NaFlexBatches([IMAGE], [0], {"patch_size": 16}), r"plan must be a NaFlexPlan; got dict"),
    "bad image in a batch": (lambda: NaFlexBatches([np.zeros((5, 5))], [0], NaFlexPlan())[0],
                             r"\(height, width, 3\).*got shape \(5, 5\)"),
}


@independent
@pytest.mark.parametrize("case", BAD, ids=list(BAD))
def test_bad_input_is_one_clear_value_error(case):
    call, message = BAD[case]
    with pytest.raises(ValueError, match=message):
        call()


@independent
def test_tf_dataset_refuses_what_is_not_image_label_pairs():
    tf = pytest.importorskip("tensorflow")
    with pytest.raises(ValueError, match=r"\(image, label\) pairs"):
        nf.tf_dataset(tf.data.Dataset.from_tensor_slices(np.zeros((2, 8, 8, 3), np.uint8)), NaFlexPlan())
    grey = tf.data.Dataset.from_tensor_slices((np.zeros((2, 8, 8, 1), np.uint8), [0, 1]))
    with pytest.raises(ValueError, match=r"\(height, width, 3\) images .* got images of"):
        nf.tf_dataset(grey, NaFlexPlan())
    with pytest.raises(ValueError, match="holds no images"):
        nf.tf_dataset(tf.data.Dataset.from_tensor_slices((np.zeros((0, 8, 8, 3), np.uint8), [])).filter(
            lambda x, y: True), NaFlexPlan())
