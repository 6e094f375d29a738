"""Stochastic depth (`drop_path_rate`, issue 45): timm's per-sample `drop_path` of each residual branch, its
linear rule over the blocks, evaluation exactly the model without it, the same masks in a remat
recomputation, the option kept by every copy of a model and read from the files that record it."""

import inspect
import json
import logging
import os
import sys

import keras
import numpy as np
import pytest
from conftest import TINY

import keras_vit
from keras_vit import layers as L
from keras_vit.configs import VARIANTS
from keras_vit.vit_config import ViTConfig

SMALL = {**TINY, "include_top": False, "pooling": None}  # two blocks, rates 0 and r; the tokens out


def _numpy(x):
    return keras.ops.convert_to_numpy(x)


def test_drop_path_equals_timms_for_the_same_draw():
    """timm's `drop_path` draws its own mask; the samples it kept, given to ours, give its output: the
    kept ones scaled by 1 / keep, the others zero in every token and channel."""
    torch = pytest.importorskip("torch")
    benchmarks = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks")
    if benchmarks not in sys.path:
        sys.path.insert(0, benchmarks)
    from timm_peer import import_timm  # timm without torchvision, as the other tests import it

    import_timm()
    from timm.layers import drop_path

    torch.manual_seed(0)
    x = torch.randn(64, 5, 8)
    theirs = drop_path(x, 0.25, training=True).numpy()
    kept = np.abs(theirs).reshape(64, -1).max(1) > 0
    assert 0 < (~kept).sum() < 64
    ours = _numpy(L.drop_path(keras.ops.convert_to_tensor(x.numpy()), kept[:, None, None], 0.25))
    np.testing.assert_array_equal(ours, theirs)
    branch = x.numpy()
    assert L.drop_path(branch, kept[:, None, None], 0.0) is branch  # rate 0: the branch as it is


@pytest.mark.parametrize("branch", ["attention", "mlp"])
def test_a_block_drops_each_branch_for_whole_samples_at_its_rate(branch):
    """With the other branch's output projection at zero, the block in training adds to each sample
    either nothing or the evaluation's branch / keep; about `rate` of the samples get nothing, a new
    draw each call; evaluation equals the block without stochastic depth bit for bit."""
    rate, n = 0.3, 512
    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(n, 3, 8)).astype("float32")
    block, plain = L.TransformerBlock(2, 16, drop_path_rate=rate), L.TransformerBlock(2, 16)
    for b in (block, plain):
        b.build(x.shape)
    silenced = "MlpBlock_3/Dense_1/" if branch == "attention" else "MultiHeadDotProductAttention_1/out/"
    for key, var in block.official_weights().items():
        value = np.zeros(var.shape) if key.startswith(silenced) else rng.normal(scale=0.3, size=var.shape)
        var.assign(value.astype("float32"))
    plain.set_weights(block.get_weights())
    evaluated = _numpy(block(x, training=False))
    np.testing.assert_array_equal(evaluated, _numpy(plain(x, training=False)))
    np.testing.assert_array_equal(evaluated, _numpy(plain(x, training=True)))  # no dropout: training is eval
    full = (evaluated - x).reshape(n, -1)
    draws = []
    for _ in range(2):
        added = (_numpy(block(x, training=True)) - x).reshape(n, -1)
        dropped = np.all(added == 0, axis=1)
        np.testing.assert_allclose(added[~dropped], full[~dropped] / (1 - rate), rtol=1e-5, atol=1e-6)
        assert np.abs(full[dropped]).max(axis=1).min() > 1e-3  # each dropped sample had a branch to drop
        assert abs(dropped.mean() - rate) < 4 * np.sqrt(rate * (1 - rate) / n), dropped.mean()
        draws.append(dropped)
    assert (draws[0] != draws[1]).any()


def test_evaluation_equals_rate_0_and_copies_keep_the_rate(tmp_path):
    """The model with stochastic depth predicts what the same weights without it predict, bit for bit,
    and differs in training (with LoRA adapters too); a .keras file reloaded in safe mode, `any_size`,
    `naflex` and `merge_lora` keep each block's rate, and a config saved before the option existed loads
    without it."""
    from keras_vit.lora import enable_lora, merge_lora
    from keras_vit.model import any_size
    from keras_vit.naflex import naflex, patchify_images

    keras.utils.set_random_seed(1)
    x = np.random.default_rng(1).uniform(-1, 1, (4, 32, 32, 3)).astype("float32")
    model = keras_vit.VisionTransformer(**SMALL, drop_path_rate=0.4)
    plain = keras_vit.VisionTransformer(**SMALL)
    plain.set_weights(model.get_weights())
    evaluated = _numpy(model(x, training=False))
    np.testing.assert_array_equal(evaluated, _numpy(plain(x, training=False)))
    assert np.abs(_numpy(model(x, training=True)) - evaluated).max() > 1e-3
    model.save(tmp_path / "m.keras")
    copies = {"loaded": keras.saving.load_model(tmp_path / "m.keras", safe_mode=True), "any_size": any_size(model),
              "naflex": naflex(any_size(model))}
    batch = patchify_images(x, 8)  # a NaFlex batch: the blocks see its `valid` mask
    flexed = _numpy(copies["naflex"](batch, training=False))
    np.testing.assert_allclose(flexed, evaluated.reshape(flexed.shape), atol=1e-5, rtol=0)
    assert np.abs(_numpy(copies["naflex"](batch, training=True)) - flexed).max() > 1e-3
    enable_lora(model, 2)
    assert np.abs(_numpy(model(x, training=True)) - _numpy(model(x, training=False))).max() > 1e-3
    copies["merge_lora"] = merge_lora(model)
    for what, copy in copies.items():
        assert [copy.get_layer(f"encoderblock_{i}").drop_path_rate for i in range(2)] == [0.0, 0.4], what
    np.testing.assert_array_equal(_numpy(copies["loaded"](x, training=False)), evaluated)
    old = model.get_layer("encoderblock_1").get_config()
    old.pop("drop_path_rate")
    block = L.TransformerBlock.from_config(json.loads(json.dumps(old)))
    assert block.drop_path_rate == 0.0 and block.get_config()["drop_path_rate"] == 0.0


@pytest.mark.skipif(keras.backend.backend() != "jax", reason="jax.grad of a stateless call")
def test_remat_gradient_equals_the_plain_models_under_the_same_seed():
    """The remat model recomputes each block in the backward pass (JAX-on-CPU's custom gradient) with the
    drop-path masks of the forward pass: its gradient is the plain model's for the same seed state."""
    import jax

    keras.utils.set_random_seed(2)
    rng = np.random.default_rng(2)
    x = rng.uniform(-1, 1, (8, 32, 32, 3)).astype("float32")
    target = rng.normal(size=(8, 4, 4, 32)).astype("float32")
    config = {**SMALL, "drop_path_rate": 0.5}
    plain, remat = (keras_vit.VisionTransformer(**config, remat=remat) for remat in (False, True))
    remat.set_weights(plain.get_weights())
    seed = plain.get_layer("encoderblock_1").drop_path_seed.state  # the same seed state: the same masks
    remat.get_layer("encoderblock_1").drop_path_seed.state.assign(seed.value)
    assert plain.get_layer("encoderblock_0").drop_path_seed is None  # rate 0: nothing drawn

    def loss_and_gradient(model):
        others = [v.value for v in model.non_trainable_variables]

        def loss(trainable):
            tokens = model.stateless_call(trainable, others, x, training=True)[0]
            return keras.ops.mean(keras.ops.square(tokens - target)), tokens

        return jax.jit(jax.value_and_grad(loss, has_aux=True))([v.value for v in model.trainable_variables])

    ((loss, tokens), grads), ((remat_loss, _), remat_grads) = loss_and_gradient(plain), loss_and_gradient(remat)
    assert remat.get_layer("encoderblock_1").remat and not plain.get_layer("encoderblock_1").remat
    np.testing.assert_allclose(float(remat_loss), float(loss), rtol=1e-6)
    for a, b in zip(remat_grads, grads):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-7)
    changed = np.abs(np.asarray(tokens) - _numpy(plain(x, training=False))).reshape(8, -1).max(1)
    assert (changed > 1e-3).sum() >= 2  # the masks did drop branches of several images


@pytest.mark.backend_independent
@pytest.mark.parametrize("rate, depth", [(0.1, 12), (0.4, 24), (0.35, 7), (0.3, 1), (0.0, 5)])
def test_the_rates_rise_linearly_as_timms(rate, depth):
    torch = pytest.importorskip("torch")
    theirs = [v.item() for v in torch.linspace(0, rate, depth)]
    ours = L.drop_path_rates(rate, depth)
    np.testing.assert_allclose(ours, theirs, rtol=1e-6, atol=0)
    assert ours[0] == 0.0 and (depth == 1 or ours[-1] == rate)


@pytest.mark.backend_independent
def test_every_factory_takes_the_rate_and_gives_each_block_its_own():
    for variant in VARIANTS:
        assert inspect.signature(getattr(keras_vit, variant)).parameters["drop_path_rate"].default is None, variant
    model = keras_vit.ViT_Ti16(image_size=32, classes=3, drop_path_rate=0.1)
    rates = [model.get_layer(f"encoderblock_{i}").drop_path_rate for i in range(12)]
    assert rates == L.drop_path_rates(0.1, 12) and rates[-1] == 0.1


@pytest.mark.backend_independent
@pytest.mark.parametrize("rate, error", [(-0.1, ValueError), (1.0, ValueError), (1.5, ValueError),
                                         (float("nan"), ValueError), ("0.1", TypeError), (True, TypeError)])
def test_bad_rates_are_refused_by_name(rate, error):
    match = r"drop_path_rate must be .*\[0, 1\)"
    with pytest.raises(error, match=match):
        ViTConfig(**TINY, drop_path_rate=rate)
    with pytest.raises(error, match=match):
        keras_vit.VisionTransformer(**TINY, drop_path_rate=rate)
    with pytest.raises(error, match="TransformerBlock: " + match):
        L.TransformerBlock(2, 16, drop_path_rate=rate)
    if error is ValueError:
        with pytest.raises(error, match=match):
            keras_vit.ViT_Ti16(image_size=32, drop_path_rate=rate)


@pytest.mark.backend_independent
def test_the_rate_a_file_records_is_kept(tmp_path, caplog):
    """A Hugging Face DINOv2 config records `drop_path_rate` (its every block's; keras-vit's rises to it),
    keras-hub's DINOv2 backbone too; a ViT config records none, nor does a timm state dict."""
    transformers = pytest.importorskip("transformers")
    from keras_vit.weights import hf, keras_hub, timm

    config = transformers.Dinov2Config(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, patch_size=8,
                                       image_size=32, mlp_ratio=2, drop_path_rate=0.2)
    transformers.Dinov2Model(config).save_pretrained(tmp_path / "dinov2")
    with caplog.at_level(logging.INFO, logger="keras_vit"):
        model = keras_vit.from_huggingface(tmp_path / "dinov2")
    assert [model.get_layer(f"encoderblock_{i}").drop_path_rate for i in range(2)] == [0.0, 0.2]
    assert "drop_path_rate=0.2" in caplog.text
    again = keras_vit.from_huggingface(tmp_path / "dinov2", drop_path_rate=0.0)  # an override wins
    assert again.get_layer("encoderblock_1").drop_path_rate == 0.0
    vit = hf.architecture({"model_type": "vit", "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2,
                           "intermediate_size": 64, "patch_size": 8, "image_size": 32, "hidden_act": "gelu",
                           "layer_norm_eps": 1e-12}, {"embeddings.patch_embeddings.projection.weight": np.zeros(1)})
    assert "drop_path_rate" not in vit
    hub = keras_hub._family_arguments("DINOV2Backbone", {"intermediate_dim": 64, "drop_path_rate": 0.3})
    assert hub["drop_path_rate"] == 0.3
    tensors = {"patch_embed.proj.weight": np.zeros((32, 3, 8, 8)), "pos_embed": np.zeros((1, 17, 32)),
               "cls_token": np.zeros((1, 1, 32)), "blocks.0.norm1.weight": np.zeros(32),
               "blocks.0.norm1.bias": np.zeros(32)}
    assert "drop_path_rate" not in timm.architecture(tensors)
