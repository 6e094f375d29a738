"""Serving artefacts run in their own runtimes (TensorFlow's loader, onnxruntime, the LiteRT
interpreter) on real photographs give the Keras model's probabilities and top-k."""

import importlib.util
import os

import keras
import numpy as np
import pytest

import keras_vit
from conftest import TINY
from keras_vit.export import FIXED_BATCH, FORMATS, UNSUPPORTED, artefact, export, formats, run

BACKEND = keras.backend.backend()
SUPPORTED = formats(BACKEND, fixed_batch=True)  # LiteRT from torch too, at a fixed batch
RUNTIMES = {"tf_saved_model": "tensorflow", "onnx": "onnxruntime", "litert": "ai_edge_litert"}


def _runtime_or_skip(format):
    pytest.importorskip(RUNTIMES[format])
    if (BACKEND, format) == ("torch", "litert") and importlib.util.find_spec("litert_torch") is None:
        # not "could not import" (a failure under CI=true): the export extra does not install it
        pytest.skip("litert-torch is not installed (outside the export extra; README: Serving)")


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


@pytest.mark.parametrize("format", SUPPORTED)
def test_artefact_in_its_runtime_equals_keras_on_photos(format, model, tmp_path):
    photos = _photos((TINY["image_size"], TINY["image_size"]))
    _runtime_or_skip(format)
    expected = keras.ops.convert_to_numpy(model(keras_vit.preprocess_input(photos.astype("float32"))))
    fixed = (BACKEND, format) in FIXED_BATCH
    if fixed:  # one file per batch size
        paths = {n: export(model, tmp_path / f"out{n}", format, top_k=3, batch_size=n) for n in (1, 3)}
        assert sorted(os.listdir(tmp_path)) == ["out1", "out3"]
    else:
        path = export(model, tmp_path / "out", format, top_k=3)
        assert path == artefact(str(tmp_path / "out"), format)
        assert os.listdir(tmp_path) == ["out"]  # no temp folder left
        paths = {1: path, 3: path}  # one file, any batch size
    for n in (1, 3):
        got = run(paths[n], format, photos[:n])
        np.testing.assert_allclose(got["probabilities"], expected[:n], atol=1e-4, rtol=0)
        np.testing.assert_array_equal(got["top_k_classes"], np.argsort(-expected[:n], axis=-1)[:, :3])
        np.testing.assert_allclose(got["top_k_scores"], np.sort(expected[:n], axis=-1)[:, ::-1][:, :3], atol=1e-4)
    assert expected.max() - expected.min() > 0.05  # the photos give distinct probabilities


def test_unknown_and_unsupported_formats_and_an_existing_folder_write_nothing(model, tmp_path):
    with pytest.raises(ValueError, match="unknown export format 'pickle'; expected one of tf_saved_model, onnx, litert"):
        export(model, tmp_path / "a", "pickle")
    for format in FORMATS:
        if (BACKEND, format) in UNSUPPORTED:
            others = ", ".join(b for b in ("tensorflow", "jax", "torch") if (b, format) not in UNSUPPORTED)
            with pytest.raises(ValueError, match=rf"cannot export {format} from the {BACKEND} backend \(.*\); "
                               f"{BACKEND} exports {', '.join(SUPPORTED)}; {format} exports from {others}$"):
                export(model, tmp_path / "b", format)
    (tmp_path / "taken").mkdir()
    with pytest.raises(FileExistsError, match="already exists"):
        export(model, tmp_path / "taken", SUPPORTED[0], batch_size=1)
    assert sorted(os.listdir(tmp_path)) == ["taken"]


@pytest.mark.parametrize("format", SUPPORTED)
def test_interrupted_export_leaves_no_folder(format, model, tmp_path, monkeypatch):
    import keras_vit.export

    def interrupted(self, path, *args, **kwargs):  # Model.export and the torch ONNX exporter: half a file
        os.makedirs(os.path.dirname(path), exist_ok=True)
        open(path if path.endswith((".onnx", ".tflite")) else os.path.join(path, "part"), "w").write("half")
        raise KeyboardInterrupt

    if (BACKEND, format) == ("torch", "litert"):
        _runtime_or_skip(format)
    monkeypatch.setattr(keras.Model, "export", interrupted)
    monkeypatch.setattr(keras_vit.export, "_torch_onnx", interrupted)
    monkeypatch.setattr(keras_vit.export, "_torch_litert", interrupted)
    with pytest.raises(KeyboardInterrupt):
        export(model, tmp_path / "out", format, batch_size=1 if (BACKEND, format) in FIXED_BATCH else None)
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


@pytest.mark.skipif("onnx" not in SUPPORTED, reason="int8 quantizes ONNX files")
@pytest.mark.parametrize("calibrated", [False, True], ids=["dynamic", "static"])
def test_int8_onnx_is_quantized_and_close_to_keras(calibrated, model, tmp_path):
    """onnxruntime's int8: dynamic (integer matrix products) or static (QDQ pairs from calibration
    images); on the tiny model the probabilities stay within 0.05 of float32's."""
    onnx = pytest.importorskip("onnx")
    pytest.importorskip("onnxruntime")
    photos = _photos((TINY["image_size"], TINY["image_size"]))
    calibration = np.concatenate([photos, photos[:, ::-1]]) if calibrated else None
    path = export(model, tmp_path / "int8", "onnx", quantize="int8", calibration=calibration)
    assert os.listdir(tmp_path / "int8") == ["model.onnx"]
    ops = {n.op_type for n in onnx.load(path).graph.node}
    assert ({"QuantizeLinear", "DequantizeLinear"} if calibrated else {"MatMulInteger", "DynamicQuantizeLinear"}) <= ops
    expected = keras.ops.convert_to_numpy(model(keras_vit.preprocess_input(photos.astype("float32"))))
    got = run(path, "onnx", photos)["probabilities"]
    np.testing.assert_allclose(got, expected, atol=0.05, rtol=0)


@pytest.mark.skipif("onnx" not in SUPPORTED, reason="ONNX graph rewrites")
def test_onnx_weights_are_folded_and_int8_quantizes_every_projection(tmp_path):
    """Kernels above the exporters' folding limit (8192 values, so every real ViT) become
    initializers: nothing is computed from constants alone at load time, and onnxruntime's int8
    quantizer, which only quantizes a MatMul whose weight is an initializer, quantizes all of them.
    On torch the attention's fused q/k/v matmul becomes three, with no slicing left; on JAX the
    projections' Einsum nodes become MatMul."""
    onnx = pytest.importorskip("onnx")
    pytest.importorskip("onnxruntime")
    m = keras_vit.VisionTransformer(**dict(TINY, hidden_size=64, mlp_dim=128))  # q/k/v kernels: 12,288 values
    for i, var in enumerate(m.weights):
        var.assign(np.random.default_rng(i).normal(0, 0.3, var.shape).astype("float32"))
    graph = onnx.load(export(m, tmp_path / "float", "onnx")).graph
    constants = {i.name for i in graph.initializer}
    assert [n.op_type for n in graph.node if n.input and all(i in constants for i in n.input if i)] == []
    weighted = [n for n in graph.node if n.op_type == "MatMul" and n.input[1] in constants]
    ops = [n.op_type for n in graph.node]
    # per block: q, k, v, out, MLP in and out (TensorFlow's graph keeps one q/k/v matmul, sliced after)
    per_block = 4 if BACKEND == "tensorflow" else 6
    assert len(weighted) == 2 + TINY["num_layers"] * per_block and "Einsum" not in ops  # + patches, head
    if BACKEND == "torch":
        assert "Split" not in ops and ops.count("Gather") == 1  # the class token's only
    photos = _photos((TINY["image_size"], TINY["image_size"]))
    expected = keras.ops.convert_to_numpy(m(keras_vit.preprocess_input(photos.astype("float32"))))
    np.testing.assert_allclose(run(str(tmp_path / "float" / "model.onnx"), "onnx", photos)["probabilities"],
                               expected, atol=1e-4, rtol=0)
    int8 = [n.op_type for n in onnx.load(export(m, tmp_path / "int8", "onnx", quantize="int8")).graph.node]
    assert int8.count("MatMulInteger") == len(weighted) and int8.count("MatMul") == ops.count("MatMul") - len(weighted)


@pytest.mark.backend_independent
def test_formats_lists_fixed_batch_formats_only_when_asked():
    """`formats(backend)` is what writes one file for any batch size (what callers iterating it
    run at batch 1 and 3); LiteRT from torch is fixed-batch, listed with fixed_batch=True."""
    assert formats("torch") == ["onnx"] and formats("torch", fixed_batch=True) == ["onnx", "litert"]
    assert formats("tensorflow") == formats("tensorflow", fixed_batch=True) == list(FORMATS)


@pytest.mark.backend_independent
def test_int8_bad_requests_are_refused_before_writing(tmp_path):
    from keras_vit.export import calibration_images, check_format

    with pytest.raises(ValueError, match="--quantize int8 applies to onnx"):
        check_format("tensorflow", "tf_saved_model", "int8")
    with pytest.raises(ValueError, match="unknown quantization 'int4'"):
        check_format("tensorflow", "onnx", "int4")
    (tmp_path / "calib").mkdir()
    (tmp_path / "calib" / "notes.txt").write_text("not an image")
    with pytest.raises(ValueError, match="holds no readable images"):
        calibration_images(str(tmp_path / "calib"), 32)
    assert sorted(os.listdir(tmp_path)) == ["calib"]


def test_export_cli_writes_checks_and_reports_an_int8_onnx(model, tmp_path, capsys):
    from keras_vit.cli import main

    model.save(tmp_path / "tiny.keras")
    calibration = tmp_path / "calibration"
    calibration.mkdir()
    for i, photo in enumerate(_photos((40, 40))):
        keras.utils.save_img(calibration / f"{i}.png", photo)
    out = tmp_path / "int8"
    argv = ["export", "--weights", str(tmp_path / "tiny.keras"), "--format", "onnx", "--out", str(out),
            "--quantize", "int8", "--calibration", str(calibration)]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert f"wrote {out / 'model.onnx'} (" in printed and " MiB)" in printed
    assert "checked in onnxruntime against Keras on 2 random images: max |probability difference|" in printed
    assert main(argv) == 2  # the folder exists now: refused, left as it was
    assert "already exists" in capsys.readouterr().err
    assert os.listdir(out) == ["model.onnx"]


def test_export_cli_bad_requests_name_what_works_and_write_nothing(model, tmp_path, capsys):
    from keras_vit.cli import main

    model.save(tmp_path / "tiny.keras")
    (tmp_path / "empty").mkdir()
    base = ["export", "--weights", str(tmp_path / "tiny.keras"), "--out", str(tmp_path / "x")]
    assert main([*base, "--format", "onnx", "--quantize", "int8", "--calibration", str(tmp_path / "empty")]) == 2
    assert "holds no readable images" in capsys.readouterr().err
    assert main([*base, "--format", "onnx", "--calibration", str(tmp_path / "empty")]) == 2
    assert "--calibration is for --quantize int8" in capsys.readouterr().err
    for format in set(FORMATS) - set(SUPPORTED):
        assert main([*base, "--format", format]) == 2
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1 and f"{BACKEND} exports {', '.join(SUPPORTED)}" in err
    for backend, format in FIXED_BATCH:
        if backend == BACKEND:
            assert main([*base, "--format", format]) == 2
            err = capsys.readouterr().err
            assert len(err.strip().splitlines()) == 1 and "needs a fixed batch size (--batch-size N)" in err
    assert sorted(os.listdir(tmp_path)) == ["empty", "tiny.keras"]
