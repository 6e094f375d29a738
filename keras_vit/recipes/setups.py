"""The paper's fine-tuning setups (Table 4, appendix B.1.1) and its learning-rate sweep on a dev split."""

import dataclasses
import gc
import math

import keras

from keras_vit.recipes.checks import _check_positive_float
from keras_vit.recipes.compile import compile_for_finetuning, fit_steps


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

    Args:
        build_model: a callable returning a fresh `keras.Model`.
        train_ds: the training data (repeated, at least ``fit_steps`` batches).
        val_ds: the held-out dev data.
        lrs: the learning rates to try.
        total_steps: optimizer updates per rate.
        warmup_steps: updates of the linear warm-up.
        batch_size: the global batch of one update.
        device_batch_size: images per device and step (gradient accumulation below ``batch_size``).
        seed: the Keras seed every rate starts from.
        verbose: passed to ``fit``.
        eval_steps: batches of ``val_ds`` to evaluate (None: all).
        **compile_kwargs: passed to :func:`compile_for_finetuning`.

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
