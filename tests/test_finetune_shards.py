"""`keras-vit finetune 'shards/train-{000000..000002}.tar' --validation-shards ...` (keras_vit.recipes.own_shards):
tar shards trained on as a folder is, resumed exactly, with timm's augmentations and MixUp on both shard
pipelines, on 2 processes to the one-process model, and what shards cannot take refused by flag name before
--out is written."""

import json
import os

import keras
import numpy as np
import pytest
from conftest import TINY, assert_resumed_equals_whole, photo_folder
from test_finetune_multiprocess import run_against_one, same_model, several

from keras_vit import cli
from keras_vit.data import rand_augment
from keras_vit.data import shards as S
from keras_vit.data.augment import Augment
from keras_vit.data.folder import scan
from keras_vit.data.preprocess import resize_bilinear
from keras_vit.data.shard_feed import ShardPlan, from_shards, raw_examples
from keras_vit.data.shard_writer import write_shards
from keras_vit.data.stream import RAND_AUGMENT_STREAM, position_rng
from keras_vit.recipes import folder_plan, own_images

independent = pytest.mark.backend_independent  # numpy, Pillow and tf.data: the same on every backend
AUGMENT = dict(auto_augment="rand-m9-mstd0.5-inc1", re_prob=0.5, re_count=2)
FEED = dict(image_size=32, batch_size=4, shuffle_buffer=6)
FLAGS = ["--aa", "rand-m9-mstd0.5-inc1", "--reprob", "0.25", "--mixup", "0.8", "--cutmix", "1.0"]


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """A folder of 18 photographs split 9 / 9 (its scan) and its two parts as shards of 4: (folder, train, val)."""
    tmp = tmp_path_factory.mktemp("shards")
    folder = scan(photo_folder(tmp / "photos", per_class=6), validation_split=0.34, seed=0)
    return (folder, write_shards(folder, str(tmp / "shards" / "train-%06d.tar"), shard_size=4),
            write_shards(folder, str(tmp / "shards" / "val-%06d.tar"), shard_size=4, part="validation"))


def _argv(written, start, out, *more):
    return ["finetune", written[1], "--validation-shards", written[2], "--weights", start, "--image-size", "32",
            "--epochs", "2", "--lr", "0.05", "--out", str(out), "--quiet", *FLAGS, *more]


@pytest.fixture(scope="module")
def whole(written, start, tmp_path_factory):
    """The folder of an uninterrupted run on the shards, with RandAugment, random erasing, MixUp and CutMix."""
    out = tmp_path_factory.mktemp("runs") / "whole"
    assert cli.main(_argv(written, start, out)) == 0
    return out


@pytest.mark.one_backend  # the command's plumbing; the shard feeds are tested per pipeline below
def test_finetune_on_shards_writes_the_model_and_report_as_a_folder_run_does(written, whole):
    folder = written[0]
    assert {"model.keras", "curves.png", "confusion_matrix.png", "mistakes.png", "per_class.csv", "split.json",
            "report.json", "run.json"} == set(os.listdir(whole))
    report = json.loads((whole / "report.json").read_text())
    assert report["class_names"] == list(folder.class_names)
    assert {k: tuple(v.values()) for k, v in report["images"].items()} == folder.counts()  # from the info files
    assert (report["schedule"]["batch_size"], report["schedule"]["updates_per_epoch"]) == folder_plan.schedule(
        len(folder.train), epochs=2)[:2]
    model = keras.saving.load_model(whole / "model.keras")
    assert model.class_names == folder.class_names
    # the report's accuracy is the saved model's on the validation shards' images, recomputed here from the shards
    val = S.open_shards(written[2])
    samples = [s for path in val.paths for s in S.samples(path, val.class_names)]
    images = np.stack([np.round(resize_bilinear(S.decode(data, kind), (32, 32))).astype("uint8")
                       for _, data, kind, _ in samples])
    truth = np.asarray([label for *_, label in samples])
    probs = model.predict(images, verbose=0)
    assert report["validation_accuracy"] == pytest.approx(float((probs.argmax(-1) == truth).mean()))
    assert report["flags"]["validation_shards"] == os.path.abspath(written[2])


@pytest.mark.one_backend
def test_an_interrupted_shard_run_resumes_to_the_weights_of_an_uninterrupted_one(written, start, whole, tmp_path):
    class Interrupt(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            raise KeyboardInterrupt  # after the backup of epoch 1

    with pytest.raises(KeyboardInterrupt):
        own_images.run(cli.parser().parse_args(_argv(written, start, tmp_path / "cut")), [Interrupt()])
    assert not (tmp_path / "cut" / "report.json").exists()
    resumed = own_images.run(cli.parser().parse_args(  # the pattern again; every other flag from run.json
        ["finetune", written[1], "--out", str(tmp_path / "cut"), "--resume", "--quiet"]))
    assert resumed["resumed_from_epoch"] == 1 and resumed["flags"]["aa"] == "rand-m9-mstd0.5-inc1"
    assert_resumed_equals_whole(whole, tmp_path / "cut", resumed)


def _level(image_dtype):
    """One level of 255 in the images' scale."""
    return 1 if image_dtype == "uint8" else 1 / 127.5 + 1e-6


@independent
@pytest.mark.parametrize("image_dtype", ["float32", "uint8"])
def test_tf_data_and_the_pydataset_give_the_same_augmented_shard_batches(written, image_dtype):
    pytest.importorskip("tensorflow")
    on_tf = from_shards(written[1], **FEED, **AUGMENT, image_dtype=image_dtype, pipeline="tf.data")
    on_py = from_shards(written[1], **FEED, **AUGMENT, image_dtype=image_dtype, pipeline="pydataset", workers=2)
    plain = from_shards(written[1], **FEED, image_dtype=image_dtype, pipeline="pydataset")
    later = {p: from_shards(written[1], **FEED, **AUGMENT, image_dtype=image_dtype, pipeline=p, skip_batches=3)
             for p in ("tf.data", "pydataset")}
    stream, resumed, off = iter(on_tf), iter(later["tf.data"]), []
    for i in range(6):  # 24 images: two passes over the 9 training samples and a bit of a third
        images, labels = (a.numpy() for a in next(stream))
        theirs, their_labels = on_py[i]
        np.testing.assert_array_equal(labels, their_labels)
        assert images.dtype == theirs.dtype and theirs.shape == (4, 32, 32, 3)
        off.append(np.abs(images.astype(np.float64) - theirs) / _level(image_dtype))
        assert np.abs(theirs.astype(np.float64) - plain[i][0]).max() > 10 * _level(image_dtype)  # augmented
        if i >= 3:  # skip_batches resumes each pipeline exactly
            np.testing.assert_array_equal(next(resumed)[0].numpy(), images)
            np.testing.assert_array_equal(later["pydataset"][i - 3][0], theirs)
    off = np.concatenate(off)  # one level, as the folder feed's (two resizers; RandAugment scales a few)
    assert np.median(off) == 0 and (off > 1).mean() < 1e-3


@independent
def test_randaugment_on_shards_draws_from_the_samples_pass_and_number(written):
    """Each sample's RandAugment is drawn from position_rng(seed, pass, sample number, its stream), on the
    uint8 crop after resize and flip: as the folder feed draws from a position."""
    aa = AUGMENT["auto_augment"]
    with_aa = from_shards(written[1], **FEED, auto_augment=aa, image_dtype="uint8", pipeline="pydataset", seed=3)
    plain = from_shards(written[1], **FEED, image_dtype="uint8", pipeline="pydataset", seed=3)
    config = Augment(aa).rand_augment
    examples = raw_examples(ShardPlan(S.open_shards(written[1]), 3, 6, True, 4))
    for batch in range(3):  # into the second pass
        for row in range(4):
            *_, pass_index, sample = next(examples)
            steps = rand_augment.draw(config, position_rng(3, pass_index, sample, RAND_AUGMENT_STREAM))
            np.testing.assert_array_equal(with_aa[batch][0][row],
                                          rand_augment.apply_pillow(plain[batch][0][row], steps, config.fill))


def test_the_augmented_and_mixed_shard_feed_trains_on_this_backend(written):
    """The PyDataset of shards, augmented and mixed (keras_vit.data.mixup), through this backend's `fit`."""
    from keras_vit import VisionTransformer, recipes
    from keras_vit.data.mixup import MixUp, mixed_feeds

    train = from_shards(written[1], **FEED, **AUGMENT, image_dtype="uint8", pipeline="pydataset", workers=2)
    val = from_shards(written[2], **{**FEED, "shuffle_buffer": 1}, image_dtype="uint8", pipeline="pydataset",
                      training=False, repeat=False, drop_remainder=False)
    mix = MixUp(num_classes=3, seed=0)
    train, val = mixed_feeds(train, val, mix)
    model = VisionTransformer(**{**TINY, "classes": 3}, input_dtype="uint8")
    recipes.compile_for_finetuning(model, total_steps=4, warmup_steps=0, batch_size=4, sparse_labels=False)
    history = model.fit(train, steps_per_epoch=2, epochs=2, validation_data=val, verbose=0)
    assert np.isfinite(history.history["loss"]).all() and len(history.history["val_loss"]) == 2


@independent
def test_from_shards_refuses_repeats_and_an_augmented_evaluation_stream(written):
    with pytest.raises(ValueError, match=r"`aug_repeats` 3: a stream of tar shards reads each sample once a pass"):
        from_shards(written[1], **FEED, aug_repeats=3)
    with pytest.raises(ValueError, match=r"`re_prob` augment a training stream; an evaluation stream"):
        from_shards(written[2], **FEED, training=False, re_prob=0.5)


def _verify_other():
    """The --verify level that is not finetune's default."""
    parser = cli.parser()
    default = parser.parse_args(["finetune", "x"]).verify
    return next(level for level in ("full", "header") if level != default)


@independent
def test_what_shards_cannot_take_is_refused_by_name_writing_nothing(written, start, tmp_path, capsys):
    folder = written[0]
    other = write_shards(folder, str(tmp_path / "other" / "val-%06d.tar"), shard_size=9, part="validation")
    info = tmp_path / "other" / "val-info.json"
    recorded = json.loads(info.read_text())
    info.write_text(json.dumps({**recorded, "class_names": ["a", "b", "c"]}))  # another class set
    base = ["finetune", written[1], "--weights", start, "--image-size", "32", "--quiet"]
    refusals = {
        (): "give the held-out ones with --validation-shards PATTERN",
        ("--validation-shards", written[2], "--validation-split", "0.2"): "--validation-split 0.2: DIR",
        ("--validation-shards", written[2], "--labels-csv", "x.csv"): "--labels-csv x.csv: DIR",
        ("--validation-shards", written[2], "--strict"): "--strict: DIR",
        ("--validation-shards", written[2], "--verify", _verify_other()): f"--verify {_verify_other()}: DIR",
        ("--validation-shards", written[2], "--naflex", "16"): "the shard feed gives square images",
        ("--validation-shards", written[2], "--aug-repeats", "3"): "--aug-repeats 3: a stream of tar shards",
        ("--validation-shards", other): "--validation-shards",
    }
    for flags, message in refusals.items():
        out = tmp_path / "out"
        assert cli.main([*base, *flags, "--out", str(out)]) == 2, flags
        err = capsys.readouterr().err
        assert message in err, (flags, err)
        assert not out.exists(), flags
    assert "hold 3 classes (a, b, c), the training shards 3 (astronaut, cat, coffee)" in err
    missing = written[1].replace("000002}", "000009}")  # a brace range past the last shard
    assert cli.main(["finetune", missing, "--validation-shards", written[2], "--out", str(tmp_path / "out")]) == 2
    assert "7 shard(s) of" in capsys.readouterr().err and not (tmp_path / "out").exists()
    folder_run = ["finetune", folder.root, "--validation-shards", written[2], "--out", str(tmp_path / "out")]
    assert cli.main(folder_run) == 2
    assert "goes with a shard pattern DIR" in capsys.readouterr().err and not (tmp_path / "out").exists()


@independent
def test_per_process_rows_gives_each_process_its_rows_of_the_one_process_batches(written):
    """per_process="rows" (what finetune on several processes asks): with as many shards as processes, each
    process still reads every shard and keeps its rows of the batches of one process (augmented as there); the
    default then gives each process its own shards instead."""
    assert len(S.shard_paths(written[1])) == 3
    feed = dict(**FEED, **AUGMENT, image_dtype="uint8", pipeline="pydataset")
    one = from_shards(written[1], **feed)
    rows = [from_shards(written[1], **feed, process_index=i, process_count=2, per_process="rows") for i in range(2)]
    own = from_shards(written[1], **feed, process_index=0, process_count=2)
    for batch in range(4):  # into the second pass
        images, labels = one[batch]
        np.testing.assert_array_equal(np.concatenate([r[batch][0] for r in rows]), images)
        np.testing.assert_array_equal(np.concatenate([r[batch][1] for r in rows]), labels)
    assert not all(np.array_equal(own[b][0], one[b][0][:2]) for b in range(4))
    with pytest.raises(ValueError, match=r"`per_process` must be one of \('shards', 'rows'\); got 'files'"):
        from_shards(written[1], **FEED, per_process="files")


@several
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_two_processes_train_on_shards_to_the_one_process_model(start, tmp_path):
    """`keras-vit finetune SHARDS ...` on 2 processes (`mpiexec -n 2` on JAX, `python -m keras_vit.launch -n 2
    --cpu-devices 1 --` on TensorFlow; 3 training shards, so that each process could read its own) with RandAugment and random erasing: process 0 alone reads the shards'
    info, says the schedule and writes --out; each process trains its rows of the one-process run's batches,
    which the same command on one process (in the test's process) ends with."""
    folder = scan(photo_folder(tmp_path / "photos", per_class=3, size=(40, 48)), validation_split=0.2, seed=0)
    train = write_shards(folder, str(tmp_path / "shards" / "train-%06d.tar"), shard_size=2)
    held_out = write_shards(folder, str(tmp_path / "shards" / "val-%06d.tar"), shard_size=2, part="validation")
    assert len(S.shard_paths(train)) == 3 and len(folder.validation) == 3

    def args(out):
        return [train, "--validation-shards", held_out, "--weights", start, "--image-size", "32", "--steps", "2",
                "--lr", "0.05", *FLAGS[:4], "--quiet", "--out", str(out)]

    lines = run_against_one(args, tmp_path)
    said = [line for _, line in lines.lines if "[Gloo]" not in line]
    for opening in ("reading ", "batch 8 (1 x 8 on the devices of 2 processes), 2 epochs of 1 updates"):
        assert [line[:4] for line in said if line.partition(" ")[2].startswith(opening)] == ["[0] "], lines.text()
    assert not [line for line in said if line.startswith(("[1] reading", "[1] batch", "[1] validation"))]
    assert said[-1].endswith(f"wrote {tmp_path / 'two'}") and not (tmp_path / "two.lock").exists()
    assert sorted(os.listdir(tmp_path / "two")) == sorted(os.listdir(tmp_path / "one"))
    same_model(tmp_path / "two", tmp_path / "one", weights_at_least=10)  # a TINY model
