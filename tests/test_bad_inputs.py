"""Inputs a new user gets wrong: each gets one error naming what was expected and what came."""

import json
import os
import re

import keras
import numpy as np
import pytest

import keras_vit
from conftest import TINY


def _weights(model):
    return [w.copy() for w in model.get_weights()]


EXPECTED_CHANNELS = r"takes images with 3 channels \(RGB\) on the last axis, got a batch of shape \(1, 32, 32, 1\) with 1"


def test_a_grayscale_batch_names_the_models_channel_count():
    model = keras_vit.VisionTransformer(**TINY)
    gray = np.zeros((1, 32, 32, 1), "float32")
    with pytest.raises(ValueError, match=EXPECTED_CHANNELS):
        model(gray)
    rgb = np.repeat(gray, 3, axis=-1)  # the fix the message proposes works
    assert tuple(model(rgb).shape) == (1, TINY["classes"])
    # Last: on JAX, Keras' predict leaves a model without its weights after any error in the step.
    with pytest.raises(ValueError, match=EXPECTED_CHANNELS):
        model.predict(gray, verbose=0)


def test_a_grayscale_batch_into_a_hybrid_names_the_models_channel_count():
    model = keras_vit.VisionTransformer(**dict(TINY, patch_size=1, resnet={"num_layers": (1,), "width_factor": 1}))
    with pytest.raises(ValueError, match=EXPECTED_CHANNELS):
        model(np.zeros((1, 32, 32, 1), "float32"))


@pytest.mark.parametrize("suffix,match", [(".weights.h5", "not an HDF5/Keras weights file"),
                                          (".keras", "not a Keras model file")])
def test_a_weights_file_of_another_format_is_refused_and_nothing_is_loaded(tmp_path, suffix, match):
    model = keras_vit.VisionTransformer(**TINY)
    before = _weights(model)
    path = tmp_path / f"garbage{suffix}"
    path.write_text("this is not a weights file")
    with pytest.raises(ValueError, match=f"garbage{suffix} is {match}.*got 26 bytes"):
        keras_vit.load_weights(model, str(path))
    for a, b in zip(before, model.get_weights()):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("value", ["abc", None, {"image": 1}, b"\x00\x01"])
def test_preprocess_input_names_the_accepted_types(value):
    with pytest.raises(TypeError, match=f"NumPy array, a nested list.*backend tensor.*KerasTensor; got {type(value).__name__}"):
        keras_vit.preprocess_input(value)


@pytest.mark.parametrize("classes", [0, -3, True, 2.0])
def test_classes_must_be_a_positive_int(classes):
    with pytest.raises(ValueError, match=f"classes must be a positive int.*got {classes!r}"):
        keras_vit.ViT_Ti16(classes=classes, image_size=32)


def test_image_size_zero_is_refused_not_taken_as_unset():
    with pytest.raises(ValueError, match="image_size must be a positive int"):
        keras_vit.ViT_Ti16(image_size=0)


# --------------------------------------------------------------------------
# issue 36 (4): the calls added by issue 35's turn under bad input; each refused with one message that
# names what was expected and what came, the model and the files as they were
# --------------------------------------------------------------------------
def _files(folder):
    """{relative path: bytes} of everything under `folder`."""
    out = {}
    for root, _, names in os.walk(folder):
        for name in names:
            path = os.path.join(root, name)
            with open(path, "rb") as f:
                out[os.path.relpath(path, folder)] = f.read()
    return out


def _tiny(**overrides):
    return keras_vit.VisionTransformer(**{**TINY, **overrides})


@pytest.mark.backend_independent
@pytest.mark.parametrize("kwargs, error, match", [
    (dict(rank="4"), ValueError, "rank must be a positive integer; got '4'"),
    (dict(rank=4, targets=None), TypeError, r"targets must be a name or a list of names from \('query'.*got None"),
    (dict(rank=4, targets="qkv"), ValueError, r"unknown LoRA target\(s\) \['qkv'\]; expected a non-empty subset"),
    (dict(rank=4, alpha=float("nan")), ValueError, "alpha must be a positive number or None.*got nan"),
    (dict(rank=4, alpha="8"), ValueError, "alpha must be a positive number or None.*got '8'"),
])
def test_enable_lora_refuses_bad_arguments_and_leaves_the_model_as_it_was(kwargs, error, match):
    model = _tiny()
    before = _weights(model)
    with pytest.raises(error, match=match):
        keras_vit.enable_lora(model, **kwargs)
    assert not keras_vit.lora.lora_layers(model) and len(model.trainable_weights) == len(model.weights)
    for a, b in zip(before, model.get_weights()):
        np.testing.assert_array_equal(a, b)


@pytest.mark.backend_independent
@pytest.mark.parametrize("call", ["enable_lora", "save_lora", "load_lora", "merge_lora"])
@pytest.mark.parametrize("model", [None, "model.keras"])
def test_the_lora_calls_name_the_model_they_expected(call, model, tmp_path):
    args = {"enable_lora": (2,), "save_lora": (tmp_path / "a.lora",), "load_lora": (tmp_path / "a.lora",),
            "merge_lora": ()}[call]
    with pytest.raises(TypeError, match=f"expected a keras-vit model \\(a keras.Model\\), got {type(model).__name__}"):
        getattr(keras_vit, call)(model, *args)
    assert os.listdir(tmp_path) == []


@pytest.fixture()
def adapted():
    model = _tiny()
    keras_vit.enable_lora(model, 2)
    return model


@pytest.mark.backend_independent
def test_save_lora_onto_a_folder_or_under_a_file_says_so_and_writes_nothing(adapted, tmp_path):
    (tmp_path / "adapters").mkdir()
    (tmp_path / "adapters" / "keep.txt").write_text("mine")
    (tmp_path / "notes.txt").write_text("a file, not a folder")
    before = _files(tmp_path)
    with pytest.raises(IsADirectoryError, match=f"cannot write the file {tmp_path / 'adapters'}: it is a folder"):
        keras_vit.save_lora(adapted, tmp_path / "adapters")
    with pytest.raises(NotADirectoryError, match=f"{tmp_path / 'notes.txt'} is a file, not a folder"):
        keras_vit.save_lora(adapted, tmp_path / "notes.txt" / "adapters.lora")
    assert _files(tmp_path) == before


def _numpy(model):
    return [keras.ops.convert_to_numpy(v).copy() for v in model.weights]


@pytest.mark.parametrize("content, match", [
    (b"rank=4 alpha=4\n", r"got 15 bytes that are no zip archive, starting b'rank=4 a'"),
    ("npy", "a single .npy array, not an .npz archive"),
    ("folder", "Is a directory"),
    ("meta", "LoRA rank must be a positive integer; got 0"),
])
def test_load_lora_of_something_else_names_the_file_and_leaves_the_model(content, match, adapted, tmp_path):
    path = tmp_path / "adapters.lora"
    if content == "npy":
        with open(path, "wb") as f:
            np.save(f, np.zeros(3))
    elif content == "folder":
        path.mkdir()
    elif content == "meta":  # a file save_lora wrote, its rank rewritten
        keras_vit.save_lora(adapted, path)
        with np.load(path) as f:
            arrays = {k: f[k] for k in f.files}
        meta = json.loads(str(arrays[keras_vit.lora._META]))
        arrays[keras_vit.lora._META] = np.array(json.dumps({**meta, "rank": 0}))
        with open(path, "wb") as f:
            np.savez(f, **arrays)
    else:
        path.write_bytes(content)
    model = _tiny()
    before = _numpy(model)
    with pytest.raises(ValueError, match=match) as err:
        keras_vit.load_lora(model, path)
    assert str(path) in str(err.value) and "allow_pickle" not in str(err.value)
    assert not keras_vit.lora.lora_layers(model)
    assert all(np.array_equal(a, b) for a, b in zip(before, _numpy(model)))


@pytest.mark.backend_independent
def test_merge_lora_of_a_model_without_adapters_says_so():
    with pytest.raises(ValueError, match="model 'vit' has no LoRA adapters to merge"):
        keras_vit.merge_lora(_tiny())


@pytest.mark.backend_independent
@pytest.mark.parametrize("decay, error, match", [
    (1.5, ValueError, r"`layer_decay` must be in \(0, 1\] \(1 is no decay\); got 1.5"),
    ("0.7", TypeError, "`layer_decay` must be a number; got '0.7'"),
    (float("nan"), ValueError, "`layer_decay` must be a finite number > 0; got nan"),
    (0, ValueError, "`layer_decay` must be a finite number > 0; got 0.0"),
])
def test_layer_decay_out_of_range_is_refused_before_compiling(decay, error, match):
    model = _tiny()
    with pytest.raises(error, match=match):
        keras_vit.recipes.compile_for_finetuning(model, 100, warmup_steps=10, layer_decay=decay)
    assert not getattr(model, "optimizer", None) and not model.compiled


@pytest.mark.backend_independent
def test_layer_decay_on_a_model_without_blocks_names_what_it_looked_for():
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    with pytest.raises(ValueError, match="needs a keras-vit encoder; model 'sequential.*' has no layer named "
                                         "encoderblock_<i>"):
        keras_vit.recipes.compile_for_finetuning(model, 100, warmup_steps=10, layer_decay=0.7)


@pytest.fixture()
def preset(tmp_path):
    from keras_vit.weights.keras_hub_save import save_keras_hub_preset

    return save_keras_hub_preset(_tiny(approximate_gelu=False), tmp_path / "preset")


@pytest.mark.parametrize("kwargs, match", [
    (dict(classifier_activation="bogus"), "unknown classifier_activation 'bogus'; expected None, the name of a "
                                          "Keras activation"),
    (dict(image_size=30), r"image_size \(30, 30\) is not divisible by the patch size 8"),
    (dict(num_layers=3), "(?s)preset does not fit model 'vit'.*16 missing from the file"),
])
def test_from_keras_hub_with_arguments_the_preset_cannot_take(kwargs, match, preset):
    before = _files(preset)
    with pytest.raises(ValueError, match=match):
        keras_vit.from_keras_hub(preset, **kwargs)
    assert _files(preset) == before


@pytest.mark.backend_independent
def test_from_keras_hub_of_a_file_or_another_folder_says_what_a_preset_is(tmp_path):
    (tmp_path / "model.keras").write_bytes(b"PK")
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "config.json").write_text(json.dumps({"model_type": "vit"}))
    with pytest.raises(ValueError, match="model.keras is not a folder; expected a keras-hub preset folder "
                                         r"\(config.json \+ model.weights.h5"):
        keras_vit.from_keras_hub(tmp_path / "model.keras")
    with pytest.raises(ValueError, match="hf is no keras-hub preset: expected a config.json whose registered_name "
                                         "starts with 'keras_hub>'"):
        keras_vit.from_keras_hub(tmp_path / "hf")


def test_save_keras_hub_preset_refuses_a_file_or_a_folder_of_other_files(tmp_path):
    from keras_vit.weights.keras_hub_save import save_keras_hub_preset

    (tmp_path / "preset.txt").write_text("a file")
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "thesis.tex").write_text("not to be removed")
    before = _files(tmp_path)
    model = _tiny(approximate_gelu=False)
    with pytest.raises(NotADirectoryError, match="preset.txt: it is a file \\(expected a folder path\\)"):
        save_keras_hub_preset(model, tmp_path / "preset.txt")
    with pytest.raises(FileExistsError, match="mine already holds thesis.tex, which this writer did not write"):
        save_keras_hub_preset(model, tmp_path / "mine")
    with pytest.raises(ValueError, match="approximate_gelu=True.*nothing was written"):
        save_keras_hub_preset(_tiny(), tmp_path / "new")
    assert _files(tmp_path) == before and sorted(os.listdir(tmp_path)) == ["mine", "preset.txt"]


def test_a_preset_saved_over_a_classifier_preset_leaves_none_of_its_task_files(preset):
    """A backbone saved where a classifier preset was: its task.json would otherwise be read with it."""
    from keras_vit.weights.keras_hub_save import save_keras_hub_preset

    with open(os.path.join(preset, "task.json"), "w") as f:
        json.dump({"class_name": "ViTImageClassifier"}, f)
    save_keras_hub_preset(_tiny(approximate_gelu=False, num_layers=1), preset)
    assert sorted(os.listdir(preset)) == ["config.json", "metadata.json", "model.weights.h5"]
    assert len(keras_vit.from_keras_hub(preset).get_layer("encoderblock_0").weights) > 0
    assert sorted(os.listdir(os.path.dirname(preset))) == ["preset"]  # no temporary beside it


@pytest.fixture(scope="module")
def cli_setup(tmp_path_factory):
    """A tiny model as a .keras file and folders of what predict and inspect are given."""
    from PIL import Image

    root = tmp_path_factory.mktemp("cli")
    _tiny().save(root / "tiny.keras")
    (root / "empty").mkdir()
    (root / "notes").mkdir()
    (root / "notes" / "a.txt").write_text("not an image")
    (root / "photos" / "sub").mkdir(parents=True)
    Image.fromarray(np.zeros((20, 20, 3), np.uint8)).save(root / "photos" / "sub" / "a.png")
    (root / "weights.npz").write_text("not an archive")
    return root


@pytest.mark.parametrize("argv, match", [
    (["predict", "{r}/empty"], "the folder {r}/empty holds no image files .* in it or in folders under it"),
    (["predict", "{r}/notes"], "the folder {r}/notes holds no image files"),
    (["predict", "{r}/photos", "--csv", "{r}/photos"], "cannot write the file {r}/photos: it is a folder"),
    (["predict", "{r}/photos", "--csv", "{r}/tiny.keras/top.csv"], "{r}/tiny.keras is a file, not a folder"),
    (["predict", "{r}/photos", "--top", "0"], "--top must be a positive number, got 0"),
    (["inspect", "--image", "{r}/photos", "--out", "{r}/maps"], "--image {r}/photos is a folder; inspect takes "
                                                                "image files"),
    (["inspect", "--image", "{r}/photos/sub/a.png", "--out", "{r}/tiny.keras"], "--out {r}/tiny.keras is a file; "
                                                                               "expected the folder"),
])
def test_predict_and_inspect_on_folders_name_what_they_expected(argv, match, cli_setup, capsys):
    from keras_vit import cli

    before = _files(cli_setup)
    argv = [a.format(r=cli_setup) for a in argv] + ["--weights", str(cli_setup / "tiny.keras")]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert f"keras-vit {argv[0]}: error: " in err, err
    assert re.search(re.escape(match.format(r=cli_setup)).replace(r"\.\*", ".*"), err), err
    assert _files(cli_setup) == before


@pytest.mark.backend_independent
@pytest.mark.parametrize("weights, match", [
    ("{r}/photos", "{r}/photos is a folder without config.json; expected a weights file (.npz, .weights.h5"),
    ("{r}/weights.npz", "{r}/weights.npz is not a readable official ViT .npz checkpoint (expected a zip archive "
                        "of named float arrays; truncated or corrupt download?): got 14 bytes that are no zip"),
])
def test_predict_with_weights_that_are_no_weights_file(weights, match, cli_setup, capsys):
    from keras_vit import cli

    argv = ["predict", str(cli_setup / "photos"), "--model", "ViT_Ti16", "--weights", weights.format(r=cli_setup)]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert match.format(r=cli_setup) in err and "allow_pickle" not in err, err


@pytest.mark.backend_independent
@pytest.mark.parametrize("argv, match", [
    (["--steps", "0"], "argument --steps: expected a positive integer, got '0'"),
    (["--steps", "-2"], "argument --steps: expected a positive integer, got '-2'"),
    (["--budget", "-5"], "argument --budget: expected a positive number, got '-5'"),
    (["--budget", "nan"], "argument --budget: expected a positive number, got 'nan'"),
    (["--feed-batch", "0"], "argument --feed-batch: expected a positive integer, got '0'"),
    (["--policy", "bf16"], "argument --policy: invalid choice: 'bf16'"),
    (["--backends", "jax,mxnet"], "unknown backend ['mxnet']; expected some of jax, torch, tensorflow"),
    (["--render", "{t}/missing.json"], "argument --render: expected a session JSON written by gpu.py --out, got "
                                       "'{t}/missing.json'"),
    (["--resume", "{t}/list.json"], "argument --resume: expected a session JSON object, '{t}/list.json' holds a list"),
])
def test_gpu_benchmark_flags_out_of_range_stop_before_anything_runs(argv, match, tmp_path, capsys):
    import sys

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
    import gpu

    (tmp_path / "list.json").write_text("[]")
    with pytest.raises(SystemExit) as stop:
        gpu.main(["--quick", "--out", str(tmp_path / "session.json"), *[a.format(t=tmp_path) for a in argv]])
    assert stop.value.code == 2
    assert match.format(t=tmp_path) in capsys.readouterr().err
    assert sorted(os.listdir(tmp_path)) == ["list.json"]


@pytest.mark.backend_independent
@pytest.mark.parametrize("calibration, match", [
    (np.zeros((2, 32, 32, 3), "float32"), "calibration.*uint8.*float32"),
    (np.zeros((2, 16, 16, 3), "uint8"), r"calibration.*\(N, 32, 32, 3\).*\(2, 16, 16, 3\)"),
    (np.zeros((0, 32, 32, 3), "uint8"), "calibration.*no images"),
    ("images/", "calibration.*numpy.*str"),
])
def test_export_calibration_of_another_kind_is_refused_before_exporting(calibration, match, tmp_path):
    pytest.importorskip("onnxruntime")
    from keras_vit.export import export

    with pytest.raises(ValueError, match=match):
        export(_tiny(), tmp_path / "out", "onnx", quantize="int8", calibration=calibration)
    assert os.listdir(tmp_path) == []
