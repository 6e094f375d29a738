"""Keras' own files: a `.keras` file loaded as the whole model it holds, the check that a file is what
its suffix says, and what differs between a `.weights.h5`/`.keras` file and a model, key by key, for
load errors."""

import io
import os
import tempfile
import zipfile


def check_keras_file(path):
    """Refuses a `.weights.h5` that is not HDF5 or a `.keras` that is not a zip (ValueError naming it)."""
    import h5py

    if str(path).endswith(".keras"):
        if not zipfile.is_zipfile(path):
            raise ValueError(f"{path} is not a Keras model file (a .keras zip archive) or is damaged; "
                             f"got {os.path.getsize(path)} bytes that are no zip archive")
    elif not h5py.is_hdf5(path):
        raise ValueError(f"{path} is not an HDF5/Keras weights file (as written by model.save_weights); "
                         f"got {os.path.getsize(path)} bytes of something else")


def load_keras_model(path):
    """The whole model the `.keras` file `path` holds (any keras-vit model, any head), loaded by
    `keras.saving.load_model` in safe mode without its training setup (`compile=False`). The
    package's classes must be registered first (`import keras_vit` does it).

    Raises FileNotFoundError when there is no such file, and a ValueError naming the file when it is
    not a Keras model archive or cannot be loaded from it (corrupt, a class Keras does not know, a
    Lambda layer that safe mode refuses)."""
    import keras

    path = os.fspath(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"model file not found: {path}")
    check_keras_file(path)
    try:
        return keras.saving.load_model(path, compile=False, safe_mode=True)
    except Exception as err:
        what = (str(err).strip().splitlines() or [""])[0][:300]
        raise ValueError(f"could not load {path} as a Keras model: {type(err).__name__}: {what}") from None


def _h5_shapes(source):
    import h5py

    shapes = {}
    with h5py.File(source, "r") as f:
        f.visititems(lambda name, obj: shapes.__setitem__(name, tuple(obj.shape)) if isinstance(obj, h5py.Dataset) else None)
    return shapes


def _file_shapes(path):
    if str(path).endswith(".keras"):
        with zipfile.ZipFile(path) as archive:
            return _h5_shapes(io.BytesIO(archive.read("model.weights.h5")))
    return _h5_shapes(path)


def file_array_count(path):
    return len(_file_shapes(path))


def _model_shapes(model):
    """The model's arrays under the keys Keras writes them with (its own `.weights.h5`, in a temp folder)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "model.weights.h5")
        model.save_weights(path)
        return _h5_shapes(path)


def weight_file_mismatch(model, path, limit=12):
    """Lines naming every key whose shape differs, is missing from the file, or is only in the file."""
    try:
        theirs, ours = _file_shapes(path), _model_shapes(model)
    except Exception as err:  # an unreadable file: the caller's message says what Keras said
        return [f"  (could not list the file's arrays: {err})"]
    groups = (
        ("shape mismatch", [f"{k}: file {theirs[k]}, model {ours[k]}" for k in sorted(ours) if k in theirs and theirs[k] != ours[k]]),
        ("missing from the file", [f"{k} {ours[k]}" for k in sorted(ours) if k not in theirs]),
        ("in the file but not in the model", [f"{k} {theirs[k]}" for k in sorted(theirs) if k not in ours]),
    )
    lines = []
    for title, items in groups:
        if items:
            shown = "\n    ".join(items[:limit]) + (f"\n    ... and {len(items) - limit} more" if len(items) > limit else "")
            lines.append(f"  {len(items)} {title}:\n    {shown}")
    return lines
