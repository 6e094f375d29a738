"""An inference call on the torch backend runs each node's own `call`, without Keras' layer call around it
(`keras_vit.vit_model.ViTModel.call`): the same outputs, bit for bit, as Keras' functional call for every
kind of model, and Keras' call wherever a layer needs it (a mixed policy, a quantized kernel, training)."""

import keras
import numpy as np
import pytest
from conftest import TINY, backend

import keras_vit
from keras_vit import vit_model
from keras_vit.features import feature_extractor
from keras_vit.naflex import naflex, patchify_images
from keras_vit.vit_model import ViTModel

pytestmark = pytest.mark.skipif(backend() != "torch", reason="the direct inference call is the torch backend's")


def _images(h, w, n=2, dtype="float32"):
    x = np.random.default_rng(0).uniform(-1, 1, (n, h, w, 3))
    return (x * 127 + 128).astype("uint8") if dtype == "uint8" else x.astype(dtype)


def _keras(model, x):
    """Keras' functional call: every node through its layer call."""
    return keras.tree.map_structure(keras.ops.convert_to_numpy, super(ViTModel, model).call(x, training=False))


def _direct(model, x, monkeypatch):
    """`model(x)`, asserting that it ran the nodes' own calls."""
    ran = []
    own = vit_model._own_call
    monkeypatch.setattr(vit_model, "_own_call", lambda op: ran.append(op) or own(op))
    out = keras.tree.map_structure(keras.ops.convert_to_numpy, model(x, training=False))
    monkeypatch.setattr(vit_model, "_own_call", own)
    return out, len(ran)


def _same(model, x, monkeypatch):
    ours, nodes = _direct(model, x, monkeypatch)
    assert nodes >= TINY["num_layers"], nodes
    keras.tree.map_structure(np.testing.assert_array_equal, ours, _keras(model, x))


@pytest.mark.parametrize("kind", ["classifier", "tokens", "uint8", "hybrid", "any_size", "features", "naflex"])
def test_an_inference_call_runs_the_nodes_directly_to_keras_outputs(kind, monkeypatch):
    args = dict(TINY, classifier_activation="softmax")
    if kind == "tokens":
        args.update(include_top=False, pooling=None, num_register_tokens=2)
    elif kind == "uint8":
        args.update(input_dtype="uint8")
    elif kind == "hybrid":
        args.update(patch_size=1, resnet={"num_layers": (1,), "width_factor": 1})
    model = keras_vit.VisionTransformer(**args)
    x = _images(32, 32, dtype="uint8" if kind == "uint8" else "float32")
    if kind == "any_size":
        model = keras_vit.any_size(model)
        _same(model, _images(48, 24), monkeypatch)
    elif kind == "features":
        model = feature_extractor(model, [0, 1])
    elif kind == "naflex":
        model = naflex(model)
        x = patchify_images(_images(24, 40), TINY["patch_size"])
    _same(model, x, monkeypatch)


def test_keras_call_runs_where_a_layer_needs_it(monkeypatch):
    """A mixed policy and a quantized model take Keras' layer calls (casts, the int8 kernels), as training does."""
    x = _images(32, 32)
    keras.mixed_precision.set_global_policy("mixed_bfloat16")
    try:
        mixed = keras_vit.VisionTransformer(**TINY)
    finally:
        keras.mixed_precision.set_global_policy("float32")
    quantized = keras_vit.VisionTransformer(**TINY)
    quantized.quantize("int8")
    for model in (mixed, quantized):
        ours, nodes = _direct(model, x, monkeypatch)
        assert nodes == 0
        np.testing.assert_array_equal(ours, _keras(model, x))
    plain = keras_vit.VisionTransformer(**TINY, dropout_rate=0.5)
    ran = []
    own = vit_model._own_call
    monkeypatch.setattr(vit_model, "_own_call", lambda op: ran.append(op) or own(op))
    plain(x, training=True)
    assert ran == []
