"""Training recipes of the ViT paper as plain Keras objects.

Everything here returns ordinary Keras pieces (a learning-rate schedule, a
compiled model, callbacks), so ``model.fit`` stays the user's own call:

    from keras_vit import recipes
    recipes.compile_for_finetuning(model, total_steps=10_000, base_lr=0.01,
                                   batch_size=512, device_batch_size=64)
    model.fit(train, steps_per_epoch=..., epochs=...)

Sources: paper section 4.1 (pre-training: Adam beta1 0.9, beta2 0.999, weight
decay, linear warm-up and decay), appendix B.1.1 and Table 4 (fine-tuning: SGD
momentum 0.9, batch 512, no weight decay, global-norm clipping at 1, cosine
decay, step counts and learning-rate grids, dev splits), and the official code's
500-step fine-tuning warm-up.

Step counting: a schedule built with ``accumulation_steps=k`` counts optimizer
*updates*, i.e. ``total_steps`` updates of ``batch_size`` images each take
``total_steps * k`` calls of ``train_step`` (batches of ``device_batch_size``).
Use :func:`fit_steps` to get the number of batches to give ``model.fit``.
"""

import dataclasses
import gc
import math
import os
import types
import warnings

import keras
import numpy as np
from keras import ops

from keras_vit.distribute import num_replicas
from keras_vit.model import jit_compile_default

__all__ = [
    "WarmupDecay",
    "finetune_schedule",
    "pretrain_schedule",
    "gradient_accumulation_steps",
    "fit_steps",
    "compile_for_finetuning",
    "compile_for_pretraining",
    "SparseCategoricalCrossentropyWithSmoothing",
    "FinetuneSetup",
    "FINETUNE_SETUPS",
    "sweep_learning_rate",
    "NonFiniteLossError",
    "NonFiniteLossStop",
    "TrainingBackup",
]

_DECAYS = ("cosine", "linear")


# --------------------------------------------------------------------------
# argument checks
# --------------------------------------------------------------------------
def _check_int(name, value, minimum):
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"`{name}` must be an integer >= {minimum}; got {value!r}.")
    if value < minimum:
        raise ValueError(f"`{name}` must be an integer >= {minimum}; got {value}.")
    return int(value)


def _check_positive_float(name, value, allow_zero=False):
    if isinstance(value, bool) or not isinstance(value, (int, float, np.number)):
        raise TypeError(f"`{name}` must be a number; got {value!r}.")
    value = float(value)
    ok = value >= 0 if allow_zero else value > 0
    if not math.isfinite(value) or not ok:
        bound = ">= 0" if allow_zero else "> 0"
        raise ValueError(f"`{name}` must be a finite number {bound}; got {value}.")
    return value


# --------------------------------------------------------------------------
# learning-rate schedules
# --------------------------------------------------------------------------
@keras.saving.register_keras_serializable(package="keras_vit")
class WarmupDecay(keras.optimizers.schedules.LearningRateSchedule):
    """Linear warm-up from 0, then cosine or linear decay to 0.

    With ``u`` the update index (``step // accumulation_steps``),
    ``w = warmup_steps`` and ``T = total_steps``:

        progress = clip((u - w) / max(T - w, 1), 0, 1)
        decay    = 0.5 * (1 + cos(pi * progress))   # "cosine"
                   1 - progress                      # "linear"
        lr(u)    = base_lr * decay * min(1, u / w)   # (no warm-up factor if w == 0)

    so ``lr(0) = 0``, ``lr(w) = base_lr`` and ``lr(T) = 0``; past ``T`` it stays 0.

    Args:
        base_lr: peak learning rate, reached at the end of warm-up.
        total_steps: number of optimizer updates of the whole run.
        warmup_steps: number of updates of the linear warm-up (``<= total_steps``).
        decay: ``"cosine"`` or ``"linear"``.
        accumulation_steps: the optimizer's ``gradient_accumulation_steps``
            (1 for none). Keras calls a schedule with the count of
            ``train_step`` calls; dividing by this makes the schedule count
            updates, so ``total_steps`` means updates with or without
            accumulation.
    """

    def __init__(self, base_lr, total_steps, warmup_steps=0, decay="cosine",
                 accumulation_steps=1):
        self.base_lr = _check_positive_float("base_lr", base_lr)
        self.total_steps = _check_int("total_steps", total_steps, 1)
        self.warmup_steps = _check_int("warmup_steps", warmup_steps, 0)
        if self.warmup_steps > self.total_steps:
            raise ValueError(
                f"`warmup_steps` ({self.warmup_steps}) must not exceed "
                f"`total_steps` ({self.total_steps}); pass a shorter warm-up, e.g. "
                f"warmup_steps={self.total_steps // 10}."
            )
        if decay not in _DECAYS:
            raise ValueError(f"`decay` must be one of {_DECAYS}; got {decay!r}.")
        self.decay = decay
        self.accumulation_steps = _check_int("accumulation_steps", accumulation_steps, 1)

    def __call__(self, step):
        step = ops.convert_to_tensor(step)
        if self.accumulation_steps > 1:
            step = ops.floor_divide(step, self.accumulation_steps)
        step = ops.cast(step, "float32")
        span = float(max(self.total_steps - self.warmup_steps, 1))
        progress = ops.clip((step - self.warmup_steps) / span, 0.0, 1.0)
        if self.decay == "cosine":
            factor = 0.5 * (1.0 + ops.cos(math.pi * progress))
        else:
            factor = 1.0 - progress
        if self.warmup_steps > 0:
            factor = factor * ops.minimum(1.0, step / float(self.warmup_steps))
        return self.base_lr * factor

    def get_config(self):
        return {
            "base_lr": self.base_lr,
            "total_steps": self.total_steps,
            "warmup_steps": self.warmup_steps,
            "decay": self.decay,
            "accumulation_steps": self.accumulation_steps,
        }


def finetune_schedule(base_lr, total_steps, warmup_steps=500, accumulation_steps=1):
    """Fine-tuning schedule (paper B.1.1): linear warm-up, then cosine decay to 0."""
    return WarmupDecay(base_lr, total_steps, warmup_steps, "cosine", accumulation_steps)


def pretrain_schedule(base_lr, total_steps, warmup_steps=10_000, decay="linear",
                      accumulation_steps=1):
    """Pre-training schedule (paper 4.1, B.1): 10k-step linear warm-up, linear (or cosine) decay to 0."""
    return WarmupDecay(base_lr, total_steps, warmup_steps, decay, accumulation_steps)


# --------------------------------------------------------------------------
# batch size and accumulation
# --------------------------------------------------------------------------
def gradient_accumulation_steps(batch_size, device_batch_size=None):
    """Number of micro-batches per update: ``batch_size // device_batch_size`` (1 if none).

    Raises a ``ValueError`` unless ``device_batch_size`` divides ``batch_size``.
    """
    batch_size = _check_int("batch_size", batch_size, 1)
    if device_batch_size is None:
        return 1
    device_batch_size = _check_int("device_batch_size", device_batch_size, 1)
    if device_batch_size > batch_size:
        raise ValueError(
            f"`device_batch_size` ({device_batch_size}) must not exceed `batch_size` "
            f"({batch_size}); it is the part of the batch one step holds."
        )
    if batch_size % device_batch_size:
        raise ValueError(
            f"`batch_size` ({batch_size}) must be a multiple of `device_batch_size` "
            f"({device_batch_size}) to accumulate gradients over equal micro-batches; "
            f"e.g. device_batch_size={_largest_divisor(batch_size, device_batch_size)}."
        )
    return batch_size // device_batch_size


def _largest_divisor(n, at_most):
    return max(d for d in range(1, at_most + 1) if n % d == 0)


def fit_steps(model_or_optimizer, updates):
    """Number of batches ``model.fit`` must run for ``updates`` optimizer updates.

    ``updates * gradient_accumulation_steps`` of the compiled optimizer.
    """
    optimizer = getattr(model_or_optimizer, "optimizer", model_or_optimizer)
    if not isinstance(optimizer, keras.optimizers.Optimizer):
        raise TypeError(
            "`fit_steps` expects a compiled keras.Model or a keras optimizer; "
            f"got {type(model_or_optimizer).__name__}."
        )
    updates = _check_int("updates", updates, 0)
    return updates * (optimizer.gradient_accumulation_steps or 1)


# --------------------------------------------------------------------------
# loss selection
# --------------------------------------------------------------------------
@keras.saving.register_keras_serializable(package="keras_vit")
class SparseCategoricalCrossentropyWithSmoothing(keras.losses.Loss):
    """Cross-entropy on integer labels with label smoothing.

    Keras' sparse cross-entropy has no ``label_smoothing``; this one-hot encodes
    the labels to the width of the predictions and uses the categorical loss.
    """

    def __init__(self, from_logits=False, label_smoothing=0.0,
                 name="sparse_categorical_crossentropy_with_smoothing", **kwargs):
        super().__init__(name=name, **kwargs)
        self.from_logits = bool(from_logits)
        self.label_smoothing = float(label_smoothing)

    def call(self, y_true, y_pred):
        num_classes = ops.shape(y_pred)[-1]
        y_true = ops.cast(y_true, "int32")
        if len(y_true.shape) == len(y_pred.shape):
            y_true = ops.squeeze(y_true, axis=-1)
        onehot = ops.one_hot(y_true, num_classes, dtype=y_pred.dtype)
        return keras.losses.categorical_crossentropy(
            onehot, y_pred, from_logits=self.from_logits,
            label_smoothing=self.label_smoothing,
        )

    def get_config(self):
        config = super().get_config()
        config.update(from_logits=self.from_logits, label_smoothing=self.label_smoothing)
        return config


def _outputs_logits(model):
    """True if the model's output layer has a linear activation, False for softmax."""
    if not isinstance(model, keras.Model):
        raise TypeError(f"Expected a keras.Model; got {type(model).__name__}.")
    if not model.layers:
        raise ValueError("The model has no layers; pass `from_logits` explicitly.")
    layer = model.layers[-1]
    if isinstance(layer, keras.layers.Softmax):
        return False
    activation = getattr(layer, "activation", None)
    if activation is None:
        raise ValueError(
            f"Cannot tell whether the output layer {layer.name!r} "
            f"({type(layer).__name__}) returns logits or probabilities; pass "
            "`from_logits=True` or `from_logits=False`."
        )
    name = getattr(activation, "__name__", str(activation))
    if name == "linear":
        return True
    if name == "softmax":
        return False
    raise ValueError(
        f"The output layer {layer.name!r} has activation {name!r}; expected "
        "'linear' (logits) or 'softmax' (probabilities). Pass `from_logits` explicitly."
    )


def _make_loss(model, from_logits, label_smoothing, sparse_labels):
    if from_logits is None:
        from_logits = _outputs_logits(model)
    label_smoothing = _check_positive_float("label_smoothing", label_smoothing, allow_zero=True)
    if label_smoothing >= 1:
        raise ValueError(f"`label_smoothing` must be in [0, 1); got {label_smoothing}.")
    if not sparse_labels:
        return keras.losses.CategoricalCrossentropy(
            from_logits=from_logits, label_smoothing=label_smoothing)
    if label_smoothing:
        return SparseCategoricalCrossentropyWithSmoothing(
            from_logits=from_logits, label_smoothing=label_smoothing)
    return keras.losses.SparseCategoricalCrossentropy(from_logits=from_logits)


def _ema_args(ema, ema_momentum, accumulation):
    if not ema:
        return {}
    ema_momentum = float(ema_momentum)
    if not 0.0 <= ema_momentum < 1.0:
        raise ValueError(f"`ema_momentum` must be in [0, 1); got {ema_momentum}.")
    # Keras updates the average after every train_step, also between
    # accumulated micro-batches when the weights have not moved; taking the
    # k-th root gives the requested momentum per optimizer update.
    return {"use_ema": True, "ema_momentum": ema_momentum ** (1.0 / accumulation)}


def _copy_average_into_weights(optimizer, trainable_variables):
    # Replaces the optimizer's own method on this instance (see _compile).
    averages = optimizer._model_variables_moving_average
    if len(trainable_variables) != len(averages):
        raise ValueError(
            f"Expected {len(averages)} model variables to overwrite with their "
            f"moving averages; got {len(trainable_variables)}."
        )
    for variable, average in zip(trainable_variables, averages):
        if average is not None:
            variable.assign(ops.copy(average.value))


def _compile(model, optimizer, loss, jit_compile, compile_kwargs):
    if optimizer.use_ema:
        # At the end of fit, Keras assigns each EMA average to its weight. On
        # JAX both variables then hold the same buffer, and the next evaluate or
        # predict (which donates the weights' buffers) deletes the average
        # too, so a later model.save fails with "Array has been deleted".
        # Assigning a copy keeps the two buffers apart on every backend.
        optimizer._overwrite_model_variables_with_average_value = types.MethodType(
            _copy_average_into_weights, optimizer)
    if "optimizer" in compile_kwargs or "loss" in compile_kwargs:
        raise TypeError("`optimizer` and `loss` are chosen by the recipe; do not pass them.")
    compile_kwargs.setdefault("metrics", ["accuracy"])
    if isinstance(jit_compile, str) and jit_compile == "auto":
        # XLA-compiled TensorFlow steps cannot reach a MirroredStrategy's per-device variables
        # ("Trying to access resource ... located in device CPU:1 from device CPU:0")
        mirrored = keras.backend.backend() == "tensorflow" and num_replicas() > 1
        jit_compile = jit_compile_default(training=True) and not mirrored
    model.compile(optimizer=optimizer, loss=loss, jit_compile=jit_compile, **compile_kwargs)
    return model


# --------------------------------------------------------------------------
# recipes
# --------------------------------------------------------------------------
def compile_for_finetuning(model, total_steps, base_lr=0.01, warmup_steps=500,
                           batch_size=512, device_batch_size=None, ema=False,
                           label_smoothing=0.0, jit_compile="auto", *,
                           momentum=0.9, global_clipnorm=1.0, ema_momentum=0.9999,
                           from_logits=None, sparse_labels=True, **compile_kwargs):
    """Compile ``model`` with the paper's fine-tuning recipe (B.1.1, Table 4).

    SGD with momentum 0.9, no weight decay, gradient clipping at global norm 1,
    linear warm-up then cosine decay to 0 over ``total_steps`` updates. When
    ``device_batch_size`` is smaller than ``batch_size``, gradients of
    ``batch_size // device_batch_size`` micro-batches are averaged before each
    update (the data pipeline must then yield batches of ``device_batch_size``
    and ``model.fit`` must run ``fit_steps(model, total_steps)`` batches).
    ``ema=True`` keeps a Polyak average of the weights (momentum 0.9999 per
    update) that replaces the weights at the end of ``fit``.

    The loss is cross-entropy on integer labels (``sparse_labels=False`` for
    one-hot labels), from logits when the output layer is linear and from
    probabilities when it is a softmax (or as ``from_logits`` says). Metrics
    default to ``["accuracy"]``; other ``compile`` arguments pass through.
    ``jit_compile="auto"`` takes :func:`keras_vit.jit_compile_default`, the
    setting measured fastest for training on the current backend (XLA on JAX,
    and on TensorFlow also on a CPU, where Keras' own "auto" turns it off;
    eager on torch); ``True``/``False`` override it.

    Returns:
        the same model, compiled.
    """
    accumulation = gradient_accumulation_steps(batch_size, device_batch_size)
    schedule = finetune_schedule(base_lr, total_steps, warmup_steps, accumulation)
    optimizer = keras.optimizers.SGD(
        learning_rate=schedule,
        momentum=_check_positive_float("momentum", momentum, allow_zero=True),
        global_clipnorm=_clipnorm(global_clipnorm),
        gradient_accumulation_steps=accumulation if accumulation > 1 else None,
        **_ema_args(ema, ema_momentum, accumulation),
    )
    loss = _make_loss(model, from_logits, label_smoothing, sparse_labels)
    return _compile(model, optimizer, loss, jit_compile, compile_kwargs)


def compile_for_pretraining(model, total_steps, base_lr=1e-3, weight_decay=0.1,
                            warmup_steps=10_000, decay="linear", label_smoothing=0.0,
                            global_clipnorm=1.0, batch_size=4096, device_batch_size=None,
                            ema=False, jit_compile="auto", *, beta_1=0.9, beta_2=0.999,
                            ema_momentum=0.9999, from_logits=None, sparse_labels=True,
                            **compile_kwargs):
    """Compile ``model`` with the paper's pre-training recipe (4.1, Table 3).

    AdamW (beta1 0.9, beta2 0.999) with decoupled weight decay (Keras applies
    ``weight_decay * learning_rate`` per update), linear warm-up over
    ``warmup_steps`` then linear (or ``decay="cosine"``) decay to 0, optional
    global-norm clipping (``global_clipnorm=None`` to switch off) and label
    smoothing. Dropout is a property of the model (``dropout_rate=0.1`` in the
    paper's ImageNet runs). Batch-size handling, loss and metrics as in
    :func:`compile_for_finetuning`.
    """
    accumulation = gradient_accumulation_steps(batch_size, device_batch_size)
    schedule = pretrain_schedule(base_lr, total_steps, warmup_steps, decay, accumulation)
    optimizer = keras.optimizers.AdamW(
        learning_rate=schedule,
        weight_decay=_check_positive_float("weight_decay", weight_decay, allow_zero=True),
        beta_1=float(beta_1),
        beta_2=float(beta_2),
        global_clipnorm=_clipnorm(global_clipnorm),
        gradient_accumulation_steps=accumulation if accumulation > 1 else None,
        **_ema_args(ema, ema_momentum, accumulation),
    )
    loss = _make_loss(model, from_logits, label_smoothing, sparse_labels)
    return _compile(model, optimizer, loss, jit_compile, compile_kwargs)


def _clipnorm(value):
    if value is None:
        return None
    return _check_positive_float("global_clipnorm", value)


# --------------------------------------------------------------------------
# Table 4
# --------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class FinetuneSetup:
    """One row of the paper's Table 4 plus the matching data splits.

    Attributes:
        dataset: TFDS name.
        total_steps: fine-tuning steps (updates of ``batch_size`` images).
        base_lrs: the learning-rate grid swept on the dev split.
        default_lr: the value the examples use without a sweep (in the grid).
        warmup_steps: linear warm-up length. 500 is the official code's value;
            the paper states none for the 500- and 2500-step runs, where we
            use 10% of the steps.
        dev_fraction: part of ``train_split`` held out for the sweep (B.1.1).
        train_split / test_split: TFDS splits for final training / testing.
        batch_size: 512 for all fine-tuning runs.
        image_size: 384, the paper's fine-tuning resolution.
    """

    dataset: str
    total_steps: int
    base_lrs: tuple
    default_lr: float
    warmup_steps: int
    dev_fraction: float
    train_split: str = "train"
    test_split: str = "test"
    batch_size: int = 512
    image_size: int = 384


FINETUNE_SETUPS = {
    # The paper adds 0.06 to the ImageNet grid for ResNets and hybrids only.
    "imagenet2012": FinetuneSetup("imagenet2012", 20_000, (0.003, 0.01, 0.03, 0.06), 0.03,
                                  500, 0.01, test_split="validation"),
    "cifar10": FinetuneSetup("cifar10", 10_000, (0.001, 0.003, 0.01, 0.03), 0.01, 500, 0.02),
    "cifar100": FinetuneSetup("cifar100", 10_000, (0.001, 0.003, 0.01, 0.03), 0.01, 500, 0.02),
    "oxford_iiit_pet": FinetuneSetup("oxford_iiit_pet", 500, (0.001, 0.003, 0.01, 0.03), 0.01,
                                     50, 0.10),
    "oxford_flowers102": FinetuneSetup("oxford_flowers102", 500, (0.001, 0.003, 0.01, 0.03),
                                       0.01, 50, 0.10),
    # VTAB-1k: 1000 training images per task, 200 of them (20%) the validation set.
    "vtab": FinetuneSetup("vtab", 2_500, (0.01,), 0.01, 250, 0.20),
}


# --------------------------------------------------------------------------
# learning-rate sweep
# --------------------------------------------------------------------------
def sweep_learning_rate(build_model, train_ds, val_ds, lrs, total_steps, *,
                        warmup_steps=500, batch_size=512, device_batch_size=None,
                        seed=0, verbose=0, eval_steps=None, **compile_kwargs):
    """Pick the fine-tuning learning rate as the paper does (B.1.1).

    For each rate, builds a fresh model with ``build_model()`` (the Keras seed
    is reset to ``seed`` first, so every rate starts from the same weights),
    compiles it with :func:`compile_for_finetuning`, trains ``total_steps``
    updates on ``train_ds`` (the training part of the train split; it must
    yield at least ``fit_steps`` batches, e.g. a repeated dataset) and measures
    accuracy on ``val_ds`` (the held-out dev part, e.g.
    ``keras_vit.data.load(..., dev_fraction=0.02)``). A run whose loss turns
    non-finite scores ``nan`` and is not selected.

    Returns:
        ``(accuracies, best_lr)``: a dict ``lr -> dev accuracy`` in the order of
        ``lrs`` and the rate with the highest accuracy (the first on ties).
    """
    if not callable(build_model):
        raise TypeError("`build_model` must be a callable returning a fresh keras.Model.")
    lrs = [float(lr) for lr in lrs]
    if not lrs:
        raise ValueError("`lrs` must name at least one learning rate.")
    for lr in lrs:
        _check_positive_float("lr", lr)
    accuracies = {}
    for lr in lrs:
        keras.utils.set_random_seed(seed)
        model = build_model()
        if not isinstance(model, keras.Model):
            raise TypeError(f"`build_model()` must return a keras.Model; got {type(model).__name__}.")
        compile_for_finetuning(model, total_steps, base_lr=lr, warmup_steps=warmup_steps,
                               batch_size=batch_size, device_batch_size=device_batch_size,
                               **compile_kwargs)
        steps = fit_steps(model, total_steps)
        history = model.fit(train_ds, epochs=1, steps_per_epoch=steps, verbose=verbose,
                            shuffle=False,
                            callbacks=[keras.callbacks.TerminateOnNaN()])
        losses = history.history.get("loss", [float("nan")])
        if not all(math.isfinite(v) for v in losses):
            accuracies[lr] = float("nan")
        else:
            result = model.evaluate(val_ds, steps=eval_steps, verbose=verbose, return_dict=True)
            accuracies[lr] = float(_accuracy_of(result))
        del model
        gc.collect()
    finite = [lr for lr in lrs if math.isfinite(accuracies[lr])]
    if not finite:
        raise RuntimeError(f"Every learning rate diverged (non-finite loss): {lrs}.")
    best = max(finite, key=lambda lr: accuracies[lr])
    return accuracies, best


def _accuracy_of(result):
    for key in ("accuracy", "sparse_categorical_accuracy", "categorical_accuracy"):
        if key in result:
            return result[key]
    for key, value in result.items():
        if "acc" in key:
            return value
    raise KeyError(f"No accuracy metric among the evaluation results {sorted(result)}.")


# --------------------------------------------------------------------------
# callbacks
# --------------------------------------------------------------------------
class NonFiniteLossError(RuntimeError):
    """Raised by :class:`NonFiniteLossStop` when the training loss is nan or inf."""


class NonFiniteLossStop(keras.callbacks.Callback):
    """Stop training when the loss turns nan or inf, naming the step.

    Checks the loss after every batch. On a non-finite loss it stops training
    and, with ``raise_error=True`` (default), raises :class:`NonFiniteLossError`
    at once, so no later callback (e.g. a checkpoint at the epoch end) can save
    the broken weights: the last checkpoint written before stays the last good
    one. With ``raise_error=False`` it sets ``model.stop_training`` and warns.

    Args:
        checkpoint_hint: optional text (e.g. a path) named in the message as
            the place of the last good checkpoint.
        raise_error: raise instead of only stopping.

    Attributes:
        stopped_step: global batch index (1-based) of the first non-finite loss,
            or None.
    """

    def __init__(self, checkpoint_hint=None, raise_error=True):
        super().__init__()
        self.checkpoint_hint = checkpoint_hint
        self.raise_error = raise_error
        self.stopped_step = None
        self._epoch = 0

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        loss = (logs or {}).get("loss")
        if loss is None:
            return
        loss = float(loss)
        if math.isfinite(loss):
            return
        steps = (self.params or {}).get("steps") or 0
        self.stopped_step = self._epoch * steps + batch + 1
        self.model.stop_training = True
        where = (f" The last good checkpoint is {self.checkpoint_hint}."
                 if self.checkpoint_hint else "")
        message = (
            f"Training loss became {loss} at step {self.stopped_step} (epoch "
            f"{self._epoch + 1}, batch {batch + 1}); training stopped.{where} "
            "Try a lower learning rate, check the inputs for nan/inf, and that "
            "the labels lie in [0, classes)."
        )
        if self.raise_error:
            raise NonFiniteLossError(message)
        warnings.warn(message, RuntimeWarning, stacklevel=2)


class TrainingBackup(keras.callbacks.Callback):
    """Back up the training state at epoch ends, atomically, for resuming.

    A resumable counterpart of ``keras.callbacks.BackupAndRestore`` that makes
    the resume point explicit:

        backup = recipes.TrainingBackup(out / "backup")
        done = backup.restore(model)          # train_step calls already done
        initial_epoch = done // steps_per_epoch
        train = data.load(..., skip_batches=done)   # data from the same point
        model.fit(train, initial_epoch=initial_epoch, ..., callbacks=[backup])

    Differences that matter for exact resumes: the weights file (model and
    optimizer variables, so also the step counter and any EMA) is written to a
    temporary name and then renamed, so a run killed while saving still has
    the previous backup; and the resume point is read from the optimizer's own
    step counter inside that file, so it can never disagree with the weights.
    A backup is not written when the epoch's loss is non-finite.

    Args:
        backup_dir: folder for the backup (created when needed).
        delete_on_end: remove the backup when ``fit`` ends normally.
    """

    FILENAME = "latest.weights.h5"

    def __init__(self, backup_dir, delete_on_end=True):
        super().__init__()
        if not backup_dir:
            raise ValueError("`backup_dir` must be a folder path.")
        self.backup_dir = os.fspath(backup_dir)
        self.delete_on_end = delete_on_end
        self.path = os.path.join(self.backup_dir, self.FILENAME)

    def exists(self):
        return os.path.exists(self.path)

    def restore(self, model):
        """Load the backup into a compiled ``model``; return the train_step calls done (0 if none)."""
        optimizer = getattr(model, "optimizer", None)
        if optimizer is None:
            raise ValueError("Compile the model before restoring its training state.")
        if not self.exists():
            return 0
        if not model.built:
            raise ValueError("Build the model (e.g. call it once) before restoring.")
        if not optimizer.built:
            optimizer.build(model.trainable_variables)
        model.load_weights(self.path)
        # optimizer.iterations counts updates; one update is
        # gradient_accumulation_steps train_step calls.
        updates = int(keras.ops.convert_to_numpy(optimizer.iterations))
        return updates * (optimizer.gradient_accumulation_steps or 1)

    def on_train_begin(self, logs=None):
        accumulation = getattr(self.model.optimizer, "gradient_accumulation_steps", None) or 1
        steps = (self.params or {}).get("steps")
        if accumulation > 1 and steps and steps % accumulation:
            raise ValueError(
                f"steps_per_epoch ({steps}) must be a multiple of the optimizer's "
                f"gradient_accumulation_steps ({accumulation}) so that every backup "
                "falls on an update boundary and a resumed run is exact."
            )

    def on_epoch_end(self, epoch, logs=None):
        loss = (logs or {}).get("loss")
        if loss is not None and not math.isfinite(float(loss)):
            return
        os.makedirs(self.backup_dir, exist_ok=True)
        tmp = os.path.join(self.backup_dir, f".tmp-{os.getpid()}.weights.h5")
        self.model.save_weights(tmp, overwrite=True)
        os.replace(tmp, self.path)

    def on_train_end(self, logs=None):
        if self.delete_on_end and not self.model.stop_training:
            if os.path.exists(self.path):
                os.remove(self.path)
            try:
                os.rmdir(self.backup_dir)
            except OSError:
                pass
