"""The fine-tuning examples on mocked TFDS data with a tiny ViT. A run, its flags and data parallelism are
tested under each KERAS_BACKEND; the output-folder rules, the factories and checkpoints through the recipe
and the killed-and-resumed run, whose backend-specific parts are tested per backend elsewhere, on torch only.

The kill test starts a real training process, kills it with SIGKILL in the
middle of an epoch, starts it again with the same flags and checks that it
ends with the same weights as an uninterrupted run.
"""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import zipfile

import numpy as np
import pytest

tfds = pytest.importorskip("tensorflow_datasets")

from keras_vit.recipes import finetune as _finetune  # noqa: E402

TINY = json.dumps(dict(patch_size=8, hidden_size=16, mlp_dim=32, num_heads=2, num_layers=1))
NOWHERE = "/nonexistent/tfds"


def flags(out, *extra):
    return ["--model", TINY, "--weights", "none", "--image-size", "16", "--batch-size", "8",
            "--device-batch-size", "4", "--steps", "6", "--eval-every", "2", "--warmup-steps", "1",
            "--lr", "0.05", "--data-dir", NOWHERE, "--output-dir", str(out), "--verbose", "0", *extra]


def run(out, *extra, dataset="cifar10", examples=16):
    with tfds.testing.mock_data(num_examples=examples):
        return _finetune.main(dataset, flags(out, *extra))


def weights_in(path):
    """The arrays of a saved .keras file, read without Keras."""
    import h5py

    arrays = {}
    with zipfile.ZipFile(path) as z, z.open("model.weights.h5") as f:
        with h5py.File(f, "r") as h5:
            h5.visititems(lambda name, obj: arrays.__setitem__(name, obj[()])
                          if isinstance(obj, h5py.Dataset) else None)
    return arrays


def test_a_run_writes_model_metrics_and_curves(tmp_path):
    import keras

    import keras_vit  # noqa: F401  (registers the layers for loading)

    out = tmp_path / "run"
    metrics = run(out, "--ema", "--validate", dataset="oxford_iiit_pet")
    assert sorted(os.listdir(out)) == ["curves.png", "metrics.json", "model.keras", "run.json"]
    saved = json.loads((out / "metrics.json").read_text())
    assert saved == json.loads(json.dumps(metrics))
    for key in ("test_accuracy", "test_loss", "steps", "seconds", "images_per_second"):
        assert key in saved
    assert saved["steps"] == 6 and saved["resumed_from_step"] == 0
    assert len(saved["history"]["loss"]) == 3 and len(saved["history"]["val_loss"]) == 3
    assert (out / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    model = keras.saving.load_model(str(out / "model.keras"))
    assert model.output_shape == (None, 37)  # the dataset's classes
    # the reported test figures are the saved model's on the test split, recomputed here
    from keras_vit import data, recipes

    setup = recipes.FINETUNE_SETUPS["oxford_iiit_pet"]
    with tfds.testing.mock_data(num_examples=16):
        _, test = data.load("oxford_iiit_pet", 16, 8, split=(setup.train_split, setup.test_split), data_dir=NOWHERE,
                            image_dtype="uint8")  # what the recipe feeds by default
        batches = [(x.numpy(), y.numpy()) for x, y in test]
    labels = np.concatenate([y for _, y in batches])
    logits = np.concatenate([keras.ops.convert_to_numpy(model(x)) for x, _ in batches]).astype(np.float64)
    logits -= logits.max(-1, keepdims=True)
    log_probs = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    assert saved["test_accuracy"] == pytest.approx(float(np.mean(logits.argmax(-1) == labels)), abs=1e-6)
    assert saved["test_loss"] == pytest.approx(float(-log_probs[np.arange(len(labels)), labels].mean()), rel=1e-4)
    assert not any(name.startswith(".") for name in os.listdir(out))  # no temporary files


@pytest.mark.slow
@pytest.mark.one_backend
def test_factory_models_and_official_checkpoints(tmp_path, capsys):
    # a registered variant through its factory
    metrics = run(tmp_path / "ti16", "--model", "ViT_Ti16", "--image-size", "32", "--steps", "2",
                  "--eval-every", "2")
    assert metrics["flags"]["model"] == "ViT_Ti16" and np.isfinite(metrics["test_loss"])
    # an official-layout .npz loaded at another resolution with a new head
    case = json.loads(open(os.path.join(os.path.dirname(__file__), "data", "official",
                                        "cases.json")).read())["cases"]["vit_tiny_token"]
    config = {k: case[k] for k in ("patch_size", "hidden_size", "mlp_dim", "num_heads", "num_layers")}
    npz = os.path.join(os.path.dirname(__file__), "data", "official", "vit_tiny_token.npz")
    run(tmp_path / "npz", "--model", json.dumps(config), "--weights", npz,
        "--image-size", str(case["resized_image_size"]), "--steps", "2", "--eval-every", "2")
    printed = capsys.readouterr().out
    assert "weights:" in printed  # the loader's notes (resize, new head) are shown


@pytest.mark.backend_independent
def test_output_folder_rules(tmp_path):
    out = tmp_path / "run"
    run(out)
    with pytest.raises(SystemExit, match="holds a finished run"):
        run(out)
    (out / "metrics.json").unlink()
    (out / "stale.txt").write_text("from the first run")
    run(out, "--overwrite")
    assert (out / "metrics.json").exists() and not (out / "stale.txt").exists()

    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("keep me")
    with pytest.raises(SystemExit, match="exists and is not empty"):
        run(foreign)
    with pytest.raises(SystemExit, match="not deleting it"):
        run(foreign, "--overwrite")
    assert (foreign / "notes.txt").read_text() == "keep me"

    interrupted = tmp_path / "interrupted"
    interrupted.mkdir()
    (interrupted / "run.json").write_text(json.dumps(_finetune.run_flags(
        _finetune.parse_args("cifar10", flags(interrupted, "--seed", "5")))))
    with pytest.raises(SystemExit, match=r"other flags.*'seed': \(5, 0\)"):
        run(interrupted)


@pytest.mark.backend_independent
def test_default_weights_are_a_pretrained_release_of_every_variant():
    from keras_vit import VARIANTS
    from keras_vit.weights.registry import get_weights

    for name in VARIANTS:
        tag = _finetune.parse_args("cifar10", ["--model", name]).weights
        assert tag in _finetune.PRETRAINED_TAGS and get_weights(name, tag).classes == 21843, (name, tag)
    assert _finetune.parse_args("cifar10", ["--model", "ViT_Ti16"]).weights == "augreg-imagenet21k"
    assert _finetune.parse_args("cifar10", ["--model", "ViT_B16"]).weights == "imagenet21k"
    assert _finetune.parse_args("cifar10", ["--model", "ViT_B16", "--weights", "none"]).weights is None


def test_bad_flags_are_refused(tmp_path, capsys):
    for extra, message in ((["--batch-size", "8", "--device-batch-size", "3"], "multiple of"),
                           (["--steps", "7"], "multiple of --eval-every"),
                           (["--lr", "-1"], "positive number"), (["--layer-decay", "0"], "positive number"),
                           (["--layer-decay", "1.5"], "must be in (0, 1]")):
        with pytest.raises(SystemExit):
            _finetune.parse_args("cifar10", flags(tmp_path / "x") + extra)
        assert message in capsys.readouterr().err
    args = _finetune.parse_args("cifar10", flags(tmp_path / "x") + ["--layer-decay", "0.75"])
    assert args.layer_decay == 0.75 and _finetune.run_flags(args)["layer_decay"] == 0.75
    with pytest.raises(SystemExit, match="--model: unknown variant 'ViT_X99'"):
        run(tmp_path / "y", "--model", "ViT_X99")
    assert not (tmp_path / "y" / "metrics.json").exists()


LAUNCHER = textwrap.dedent("""
    import os, sys, time
    import keras
    import tensorflow_datasets as tfds
    from keras_vit.recipes import finetune as _finetune

    class PauseAt(keras.callbacks.Callback):
        # stands in for a long training step: the parent kills the process here
        def __init__(self, step):
            super().__init__()
            self.step, self.seen = step, 0

        def on_train_batch_end(self, batch, logs=None):
            self.seen += 1
            if self.seen == self.step:
                open(os.environ["PAUSED_FILE"], "w").close()
                time.sleep(600)

    pause = int(os.environ.get("PAUSE_AT", "0"))
    with tfds.testing.mock_data(num_examples=12):
        _finetune.main("cifar10", sys.argv[1:], callbacks=[PauseAt(pause)] if pause else [])
""")


@pytest.mark.slow
@pytest.mark.one_backend
def test_killed_run_resumes_to_the_same_weights(tmp_path, capsys):
    launcher = tmp_path / "launch.py"
    launcher.write_text(LAUNCHER)
    # 12 examples, device batches of 4: passes over the data and epochs do not
    # line up, so the resumed data stream must start mid-pass.
    extra = ["--steps", "8", "--eval-every", "2", "--ema"]
    env = dict(os.environ, PAUSED_FILE=str(tmp_path / "paused"))

    def start(out, pause):
        return subprocess.Popen([sys.executable, str(launcher), *flags(out, *extra)],
                                env=dict(env, PAUSE_AT=str(pause)), stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)

    # the uninterrupted reference and the resumed run run here: a process of its own (a start of Keras, its backend
    # and TensorFlow) is what the killed run needs; what the resumed one reads is what the killed one left on disk
    run(tmp_path / "straight", *extra, examples=12)

    out = tmp_path / "killed"
    victim = start(out, pause=11)  # micro-step 11 = epoch 3 of 4 (4 steps an epoch), 3rd batch
    deadline = time.time() + 600
    while not (tmp_path / "paused").exists():
        assert victim.poll() is None, victim.communicate()[0]
        assert time.time() < deadline
        time.sleep(0.2)
    victim.send_signal(signal.SIGKILL)
    victim.wait(timeout=60)
    assert victim.returncode == -signal.SIGKILL
    assert (out / "backup" / "latest.weights.h5").exists()
    assert not (out / "metrics.json").exists()

    capsys.readouterr()
    resumed = run(out, *extra, examples=12)
    assert "resuming" in capsys.readouterr().out
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics == json.loads(json.dumps(resumed))
    assert metrics["resumed_from_step"] == 4  # two epochs of 2 updates were backed up
    assert len(metrics["history"]["loss"]) == 4
    reference = json.loads((tmp_path / "straight" / "metrics.json").read_text())
    np.testing.assert_allclose(metrics["history"]["loss"], reference["history"]["loss"], rtol=1e-5)
    assert not (out / "backup").exists()

    a, b = weights_in(tmp_path / "straight" / "model.keras"), weights_in(out / "model.keras")
    assert a.keys() == b.keys() and len(a) > 5
    for name in a:
        np.testing.assert_allclose(a[name], b[name], rtol=1e-5, atol=1e-6, err_msg=name)


def test_distribution_flags_are_refused_before_anything_runs(tmp_path, capsys):
    import keras

    cases = [(["--mesh", "2x4"], "--mesh goes with --distribute model")]
    if keras.backend.backend() == "jax":
        cases.append((["--distribute", "model", "--mesh", "2by4"], "mesh must be 'BxM'"))
    else:
        cases.append((["--distribute", "model"], "--distribute model runs on the jax backend"))
    for extra, message in cases:
        with pytest.raises(SystemExit):
            _finetune.parse_args("cifar10", flags(tmp_path / "x") + extra)
        assert message in capsys.readouterr().err
    if keras.backend.backend() == "torch":  # a bare --distribute means data parallel: torchrun's job there
        with pytest.raises(SystemExit):
            _finetune.parse_args("cifar10", flags(tmp_path / "x") + ["--distribute"])
        assert "--distribute data covers the jax and tensorflow backends" in capsys.readouterr().err
    else:
        assert _finetune.parse_args("cifar10", flags(tmp_path / "x") + ["--distribute"]).distribute == "data"
    assert not (tmp_path / "x").exists()


def test_a_data_parallel_run_trains_as_the_plain_run(tmp_path):
    """`--distribute data` end to end on this machine's one device: the same steps as without it."""
    import keras

    if keras.backend.backend() == "torch":
        pytest.skip("data parallel on torch is torchrun's job: the example refuses it (tested above)")
    plain = run(tmp_path / "plain")
    parallel = run(tmp_path / "parallel", "--distribute", "data")
    assert parallel["steps"] == plain["steps"] == 6
    assert parallel["test_loss"] == pytest.approx(plain["test_loss"], rel=1e-4)
