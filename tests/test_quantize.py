"""Keras' int8 quantization on keras-vit models: every Dense/EinsumDense of the encoder (the
q/k/v/out projections that the fused path reads included) runs int8, and a `.keras` file reloads
the quantized model with the same outputs."""

import os

import keras
import numpy as np
import pytest

import keras_vit
from conftest import TINY

CASES = {
    "token": dict(TINY),
    "gap_pre_logits": dict(TINY, classifier="gap", representation_size=16),
    "hybrid": dict(TINY, patch_size=2, resnet={"num_layers": (1,), "width_factor": 1}),
    "hf_numerics": dict(TINY, approximate_gelu=False, layer_norm_epsilon=1e-12),
}


@pytest.fixture(autouse=True)
def _one_collection_per_variable_skipped(monkeypatch):
    """Keras' quantize runs gc.collect() after each float kernel it drops (about 75 for ViT-Ti/16): a full
    collection of the whole test session's heap every time, which late in a suite took 1.5 s each (118 s
    for one test). What these tests assert (outputs, modes, file sizes) does not depend on when the
    dropped kernels' memory is returned."""
    import gc

    monkeypatch.setattr(gc, "collect", lambda generation=2: 0)


def _randomised(model):
    for i, var in enumerate(model.weights):
        var.assign(np.random.default_rng(i).normal(0, 0.2, var.shape).astype("float32"))
    return model


@pytest.mark.parametrize("case", CASES)
def test_int8_quantized_model_is_close_and_reloads_exactly(case, tmp_path):
    model = _randomised(keras_vit.VisionTransformer(**CASES[case], classifier_activation=None))
    x = np.random.default_rng(0).uniform(-1, 1, (2, 32, 32, 3)).astype("float32")
    reference = keras.ops.convert_to_numpy(model(x))
    model.quantize("int8")
    projections = [layer for layer in model._flatten_layers() if isinstance(layer, (keras.layers.Dense,
                                                                                    keras.layers.EinsumDense))]
    assert len(projections) >= 6 * TINY["num_layers"] + 1
    assert all(layer.quantization_mode == "int8" for layer in projections)
    quantized = keras.ops.convert_to_numpy(model(x))
    error = np.abs(quantized - reference).max() / np.abs(reference).max()
    assert 0 < error < 0.05, error  # int8 rounding, not the float model and not garbage
    path = tmp_path / "int8.keras"
    model.save(path)
    reloaded = keras.saving.load_model(path, safe_mode=True)
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(reloaded(x)), quantized)
    assert reloaded.get_layer("encoderblock_0").attention.query.quantization_mode == "int8"


@pytest.mark.backend_independent  # the same variables are saved whatever computes them
def test_int8_factory_file_is_about_four_times_smaller(tmp_path):
    model = keras_vit.ViT_Ti16(image_size=32, classes=10)
    model.save(tmp_path / "float.keras")
    model.quantize("int8")
    model.save(tmp_path / "int8.keras")
    ratio = os.path.getsize(tmp_path / "float.keras") / os.path.getsize(tmp_path / "int8.keras")
    assert 3.3 < ratio < 4.1, ratio
