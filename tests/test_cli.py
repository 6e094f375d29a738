"""The `keras-vit` command and the checkpoint converter, end to end on real images."""

import importlib.util
import os
import pathlib

import numpy as np
import pytest
import skimage.data
from PIL import Image

import keras_vit
from keras_vit import cli
from keras_vit.preprocessing import decode_predictions, load_image, preprocess_input
from keras_vit.weights import save_npz

ROOT = pathlib.Path(__file__).parents[1]


@pytest.fixture(scope="module")
def ti16_npz(tmp_path_factory):
    """A ViT-Ti/16 with a random non-zero head, saved in the official layout."""
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
    (["predict", "x.jpg", "--model", "ViT_Z9", "--weights", "none"], "unknown variant 'ViT_Z9'; expected one of ViT_Ti16"),
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


@pytest.mark.parametrize("suffix", [".keras", ".weights.h5"])
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
        record = get_weights(name, cli.default_weights(name))  # raises on a tag the variant lacks
        assert record.classes == 1000 or not any(r.classes == 1000 for r in keras_vit.list_weights(name))
    assert cli.default_weights("ViT_Ti16") == "augreg-imagenet21k+imagenet2012"
    assert cli.default_weights("ViT_B16") == "imagenet21k+imagenet2012"
