"""preprocess_input and decode_predictions on NumPy arrays and backend tensors."""

import gzip
import importlib.resources

import keras
import numpy as np
import pytest

from keras_vit import preprocessing
from keras_vit.preprocessing import class_names, decode_predictions, preprocess_input


# ---------------------------------------------------------------- preprocess_input

def test_scales_the_endpoints_and_the_midpoint():
    x = np.array([0.0, 127.5, 255.0], np.float32).reshape(1, 1, 3)
    y = preprocess_input(x)
    assert y.dtype == np.float32 and y.shape == (1, 1, 3)
    np.testing.assert_array_equal(y.ravel(), [-1.0, 0.0, 1.0])


def test_uint8_does_not_overflow_and_matches_the_formula():
    x = np.arange(256, dtype=np.uint8)[:255].reshape(5, 17, 3)
    y = preprocess_input(x)
    assert y.dtype == np.float32
    np.testing.assert_allclose(y, (x.astype(np.float64) - 127.5) / 127.5, rtol=0, atol=1e-7)
    assert y.min() == -1.0 and y.max() <= 1.0


def test_does_not_modify_its_input_and_accepts_lists():
    x = np.full((2, 4, 4, 3), 255.0)
    preprocess_input(x)
    assert (x == 255.0).all()
    y = preprocess_input([[[0, 0, 0]]])
    np.testing.assert_array_equal(y, -np.ones((1, 1, 3), np.float32))


@pytest.mark.parametrize("dtype", ["uint8", "float32", "int32"])
def test_backend_tensors(dtype):
    x = np.random.default_rng(0).integers(0, 256, size=(2, 8, 8, 3)).astype(dtype)
    t = keras.ops.convert_to_tensor(x)
    y = preprocess_input(t)
    assert not isinstance(y, np.ndarray)
    assert keras.backend.standardize_dtype(y.dtype) == "float32"
    np.testing.assert_allclose(keras.ops.convert_to_numpy(y), (x.astype(np.float64) - 127.5) / 127.5, atol=1e-6)


def test_symbolic_input_inside_a_functional_model():
    inputs = keras.Input((8, 8, 3), dtype="uint8")
    outputs = preprocess_input(inputs)
    assert tuple(outputs.shape) == (None, 8, 8, 3)
    model = keras.Model(inputs, outputs)
    x = np.array([0, 255, 51], np.uint8) * np.ones((1, 8, 8, 3), np.uint8)
    y = keras.ops.convert_to_numpy(model(x))
    np.testing.assert_allclose(y[0, 0, 0], [-1.0, 1.0, (51 - 127.5) / 127.5], atol=1e-6)


@pytest.mark.parametrize("shape", [(8, 8), (8,), (1, 2, 8, 8, 3)])
def test_wrong_rank_raises(shape):
    with pytest.raises(ValueError, match=r"rank 3 .* or 4 .*got rank"):
        preprocess_input(np.zeros(shape))
    with pytest.raises(ValueError, match="got rank"):
        preprocess_input(keras.ops.zeros(shape))


@pytest.mark.parametrize("shape", [(8, 8, 1), (2, 8, 8, 4), (3, 8, 8)])
def test_wrong_channels_raise(shape):
    with pytest.raises(ValueError, match="3 \\(RGB\\) channels"):
        preprocess_input(np.zeros(shape))
    with pytest.raises(ValueError, match="channels"):
        preprocess_input(keras.ops.zeros(shape))


def test_unknown_channels_of_a_symbolic_input_pass():
    outputs = preprocess_input(keras.Input((8, 8, None)))
    assert tuple(outputs.shape) == (None, 8, 8, None)


def test_non_numeric_input_raises():
    with pytest.raises(TypeError, match="dtype"):
        preprocess_input(np.array([[["a", "b", "c"]]]))


# ---------------------------------------------------------------- class names

@pytest.mark.backend_independent
def test_imagenet1k_names_at_known_indices():
    names = class_names(1000)
    assert len(names) == 1000
    assert names[0] == ("n01440764", "tench, Tinca tinca")
    assert names[1][1].startswith("goldfish")
    assert names[207] == ("n02099601", "golden retriever")
    assert names[281][1].startswith("tabby")
    assert names[999][0] == "n15075141" and names[999][1].startswith("toilet tissue")
    synsets = [s for s, _ in names]
    assert synsets == sorted(synsets) and len(set(synsets)) == 1000  # the standard order is sorted


@pytest.mark.backend_independent
def test_imagenet21k_names_in_google_order():
    names = class_names(21843)
    assert len(names) == 21843
    synsets = [s for s, _ in names]
    assert synsets == sorted(synsets) and len(set(synsets)) == 21843
    assert names[0] == ("n00004475", "organism, being")
    assert names[2264] == ("n02099601", "golden retriever")
    assert names[21842][0] == "n15102894"
    # Google's 21k list lacks the teddy bear synset of ImageNet-1k
    assert "n04399382" not in set(synsets)
    assert set(s for s, _ in class_names(1000)) - set(synsets) == {"n04399382"}


@pytest.mark.backend_independent
def test_names_are_loaded_once_and_cached():
    preprocessing._class_list.cache_clear()
    first = class_names(1000)
    assert class_names(1000) is first
    assert preprocessing._class_list.cache_info().misses == 1


@pytest.mark.backend_independent
def test_shipped_files_have_the_expected_lines():
    data = importlib.resources.files("keras_vit") / "resources"
    lines_1k = data.joinpath("imagenet1k.txt").read_text("utf-8").splitlines()
    lines_21k = gzip.decompress(data.joinpath("imagenet21k.txt.gz").read_bytes()).decode("utf-8").splitlines()
    for lines, count in ((lines_1k, 1000), (lines_21k, 21843)):
        assert len(lines) == count
        for line in lines:
            synset, name = line.split("\t")
            assert len(synset) == 9 and synset[0] == "n" and synset[1:].isdigit() and name


@pytest.mark.backend_independent
def test_unsupported_class_count_for_names():
    with pytest.raises(ValueError, match="1000 .* or 21843"):
        class_names(10)


# ---------------------------------------------------------------- decode_predictions

def test_decode_one_hot_imagenet1k():
    preds = np.zeros((2, 1000), np.float32)
    preds[0, 207] = 1.0
    preds[1, 0] = 0.9
    preds[1, 1] = 0.1
    decoded = decode_predictions(preds, top=2)
    assert len(decoded) == 2 and all(len(d) == 2 for d in decoded)
    assert decoded[0][0] == ("n02099601", "golden retriever", 1.0)
    assert decoded[1][0][:2] == ("n01440764", "tench, Tinca tinca")
    assert decoded[1][0][2] == pytest.approx(0.9)
    assert decoded[1][1][0] == "n01443537" and decoded[1][1][2] == pytest.approx(0.1)
    assert isinstance(decoded[1][1][2], float)


def test_decode_sorts_by_score_and_defaults_to_top5():
    scores = np.random.default_rng(1).random((3, 1000)).astype(np.float32)
    decoded = decode_predictions(scores)
    names = class_names(1000)
    for row, result in zip(scores, decoded):
        assert len(result) == 5
        expected = np.argsort(row)[::-1][:5]
        assert [r[0] for r in result] == [names[i][0] for i in expected]
        assert [r[2] for r in result] == sorted((r[2] for r in result), reverse=True)


def test_decode_imagenet21k_by_width():
    preds = np.zeros((1, 21843), np.float32)
    preds[0, 2264] = 5.0
    preds[0, 0] = 3.0
    decoded = decode_predictions(preds, top=3)
    assert decoded[0][0] == ("n02099601", "golden retriever", 5.0)
    assert decoded[0][1] == ("n00004475", "organism, being", 3.0)
    assert decoded[0][2][2] == 0.0 and decoded[0][2][0] == "n00005787"  # ties keep index order


def test_decode_backend_tensor():
    logits = np.zeros((1, 1000), np.float32)
    logits[0, 281] = 10.0
    probs = keras.ops.softmax(keras.ops.convert_to_tensor(logits), axis=-1)
    (result,) = decode_predictions(probs, top=1)
    assert result[0][0] == class_names(1000)[281][0]
    assert result[0][2] == pytest.approx(float(np.exp(10.0) / (np.exp(10.0) + 999)), rel=1e-5)


def test_top_larger_than_classes_is_clipped():
    decoded = decode_predictions(np.ones((1, 1000)), top=5000)
    assert len(decoded[0]) == 1000


@pytest.mark.parametrize("shape", [(1, 10), (1000,), (2, 1, 1000), (1, 21841)])
def test_decode_rejects_other_shapes(shape):
    with pytest.raises(ValueError, match=r"\(batch, 1000\) or \(batch, 21843\)"):
        decode_predictions(np.zeros(shape))


@pytest.mark.parametrize("top", [0, -1, 2.5, True])
def test_decode_rejects_bad_top(top):
    with pytest.raises(ValueError, match="top"):
        decode_predictions(np.zeros((1, 1000)), top=top)


@pytest.mark.backend_independent
def test_public_api_reexports():
    import keras_vit

    assert keras_vit.preprocess_input is preprocess_input
    assert keras_vit.decode_predictions is decode_predictions
