"""The offline demo (examples/demo.py) end to end, in --quick mode, on the current backend. The demo's and
examples/lora_digits.py's `main` run in this process: their own processes would only import what this one has
(a start of Keras and its backend: seconds of CPU), and what is checked is their outputs, not the interpreter."""

import contextlib
import importlib.util
import io
import json
import pathlib
import sys

import numpy as np
import pytest

from conftest import backend

ROOT = pathlib.Path(__file__).resolve().parents[1]
DEMO = ROOT / "examples" / "demo.py"


def _load_demo_module(path=DEMO, name="keras_vit_demo"):
    if str(DEMO.parent) not in sys.path:  # as `python examples/demo.py` has it: its helpers beside it
        sys.path.insert(0, str(DEMO.parent))
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    """One --quick run of the demo in a fresh folder, shared by the tests below: (its folder, what it printed)."""
    out = tmp_path_factory.mktemp("demo") / "run"
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        _load_demo_module().main(["--quick", "--verbose", "2", "--out", str(out)])
    return out, printed.getvalue()


@pytest.mark.slow
def test_quick_demo_writes_metrics(quick_run):
    out, printed = quick_run
    metrics = json.loads((out / "metrics.json").read_text())
    for key in ("test_accuracy", "few_shot_accuracy"):
        assert isinstance(metrics[key], float) and 0.0 <= metrics[key] <= 1.0, (key, metrics[key])
    for value in metrics["few_shot"].values():
        assert 0.0 <= value <= 1.0
    assert metrics["few_shot_accuracy"] == metrics["few_shot"][str(metrics["few_shot_shots"])]
    assert metrics["backend"] == backend()
    timings = metrics["timings"]
    assert timings["total_s"] > 0 and timings["pretrain_s"] > 0 and timings["finetune_s"] > 0
    # the checkpoint was transferred as the paper does it (3.2): grid resized, new zero head
    transfer = " ".join(metrics["finetune"]["transfer"])
    assert "4x4 to a 8x8" in transfer and "zero-initialised head" in transfer
    # one history entry per epoch, train and test
    curves = metrics["curves"]["finetune"]
    assert len(curves["loss"]) == len(curves["val_accuracy"]) == metrics["finetune"]["epochs"]
    assert f"{metrics['test_accuracy']:.4f}" in printed
    # no staging folder left behind next to the output
    assert not [p for p in out.parent.iterdir() if ".partial-" in p.name or ".old-" in p.name]


@pytest.mark.slow
def test_quick_demo_model_reloads_in_safe_mode(quick_run):
    import keras

    import keras_vit  # noqa: F401  (registers the layers for deserialisation)

    out, _ = quick_run
    model = keras.saving.load_model(out / "model.keras", safe_mode=True)
    sample = np.load(out / "sample_predictions.npz", allow_pickle=False)
    logits = keras.ops.convert_to_numpy(model.predict(sample["images"], verbose=0))
    np.testing.assert_allclose(logits, sample["logits"], rtol=1e-4, atol=1e-5)
    assert logits.shape == (len(sample["labels"]), 5)
    assert sample["images"].shape[1:] == (32, 32, 3)
    assert -1.0 <= sample["images"].min() and sample["images"].max() <= 1.0


@pytest.mark.slow
def test_quick_demo_checkpoint_and_pngs(quick_run):
    import keras

    from keras_vit import load_weights

    out, _ = quick_run
    pngs = [out / "curves.png", out / "attention" / "attention_rollout.png"]
    for png in pngs:
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", png
        assert png.stat().st_size > 5_000, png
    # the official-layout checkpoint loads at the pre-training resolution and reproduces the
    # Keras checkpoint written beside it
    metrics = json.loads((out / "metrics.json").read_text())
    config = metrics["model"]
    demo = _load_demo_module()
    a = demo.build_vit(config, 16, classes=5, representation_size=config["hidden_size"], classifier_activation=None)
    b = demo.build_vit(config, 16, classes=5, representation_size=config["hidden_size"], classifier_activation=None)
    a.load_weights(out / "pretrained.weights.h5")
    load_weights(b, str(out / "pretrained.npz"))
    x = demo.to_rgb(np.random.default_rng(0).integers(0, 17, (4, 8, 8)), 16)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(a(x)), keras.ops.convert_to_numpy(b(x)), atol=1e-6)


@pytest.mark.slow
@pytest.mark.one_backend
def test_three_ways_example_from_the_demo_checkpoint(quick_run, tmp_path, capsys):
    """examples/lora_digits.py on the quick demo's checkpoint: full, layer-decayed and LoRA fine-tuning
    with one budget; LoRA trains fewer weights and its adapter file reloads to the same predictions."""
    out, _ = quick_run
    lora_digits = _load_demo_module(ROOT / "examples" / "lora_digits.py", "keras_vit_lora_digits")
    returned = lora_digits.main(["--quick", "--verbose", "0", "--pretrained", str(out / "pretrained.npz"),
                                 "--out", str(tmp_path / "lora")])
    written = json.loads((tmp_path / "lora" / "metrics.json").read_text())
    assert written == json.loads(json.dumps(returned))
    arms = written["arms"]
    assert set(arms) == {"full", "layer_decay", "lora"}
    assert all(0 <= a["test_accuracy"] <= 1 and a["updates"] == arms["full"]["updates"] for a in arms.values())
    assert arms["lora"]["trainable_parameters"] < arms["full"]["trainable_parameters"] / 2
    assert arms["lora"]["adapter_reload_max_abs_difference"] <= 1e-5
    assert arms["lora"]["adapter_file_bytes"] == (tmp_path / "lora" / "adapters.npz").stat().st_size
    # a missing checkpoint is refused before anything runs
    capsys.readouterr()
    with pytest.raises(SystemExit) as missing:
        lora_digits.main(["--pretrained", str(tmp_path / "none.npz")])
    assert missing.value.code == 2 and "make demo" in capsys.readouterr().err


def test_refuses_existing_output_folder(tmp_path):
    """The demo's main refuses before it trains (in-process: the refusal is the demo's, not the interpreter's)."""
    demo = _load_demo_module()
    out = tmp_path / "taken"
    out.mkdir()
    (out / "notes.txt").write_text("someone else's work")
    with pytest.raises(SystemExit, match="already exists.*--overwrite"):
        demo.main(["--quick", "--out", str(out)])
    # --overwrite still refuses a folder that is no demo output
    with pytest.raises(SystemExit, match="does not look like the output of this demo"):
        demo.main(["--quick", "--overwrite", "--out", str(out)])
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]
    assert (out / "notes.txt").read_text() == "someone else's work"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["taken"]  # no staging folder made


def test_output_folder_rules(tmp_path):
    demo = _load_demo_module()
    demo.check_output_folder(str(tmp_path / "missing"), overwrite=False)
    (tmp_path / "empty").mkdir()
    demo.check_output_folder(str(tmp_path / "empty"), overwrite=False)
    (tmp_path / "file").write_text("x")
    with pytest.raises(SystemExit, match="not a folder"):
        demo.check_output_folder(str(tmp_path / "file"), overwrite=True)
    # an earlier demo run is replaced whole, with --overwrite only
    old = tmp_path / "old"
    old.mkdir()
    (old / demo.MARKER).write_text("")
    (old / "stale.png").write_text("stale")
    with pytest.raises(SystemExit, match="already exists"):
        demo.check_output_folder(str(old), overwrite=False)
    demo.check_output_folder(str(old), overwrite=True)
    staging = tmp_path / "old.partial-1"
    staging.mkdir()
    (staging / "metrics.json").write_text("{}")
    demo.publish(str(staging), str(old))
    assert sorted(p.name for p in old.iterdir()) == ["metrics.json"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty", "file", "old"]


def test_digits_data_is_offline_and_scaled():
    demo = _load_demo_module()
    splits = demo.load_digit_splits(seed=0)
    pre, fin = splits["pretrain"], splits["finetune"]
    assert set(np.unique(pre["y_train"])) == set(np.unique(fin["y_test"])) == set(range(5))
    assert len(pre["x_train"]) + len(pre["x_test"]) + len(fin["x_train"]) + len(fin["x_test"]) == 1797
    images = demo.to_rgb(pre["x_train"][:3], 32)
    assert images.shape == (3, 32, 32, 3) and images.dtype == np.float32
    assert images.min() >= -1.0 and images.max() <= 1.0
    np.testing.assert_array_equal(images[..., 0], images[..., 2])
    # bilinear with half-pixel centres and clamped edges, as scikit-image's order-1 resize
    from skimage.transform import resize

    for size in (16, 32):
        ours = demo.to_rgb(pre["x_train"][:3], size)[..., 1]
        reference = [resize(x / 16.0 * 2.0 - 1.0, (size, size), order=1, mode="edge", anti_aliasing=False)
                     for x in pre["x_train"][:3]]
        np.testing.assert_allclose(ours, np.stack(reference), atol=1e-6)
    # constant images stay constant at any size
    flat = demo.to_rgb(np.full((1, 8, 8), 16.0), 16)
    np.testing.assert_allclose(flat, 1.0)
