"""Tests for keras_vit.recipes; run under each KERAS_BACKEND."""

import json
import math
import os

import keras
import numpy as np
import pytest
from keras import ops

from keras_vit import recipes


def lr_at(schedule, step):
    return float(ops.convert_to_numpy(schedule(step)))


def closed_form(step, base, total, warmup, decay):
    """The paper's schedule written out independently, in plain Python."""
    warm = min(1.0, step / warmup) if warmup else 1.0
    p = min(max((step - warmup) / (total - warmup), 0.0), 1.0)
    d = 0.5 * (1 + math.cos(math.pi * p)) if decay == "cosine" else 1 - p
    return base * warm * d


def tiny_model(inputs=3, classes=2, activation=None, seed=0):
    keras.utils.set_random_seed(seed)
    return keras.Sequential([
        keras.Input((inputs,)),
        keras.layers.Dense(classes, activation=activation, name="head"),
    ])


def weights_of(model):
    return [np.array(ops.convert_to_numpy(w)) for w in model.get_weights()]


def toy_data(n=16, inputs=3, classes=2, seed=1):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, inputs)).astype("float32")
    y = rng.integers(0, classes, size=(n,)).astype("int32")
    return x, y


# ----------------------------------------------------------------- schedules
@pytest.mark.parametrize("decay", ["cosine", "linear"])
def test_schedule_matches_closed_form(decay):
    base, total, warmup = 0.03, 1000, 100
    s = recipes.WarmupDecay(base, total, warmup, decay)
    assert lr_at(s, 0) == 0.0
    assert lr_at(s, warmup) == pytest.approx(base, rel=1e-6)
    assert lr_at(s, total) == pytest.approx(0.0, abs=1e-9)
    assert lr_at(s, total + 50) == pytest.approx(0.0, abs=1e-9)
    for step in (1, 50, 99, 101, 400, 550, 999):
        assert lr_at(s, step) == pytest.approx(closed_form(step, base, total, warmup, decay),
                                               rel=1e-5, abs=1e-9)


def test_finetune_and_pretrain_schedule_defaults():
    f = recipes.finetune_schedule(0.01, 10_000)
    assert (f.decay, f.warmup_steps) == ("cosine", 500)
    assert lr_at(f, 500) == pytest.approx(0.01)
    # halfway through the cosine part the rate is half the peak
    assert lr_at(f, 500 + 4750) == pytest.approx(0.005, rel=1e-5)
    p = recipes.pretrain_schedule(1e-3, 100_000)
    assert (p.decay, p.warmup_steps) == ("linear", 10_000)
    assert lr_at(p, 55_000) == pytest.approx(5e-4, rel=1e-5)


def test_schedule_without_warmup_and_all_warmup():
    s = recipes.WarmupDecay(0.1, 10, 0)
    assert lr_at(s, 0) == pytest.approx(0.1)
    s = recipes.WarmupDecay(0.1, 10, 10)  # warm-up over the whole run
    assert lr_at(s, 5) == pytest.approx(0.05)
    assert lr_at(s, 10) == pytest.approx(0.1)


def test_schedule_counts_updates_with_accumulation():
    plain = recipes.finetune_schedule(0.01, 100, 10)
    accumulated = recipes.finetune_schedule(0.01, 100, 10, accumulation_steps=4)
    for update in (0, 3, 10, 57, 100):
        for micro in range(4):
            assert lr_at(accumulated, 4 * update + micro) == pytest.approx(
                lr_at(plain, update), rel=1e-6, abs=1e-12)


def test_schedule_serialization_round_trip():
    s = recipes.pretrain_schedule(2e-4, 1000, 100, decay="cosine", accumulation_steps=2)
    assert s.get_config() == {"base_lr": 2e-4, "total_steps": 1000, "warmup_steps": 100,
                              "decay": "cosine", "accumulation_steps": 2}
    blob = json.dumps(keras.saving.serialize_keras_object(s))
    back = keras.saving.deserialize_keras_object(json.loads(blob))
    assert isinstance(back, recipes.WarmupDecay)
    assert back.get_config() == s.get_config()
    assert lr_at(back, 333) == lr_at(s, 333)


@pytest.mark.parametrize("kwargs, match", [
    (dict(base_lr=0.0), "base_lr"),
    (dict(base_lr=float("nan")), "base_lr"),
    (dict(total_steps=0), "total_steps"),
    (dict(warmup_steps=-1), "warmup_steps"),
    (dict(warmup_steps=2000), "must not exceed"),
    (dict(decay="step"), "decay"),
    (dict(accumulation_steps=0), "accumulation_steps"),
])
def test_schedule_bad_input(kwargs, match):
    args = dict(base_lr=0.01, total_steps=1000, warmup_steps=10)
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        recipes.WarmupDecay(**args)


def test_schedule_rejects_non_integer_steps():
    with pytest.raises(TypeError, match="total_steps"):
        recipes.WarmupDecay(0.1, 10.5)


# ------------------------------------------------------------------ compile
def test_recipes_take_the_measured_jit_default_and_let_it_be_overridden():
    # measured fastest for training on a CPU (benchmarks/README.md): XLA on JAX and on TensorFlow
    # (where Keras' own "auto" turns it off on a CPU), eager on torch
    expected = {"jax": True, "tensorflow": True, "torch": False}[keras.backend.backend()]
    for compile_fn in (recipes.compile_for_finetuning, recipes.compile_for_pretraining):
        model = compile_fn(tiny_model(), total_steps=10, warmup_steps=1)
        assert model.jit_compile is expected
    model = recipes.compile_for_finetuning(tiny_model(), total_steps=10, warmup_steps=1, jit_compile=False)
    assert model.jit_compile is False


def test_compile_for_finetuning_builds_the_paper_optimizer():
    model = tiny_model()
    out = recipes.compile_for_finetuning(model, total_steps=1000)
    assert out is model
    opt = model.optimizer
    assert isinstance(opt, keras.optimizers.SGD)
    assert opt.momentum == pytest.approx(0.9)
    assert opt.global_clipnorm == pytest.approx(1.0)
    assert not opt.weight_decay
    assert not opt.use_ema
    assert opt.gradient_accumulation_steps is None
    assert isinstance(opt._learning_rate, recipes.WarmupDecay)
    assert opt._learning_rate.get_config()["decay"] == "cosine"
    assert isinstance(model.loss, keras.losses.SparseCategoricalCrossentropy)
    assert model.loss.get_config()["from_logits"] is True


def test_loss_from_probabilities_for_softmax_output():
    model = tiny_model(activation="softmax")
    recipes.compile_for_finetuning(model, total_steps=10, warmup_steps=1)
    assert model.loss.get_config()["from_logits"] is False


def test_loss_detection_refuses_unknown_activation():
    model = tiny_model(activation="sigmoid")
    with pytest.raises(ValueError, match="sigmoid"):
        recipes.compile_for_finetuning(model, total_steps=10, warmup_steps=1)
    recipes.compile_for_finetuning(model, total_steps=10, warmup_steps=1, from_logits=False)


def test_label_smoothing_loss_matches_reference():
    model = tiny_model()
    recipes.compile_for_finetuning(model, total_steps=10, warmup_steps=1, label_smoothing=0.1)
    loss = model.loss
    assert isinstance(loss, recipes.SparseCategoricalCrossentropyWithSmoothing)
    logits = np.array([[2.0, -1.0, 0.5], [0.0, 0.3, -2.0]], "float32")
    labels = np.array([2, 0])
    target = np.full((2, 3), 0.1 / 3) + 0.9 * np.eye(3)[labels]
    logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    expected = float(np.mean(-(target * logp).sum(-1)))
    got = float(ops.convert_to_numpy(loss(labels, logits)))
    assert got == pytest.approx(expected, rel=1e-5)
    back = keras.losses.deserialize(keras.losses.serialize(loss))
    assert back.get_config() == loss.get_config()


def test_one_hot_labels():
    model = tiny_model()
    recipes.compile_for_finetuning(model, total_steps=10, warmup_steps=1, sparse_labels=False,
                                   label_smoothing=0.1)
    assert isinstance(model.loss, keras.losses.CategoricalCrossentropy)
    x, y = toy_data()
    model.fit(x, np.eye(2)[y], batch_size=8, epochs=1, verbose=0)


def test_gradient_accumulation_equals_one_big_batch():
    x, y = toy_data(n=24)
    big = tiny_model(seed=3)
    recipes.compile_for_finetuning(big, total_steps=3, base_lr=0.5, warmup_steps=0,
                                   batch_size=8)
    small = tiny_model(seed=3)
    recipes.compile_for_finetuning(small, total_steps=3, base_lr=0.5, warmup_steps=0,
                                   batch_size=8, device_batch_size=2)
    assert small.optimizer.gradient_accumulation_steps == 4
    start = weights_of(big)
    for a, b in zip(start, weights_of(small)):
        np.testing.assert_array_equal(a, b)
    big.fit(x, y, batch_size=8, shuffle=False, epochs=1, verbose=0)
    small.fit(x, y, batch_size=2, shuffle=False, epochs=1, verbose=0)
    assert int(ops.convert_to_numpy(small.optimizer.iterations)) == 3
    for a, b, s in zip(weights_of(big), weights_of(small), start):
        assert not np.allclose(a, s)  # training moved the weights
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_global_norm_clipping_caps_the_first_update():
    # Inputs of size 100 give gradients with a global norm far above 1.
    x = np.full((4, 3), 100.0, "float32")
    y = np.array([0, 0, 0, 0])

    def first_update(clipnorm):
        model = tiny_model(seed=5)
        recipes.compile_for_finetuning(model, total_steps=10, base_lr=0.1, warmup_steps=0,
                                       batch_size=4, global_clipnorm=clipnorm)
        before = weights_of(model)
        model.fit(x, y, batch_size=4, epochs=1, verbose=0)
        return math.sqrt(sum(float(np.sum((a - b) ** 2))
                             for a, b in zip(weights_of(model), before)))

    # First SGD-momentum step: delta = -lr * g, so |delta| = lr * min(|g|, 1).
    assert first_update(1.0) == pytest.approx(0.1, rel=1e-4)
    assert first_update(None) > 1.0


def test_ema_variables_and_values_follow_the_reference():
    x, y = toy_data(n=12)
    model = tiny_model(seed=2)
    recipes.compile_for_finetuning(model, total_steps=6, base_lr=0.3, warmup_steps=0,
                                   batch_size=2, ema=True, ema_momentum=0.5)
    opt = model.optimizer
    assert opt.use_ema and opt.ema_momentum == pytest.approx(0.5)

    seen = []

    class Record(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            seen.append(weights_of(self.model))

    model.fit(x, y, batch_size=2, shuffle=False, epochs=1, verbose=0, callbacks=[Record()])
    names = [v.path for v in opt.variables]
    assert sum("average" in n for n in names) == len(model.trainable_variables)
    # Keras starts the average at the first updated weights, then
    # avg = m * avg + (1 - m) * w after every update.
    expected = seen[0]
    for w in seen[1:]:
        expected = [0.5 * a + 0.5 * b for a, b in zip(expected, w)]
    for a, b in zip(weights_of(model), expected):  # fit ends by loading the average
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_ema_momentum_is_per_update_with_accumulation():
    model = tiny_model()
    recipes.compile_for_finetuning(model, total_steps=10, warmup_steps=1, batch_size=8,
                                   device_batch_size=2, ema=True)
    assert model.optimizer.ema_momentum ** 4 == pytest.approx(0.9999, rel=1e-9)


def test_ema_model_can_be_evaluated_and_saved(tmp_path):
    x, y = toy_data()
    model = tiny_model()
    recipes.compile_for_finetuning(model, total_steps=4, warmup_steps=1, batch_size=4, ema=True)
    model.fit(x, y, batch_size=4, epochs=1, verbose=0)
    model.evaluate(x, y, verbose=0)
    model.predict(x, verbose=0)
    path = str(tmp_path / "m.keras")
    model.save(path)
    back = keras.saving.load_model(path)
    for a, b in zip(weights_of(model), weights_of(back)):
        np.testing.assert_array_equal(a, b)
    assert isinstance(back.optimizer._learning_rate, recipes.WarmupDecay)


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(batch_size=512, device_batch_size=100), ValueError, "multiple of"),
    (dict(batch_size=64, device_batch_size=128), ValueError, "must not exceed"),
    (dict(batch_size=0), ValueError, "batch_size"),
    (dict(warmup_steps=500, total_steps=100), ValueError, "warmup_steps"),
    (dict(label_smoothing=1.0), ValueError, "label_smoothing"),
    (dict(ema=True, ema_momentum=1.5), ValueError, "ema_momentum"),
    (dict(global_clipnorm=-1.0), ValueError, "global_clipnorm"),
    (dict(optimizer="adam"), ValueError, "`optimizer` must be one of 'sgd', 'adamw', 'lamb'; got 'adam'"),
    (dict(loss="mse"), TypeError, "chosen by the recipe"),
])
def test_compile_bad_input(kwargs, error, match):
    args = dict(total_steps=1000)
    args.update(kwargs)
    with pytest.raises(error, match=match):
        recipes.compile_for_finetuning(tiny_model(), **args)


def test_compile_refuses_non_models():
    with pytest.raises(TypeError, match="keras.Model"):
        recipes.compile_for_finetuning("ViT_B16", total_steps=10, warmup_steps=1)


def test_accumulation_helpers():
    assert recipes.gradient_accumulation_steps(512) == 1
    assert recipes.gradient_accumulation_steps(512, 512) == 1
    assert recipes.gradient_accumulation_steps(512, 64) == 8
    with pytest.raises(ValueError, match="device_batch_size=96"):
        recipes.gradient_accumulation_steps(480, 100)
    model = tiny_model()
    recipes.compile_for_finetuning(model, 10, warmup_steps=1, batch_size=8, device_batch_size=2)
    assert recipes.fit_steps(model, 10) == 40


def test_compile_for_pretraining():
    model = tiny_model()
    recipes.compile_for_pretraining(model, total_steps=1000, warmup_steps=100,
                                    label_smoothing=0.1, batch_size=32, device_batch_size=16)
    opt = model.optimizer
    assert isinstance(opt, keras.optimizers.AdamW)
    assert (opt.beta_1, opt.beta_2) == (pytest.approx(0.9), pytest.approx(0.999))
    assert opt.weight_decay == pytest.approx(0.1)
    assert opt.global_clipnorm == pytest.approx(1.0)
    assert opt.gradient_accumulation_steps == 2
    cfg = opt._learning_rate.get_config()
    assert cfg == {"base_lr": 1e-3, "total_steps": 1000, "warmup_steps": 100,
                   "decay": "linear", "accumulation_steps": 2}
    x, y = toy_data(n=32)
    model.fit(x, y, batch_size=16, epochs=1, verbose=0)
    assert int(ops.convert_to_numpy(opt.iterations)) == 1  # 2 micro-batches, 1 update
    recipes.compile_for_pretraining(tiny_model(), 100, warmup_steps=10, decay="cosine",
                                    global_clipnorm=None)


def test_pretraining_weight_decay_is_decoupled():
    # With zero gradients (lr schedule aside) AdamW only shrinks the weights:
    # w <- w - lr * wd * w.
    model = tiny_model(seed=4)
    recipes.compile_for_pretraining(model, total_steps=10, base_lr=0.1, weight_decay=0.5,
                                    warmup_steps=0, batch_size=4)
    before = weights_of(model)
    zero = [ops.zeros(v.shape) for v in model.trainable_variables]
    model.optimizer.apply_gradients(zip(zero, model.trainable_variables))
    for a, b in zip(weights_of(model), before):
        np.testing.assert_allclose(a, b * (1 - 0.1 * 0.5), rtol=1e-6, atol=1e-7)


# --------------------------------------------------------------- Table 4
@pytest.mark.backend_independent
def test_finetune_setups_follow_table_4():
    s = recipes.FINETUNE_SETUPS
    assert set(s) == {"cifar10", "cifar100", "oxford_iiit_pet", "oxford_flowers102",
                      "imagenet2012", "vtab"}
    assert (s["imagenet2012"].total_steps, s["cifar10"].total_steps,
            s["oxford_iiit_pet"].total_steps, s["vtab"].total_steps) == (20_000, 10_000, 500, 2_500)
    assert s["cifar100"].base_lrs == (0.001, 0.003, 0.01, 0.03)
    assert s["vtab"].base_lrs == (0.01,)
    assert (s["cifar10"].dev_fraction, s["oxford_flowers102"].dev_fraction,
            s["imagenet2012"].dev_fraction) == (0.02, 0.10, 0.01)
    for setup in s.values():
        assert setup.default_lr in setup.base_lrs
        assert 0 < setup.warmup_steps <= setup.total_steps
        assert (setup.batch_size, setup.image_size) == (512, 384)


# -------------------------------------------------------------------- sweep
def test_sweep_learning_rate_picks_the_rate_that_learns():
    rng = np.random.default_rng(0)
    y = rng.integers(0, 2, size=64).astype("int32")
    x = (rng.normal(size=(64, 3)) + 3.0 * (2 * y[:, None] - 1)).astype("float32")
    import tensorflow as tf

    train = tf.data.Dataset.from_tensor_slices((x[:48], y[:48])).repeat().batch(8)
    val = tf.data.Dataset.from_tensor_slices((x[48:], y[48:])).batch(16)
    built = []

    def build():
        model = tiny_model(seed=11)
        # start from a head that gets every dev example wrong
        model.get_layer("head").set_weights([np.array([[0.1, -0.1]] * 3, "float32"),
                                             np.zeros(2, "float32")])
        built.append(model)
        return model

    accs, best = recipes.sweep_learning_rate(build, train, val, lrs=[1e-6, 0.3], total_steps=6,
                                             warmup_steps=0, batch_size=8)
    assert list(accs) == [1e-6, 0.3]
    assert len(built) == 2 and built[0] is not built[1]
    assert accs[0.3] == pytest.approx(1.0)
    assert accs[1e-6] == pytest.approx(0.0)
    assert best == 0.3


def test_sweep_reports_divergence():
    import tensorflow as tf

    x = np.full((8, 3), np.nan, "float32")
    y = np.zeros(8, "int32")
    ds = tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(4)
    with pytest.raises(RuntimeError, match="diverged"):
        recipes.sweep_learning_rate(tiny_model, ds, ds, lrs=[0.1], total_steps=2,
                                    warmup_steps=0, batch_size=4, eval_steps=1)
    with pytest.raises(ValueError, match="at least one"):
        recipes.sweep_learning_rate(tiny_model, ds, ds, lrs=[], total_steps=2)


# ---------------------------------------------------------------- callbacks
def test_non_finite_loss_stops_with_step_and_keeps_last_good_backup(tmp_path):
    x, y = toy_data(n=16)
    x[10] = np.nan  # batch 6 of epoch 2 (batch size 2, 4 batches per epoch) -> step 6
    model = tiny_model()
    recipes.compile_for_finetuning(model, total_steps=8, warmup_steps=0, batch_size=2)
    backup = recipes.TrainingBackup(tmp_path / "backup")
    stop = recipes.NonFiniteLossStop(checkpoint_hint=backup.path)
    import tensorflow as tf

    ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(2)
    with pytest.raises(recipes.NonFiniteLossError, match=r"step 6 \(epoch 2, batch 2\)"):
        model.fit(ds, epochs=2, steps_per_epoch=4, verbose=0, shuffle=False,
                  callbacks=[stop, backup])
    assert stop.stopped_step == 6
    assert backup.exists()  # epoch 1's backup is kept, and it is finite
    fresh = tiny_model()
    recipes.compile_for_finetuning(fresh, total_steps=8, warmup_steps=0, batch_size=2)
    assert backup.restore(fresh) == 4
    assert all(np.isfinite(w).all() for w in weights_of(fresh))


def test_non_finite_loss_stop_without_raising():
    x, y = toy_data(n=8)
    x[:] = np.inf
    model = tiny_model()
    recipes.compile_for_finetuning(model, total_steps=8, warmup_steps=0, batch_size=2)
    stop = recipes.NonFiniteLossStop(raise_error=False)
    with pytest.warns(RuntimeWarning, match="step 1"):
        history = model.fit(x, y, batch_size=2, epochs=3, verbose=0, callbacks=[stop])
    assert len(history.history["loss"]) == 1


def test_training_backup_resumes_to_the_same_weights(tmp_path):
    x, y = toy_data(n=16)

    def fresh():
        model = tiny_model(seed=9)
        recipes.compile_for_finetuning(model, total_steps=16, base_lr=0.2, warmup_steps=2,
                                       batch_size=4, device_batch_size=2, ema=True)
        return model

    straight = fresh()
    straight.fit(x, y, batch_size=2, shuffle=False, epochs=4, verbose=0)

    backup = recipes.TrainingBackup(tmp_path / "b", delete_on_end=False)
    first = fresh()
    assert backup.restore(first) == 0
    first.fit(x, y, batch_size=2, shuffle=False, epochs=2, verbose=0, callbacks=[backup])
    assert backup.exists()

    second = fresh()  # a new process would start here
    done = backup.restore(second)
    assert done == 16  # two epochs of 8 micro-batches
    second.fit(x, y, batch_size=2, shuffle=False, epochs=4, initial_epoch=done // 8, verbose=0)
    for a, b in zip(weights_of(straight), weights_of(second)):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)


def test_training_backup_is_removed_after_a_normal_end(tmp_path):
    x, y = toy_data(n=8)
    model = tiny_model()
    recipes.compile_for_finetuning(model, total_steps=4, warmup_steps=0, batch_size=4)
    backup = recipes.TrainingBackup(tmp_path / "b")
    model.fit(x, y, batch_size=4, epochs=2, verbose=0, callbacks=[backup])
    assert not backup.exists() and not os.path.exists(tmp_path / "b")


def test_training_backup_refuses_epochs_off_update_boundaries(tmp_path):
    x, y = toy_data(n=6)
    model = tiny_model()
    recipes.compile_for_finetuning(model, total_steps=8, warmup_steps=0, batch_size=4,
                                   device_batch_size=2)
    with pytest.raises(ValueError, match="multiple of"):
        model.fit(x, y, batch_size=2, epochs=1, verbose=0,
                  callbacks=[recipes.TrainingBackup(tmp_path / "b")])
    assert not os.path.exists(tmp_path / "b")


def test_weight_decay_shrinks_the_kernels_only():
    """AdamW's decoupled decay, one update with zero gradients (Adam's own step is then 0): every kernel
    shrinks by lr x decay, and nothing else moves: the biases (the attention's are 2-D), the norms, the
    class and distillation tokens, the position embeddings (timm's `no_weight_decay`)."""
    import keras_vit

    model = keras_vit.VisionTransformer(image_size=16, patch_size=8, hidden_size=16, mlp_dim=32, num_heads=2,
                                        num_layers=1, classes=3, distillation_token=True)
    recipes.compile_for_finetuning(model, total_steps=10, base_lr=0.1, warmup_steps=0, optimizer="adamw",
                                   weight_decay=0.5, batch_size=2, jit_compile=False)
    before = {v.path: ops.convert_to_numpy(v) for v in model.trainable_variables}
    model.optimizer.apply_gradients([(ops.zeros(v.shape), v) for v in model.trainable_variables])
    kept = {v.path for v in recipes.not_decayed(model)}
    assert {"cls/cls", "dist/tokens", "posembed_input/pos_embedding",
            "encoderblock_0/MultiHeadDotProductAttention_1/query/bias"} <= kept
    for v in model.trainable_variables:
        after = ops.convert_to_numpy(v)
        if v.path in kept:
            np.testing.assert_array_equal(after, before[v.path], err_msg=v.path)
        else:
            assert v.name == "kernel", v.path
            np.testing.assert_allclose(after, before[v.path] * (1 - 0.1 * 0.5), rtol=1e-6, err_msg=v.path)
