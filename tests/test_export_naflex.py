"""Artefacts of NaFlex models (issue 37, item 5): ONNX and a SavedModel of `keras_vit.naflex(model)` take its dict
of patches, their coordinates and their validity, of any batch and sequence length, and equal the Keras model on
padded batches of images of mixed sizes (a [class]-token classifier, gap pooling with registers, MAP on uint8
patches); LiteRT and the options that act on images are refused before anything is written."""

import importlib.util
import logging
import os

import keras
import numpy as np
import pytest
from conftest import once_on_tensorflow, outputs_of, tensorflows_file

from keras_vit.export import (NAFLEX_REFUSED, THROUGH_TENSORFLOW_NAFLEX, check_format, compare, export,
                              read_class_names, run, writer)
from keras_vit.extras import MissingPackageError
from keras_vit.model import build_vit
from keras_vit.naflex import naflex, patchify_images

BACKEND = keras.backend.backend()
RUNTIMES = {"tf_saved_model": "tensorflow", "onnx": "onnxruntime"}
TINY = dict(image_size=32, patch_size=8, hidden_size=32, mlp_dim=64, num_heads=4, num_layers=2, classes=5)
CONFIGS = {
    "token": dict(classifier="token"),
    "gap_registers": dict(classifier="gap", num_register_tokens=2, fc_norm=True, position_interpolation="bicubic"),
    "map_uint8": dict(classifier="map", num_register_tokens=1, input_dtype="uint8", input_mode="imagenet"),
}
# two batches of two shapes: (images' (h, w), sequence length); 24x40 is 15 patches, 32x32 16, 56x8 7
BATCHES = [([(24, 40), (8, 8)], 15), ([(32, 32), (56, 8), (16, 16)], 20)]


def _model(config):
    """A tiny NaFlex model, every weight random (the heads too: not zero-initialised)."""
    rng = np.random.default_rng(0)
    model = build_vit(**TINY, **CONFIGS[config], input_shape=(None, None, 3))
    for w in model.weights:
        w.assign(rng.normal(size=w.shape).astype("float32") * 0.2)
    model.class_names = [f"class {i}" for i in range(TINY["classes"])]
    return naflex(model)


def _batch(sizes, seq_len, dtype, seed=0):
    """Images of `sizes` cut into patches (each its own grid) and padded to `seq_len`, random patches and
    coordinates in the padding (the model must mask them)."""
    rng = np.random.default_rng(seed)
    batch = {k: [] for k in ("patches", "patch_coord", "patch_valid")}
    for h, w in sizes:
        image = rng.integers(0, 256, (h, w, 3)) if dtype == "uint8" else rng.uniform(-1, 1, (h, w, 3))
        one = {k: v[0] for k, v in patchify_images(image.astype(dtype)[None], 8).items()}
        pad = seq_len - len(one["patches"])
        fill = {"patches": rng.uniform(0, 255, (pad, 192)).astype(dtype),
                "patch_coord": rng.integers(0, 9, (pad, 2)).astype("int32"), "patch_valid": np.zeros(pad, bool)}
        for k in batch:
            batch[k].append(np.concatenate([one[k], fill[k]]))
    return {k: np.stack(v) for k, v in batch.items()}


def _writes_or_skip(format, config):
    pytest.importorskip(RUNTIMES[format])
    if tensorflows_file(format, naflex=True):
        pytest.importorskip("tensorflow")  # writes it in a fresh process
        if config != "token":
            pytest.skip("written by the TensorFlow backend in a fresh process, as the tensorflow lane writes every "
                        "model; the token classifier tests the way there")


@pytest.mark.parametrize("config", list(CONFIGS))
@pytest.mark.parametrize("format", list(RUNTIMES))
def test_naflex_artefact_equals_keras_at_two_batch_and_sequence_lengths(format, config, tmp_path, caplog):
    _writes_or_skip(format, config)
    flex = _model(config)
    dtype = flex.input["patches"].dtype
    with caplog.at_level(logging.WARNING, logger="keras_vit"):
        path = export(flex, tmp_path / "out", format, top_k=2)
    ours = [r.getMessage() for r in caplog.records if r.name == "keras_vit"]
    assert not ours, ours  # the ONNX rewrites checked on a NaFlex batch, and kept
    assert read_class_names(path) == flex.class_names == tuple(f"class {i}" for i in range(5))
    for i, (sizes, seq_len) in enumerate(BATCHES):
        batch = _batch(sizes, seq_len, dtype, seed=i)
        expected = outputs_of(flex, batch)
        got = run(path, format, batch)
        assert sorted(got) == ["probabilities", "top_k_classes", "top_k_scores"]
        np.testing.assert_allclose(got["probabilities"], expected, atol=1e-5, rtol=0, err_msg=f"{sizes}, {seq_len}")
        np.testing.assert_array_equal(got["top_k_classes"], np.argsort(-expected, axis=-1)[:, :2])
    error, agreement = compare(flex, path, format, batch)
    assert error <= 1e-5 and agreement == 1.0
    assert np.ptp(expected, axis=0).max() > 0.01  # the images give distinct probabilities, far beyond 1e-5
    if format == "onnx":
        import onnxruntime as ort

        session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
        assert {i.name: i.shape for i in session.get_inputs()} == {"patches": ["batch", "tokens", 192],
                                                                   "patch_coord": ["batch", "tokens", 2],
                                                                   "patch_valid": ["batch", "tokens"]}
        assert {o.name: o.shape for o in session.get_outputs()} == {"probabilities": ["batch", 5],
                                                                    "top_k_classes": ["batch", 2],
                                                                    "top_k_scores": ["batch", 2]}
    other = "float32" if dtype == "uint8" else "float64"
    with pytest.raises(ValueError, match=f"the artefact takes {dtype} patches, got {other}"):
        run(path, format, dict(batch, patches=batch["patches"].astype(other)))
    with pytest.raises(ValueError, match=r"the artefact takes a dict with keys \('patches', 'patch_coord', "):
        run(path, format, {k: batch[k] for k in ("patches", "patch_valid")})
    assert os.listdir(tmp_path) == ["out"]


@once_on_tensorflow("the exporters' shapes are tested above on every lane; int8 and a fixed batch are "
                    "onnxruntime's and the signature's")
def test_int8_naflex_onnx_at_a_fixed_batch(tmp_path):
    onnx = pytest.importorskip("onnx")
    pytest.importorskip("onnxruntime")
    flex = _model("token")
    path = export(flex, tmp_path / "int8", "onnx", quantize="int8", batch_size=2)
    graph = onnx.load(path).graph
    assert "MatMulInteger" in {n.op_type for n in graph.node}
    assert [d.dim_value or d.dim_param for d in graph.input[0].type.tensor_type.shape.dim][:2] == [2, "tokens"]
    for sizes, seq_len in ([(24, 40), (8, 8)], 15), ([(16, 16), (8, 56)], 9):
        batch = _batch(sizes, seq_len, "float32")
        np.testing.assert_allclose(run(path, "onnx", batch)["probabilities"],
                                   flex.predict_on_batch(batch), atol=0.05, rtol=0)
    with pytest.raises(Exception, match="(?i)invalid dimensions for input"):
        run(path, "onnx", _batch([(8, 8)] * 3, 4, "float32"))


@pytest.mark.backend_independent
def test_litert_and_the_options_on_images_are_refused_before_writing(tmp_path, monkeypatch):
    flex = _model("token")
    refused = [
        (dict(format="litert"), r"^a NaFlex model \(patches, patch_coord, patch_valid in\) cannot be exported to "
                                r"litert: .*\(FlexStridedSlice\).*; expected one of tf_saved_model, onnx$"),
        (dict(format="onnx", input_mode="imagenet"), r"^input_mode='imagenet': model 'vit' is a NaFlex model"),
        (dict(format="tf_saved_model", resize_to=32), r"^resize_to=32: model 'vit' is a NaFlex model"),
        (dict(format="onnx", quantize="int8", calibration=np.zeros((2, 32, 32, 3), np.uint8)),
         r"^calibration: model 'vit' is a NaFlex model, .* quantize='int8' without calibration"),
    ]
    for kwargs, match in refused:
        with pytest.raises(ValueError, match=match):
            export(flex, tmp_path / "out", **kwargs)
    assert os.listdir(tmp_path) == [] and set(NAFLEX_REFUSED) == {"litert"}
    # which backend writes what: jax's ONNX through TensorFlow, everything else as for any model
    assert {(b, f) for b in ("tensorflow", "jax", "torch") for f in RUNTIMES
            if writer(b, f, naflex=True) != b} == {("jax", "onnx"), ("torch", "tf_saved_model")}
    assert set(THROUGH_TENSORFLOW_NAFLEX) == {("jax", "onnx")} and writer("jax", "onnx") == "jax"
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "tensorflow" else real(name, *a))
    with pytest.raises(MissingPackageError, match=r"^onnx from the jax backend of a NaFlex model, written from the "
                       r"TensorFlow backend in a separate process \(jax2onnx 0.17 .*\), needs tensorflow, which is not "
                       r"installed: pip install \"keras-vit\[tensorflow\]\""):
        check_format("jax", "onnx", naflex=True)
    check_format("torch", "onnx", naflex=True)


@once_on_tensorflow("the CLI's NaFlex path: the exporters are tested above on every lane")
def test_cli_exports_a_naflex_model_file_and_checks_it_on_naflex_sequences(tmp_path, capsys):
    """`keras-vit export --weights model.keras` of a NaFlex model (what `keras-vit finetune --naflex` saves)."""
    from keras_vit import cli

    model = build_vit(image_size=32, patch_size=8, hidden_size=32, mlp_dim=64, num_heads=4, num_layers=2, classes=5,
                      input_dtype="uint8", naflex=True)
    for i, w in enumerate(model.weights):
        w.assign(np.random.default_rng(i).normal(size=w.shape).astype("float32") * 0.2)
    model.save(tmp_path / "flex.keras")
    assert cli.main(["export", "--weights", str(tmp_path / "flex.keras"), "--format", "onnx",
                     "--out", str(tmp_path / "out")]) in (0, None)
    printed = capsys.readouterr().out
    assert "checked against Keras on 2 random NaFlex sequences (grids 3x5 and 4x4, padded to 16)" in printed
    error = float(printed.split("max |difference| ")[1].split(",")[0])
    assert error <= 1e-5
    batch = {k: v for k, v in patchify_images(np.zeros((1, 16, 24, 3), "uint8"), 8).items()}
    assert run(str(tmp_path / "out" / "model.onnx"), "onnx", batch)["probabilities"].shape == (1, 5)
