"""Files that fail while the folder feed reads them (issue 46): with the header scan (the default) a file
truncated, removed or resized after the scan is skipped as it is read, named once in the log and in
`skipped_files`; a training example takes the next readable file of its pass, so batches stay full, tf.data and
the PyDataset agree and `skip_batches` resumes exactly (keras_vit.data.folder_read)."""

import logging
import os
import pathlib

import numpy as np
import pytest
from conftest import TINY, photo_folder

from keras_vit import data
from keras_vit.data import folder as F
from keras_vit.data.stream import plan_pass

independent = pytest.mark.backend_independent
ARGS = dict(image_size=16, batch_size=4, image_dtype="uint8", eval_batch_size=2)


def _photos(tmp_path):
    """12 small photos (36x48: 9 training, 3 validation), a JPEG the last image of the first pass: the seed
    found, and the scan of the folder with it."""
    root = photo_folder(tmp_path / "photos", per_class=4, size=(36, 48))
    for seed in range(20):
        folder = F.scan(root, 0.25, seed, cache=False)
        if folder.train[plan_pass(folder.train, seed, 0)[0][-1]][0].endswith(".jpg"):
            return folder
    raise AssertionError("no seed puts a JPEG last")


def _batches(ds, count):
    if hasattr(ds, "take"):  # tf.data
        return [(images.numpy(), labels.numpy()) for images, labels in ds.take(count)]
    return [ds[i] for i in range(count)]


def _same(ours, theirs):
    """Equal labels and images within one level (two resizers' rounding) batch by batch."""
    assert len(ours) == len(theirs)
    for (images, labels), (their_images, their_labels) in zip(ours, theirs):
        np.testing.assert_array_equal(labels, their_labels)
        assert images.shape == their_images.shape and np.abs(images.astype(int) - their_images).max() <= 1


def _file(folder, path):
    return pathlib.Path(folder.root, path)


def _cut(path, keep=0.9):
    raw = path.read_bytes()
    path.write_bytes(raw[: int(len(raw) * keep)])


def _said(caplog):
    return [r.getMessage() for r in caplog.records if r.name == "keras_vit"]


@independent
def test_a_file_truncated_after_the_scan_is_replaced_by_the_next_of_its_pass(tmp_path, caplog):
    tf = pytest.importorskip("tensorflow")
    folder = _photos(tmp_path)
    n, order = len(folder.train), plan_pass(folder.train, folder.seed, 0)[0]
    intact = _batches(data.from_directory(folder, **ARGS, pipeline="pydataset")[0], 6)  # 24 examples
    bad = folder.train[order[-1]][0]
    _cut(_file(folder, bad))
    assert F.scan(folder.root, 0.25, folder.seed, cache=False) == folder  # the header scan cannot see it
    window = tf.image.decode_and_crop_jpeg(tf.io.read_file(str(_file(folder, bad))), [0, 0, 8, 8])
    assert window.shape == (8, 8, 3)  # TensorFlow's cropped decode reads the top of the cut file: the end marker tells
    feeds = {}
    for pipeline in ("pydataset", "tf.data"):
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="keras_vit"):
            train, _ = data.from_directory(folder, **ARGS, pipeline=pipeline)
            feeds[pipeline] = _batches(train, 6)
        said = _said(caplog)
        assert len(said) == 1 and bad in said[0] and "cannot be decoded" in said[0]  # once, in two passes
        assert [p for p, _ in train.skipped_files] == [bad]
    _same(feeds["tf.data"], feeds["pydataset"])
    flat = [(image, label) for images, labels in feeds["pydataset"] for image, label in zip(images, labels)]
    before = [(image, label) for images, labels in intact for image, label in zip(images, labels)]
    assert all(images.shape == (4, 16, 16, 3) for images, _ in feeds["pydataset"])  # every batch full
    for g, ((image, label), (was, _)) in enumerate(zip(flat, before)):
        pass_index, position = divmod(g, n)
        if folder.train[plan_pass(folder.train, folder.seed, pass_index)[0][position]][0] != bad:
            np.testing.assert_array_equal(image, was)  # only the bad file's examples change
        else:  # the next file of the pass (the first, wrapping round), a crop of its own
            following = plan_pass(folder.train, folder.seed, pass_index)[0][(position + 1) % n]
            assert label == folder.train[following][1]
            assert not np.array_equal(image, before[pass_index * n + (position + 1) % n][0])


@independent
def test_skip_batches_one_pass_and_processes_stay_exact_across_a_bad_file(tmp_path):
    pytest.importorskip("tensorflow")
    folder = _photos(tmp_path)
    bad = folder.train[plan_pass(folder.train, folder.seed, 0)[0][-1]][0]
    _cut(_file(folder, bad))
    for pipeline in ("pydataset", "tf.data"):
        whole = _batches(data.from_directory(folder, **ARGS, pipeline=pipeline)[0], 6)
        later = _batches(data.from_directory(folder, **ARGS, pipeline=pipeline, skip_batches=2)[0], 4)
        _same(later, whole[2:])  # batch 2 holds the bad file's example (the 9th)
        halves = [_batches(data.from_directory(folder, **ARGS, pipeline=pipeline, process_index=i,
                                               process_count=2)[0], 6) for i in range(2)]
        _same([(np.concatenate([a[0], b[0]]), np.concatenate([a[1], b[1]])) for a, b in zip(*halves)], whole)
        once, _ = data.from_directory(folder, **ARGS, pipeline=pipeline, repeat=False, drop_remainder=False)
        single = _batches(once, 3)
        _same(single, [*whole[:2], (whole[2][0][:1], whole[2][1][:1])])  # the pass's last example put back
        assert [len(labels) for _, labels in single] == [4, 4, 1] and [p for p, _ in once.skipped_files] == [bad]


@independent
def test_a_file_deleted_during_training_is_skipped_by_both_feeds(tmp_path):
    pytest.importorskip("tensorflow")
    folder = _photos(tmp_path)
    gone = folder.train[3][0]
    train, _ = data.from_directory(folder, **ARGS, pipeline="tf.data")
    stream = iter(train)
    next(stream)  # training has begun
    os.remove(_file(folder, gone))
    later = [(images.numpy(), labels.numpy()) for _, (images, labels) in zip(range(60), stream)]  # 27 passes
    assert all(images.shape == (4, 16, 16, 3) for images, _ in later)
    theirs, _ = data.from_directory(folder, **ARGS, pipeline="pydataset")
    _same(later[-10:], [theirs[i] for i in range(51, 61)])  # past what tf.data read ahead before the removal
    assert [(p, "gone" in reason) for p, reason in train.skipped_files] == [(gone, True)]
    assert [(p, "gone" in reason) for p, reason in theirs.skipped_files] == [(gone, True)]


@independent
def test_a_file_replaced_after_the_scan_is_read_at_its_size_and_skipped_at_another(tmp_path):
    pytest.importorskip("tensorflow")
    from PIL import Image

    folder = _photos(tmp_path)
    resized, grey = folder.train[0][0], folder.train[1][0]
    Image.new("RGB", (30, 20), (200, 10, 10)).save(_file(folder, resized))  # another size
    Image.new("RGB", (48, 36), (90, 90, 90)).save(_file(folder, grey))  # the scanned size
    feeds = {}
    for pipeline in ("pydataset", "tf.data"):
        train, _ = data.from_directory(folder, **ARGS, pipeline=pipeline)
        feeds[pipeline] = _batches(train, 3)  # 12 examples: the first pass whole
        assert [p for p, _ in train.skipped_files] == [resized]
        assert "30x20 pixels now, 48x36 when the folder was scanned" in dict(train.skipped_files)[resized]
    _same(feeds["tf.data"], feeds["pydataset"])
    order = plan_pass(folder.train, folder.seed, 0)[0]
    images = np.concatenate([images for images, _ in feeds["pydataset"]])
    same_size = images[list(order).index(1)]  # the grey replacement's example: its new pixels
    assert np.abs(same_size.astype(int) - 90).max() <= 2
    assert not (np.abs(images.astype(int) - [200, 10, 10]).max(axis=(1, 2, 3)) <= 2).any()  # the resized: never


@independent
def test_a_bad_validation_file_is_left_out_of_its_batch(tmp_path, caplog):
    pytest.importorskip("tensorflow")
    folder = _photos(tmp_path)
    bad = folder.validation[1][0]
    _cut(_file(folder, bad), keep=0.3)
    feeds = {}
    for pipeline in ("pydataset", "tf.data"):
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="keras_vit"):
            _, validation = data.from_directory(folder, **ARGS, pipeline=pipeline)
            feeds[pipeline] = _batches(validation, 2)
        assert [p for p, _ in validation.skipped_files] == [bad] and len(_said(caplog)) == 1
        assert [list(labels) for _, labels in feeds[pipeline]] == [[folder.validation[0][1]],
                                                                  [folder.validation[2][1]]]
        _, one = data.from_directory(folder, **{**ARGS, "eval_batch_size": 1}, pipeline=pipeline)
        assert [len(labels) for _, labels in _batches(one, 3)] == [1, 0, 1]  # a batch of none, not an error
    _same(feeds["tf.data"], feeds["pydataset"])


@independent
def test_a_folder_with_no_readable_training_file_left_says_so(tmp_path):
    pytest.importorskip("tensorflow")
    folder = _photos(tmp_path)
    for record in folder.train:
        os.remove(_file(folder, record[0]))
    train, _ = data.from_directory(folder, **ARGS, pipeline="pydataset")
    with pytest.raises(ValueError, match=r"none of the 9 training images of .*photos.* can be read now"):
        train[0]
    train, _ = data.from_directory(folder, **ARGS, pipeline="tf.data")
    with pytest.raises(Exception, match=r"none of the 9 training images"):
        next(iter(train))
    assert len(train.skipped_files) == 9


@pytest.mark.parametrize("pipeline", ["pydataset", "tf.data"])
def test_fit_goes_on_past_a_truncated_file(tmp_path, pipeline):
    """model.fit on this backend, from a folder whose file was cut after the scan."""
    pytest.importorskip("tensorflow")
    import keras_vit

    folder = _photos(tmp_path)
    bad = folder.train[plan_pass(folder.train, folder.seed, 0)[0][0]][0]  # the first example
    _cut(_file(folder, bad))
    train, validation = data.from_directory(folder, 32, 4, image_dtype="uint8", pipeline=pipeline)
    model = keras_vit.VisionTransformer(**{**TINY, "classes": 3}, input_dtype="uint8")
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    history = model.fit(train, steps_per_epoch=3, epochs=1, validation_data=validation, verbose=0)
    assert np.isfinite(history.history["loss"][0]) and np.isfinite(history.history["val_loss"][0])
    assert [p for p, _ in train.skipped_files] == [bad]


@pytest.mark.one_backend
def test_finetune_reports_a_file_that_fails_as_it_is_read(tmp_path, start):
    """`keras-vit finetune DIR` scans headers by default: a truncated validation JPEG passes the scan, is left
    out when read, and report.json names it under skipped_while_reading (not under the scan's skipped)."""
    import json

    from keras_vit import cli

    folder = _photos(tmp_path)
    bad = next(record[0] for record in folder.validation if record[0].endswith(".jpg"))
    _cut(_file(folder, bad), keep=0.6)
    out = tmp_path / "run"
    assert cli.main(["finetune", folder.root, "--weights", start, "--image-size", "32", "--steps", "2",
                     "--batch-size", "4", "--validation-split", "0.25", "--seed", str(folder.seed), "--out", str(out),
                     "--quiet"]) == 0
    report = json.loads((out / "report.json").read_text())
    assert report["skipped"] == [] and report["flags"]["verify"] is None
    assert [entry["file"] for entry in report["skipped_while_reading"]] == [bad]


@independent
def test_the_naflex_feed_skips_a_bad_file_as_the_square_feed_does(tmp_path, caplog):
    """naflex_feed.folder_batches: a training file cut after the scan is replaced by the next readable file of
    its pass (made with the flip of its position), a cut validation file left out of its batch, both named once
    in the log and in skipped_files."""
    from keras_vit.data import naflex_feed
    from keras_vit.data.folder import read_image
    from keras_vit.data.naflex_sequence import image_sequence, naflex_grid

    folder = _photos(tmp_path)
    plan = naflex_feed.NaFlexPlan(patch_size=8, seq_lens=(12, 24), max_tokens_per_batch=48, eval_seq_len=24)
    epoch = plan.epoch(len(folder.train), 0)
    bad_row = int(epoch.order[1])
    bad, bad_validation = folder.train[bad_row][0], folder.validation[0][0]
    _cut(_file(folder, bad), keep=0.4)
    _cut(_file(folder, bad_validation), keep=0.4)
    with caplog.at_level(logging.WARNING, logger="keras_vit"):
        train, validation = naflex_feed.folder_batches(folder, plan, image_dtype="uint8")
        first = train[0]
        later = [train[i] for i in range(1, len(train))]
        val_labels = np.concatenate([validation[i][1] for i in range(len(validation))])
    assert [p for p, _ in train.skipped_files] == sorted([bad, bad_validation]) and len(_said(caplog)) == 2
    stand_in = next(int(r) for r in epoch.order[2:] if int(r) != bad_row)  # the next file of the pass
    assert first[1][1] == folder.train[stand_in][1] and len(first[1]) == epoch.starts[1]  # the batch full
    assert sum(len(labels) for _, labels in (first, *later)) == epoch.starts[-1]
    image = read_image(os.path.join(folder.root, folder.train[stand_in][0]))
    seq_len = int(epoch.seq_lens[0])
    expected = image_sequence(image, 8, naflex_grid(*image.shape[:2], 8, seq_len), seq_len, bool(epoch.flips[1]),
                              "vit", "uint8")
    for key, value in expected.items():
        np.testing.assert_array_equal(first[0][key][1], value)
    assert val_labels.tolist() == [record[1] for record in folder.validation[1:]]
