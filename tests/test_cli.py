"""The `keras-vit` command and the checkpoint converter, end to end on real images."""

import csv
import importlib.util
import os
import pathlib
import re
import zipfile

import keras

import numpy as np
import pytest
import skimage.data
from PIL import Image

import keras_vit
from conftest import photos, tiny_variant
from keras_vit import cli
from keras_vit.cli.model_args import default_weights
from keras_vit.preprocessing import decode_predictions, load_image, preprocess_input
from keras_vit.weights import save_npz

ROOT = pathlib.Path(__file__).parents[1]


@pytest.fixture(scope="module", autouse=True)
def tiny_ti16():
    """ViT_Ti16 at TINY's depth and widths in this module: its tests check the commands' and the converter's
    plumbing by a released model's name (the official layout key by key is test_weights.py's), not its 12 layers,
    whose tracing was most of their time on TensorFlow and JAX."""
    with pytest.MonkeyPatch.context() as patch:
        tiny_variant(patch)
        yield


@pytest.fixture(scope="module")
def ti16_npz(tiny_ti16, tmp_path_factory):
    """A ViT-Ti/16 (tiny_ti16's) with a random non-zero head, saved in the official layout."""
    model = keras_vit.ViT_Ti16()
    rng = np.random.default_rng(0)
    head = model.get_layer("head")
    head.kernel.assign(rng.normal(scale=0.5, size=head.kernel.shape))
    return save_npz(model, tmp_path_factory.mktemp("w") / "ti16.npz")


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    folder = tmp_path_factory.mktemp("img")
    paths = []
    for name in ("astronaut", "coffee"):
        path = folder / f"{name}.png"
        Image.fromarray(getattr(skimage.data, name)()).save(path)
        paths.append(str(path))
    return paths


def test_list_shows_every_variant_and_weights(capsys):
    assert cli.main(["list"]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in keras_vit.VARIANTS)
    assert "imagenet21k+imagenet2012" in out


def test_predict_prints_the_models_top5(capsys, ti16_npz, images):
    assert cli.main(["predict", *images, "--model", "ViT_Ti16", "--weights", str(ti16_npz)]) == 0
    out = capsys.readouterr().out
    model = keras_vit.ViT_Ti16(weights=ti16_npz)
    x = preprocess_input(np.stack([load_image(p, 224) for p in images]))
    expected = decode_predictions(model.predict(x, verbose=0), top=5)
    for path, rows in zip(images, expected):
        block = out.split(path)[1]
        assert rows[0][1] in block.splitlines()[1]  # the top-1 name on the first line
        assert all(name in block for _, name, _ in rows)


@pytest.mark.parametrize("argv,match", [
    (["predict", "missing.jpg", "--model", "ViT_Ti16", "--weights", "none"], "image file not found: missing.jpg"),
    (["predict", str(ROOT / "README.md"), "--model", "ViT_Z9", "--weights", "none"],
     "unknown variant 'ViT_Z9'; expected one of ViT_Ti16"),  # the files are checked first: this one exists
])
def test_predict_bad_input(capsys, argv, match):
    assert cli.main(argv) == 2
    assert match in capsys.readouterr().err


@pytest.mark.backend_independent
def test_load_image_rejects_non_images(tmp_path):
    bad = tmp_path / "not.jpg"
    bad.write_text("hello")
    with pytest.raises(ValueError, match="cannot read"):
        load_image(str(bad), 32)


def _converter():
    spec = importlib.util.spec_from_file_location("convert", ROOT / "weights" / "tools" / "convert.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# the file kinds' writers are backend-independent: the second kind on torch only
@pytest.mark.parametrize("suffix", [".keras", pytest.param(".weights.h5", marks=pytest.mark.backend_independent)])
def test_converter_writes_a_checked_file_and_nothing_else(tmp_path, ti16_npz, suffix):
    out = tmp_path / "out" / f"ti16{suffix}"
    err = _converter().convert("ViT_Ti16", str(ti16_npz), str(out))
    assert err <= 1e-5 and os.listdir(out.parent) == [out.name]


def test_converter_refuses_bad_suffix_and_leaves_no_file(tmp_path, ti16_npz):
    with pytest.raises(ValueError, match=".keras or .weights.h5"):
        _converter().convert("ViT_Ti16", str(ti16_npz), str(tmp_path / "x.h5"))
    assert os.listdir(tmp_path) == []


@pytest.mark.backend_independent
@pytest.mark.parametrize("command", [["predict", "x.jpg"], ["export", "--format", "onnx", "--out", "x"]])
def test_default_weights_exist_for_every_variant(command):
    """Without --weights, predict and export take a tag the registry holds for the chosen variant
    (a fixed 'imagenet21k+imagenet2012' does not exist for ViT_Ti16 or ViT_H14)."""
    from keras_vit.weights.registry import get_weights

    for name in keras_vit.VARIANTS:
        args = cli.parser().parse_args([*command, "--model", name])
        assert args.weights is None
        record = get_weights(name, default_weights(name))  # raises on a tag the variant lacks
        assert record.classes == 1000 or not any(r.classes == 1000 for r in keras_vit.list_weights(name))
    assert default_weights("ViT_Ti16") == "augreg-imagenet21k+imagenet2012"
    assert default_weights("ViT_B16") == "imagenet21k+imagenet2012"


# a fine-tuned model of one's own: 3 classes, one name with a comma (the CSV quotes it)
TINY3 = dict(image_size=32, patch_size=8, hidden_size=16, mlp_dim=32, num_heads=2, num_layers=1, classes=3)
NAMES = ("cat", "dog", "bird, small")


def _tiny(**kwargs):
    model = keras_vit.VisionTransformer(**{**TINY3, **kwargs})
    for i, var in enumerate(model.weights):  # a head that spreads the probabilities
        var.assign(np.random.default_rng(i).normal(0, 0.3, var.shape).astype("float32"))
    return model


def test_class_names_survive_save_and_load(tmp_path):
    model = _tiny()
    assert model.class_names is None
    model.class_names = list(NAMES)
    assert model.class_names == NAMES and model.get_config()["class_names"] == list(NAMES)
    model.save(tmp_path / "named.keras")
    loaded = keras.saving.load_model(tmp_path / "named.keras")  # safe mode
    assert type(loaded).__name__ == "ViTModel" and loaded.class_names == NAMES
    loaded.class_names = None  # a file without them, as every file saved before they existed
    loaded.save(tmp_path / "plain.keras")
    assert keras.saving.load_model(tmp_path / "plain.keras").class_names is None
    assert decode_predictions(np.eye(3)[[2]], top=1, class_names=model) == [[("2", "bird, small", 1.0)]]


@pytest.mark.parametrize("kwargs,names,error,match", [
    ({}, ["cat", "dog"], ValueError, r"2 class names given for 3 classes \(the head of model 'vit'\)"),
    ({}, ["cat", "dog", "cat"], ValueError, "class names must be distinct; repeated: 'cat'"),
    ({}, ["cat", "dog", 3], TypeError, r"class names must be str; got 3 \(int\)"),
    ({}, "cat", TypeError, "class names must be a sequence of str"),
    ({"include_top": False}, ["a"], ValueError, "model 'vit' outputs features, not classes"),
    ({"head": "projection", "classifier_activation": None}, NAMES, ValueError, "outputs embeddings, not classes"),
])
def test_class_names_are_checked(kwargs, names, error, match):
    model = keras_vit.VisionTransformer(**{**TINY3, **kwargs})
    with pytest.raises(error, match=match):
        model.class_names = names
    assert model.class_names is None


@pytest.mark.backend_independent
def test_decode_predictions_takes_the_users_names():
    preds = np.array([[0.1, 0.7, 0.2], [0.5, 0.2, 0.3]])
    assert decode_predictions(preds, top=2, class_names=NAMES) == [
        [("1", "dog", 0.7), ("2", "bird, small", 0.2)], [("0", "cat", 0.5), ("2", "bird, small", 0.3)]]
    with pytest.raises(ValueError, match=r"2 class names given for 3 classes \(preds of shape \(2, 3\)\)"):
        decode_predictions(preds, class_names=NAMES[:2])
    with pytest.raises(ValueError, match=r"or \(batch, classes\) with class_names .* got shape \(2, 3\)"):
        decode_predictions(preds)
    assert decode_predictions(np.eye(1000)[[1]], top=1)[0][0][0] == "n01443537"  # ImageNet as before (goldfish)


def _read_csv(path):
    with open(path, newline="") as f:
        return list(csv.reader(f))


@pytest.mark.parametrize("input_dtype,names", [("float32", NAMES), ("uint8", None)])
def test_predict_a_keras_file_over_files_and_folders(tmp_path, capsys, images, input_dtype, names):
    """A saved model of one's own (float input with its class names; uint8 input, which scales itself,
    without them: "class i") over a file and a folder; the CSV's rows are model.predict's."""
    model = _tiny(input_dtype=input_dtype)
    model.class_names = names
    model.save(tmp_path / "mine.keras")
    folder = tmp_path / "photos"
    (folder / "sub").mkdir(parents=True)
    for name, photo in zip(("b.png", "sub/a.JPG", "c.webp"), photos(48)):
        Image.fromarray(photo).save(folder / name, format="JPEG" if name.endswith("JPG") else None)
    (folder / "notes.txt").write_text("not an image")
    (folder / ".hidden.png").write_text("skipped too")
    (folder / "cut.jpg").write_bytes((folder / "sub" / "a.JPG").read_bytes()[:300])  # a folder's bad file: skipped
    out = tmp_path / "top.csv"
    argv = ["predict", "--weights", str(tmp_path / "mine.keras"), images[0], str(folder), "--csv", str(out),
            "--top", "2", "--batch-size", "2"]
    assert cli.main(argv) == 0
    files = [images[0], *(str(folder / n) for n in ("b.png", "c.webp", "sub/a.JPG"))]
    pixels = np.stack([load_image(f, 32) for f in files])
    x = pixels.astype(np.uint8) if input_dtype == "uint8" else preprocess_input(pixels)
    expected = decode_predictions(model.predict(x, verbose=0), top=2, class_names=names or [f"class {i}" for i in range(3)])
    rows = _read_csv(out)
    assert rows[0] == ["file", "class_1", "score_1", "class_2", "score_2"]
    assert [r[0] for r in rows[1:]] == files
    for row, top in zip(rows[1:], expected):
        assert row[1::2] == [name for _, name, _ in top]
        np.testing.assert_allclose([float(v) for v in row[2::2]], [score for _, _, score in top], atol=1e-5)
    printed = capsys.readouterr()
    assert all(name in printed.out for top in expected for _, name, _ in top) and f"wrote {out}" in printed.out
    assert "cut.jpg" in printed.err and "1 file(s) of the folders given could not be read" in printed.err


def test_inspect_and_export_take_a_keras_file(tmp_path, capsys, images):
    # the quickest format of each backend (ONNX from JAX and a SavedModel from torch take a few times longer)
    format, runtime = ("onnx", "onnxruntime") if keras.backend.backend() == "torch" else ("tf_saved_model", "tensorflow")
    pytest.importorskip(runtime)
    model = _tiny(input_dtype="uint8")
    model.save(tmp_path / "mine.keras")
    argv = ["inspect", "--weights", str(tmp_path / "mine.keras"), "--image", images[0], "--out", str(tmp_path / "fig")]
    assert cli.main(argv) == 0
    assert len(os.listdir(tmp_path / "fig")) == 4
    argv = ["export", "--weights", str(tmp_path / "mine.keras"), "--format", format, "--out", str(tmp_path / "out")]
    assert cli.main(argv) == 0
    printed = capsys.readouterr().out
    assert "top-1 agreement 100%" in printed  # Keras fed the uint8 images as the artefact is
    error = float(printed.split("max |difference| ")[1].split(",")[0])
    assert error < 1e-4


@pytest.fixture(scope="module")
def mine(tmp_path_factory):
    """A saved 3-class model, and files that are not one."""
    folder = tmp_path_factory.mktemp("keras")
    _tiny().save(folder / "mine.keras")
    (folder / "text.keras").write_text("not a model")
    (folder / "cut.keras").write_bytes((folder / "mine.keras").read_bytes()[:5000])  # a download cut short
    with zipfile.ZipFile(folder / "other.keras", "w") as archive:
        archive.writestr("readme.txt", "a zip, not a Keras archive")
    (folder / "empty").mkdir()
    return folder


@pytest.mark.parametrize("argv,match", [
    (["--weights", "{}/text.keras"], r"{}/text.keras is not a Keras model file \(a .keras zip archive\)"),
    (["--weights", "{}/cut.keras"], r"{}/cut.keras is not a Keras model file \(a .keras zip archive\) or is damaged"),
    (["--weights", "{}/other.keras"], "could not load {}/other.keras as a Keras model"),
    (["--weights", "{}/missing.keras"], "model file not found: {}/missing.keras"),
    (["--weights", "{}/mine.keras", "--model", "ViT_Ti16"],
     "{}/mine.keras is a whole model \\(a .keras file\\); --model is not used with it"),
    (["--weights", "{}/mine.keras", "--image-size", "64"], "--image-size 64: the model in {}/mine.keras takes 32x32 images only"),
    (["--weights", "{}/mine.keras", "{}/empty"], "the folder {}/empty holds no image files"),
])
def test_predict_refuses_what_is_no_model_or_does_not_fit_it(capsys, images, mine, argv, match):
    assert cli.main(["predict", *(a.format(mine) for a in argv), images[0]]) == 2
    err = capsys.readouterr().err
    assert err.startswith("keras-vit predict: error: ") and len(err.splitlines()) == 1
    assert re.search(match.replace("{}", re.escape(str(mine))), err), err
