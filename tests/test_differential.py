"""Differential attention (Ye et al. 2024; timm's DiffAttention): timm's `vit_dwee_*` and `vit_dpwee_*` (in parallel
blocks) read by `from_timm` and equal to timm's random-weight models at two sizes; the layer's output and its maps
equal to a numpy reference; reloaded in safe mode, trained with attention dropout; what it does not take refused."""

import keras
import numpy as np
import pytest

import keras_vit
from keras_vit.layers.differential_attention import DifferentialAttention, lambda_init

torch = pytest.importorskip("torch")
pytest.importorskip("safetensors.torch")
from timm_files import equal_to_timm_at, redraw, timm_file, timm_module, to_numpy  # noqa: E402

timm = timm_module()
SIZES = ((48, 48), (64, 80))  # the size timm's model is made at, and another grid (not square)


@pytest.mark.parametrize("arch", ["vit_dwee_patch16_reg1_gap_256",
                                  pytest.param("vit_dpwee_patch16_reg1_gap_256", marks=pytest.mark.backend_independent)])
def test_timm_differential_files_equal_timm_at_two_sizes(arch, tmp_path):
    """The logits at two sizes: each block's lambda_init from its index, the four lambda vectors and the heads' RMSNorm
    read off the file; `vit_dpwee_*`'s parallel block with one output projection for both branches read as two.
    `vit_dwee_*` on every backend, `vit_dpwee_*` on torch's lane."""
    ref = redraw(timm.create_model(arch, pretrained=False, depth=2, img_size=SIZES[0], num_classes=5))
    path = timm_file(ref, tmp_path, arch)
    equal_to_timm_at(ref, SIZES, arch, path=path)
    model = keras_vit.from_timm(path, image_size=SIZES[0])
    assert keras_vit.structure.find_vit(model).family()["differential_attention"] is True
    assert [model.get_layer(f"encoderblock_{i}").attention.depth for i in range(2)] == [0, 1]


def _numpy_reference(layer, x):
    """(output, maps) of differential attention computed in numpy from `layer`'s weights."""
    w = {k: to_numpy(v).astype("float64") for k, v in layer.official_weights().items()}
    q, k, v = (np.einsum("btd,dnh->btnh", x, w[f"{n}/kernel"]) + w[f"{n}/bias"] for n in ("query", "key", "value"))
    half = q.shape[-1] // 2

    def softmax(z):
        e = np.exp(z - z.max(-1, keepdims=True))
        return e / e.sum(-1, keepdims=True)

    maps = [softmax(np.einsum("bqnh,bknh->bnqk", q[..., i * half:(i + 1) * half], k[..., i * half:(i + 1) * half])
                    / np.sqrt(half)) for i in range(2)]
    lam = np.exp(w["lambda_q1"] @ w["lambda_k1"]) - np.exp(w["lambda_q2"] @ w["lambda_k2"]) + lambda_init(layer.depth)
    weights = maps[0] - lam * maps[1]
    y = np.einsum("bnqk,bknh->bqnh", weights, v)
    y = y / np.sqrt(np.mean(y ** 2, axis=-1, keepdims=True) + 1e-5) * w["sub_norm/scale"] * (1 - lambda_init(layer.depth))
    return np.einsum("btnh,nhd->btd", y, w["out/kernel"]) + w["out/bias"], weights


@pytest.mark.backend_independent
def test_the_layer_and_its_maps_equal_numpy_and_a_model_of_it_reloads_and_trains(tmp_path):
    """The layer's output (through the backend's fused path) and its maps (`return_attention`) equal a numpy
    reference from its weights; a model of differential attention with attention dropout reloads from `.keras` in
    safe mode with the same outputs, differs in training, and a step moves every weight but the key biases (which
    shift each query's logits alike, so no map sees them); q/k norms or relative position embeddings with
    it, and an odd head size, are refused in one line."""
    rng = np.random.default_rng(0)
    layer = DifferentialAttention(2, depth=3)
    x = rng.normal(size=(2, 5, 16)).astype("float32")
    layer.build(x.shape)
    for var in layer.weights:
        var.assign(rng.normal(scale=0.3, size=var.shape).astype("float32"))
    want, want_maps = _numpy_reference(layer, x.astype("float64"))
    got, maps = layer(x, return_attention=True)
    np.testing.assert_allclose(to_numpy(maps), want_maps, atol=1e-5)
    np.testing.assert_allclose(to_numpy(got), want, atol=1e-5 * np.abs(want).max())
    np.testing.assert_allclose(to_numpy(layer(x)), want, atol=1e-5 * np.abs(want).max())
    args = dict(image_size=32, patch_size=8, hidden_size=32, mlp_dim=64, num_heads=2, num_layers=2, classes=3,
                differential_attention=True)
    model = keras_vit.VisionTransformer(**args, attention_dropout_rate=0.1)
    for var in model.weights:
        var.assign(rng.normal(scale=0.3, size=var.shape).astype("float32"))
    images = rng.uniform(-1, 1, (8, 32, 32, 3)).astype("float32")
    model.save(tmp_path / "m.keras")
    reloaded = keras.saving.load_model(tmp_path / "m.keras", safe_mode=True)
    np.testing.assert_array_equal(to_numpy(reloaded(images)), to_numpy(model(images)))
    assert not np.allclose(to_numpy(model(images, training=True)), to_numpy(model(images)))
    before = [to_numpy(w).copy() for w in model.trainable_weights]
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="sparse_categorical_crossentropy")
    model.fit(images, np.arange(8) % 3, batch_size=8, epochs=1, verbose=0)
    still = [w.path for b, w in zip(before, model.trainable_weights) if np.array_equal(b, to_numpy(w))]
    assert all(p.endswith("key/bias") for p in still), still  # a key bias shifts a query's logits alike: no gradient
    with pytest.raises(ValueError, match="qk_norm is not taken"):
        keras_vit.VisionTransformer(**args, qk_norm=True)
    with pytest.raises(ValueError, match="differential attention does not take relative position embeddings"):
        keras_vit.VisionTransformer(**args, position_embedding="relative")
    with pytest.raises(ValueError, match="splits each head in two, got a head size of 9"):
        keras_vit.VisionTransformer(**{**args, "hidden_size": 18})
