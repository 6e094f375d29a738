"""Callbacks that keep long training safe: stop on a non-finite loss, back up and resume."""

import math
import os
import warnings
import zipfile

import keras
import numpy as np

from keras_vit.fileio import (H5_OVERHEAD, atomic_write, check_free_space, not_npz, variables_bytes,
                              weights_file_bytes)
from keras_vit.lora import lora_layers
from keras_vit.startup import CTRL_C
from keras_vit.weights import _restore, _snapshot
from keras_vit.weights.keras_files import check_dtypes


class StopOnCtrlC(keras.callbacks.Callback):
    """Raises KeyboardInterrupt at the end of the next batch or epoch after a Ctrl-C that Python ignored.

    Under `keras_vit.startup.watching_ctrl_c` (the `keras-vit` command, the examples), Ctrl-C sets
    `keras_vit.startup.CTRL_C` besides raising KeyboardInterrupt; a KeyboardInterrupt raised inside a
    garbage-collection callback or a `__del__` is printed as "Exception ignored in ..." and dropped, and `fit`
    would go on. This raises it again where `fit` can stop. Elsewhere it does nothing.
    """

    def _raise_if_pressed(self, *args, **kwargs):
        if CTRL_C.is_set():
            raise KeyboardInterrupt

    on_train_batch_end = on_test_batch_end = on_epoch_end = _raise_if_pressed


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

    A model with LoRA on (``keras_vit.enable_lora``) is backed up as every variable of the model and
    the optimizer in an ``.npz`` (``LORA_FILENAME``): Keras' weights file holds an adapted kernel
    merged and zeroes the adapters when it is read back, after which they would learn nothing.

    Args:
        backup_dir: folder for the backup (created when needed).
        delete_on_end: remove the backup when ``fit`` ends normally.
    """

    FILENAME = "latest.weights.h5"
    LORA_FILENAME = "latest.variables.npz"

    def __init__(self, backup_dir, delete_on_end=True):
        super().__init__()
        if not backup_dir:
            raise ValueError("`backup_dir` must be a folder path.")
        self.backup_dir = os.fspath(backup_dir)
        self.delete_on_end = delete_on_end
        self.path = os.path.join(self.backup_dir, self.FILENAME)
        self.lora_path = os.path.join(self.backup_dir, self.LORA_FILENAME)

    def exists(self):
        return os.path.exists(self.path) or os.path.exists(self.lora_path)

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
        lora = bool(lora_layers(model))
        if lora != os.path.exists(self.lora_path):
            raise ValueError(f"the backup in {self.backup_dir} is of a model with{'out' if lora else ''} LoRA; "
                             f"this model has {'LoRA on' if lora else 'no LoRA'}: resume with the same settings")
        if lora:
            _assign_all(_state_variables(model), self.lora_path)
        else:
            before = _snapshot(model)
            try:
                check_dtypes(self.path, model)  # Keras would cast integers into the float weights
                model.load_weights(self.path)
            except Exception as err:  # a damaged backup: h5py's and Keras' own errors, after some assignments
                _restore(model, before)
                what = (str(err).strip().splitlines() or [type(err).__name__])[0][:300]
                raise ValueError(f"cannot read the training backup {self.path} (a Keras .weights.h5): {what}") from None
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
        if lora_layers(self.model):
            variables = _state_variables(self.model)
            check_free_space(self.lora_path, variables_bytes(variables) + H5_OVERHEAD, "the training backup")
            values = [keras.ops.convert_to_numpy(v) for v in variables]
            with atomic_write(self.lora_path) as tmp, open(tmp, "wb") as f:
                np.savez(f, *values)
        else:  # a full disk refused before h5py writes (it would end the process); the last backup is kept
            check_free_space(self.path, weights_file_bytes(self.model, optimizer=True), "the training backup")
            with atomic_write(self.path) as tmp:
                self.model.save_weights(tmp, overwrite=True)

    def on_train_end(self, logs=None):
        if self.delete_on_end and not self.model.stop_training:
            for path in (self.path, self.lora_path):
                if os.path.exists(path):
                    os.remove(path)
            try:
                os.rmdir(self.backup_dir)
            except OSError:
                pass


def _state_variables(model):
    """Every variable of `model` and of its optimizer, in a fixed order."""
    return [*model.variables, *model.optimizer.variables]


def _assign_all(variables, path):
    """Assigns the arrays of the `.npz` at `path` (as `TrainingBackup` writes them) to `variables`."""
    try:
        why = not_npz(path)
        if why:
            raise ValueError(why)
        with np.load(path, allow_pickle=False) as stored:
            values = [stored[f"arr_{i}"] for i in range(len(stored.files))]
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as err:
        raise ValueError(f"cannot read the training backup {path}: {err or type(err).__name__}") from None
    shapes = [tuple(v.shape) for v in variables]
    if [tuple(v.shape) for v in values] != shapes:
        raise ValueError(f"the training backup {path} holds {len(values)} arrays that do not fit this model and "
                         f"optimizer ({len(variables)} variables): resume with the same model and settings")
    for variable, value in zip(variables, values):
        variable.assign(value)
