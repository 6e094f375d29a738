"""Inputs a new user gets wrong: each gets one error naming what was expected and what came."""

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
