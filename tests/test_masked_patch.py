"""Masked patch prediction (paper 4.6, B.1.2): corruption ratios, targets, learnable tokens, training."""

import os

import keras
import numpy as np
import pytest
from conftest import TINY

from keras_vit import VisionTransformer
from keras_vit.layers.patch_corruption import MaskedPatchCorruption
from keras_vit.layers.patch_targets import MaskedPatchTargets
from keras_vit.masked_patch import (MaskedPatchPredictor, color_classes, compile_for_masked_patch_prediction,
                                    patch_targets)
from keras_vit.weights import load_weights, save_npz

ENCODER = {k: v for k, v in TINY.items() if k != "classes"}


def _np(x):
    return keras.ops.convert_to_numpy(x)


def test_corruption_follows_the_ratios_over_many_draws():
    layer = MaskedPatchCorruption(seed=0)
    b, n, d = 500, 16, 4
    # every patch a distinct constant vector, so each output token tells where it came from
    tokens = np.broadcast_to(np.arange(1, n + 1, dtype="float32")[None, :, None], (b, n, d)).copy()
    layer.build(tokens.shape)
    layer.mask_token.assign(np.full((1, 1, d), -7.0, "float32"))
    out, corrupted = (_np(t) for t in layer(tokens))
    corrupted = corrupted.astype(bool)
    assert (corrupted.sum(1) == n // 2).all()  # exactly 50% of each image
    value = out[..., 0]
    masked = corrupted & (value == -7.0)
    kept = corrupted & (value == tokens[..., 0])
    replaced = corrupted & ~masked & ~kept
    total = corrupted.sum()
    # 4000 corrupted patches: the binomial standard error of 10% is 0.5 points
    assert abs(masked.sum() / total - 0.8) < 0.025
    assert abs(replaced.sum() / total - 0.1) < 0.02
    assert abs(kept.sum() / total - 0.1) < 0.02
    # replaced by another patch of the same image; untouched where not corrupted
    assert np.isin(value[replaced], np.arange(1, n + 1)).all()
    assert (out[~corrupted] == tokens[~corrupted]).all()
    # each patch is corrupted as often as any other (uniform over positions)
    assert np.abs(corrupted.mean(0) - 0.5).max() < 0.1
    # the next call draws anew
    _, again = layer(tokens)
    assert (_np(again).astype(bool) != corrupted).any()


def test_color_classes_by_hand():
    # bins of [-1, 1] in 8 levels: -1 -> 0, -0.74 -> 1, 0.01 -> 4, 1 -> 7 (clipped)
    colours = np.array([[-1.0, -1.0, -1.0], [1.0, 1.0, 1.0], [-0.74, 0.01, 1.0]])
    assert color_classes(colours).tolist() == [0, 511, 1 * 64 + 4 * 8 + 7]


@pytest.mark.parametrize("target", ["mean_color", "downsized_color", "pixels"])
def test_targets_layer_equals_numpy(target, rng):
    images = rng.uniform(-1, 1, (3, 16, 24, 3)).astype("float32")
    got = _np(MaskedPatchTargets(8, target)(images))
    want = patch_targets(images, 8, target)
    n = (16 // 8) * (24 // 8)
    shape = {"mean_color": (3, n, 1), "downsized_color": (3, n, 16), "pixels": (3, n, 192)}[target]
    assert got.shape == want.shape == shape
    if target == "pixels":
        np.testing.assert_allclose(got, want, atol=1e-6)
    else:
        # float32 vs float64 means can straddle a bin edge only on ties; random data has none
        assert (got == want).all()
        assert 0 <= got.min() and got.max() < 512


def test_numpy_targets_of_constant_patches(rng):
    """An image of constant-colour 8x8 patches: every target is that colour's class."""
    colours = rng.uniform(-1, 1, (2, 3, 3))  # a 2x3 grid of colours
    images = np.repeat(np.repeat(colours, 8, axis=0), 8, axis=1)[None]
    want = color_classes(colours.reshape(6, 3))
    assert patch_targets(images, 8, "mean_color")[0, :, 0].tolist() == want.tolist()
    assert (patch_targets(images, 8, "downsized_color")[0] == want[:, None]).all()


def test_mask_and_class_tokens_learn_and_save(tmp_path, rng):
    images = rng.uniform(-1, 1, (8, 32, 32, 3)).astype("float32")
    model = MaskedPatchPredictor(VisionTransformer(**ENCODER, include_top=False), seed=0)
    compile_for_masked_patch_prediction(model, total_steps=4, base_lr=1e-2, warmup_steps=0, batch_size=8)
    mask0, cls0 = _np(model.corruption.mask_token).copy(), _np(model.parts.cls.cls).copy()
    model.fit(images, batch_size=8, epochs=2, verbose=0)
    mask1, cls1 = _np(model.corruption.mask_token), _np(model.parts.cls.cls)
    assert not np.allclose(mask0, mask1) and not np.allclose(cls0, cls1)
    path = str(tmp_path / "ssl.keras")
    model.save(path)
    again = keras.saving.load_model(path, safe_mode=True)
    np.testing.assert_array_equal(_np(again.corruption.mask_token), mask1)
    np.testing.assert_array_equal(_np(again.parts.cls.cls), cls1)
    # the encoder as an official checkpoint, loaded by the fine-tuning path
    npz = str(tmp_path / "encoder.npz")
    save_npz(model.encoder, npz)
    finetune = VisionTransformer(**TINY, weights=npz, classifier_activation=None)
    np.testing.assert_array_equal(_np(finetune.get_layer("cls").cls), cls1)
    np.testing.assert_array_equal(_np(finetune.get_layer("encoderblock_1").mlp_0.kernel),
                                  _np(model.encoder.get_layer("encoderblock_1").mlp_0.kernel))


# the paper's target on every lane; the other two (their targets are tested per backend above) on torch only
@pytest.mark.parametrize("target", ["mean_color", pytest.param("downsized_color", marks=pytest.mark.backend_independent),
                                    pytest.param("pixels", marks=pytest.mark.backend_independent)])
def test_tiny_self_supervised_run_lowers_its_loss(target, rng):
    keras.utils.set_random_seed(0)
    images = np.clip(rng.normal(0, 0.5, (64, 32, 32, 3)), -1, 1).astype("float32")
    model = MaskedPatchPredictor(VisionTransformer(**ENCODER, include_top=False), target=target, seed=0)
    compile_for_masked_patch_prediction(model, total_steps=40, base_lr=1e-3, warmup_steps=4, batch_size=16)
    loss = model.fit(images, batch_size=16, epochs=10, verbose=0).history["loss"]
    assert loss[-1] < 0.9 * loss[0], loss


def test_bad_arguments():
    with pytest.raises(ValueError, match="rate"):
        MaskedPatchCorruption(rate=0.0)
    with pytest.raises(ValueError, match="sum to"):
        MaskedPatchCorruption(mask_fraction=0.8, random_fraction=0.3)
    with pytest.raises(ValueError, match="unknown target"):
        MaskedPatchTargets(8, "edges")
    with pytest.raises(ValueError, match="divide"):
        MaskedPatchTargets(6, "downsized_color")
    with pytest.raises(TypeError, match="MaskedPatchPredictor"):
        compile_for_masked_patch_prediction(VisionTransformer(**TINY), total_steps=2)
