"""`keras-vit finetune DIR`: a folder of photographs to a fine-tuned, served model (keras_vit.recipes.own_images)."""

import csv
import io
import json
import os
import zipfile

import h5py
import keras
import numpy as np
import pytest
from conftest import assert_resumed_equals_whole, photo_folder

from keras_vit import cli
from keras_vit.data.folder import read_image
from keras_vit.data.preprocess import resize_bilinear
from keras_vit.recipes import folder_plan, own_images


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    return photo_folder(tmp_path_factory.mktemp("photos"), per_class=6)


def _argv(photos, start, out, *more):
    return ["finetune", str(photos), "--weights", start, "--image-size", "32", "--epochs", "2", "--lr", "0.05",
            "--validation-split", "0.34", "--out", str(out), "--quiet", *more]


def _run(argv, callbacks=()):
    return own_images.run(cli.parser().parse_args(argv), callbacks)


@pytest.fixture(scope="module")
def whole(photos, start, tmp_path_factory):
    """The folder of an uninterrupted run of the command, as a user types it."""
    out = tmp_path_factory.mktemp("runs") / "whole"
    assert cli.main(_argv(photos, start, out, "--export", "onnx")) == 0
    return out


def test_finetune_writes_a_model_with_the_users_classes_and_its_report(photos, whole, capsys):
    out = whole
    assert {"model.keras", "curves.png", "confusion_matrix.png", "mistakes.png", "per_class.csv", "split.json",
            "report.json", "run.json", "export"} == set(os.listdir(out))  # the backup is gone once the run is done
    report = json.loads((out / "report.json").read_text())
    assert report["class_names"] == ["astronaut", "cat", "coffee"] and report["schedule"]["batch_size"] == 8
    assert report["images"]["cat"] == {"train": 3, "validation": 3}
    model = keras.saving.load_model(out / "model.keras")
    assert model.class_names == ("astronaut", "cat", "coffee")
    # the report's accuracy is the saved model's on the validation files, recomputed here from the files
    split = json.loads((out / "split.json").read_text())["validation"]
    images = np.stack([np.round(resize_bilinear(read_image(photos / p), (32, 32))).astype("uint8") for p, _ in split])
    probs = model.predict(images, verbose=0)
    np.testing.assert_allclose(probs.sum(-1), 1, atol=1e-5)
    truth = np.array([model.class_names.index(c) for _, c in split])
    assert report["validation_accuracy"] == pytest.approx(float((probs.argmax(-1) == truth).mean()))
    with open(out / "per_class.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [r["class"] for r in rows] == list(model.class_names)
    scores = report["history"]["val_accuracy"]
    assert report["best_epoch"] == max(i for i, s in enumerate(scores, 1) if s == max(scores))
    # the served artefact: uint8 images in, the same probabilities out, the class names beside it
    import onnxruntime

    assert (out / "export" / "class_names.txt").read_text().split("\n")[:3] == list(model.class_names)
    session = onnxruntime.InferenceSession(report["export"])
    served = session.run(None, {session.get_inputs()[0].name: images})[0]
    np.testing.assert_allclose(served, probs, atol=1e-5)
    capsys.readouterr()
    assert cli.main(["predict", "--weights", str(out / "model.keras"), str(photos / split[0][0])]) == 0
    printed = capsys.readouterr().out
    assert model.class_names[int(probs[0].argmax())] in printed and "class 0" not in printed


# what run.json recorded at ffa2530, the last release's main
FLAGS_OF_0_1_0 = ("directory", "model", "weights", "image_size", "epochs", "steps", "batch_size", "device_batch_size",
                  "lr", "lora", "layer_decay", "validation_split", "labels_csv", "seed", "strict", "pipeline", "naflex")


@pytest.mark.one_backend
def test_an_interrupted_run_resumes_to_the_weights_of_an_uninterrupted_one(photos, start, whole, tmp_path):
    class Interrupt(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            raise KeyboardInterrupt  # after the backup of epoch 1

    with pytest.raises(KeyboardInterrupt):
        _run(_argv(photos, start, tmp_path / "cut"), [Interrupt()])
    assert not (tmp_path / "cut" / "report.json").exists()
    with pytest.raises(FileExistsError, match="pass --resume to continue it"):
        _run(_argv(photos, start, tmp_path / "cut"))
    with pytest.raises(ValueError, match=r"with other flags \(was -> now: .*'lr': \(0.05, 0.1\)"):
        _run([*_argv(photos, start, tmp_path / "cut"), "--resume", "--lr", "0.1"])
    # as a run begun by an older keras-vit records it, without the flags added since: they read as their defaults
    marker = tmp_path / "cut" / own_images.MARKER
    recorded = json.loads(marker.read_text())
    marker.write_text(json.dumps({k: recorded[k] for k in FLAGS_OF_0_1_0}))
    resumed = _run(["finetune", str(photos), "--out", str(tmp_path / "cut"), "--resume", "--quiet"])  # its flags
    assert resumed["resumed_from_epoch"] == 1
    assert_resumed_equals_whole(whole, tmp_path / "cut", resumed)


@pytest.mark.one_backend  # the handling of SIGINT; the command's as a terminal sends it is in test_cli_subprocess.py
def test_a_ctrl_c_that_a_library_replaces_with_its_error_still_ends_finetune_as_ctrl_c(photos, start, tmp_path,
                                                                                       monkeypatch, capsys):
    """numpy, falling back from an `__array__` without `copy` (torch's tensors'), checks for signals in its str()
    of the TypeError, and where Ctrl-C lands there it puts the TypeError back in the KeyboardInterrupt's place:
    pressed while the backup was written, `keras-vit finetune` once ended in that TypeError's traceback, exit
    status 1. An error raised after a press is the press's: the one line, the resume it advises, 130."""
    import signal

    from keras_vit.recipes.callbacks import TrainingBackup

    def pressed_then_replaced(self, epoch, logs=None):
        try:
            signal.raise_signal(signal.SIGINT)  # the handler runs at once
        except KeyboardInterrupt:
            pass  # dropped, as numpy drops it
        raise TypeError("Tensor.__array__() got an unexpected keyword argument 'copy'")

    monkeypatch.setattr(TrainingBackup, "on_epoch_end", pressed_then_replaced)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)  # a terminal's; CI's lanes ignore SIGINT
    try:
        assert cli.main(_argv(photos, start, tmp_path / "cut")) == 130
    finally:
        signal.signal(signal.SIGINT, previous)
    assert capsys.readouterr().err.strip().splitlines() == [
        "keras-vit finetune: interrupted: the same command with --resume continues from the last epoch's backup "
        f"in {tmp_path / 'cut'}"]


@pytest.mark.one_backend  # the command's line; NonFiniteLossStop itself is tested per backend in test_recipes.py
def test_a_loss_gone_infinite_ends_finetune_in_one_line_naming_lr(photos, start, tmp_path, monkeypatch, capsys):
    from keras_vit import recipes

    def non_finite(self, batch, logs=None):
        raise recipes.NonFiniteLossError("the training loss is nan at step 1")

    monkeypatch.setattr(recipes.NonFiniteLossStop, "on_train_batch_end", non_finite)
    assert cli.main(_argv(photos, start, tmp_path / "run")) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "keras-vit finetune: error: the training loss is nan at step 1 (--lr 0.05: a lower --lr, then --resume or "
        "--overwrite)"]


@pytest.mark.one_backend  # the command's plumbing; LoRA's resume is tested per backend in test_lora.py
def test_lora_trains_the_adapters_and_writes_a_merged_model(photos, start, tmp_path):
    out = tmp_path / "lora"
    # 4 epochs at a high rate: the adapters' B (zeros) and the head (zeros) start still, so that 2 epochs at 0.05
    # moved the merged kernels by ~1e-7, float rounding; these move them by ~5e-5
    report = _run(_argv(photos, start, out, "--lora", "2", "--epochs", "4", "--lr", "0.5"))
    model = keras.saving.load_model(out / "model.keras")
    assert not any(getattr(layer, "lora_enabled", False) for layer in model._flatten_layers())
    original = keras.saving.load_model(start)
    frozen = {v.path: keras.ops.convert_to_numpy(v) for v in original.weights if "head" not in v.path}
    moved = {p: float(np.abs(keras.ops.convert_to_numpy(next(w for w in model.weights if w.path == p)) - v).max())
             for p, v in frozen.items() if "query" in p and "kernel" in p}
    assert len(moved) == 2 and min(moved.values()) > 1e-5, moved  # the merged adapters moved every query kernel
    with zipfile.ZipFile(out / "model.keras") as archive, archive.open("model.weights.h5") as f:
        assert "optimizer" not in h5py.File(io.BytesIO(f.read()), "r")  # the served file holds no training state
    assert 0 <= report["validation_accuracy"] <= 1


@pytest.mark.backend_independent
def test_schedule_rule():
    assert folder_plan.schedule(40) == (8, 5, 10, 3)  # a quarter of 40 is 10: batch 8, 10 epochs of 5 updates
    assert folder_plan.schedule(10_000) == (512, 20, 10, 10)  # the paper's batch
    assert folder_plan.schedule(1000, steps=45) == (128, 8, 6, 3)  # 45 updates: 6 epochs of 8 (48)
    assert folder_plan.schedule(100, batch_size=32, epochs=2) == (32, 4, 2, 1)


@pytest.mark.backend_independent
def test_refusals_write_nothing(photos, start, tmp_path, capsys):
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("a user's file")
    assert cli.main(_argv(photos, start, foreign)) == 2
    assert "holds no run of ours (run.json); not deleting it" in capsys.readouterr().err
    assert os.listdir(foreign) == ["notes.txt"]
    assert cli.main(_argv(photos, start, foreign, "--overwrite")) == 2
    assert (foreign / "notes.txt").read_text() == "a user's file"
    (tmp_path / "empty").mkdir()
    assert cli.main(_argv(tmp_path / "empty", start, tmp_path / "out")) == 2
    assert "holds no class folders" in capsys.readouterr().err and not (tmp_path / "out").exists()
    assert cli.main(["finetune", str(photos), "--weights", start, "--model", "ViT_B16", "--out", str(tmp_path)]) == 2
    assert "is a whole model; --model ViT_B16 is not used with it" in capsys.readouterr().err
    assert cli.main(_argv(photos, start, tmp_path / "out", "--resume")) == 2
    assert "holds no run to resume" in capsys.readouterr().err and not (tmp_path / "out").exists()


def _tree(root):
    """{relative path: bytes} of every file under `root` (None when it does not exist)."""
    if not os.path.exists(root):
        return None
    return {os.path.relpath(os.path.join(d, f), root): open(os.path.join(d, f), "rb").read()
            for d, _, files in os.walk(root) for f in files}


REFUSALS = {  # flags -> what the message says
    ("--validation-split", "1.5"): "--validation-split must be in (0, 1)",
    ("--layer-decay", "2"): "--layer-decay must be in (0, 1]",
    ("--naflex", "4", "--lora", "2"): "--naflex 4 cannot be combined with --lora",
    ("--naflex", "4", "--export", "onnx"): "--naflex 4 cannot be combined with --export",
    ("--batch-size", "8", "--device-batch-size", "3"): "must be a multiple of `device_batch_size` (3)",
    ("--batch-size", "8", "--device-batch-size", "16"): "`device_batch_size` (16) must not exceed",
    ("--image-size", "48"): "finetune continues a model that takes uint8 images of --image-size 48",
    ("--drop-path", "1.5"): "--drop-path must be in [0, 1), got 1.5",
    ("--drop-path", "0.1"): "--drop-path: --weights",  # a .keras model keeps its own rate
    ("--mixup", "-1"): "--mixup must be >= 0 (0: off), got -1.0",
    ("--cutmix", "-0.5"): "--cutmix must be >= 0 (0: off), got -0.5",
    ("--mixup", "0.8", "--mixup-switch-prob", "2"): "--mixup-switch-prob must be in [0, 1], got 2.0",
    ("--smoothing", "1"): "--smoothing must be in [0, 1), got 1.0",
    ("--naflex", "4", "--cutmix", "1"): "--naflex 4 cannot be combined with --mixup or --cutmix",
}


@pytest.mark.backend_independent
@pytest.mark.parametrize("held", ["absent", "a run"])
def test_each_refusal_leaves_out_as_it_was(photos, start, tmp_path, capsys, held):
    out = tmp_path / "out"
    if held == "a run":  # an interrupted run's marker, split and backup: refusals keep every byte, --overwrite too
        out.mkdir()
        (out / own_images.MARKER).write_text(json.dumps({"seed": 0}))
        (out / own_images.BACKUP).mkdir()
        (out / own_images.BACKUP / "latest.weights.h5").write_bytes(b"the run's backup")
    before = _tree(out)
    for flags, message in REFUSALS.items():
        for more in (("--overwrite",), ("--resume",)) if held == "a run" else ((),):
            assert cli.main(_argv(photos, start, out, *flags, *more)) == 2, (flags, more)
            err = capsys.readouterr().err
            assert message in err or more == ("--resume",) and "with other flags" in err, (flags, more, err)
            assert _tree(out) == before, (flags, more)
    if held == "a run":
        assert cli.main(_argv(photos, start, out)) == 2
        assert "holds a run; pass --resume to continue it" in capsys.readouterr().err
        (out / own_images.REPORT).write_text("{}")
        assert cli.main(_argv(photos, start, out, "--resume")) == 2
        assert "holds a finished run (report.json is there)" in capsys.readouterr().err
    else:
        assert cli.main(_argv(photos, start, out, "--resume")) == 2
        assert "holds no run to resume" in capsys.readouterr().err
    assert _tree(out) == ({**before, own_images.REPORT: b"{}"} if held == "a run" else None)


@pytest.mark.backend_independent
def test_weights_of_another_architecture_than_model_are_refused_naming_both(photos, tmp_path, capsys):
    transformers = pytest.importorskip("transformers")
    config = transformers.ViTConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                                    image_size=32, patch_size=8)
    transformers.ViTModel(config, add_pooling_layer=False).save_pretrained(tmp_path / "tiny_vit")
    out = tmp_path / "out"
    argv = ["finetune", str(photos), "--weights", str(tmp_path / "tiny_vit"), "--model", "ViT_S16", "--out", str(out)]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert "tiny_vit holds a ViT (patch_size 8, hidden_size 32" in err and "not ViT_S16 (patch_size 16" in err
    assert not out.exists()


@pytest.mark.one_backend
def test_a_full_disk_is_refused_in_one_line_and_the_last_backup_resumes(photos, start, small_disk, capsys):
    out = small_disk / "run"
    (small_disk / "filler").write_bytes(b"\0" * (8 * 2**20 - 64 * 1024))  # full before the run
    assert cli.main(_argv(photos, start, out)) == 1
    err = capsys.readouterr().err
    assert f"no space left for the run in {out}: it needs about" in err and f"free on the filesystem at {small_disk}" in err
    assert not out.exists() and os.listdir(small_disk) == ["filler"]  # refused before anything was written
    (small_disk / "filler").unlink()

    class FillTheDisk(keras.callbacks.Callback):  # after epoch 1's backup, the disk fills up
        def on_epoch_end(self, epoch, logs=None):
            free = os.statvfs(small_disk).f_bavail * os.statvfs(small_disk).f_frsize
            (small_disk / "filler").write_bytes(b"\0" * (free - 32 * 1024))

    with pytest.raises(OSError, match=r"no space left for the (training backup|best epoch's weights)") as failed:
        _run(_argv(photos, start, out), [FillTheDisk()])
    assert failed.value.errno == 28
    assert sorted(os.listdir(out / "backup")) == ["best.weights.h5", "history.json", "latest.weights.h5"]
    (small_disk / "filler").unlink()
    resumed = _run(["finetune", str(photos), "--out", str(out), "--resume", "--quiet"])
    assert resumed["resumed_from_epoch"] == 1 and (out / "model.keras").exists()


@pytest.mark.one_backend  # the flags' plumbing; drop path and MixUp are tested per backend and against timm
def test_deits_regularisers_by_timms_flags(photos, tmp_path):
    from keras_vit.layers import TransformerBlock

    out = tmp_path / "deit"
    argv = ["finetune", str(photos), "--model", "ViT_Ti16", "--weights", "none", "--image-size", "32", "--steps", "2",
            "--batch-size", "8", "--validation-split", "0.34", "--drop-path", "0.1", "--mixup", "0.8", "--cutmix", "1.0",
            "--smoothing", "0.1", "--pipeline", "pydataset", "--out", str(out), "--quiet"]
    assert cli.main(argv) == 0
    flags = json.loads((out / "run.json").read_text())
    assert (flags["drop_path"], flags["mixup"], flags["cutmix"], flags["smoothing"]) == (0.1, 0.8, 1.0, 0.1)
    model = keras.saving.load_model(out / "model.keras", safe_mode=True)
    rates = [layer.drop_path_rate for layer in model.layers if isinstance(layer, TransformerBlock)]
    np.testing.assert_allclose(rates, np.linspace(0, 0.1, 12), atol=1e-7)  # timm's linear rule over ViT-Ti's 12
    report = json.loads((out / "report.json").read_text())
    assert np.isfinite(report["history"]["loss"]).all() and 0 <= report["validation_accuracy"] <= 1
