"""Tests of keras_vit.inspection (paper 4.5, D.7, D.8): constructed inputs with known answers,
and real tiny models (nested, "gap", hybrid) checked against a numpy recomputation."""

import dataclasses
import math
import os
import warnings

import keras
import numpy as np
import pytest

from keras_vit import inspection as I
from keras_vit.inspection import capture
from keras_vit import VisionTransformer, cli

TINY = dict(image_size=32, patch_size=8, hidden_size=32, mlp_dim=64, num_heads=2, num_layers=2, classes=10)
HYBRID = dict(TINY, patch_size=1, resnet={"num_layers": (1,), "width_factor": 1})


# ----------------------------------------------------------------------------- helpers


def one_hot_attention(num_tokens, targets, heads=1, batch=1):
    """(B, heads, T, T) attention where query q of head h attends only to targets[h][q]."""
    a = np.zeros((batch, heads, num_tokens, num_tokens))
    for h in range(heads):
        for q in range(num_tokens):
            a[:, h, q, targets[h][q]] = 1.0
    return a


def rollout_reference(attentions, prefix):
    """Attention rollout with explicit loops (independent of the vectorised implementation)."""
    layers = [np.asarray(a, dtype=np.float64) for a in attentions]
    b_, h_, t_, _ = layers[0].shape
    out = np.zeros((b_, t_))
    for b in range(b_):
        r = np.eye(t_)
        for a in layers:
            m = np.zeros((t_, t_))
            for q in range(t_):
                row = [sum(a[b, h, q, k] for h in range(h_)) / h_ + (q == k) for k in range(t_)]
                m[q] = np.array(row) / sum(row)
            r = m @ r
        out[b] = r[0] if prefix else r.mean(axis=0)
    return out[:, prefix:]


# ----------------------------------------------------------------------------- rollout


@pytest.mark.backend_independent
def test_rollout_forced_onto_one_patch_has_closed_form_value():
    # 2x3 grid + class token; every query of every head attends to the patch at row 1, col 0.
    grid, target = (2, 3), 1 + 1 * 3 + 0
    a = one_hot_attention(7, [[target] * 7] * 2, heads=2)
    maps = I.attention_rollout([a, a, a], num_prefix_tokens=1, grid_size=grid)
    assert maps.shape == (1, 2, 3)
    # A = I/2 + 1 e_t^T / 2 per layer -> class row after L layers: 2^-L on cls, 1 - 2^-L on t.
    expected = np.zeros(grid)
    expected[1, 0] = 1 - 0.5**3
    np.testing.assert_allclose(maps[0], expected, atol=1e-12)


@pytest.mark.backend_independent
def test_rollout_averages_heads_and_multiplies_first_layer_rightmost():
    t = 1 + 4  # 2x2 grid
    a, b = 1, 4  # patch tokens (0,0) and (1,1)
    heads = one_hot_attention(t, [[a] * t, [b] * t], heads=2)
    m = I.attention_rollout([heads], 1, (2, 2))[0]
    np.testing.assert_allclose(m, [[0.25, 0.0], [0.0, 0.25]], atol=1e-12)  # mean, not max, of heads
    first, second = one_hot_attention(t, [[a] * t]), one_hot_attention(t, [[b] * t])
    m = I.attention_rollout([first, second], 1, 2)[0]
    # R = A2 @ A1: patch a (mixed in first, carried by b later) gets 1/2, b gets 1/4.
    np.testing.assert_allclose(m, [[0.5, 0.0], [0.0, 0.25]], atol=1e-12)


@pytest.mark.backend_independent
def test_rollout_gap_uses_mean_of_all_rows():
    t, a = 9, 5
    att = one_hot_attention(t, [[a] * t])
    m = I.attention_rollout([att, att], num_prefix_tokens=0, grid_size=3)[0]
    expected = np.full(9, 0.25 / 9)
    expected[a] = (8 * 0.75 + 1) / 9
    np.testing.assert_allclose(m.ravel(), expected, atol=1e-12)
    assert m.sum() == pytest.approx(1.0)


@pytest.mark.backend_independent
@pytest.mark.parametrize("prefix", [0, 1])
def test_rollout_matches_loop_reference_on_random_attention(rng, prefix):
    t = prefix + 6
    logits = rng.normal(size=(3, 2, 4, t, t))
    att = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
    maps = I.attention_rollout(list(att), prefix, (2, 3))
    np.testing.assert_allclose(maps.reshape(2, -1), rollout_reference(list(att), prefix), atol=1e-12)
    single = I.attention_rollout([layer[1] for layer in att], prefix, (2, 3))  # (heads, T, T) per layer
    np.testing.assert_allclose(single, maps[1], atol=1e-12)


@pytest.mark.backend_independent
def test_rollout_bad_inputs():
    good = np.full((1, 2, 10, 10), 0.1)
    with pytest.raises(ValueError, match="10 tokens.*prefix"):
        I.attention_rollout([good], 1, (4, 4))
    with pytest.raises(ValueError, match="not a square grid"):
        I.attention_rollout([good], 0)  # 10 patches: forgot the class token
    with pytest.raises(ValueError, match="same attention shape"):
        I.attention_rollout([good, np.full((1, 2, 5, 5), 0.2)], 1)
    with pytest.raises(ValueError, match="negative"):
        I.attention_rollout([-good], 1)
    with pytest.raises(ValueError, match="B, heads, T, T"):
        I.attention_rollout([np.ones((10, 10))], 1)
    with pytest.raises(ValueError, match="empty"):
        I.attention_rollout([], 1)
    with pytest.raises(ValueError, match="num_prefix_tokens"):
        I.attention_rollout([good], -1)


# ----------------------------------------------------------------------------- upsampling


@pytest.mark.backend_independent
def test_upsample_nearest_is_block_repeat_and_bilinear_matches_skimage(rng):
    from skimage.transform import resize

    m = rng.random((2, 3, 4))
    near = I.upsample_map(m, (6, 12), method="nearest")
    np.testing.assert_allclose(near, np.stack([np.kron(x, np.ones((2, 3))) for x in m]))
    bil = I.upsample_map(m[0], (15, 20))
    ref = resize(m[0], (15, 20), order=1, mode="edge", anti_aliasing=False)
    np.testing.assert_allclose(bil, ref, atol=1e-12)
    norm = I.upsample_map(m, 16, normalize=True)
    assert norm.shape == (2, 16, 16)
    np.testing.assert_allclose(norm.min(axis=(1, 2)), 0.0)
    np.testing.assert_allclose(norm.max(axis=(1, 2)), 1.0)
    peak = np.zeros((4, 4))
    peak[1, 3] = 1.0
    big = I.upsample_map(peak, (32, 32))
    assert np.unravel_index(big.argmax(), big.shape)[0] // 8 == 1
    assert np.unravel_index(big.argmax(), big.shape)[1] // 8 == 3
    with pytest.raises(ValueError, match="gh, gw"):
        I.upsample_map(np.ones(5), 8)
    with pytest.raises(ValueError, match="method"):
        I.upsample_map(m, 8, method="cubic")


# ----------------------------------------------------------------------------- attention distance


def shifted_targets(grid, dr, dc, prefix):
    """Per query token: the patch dr rows / dc columns away (mirrored at the border)."""
    gh, gw = grid
    targets = list(range(prefix))  # prefix queries attend to themselves (excluded anyway)
    for r in range(gh):
        for c in range(gw):
            r2 = r + dr if 0 <= r + dr < gh else r - dr
            c2 = c + dc if 0 <= c + dc < gw else c - dc
            assert 0 <= r2 < gh and 0 <= c2 < gw, "shift too large for the grid"
            targets.append(prefix + r2 * gw + c2)
    return targets


@pytest.mark.backend_independent
def test_attention_distance_known_shifts_prefix_excluded():
    grid, p, t = (4, 4), 16, 17
    right1 = one_hot_attention(t, [shifted_targets(grid, 0, 1, 1), shifted_targets(grid, 0, 2, 1)], heads=2)
    # half of every query's mass goes to the class token: renormalised over patches it must not matter
    right1 = 0.5 * right1
    right1[..., 0] += 0.5
    self_att = one_hot_attention(t, [list(range(t))] * 2, heads=2)
    d = I.mean_attention_distance([right1, self_att], grid, p, num_prefix_tokens=1)
    np.testing.assert_allclose(d, [[16.0, 32.0], [0.0, 0.0]], atol=1e-9)


@pytest.mark.backend_independent
def test_attention_distance_diagonal_rectangular_patches_and_image_average():
    grid = (3, 5)
    diag = one_hot_attention(15, [shifted_targets(grid, 1, 1, 0)])
    d = I.mean_attention_distance([diag], grid, patch_size=(8, 16), num_prefix_tokens=0)
    np.testing.assert_allclose(d, [[math.hypot(8, 16)]])
    # image 0 at 1 column, image 1 at 3 columns -> the average over images is 2 columns
    grid = (2, 6)
    two = np.concatenate([one_hot_attention(12, [shifted_targets(grid, 0, k, 0)]) for k in (1, 3)])
    np.testing.assert_allclose(I.mean_attention_distance([two], grid, 10, 0), [[20.0]])


@pytest.mark.backend_independent
def test_attention_distance_uniform_and_prefix_only_rows():
    uniform = np.full((1, 1, 5, 5), 0.2)
    expected = (0 + 10 + 10 + 10 * math.sqrt(2)) / 4
    np.testing.assert_allclose(I.mean_attention_distance([uniform], 2, 10, 1), [[expected]])
    # a query that puts all its weight on the class token carries no distance: left out
    a = np.full((1, 1, 5, 5), 0.2)
    a[0, 0, 1] = [1, 0, 0, 0, 0]
    np.testing.assert_allclose(I.mean_attention_distance([a], 2, 10, 1), [[expected]])
    with pytest.raises(ValueError, match="patch_size"):
        I.mean_attention_distance([uniform], 2, 0, 1)


# ----------------------------------------------------------------------------- position embeddings


@pytest.mark.backend_independent
def test_position_embedding_similarity_row_column_indicators(rng):
    gh, gw = 3, 4
    emb = np.zeros((1, 1 + gh * gw, gh + gw))
    emb[0, 0] = rng.normal(size=gh + gw)  # class token: must be dropped
    for r in range(gh):
        for c in range(gw):
            emb[0, 1 + r * gw + c, r] = 1.0
            emb[0, 1 + r * gw + c, gh + c] = 1.0
    sim = I.position_embedding_similarity(emb, (gh, gw), num_prefix_tokens=1)
    assert sim.shape == (gh, gw, gh, gw)
    r1, c1, r2, c2 = np.meshgrid(range(gh), range(gw), range(gh), range(gw), indexing="ij")
    expected = 0.5 * (r1 == r2) + 0.5 * (c1 == c2)
    np.testing.assert_allclose(sim, expected, atol=1e-12)
    with pytest.raises(ValueError, match="tokens"):
        I.position_embedding_similarity(emb, (4, 4), 1)


# ----------------------------------------------------------------------------- embedding filters


@pytest.mark.backend_independent
def test_embedding_filters_pca_recovers_constructed_directions(rng):
    p, c, d = 4, 3, 16
    u = np.linalg.qr(rng.normal(size=(p * p * c, 2)))[0]  # two orthonormal patch-space directions
    basis = np.linalg.qr(np.column_stack([np.ones(d), rng.normal(size=(d, 2))]))[0]
    a, b = basis[:, 1], basis[:, 2]  # orthonormal, zero-mean coefficient vectors over the D filters
    offset = rng.normal(size=p * p * c)  # common mean filter: PCA must centre it away
    flat = 3.0 * np.outer(u[:, 0], a) + 1.0 * np.outer(u[:, 1], b) + offset[:, None]
    kernel = flat.reshape(p, p, c, d)
    comps, ratio = I.embedding_filters(kernel, 3, normalize=False, return_variance=True)
    assert comps.shape == (3, p, p, c)
    for i in range(2):
        direction = u[:, i].reshape(p, p, c)
        assert abs(np.sum(comps[i] * direction)) == pytest.approx(1.0, abs=1e-9)
        flat_i = comps[i].ravel()
        assert flat_i[np.argmax(np.abs(flat_i))] > 0  # sign convention
    np.testing.assert_allclose(ratio[:2], [0.9, 0.1], atol=1e-9)
    assert ratio[2] < 1e-20
    shown = I.embedding_filters(kernel, 2)
    np.testing.assert_allclose(shown.reshape(2, -1).min(1), 0.0)
    np.testing.assert_allclose(shown.reshape(2, -1).max(1), 1.0)


def test_embedding_filters_rejects_hybrid_and_bad_counts(rng):
    with pytest.raises(ValueError, match="hybrid.*RGB embedding filters do not exist"):
        I.embedding_filters(rng.normal(size=(1, 1, 256, 32)))
    with pytest.raises(ValueError, match="between 1 and 12"):
        I.embedding_filters(rng.normal(size=(2, 2, 3, 16)), 13)
    with pytest.raises(ValueError, match="P, P, C, D"):
        I.embedding_filters(rng.normal(size=(12, 16)))


# ----------------------------------------------------------------------------- real tiny models


def _np(v):
    return np.asarray(keras.ops.convert_to_numpy(v), dtype=np.float64)


def manual_first_layer_attention(parts, images):
    """Layer-0 attention recomputed in numpy from the layer weights (paper Eq. 1, 5-8)."""
    x = np.asarray(images, dtype=np.float64)
    if parts.resnet is not None:  # the CNN stem is not re-derived; the token pipeline is
        x = _np(parts.resnet(keras.ops.convert_to_tensor(images)))
    kernel, bias = _np(parts.embedding.kernel), _np(parts.embedding.bias)
    p = kernel.shape[0]
    gh, gw = parts.grid_size
    tokens = np.stack(
        [np.einsum("bijc,ijcd->bd", x[:, r * p:(r + 1) * p, c * p:(c + 1) * p], kernel) + bias
         for r in range(gh) for c in range(gw)], axis=1)
    if parts.cls is not None:
        cls = np.broadcast_to(_np(parts.cls.cls), (len(x), 1, tokens.shape[-1]))
        tokens = np.concatenate([cls, tokens], axis=1)
    tokens = tokens + _np(parts.posembed.pos_embedding)
    w = {k: _np(v) for k, v in parts.blocks[0].official_weights().items()}
    mu = tokens.mean(-1, keepdims=True)
    var = ((tokens - mu) ** 2).mean(-1, keepdims=True)
    y = (tokens - mu) / np.sqrt(var + 1e-6) * w["LayerNorm_0/scale"] + w["LayerNorm_0/bias"]
    att = "MultiHeadDotProductAttention_1"
    q = np.einsum("btd,dnh->btnh", y, w[f"{att}/query/kernel"]) + w[f"{att}/query/bias"]
    k = np.einsum("btd,dnh->btnh", y, w[f"{att}/key/kernel"]) + w[f"{att}/key/bias"]
    logits = np.einsum("bqnh,bknh->bnqk", q, k) / math.sqrt(q.shape[-1])
    e = np.exp(logits - logits.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


@pytest.fixture(scope="module")
def nested_model():
    keras.utils.set_random_seed(1)
    vit = VisionTransformer(**TINY, name="vit")
    inp = keras.Input((32, 32, 3))
    outer = keras.Model(inp, keras.layers.Dense(3, name="user_head")(vit(inp)), name="finetuned")
    inp2 = keras.Input((32, 32, 3))
    return keras.Model(inp2, outer(inp2), name="wrapper")


@pytest.fixture(scope="module")
def gap_model():
    keras.utils.set_random_seed(2)
    return VisionTransformer(**TINY, classifier="gap", name="vit_gap")


@pytest.fixture(scope="module")
def hybrid_model():
    keras.utils.set_random_seed(3)
    return VisionTransformer(**HYBRID, name="vit_hybrid")


@pytest.fixture(scope="module")
def images():
    return np.random.default_rng(5).uniform(-1, 1, (2, 32, 32, 3)).astype("float32")


@pytest.mark.parametrize(
    "which, path, tokens, prefix",
    [("nested_model", "wrapper/finetuned/vit", 17, 1), ("gap_model", "vit_gap", 16, 0),
     ("hybrid_model", "vit_hybrid", 65, 1)],
)
def test_real_models_attention_rows_and_manual_first_layer(request, images, which, path, tokens, prefix):
    model = request.getfixturevalue(which)
    parts = I.find_vit(model)
    assert parts.path == path and parts.num_prefix_tokens == prefix and parts.num_tokens == tokens
    maps = I.attention_maps(model, images)
    assert len(maps) == 2 and all(m.shape == (2, 2, tokens, tokens) for m in maps)
    for m in maps:
        np.testing.assert_allclose(m.sum(-1), 1.0, atol=1e-5)
    np.testing.assert_allclose(maps[0], manual_first_layer_attention(parts, images), atol=2e-5)
    np.testing.assert_allclose(I.attention_maps(model, images, layers=[-1])[0], maps[1], atol=1e-6)
    # the layer-by-layer run reproduces the model's own encoder output
    inner = keras.Model(parts.container.inputs[0], parts.container.get_layer("encoderblock_1").output)
    _, final = capture._run_vit(parts, images, [1])
    np.testing.assert_allclose(final, _np(inner(images)), atol=1e-4)
    # the analyses accept what attention_maps returns
    assert I.attention_rollout(maps, prefix, parts.grid_size).shape == (2, *parts.grid_size)
    d = I.mean_attention_distance(maps, parts.grid_size, 32 / parts.grid_size[0], prefix)
    assert d.shape == (2, 2) and np.all((d > 0) & (d < 32 * math.sqrt(2)))


def test_model_with_attention_forced_onto_one_patch(images):
    """Weights set so every query of every block attends only to patch (2, 1): the rollout must
    peak there with the closed-form value, and the attention distance is known exactly."""
    keras.utils.set_random_seed(4)
    model = VisionTransformer(**TINY, name="forced")
    parts = I.find_vit(model)
    dim, heads, hd = 32, 2, 16
    target = 1 + 2 * 4 + 1
    parts.embedding.kernel.assign(np.zeros((8, 8, 3, dim), "float32"))
    pos = np.zeros((1, 17, dim), "float32")
    pos[0, target, 0], pos[0, target, 1] = 5.0, -5.0  # LayerNorm -> +-4 on dims 0, 1; zero elsewhere
    parts.posembed.pos_embedding.assign(pos)
    for block in parts.blocks:
        w = block.official_weights()
        att = "MultiHeadDotProductAttention_1"
        key = np.zeros((dim, heads, hd), "float32")
        key[0] = 0.25  # k_target = 4 * 0.25 = 1 per head dim, 0 for every other token
        w[f"{att}/key/kernel"].assign(key)
        w[f"{att}/query/kernel"].assign(np.zeros((dim, heads, hd), "float32"))
        w[f"{att}/query/bias"].assign(np.full((heads, hd), 50.0 / 4, "float32"))  # logit 50 on target
        for name in (f"{att}/out/kernel", f"{att}/out/bias", "MlpBlock_3/Dense_1/kernel", "MlpBlock_3/Dense_1/bias"):
            w[name].assign(np.zeros(w[name].shape, "float32"))
    maps = I.attention_maps(model, images)
    np.testing.assert_allclose(maps[1][:, :, :, target], 1.0, atol=1e-6)
    rollout = I.attention_rollout(maps, 1, (4, 4))
    expected = np.zeros((2, 4, 4))
    expected[:, 2, 1] = 0.75
    np.testing.assert_allclose(rollout, expected, atol=1e-6)
    centres = [(8 * r + 4, 8 * c + 4) for r in range(4) for c in range(4)]
    dist = np.mean([math.dist(q, centres[target - 1]) for q in centres])
    np.testing.assert_allclose(I.mean_attention_distance(maps, 4, 8, 1), np.full((2, 2), dist), rtol=1e-6)


def test_attention_maps_bad_inputs(nested_model, images):
    with pytest.raises(ValueError, match="64x64 pixels but the ViT at 'wrapper/finetuned/vit' expects 32x32"):
        I.attention_maps(nested_model, np.zeros((1, 64, 64, 3), "float32"))
    with pytest.raises(ValueError, match=r"\(B, H, W, 3\)"):
        I.attention_maps(nested_model, np.zeros((1, 32, 32, 4), "float32"))
    with pytest.raises(IndexError, match=r"valid indices are 0\.\.1"):
        I.attention_maps(nested_model, images, layers=2)
    with pytest.raises(IndexError, match="out of range"):
        I.attention_maps(nested_model, images, layers=[0, -3])
    not_vit = keras.Sequential([keras.Input((32, 32, 3)), keras.layers.Conv2D(4, 3), keras.layers.Flatten()])
    with pytest.raises(ValueError, match="no Vision Transformer found"):
        I.attention_maps(not_vit, images)
    a, b = VisionTransformer(**TINY, name="a"), VisionTransformer(**TINY, name="b")
    inp = keras.Input((32, 32, 3))
    twin = keras.Model(inp, keras.layers.Concatenate()([a(inp), b(inp)]))
    with pytest.raises(ValueError, match="2 Vision Transformers"):
        I.find_vit(twin)
    assert I.find_vit(a).container is a  # passing the one meant works


def test_single_image_and_other_resolution():
    keras.utils.set_random_seed(6)
    model = VisionTransformer(**dict(TINY, image_size=(48, 32)), name="vit_48x32")  # non-square grid 6x4
    parts = I.find_vit(model)
    assert parts.grid_size == (6, 4) and parts.image_size == (48, 32)
    maps = I.attention_maps(model, np.zeros((48, 32, 3), "float32"))
    assert maps[0].shape == (1, 2, 25, 25)
    assert I.attention_rollout(maps, 1, parts.grid_size).shape == (1, 6, 4)


# ----------------------------------------------------------------------------- plots and CLI


def _is_png(path):
    with open(path, "rb") as f:
        return f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_inspect_model_writes_four_pngs_atomically(nested_model, tmp_path):
    image = np.random.default_rng(7).uniform(-1, 1, (40, 56, 3)).astype("float32")  # resized inside
    paths = I.inspect_model(nested_model, image, tmp_path / "out")
    assert set(paths) == {"rollout", "attention_distance", "position_embedding", "embedding_filters"}
    for path in paths.values():
        assert _is_png(path) and os.path.getsize(path) > 1000
    assert sorted(os.listdir(tmp_path / "out")) == sorted(os.path.basename(p) for p in paths.values())
    with pytest.raises(ValueError, match="preprocess_input"):
        I.inspect_model(nested_model, image * 127.5 + 127.5, tmp_path / "raw")


def test_inspect_hybrid_has_no_rgb_filters(hybrid_model, images, tmp_path):
    with pytest.warns(UserWarning, match="no RGB embedding filters"):
        paths = I.inspect_model(hybrid_model, images, tmp_path)
    assert paths["embedding_filters"] is None
    assert sorted(os.listdir(tmp_path)) == sorted(os.path.basename(p) for p in paths.values() if p)


def test_cli_inspect(tmp_path, monkeypatch):
    from PIL import Image

    import keras_vit

    def tiny_factory(image_size=224, weights=None):  # a registered factory, 2 layers for speed
        assert weights is None
        return VisionTransformer(**dict(TINY, image_size=image_size), name="cli_tiny")

    monkeypatch.setattr(keras_vit, "Tiny_Test", tiny_factory, raising=False)
    monkeypatch.setitem(keras_vit.VARIANTS, "Tiny_Test", dataclasses.replace(keras_vit.VARIANTS["ViT_Ti16"], name="Tiny_Test"))

    pixels = np.random.default_rng(8).integers(0, 256, (50, 70, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(tmp_path / "a.png")
    parser = cli.parser()
    args = parser.parse_args(["inspect", "--model", "Tiny_Test", "--image", str(tmp_path / "a.png"),
                              "--image", str(tmp_path / "a.png"), "--weights", "none",
                              "--image-size", "32", "--out", str(tmp_path / "out")])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        args.func(args)
    assert sorted(os.listdir(tmp_path / "out")) == sorted(I.FIGURE_NAMES.values())
    bad = parser.parse_args(["inspect", "--model", "NotAViT", "--weights", "none", "--image", "x.jpg",
                             "--out", str(tmp_path)])
    with pytest.raises(ValueError, match="unknown variant 'NotAViT'"):
        bad.func(bad)
    missing = parser.parse_args(["inspect", "--model", "Tiny_Test", "--weights", "none",
                                 "--image", str(tmp_path / "nope.jpg"),
                                 "--image-size", "32", "--out", str(tmp_path)])
    with pytest.raises(FileNotFoundError, match="nope.jpg"):
        missing.func(missing)
