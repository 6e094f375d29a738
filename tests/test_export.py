"""Serving artefacts run in their own runtimes (TensorFlow's loader, onnxruntime, the LiteRT
interpreter) on real photographs give the Keras model's probabilities and top-k."""

import os

import keras
import numpy as np
import pytest

import keras_vit
from conftest import TINY
from keras_vit.export import FORMATS, UNSUPPORTED, artefact, export

BACKEND = keras.backend.backend()
SUPPORTED = [f for f in FORMATS if (BACKEND, f) not in UNSUPPORTED]


def _photos(size):
    skimage = pytest.importorskip("skimage")
    from skimage import data, transform

    images = [data.astronaut(), data.coffee(), data.chelsea()]
    return np.stack([(transform.resize(im, size, anti_aliasing=True) * 255).round().astype("uint8") for im in images])


# the official tanh GELU, and the exact erf form of every timm and Hugging Face checkpoint
@pytest.fixture(scope="module", params=[True, False], ids=["tanh_gelu", "erf_gelu"])
def model(request):
    m = keras_vit.VisionTransformer(**TINY, approximate_gelu=request.param)
    for i, var in enumerate(m.weights):  # a head and embeddings that spread the probabilities
        var.assign(np.random.default_rng(i).normal(0, 0.3, var.shape).astype("float32"))
    return m


def _run(path, format, images):
    """{"probabilities", "top_k_scores", "top_k_classes"} from the artefact's own runtime."""
    if format == "tf_saved_model":
        import tensorflow as tf

        loaded = tf.saved_model.load(path)  # kept: its variables die with it
        return {k: v.numpy() for k, v in loaded.serve(images).items()}
    if format == "onnx":
        ort = pytest.importorskip("onnxruntime")
        session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
        names = [o.name for o in session.get_outputs()]
        return dict(zip(names, session.run(None, {session.get_inputs()[0].name: images})))
    litert = pytest.importorskip("ai_edge_litert.interpreter")
    interpreter = litert.Interpreter(model_path=path)
    runner = interpreter.get_signature_runner()
    return runner(images=images)


@pytest.mark.parametrize("format", SUPPORTED)
def test_artefact_in_its_runtime_equals_keras_on_photos(format, model, tmp_path):
    photos = _photos((TINY["image_size"], TINY["image_size"]))
    expected = keras.ops.convert_to_numpy(model(keras_vit.preprocess_input(photos.astype("float32"))))
    fixed = BACKEND == "torch"  # torch exports ONNX at a fixed batch size
    paths = {}
    for n in (1, 3) if fixed else (None,):
        paths[n] = export(model, tmp_path / f"out{n}", format, top_k=3, batch_size=n)
        assert paths[n] == artefact(str(tmp_path / f"out{n}"), format)
    assert sorted(p for p in os.listdir(tmp_path) if p.startswith(".")) == []  # no temp folder left
    for n in (1, 3):
        got = _run(paths[n if fixed else None], format, photos[:n])
        np.testing.assert_allclose(got["probabilities"], expected[:n], atol=1e-4, rtol=0)
        np.testing.assert_array_equal(got["top_k_classes"], np.argsort(-expected[:n], axis=-1)[:, :3])
        np.testing.assert_allclose(got["top_k_scores"], np.sort(expected[:n], axis=-1)[:, ::-1][:, :3], atol=1e-4)
    assert expected.max() - expected.min() > 0.05  # the photos give distinct probabilities


def test_unknown_and_unsupported_formats_and_an_existing_folder_write_nothing(model, tmp_path):
    with pytest.raises(ValueError, match="unknown export format 'pickle'; expected one of tf_saved_model, onnx, litert"):
        export(model, tmp_path / "a", "pickle")
    for format in FORMATS:
        if (BACKEND, format) in UNSUPPORTED:
            with pytest.raises(ValueError, match=f"cannot export {format} from the {BACKEND} backend"):
                export(model, tmp_path / "b", format)
    (tmp_path / "taken").mkdir()
    with pytest.raises(FileExistsError, match="already exists"):
        export(model, tmp_path / "taken", SUPPORTED[0], batch_size=1)
    assert sorted(os.listdir(tmp_path)) == ["taken"]


def test_failed_export_leaves_no_folder(model, tmp_path, monkeypatch):
    def broken(self, *args, **kwargs):
        os.makedirs(args[0], exist_ok=True)
        open(os.path.join(os.path.dirname(args[0]) if args[0].endswith((".onnx", ".tflite")) else args[0], "part"),
             "w").write("half")
        raise RuntimeError("interrupted")

    monkeypatch.setattr(keras.Model, "export", broken)
    with pytest.raises(RuntimeError, match="interrupted"):
        export(model, tmp_path / "out", SUPPORTED[0], batch_size=1)
    assert os.listdir(tmp_path) == []


def test_export_cli_refuses_an_unknown_format_before_building(tmp_path, capsys):
    from keras_vit.cli import main

    assert main(["export", "--weights", "none", "--format", "tflite", "--out", str(tmp_path / "x")]) == 2
    assert "unknown export format 'tflite'" in capsys.readouterr().err
    assert os.listdir(tmp_path) == []


@pytest.mark.skipif(BACKEND != "tensorflow", reason="a SavedModel of dynamic height and width: the TensorFlow export")
def test_runtime_resolution_saved_model_takes_any_size(tmp_path):
    """A model of `image_size=None` exports with dynamic height and width (issue: any input)."""
    import tensorflow as tf

    m = keras_vit.VisionTransformer(**dict(TINY, image_size=None))
    for i, var in enumerate(m.weights):
        var.assign(np.random.default_rng(i).normal(0, 0.3, var.shape).astype("float32"))
    loaded = tf.saved_model.load(export(m, tmp_path / "any", "tf_saved_model"))
    for hw in ((32, 32), (48, 24)):
        photos = _photos(hw)
        expected = keras.ops.convert_to_numpy(m(keras_vit.preprocess_input(photos.astype("float32"))))
        np.testing.assert_allclose(loaded.serve(photos).numpy(), expected, atol=1e-4, rtol=0)
