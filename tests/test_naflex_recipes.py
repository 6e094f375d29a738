"""`keras-vit finetune DIR --naflex TOKENS`: a NaFlex model fine-tuned on an image folder (keras_vit.recipes.own_images)."""

import json
import os

import keras
import numpy as np
import pytest
from conftest import photo_folder
from PIL import Image

from keras_vit import cli, naflex_feed
from keras_vit.image_folder import read_image
from keras_vit.naflex import is_naflex


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    root = photo_folder(tmp_path_factory.mktemp("photos"), per_class=6)
    # one tall photograph per class beside the wide ones: aspect ratios mixed
    for name in ("astronaut", "cat", "coffee"):
        first = sorted(p for p in (root / name).iterdir() if p.is_file())[0]
        Image.fromarray(read_image(first)).transpose(Image.Transpose.ROTATE_90).save(root / name / "tall.png")
    return root


def _argv(photos, start, out, *more):
    return ["finetune", str(photos), "--weights", start, "--image-size", "32", "--naflex", "16", "--epochs", "1",
            "--lr", "0.05", "--validation-split", "0.34", "--out", str(out), "--quiet", *more]


@pytest.mark.one_backend
def test_finetune_naflex_trains_and_saves_a_naflex_model(photos, start, tmp_path):
    out = tmp_path / "run"
    assert cli.main(_argv(photos, start, out)) == 0
    assert {"model.keras", "curves.png", "confusion_matrix.png", "mistakes.png", "per_class.csv", "split.json",
            "report.json", "run.json"} == set(os.listdir(out))
    report = json.loads((out / "report.json").read_text())
    assert report["naflex"]["tokens"] == 16 and report["naflex"]["patch_size"] == 8
    assert report["flags"]["naflex"] == 16
    assert len(report["history"]["loss"]) == len(report["history"]["val_accuracy"]) == 1
    assert 0 <= report["validation_accuracy"] <= 1
    model = keras.saving.load_model(out / "model.keras", safe_mode=True)
    assert is_naflex(model) and model.class_names == ("astronaut", "cat", "coffee")
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


@pytest.mark.backend_independent
@pytest.mark.parametrize("more", [("--export", "onnx"), ("--lora", "2"), ("--resume",)])
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
