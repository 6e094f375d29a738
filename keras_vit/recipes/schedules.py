"""Learning-rate schedules of the paper: linear warm-up, then cosine or linear decay (section 4.1,
appendix B.1)."""

import math

import keras
from keras import ops

from keras_vit.recipes.checks import _check_int, _check_positive_float

_DECAYS = ("cosine", "linear")


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
    """Fine-tuning schedule (paper B.1.1): linear warm-up, then cosine decay to 0.

    Args:
        base_lr: peak learning rate.
        total_steps: optimizer updates of the whole run.
        warmup_steps: updates of the linear warm-up.
        accumulation_steps: the optimizer's gradient accumulation (1 for none).

    Returns:
        A `WarmupDecay`.
    """
    return WarmupDecay(base_lr, total_steps, warmup_steps, "cosine", accumulation_steps)


def pretrain_schedule(base_lr, total_steps, warmup_steps=10_000, decay="linear",
                      accumulation_steps=1):
    """Pre-training schedule (paper 4.1, B.1): 10k-step linear warm-up, linear (or cosine) decay to 0.

    Args:
        base_lr: peak learning rate.
        total_steps: optimizer updates of the whole run.
        warmup_steps: updates of the linear warm-up.
        decay: "linear" or "cosine".
        accumulation_steps: the optimizer's gradient accumulation (1 for none).

    Returns:
        A `WarmupDecay`.
    """
    return WarmupDecay(base_lr, total_steps, warmup_steps, decay, accumulation_steps)
