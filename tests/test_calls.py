"""A bad batch or an interrupted call: one clear message on every backend, and the model as it was.

On JAX, Keras empties the variables for the length of fit/evaluate/predict; without
keras_vit.calls a failed or interrupted call leaves them empty for ever after."""

import keras
import numpy as np
import pytest

import keras_vit
from conftest import TINY

X = np.random.default_rng(0).uniform(-1, 1, (8, 32, 32, 3)).astype("float32")
Y = np.arange(8) % TINY["classes"]


def _compiled():
    # one block: what a failed or interrupted call leaves does not depend on the depth; a block less to trace
    model = keras_vit.VisionTransformer(**{**TINY, "num_layers": 1})
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    return model


def _weights(model):
    return [v.numpy() for v in model.weights]


def _assert_unchanged(model, weights, outputs):
    for before, after in zip(weights, _weights(model)):
        np.testing.assert_array_equal(before, after)
    np.testing.assert_array_equal(model.predict(X, verbose=0), outputs)


CALLS = {
    "predict": lambda m, x: m.predict(x, verbose=0),
    "predict_on_batch": lambda m, x: m.predict_on_batch(x),
    "evaluate": lambda m, x: m.evaluate(x, Y[: len(x)], verbose=0),
    "test_on_batch": lambda m, x: m.test_on_batch(x, Y[: len(x)]),
    "fit": lambda m, x: m.fit(x, Y[: len(x)], verbose=0),
    "train_on_batch": lambda m, x: m.train_on_batch(x, Y[: len(x)]),
}
BAD = {
    "size": ((2, 48, 48, 3), r"model 'vit' takes images of shape \(batch, 32, 32, 3\), got a batch of shape \(2, 48, 48, 3\)"),
    "channels": ((2, 32, 32, 1), r"takes images with 3 channels \(RGB\) on the last axis, got a batch of shape \(2, 32, 32, 1\)"),
    "no_batch_axis": ((32, 32, 3), r"takes images of shape \(batch, 32, 32, 3\), got an array of shape \(32, 32, 3\)"),
}


@pytest.fixture(scope="module")
def refusing():
    """A compiled model, its outputs on X and its weights, shared by the tests of batches refused as they come (no
    step runs on them): each test asserts the model as it was, so a call that left it changed fails there."""
    model = _compiled()
    return model, model.predict(X, verbose=0), _weights(model)


@pytest.mark.parametrize("bad", BAD)
def test_a_bad_batch_is_refused_by_every_call_with_what_the_model_takes(bad, refusing):
    shape, match = BAD[bad]
    model, outputs, weights = refusing
    for name, call in CALLS.items():
        with pytest.raises(ValueError, match=match):
            call(model, np.zeros(shape, "float32"))
        _assert_unchanged(model, weights, outputs)


def test_a_bad_batch_from_a_generator_is_named_as_it_is_drawn(refusing):
    model, outputs, weights = refusing

    def batches():
        yield (X[:2],)
        yield (np.zeros((2, 48, 48, 3), "float32"),)

    with pytest.raises(ValueError, match=r"takes images of shape \(batch, 32, 32, 3\), got a batch of shape \(2, 48"):
        model.predict(batches(), verbose=0)
    _assert_unchanged(model, weights, outputs)


class TwoSizes(keras.utils.PyDataset):
    """A good batch, then one of another size (not checked ahead: it fails inside the step)."""

    def __init__(self, labels):
        super().__init__()
        self.labels = labels

    def __len__(self):
        return 2

    def __getitem__(self, i):
        x = X[:2] if i == 0 else np.zeros((2, 48, 48, 3), "float32")
        return (x, Y[:2]) if self.labels else (x,)


@pytest.mark.parametrize("call", ["predict", "evaluate", "fit"])
def test_a_batch_failing_inside_the_step_leaves_the_weights(call):
    model = _compiled()
    outputs, weights = model.predict(X, verbose=0), _weights(model)
    run = {"predict": lambda: model.predict(TwoSizes(False), verbose=0),
           "evaluate": lambda: model.evaluate(TwoSizes(True), verbose=0),
           "fit": lambda: model.fit(TwoSizes(True), verbose=0)}[call]
    with pytest.raises(Exception):
        run()
    candidates = [(weights, outputs)]
    if call == "fit":  # unchanged, or moved by exactly the good batch's step (when it ran before the bad one came)
        reference = _compiled()
        reference.set_weights(weights)
        reference.train_on_batch(X[:2], Y[:2])
        candidates.append((_weights(reference), reference.predict(X, verbose=0)))
    after, predicted = _weights(model), model.predict(X, verbose=0)
    assert any(all(np.allclose(a, b, atol=1e-6, rtol=0) for a, b in zip(after, w)) and
               np.allclose(predicted, o, atol=1e-6, rtol=0) for w, o in candidates)


@pytest.mark.parametrize("call", ["train_on_batch", "test_on_batch", "fit", "evaluate"])
def test_labels_failing_inside_the_step_leave_the_weights(call):
    model = _compiled()
    outputs, weights = model.predict(X, verbose=0), _weights(model)
    labels = np.zeros((8, 3, 5), "float32")  # no sparse labels for a 10-class head
    with pytest.raises(Exception):
        getattr(model, call)(X, labels, **({} if call.endswith("batch") else {"verbose": 0}))
    _assert_unchanged(model, weights, outputs)


class InterruptAt(keras.callbacks.Callback):
    def __init__(self, batch):
        super().__init__()
        self.batch = batch

    def on_predict_batch_end(self, batch, logs=None):
        if batch == self.batch:
            raise KeyboardInterrupt

    on_test_batch_end = on_train_batch_end = on_predict_batch_end


@pytest.mark.parametrize("call", ["predict", "evaluate"])
def test_keyboard_interrupt_mid_call_leaves_the_weights(call):
    model = _compiled()
    outputs, weights = model.predict(X, verbose=0), _weights(model)
    kwargs = dict(batch_size=2, callbacks=[InterruptAt(1)], verbose=0)
    with pytest.raises(KeyboardInterrupt):
        model.predict(X, **kwargs) if call == "predict" else model.evaluate(X, Y, **kwargs)
    _assert_unchanged(model, weights, outputs)


def test_keyboard_interrupt_mid_fit_keeps_the_steps_made():
    model = _compiled()
    reference = _compiled()
    reference.set_weights(_weights(model))
    with pytest.raises(KeyboardInterrupt):
        model.fit(X, Y, batch_size=2, shuffle=False, callbacks=[InterruptAt(1)], verbose=0)
    reference.fit(X[:4], Y[:4], batch_size=2, shuffle=False, verbose=0)  # the same two steps
    for ours, ref in zip(_weights(model), _weights(reference)):
        np.testing.assert_allclose(ours, ref, atol=1e-6, rtol=0)
    np.testing.assert_allclose(model.predict(X, verbose=0), reference.predict(X, verbose=0), atol=1e-6, rtol=0)


def test_any_size_model_names_a_size_that_does_not_tile():
    model = keras_vit.VisionTransformer(**{**TINY, "image_size": None}, input_shape=(None, None, 3))
    with pytest.raises(ValueError, match=r"takes images of shape \(batch, any height, any width, 3\), got a batch of "
                                         r"shape \(1, 36, 32, 3\): the height 36 is not a multiple of 8 pixels"):
        model.predict(np.zeros((1, 36, 32, 3), "float32"), verbose=0)
    assert model.predict(np.zeros((1, 40, 32, 3), "float32"), verbose=0).shape == (1, TINY["classes"])


@pytest.mark.skipif(keras.backend.backend() != "tensorflow", reason="TensorFlow's tf.function traces")
@pytest.mark.parametrize("data", ["dataset", "on_batch"])
def test_the_step_is_traced_once_on_tensorflow_and_trains_as_keras_alone(data, monkeypatch):
    """keras_vit.calls.TracesOnce: fit and evaluate trace their steps once (Keras alone, without a distribution
    strategy, builds the optimizer and the metrics inside the first trace, and TensorFlow traces again), and the
    run is the one Keras makes alone: the same losses, metrics and weights."""
    import tensorflow as tf

    from keras_vit.calls import TracesOnce

    def run():
        keras.utils.set_random_seed(3)
        model = keras_vit.VisionTransformer(**{**TINY, "num_layers": 1, "dropout_rate": 0.1})
        model.compile(optimizer=keras.optimizers.AdamW(1e-2), loss="sparse_categorical_crossentropy",
                      metrics=["accuracy"])
        traces = {"train": 0, "test": 0}
        for kind in traces:
            step = getattr(model, f"{kind}_step")

            def counted(batch, kind=kind, step=step):
                traces[kind] += 1
                return step(batch)

            setattr(model, f"{kind}_step", counted)
        if data == "on_batch":  # evaluation first: Keras alone makes the metrics' variables in its first trace
            out = [model.test_on_batch(X, Y), model.train_on_batch(X, Y), model.train_on_batch(X, Y)]
        else:
            feed = tf.data.Dataset.from_tensor_slices((X, Y)).batch(3)
            out = [model.evaluate(feed, verbose=0), model.fit(feed, epochs=2, verbose=0).history["loss"],
                   model.evaluate(feed, verbose=0)]
        return traces, out, _weights(model)

    traces, out, weights = run()
    monkeypatch.delattr(TracesOnce, "_maybe_symbolic_build")
    keras_traces, keras_out, keras_weights = run()
    assert traces == {"train": 1, "test": 1} and keras_traces == {"train": 2, "test": 2}, (traces, keras_traces)
    for ours, theirs in zip(out, keras_out):
        np.testing.assert_allclose(ours, theirs, rtol=1e-6)
    for ours, theirs in zip(weights, keras_weights):
        np.testing.assert_allclose(ours, theirs, rtol=1e-6, atol=1e-7)
