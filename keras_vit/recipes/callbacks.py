"""Callbacks that keep long training safe: stop on a non-finite loss, back up and resume."""

import math
import os
import warnings

import keras

from keras_vit.fileio import atomic_write
from keras_vit.lora import lora_layers


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
        _refuse_lora(model)
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
        _refuse_lora(self.model)
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
        with atomic_write(self.path) as tmp:
            self.model.save_weights(tmp, overwrite=True)

    def on_train_end(self, logs=None):
        if self.delete_on_end and not self.model.stop_training:
            if os.path.exists(self.path):
                os.remove(self.path)
            try:
                os.rmdir(self.backup_dir)
            except OSError:
                pass


def _refuse_lora(model):
    """A backup of a model with LoRA on would not resume: Keras writes an adapted kernel merged and
    zeroes the adapters when it reads it back, after which they get no gradient."""
    if lora_layers(model):
        raise ValueError("TrainingBackup cannot back up a model with LoRA on (Keras saves its kernels merged "
                         "and zeroes the adapters on loading); save the adapters with keras_vit.save_lora at "
                         "the end of fit instead")
