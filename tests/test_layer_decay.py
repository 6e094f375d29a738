"""Layer-wise learning-rate decay in both recipes; run under each KERAS_BACKEND.

Each test trains the same tiny ViT twice from the same weights on the same batch, once without
decay and once with it, and compares the first update of every variable: with decay it must be the
plain update times `decay ** (depth - i)` for block i (the head at 1, the embeddings at
`decay ** (depth + 1)`), the multiplier derived here from the variable's path."""

import re

import keras
import numpy as np
import pytest

import keras_vit
from keras_vit import recipes

DEPTH = 3
CONFIG = dict(image_size=16, patch_size=8, hidden_size=8, mlp_dim=16, num_heads=2, num_layers=DEPTH, classes=3,
              classifier_activation=None)
BATCH = 8
rng = np.random.default_rng(0)
X = rng.uniform(-1, 1, (BATCH, 16, 16, 3)).astype("float32")
Y = rng.integers(0, 3, BATCH)


def expected_multiplier(path, decay):
    block = re.match(r"encoderblock_(\d+)/", path)
    if block:
        return decay ** (DEPTH - int(block.group(1)))
    if path.split("/")[0] in ("embedding", "posembed_input", "cls"):
        return decay ** (DEPTH + 1)
    assert path.split("/")[0] in ("encoder_norm", "head"), path
    return 1.0


def model_with_random_weights():
    keras.utils.set_random_seed(0)
    model = keras_vit.VisionTransformer(**CONFIG)
    values = np.random.default_rng(1)
    for v in model.trainable_variables:  # the head starts at zero: no encoder gradient without this
        v.assign(values.normal(0, 0.3, v.shape).astype("float32"))
    return model


_RUNS = {}


class _EpochEnds(keras.callbacks.Callback):
    def __init__(self, values):
        super().__init__()
        self.values = values

    def on_epoch_end(self, epoch, logs=None):
        self.values.append({v.path: keras.ops.convert_to_numpy(v) for v in self.model.trainable_variables})


def updates(compile_fn, epochs=1, **kwargs):
    """[{path: how far `model.fit` had moved it}, one per epoch] over `epochs` passes over the batch (one update
    each; micro-batches of `device_batch_size` when given); the last is after `fit` (with EMA: the averages).
    Each run is made once per module: the epoch-1 update of a two-epoch run is the update of a one-epoch run
    (the schedule is set by total_steps), so one fit serves the tests that compare the same run."""
    key = (compile_fn.__name__, epochs, tuple(sorted(kwargs.items())))
    if key not in _RUNS:
        model = model_with_random_weights()
        before = {v.path: keras.ops.convert_to_numpy(v) for v in model.trainable_variables}
        compile_fn(model, total_steps=10, warmup_steps=0, global_clipnorm=None, jit_compile=False, **kwargs)
        ends = []
        model.fit(X, Y, batch_size=kwargs.get("device_batch_size") or BATCH, epochs=epochs, shuffle=False, verbose=0,
                  callbacks=[_EpochEnds(ends)])
        ends[-1] = {v.path: keras.ops.convert_to_numpy(v) for v in model.trainable_variables}
        _RUNS[key] = [{path: values[path] - before[path] for path in before} for values in ends]
    return _RUNS[key]


ULP2 = 2 * float(np.spacing(np.float32(2)))


def assert_scaled(decayed, plain, decay):
    seen = set()
    for path, delta in plain.items():
        multiplier = expected_multiplier(path, decay)
        seen.add(multiplier)
        # the key bias adds the same logit to every key of a query: softmax ignores it, its gradient is 0
        if not path.endswith("key/bias"):
            assert np.abs(delta).max() > 1e-4, f"{path} did not move: the comparison would prove nothing"
        # float32 weights of |w| < 2 round each update to within an ulp (2.4e-7)
        np.testing.assert_allclose(decayed[path], multiplier * delta, rtol=1e-4, atol=ULP2, err_msg=path)
    assert len(seen) == DEPTH + 2, seen


SGD = dict(base_lr=10.0, momentum=0.0)  # one update, linear in the rate: large, so that every weight moves


def decayed_sgd():
    """The two updates of the decayed SGD run (its first read by three tests)."""
    return updates(recipes.compile_for_finetuning, epochs=2, layer_decay=0.5, **SGD)


def test_finetuning_sgd_update_of_block_i_is_decay_to_the_depth_minus_i():
    (plain,) = updates(recipes.compile_for_finetuning, **SGD)
    decayed = decayed_sgd()[0]
    assert_scaled(decayed, plain, 0.5)


def test_pretraining_adamw_scales_the_update_and_the_weight_decay():
    kwargs = dict(base_lr=0.01, weight_decay=0.5, decay="cosine")
    (plain,) = updates(recipes.compile_for_pretraining, **kwargs)
    (decayed,) = updates(recipes.compile_for_pretraining, layer_decay=0.75, **kwargs)
    assert_scaled(decayed, plain, 0.75)


def test_with_gradient_accumulation():
    # two micro-batches of 4 make the one update, equal to the update of the batch of 8
    kwargs = dict(batch_size=BATCH, device_batch_size=BATCH // 2, **SGD)
    (plain,) = updates(recipes.compile_for_finetuning, **kwargs)
    (decayed,) = updates(recipes.compile_for_finetuning, layer_decay=0.5, **kwargs)
    assert_scaled(decayed, plain, 0.5)
    whole = decayed_sgd()[0]
    for path, delta in whole.items():
        np.testing.assert_allclose(decayed[path], delta, rtol=1e-4, atol=ULP2, err_msg=path)


def test_with_ema():
    # Keras' average starts at the weights after the first update, then average = m * average + (1 - m) * w:
    # after two updates the model holds m * w1 + (1 - m) * w2 of the decayed run without EMA
    one, two = decayed_sgd()
    ema = updates(recipes.compile_for_finetuning, epochs=2, layer_decay=0.5, ema=True, ema_momentum=0.25, **SGD)[-1]
    for path, delta in ema.items():
        assert path.endswith("key/bias") or np.abs(two[path] - one[path]).max() > 1e-4, path
        np.testing.assert_allclose(delta, 0.25 * one[path] + 0.75 * two[path], rtol=1e-4, atol=4 * ULP2,
                                   err_msg=path)


def test_one_decay_is_the_plain_recipe():
    (plain,) = updates(recipes.compile_for_finetuning, **SGD)
    (one,) = updates(recipes.compile_for_finetuning, layer_decay=1.0, **SGD)
    for path, delta in plain.items():
        np.testing.assert_allclose(one[path], delta, rtol=1e-6, atol=ULP2)


@pytest.mark.backend_independent
@pytest.mark.parametrize("value", [0, -0.5, 1.5, "0.75", True, float("nan")])
def test_bad_decay_is_refused(value):
    model = model_with_random_weights()
    with pytest.raises((ValueError, TypeError), match="layer_decay"):
        recipes.compile_for_finetuning(model, total_steps=10, layer_decay=value)


@pytest.mark.backend_independent
def test_a_model_without_blocks_is_refused():
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2, name="head")])
    with pytest.raises(ValueError, match="encoderblock_<i>"):
        recipes.compile_for_pretraining(model, total_steps=10, layer_decay=0.75)


@pytest.mark.backend_independent
def test_the_scales_table():
    model = model_with_random_weights()
    scales = recipes.layer_decay_scales(model, 0.75)
    assert set(scales) == {v.path for v in model.trainable_variables}
    for path, scale in scales.items():
        assert scale == pytest.approx(expected_multiplier(path, 0.75), rel=1e-12), path


def test_saved_model_reloads_in_safe_mode_with_its_optimizer(tmp_path):
    model = model_with_random_weights()
    recipes.compile_for_finetuning(model, total_steps=10, warmup_steps=0, layer_decay=0.5, jit_compile=False)
    model.fit(X, Y, batch_size=BATCH, epochs=1, verbose=0)
    model.save(tmp_path / "m.keras")
    again = keras.saving.load_model(tmp_path / "m.keras", safe_mode=True)
    assert type(again.optimizer) is type(model.optimizer)
    assert again.optimizer.scales == model.optimizer.scales
    np.testing.assert_allclose(keras.ops.convert_to_numpy(again(X)), keras.ops.convert_to_numpy(model(X)), atol=1e-6)
