"""Keras' own files: a `.keras` file loaded as the whole model it holds, the check that a file is what
its suffix says, and what differs between a `.weights.h5`/`.keras` file and a model, key by key, for
load errors."""

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
        model = keras.saving.load_model(path, compile=False, safe_mode=True)
    except Exception as err:
        what = (str(err).strip().splitlines() or [""])[0][:300]
        raise ValueError(f"could not load {path} as a Keras model: {type(err).__name__}: {what}") from None
    check_dtypes(path, model)
    return model


def _h5_arrays(source):
    """{dataset name: (shape, numpy dtype)} of an HDF5 file (its headers only)."""
    import h5py

    arrays = {}
    with h5py.File(source, "r") as f:
        f.visititems(lambda name, obj: arrays.__setitem__(name, (tuple(obj.shape), obj.dtype))
                     if isinstance(obj, h5py.Dataset) else None)
    return arrays


def _file_arrays(path):
    if str(path).endswith(".keras"):
        with zipfile.ZipFile(path) as archive, archive.open("model.weights.h5") as member:
            return _h5_arrays(member)  # Keras stores the member uncompressed: h5py seeks in it
    return _h5_arrays(path)


def _h5_shapes(source):
    return {name: shape for name, (shape, _) in _h5_arrays(source).items()}


def _file_shapes(path):
    return {name: shape for name, (shape, _) in _file_arrays(path).items()}


def file_array_count(path):
    return len(_file_shapes(path))


def _floating(dtype):
    return "float" in str(dtype) or "bfloat16" in str(dtype)


def check_dtypes(path, model):
    """Refuses a Keras file with more arrays of integers (or strings) than `model` has such variables: Keras
    casts what it loads, so a damaged or rewritten file of integer arrays would load as rounded weights.
    (Integer variables are legitimate: int8 kernels of a quantized model, an optimizer's step count.)"""
    arrays = {k: dtype for k, (_, dtype) in _file_arrays(path).items() if not k.startswith("optimizer/")}
    others = sorted(k for k, dtype in arrays.items() if not _floating(dtype))
    if len(others) > sum(not _floating(v.dtype) for v in model.weights):
        shown = ", ".join(f"{k} ({arrays[k]})" for k in others[:3])
        raise ValueError(f"{path} holds {len(others)} arrays that are not floating point ({shown}{' ...' * (len(others) > 3)}) "
                         f"where model {model.name!r} has float weights; expected the float arrays Keras writes "
                         "(a damaged or rewritten file?)")


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
