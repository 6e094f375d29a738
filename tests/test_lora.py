"""LoRA on keras-vit models (Keras' enable_lora on the block projections); run under each KERAS_BACKEND."""

import json
import os
import shutil

import keras
import numpy as np
import pytest

import keras_vit
from conftest import TINY, photos
from keras_vit import lora, recipes

BACKEND = keras.backend.backend()


def random_model(seed=0, **overrides):
    """TINY with every weight drawn at random (seeded), so that each one matters to the output."""
    model = keras_vit.VisionTransformer(**{**TINY, **overrides})
    for i, v in enumerate(model.weights):
        v.assign(np.random.default_rng(seed + i).normal(0, 0.3, v.shape).astype("float32"))
    return model


def with_adapters(model, rank=4, targets=("query", "value"), alpha=None, seed=100):
    """LoRA on, with B away from its zero start so the adapters change the output; A and B seeded here (A's own
    initializer draws from Keras' global generator, whose state depends on the tests run before)."""
    lora.enable_lora(model, rank, targets=targets, alpha=alpha)
    for i, layer in enumerate(lora.lora_layers(model)):
        a = layer.lora_kernel_a
        a.assign(np.random.default_rng(seed + 1000 + i).normal(0, a.shape[0] ** -0.5, a.shape).astype("float32"))
        layer.lora_kernel_b.assign(np.random.default_rng(seed + i).normal(0, 0.3, layer.lora_kernel_b.shape))
    return model


def numpy_of(model):
    return {v.path: keras.ops.convert_to_numpy(v) for v in model.weights}


@pytest.fixture(scope="module")
def images():
    return keras_vit.preprocess_input(photos(TINY["image_size"]).astype("float32"))


def out(model, x):
    return keras.ops.convert_to_numpy(model(x))


def test_trainable_weights_are_the_adapters_and_the_head():
    model = lora.enable_lora(random_model(), 4, targets=("query", "value", "mlp"))
    names = sorted(v.path for v in model.trainable_weights)
    blocks = [f"encoderblock_{i}" for i in range(TINY["num_layers"])]
    layers = [f"{b}/{p}" for b in blocks for p in ("MultiHeadDotProductAttention_1/query",
                                                   "MultiHeadDotProductAttention_1/value", "Dense_0", "Dense_1")]
    assert names == sorted([f"{layer}/lora_kernel_{ab}" for layer in layers for ab in "ab"] + ["head/bias", "head/kernel"])
    d, heads, rank = TINY["hidden_size"], TINY["num_heads"], 4
    count = sum(int(np.prod(v.shape)) for v in model.trainable_weights)
    per_block = 2 * (d * heads * rank + rank * d // heads) + (d * rank + rank * TINY["mlp_dim"]) * 2
    assert count == TINY["num_layers"] * per_block + (d + 1) * TINY["classes"]


def test_adapted_kernel_is_w_plus_scaled_a_b_in_numpy(images):
    """The LoRA model (fused q/k/v and MLP paths reading `layer.kernel`) equals a plain model whose
    kernels are W + alpha / rank * A @ B computed here in numpy."""
    model = with_adapters(random_model(), rank=4, targets=("query", "key", "value", "out", "mlp"), alpha=2.0)
    plain = random_model()
    weights = numpy_of(model)
    for layer in lora.lora_layers(model):
        a, b = weights[f"{layer.path}/lora_kernel_a"], weights[f"{layer.path}/lora_kernel_b"]
        kernel = plain.get_layer(layer.path.split("/")[0])
        for name in layer.path.split("/")[1:]:
            kernel = getattr(kernel, {"MultiHeadDotProductAttention_1": "attention", "Dense_0": "mlp_0",
                                      "Dense_1": "mlp_1"}.get(name, name))
        kernel.kernel.assign(weights[f"{layer.path}/kernel"] + 0.5 * np.matmul(a, b))
    expected = out(plain, images)
    assert np.abs(expected - out(random_model(), images)).max() > 1e-2  # the adapters matter
    np.testing.assert_allclose(out(model, images), expected, atol=1e-5, rtol=0)


def test_fit_moves_only_the_adapters_and_the_head(images):
    model = lora.enable_lora(random_model(), 2)
    recipes.compile_for_finetuning(model, total_steps=3, warmup_steps=0, base_lr=0.1, batch_size=3, jit_compile=False)
    before = numpy_of(model)
    model.fit(images, np.array([1, 2, 3]), batch_size=3, epochs=3, verbose=0)  # A moves once B has
    after = numpy_of(model)
    trained = {v.path for v in model.trainable_weights}
    for path, value in before.items():
        moved = not np.array_equal(value, after[path])
        assert moved == (path in trained), path


def test_save_and_load_hold_only_the_adapters_and_the_head(images, tmp_path):
    model = with_adapters(random_model(), targets=("query", "value", "out"))
    lora.save_lora(model, tmp_path / "adapters.npz")
    with np.load(tmp_path / "adapters.npz", allow_pickle=False) as f:
        files = set(f.files)
        meta = json.loads(str(f["__keras_vit_lora__"]))
    assert files - {"__keras_vit_lora__"} == {v.path for v in model.trainable_weights}
    assert meta["rank"] == 4 and meta["targets"] == ["query", "value", "out"]
    fresh = random_model()  # the same base weights, LoRA off
    lora.load_lora(fresh, tmp_path / "adapters.npz")
    np.testing.assert_array_equal(out(fresh, images), out(model, images))
    assert sorted(v.path for v in fresh.trainable_weights) == sorted(v.path for v in model.trainable_weights)
    again = with_adapters(random_model(), targets=("query", "value", "out"), seed=7)  # LoRA on, other values
    np.testing.assert_array_equal(out(lora.load_lora(again, tmp_path / "adapters.npz"), images), out(model, images))


@pytest.mark.backend_independent
def test_any_file_name_holds_the_adapters_and_an_empty_file_is_refused(images, tmp_path):
    """numpy appends ".npz" to a name without it: save_lora once wrote a 0-byte file and left the adapters in a
    hidden temporary beside it."""
    model = with_adapters(random_model())
    lora.save_lora(model, tmp_path / "adapters.lora")
    assert os.listdir(tmp_path) == ["adapters.lora"]
    np.testing.assert_array_equal(out(lora.load_lora(random_model(), tmp_path / "adapters.lora"), images),
                                  out(model, images))
    (tmp_path / "empty.lora").write_bytes(b"")
    with pytest.raises(ValueError, match="empty.lora as a LoRA adapter file"):
        lora.load_lora(random_model(), tmp_path / "empty.lora")


@pytest.mark.parametrize("make, match", [
    (lambda: random_model(num_layers=3), "projections"),
    (lambda: random_model(classes=5), "head/kernel: expected"),
    (lambda: with_adapters(random_model(), rank=2), "rank-4 adapters"),
    (lambda: with_adapters(random_model(), targets=("query",)), "rank-4 adapters of 4 layers"),
])
def test_adapters_of_another_model_or_rank_are_refused_untouched(make, match, tmp_path):
    lora.save_lora(with_adapters(random_model()), tmp_path / "a.npz")
    model = make()
    before, lora_before = numpy_of(model), [layer.path for layer in lora.lora_layers(model)]
    with pytest.raises(ValueError, match=match):
        lora.load_lora(model, tmp_path / "a.npz")
    assert [layer.path for layer in lora.lora_layers(model)] == lora_before
    after = numpy_of(model)
    assert after.keys() == before.keys() and all(np.array_equal(before[k], after[k]) for k in before)


@pytest.mark.backend_independent
def test_bad_requests_are_refused_before_anything_changes(tmp_path):
    model = random_model()
    for kwargs, match in [(dict(rank=0), "positive integer"), (dict(rank=1.5), "positive integer"),
                          (dict(rank=True), "positive integer"), (dict(rank=2, targets=("query", "qkv")), "'qkv'"),
                          (dict(rank=2, targets=()), "non-empty"), (dict(rank=2, alpha=-1), "alpha")]:
        with pytest.raises(ValueError, match=match):
            lora.enable_lora(model, **kwargs)
        assert not lora.lora_layers(model) and len(model.trainable_weights) == len(model.weights)
    lora.enable_lora(model, 2)
    with pytest.raises(ValueError, match="already on"):
        lora.enable_lora(model, 4)
    with pytest.raises(ValueError, match="no LoRA adapters"):
        lora.save_lora(random_model(), tmp_path / "none.npz")
    with pytest.raises(ValueError, match="no TransformerBlock"):
        lora.enable_lora(keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)]), 2)
    (tmp_path / "junk.npz").write_bytes(b"not a zip file")
    np.savez(tmp_path / "plain.npz", x=np.zeros(3))
    for name, match in [("junk.npz", "cannot read"), ("plain.npz", "not a LoRA adapter file"),
                        ("missing.npz", "cannot read")]:
        with pytest.raises(ValueError, match=match):
            lora.load_lora(random_model(), tmp_path / name)
    assert sorted(os.listdir(tmp_path)) == ["junk.npz", "plain.npz"]  # nothing half-written


def test_merge_folds_the_adapters_and_exports_the_same_outputs(images, tmp_path):
    model = with_adapters(random_model(), targets=("query", "key", "value", "out", "mlp"))
    merged = lora.merge_lora(model)
    assert not lora.lora_layers(merged) and lora.lora_layers(model)
    assert len(merged.weights) == len(model.weights) - 2 * len(lora.lora_layers(model))
    expected = out(model, images)
    np.testing.assert_allclose(out(merged, images), expected, atol=1e-5, rtol=0)
    pytest.importorskip("onnxruntime")
    from keras_vit.export import export, run

    got = run(export(merged, tmp_path / "onnx", "onnx"), "onnx", photos(TINY["image_size"]))
    np.testing.assert_allclose(got["probabilities"], expected, atol=1e-5, rtol=0)


def test_keras_file_with_lora_on_reloads_in_safe_mode(images, tmp_path):
    """Keras writes an adapted layer's kernel merged: the reloaded model is the merged model."""
    model = with_adapters(random_model())
    model.save(tmp_path / "m.keras")
    reloaded = keras.saving.load_model(tmp_path / "m.keras", safe_mode=True)
    np.testing.assert_allclose(out(reloaded, images), out(model, images), atol=1e-5, rtol=0)


def test_a_training_backup_of_a_lora_model_resumes_to_the_same_adapters(images, tmp_path):
    """Keras writes a LoRA layer's kernel merged and zeroes the adapters on reading, so the backup keeps
    every variable of the model and optimizer instead: 2 epochs, then a fresh model resumed from the
    backup after the first, end with the same adapters and head."""
    labels = np.array([1, 2, 0])

    def fresh():
        keras.utils.set_random_seed(0)  # the adapters' A starts random
        model = lora.enable_lora(random_model(), 2)
        recipes.compile_for_finetuning(model, total_steps=4, base_lr=0.5, warmup_steps=0, batch_size=3,
                                       jit_compile=False)
        return model

    class KeepFirst(keras.callbacks.Callback):  # the backup as the first epoch left it: the next one rewrites it
        def on_epoch_end(self, epoch, logs=None):
            if epoch == 0:
                shutil.copytree(tmp_path / "backup", tmp_path / "first")

    # the uninterrupted run is the one backed up (one fit less): a backup is a copy made between epochs
    whole = fresh()
    whole.fit(images, labels, batch_size=3, epochs=2, verbose=0, shuffle=False,
              callbacks=[recipes.TrainingBackup(tmp_path / "backup", delete_on_end=False), KeepFirst()])
    backup = recipes.TrainingBackup(tmp_path / "first")
    assert os.path.exists(backup.lora_path) and not os.path.exists(backup.path)
    resumed = fresh()
    assert backup.restore(resumed) == 1
    resumed.fit(images, labels, batch_size=3, epochs=2, initial_epoch=1, verbose=0, shuffle=False)
    trained = [keras.ops.convert_to_numpy(v) for v in whole.trainable_variables]
    assert max(np.abs(t).max() for t in trained) > 0  # the adapters learned something
    for a, b in zip(trained, (keras.ops.convert_to_numpy(v) for v in resumed.trainable_variables)):
        np.testing.assert_allclose(b, a, atol=1e-6, rtol=0)
    plain = random_model()
    recipes.compile_for_finetuning(plain, total_steps=4, warmup_steps=0, batch_size=3, jit_compile=False)
    with pytest.raises(ValueError, match="with LoRA"):  # not read into a model without LoRA
        backup.restore(plain)
