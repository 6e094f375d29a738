"""Tests for keras_vit.data on mocked TFDS data; run under each KERAS_BACKEND."""

import io

import keras
import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
tfds = pytest.importorskip("tensorflow_datasets")

from keras_vit import data  # noqa: E402

NOWHERE = "/nonexistent/tfds"  # never read: mock_data serves every example


def take(ds, n):
    return list(ds.take(n).as_numpy_iterator())


def png(array):
    return tf.io.encode_png(array).numpy()


def fake_source(images, labels, seen_splits):
    """A TFDS mock serving fixed images (encoded, as the pipeline reads them)."""
    encoded = [png(im) for im in images]

    def as_dataset(self, split, decoders=None, read_config=None, shuffle_files=False):
        seen_splits.append(str(split))
        return tf.data.Dataset.from_tensor_slices(
            {"image": encoded, "label": np.asarray(labels, np.int64)})

    return tfds.testing.mock_data(as_dataset_fn=as_dataset)


# ------------------------------------------------------------------- info
@pytest.mark.parametrize("name, classes", [
    ("cifar10", 10), ("cifar100", 100), ("oxford_iiit_pet", 37), ("oxford_flowers102", 102),
])
def test_dataset_info_reads_classes_without_download(name, classes):
    info = data.dataset_info(name, data_dir=NOWHERE)
    assert info.num_classes == classes
    assert (info.image_key, info.label_key) == ("image", "label")
    assert len(info.class_names) == classes


def test_unknown_dataset_is_a_clear_error():
    with pytest.raises(ValueError, match=r"Unknown TFDS dataset 'cifar_10'.*'cifar10'"):
        data.dataset_info("cifar_10")
    with pytest.raises(ValueError, match="Unknown TFDS dataset"):
        data.load("no_such_dataset_xyz", 32, 4)


def test_dataset_without_image_features_is_refused():
    with pytest.raises(ValueError, match="not an image-classification dataset.*image feature 'text'"):
        data.dataset_info("imdb_reviews", data_dir=NOWHERE)


# --------------------------------------------------------------- pipelines
@pytest.mark.parametrize("name, size", [("cifar10", 16), ("oxford_iiit_pet", (24, 20))])
def test_shapes_ranges_and_labels(name, size):
    classes = data.dataset_info(name, data_dir=NOWHERE).num_classes
    h, w = (size, size) if isinstance(size, int) else size
    with tfds.testing.mock_data(num_examples=12):
        train, test = data.load(name, size, batch_size=4, data_dir=NOWHERE)
        for images, labels in take(train, 4) + take(test, 3):
            assert images.dtype == np.float32 and labels.dtype == np.int32
            assert images.shape[1:] == (h, w, 3)
            assert images.shape[0] == labels.shape[0] <= 4
            assert images.min() >= -1.0 and images.max() <= 1.0
            assert labels.min() >= 0 and labels.max() < classes
        assert len(take(test, 10)) == 3  # 12 examples, eval keeps them all


def test_grayscale_images_become_rgb():
    with tfds.testing.mock_data(num_examples=4):
        train, test = data.load("mnist", 8, batch_size=2, data_dir=NOWHERE)
        images, _ = take(test, 1)[0]
        assert images.shape == (2, 8, 8, 3)
        np.testing.assert_array_equal(images[..., 0], images[..., 2])


def test_eval_is_a_plain_deterministic_resize():
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, size=(6, 32, 32, 3), dtype=np.uint8)
    labels = np.arange(6) % 3
    with fake_source(images, labels, []):
        _, test = data.load("cifar10", 32, batch_size=4, data_dir=NOWHERE)
        first = np.concatenate([b[0] for b in test.as_numpy_iterator()])
        again = np.concatenate([b[0] for b in test.as_numpy_iterator()])
        got_labels = np.concatenate([b[1] for b in test.as_numpy_iterator()])
    np.testing.assert_array_equal(first, again)
    # at the stored size a resize is the identity: only the [-1, 1] scaling is left
    np.testing.assert_allclose(first, images.astype(np.float32) / 127.5 - 1.0, atol=1e-6)
    np.testing.assert_array_equal(got_labels, labels)


def test_eval_resize_matches_an_independent_bilinear_resize():
    skimage_transform = pytest.importorskip("skimage.transform")
    image = np.tile(np.linspace(0, 255, 40, dtype=np.float64)[None, :, None], (30, 1, 3))
    image = image.astype(np.uint8)
    out = np.asarray(data.eval_preprocess(image, (15, 20)))
    reference = skimage_transform.resize(image.astype(np.float64), (15, 20, 3), order=1,
                                         anti_aliasing=False, preserve_range=True)
    np.testing.assert_allclose(out, reference / 127.5 - 1.0, atol=2e-3)


def test_train_crops_differ_between_passes_and_repeat_exactly():
    with tfds.testing.mock_data(num_examples=8):
        # no shuffling: pass 2 holds the same images in the same order
        train, _ = data.load("cifar10", 16, batch_size=8, data_dir=NOWHERE, shuffle_buffer=1)
        (a_img, a_lab), (b_img, b_lab) = take(train, 2)
        np.testing.assert_array_equal(a_lab, b_lab)
        assert not np.allclose(a_img, b_img)
        again, _ = data.load("cifar10", 16, batch_size=8, data_dir=NOWHERE, shuffle_buffer=1)
        (c_img, _), (d_img, _) = take(again, 2)
        np.testing.assert_array_equal(a_img, c_img)  # same seed, same stream
        np.testing.assert_array_equal(b_img, d_img)
        other, _ = data.load("cifar10", 16, batch_size=8, data_dir=NOWHERE, shuffle_buffer=1,
                             seed=1)
        assert not np.allclose(take(other, 1)[0][0], a_img)


def test_shuffle_order_changes_per_pass_and_covers_every_example():
    images = np.zeros((10, 8, 8, 3), np.uint8)
    labels = np.arange(10)
    with fake_source(images, labels, []):
        train, _ = data.load("cifar10", 8, batch_size=10, data_dir=NOWHERE)
        first, second = [b[1] for b in take(train, 2)]
    assert sorted(first) == sorted(second) == list(range(10))
    assert list(first) != list(second)


def test_stream_does_not_depend_on_the_global_seed():
    def labels():
        with tfds.testing.mock_data(num_examples=10):
            train, _ = data.load("cifar10", 8, batch_size=10, data_dir=NOWHERE, seed=3)
            return [list(b[1]) for b in take(train, 2)]

    plain = labels()
    for global_seed in (0, 1234):
        keras.utils.set_random_seed(global_seed)
        assert labels() == plain


def test_skip_batches_resumes_the_same_stream_across_passes():
    with tfds.testing.mock_data(num_examples=10):
        train, _ = data.load("cifar10", 8, batch_size=4, data_dir=NOWHERE)
        stream = take(train, 7)
        resumed, _ = data.load("cifar10", 8, batch_size=4, data_dir=NOWHERE, skip_batches=3)
        tail = take(resumed, 4)  # batch 3 starts inside the second pass (example 12 = 10 + 2)
    for (x, y), (rx, ry) in zip(stream[3:], tail):
        np.testing.assert_array_equal(x, rx)
        np.testing.assert_array_equal(y, ry)


def test_single_pass_has_known_length():
    with tfds.testing.mock_data(num_examples=10):
        train, _ = data.load("cifar10", 8, batch_size=4, data_dir=NOWHERE, repeat=False)
        assert int(train.cardinality()) == 2
        assert len(list(train)) == 2
        train, _ = data.load("cifar10", 8, batch_size=4, data_dir=NOWHERE, repeat=False,
                             drop_remainder=False)
        assert [len(b[1]) for b in train.as_numpy_iterator()] == [4, 4, 2]


def test_train_crop_follows_the_official_area_and_aspect_ranges():
    # Pixel values encode their own row (channel 0) and column (channel 1), so
    # the output tells which part of the source image was cropped.
    rows, cols = np.meshgrid(np.arange(100), np.arange(100), indexing="ij")
    image = np.stack([rows * 2, cols * 2, np.zeros_like(rows)], -1).astype(np.uint8)
    areas, flips = [], 0
    for i in range(60):
        out = (np.asarray(data.train_preprocess(image, 32, seed=[7, i])) + 1.0) * 127.5 / 2.0
        r, c = out[..., 0], out[..., 1]
        height = r.max() - r.min() + 1
        width = c.max() - c.min() + 1
        areas.append(height * width / 100.0**2)
        assert 0.75 * 0.85 <= width / height <= (4 / 3) / 0.85
        flips += c[0, 0] > c[0, -1]
    areas = np.array(areas)
    assert areas.min() >= 0.05 * 0.8 and areas.max() <= 1.0
    assert (areas < 0.4).any() and (areas > 0.6).any()  # the range is actually used
    assert 10 < flips < 50  # about half flipped


def test_dev_split_names_and_use():
    assert data.dev_splits("train", 0.02) == ("train[:98%]", "train[98%:]")
    assert data.dev_splits("train", 0.1) == ("train[:90%]", "train[90%:]")
    assert data.dev_splits("train", 0.025) == ("train[:97.5%]", "train[97.5%:]")
    seen = []
    images = np.zeros((8, 8, 8, 3), np.uint8)
    with fake_source(images, np.zeros(8), seen):
        data.load("oxford_iiit_pet", 8, batch_size=2, data_dir=NOWHERE, dev_fraction=0.1)
    assert seen == ["train[:90%]", "train[90%:]"]
    with pytest.raises(ValueError, match="dev_fraction"):
        data.dev_splits("train", 1.0)
    with pytest.raises(ValueError, match="plain split name"):
        data.dev_splits("train[:50%]", 0.1)


@pytest.mark.parametrize("kwargs, match", [
    (dict(image_size=0), "image_size"),
    (dict(image_size=(32, 32, 3)), "image_size"),
    (dict(batch_size=0), "batch_size"),
    (dict(split="train"), "pair"),
    (dict(skip_batches=-1), "skip_batches"),
    (dict(shuffle_buffer=0), "shuffle_buffer"),
])
def test_bad_arguments(kwargs, match):
    args = dict(name="cifar10", image_size=8, batch_size=2, data_dir=NOWHERE)
    args.update(kwargs)
    with tfds.testing.mock_data(num_examples=4):
        with pytest.raises(ValueError, match=match):
            data.load(**args)


def test_missing_data_without_download_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match="not prepared.*data_dir"):
        data.load("cifar10", 8, 2, data_dir=str(tmp_path), download=False)


def test_a_split_smaller_than_a_batch_is_refused_for_a_single_pass():
    with tfds.testing.mock_data(num_examples=3):
        with pytest.raises(ValueError, match="fewer than one batch"):
            data.load("cifar10", 8, batch_size=4, data_dir=NOWHERE, repeat=False)


# ---------------------------------------------------------------- model.fit
def test_pipelines_feed_model_fit_on_this_backend():
    classes = data.dataset_info("cifar10", data_dir=NOWHERE).num_classes
    keras.utils.set_random_seed(0)
    model = keras.Sequential([
        keras.Input((16, 16, 3)),
        keras.layers.Conv2D(4, 4, strides=4),
        keras.layers.GlobalAveragePooling2D(),
        keras.layers.Dense(classes),
    ])
    model.compile(optimizer=keras.optimizers.SGD(0.1),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    with tfds.testing.mock_data(num_examples=16):
        train, test = data.load("cifar10", 16, batch_size=4, data_dir=NOWHERE)
        before = [np.array(w) for w in model.get_weights()]
        history = model.fit(train, steps_per_epoch=3, epochs=2, validation_data=test, verbose=0,
                            shuffle=False)
        result = model.evaluate(test, verbose=0, return_dict=True)
        batches = [(np.asarray(images), np.asarray(labels)) for images, labels in test]
    assert len(history.history["loss"]) == 2
    assert np.isfinite(history.history["loss"]).all()
    # the metrics are those of the pipeline's own images and labels, recomputed here
    logits = np.concatenate([model.predict(images, verbose=0) for images, _ in batches]).astype("float64")
    labels = np.concatenate([labels for _, labels in batches])
    assert len(labels) == 16
    log_probs = logits - logits.max(-1, keepdims=True)
    log_probs -= np.log(np.exp(log_probs).sum(-1, keepdims=True))
    np.testing.assert_allclose(result["accuracy"], (logits.argmax(-1) == labels).mean(), atol=1e-6)
    np.testing.assert_allclose(result["loss"], -log_probs[np.arange(16), labels].mean(), rtol=1e-5)
    assert any(not np.allclose(a, np.array(b)) for a, b in zip(before, model.get_weights()))


@pytest.mark.parametrize("repeat", [True, False])
def test_hosts_read_their_rows_of_each_global_batch(repeat):
    """Two processes' batches of 3, put side by side, are the single-process batches of 6 (also
    resumed mid-stream), each host decoding only its own rows."""
    with tfds.testing.mock_data(num_examples=14):
        args = dict(name="cifar10", image_size=8, batch_size=6, data_dir=NOWHERE, repeat=repeat, eval_batch_size=4)
        whole, whole_eval = data.load(**args, skip_batches=1)
        parts = [data.load(**args, skip_batches=1, process_index=i, process_count=2) for i in range(2)]
        n = 3 if repeat else 1
        expected, expected_eval = take(whole, n), take(whole_eval, 2)
        got = [take(train, n) for train, _ in parts]
        got_eval = [take(evaluation, 2) for _, evaluation in parts]
        assert [int(train.cardinality()) for train, _ in parts] == [int(whole.cardinality())] * 2
    assert len(got[0]) == len(got[1]) == len(expected) == n
    for batch, first, second in zip(expected, *got):
        assert first[0].shape == (3, *batch[0].shape[1:]) and batch[0].shape[0] == 6
        for k in range(2):
            np.testing.assert_array_equal(np.concatenate([first[k], second[k]]), batch[k])
    for batch, first, second in zip(expected_eval, *got_eval):
        np.testing.assert_array_equal(np.concatenate([first[1], second[1]]), batch[1])


@pytest.mark.parametrize("kwargs, match", [
    (dict(process_count=4), r"`batch_size` \(6\) must be divisible by `process_count` \(4\)"),
    (dict(process_index=2, process_count=2), r"`process_index` must be an integer in \[0, 2\); got 2"),
    (dict(process_count=2, repeat=False, drop_remainder=False), "equal batches on every host"),
])
def test_bad_process_split(kwargs, match):
    with tfds.testing.mock_data(num_examples=4):
        with pytest.raises(ValueError, match=match):
            data.load("cifar10", 8, batch_size=6, data_dir=NOWHERE, **kwargs)
