"""Position-embedding resize rules of the weights' sources (keras_vit.interpolation.POSITION_INTERPOLATIONS):
the numpy matrices against torch's F.interpolate itself, the load-time resize against timm's
`resample_abs_pos_embed` and Hugging Face's `interpolate_pos_encoding`, the call-time keras.ops
matrices against the numpy ones, and the layer's `interpolation` through a save and reload."""

import os
import sys

import keras
import numpy as np
import pytest
from conftest import backend

from keras_vit.interpolation import POSITION_INTERPOLATIONS, resize_2d, resize_matrix
from keras_vit.layers import AddPositionEmbs, resize_position_embeddings

try:  # before timm's torchvision stand-in (_timm_resample): transformers notes torchvision's presence on import
    import transformers
except ImportError:
    transformers = None

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# each rule as the torch call that defines it
TORCH_CALLS = {
    "bilinear": dict(mode="bilinear", align_corners=True),
    "bilinear_half_pixel": dict(mode="bilinear", align_corners=False),
    "bicubic": dict(mode="bicubic", align_corners=False),
    "bicubic_antialias": dict(mode="bicubic", align_corners=False, antialias=True),
    "bilinear_antialias": dict(mode="bilinear", align_corners=False, antialias=True),
}
# up, down, square, not square, from and to a single position. Not (h, 1) -> (h', 1) for
# "bicubic_antialias": torch 2.13's CPU antialias kernel gives every output row the first row's
# weights when an axis of size 1 keeps its size, a torch quirk this module does not copy.
GRIDS = [((7, 7), (10, 10)), ((16, 16), (37, 37)), ((37, 37), (16, 16)), ((14, 14), (10, 20)),
         ((5, 9), (12, 4)), ((1, 1), (3, 3)), ((3, 3), (1, 1))]


def _torch_resize(grid, size, method, dtype):
    """(h, w, c) `grid` resized by torch.nn.functional.interpolate (NCHW) in `dtype`."""
    torch = pytest.importorskip("torch")
    x = torch.tensor(grid, dtype=dtype).permute(2, 0, 1)[None]
    return torch.nn.functional.interpolate(x, size=size, **TORCH_CALLS[method])[0].permute(1, 2, 0).numpy()


def _timm_resample():
    pytest.importorskip("torch")
    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    from timm_peer import import_timm  # timm without torchvision installed

    import_timm()
    from timm.layers import resample_abs_pos_embed

    return resample_abs_pos_embed


@pytest.mark.backend_independent
@pytest.mark.parametrize("method", POSITION_INTERPOLATIONS)
def test_numpy_rules_equal_torch_interpolate(method):
    torch = pytest.importorskip("torch")
    assert set(TORCH_CALLS) == set(POSITION_INTERPOLATIONS)
    for old, new in GRIDS:
        grid = np.random.default_rng(0).normal(size=(*old, 3))
        want = _torch_resize(grid, new, method, torch.float64)
        got = resize_2d(grid, new, method=method)
        np.testing.assert_allclose(got, want, atol=1e-6, rtol=0, err_msg=f"{old}->{new}")


@pytest.mark.backend_independent
def test_every_size_pair_up_to_twenty_equals_torch():
    """Each 1-D matrix, read off torch by resizing the identity (width 2 kept, see GRIDS)."""
    torch = pytest.importorskip("torch")
    worst = 0.0
    for method in POSITION_INTERPOLATIONS:
        for n_in in range(1, 21):
            eye = np.repeat(np.eye(n_in)[:, :, None], 2, axis=2).transpose(1, 2, 0)  # (n_in, 2, n_in)
            for n_out in range(1, 21):
                want = _torch_resize(eye, (n_out, 2), method, torch.float64)[:, 0, :]  # (n_out, n_in)
                worst = max(worst, np.abs(resize_matrix(n_in, n_out, method) - want).max())
    assert worst <= 1e-6


@pytest.mark.backend_independent
def test_rows_sum_to_one_and_an_unchanged_size_is_the_identity():
    for method in POSITION_INTERPOLATIONS:
        for n_in, n_out in [(1, 3), (3, 1), (7, 10), (37, 16)]:
            np.testing.assert_allclose(resize_matrix(n_in, n_out, method).sum(axis=1), 1.0, atol=1e-12)
        np.testing.assert_array_equal(resize_matrix(6, 6, method), np.eye(6))


@pytest.mark.backend_independent
@pytest.mark.parametrize("method, timm_args", [
    ("bicubic_antialias", {}),  # timm's defaults: checkpoint_filter_fn, dynamic_img_size, set_input_size
    ("bicubic", dict(interpolation="bicubic", antialias=False)),
    ("bilinear_half_pixel", dict(interpolation="bilinear", antialias=False)),  # timm's .npz loader
    ("bilinear", dict(interpolation="bilinear", antialias=False, align_corners=True)),
])
def test_load_time_resize_equals_timm_resample_abs_pos_embed(method, timm_args):
    torch = pytest.importorskip("torch")
    resample = _timm_resample()
    rng = np.random.default_rng(1)
    for (old, new), prefix in zip(GRIDS[:5], [1, 0, 5, 1, 1]):
        posemb = rng.normal(size=(1, prefix + old[0] * old[1], 8)).astype("float32")
        want = resample(torch.tensor(posemb), new_size=list(new), old_size=list(old), num_prefix_tokens=prefix,
                        **timm_args).numpy()
        got = resize_position_embeddings(posemb, new, old_grid=old, num_prefix_tokens=prefix, method=method)
        assert got.dtype == np.float32 and got.shape == want.shape
        np.testing.assert_array_equal(got[:, :prefix], posemb[:, :prefix])
        np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)


def _hugging_face_case(model):
    """(embeddings module, its position table, prefix tokens, our rule) of a tiny `model`."""
    arch = dict(image_size=32, patch_size=8, hidden_size=8)  # a 4x4 grid
    if model == "vit":
        embeddings, prefix = transformers.models.vit.modeling_vit.ViTEmbeddings(transformers.ViTConfig(**arch)), 1
        table = embeddings.position_embeddings
    elif model == "siglip":
        embeddings = transformers.models.siglip.modeling_siglip.SiglipVisionEmbeddings(
            transformers.SiglipVisionConfig(**arch))
        table, prefix = embeddings.position_embedding.weight, 0
    else:
        module = transformers.models.dinov2_with_registers.modeling_dinov2_with_registers
        embeddings = module.Dinov2WithRegistersEmbeddings(
            transformers.Dinov2WithRegistersConfig(**arch, num_register_tokens=2))
        table, prefix = embeddings.position_embeddings, 1
    return embeddings, table, prefix, "bicubic_antialias" if model == "dinov2_with_registers" else "bicubic"


@pytest.mark.backend_independent
def test_load_time_resize_equals_hugging_face_interpolate_pos_encoding():
    torch = pytest.importorskip("torch")
    if transformers is None:
        pytest.importorskip("transformers")
    for model in ["vit", "siglip", "dinov2_with_registers"]:
        embeddings, table, prefix, method = _hugging_face_case(model)
        posemb = np.random.default_rng(2).normal(size=(1, prefix + 16, 8)).astype("float32")
        with torch.no_grad():
            table.copy_(torch.tensor(posemb).reshape(table.shape))
            for new in [(7, 7), (3, 9), (2, 2)]:
                tokens = torch.zeros(1, prefix + new[0] * new[1], 8)
                want = embeddings.interpolate_pos_encoding(tokens, new[0] * 8, new[1] * 8).numpy()
                got = resize_position_embeddings(posemb, new, num_prefix_tokens=prefix, method=method)
                np.testing.assert_allclose(got, want, atol=1e-5, rtol=0, err_msg=f"{model} {new}")


def _runtime_layer(method, grid=(5, 5), prefix=1, dim=8, seed=3):
    """A runtime-resolution layer (stride 8) holding N(0, 1) embeddings, and those as numpy."""
    layer = AddPositionEmbs(grid, num_prefix_tokens=prefix, stride=8, interpolation=method)
    layer(np.zeros((1, layer.num_tokens, dim), "float32"), np.zeros((1, grid[0] * 8, grid[1] * 8, 3), "float32"))
    posemb = np.random.default_rng(seed).normal(size=(1, layer.num_tokens, dim)).astype("float32")
    layer.set_weights([posemb])
    return layer, posemb


def _runtime_model(layer):
    tokens, images = keras.Input((None, 8)), keras.Input((None, None, 3))
    return keras.Model([tokens, images], layer(tokens, images))


def test_call_time_ops_resize_equals_the_numpy_resize():
    for method in POSITION_INTERPOLATIONS:
        layer, posemb = _runtime_layer(method)
        model = _runtime_model(layer)  # compiled: one traced call per size (on JAX faster than op by op)
        for new in [(9, 3), (1, 1), (12, 7)]:
            tokens = np.zeros((1, 1 + new[0] * new[1], 8), "float32")
            got = model.predict([tokens, np.zeros((1, new[0] * 8, new[1] * 8, 3), "float32")], verbose=0)
            want = resize_position_embeddings(posemb, new, old_grid=(5, 5), method=method)
            np.testing.assert_allclose(got, want, atol=1e-5, rtol=0, err_msg=f"{method} {new}")


@pytest.mark.skipif(backend() != "tensorflow", reason="sizes as scalar tensors: tf.function with unknown H and W")
def test_call_time_resize_traces_with_unknown_height_and_width_on_tensorflow():
    import tensorflow as tf

    for method in POSITION_INTERPOLATIONS:
        layer, posemb = _runtime_layer(method)
        fn = tf.function(layer, jit_compile=False, input_signature=[
            tf.TensorSpec((1, None, 8), tf.float32), tf.TensorSpec((1, None, None, 3), tf.float32)])
        graph = fn.get_concrete_function()
        for new in [(9, 3), (2, 2)]:
            got = graph(tf.zeros((1, 1 + new[0] * new[1], 8)), tf.zeros((1, new[0] * 8, new[1] * 8, 3))).numpy()
            want = resize_position_embeddings(posemb, new, method=method)
            np.testing.assert_allclose(got, want, atol=1e-5, rtol=0, err_msg=f"{method} {new}")


def test_saved_and_reloaded_layer_keeps_its_interpolation(tmp_path):
    layer, posemb = _runtime_layer("bicubic_antialias")
    model = _runtime_model(layer)
    path = tmp_path / "posemb.keras"
    model.save(path)
    reloaded = keras.models.load_model(path, safe_mode=True)
    loaded = reloaded.layers[-1]
    assert isinstance(loaded, AddPositionEmbs) and loaded.interpolation == "bicubic_antialias"
    assert loaded.get_config() == layer.get_config()
    x = [np.zeros((1, 1 + 27, 8), "float32"), np.zeros((1, 72, 24, 3), "float32")]
    want = resize_position_embeddings(posemb, (9, 3), method="bicubic_antialias")
    np.testing.assert_allclose(reloaded.predict(x, verbose=0), want, atol=1e-5, rtol=0)
    config = {k: v for k, v in layer.get_config().items() if k != "interpolation"}  # saved before the option
    assert AddPositionEmbs.from_config(config).interpolation == "bilinear"  # the official rule, as then


@pytest.mark.backend_independent
def test_resize_official_uses_the_layers_rule():
    posemb = np.random.default_rng(4).normal(size=(1, 1 + 49, 8)).astype("float32")
    for method in POSITION_INTERPOLATIONS:
        layer = AddPositionEmbs((4, 6), interpolation=method)
        np.testing.assert_array_equal(layer.resize_official("pos_embedding", posemb),
                                      resize_position_embeddings(posemb, (4, 6), method=method))


@pytest.mark.backend_independent
def test_unknown_rules_raise_listing_the_choices():
    choices = r"'bilinear', 'bilinear_half_pixel', 'bicubic', 'bicubic_antialias', 'bilinear_antialias'"
    with pytest.raises(ValueError, match=f"AddPositionEmbs interpolation must be one of {choices}; got 'cubic'"):
        AddPositionEmbs((2, 2), interpolation="cubic")
    with pytest.raises(ValueError, match=f"method must be one of {choices}; got 'area'"):
        resize_position_embeddings(np.zeros((1, 5, 4)), (3, 3), method="area")
    with pytest.raises(ValueError, match="interpolation must be one of"):
        resize_matrix(3, 4, "linear")
    with pytest.raises(ValueError, match="fixes its own alignment"):
        resize_2d(np.zeros((2, 2)), (3, 3), align_corners=False, method="bicubic")
