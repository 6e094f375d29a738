"""`keras-vit finetune DIR --naflex TOKENS`: a NaFlex model fine-tuned on an image folder (keras_vit.recipes.own_images)."""

import csv
import json
import os

import keras
import numpy as np
import pytest
from conftest import assert_resumed_equals_whole, photo_folder
from PIL import Image

from keras_vit import cli
from keras_vit.data import naflex_feed
from keras_vit.data.folder import read_image
from keras_vit.naflex import is_naflex
from keras_vit.recipes import own_images


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    root = photo_folder(tmp_path_factory.mktemp("photos"), per_class=6)
    # one tall photograph per class beside the wide ones: aspect ratios mixed
    for name in ("astronaut", "cat", "coffee"):
        first = sorted(p for p in (root / name).iterdir() if p.is_file())[0]
        Image.fromarray(read_image(first)).transpose(Image.Transpose.ROTATE_90).save(root / name / "tall.png")
    return root


def _argv(photos, start, out, *more):
    return ["finetune", str(photos), "--weights", start, "--image-size", "32", "--naflex", "16", "--epochs", "2",
            "--lr", "0.05", "--validation-split", "0.34", "--out", str(out), "--quiet", *more]


@pytest.fixture(scope="module")
def whole(photos, start, tmp_path_factory):
    """The folder of an uninterrupted NaFlex run, as a user types it."""
    out = tmp_path_factory.mktemp("runs") / "whole"
    assert cli.main(_argv(photos, start, out)) == 0
    return out


@pytest.mark.one_backend
def test_finetune_naflex_trains_and_saves_a_naflex_model(photos, whole):
    out = whole
    assert {"model.keras", "curves.png", "confusion_matrix.png", "mistakes.png", "per_class.csv", "split.json",
            "report.json", "run.json"} == set(os.listdir(out))
    report = json.loads((out / "report.json").read_text())
    assert report["naflex"]["tokens"] == 16 and report["naflex"]["patch_size"] == 8
    assert report["flags"]["naflex"] == 16
    assert len(report["history"]["loss"]) == len(report["history"]["val_accuracy"]) == 2
    assert 0 <= report["validation_accuracy"] <= 1
    model = keras.saving.load_model(out / "model.keras", safe_mode=True)
    assert is_naflex(model) and model.class_names == ("astronaut", "cat", "coffee") and model.naflex_tokens == 16
    # the saved model gives the report's accuracy on the validation files, fed as NaFlex batches again
    split = json.loads((out / "split.json").read_text())["validation"]
    images = [read_image(photos / p) for p, _ in split]
    labels = [model.class_names.index(c) for _, c in split]
    plan = naflex_feed.NaFlexPlan(patch_size=8, seq_lens=(16,), eval_seq_len=16, max_tokens_per_batch=16 * 8)
    batches = naflex_feed.NaFlexBatches(images, labels, plan, training=False, image_dtype="uint8")
    x, _ = batches[0]
    assert x["patches"].shape[1:] == (16, 8 * 8 * 3) and x["patches"].dtype == np.uint8
    probs = model.predict(batches, verbose=0)
    np.testing.assert_allclose(probs.sum(-1), 1, atol=1e-5)
    assert report["validation_accuracy"] == pytest.approx(float((probs.argmax(-1) == np.array(labels)).mean()))


@pytest.mark.one_backend
def test_predict_reads_the_naflex_model_finetune_wrote_and_inspect_refuses_it(photos, whole, tmp_path, capsys):
    model = keras.saving.load_model(whole / "model.keras", safe_mode=True)
    split = json.loads((whole / "split.json").read_text())["validation"]
    files = [str(photos / p) for p, _ in split]
    csv_path = tmp_path / "predictions.csv"
    # each image at its own aspect ratio (the tall ones too), cut to the 16 tokens the model records
    assert cli.main(["predict", "--weights", str(whole / "model.keras"), *files, "--top", "2", "--batch-size", "2",
                     "--csv", str(csv_path)]) == 0
    printed = capsys.readouterr().out
    assert "astronaut" in printed and "coffee" in printed
    rows = list(csv.DictReader(csv_path.open()))
    plan = naflex_feed.NaFlexPlan(patch_size=8, seq_lens=(16,), eval_seq_len=16, max_tokens_per_batch=16 * 8)
    batches = naflex_feed.NaFlexBatches([read_image(f) for f in files], [0] * len(files), plan, training=False,
                                        image_dtype="uint8")
    probs = model.predict(batches, verbose=0)
    assert [r["file"] for r in rows] == files
    assert [r["class_1"] for r in rows] == [model.class_names[i] for i in probs.argmax(-1)]
    np.testing.assert_allclose([float(r["score_1"]) for r in rows], probs.max(-1), atol=1e-5)
    # another budget by flag: the same image cut to 4 tokens gives the model's output at 4 tokens
    assert cli.main(["predict", "--weights", str(whole / "model.keras"), files[0], "--naflex-tokens", "4",
                     "--top", "1", "--csv", str(csv_path)]) == 0
    few = model.predict_on_batch({k: v[None] for k, v in naflex_feed.patchify(
        read_image(files[0]), 8, 4, 4, image_dtype="uint8").items()})
    assert float(next(csv.DictReader(csv_path.open()))["score_1"]) == pytest.approx(float(few.max()), abs=1e-5)
    assert cli.main(["predict", "--weights", str(whole / "model.keras"), files[0], "--image-size", "32"]) == 2
    assert "--image-size is not used with a NaFlex model" in capsys.readouterr().err
    assert cli.main(["inspect", "--weights", str(whole / "model.keras"), "--image", files[0],
                     "--out", str(tmp_path / "maps")]) == 2
    assert "is a NaFlex model (it takes patches, not images)" in capsys.readouterr().err
    assert not (tmp_path / "maps").exists()


@pytest.mark.one_backend
def test_an_interrupted_naflex_run_resumes_to_the_uninterrupted_weights(photos, start, whole, tmp_path):
    class Interrupt(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            raise KeyboardInterrupt  # after the backup of epoch 1

    with pytest.raises(KeyboardInterrupt):
        own_images.run(cli.parser().parse_args(_argv(photos, start, tmp_path / "cut")), [Interrupt()])
    assert cli.main(["finetune", str(photos), "--out", str(tmp_path / "cut"), "--resume", "--quiet"]) == 0
    resumed = json.loads((tmp_path / "cut" / "report.json").read_text())
    assert resumed["resumed_from_epoch"] == 1
    assert_resumed_equals_whole(whole, tmp_path / "cut", resumed)


@pytest.mark.backend_independent
@pytest.mark.parametrize("more", [("--export", "onnx"), ("--lora", "2")])
def test_finetune_naflex_refuses_what_it_does_not_do(photos, start, tmp_path, capsys, more):
    out = tmp_path / "run"
    assert cli.main(_argv(photos, start, out, *more)) == 2
    assert f"--naflex 16 cannot be combined with {more[0]}" in capsys.readouterr().err
    assert not out.exists()  # nothing written


@pytest.mark.one_backend
def test_the_examples_recipe_fine_tunes_a_naflex_model_on_tfds(tmp_path):
    """`python examples/finetune_cifar10.py --naflex TOKENS` (the recipe on mocked TFDS cifar10): NaFlex batches
    of one bucket, the saved model a NaFlex model whose test accuracy is the reported one."""
    tfds = pytest.importorskip("tensorflow_datasets")
    from keras_vit.recipes import finetune

    tiny = json.dumps(dict(patch_size=8, hidden_size=16, mlp_dim=32, num_heads=2, num_layers=1))
    out = tmp_path / "run"
    argv = ["--model", tiny, "--weights", "none", "--image-size", "16", "--naflex", "4", "--batch-size", "4",
            "--steps", "4", "--eval-every", "2", "--warmup-steps", "1", "--lr", "0.05", "--data-dir", str(tmp_path),
            "--output-dir", str(out), "--verbose", "0"]
    with tfds.testing.mock_data(num_examples=12):
        metrics = finetune.main("cifar10", argv)
    assert metrics["steps"] == 4 and len(metrics["history"]["loss"]) == 2 and 0 <= metrics["test_accuracy"] <= 1
    assert json.loads((out / "run.json").read_text())["naflex"] == 4
    model = keras.saving.load_model(str(out / "model.keras"), safe_mode=True)
    assert is_naflex(model) and model.output_shape == (None, 10)


@pytest.mark.backend_independent
def test_the_examples_recipe_refuses_naflex_with_distribute(capsys):
    from keras_vit.recipes.finetune_args import parse_args

    with pytest.raises(SystemExit):
        parse_args("cifar10", ["--naflex", "64", "--distribute", "data"])
    assert "--naflex feeds one process" in capsys.readouterr().err
