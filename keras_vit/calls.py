"""`fit`, `evaluate`, `predict` and their `*_on_batch` forms that check the images first and, when
they fail or are interrupted, leave the model as it was.

Keras' JAX trainer hands the variables' values to the compiled step and empties the variables for
the length of `fit`, `evaluate` and `predict`; `evaluate` and `predict` put them back only when
their loop ends normally. A batch of another shape (an error raised while tracing the step) or a
KeyboardInterrupt would leave every variable of the model empty. `KeepsStateOnError` puts back
the last state the loop had (so an interrupted `fit` keeps the steps it made), else the values
from before the call. On TensorFlow and torch the variables are never emptied.

Batches whose shape is known before the loop (arrays, tensors, `tf.data` datasets) are checked
against the model's input first, and a Python generator's batches as they are drawn, with one
message on every backend naming what the model takes and what came (TensorFlow would otherwise
trace the step with relaxed shapes and fail deep in the graph). A `keras.utils.PyDataset` is not
checked ahead: a bad batch fails inside the step, and the weights are still kept.

`TracesOnce` (which `KeepsStateOnError` brings): on TensorFlow, Keras builds the optimizer and the
compiled metrics and loss from the first batch before tracing the step only under a distribution
strategy; without one it builds them inside the step's first trace, and a `tf.function` whose first
trace makes variables is traced again, whole. They are built first here as under a strategy, so the
step is traced once (benchmarks/README.md has the figures).
"""

import inspect

import keras
import numpy as np

from keras_vit.layers.patch_encoder import check_channels
from keras_vit.structure import find_vit


def _first_shape(data):
    """The static shape of the images in `data` (array, tensor, tf.data dataset, or a tuple of
    them as `fit` takes), or None when it is not known before iterating."""
    spec = getattr(data, "element_spec", None)  # a tf.data.Dataset, without importing TensorFlow
    if spec is not None:
        data = spec
    while isinstance(data, (tuple, list)) and data:
        data = data[0]
    shape = getattr(data, "shape", None)
    if shape is None or isinstance(data, dict):
        return None
    try:
        return tuple(None if d is None else int(d) for d in shape)
    except TypeError:  # a TensorShape of unknown rank
        return None


# a NaFlex model's input, timm's names: patches (B, N, P * P * C), their (row, col) (B, N, 2), validity (B, N)
NAFLEX_KEYS = ("patches", "patch_coord", "patch_valid")


def is_naflex(model):
    """Whether `model` takes a NaFlex dict {"patches", "patch_coord", "patch_valid"}."""
    names = {getattr(t, "name", None) for t in getattr(model, "inputs", None) or ()}
    return set(NAFLEX_KEYS) <= names


def _naflex_arrays(data):
    """The NaFlex dict of numpy arrays in `data` (a dict, or a tuple starting with one), else None."""
    while isinstance(data, (tuple, list)) and data:
        data = data[0]
    if not isinstance(data, dict) or not all(isinstance(v, np.ndarray) for v in data.values()):
        return None
    return data


def check_naflex_batch(batch, patch_width, what="the model"):
    """Raises a ValueError naming what came, when `batch` (a dict of numpy arrays) is no NaFlex batch of
    patches `patch_width` wide (P * P * C): keys, shapes, dtypes, coordinates that are negative or do not
    tile their image's grid, an image without a valid patch."""
    if set(batch) != set(NAFLEX_KEYS):
        raise ValueError(f"{what} takes a dict with keys {NAFLEX_KEYS}, got keys {tuple(sorted(batch))}")
    patches, coord, valid = (batch[k] for k in NAFLEX_KEYS)
    if patches.ndim != 3 or patches.shape[-1] != patch_width:
        raise ValueError(f"{what} takes patches of shape (batch, tokens, {patch_width}), got {patches.shape}: "
                         f"{patch_width} values are one patch of the model's patch size, flattened")
    if coord.shape != (*patches.shape[:2], 2) or valid.shape != patches.shape[:2]:
        raise ValueError(f"{what} takes patch_coord of shape {(*patches.shape[:2], 2)} and patch_valid of shape "
                         f"{patches.shape[:2]} for patches of shape {patches.shape}, got {coord.shape} and {valid.shape}")
    if not np.issubdtype(coord.dtype, np.integer) or valid.dtype != bool:
        raise ValueError(f"{what} takes integer patch_coord and bool patch_valid, got {coord.dtype} and {valid.dtype}")
    for i in range(len(coord)):
        mine = coord[i][valid[i]]
        if not len(mine):
            raise ValueError(f"image {i} of the batch has no valid patch (patch_valid all False): every image needs one")
        if mine.min() < 0:
            raise ValueError(f"image {i} of the batch has a negative patch coordinate {tuple(mine[mine.min(1) < 0][0])}")
        gh, gw = mine.max(0) + 1
        if len(mine) != gh * gw or len(np.unique(mine[:, 0] * gw + mine[:, 1])) != len(mine):
            raise ValueError(f"image {i} of the batch: its {len(mine)} valid patches do not tile the {gh}x{gw} grid their "
                             f"coordinates reach (each (row, col) of the grid once): coordinates past the image")


def check_images(model, data):
    """Raises a ValueError naming what `model` takes and what came, when the images in `data` cannot
    go through it (rank, height, width or channels); for a NaFlex model, when a batch of numpy arrays is
    no NaFlex batch (`check_naflex_batch`). Data of unknown shape passes."""
    inputs = getattr(model, "inputs", None)
    if inputs and is_naflex(model):
        batch = _naflex_arrays(data)
        if batch is not None:
            width = next(t.shape[-1] for t in inputs if t.name == "patches")
            check_naflex_batch(batch, width, f"model {model.name!r}")
        return
    shape = _first_shape(data)
    if shape is None or not inputs or len(inputs) != 1 or len(inputs[0].shape) != 4:
        return
    _, h, w, c = inputs[0].shape
    takes = f"model {model.name!r} takes images of shape (batch, {h or 'any height'}, {w or 'any width'}, {c})"
    if len(shape) != 4:
        hint = " (one image? add the batch axis: x[None])" if len(shape) == 3 else ""
        raise ValueError(f"{takes}, got an array of shape {shape}{hint}")
    check_channels(model, shape, c)
    clash = [(axis, got, want) for axis, got, want in zip(("height", "width"), shape[1:3], (h, w))
             if want is not None and got is not None and got != want]
    if clash:
        raise ValueError(
            f"{takes}, got a batch of shape {shape}: resize the images to {h}x{w}, or build the model for "
            "any size (input_shape=(None, None, 3); weights= resizes the position embeddings)")
    if h is None or w is None:
        try:
            parts = find_vit(model)
        except ValueError:
            return
        stride, crop = parts.stride, parts.crop is not None  # crop: any size of a patch or more, cut to whole ones
        odd = [(axis, got) for axis, got in zip(("height", "width"), shape[1:3])
               if got is not None and (got < stride if crop else got % stride)]
        if odd:
            raise ValueError(f"{takes}, got a batch of shape {shape}: the {odd[0][0]} {odd[0][1]} is "
                             + (f"less than one {stride}-pixel patch" if crop else
                                f"not a multiple of {stride} pixels per token (patch size x ResNet stride)"))


def _checked_batches(model, batches):
    """A generator's batches, each checked as it is drawn (their shapes are known only then)."""
    for batch in batches:
        check_images(model, batch)
        yield batch


def _all_variables(model):
    optimizer = getattr(model, "optimizer", None)
    seen, out = set(), []
    for v in (*model.variables, *(optimizer.variables if optimizer is not None else ()), *model.metrics_variables):
        if id(v) not in seen:
            seen.add(id(v))
            out.append(v)
    return out


def _lost(value):
    return value is None or (hasattr(value, "is_deleted") and value.is_deleted())


def _restore(model, before):
    """After a failed call on JAX: the state the loop last had, else the values from `before`."""
    state = getattr(model, "_jax_state", None)
    if state and not model._jax_state_synced and not any(
            _lost(v) for values in state.values() for v in (values or ())):
        model.jax_state_sync()
    model._jax_state, model._jax_state_synced = None, True
    lost_metric = False
    for v in _all_variables(model):
        if _lost(v._value):
            saved = before.get(id(v))
            if saved is not None and not _lost(saved):
                v.assign(saved)
            else:
                lost_metric = True  # e.g. a metric built inside the failed call: reset below
    if lost_metric:
        model.reset_metrics()


class TracesOnce:
    """Mixin for a `keras.Model`: on TensorFlow without a distribution strategy, `fit`, `evaluate` and their
    `*_on_batch` forms build the optimizer, the compiled metrics and the loss from the first batch before
    the step is traced (see the module's docstring), as Keras does under a strategy; elsewhere, Keras' own
    build."""

    def _maybe_symbolic_build(self, iterator=None, data_batch=None):
        if keras.backend.backend() != "tensorflow" or self._distribute_strategy is not None:
            return super()._maybe_symbolic_build(iterator=iterator, data_batch=data_batch)
        import tensorflow as tf

        self._distribute_strategy = tf.distribute.get_strategy()  # the default one: what the step runs under
        try:
            return super()._maybe_symbolic_build(iterator=iterator, data_batch=data_batch)
        finally:
            self._distribute_strategy = None


class KeepsStateOnError(TracesOnce):
    """Mixin for a `keras.Model`: its images are checked before the loop, and a call that raises
    (KeyboardInterrupt included) leaves the variables as they were; its step is traced once on TensorFlow
    (`TracesOnce`)."""

    def fit(self, x=None, *args, **kwargs):
        return self._keeping_state(super().fit, x, *args, **kwargs)

    def evaluate(self, x=None, *args, **kwargs):
        return self._keeping_state(super().evaluate, x, *args, **kwargs)

    def predict(self, x, *args, **kwargs):
        return self._keeping_state(super().predict, x, *args, **kwargs)

    def train_on_batch(self, x, *args, **kwargs):
        return self._keeping_state(super().train_on_batch, x, *args, **kwargs)

    def test_on_batch(self, x, *args, **kwargs):
        return self._keeping_state(super().test_on_batch, x, *args, **kwargs)

    def predict_on_batch(self, x):
        return self._keeping_state(super().predict_on_batch, x)

    def _keeping_state(self, method, x, *args, **kwargs):
        check_images(self, x)
        if inspect.isgenerator(x):
            x = _checked_batches(self, x)
        if keras.backend.backend() != "jax":
            return method(x, *args, **kwargs)
        before = {id(v): v._value for v in _all_variables(self)}  # references to the arrays, not copies
        try:
            return method(x, *args, **kwargs)
        except BaseException:
            _restore(self, before)
            raise


__all__ = ["KeepsStateOnError", "TracesOnce", "check_images", "check_naflex_batch"]
