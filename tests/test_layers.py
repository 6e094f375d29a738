"""Each public layer against an independent numpy/scipy reference, and its config round trip."""

import inspect
import json

import keras
import numpy as np
import pytest
import scipy.ndimage
from reference import block_reference, group_norm, max_pool_same, resnet_stem, std_conv

from keras_vit import layers as L


def _layer_cases():
    return [
        (L.PatchEncoder(4, 8), (2, 8, 12, 3)),
        (L.ClassToken(), (2, 5, 8)),
        (L.AddPositionEmbs((2, 3), num_prefix_tokens=1), (2, 7, 8)),
        (L.AddPositionEmbs((2, 3), num_prefix_tokens=0), (2, 6, 8)),
        (L.MultiHeadDotProductAttention(2, dropout_rate=0.1), (2, 5, 8)),
        (L.TransformerBlock(2, 16, dropout_rate=0.1, attention_dropout_rate=0.2, drop_path_rate=0.1), (2, 5, 8)),
        (L.SequencePooling("gap"), (2, 5, 8)),
        (L.StdConv2D(32, 3, 2), (1, 8, 8, 3)),
        (L.BottleneckUnit(32, strides=2), (1, 8, 8, 32)),
        (L.ResNetStem((1, 1), width_factor=1), (1, 32, 32, 3)),
        (L.CropToPatches(4), (2, 10, 13, 3)),
    ]


@pytest.mark.parametrize("layer,shape", _layer_cases(), ids=lambda v: getattr(v, "name", str(v)))
def test_config_round_trip_and_constructor_args(layer, shape):
    x = np.random.default_rng(0).normal(size=shape).astype("float32")
    y = keras.ops.convert_to_numpy(layer(x))
    config = layer.get_config()
    params = set(inspect.signature(type(layer).__init__).parameters) - {"self", "kwargs"}
    if isinstance(layer, keras.layers.Conv2D):  # StdConv2D forwards every Conv2D argument
        params |= set(inspect.signature(keras.layers.Conv2D.__init__).parameters) - {"self", "kwargs"}
    base = {"name", "trainable", "dtype"}
    assert params <= set(config) and set(config) - params <= base, (params, set(config))
    clone = type(layer).from_config(json.loads(json.dumps(config)))
    assert json.dumps(clone.get_config(), sort_keys=True) == json.dumps(config, sort_keys=True)
    clone.build(shape)
    clone.set_weights(layer.get_weights())
    np.testing.assert_allclose(keras.ops.convert_to_numpy(clone(x)), y, atol=1e-6)


def _conv_reference(images, kernel, bias, p):
    """Strided VALID convolution, written out with loops over output positions."""
    b, h, w, c = images.shape
    out = np.zeros((b, h // p, w // p, kernel.shape[-1]))
    for i in range(h // p):
        for j in range(w // p):
            patch = images[:, i * p:(i + 1) * p, j * p:(j + 1) * p, :]
            out[:, i, j] = np.einsum("bhwc,hwcd->bd", patch, kernel) + bias
    return out.reshape(b, -1, kernel.shape[-1])


def test_crop_to_patches_then_patch_encoder_equals_a_valid_strided_convolution(rng):
    """Sides that are no multiple of the patch (10 x 13 at patch 4): the VALID convolution reads 2 x 3
    patches and never the last 2 rows and 1 column; so do CropToPatches and PatchEncoder."""
    crop, layer = L.CropToPatches(4), L.PatchEncoder(4, 6)
    x = rng.normal(size=(2, 10, 13, 3)).astype("float32")
    cropped = crop(x)
    assert tuple(cropped.shape) == (2, 8, 12, 3) == crop.compute_output_shape((2, 10, 13, 3))
    y = keras.ops.convert_to_numpy(layer(cropped))
    kernel, bias = (keras.ops.convert_to_numpy(w) for w in (layer.kernel, layer.bias))
    np.testing.assert_allclose(y, _conv_reference(x, kernel, bias, 4), atol=1e-5)
    assert crop.compute_output_shape((None, None, 13, 3)) == (None, None, 12, 3)


def test_patch_encoder_equals_strided_convolution_on_non_square_input(rng):
    layer = L.PatchEncoder(4, 6)
    x = rng.normal(size=(2, 8, 12, 3)).astype("float32")
    y = keras.ops.convert_to_numpy(layer(x))
    assert y.shape == (2, 6, 6)  # 2 x 3 grid, row-major
    ref = _conv_reference(x, layer.kernel.numpy(), layer.bias.numpy(), 4)
    np.testing.assert_allclose(y, ref, atol=1e-5)


def test_patch_encoder_rejects_indivisible_size_and_wrong_channels():
    with pytest.raises(ValueError, match="not divisible by patch_size 4"):
        L.PatchEncoder(4, 8).build((None, 10, 8, 3))
    layer = L.PatchEncoder(4, 8)
    layer(np.zeros((1, 8, 8, 3), "float32"))
    with pytest.raises(ValueError, match=r"takes images with 3 channels \(RGB\).*shape \(1, 8, 8, 1\) with 1"):
        layer(np.zeros((1, 8, 8, 1), "float32"))


def test_class_token_prepends_learned_vector(rng):
    layer = L.ClassToken()
    x = rng.normal(size=(3, 4, 5)).astype("float32")
    layer.build(x.shape)
    layer.cls.assign(np.arange(5, dtype="float32").reshape(1, 1, 5))
    y = keras.ops.convert_to_numpy(layer(x))
    assert y.shape == (3, 5, 5)
    np.testing.assert_array_equal(y[:, 0], np.tile(np.arange(5.0), (3, 1)))
    np.testing.assert_array_equal(y[:, 1:], x)


@pytest.mark.backend_independent
@pytest.mark.parametrize("old,new,prefix", [((4, 4), (6, 6), 1), ((4, 4), (3, 7), 1), ((5, 3), (2, 9), 0), ((3, 3), (1, 1), 1)])
def test_resize_position_embeddings_equals_scipy_zoom(rng, old, new, prefix):
    posemb = rng.normal(size=(1, prefix + old[0] * old[1], 5)).astype("float32")
    out = L.resize_position_embeddings(posemb, new, old_grid=old, num_prefix_tokens=prefix)
    grid = posemb[0, prefix:].reshape(*old, 5).astype("float64")
    zoom = (new[0] / old[0], new[1] / old[1], 1)
    ref = scipy.ndimage.zoom(grid, zoom, order=1).reshape(1, -1, 5)
    assert out.shape == (1, prefix + new[0] * new[1], 5)
    np.testing.assert_array_equal(out[:, :prefix], posemb[:, :prefix])
    np.testing.assert_allclose(out[:, prefix:], ref, atol=1e-6)


@pytest.mark.backend_independent
def test_resize_position_embeddings_errors():
    with pytest.raises(ValueError, match="not a square"):
        L.resize_position_embeddings(np.zeros((1, 1 + 6, 4)), (3, 3))
    with pytest.raises(ValueError, match=r"shape \(1, T, D\)"):
        L.resize_position_embeddings(np.zeros((7, 4)), (3, 3))


def test_add_position_embs_rejects_other_token_count():
    with pytest.raises(ValueError, match="expects 10 tokens"):
        L.AddPositionEmbs((3, 3))(np.zeros((1, 17, 4), "float32"))


def test_transformer_block_matches_numpy_reference_on_both_attention_paths(rng):
    block = L.TransformerBlock(num_heads=3, mlp_dim=20)
    x = rng.normal(size=(2, 7, 12)).astype("float32")
    block.build(x.shape)
    params = {k: rng.normal(scale=0.3, size=tuple(v.shape)).astype("float32") for k, v in block.official_weights().items()}
    for key, var in block.official_weights().items():
        var.assign(params[key])
    ref, ref_w = block_reference(x.astype("float64"), params, 3)
    fused = keras.ops.convert_to_numpy(block(x))
    explicit, weights = block(x, return_attention=True)
    np.testing.assert_allclose(fused, ref, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(explicit), ref, rtol=1e-5, atol=1e-5)
    weights = keras.ops.convert_to_numpy(weights)
    assert weights.shape == (2, 3, 7, 7)
    np.testing.assert_allclose(weights, ref_w, atol=1e-5)
    np.testing.assert_allclose(weights.sum(-1), 1.0, atol=1e-5)


@pytest.mark.parametrize("make,tokens", [
    (lambda: L.RelativeBiasAttention(2, (2, 3)), 7),  # BEiT's table, a class token beside the grid
    (lambda: L.RelativeMlpAttention(2, (2, 3), hidden_dim=8, num_prefix_tokens=1), 7),
    (lambda: L.RelativeMultiHeadDotProductAttention(2), 5),  # Table 8's, a bias per query
])
def test_a_logit_bias_rides_the_fused_attention_equal_to_explicit_weights(make, tokens, rng, monkeypatch):
    """An inference call of an attention with a relative position bias runs the fused kernel with the bias as its
    additive mask (SDPA's, XLA's), equal to the path that forms the softmax weights explicitly."""
    from keras_vit.layers import attention

    layer, x = make(), rng.normal(size=(2, tokens, 8)).astype("float32")
    layer.build(x.shape)
    for w in layer.weights:
        w.assign(rng.normal(scale=0.5, size=tuple(w.shape)).astype("float32"))
    biases, fused = [], attention._fused_attention
    monkeypatch.setattr(attention, "_fused_attention", lambda *a: biases.append(a[-1]) or fused(*a))
    y = keras.ops.convert_to_numpy(layer(x, training=False))
    explicit, _ = layer(x, training=False, return_attention=True)
    assert len(biases) == 1 and biases[0] is not None
    np.testing.assert_allclose(y, keras.ops.convert_to_numpy(explicit), rtol=1e-5, atol=1e-6)


def test_dropout_acts_only_in_training(rng):
    block = L.TransformerBlock(num_heads=2, mlp_dim=16, dropout_rate=0.5, attention_dropout_rate=0.5)
    x = rng.normal(size=(2, 5, 8)).astype("float32")
    a, b = (keras.ops.convert_to_numpy(block(x, training=False)) for _ in range(2))
    np.testing.assert_array_equal(a, b)
    c = keras.ops.convert_to_numpy(block(x, training=True))
    assert np.abs(c - a).max() > 1e-3


def test_std_conv_standardises_each_output_channel(rng):
    kernel = rng.normal(loc=2.0, scale=3.0, size=(3, 3, 4, 5)).astype("float32")
    w = keras.ops.convert_to_numpy(L.standardize_kernel(kernel))
    ref = (kernel - kernel.mean((0, 1, 2))) / (kernel.std((0, 1, 2)) + 1e-5)
    np.testing.assert_allclose(w, ref, atol=1e-5)


def _randomise(variables, rng):
    """Random values for every variable (GroupNorm scales away from 1, gn3's zero init included)."""
    values = {}
    for key, var in variables.items():
        value = rng.normal(size=tuple(var.shape)).astype("float32")
        if "/scale" in key or key.endswith("gamma"):
            value = 1.0 + 0.3 * value
        var.assign(value)
        values[key] = value
    return values


@pytest.mark.parametrize("kernel,strides,size", [(3, 2, (9, 12)), (7, 2, (16, 15)), (1, 2, (7, 8)), (3, 1, (6, 5))])
def test_std_conv_equals_numpy_weight_standardised_same_convolution(rng, kernel, strides, size):
    layer = L.StdConv2D(8, kernel, strides)
    x = rng.normal(size=(2, *size, 3)).astype("float32")
    layer.build(x.shape)
    w = _randomise({"kernel": layer.kernel}, rng)["kernel"] * 3 + 1  # off-centre: standardisation matters
    layer.kernel.assign(w)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(layer(x)), std_conv(x.astype("float64"), w, strides), rtol=1e-5, atol=1e-5)


def test_group_norm_of_the_stem_equals_numpy(rng):
    stem = L.ResNetStem((1,), width_factor=1)
    stem.build((None, 16, 16, 3))
    gn = stem.gn_root
    p = _randomise({"scale": gn.gamma, "bias": gn.beta}, rng)
    for scale in (3.0, 1e-3):  # at variance ~1e-6 the epsilon (official 1e-6) shows
        x = rng.normal(loc=scale, scale=scale, size=(2, 5, 6, 64)).astype("float32")
        y = keras.ops.convert_to_numpy(gn(x))
        np.testing.assert_allclose(y, group_norm(x.astype("float64"), p["scale"], p["bias"]), rtol=1e-5, atol=1e-5)


@pytest.mark.backend_independent
def test_max_pool_reference_pads_with_minus_infinity():
    x = -np.arange(1.0, 26.0).reshape(1, 5, 5, 1)  # all negative: a zero pad would win every edge window
    # 5 -> 3 windows of 3 at stride 2: one padded row/column on each side, windows start at -1, 1, 3
    np.testing.assert_array_equal(max_pool_same(x)[0, :, :, 0], [[-1, -2, -4], [-6, -7, -9], [-16, -17, -19]])


@pytest.mark.parametrize("num_layers,size", [((1, 2), (32, 32)), ((2,), (30, 34))])
def test_resnet_stem_equals_numpy_reference(rng, num_layers, size):
    stem = L.ResNetStem(num_layers, width_factor=1)
    x = rng.uniform(-1, 1, size=(2, *size, 3)).astype("float32")
    stem.build(x.shape)
    p = _randomise(stem.official_weights(), rng)
    y = keras.ops.convert_to_numpy(stem(x))
    ref = resnet_stem(x.astype("float64"), p, num_layers)
    assert y.shape == ref.shape == (2, -(-size[0] // stem.stride), -(-size[1] // stem.stride), stem.output_channels)
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-5 * np.abs(ref).max())


def test_resnet_stem_stride_and_channels():
    stem = L.ResNetStem((2, 1, 1), width_factor=1)
    y = stem(np.zeros((1, 64, 48, 3), "float32"))
    assert tuple(y.shape) == (1, 4, 3, 1024) and stem.stride == 16
    assert tuple(stem.compute_output_shape((1, 64, 48, 3))) == (1, 4, 3, 1024)


def test_pooling_rejects_unknown_method():
    with pytest.raises(ValueError, match="expected one of"):
        L.SequencePooling("max")
