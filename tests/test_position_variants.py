"""Position-embedding variants of appendix D.4 / Table 8: shapes, parameter counts, equivariance,
save/reload and resizing."""

import keras
import numpy as np
import pytest
from conftest import TINY

from keras_vit import VisionTransformer
from keras_vit.layers.relative_attention import relative_offsets
from keras_vit.structure import find_vit
from keras_vit.weights import load_weights, official_variables, save_npz

VARIANTS = [("none", "once"), ("learned_1d", "once"), ("learned_1d", "every_layer"),
            ("learned_1d", "every_layer_shared"), ("learned_2d", "once"), ("learned_2d", "every_layer"),
            ("learned_2d", "every_layer_shared"), ("relative", "once")]
D, L, GRID, HEADS = TINY["hidden_size"], TINY["num_layers"], 4, TINY["num_heads"]


def _np(x):
    return keras.ops.convert_to_numpy(x)


def _position_params(kind, placement, prefix):
    """Parameters D.4 implies beyond the position-free model."""
    t = prefix + GRID * GRID
    one = {"none": 0, "learned_1d": t * D, "learned_2d": GRID * D // 2 * 2 + prefix * D,
           "relative": L * (2 * t - 1) * D}[kind]
    return one * (L if placement == "every_layer" else 1)


@pytest.mark.parametrize("kind,placement,classifier", [(*v, "token") for v in VARIANTS] + [
    ("learned_1d", "every_layer", "gap"), ("learned_2d", "once", "gap"), ("relative", "once", "gap")])
def test_shapes_parameter_counts_and_reload(kind, placement, classifier, tmp_path, rng):
    args = dict(TINY, classifier=classifier)
    model = VisionTransformer(**args, position_embedding=kind, position_placement=placement)
    bare = VisionTransformer(**args, position_embedding="none")
    prefix = int(classifier == "token")
    assert model.count_params() - bare.count_params() == _position_params(kind, placement, prefix)
    parts = find_vit(model)
    added = [p is not None for p in parts.block_posembeds]
    assert added == [True] + [placement != "once"] * (L - 1)
    if kind == "learned_2d":
        layer = parts.posembed
        assert tuple(layer.row_embedding.shape) == (GRID, D // 2) == tuple(layer.col_embedding.shape)
        table = _np(layer.pos_embedding)[0, prefix:].reshape(GRID, GRID, D)
        # the row half depends on the row only, the column half on the column only
        np.testing.assert_array_equal(table[:, :, : D // 2], np.broadcast_to(table[:, :1, : D // 2], table[:, :, : D // 2].shape))
        np.testing.assert_array_equal(table[:, :, D // 2:], np.broadcast_to(table[:1, :, D // 2:], table[:, :, D // 2:].shape))
    if kind == "relative":
        rel = parts.blocks[0].attention.rel_embedding
        assert tuple(rel.shape) == (2 * (prefix + GRID * GRID) - 1, HEADS, D // HEADS)
    images = rng.uniform(-1, 1, (2, 32, 32, 3)).astype("float32")
    want = _np(model(images))
    model.save(tmp_path / "m.keras")
    again = keras.saving.load_model(tmp_path / "m.keras", safe_mode=True)
    np.testing.assert_allclose(_np(again(images)), want, atol=1e-6)
    assert len(find_vit(again).block_posembeds) == L
    # the official-layout .npz round trip
    save_npz(model, tmp_path / "m.npz")
    copy = VisionTransformer(**args, position_embedding=kind, position_placement=placement)
    load_weights(copy, str(tmp_path / "m.npz"))
    np.testing.assert_allclose(_np(copy(images)), want, atol=1e-6)


@pytest.mark.parametrize("kind,placement", [v for v in VARIANTS if v[0] != "relative"])
def test_resize_to_another_resolution(kind, placement, tmp_path):
    model = VisionTransformer(**TINY, position_embedding=kind, position_placement=placement)
    save_npz(model, tmp_path / "m.npz")
    big = VisionTransformer(**dict(TINY, image_size=48), position_embedding=kind, position_placement=placement)
    load_weights(big, str(tmp_path / "m.npz"))
    small, large = official_variables(model), official_variables(big)
    for key in small:
        if key.endswith(("row_embedding", "col_embedding")):
            a, b = _np(small[key]), _np(large[key])
            assert b.shape == (6, D // 2)
            # corners aligned: the end points are kept, the middle interpolated
            np.testing.assert_allclose(b[[0, -1]], a[[0, -1]], atol=1e-6)
            np.testing.assert_allclose(b[1], a[0] + (a[1] - a[0]) * 0.6, atol=1e-6)
        elif key.endswith("pos_embedding"):
            assert _np(large[key]).shape == (1, 37, D)


def test_relative_refuses_another_resolution(tmp_path):
    model = VisionTransformer(**TINY, position_embedding="relative")
    save_npz(model, tmp_path / "m.npz")
    big = VisionTransformer(**dict(TINY, image_size=48), position_embedding="relative")
    before = [_np(v).copy() for v in big.weights]
    with pytest.raises(ValueError, match="relative offsets"):
        load_weights(big, str(tmp_path / "m.npz"))
    for var, value in zip(big.weights, before):
        np.testing.assert_array_equal(_np(var), value)


def _first_logits(model, tokens):
    """Attention logits (B, heads, T, T) of block 0 for (B, T, D) patch tokens, position included."""
    parts = find_vit(model)
    x = parts.block_posembeds[0](keras.ops.convert_to_tensor(tokens))
    attention = parts.blocks[0].attention
    q, k, _ = attention._qkv(parts.blocks[0].norm_0(x))
    scale = 1.0 / np.sqrt(attention.head_dim)
    logits = keras.ops.einsum("bqnh,bknh->bnqk", q * scale, k)
    bias = attention.logit_bias(q, scale)
    return _np(logits if bias is None else logits + bias)


@pytest.mark.parametrize("kind,equivariant", [("none", True), ("relative", True), ("learned_1d", False),
                                              ("learned_2d", False)])
def test_translation_equivariance(kind, equivariant, rng):
    """Relative attention sees contents and offsets only: shifting the tokens along the sequence
    shifts the logits (on the overlap); absolute embeddings tie the logits to positions."""
    model = VisionTransformer(**dict(TINY, classifier="gap"), position_embedding=kind)
    if kind.startswith("learned"):  # trained-size embeddings, not the 0.02 initialisation
        for var in model.get_layer("posembed_input").weights:
            var.assign(rng.normal(0, 1, var.shape).astype("float32"))
    else:
        for var in model.get_layer("encoderblock_0").attention.weights:
            if "rel_embedding" in var.path:
                var.assign(rng.normal(0, 1, var.shape).astype("float32"))
    n, s = GRID * GRID, 3
    tokens = rng.normal(0, 1, (2, n + s, D)).astype("float32")
    a, b = _first_logits(model, tokens[:, :n]), _first_logits(model, tokens[:, s:])
    # token i of b is token i + s of a
    close = np.allclose(b[:, :, : n - s, : n - s], a[:, :, s:, s:], atol=1e-4)
    assert close == equivariant
    if kind == "none":  # a bag of patches: any permutation
        perm = rng.permutation(n)
        c = _first_logits(model, tokens[:, :n][:, perm])
        np.testing.assert_allclose(c, a[:, :, perm][:, :, :, perm], atol=1e-4)


@pytest.mark.backend_independent
def test_relative_offsets():
    off = relative_offsets(3)
    assert off.tolist() == [[2, 1, 0], [3, 2, 1], [4, 3, 2]]


def test_default_path_is_unchanged(rng):
    """The default model takes the fused attention path (no bias) and equals the explicit softmax."""
    model = VisionTransformer(**TINY)
    block = find_vit(model).blocks[0]
    assert block.attention.logit_bias(None, 1.0) is None
    x = keras.ops.convert_to_tensor(rng.normal(0, 1, (2, 17, D)).astype("float32"))
    fused = _np(block.attention(x))
    explicit, _ = block.attention(x, return_attention=True)
    np.testing.assert_allclose(fused, _np(explicit), atol=1e-5)


def test_bad_arguments():
    with pytest.raises(ValueError, match="unknown position_embedding"):
        VisionTransformer(**TINY, position_embedding="sinusoidal")
    with pytest.raises(ValueError, match="unknown position_placement"):
        VisionTransformer(**TINY, position_placement="twice")
    with pytest.raises(ValueError, match="needs a learned position embedding"):
        VisionTransformer(**TINY, position_embedding="relative", position_placement="every_layer")
    with pytest.raises(ValueError, match="even hidden size"):
        VisionTransformer(**dict(TINY, hidden_size=33, num_heads=3), position_embedding="learned_2d")
