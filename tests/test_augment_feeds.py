"""timm's per-image augmentations in every feed (keras_vit.data.augment): RandAugment, random erasing and
repeated augmentation through `from_directory` (tf.data and the PyDataset, the same batches) and TFDS's `load`,
every draw keyed on (seed, pass, position) so that `skip_batches` stays exact; their refusals by name, in
Python and on `keras-vit finetune`'s command line."""

import json

import keras
import numpy as np
import pytest
from conftest import assert_resumed_equals_whole, photo_folder

from keras_vit import cli, data
from keras_vit.data import rand_augment
from keras_vit.data.augment import Augment
from keras_vit.data.stream import (
    ERASE_STREAM,
    RAND_AUGMENT_STREAM,
    plan_pass,
    position_rng,
)
from keras_vit.recipes import own_images

independent = pytest.mark.backend_independent  # numpy, Pillow and tf.data: the same on every backend
ALL = dict(auto_augment="rand-m9-mstd0.5-inc1", re_prob=0.5, re_count=2, aug_repeats=2)
ARGS = dict(image_size=32, batch_size=4, validation_split=0.25)


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    return photo_folder(tmp_path_factory.mktemp("photos"), per_class=4)


def _level(image_dtype):
    """One level of 255 in the images' scale."""
    return 1 if image_dtype == "uint8" else 1 / 127.5 + 1e-6


@independent
@pytest.mark.parametrize("image_dtype", ["float32", "uint8"])
def test_tf_data_and_the_pydataset_give_the_same_augmented_batches(photos, image_dtype):
    pytest.importorskip("tensorflow")
    tf_train, _ = data.from_directory(photos, **ARGS, **ALL, image_dtype=image_dtype, pipeline="tf.data")
    py_train, _ = data.from_directory(tf_train.image_folder, **ARGS, **ALL, image_dtype=image_dtype,
                                      pipeline="pydataset")
    plain, _ = data.from_directory(tf_train.image_folder, **ARGS, image_dtype=image_dtype, pipeline="pydataset")
    stream, off = iter(tf_train), []
    for i in range(5):  # 20 images: two passes over the 9 training images and a bit of a third
        images, labels = next(stream)
        theirs, their_labels = py_train[i]
        np.testing.assert_array_equal(labels.numpy(), their_labels)
        assert images.dtype == theirs.dtype and theirs.shape == (4, 32, 32, 3)
        off.append(np.abs(images.numpy().astype(np.float64) - theirs) / _level(image_dtype))
        assert np.abs(theirs.astype(np.float64) - plain[i][0]).max() > 10 * _level(image_dtype)  # augmented
    # within one level, as the paths without RandAugment (the two resizers' rounding; both paths run
    # RandAugment's same Pillow code), but for a few values: an op (an enhancement, AutoContrast) can scale that
    off = np.concatenate(off)
    assert np.median(off) == 0 and (off > 1).mean() < 1e-3


@independent
def test_each_augmentation_runs_in_timms_order_from_its_positions_draws(photos):
    """RandAugment on the uint8 crop after resize and flip, before normalisation; erasing after it; the
    draws of the example at position j of pass p from position_rng(seed, p, j, its stream)."""
    folder = data.from_directory(photos, **ARGS, pipeline="pydataset")[0].image_folder
    n, config = len(folder.train), rand_augment.parse(ALL["auto_augment"], fill=(128, 128, 128))
    uint8_plain = data.from_directory(folder, **ARGS, image_dtype="uint8", pipeline="pydataset")[0]
    float_plain = data.from_directory(folder, **ARGS, pipeline="pydataset")[0]
    with_aa = data.from_directory(folder, **ARGS, auto_augment=ALL["auto_augment"], image_dtype="uint8",
                                  pipeline="pydataset")[0]
    erased = data.from_directory(folder, **ARGS, re_prob=1.0, re_count=3, pipeline="pydataset")[0]
    eraser = Augment(re_prob=1.0, re_count=3).eraser
    for batch in (0, 3):  # pass 0, and pass 1 from its fourth position on
        for row in range(4):
            g = batch * 4 + row
            steps = rand_augment.draw(config, position_rng(folder.seed, g // n, g % n, RAND_AUGMENT_STREAM))
            np.testing.assert_array_equal(with_aa[batch][0][row],
                                          rand_augment.apply_pillow(uint8_plain[batch][0][row], steps, config.fill))
            draws = eraser.draw(position_rng(folder.seed, g // n, g % n, ERASE_STREAM), 32, 32)
            assert draws[:, 2:4].any()  # re_prob 1: at least one box
            np.testing.assert_array_equal(erased[batch][0][row], eraser.apply(float_plain[batch][0][row], draws))


@independent
def test_repeated_augmentation_shows_each_image_k_times_differently(photos):
    train, _ = data.from_directory(photos, **ARGS, aug_repeats=2, pipeline="pydataset")
    order = plan_pass(train.image_folder.train, train.image_folder.seed, 0, aug_repeats=2)[0]
    labels = np.concatenate([train[i][1] for i in range(2)])
    images = np.concatenate([train[i][0] for i in range(2)])
    np.testing.assert_array_equal(labels, [train.image_folder.train[j][1] for j in order[:8]])
    assert (order[0:8:2] == order[1:8:2]).all()  # an image twice in a row ...
    assert all(np.abs(images[k] - images[k + 1]).max() > 0.1 for k in range(0, 8, 2))  # ... cropped apart


@independent
@pytest.mark.parametrize("pipeline", ["tf.data", "pydataset"])
def test_skip_batches_resumes_the_augmented_stream_exactly(photos, pipeline):
    if pipeline == "tf.data":
        pytest.importorskip("tensorflow")
    args = dict(**ARGS, **ALL, re_mode="rand", image_dtype="uint8", pipeline=pipeline)
    whole, _ = data.from_directory(photos, **args)
    later, _ = data.from_directory(whole.image_folder, **args, skip_batches=2)  # from image 8: pass 0's last

    def batches(ds, count):
        if pipeline == "pydataset":
            return [ds[i] for i in range(count)]
        return [(x.numpy(), y.numpy()) for x, y in ds.take(count)]

    for (x, y), (rx, ry) in zip(batches(whole, 5)[2:], batches(later, 3)):
        np.testing.assert_array_equal(rx, x)
        np.testing.assert_array_equal(ry, y)


@independent
def test_tfds_load_augments_and_resumes_exactly():
    tfds = pytest.importorskip("tensorflow_datasets")

    def take(ds, n):
        return list(ds.take(n).as_numpy_iterator())

    args = dict(data_dir="/nonexistent/tfds", image_dtype="uint8")  # never read: mock_data serves every example
    with tfds.testing.mock_data(num_examples=10):
        stream = take(data.load("cifar10", 32, 4, **args, **ALL)[0], 6)
        tail = take(data.load("cifar10", 32, 4, **args, **ALL, skip_batches=3)[0], 3)
        plain = take(data.load("cifar10", 32, 4, **args)[0], 2)
        repeated = take(data.load("cifar10", 32, 4, **args, aug_repeats=2)[0], 2)
    for (x, y), (rx, ry) in zip(stream[3:], tail):  # batch 3 starts in the second pass (example 12 = 10 + 2)
        np.testing.assert_array_equal(rx, x)
        np.testing.assert_array_equal(ry, y)
    labels = np.concatenate([y for _, y in repeated])
    assert (labels[0::2] == labels[1::2]).all() and len(set(labels)) > 1  # each example twice in a row
    assert np.abs(stream[0][0].astype(int) - plain[0][0]).max() > 10


@independent
@pytest.mark.parametrize("option, value, named", [
    ("auto_augment", "rand-m9-x3", "'x3'"), ("auto_augment", "augmix-m5", "'augmix'"),
    ("re_prob", 1.5, "[0, 1]"), ("re_prob", -0.1, "[0, 1]"), ("re_mode", "noise", "pixel, rand, const"),
    ("re_count", 0, ">= 1"), ("aug_repeats", 0, ">= 1"), ("aug_repeats", 1.5, ">= 1"),
])
def test_bad_options_are_refused_by_name_before_the_folder_is_read(tmp_path, option, value, named):
    with pytest.raises(ValueError, match=f"`{option}`") as caught:
        data.from_directory(tmp_path / "nowhere", 32, 4, **{option: value})  # the option, not the folder
    assert named in str(caught.value) and repr(value) in str(caught.value)


@independent
def test_the_naflex_feed_refuses_the_augmentations_by_name(photos):
    from keras_vit.data import naflex_feed

    plan = naflex_feed.NaFlexPlan(patch_size=8, seq_lens=(16,))
    with pytest.raises(ValueError, match="does not run `re_prob`, `aug_repeats`"):
        naflex_feed.folder_batches(photos, plan, re_prob=0.25, aug_repeats=3)


def _finetune(photos, out, *more, model=("--model", "ViT_Ti16", "--weights", "none")):
    return ["finetune", str(photos), *model, "--image-size", "32", "--validation-split", "0.34", "--out", str(out),
            "--quiet", *more]


@independent
@pytest.mark.parametrize("flags, message", [
    (("--reprob", "1.5"), "--reprob must be a probability in [0, 1]"),
    (("--aug-repeats", "0"), "--aug-repeats must be an integer >= 1"),
    (("--aa", "rand-m9-mstd0.5-inc2"), "--aa 'rand-m9-mstd0.5-inc2' does not parse: RandAugment section 'inc2'"),
    (("--aa", "original"), "got 'original'"),
    (("--remode", "zeros"), "--remode must be one of pixel, rand, const"),
    (("--recount", "0"), "--recount must be an integer >= 1"),
    (("--naflex", "16", "--aa", "rand-m9"), "--naflex 16 cannot be combined with --aa rand-m9"),
])
def test_finetune_refuses_bad_augmentation_flags_by_name_writing_nothing(photos, tmp_path, capsys, flags, message):
    out = tmp_path / "out"
    assert cli.main(_finetune(photos, out, *flags)) == 2
    assert message in capsys.readouterr().err
    assert not out.exists()


@pytest.mark.one_backend  # the flags' plumbing, on conftest's tiny model; the feeds' augmentations are tested above
def test_finetune_trains_with_every_augmentation_flag_and_resumes_exactly(photos, start, tmp_path):
    flags = ["--aa", "rand-m9-mstd0.5-inc1", "--reprob", "0.25", "--remode", "pixel", "--recount", "2",
             "--aug-repeats", "3", "--epochs", "2", "--batch-size", "4", "--pipeline", "pydataset"]
    tiny = ("--weights", start)
    assert cli.main(_finetune(photos, tmp_path / "whole", *flags, model=tiny)) == 0
    recorded = json.loads((tmp_path / "whole" / "run.json").read_text())
    assert (recorded["aa"], recorded["reprob"], recorded["remode"], recorded["recount"], recorded["aug_repeats"]) == (
        "rand-m9-mstd0.5-inc1", 0.25, "pixel", 2, 3)

    class Interrupt(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            raise KeyboardInterrupt  # after the backup of epoch 1

    with pytest.raises(KeyboardInterrupt):
        own_images.run(cli.parser().parse_args(_finetune(photos, tmp_path / "cut", *flags, model=tiny)), [Interrupt()])
    resumed = own_images.run(cli.parser().parse_args(["finetune", str(photos), "--out", str(tmp_path / "cut"),
                                                      "--resume", "--quiet"]))  # the augmentations from run.json
    assert resumed["resumed_from_epoch"] == 1 and resumed["flags"]["aa"] == "rand-m9-mstd0.5-inc1"
    assert_resumed_equals_whole(tmp_path / "whole", tmp_path / "cut", resumed)
