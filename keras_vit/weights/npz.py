"""Reading official ViT `.npz` checkpoints into a keras_vit model: a flat key map, checked whole
before a single variable is written."""

import logging
import math
import os
import zipfile

import keras
import numpy as np

from keras_vit.fileio import atomic_write, not_npz
from keras_vit.layers.norms import norm_weights
from keras_vit.patch_resize import resize_patch_embedding
from keras_vit.structure import find_vit

logger = logging.getLogger("keras_vit")

# Keras layer name in the model -> official key prefix ("" for keys at the top of the file).
_PREFIXES = {
    "resnet": "",
    "embedding": "embedding",
    "cls": "cls",
    "dist": "dist",
    "registers": "registers",
    "posembed_input": "Transformer/posembed_input",
    "embed_norm": "embed_norm",
    "pre_norm": "Transformer/pre_norm",
    "encoder_norm": "Transformer/encoder_norm",
    "map_head": "MAPHead_0",
    "fc_norm": "fc_norm",
    "pre_logits": "pre_logits",
    "head": "head",
    "head_dist": "head_dist",
}
HEADS = ("head/", "head_dist/")  # replaced together by a zero-initialised head of the model's classes
POSEMB_KEY = "Transformer/posembed_input/pos_embedding"
PATCH_KEY = "embedding/kernel"


def _layer_params(layer):
    if hasattr(layer, "official_weights"):
        return layer.official_weights()
    if isinstance(layer, (keras.layers.LayerNormalization, keras.layers.RMSNormalization)):
        return norm_weights(layer)
    return {"kernel": layer.kernel, "bias": layer.bias}  # Dense


def _official_layers(model):
    """(official key prefix, layer) for every layer of the ViT in `model` that holds parameters."""
    for layer in find_vit(model).container.layers:
        if layer.name.startswith(("encoderblock_", "posembed_")):  # posembed_i: position_placement="every_layer"
            yield f"Transformer/{layer.name}", layer
        elif layer.name in _PREFIXES:
            yield _PREFIXES[layer.name], layer


def official_variables(model):
    """{official key: keras Variable} for every parameter of the ViT in `model`."""
    params = {}
    for prefix, layer in _official_layers(model):
        for key, var in _layer_params(layer).items():
            params["/".join(p for p in (prefix, key) if p)] = var
    return params


def _resizers(model):
    """{official key: (layer, array name)} of the arrays whose layer resizes them to its grid."""
    return {
        f"{prefix}/{key}": (layer, key)
        for prefix, layer in _official_layers(model) if hasattr(layer, "resize_official")
        for key in layer.official_weights()
    }


class _NpzReader:
    """Opens an `.npz` without unpickling and turns every failure into one clear error."""

    def __init__(self, path):
        self.path = path

    def _fail(self, err):
        return ValueError(
            f"{self.path} is not a readable official ViT .npz checkpoint (expected a zip archive of "
            f"named float arrays; truncated or corrupt download?): {err}"
        )

    def __enter__(self):
        if os.path.isdir(self.path):
            raise ValueError(f"{self.path} is a folder without config.json; expected a weights file (.npz, "
                             ".weights.h5, .keras, .safetensors, .pth, .bin), a Hugging Face folder or a keras-hub "
                             "preset folder")
        try:
            why = not_npz(self.path)
            if why:
                raise self._fail(why)
            self.data = np.load(self.path, allow_pickle=False)
        except FileNotFoundError:
            raise FileNotFoundError(f"weights file not found: {self.path}") from None
        except (zipfile.BadZipFile, ValueError, OSError, EOFError) as err:
            raise self._fail(err) from None
        return self

    def __exit__(self, *exc):
        self.data.close()

    @property
    def keys(self):
        return list(self.data.files)

    def __getitem__(self, key):
        try:
            return np.asarray(self.data[key])
        except (zipfile.BadZipFile, ValueError, OSError, EOFError, KeyError) as err:
            raise self._fail(f"array {key!r}: {err}") from None


def read_npz(path):
    """All arrays of an `.npz` file, never unpickling; a clear error for anything else."""
    with _NpzReader(path) as reader:
        return {key: reader[key] for key in reader.keys}


def _shape(var):
    return tuple(int(d) for d in var.shape)


def plan_npz(model, arrays, source="checkpoint"):
    """Maps checkpoint arrays onto the model's variables without writing anything (`source`: the file
    the arrays came from, for the error).

    Returns (assignments {key: (variable, value)}, notes [str]); raises ValueError listing every
    missing, mis-shaped or unexpected key when the file does not fit the model.
    """
    targets = official_variables(model)
    posembed = find_vit(model).posembed
    resizers = _resizers(model)
    assignments, notes = {}, []
    missing, mismatched, not_float = [], [], []
    replace_head = _replaces_head(targets, arrays, notes)
    for key, var in targets.items():
        shape = _shape(var)
        if key.startswith(HEADS) and replace_head:
            assignments[key] = (var, np.zeros(shape, np.float32))
            continue
        if key not in arrays:
            missing.append(key)
            continue
        value, error = _resized(key, arrays[key], shape, posembed, resizers, notes)
        if error is None and value.shape != shape:
            why = (" (1-D relative offsets in raster order mean other positions on another grid: train at "
                   "this resolution)") if key.endswith("/rel_embedding") else ""
            error = f"{key}: file {tuple(value.shape)}, model {shape}{why}"
        if error is not None:
            mismatched.append(error)
            continue
        if not np.issubdtype(value.dtype, np.floating):
            not_float.append(f"{key}: dtype {value.dtype}, expected floating point")
            continue
        assignments[key] = (var, value)

    tolerated = ("pre_logits/", *HEADS, "MAPHead_0/", "fc_norm/")  # what a model without the head or pooling leaves
    unused = sorted(k for k in arrays if k not in targets)
    unexpected = [k for k in unused if not k.startswith(tolerated)]
    if missing or mismatched or not_float or unexpected:
        _refuse(model, source, missing, mismatched, not_float, unexpected)
    dropped = sorted({k.split("/")[0] for k in unused})
    if dropped:
        notes.append(f"not used: {', '.join(dropped)} ({sum(1 for _ in unused)} arrays)")
    return assignments, notes


def _replaces_head(targets, arrays, notes):
    """Whether the model's head (of `targets`, its variables) is replaced by a zero-initialised one: the
    file has none, one of other classes, or one on pre-logits the model lacks (the why appended to `notes`)."""
    model_head = targets.get("head/kernel")
    replace_head = False
    if model_head is not None:
        file_head = arrays.get("head/kernel")
        file_pre, model_pre = "pre_logits/kernel" in arrays, "pre_logits/kernel" in targets
        if file_head is None:
            replace_head, why = True, "the file has no head"
        elif file_head.ndim == 2 and file_head.shape[1] != model_head.shape[1]:
            replace_head, why = True, f"{file_head.shape[1]} classes in the file, {model_head.shape[1]} in the model"
        elif file_pre and not model_pre:
            replace_head, why = True, "the file's head sits on pre-logits that the model does not have"
        if replace_head:
            notes.append(f"new zero-initialised head ({why}; paper 3.2)")
    return replace_head


def _resized(key, value, shape, posembed, resizers, notes):
    """(value, None): the file's array `value` of `key` brought to the model's `shape` where a rule does it
    (the position embeddings by their layer's rule, the patch embedding by FlexiViT's pseudo-inverse, an
    array its layer resizes, a reshape of unit axes; each resize's note appended to `notes`), else as it
    is; (None, why) where the resize fails."""
    original = value
    if key == POSEMB_KEY and value.shape != shape and value.ndim == 3 and value.shape[-1] == shape[-1]:
        layer = posembed
        try:
            value = layer.resize_official(key, value)  # by the layer's rule (the paper's, timm's, ...)
        except ValueError as err:
            return None, f"{key}: cannot resize {value.shape} to {shape}: {err}"
        old = math.isqrt(original.shape[1] - layer.num_prefix_tokens)
        notes.append(f"position embeddings resized from a {old}x{old} to a {layer.grid_size[0]}x{layer.grid_size[1]} grid")
    elif key == PATCH_KEY and value.ndim == 4 and len(shape) == 4 and value.shape[0] == value.shape[1] \
            and shape[0] == shape[1] and value.shape[2:] == shape[2:] and value.shape[0] != shape[0]:
        value = resize_patch_embedding(value, shape[0])  # FlexiViT's pseudo-inverse resize
        notes.append(f"patch embedding resized from {original.shape[0]}x{original.shape[0]} to "
                     f"{shape[0]}x{shape[1]} patches (FlexiViT pseudo-inverse)")
    elif value.shape != shape and key in resizers:
        layer, name = resizers[key]
        try:
            value = layer.resize_official(name, value)
        except ValueError as err:
            return None, f"{key}: cannot resize {value.shape} to {shape}: {err}"
        notes.append(f"{key} resized from {tuple(original.shape)} to {shape}")
    elif value.shape != shape and value.size == math.prod(shape) and value.squeeze().shape == tuple(
        d for d in shape if d != 1
    ):
        value = value.reshape(shape)  # e.g. GroupNorm scale stored as (1, 1, 1, C)
    return value, None


def _refuse(model, source, missing, mismatched, not_float, unexpected):
    """The ValueError of a file that does not fit the model, listing (12 at most each) what does not fit."""
    lines = []
    for title, items in (("missing from the file", missing), ("shape mismatch", mismatched),
                         ("not floating point", not_float), ("in the file but not in the model", unexpected)):
        if items:
            shown = "\n    ".join(items[:12]) + (f"\n    ... and {len(items) - 12} more" if len(items) > 12 else "")
            lines.append(f"  {len(items)} {title}:\n    {shown}")
    raise ValueError(
        f"{source} does not fit model {model.name!r} (another variant, resolution or classifier?); "
        "the model's weights were left unchanged.\n" + "\n".join(lines)
    )


def load_npz(model, path):
    """Loads an official `.npz` into `model`: all or nothing, with one log line of what changed."""
    return load_arrays(model, read_npz(path), path)


def load_arrays(model, arrays, path, notes=()):
    """Loads {official key: array} into `model`: checked whole by `plan_npz`, then written."""
    assignments, planned = plan_npz(model, arrays, path)
    notes = [*notes, *planned]
    for var, value in assignments.values():
        var.assign(value.astype(var.dtype if isinstance(var.dtype, str) else "float32"))
    message = f"keras_vit: loaded {len(assignments)} arrays from {path}" + ("; " + "; ".join(notes) if notes else "")
    (logger.warning if any(n.startswith("new zero") for n in notes) else logger.info)(message)
    return notes


def peek_npz(path):
    """(classes or None, has_pre_logits, position-embedding tokens or None, has_cls), reading only those arrays."""
    with _NpzReader(path) as reader:
        keys = set(reader.keys)
        return (
            int(reader["head/kernel"].shape[-1]) if "head/kernel" in keys else None,
            "pre_logits/kernel" in keys,
            int(reader[POSEMB_KEY].shape[1]) if POSEMB_KEY in keys else None,
            "cls" in keys,
        )


def save_npz(model, path):
    """Writes the ViT in `model` as an official-layout `.npz` (atomically: temp file, then rename)."""
    arrays = {key: np.asarray(var.numpy(), np.float32) for key, var in official_variables(model).items()}
    with atomic_write(path, suffix=".npz") as tmp, open(tmp, "wb") as f:
        np.savez(f, **arrays)
    return path
