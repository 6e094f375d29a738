"""Any input, any output (issue 12): runtime resolution, keras.applications' input_shape/pooling,
intermediate features, FlexiViT patch resizing."""

import keras
import numpy as np
import pytest
from conftest import OFFICIAL, TINY, backend, case_config

import keras_vit
from keras_vit import VisionTransformer, feature_extractor, resize_patch_embedding
from keras_vit.layers import PatchEncoder, resize_position_embeddings
from keras_vit.patch_resize import bilinear_resize_matrix
from keras_vit.weights import read_npz

TOKEN = OFFICIAL / "vit_tiny_token.npz"
HYBRID = OFFICIAL / "hybrid_tiny.npz"
ARCH = {k: v for k, v in TINY.items() if k not in ("image_size", "classes")}
# a map output shows every token's error, a head (zero-initialised) would hide it
MAP = dict(ARCH, include_top=False, pooling=None)


def _np(x):
    return keras.ops.convert_to_numpy(x)


def _run(model, x):
    """One compiled call (on JAX much faster than op-by-op eager for a new shape)."""
    return model.predict(x, batch_size=len(x), verbose=0)


def _images(shape, seed=0):
    return np.random.default_rng(seed).uniform(-1, 1, shape).astype("float32")


def _copy_into_fixed(dynamic, fixed):
    """`dynamic`'s weights into `fixed`, the position embeddings resized at load by the numpy rule."""
    old = dynamic.get_layer("posembed_input").grid_size
    for src, dst in zip(dynamic.layers, fixed.layers):
        values = [_np(v) for v in src.weights]
        if src.name == "posembed_input":
            values = [resize_position_embeddings(values[0], dst.grid_size, old_grid=old,
                                                 num_prefix_tokens=dst.num_prefix_tokens)]
        dst.set_weights(values)


# ---------------------------------------------------------------- runtime resolution


@pytest.mark.parametrize("classifier", ["token", "gap"])
def test_runtime_resolution_equals_a_model_built_at_each_size(classifier):
    assert VisionTransformer(image_size=None, **MAP).get_layer("posembed_input").grid_size == (28, 28)  # 224 px
    dynamic = VisionTransformer(image_size=32, input_shape=(None, None, 3), **MAP, classifier=classifier)
    assert dynamic.input_shape == (None, None, None, 3)
    for hw in [(32, 32), (24, 48), (8, 16)]:
        fixed = VisionTransformer(image_size=hw, **MAP, classifier=classifier)
        _copy_into_fixed(dynamic, fixed)
        x = _images((2, *hw, 3))
        got, want = _run(dynamic, x), _run(fixed, x)
        assert got.shape == (2, hw[0] // 8, hw[1] // 8, 32)
        np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)


@pytest.mark.parametrize("case", ["vit_tiny_token", "hybrid_tiny"])
def test_runtime_resolution_matches_the_official_outputs_at_the_resized_resolution(case):
    """One model taking any size gives the official logits at the checkpoint's size and at the
    resized one (where the official code resized the position embeddings at load)."""
    config = case_config(case)
    size = config.pop("image_size")
    model = VisionTransformer(**config, input_shape=(None, None, 3), image_size=size, classifier_activation=None,
                              weights=str(OFFICIAL / f"{case}.npz"))
    expected = np.load(OFFICIAL / f"{case}.expected.npz", allow_pickle=False)
    np.testing.assert_allclose(_run(model, expected["x"]), expected["logits"], atol=1e-5, rtol=0)
    np.testing.assert_allclose(_run(model, expected["x_resized"]), expected["logits_resized"], atol=1e-5, rtol=0)


def test_none_size_model_keeps_the_grid_of_the_npz_it_loads():
    config = case_config("vit_tiny_token")
    del config["image_size"]
    model = VisionTransformer(**config, image_size=None, weights=str(TOKEN))
    file_posemb = read_npz(TOKEN)["Transformer/posembed_input/pos_embedding"]
    layer = model.get_layer("posembed_input")
    assert layer.grid_size == (4, 4)
    np.testing.assert_array_equal(_np(layer.pos_embedding), file_posemb)


def test_runtime_resolution_under_jit_and_after_keras_reload(tmp_path):
    model = VisionTransformer(image_size=32, input_shape=(None, None, 3), **MAP)
    eager = {hw: _np(model(_images((2, *hw, 3)))) for hw in [(32, 32), (40, 24)]}
    model.compile(jit_compile=True if backend() != "torch" else False)
    for hw, want in eager.items():  # one compiled predict function per shape
        np.testing.assert_allclose(model.predict(_images((2, *hw, 3)), verbose=0), want, atol=1e-5, rtol=0)
    path = tmp_path / "dynamic.keras"
    model.save(path)
    loaded = keras.models.load_model(path, safe_mode=True)
    assert loaded.get_layer("posembed_input").get_config() == model.get_layer("posembed_input").get_config()
    for hw, want in eager.items():
        np.testing.assert_allclose(_np(loaded(_images((2, *hw, 3)))), want, atol=1e-5, rtol=0)


@pytest.mark.skipif(backend() != "tensorflow", reason="tf.function with unknown height and width")
def test_traceable_with_unknown_height_and_width_on_tensorflow():
    import tensorflow as tf

    model = VisionTransformer(image_size=32, input_shape=(None, None, 3), **MAP)
    fn = tf.function(model, input_signature=[tf.TensorSpec((None, None, None, 3), tf.float32)], jit_compile=False)
    graph = fn.get_concrete_function()
    assert graph.outputs[0].shape.as_list() == [None, None, None, 32]
    for hw in [(32, 32), (48, 16)]:
        x = _images((2, *hw, 3))
        np.testing.assert_allclose(graph(tf.constant(x)).numpy(), _np(model(x)), atol=1e-5, rtol=0)


def test_sizes_that_do_not_tile_and_wrong_channels_raise_clearly():
    model = VisionTransformer(image_size=None, **MAP)
    with pytest.raises(ValueError, match=r"height 36 is not divisible by (patch_size )?8"):
        model(_images((1, 36, 32, 3)))
    with pytest.raises(ValueError, match=r"the model takes images with 3 channels \(RGB\) on the last axis, got a batch of shape \(1, 32, 32, 1\) with 1"):
        model(_images((1, 32, 32, 1)))
    with pytest.raises(ValueError, match=r"input width 20 is not divisible by 8"):
        VisionTransformer(input_shape=(None, 20, 3), image_size=None, **MAP)
    hybrid = dict(case_config("hybrid_tiny"), image_size=None)
    with pytest.raises(ValueError, match=r"input height 42 is not divisible by 4 pixels per token"):
        VisionTransformer(**hybrid, input_shape=(42, None, 3))


# ---------------------------------------------------------------- input_shape and pooling


def test_input_shape_agrees_with_image_size_or_raises():
    assert VisionTransformer(input_shape=(48, 32, 3), image_size=None, **ARCH).input_shape == (None, 48, 32, 3)
    assert VisionTransformer(input_shape=(48, 32, 3), image_size=(48, 32), **ARCH).input_shape == (None, 48, 32, 3)
    model = VisionTransformer(input_shape=(None, 32, 3), image_size=(48, 32), **ARCH)
    assert model.get_layer("posembed_input").grid_size == (6, 4)  # the stored grid
    with pytest.raises(ValueError, match=r"input_shape \(48, 32, 3\) disagrees with image_size \(32, 32\)"):
        VisionTransformer(input_shape=(48, 32, 3), image_size=32, **ARCH)
    for bad in [(32, 32), (32, 32, None), (0, 32, 3), "32"]:
        with pytest.raises(ValueError, match="input_shape must be"):
            VisionTransformer(input_shape=bad, **ARCH)


@pytest.mark.parametrize("classifier", ["token", "gap"])
def test_pooling_options_are_views_of_the_final_tokens(classifier):
    x = _images((2, 32, 40, 3))
    kw = dict(ARCH, image_size=(32, 40), include_top=False, classifier=classifier)
    maps = VisionTransformer(**kw, pooling=None)
    prefix = int(classifier == "token")
    ln_tokens = keras.Model(maps.input, maps.get_layer("encoder_norm").output)(x)
    got_map = _np(maps(x))
    assert got_map.shape == (2, 4, 5, 32)
    np.testing.assert_array_equal(got_map.reshape(2, 20, 32), _np(ln_tokens)[:, prefix:])
    pooled = {}
    for pooling in ["representation", "avg"] + (["token"] if prefix else []):
        model = VisionTransformer(**kw, pooling=pooling)
        model.set_weights(maps.get_weights())
        pooled[pooling] = _np(model(x))
    np.testing.assert_allclose(pooled["avg"], got_map.mean(axis=(1, 2)), atol=1e-5, rtol=0)
    if prefix:
        np.testing.assert_array_equal(pooled["token"], _np(ln_tokens)[:, 0])
        np.testing.assert_array_equal(pooled["representation"], pooled["token"])  # today's y = LN(z_L^0)
    else:
        np.testing.assert_allclose(pooled["representation"], pooled["avg"], atol=1e-6, rtol=0)


def test_default_pooling_is_the_representation_the_head_reads():
    """Backward compatible: include_top=False still returns the pooled vector (with pre-logits)."""
    config = case_config("vit_tiny_prelogits")
    features = VisionTransformer(**config, include_top=False, weights=str(OFFICIAL / "vit_tiny_prelogits.npz"))
    assert features.output_shape == (None, 24)
    full = VisionTransformer(**config, weights=str(OFFICIAL / "vit_tiny_prelogits.npz"), classifier_activation=None)
    x = np.load(OFFICIAL / "vit_tiny_prelogits.expected.npz", allow_pickle=False)["x"]
    head = full.get_layer("head")
    np.testing.assert_allclose(_np(head(features(x))), _np(full(x)), atol=1e-5, rtol=0)


def test_bad_pooling_raises_clearly():
    with pytest.raises(ValueError, match="pooling='token' is for include_top=False"):
        VisionTransformer(**TINY, pooling="token")
    with pytest.raises(ValueError, match="unknown pooling 'max'"):
        VisionTransformer(**TINY, include_top=False, pooling="max")
    with pytest.raises(ValueError, match='pooling="token" needs a class token'):
        VisionTransformer(**TINY, include_top=False, classifier="gap", pooling="token")
    with pytest.raises(ValueError, match="representation_size .* goes with pooling='representation'"):
        VisionTransformer(**TINY, include_top=False, pooling=None, representation_size=16)


def test_factory_takes_input_shape_pooling_and_patch_size(tmp_path):
    src = keras_vit.ViT_Ti16(image_size=32, classes=3)
    path = str(tmp_path / "ti16.npz")
    keras_vit.weights.save_npz(src, path)
    dynamic = keras_vit.ViT_Ti16(weights=path, input_shape=(None, None, 3), include_top=False, pooling=None)
    assert dynamic.get_layer("posembed_input").grid_size == (2, 2)  # the file's grid
    assert _np(dynamic(_images((1, 48, 64, 3)))).shape == (1, 3, 4, 192)
    flexi = keras_vit.ViT_Ti16(weights=path, patch_size=8, include_top=False, input_shape=(32, 32, 3))
    assert flexi.get_layer("posembed_input").grid_size == (4, 4)  # the file's 32 px on 8 px patches
    kernel = read_npz(path)["embedding/kernel"]
    np.testing.assert_allclose(_np(flexi.get_layer("embedding").kernel), resize_patch_embedding(kernel, 8),
                               atol=1e-7, rtol=0)
    with pytest.raises(ValueError, match="patch_size must be a positive int, got 0"):
        keras_vit.ViT_Ti16(patch_size=0)


# ---------------------------------------------------------------- intermediate features


def _tokens_by_hand(model, x, upto):
    """The residual stream after each block, running the model's layers one by one."""
    parts = keras_vit.weights.find_vit(model)
    t = parts.embedding(x)
    if parts.cls is not None:
        t = parts.cls(t)
    t = parts.posembed(t) if parts.posembed.stride is None else parts.posembed(t, x)
    out = []
    for block in parts.blocks[: upto + 1]:
        t = block(t)
        out.append(_np(t))
    return out


@pytest.mark.parametrize("size", [32, None])
def test_feature_extractor_returns_the_blocks_outputs(size):
    model = VisionTransformer(**dict(TINY, num_layers=3, image_size=size))
    x = _images((2, 32, 32 if size else 48, 3))
    want = _tokens_by_hand(model, x, 2)
    tokens = feature_extractor(model, [0, -1], output="tokens")
    got = [_np(t) for t in tokens(x)]
    np.testing.assert_allclose(got[0], want[0], atol=1e-5, rtol=0)
    np.testing.assert_allclose(got[1], want[2], atol=1e-5, rtol=0)
    assert {id(v) for v in tokens.weights} <= {id(v) for v in model.weights}  # the same layers, nothing copied
    maps = feature_extractor(model, [1], output="maps")
    got = _np(maps(x)[0] if isinstance(maps(x), (list, tuple)) else maps(x))
    np.testing.assert_allclose(got, want[1][:, 1:].reshape(2, 4, x.shape[2] // 8, 32), atol=1e-5, rtol=0)


def test_feature_extractor_of_a_nested_vit_takes_the_outer_inputs():
    vit = VisionTransformer(**TINY)
    inputs = keras.Input((32, 32, 3))
    outer = keras.Model(inputs, keras.layers.Dense(2)(vit(keras.layers.Rescaling(2.0)(inputs))))
    x = _images((2, 32, 32, 3)) / 2
    got = feature_extractor(outer, 1)
    assert got.input_shape == (None, 32, 32, 3)
    np.testing.assert_allclose(_np(got(x)), _tokens_by_hand(vit, 2 * x, 1)[1], atol=1e-5, rtol=0)


def test_feature_extractor_bad_arguments_raise_clearly():
    model = VisionTransformer(**TINY)
    with pytest.raises(ValueError, match=r"block index 2 is out of range: the ViT has 2 encoder blocks, indices 0..1"):
        feature_extractor(model, [0, 2])
    with pytest.raises(ValueError, match="block index -3 is out of range"):
        feature_extractor(model, -3)
    with pytest.raises(ValueError, match="unknown output 'map'"):
        feature_extractor(model, 0, output="map")
    with pytest.raises(ValueError, match="blocks is empty"):
        feature_extractor(model, [])


# ---------------------------------------------------------------- FlexiViT


def _jax_resize_matrix(old, new):
    """Columns: jax.image.resize of each basis vector (an independent bilinear implementation), in
    float64 (the pseudo-inverse of a shrinking resize amplifies float32 rounding)."""
    jax = pytest.importorskip("jax")
    with jax.enable_x64(True):
        return np.stack([np.asarray(jax.image.resize(np.eye(old, dtype="float64")[k], (new,), "bilinear"))
                         for k in range(old)], axis=1)


@pytest.mark.backend_independent
@pytest.mark.parametrize("old,new", [(4, 8), (8, 4), (4, 6), (6, 5), (16, 8), (3, 7)])
def test_bilinear_resize_matrix_is_jax_image_resize(old, new):
    np.testing.assert_allclose(bilinear_resize_matrix(old, new), _jax_resize_matrix(old, new), atol=1e-12)


@pytest.mark.backend_independent
@pytest.mark.parametrize("old,new", [(4, 8), (4, 6), (8, 4), (6, 5)])
def test_resize_patch_embedding_is_the_pseudo_inverse_formula(old, new):
    rng = np.random.default_rng(old * 10 + new)
    kernel = rng.normal(size=(old, old, 3, 5))
    b = np.kron(_jax_resize_matrix(old, new), _jax_resize_matrix(old, new))  # resizes a flattened patch
    want = np.einsum("nk,kcd->ncd", np.linalg.pinv(b.T), kernel.reshape(old * old, 3, 5)).reshape(new, new, 3, 5)
    np.testing.assert_allclose(resize_patch_embedding(kernel, new), want, atol=1e-9, rtol=0)
    if new >= old:  # enlarging: a patch resized up gives the same token
        patch = rng.normal(size=(old, old, 3))
        jax = pytest.importorskip("jax")
        bigger = np.asarray(jax.image.resize(patch, (new, new, 3), "bilinear"))
        np.testing.assert_allclose(np.einsum("hwc,hwcd->d", bigger, resize_patch_embedding(kernel, new)),
                                   np.einsum("hwc,hwcd->d", patch, kernel), atol=1e-5)


def test_resized_patch_encoder_gives_the_same_tokens_for_upsampled_patches():
    old, new, d = 4, 8, 16
    x = _images((2, 8, 12, 3))  # a 2x3 grid of 4x4 patches
    encoder = PatchEncoder(old, d)
    want = _np(encoder(x))
    resized = PatchEncoder(new, d)
    resized.build((None, 16, 24, 3))
    resized.kernel.assign(resize_patch_embedding(_np(encoder.kernel), new))
    resized.bias.assign(_np(encoder.bias))
    r = bilinear_resize_matrix(old, new)
    patches = x.reshape(2, 2, old, 3, old, 3)  # each patch upsampled on its own
    up = np.einsum("ih,bghkwc,jw->bgikjc", r, patches, r)
    np.testing.assert_allclose(_np(resized(up.reshape(2, 16, 24, 3))), want, atol=1e-5, rtol=0)


def test_checkpoint_loads_into_another_patch_size():
    config = case_config("vit_tiny_token")  # 16 px, 4 px patches
    arrays = read_npz(TOKEN)
    model = VisionTransformer(**dict(config, patch_size=8, image_size=32))  # same 4x4 grid, 8 px patches
    notes = keras_vit.load_weights(model, str(TOKEN))
    assert any("patch embedding resized from 4x4 to 8x8" in n for n in notes)
    np.testing.assert_allclose(_np(model.get_layer("embedding").kernel),
                               resize_patch_embedding(arrays["embedding/kernel"], 8), atol=1e-7, rtol=0)
    # a 16 px image upsampled to 32 px (per patch) gives the official logits of the 16 px image
    expected = np.load(OFFICIAL / "vit_tiny_token.expected.npz", allow_pickle=False)
    r = bilinear_resize_matrix(4, 8)
    x = expected["x"]
    up = np.einsum("ih,bghkwc,jw->bgikjc", r, x.reshape(-1, 4, 4, 4, 4, 3), r).reshape(-1, 32, 32, 3)
    model_logits = keras.Model(model.input, model.get_layer("head").output)
    np.testing.assert_allclose(_np(model_logits(up)), expected["logits"], atol=1e-5, rtol=0)
    # and at another grid: position embeddings resized to it
    model = VisionTransformer(**dict(config, patch_size=2, image_size=16))
    keras_vit.load_weights(model, str(TOKEN))
    np.testing.assert_allclose(_np(model.get_layer("posembed_input").pos_embedding),
                               resize_position_embeddings(arrays["Transformer/posembed_input/pos_embedding"], (8, 8)),
                               atol=1e-7, rtol=0)


@pytest.mark.backend_independent
def test_impossible_patch_sizes_raise_clearly():
    kernel = np.zeros((4, 4, 3, 8))
    for bad in [0, -2, 2.5, True, None]:
        with pytest.raises(ValueError, match=f"new_patch_size must be a positive int, got {bad!r}"):
            resize_patch_embedding(kernel, bad)
    with pytest.raises(ValueError, match=r"shape \(P, P, C, D\), got \(4, 2, 3, 8\)"):
        resize_patch_embedding(np.zeros((4, 2, 3, 8)), 8)
