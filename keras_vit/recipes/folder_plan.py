"""The schedule of a `keras-vit finetune DIR` run from its folder's size (`plan`, `schedule`): the batch, the
device batch and gradient accumulation, updates and epochs, warm-up; one rule for square and NaFlex runs."""

import math
import typing

# the paper's fine-tuning batch (Table 4), the ceiling of the size rule
PAPER_BATCH = 512
DEFAULT_EPOCHS = 10
DEVICE_BATCH = 32  # the most images a device step holds by default
WARMUP_FRACTION = 0.05  # the paper's 500 warm-up updates of 10,000 (CIFAR)


class Plan(typing.NamedTuple):
    """The run's schedule (see `plan`): `steps_per_epoch` device steps of `device_batch_size` images make
    `updates_per_epoch` optimizer updates of `batch_size` images, `accumulation` steps an update."""

    batch_size: int
    device_batch_size: int
    accumulation: int
    updates_per_epoch: int
    epochs: int
    warmup: int

    @property
    def steps_per_epoch(self):
        return self.updates_per_epoch * self.accumulation


def plan(num_train, batch_size=None, device_batch_size=None, epochs=None, steps=None):
    """The `Plan` of a run on `num_train` training images, square or NaFlex alike: `schedule`'s batch,
    epochs and warm-up, and the device batch (`device_batch_size`, default the largest divisor of the
    batch at most `DEVICE_BATCH`). Both feeds stream endlessly, so an epoch is a whole number of updates
    whatever the folder's size and every backup falls on an update boundary.

    Raises:
        ValueError: a device batch larger than the batch or not dividing it (naming one that does).
    """
    from keras_vit.recipes.compile import gradient_accumulation_steps

    batch, per_epoch, epochs, warmup = schedule(num_train, batch_size, epochs, steps)
    device = device_batch_size or max(d for d in range(1, min(batch, DEVICE_BATCH) + 1) if batch % d == 0)
    return Plan(batch, device, gradient_accumulation_steps(batch, device), per_epoch, epochs, warmup)


def schedule(num_train, batch_size=None, epochs=None, steps=None):
    """(batch, updates per epoch, epochs, warm-up updates) for `num_train` training images.

    The rule: the batch is the paper's 512, or the largest power of two at most a quarter of the training
    images when that is smaller (8 at least); an epoch is one pass, ceil(num_train / batch) updates;
    10 epochs unless `epochs` or `steps` says otherwise (`steps` is rounded up to whole epochs of at most
    one pass each); the first 5% of the updates warm up.
    """
    if batch_size is None:
        batch_size = max(8, min(PAPER_BATCH, 2 ** int(math.log2(max(1, num_train // 4)))))
    per_epoch = -(-num_train // batch_size)
    if steps is not None:
        per_epoch = min(per_epoch, steps)
        epochs = -(-steps // per_epoch)
    epochs = epochs or DEFAULT_EPOCHS
    return batch_size, per_epoch, epochs, math.ceil(WARMUP_FRACTION * per_epoch * epochs)


__all__ = ["Plan", "plan", "schedule"]
