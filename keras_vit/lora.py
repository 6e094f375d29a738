"""Low-rank adaptation (LoRA) of a keras-vit model: Keras' own `enable_lora` on the projections of every
encoder block, the rest frozen but the classifier head; adapter files that hold only what was trained;
merging the adapters into the kernels for export and serving.

The adapted kernel is `W + (alpha / rank) * A @ B` (Keras' `lora_kernel_a`, `lora_kernel_b`; for the
(D, heads, head_dim) q/k/v kernels, A is (D, heads, rank) and B (rank, head_dim), as on keras-hub's
backbones). The blocks read it through `layer.kernel`, so the fused q/k/v and MLP paths stay.
"""

import json
import zipfile

import keras
import numpy as np

from keras_vit.fileio import (NPZ_OVERHEAD, atomic_write, check_free_space, check_writable, full_disk_named, not_npz,
                              variables_bytes)
from keras_vit.layers.transformer_block import TransformerBlock

LORA_TARGETS = ("query", "key", "value", "out", "mlp")
DEFAULT_TARGETS = ("query", "value")
# top-level layers that stay trainable under LoRA: the classifier head(s) and a pre-logits layer
HEAD_LAYERS = ("head", "head_dist", "pre_logits")
_META = "__keras_vit_lora__"


def _check_model(model):
    if not isinstance(model, keras.Model):
        raise TypeError(f"expected a keras-vit model (a keras.Model), got {type(model).__name__}: {model!r:.80}")
    return model


def _blocks(model):
    blocks = [layer for layer in model.layers if isinstance(layer, TransformerBlock)]
    if not blocks:
        raise ValueError(f"LoRA needs a keras-vit encoder; model {model.name!r} has no TransformerBlock")
    return blocks


def _check_targets(targets):
    if not isinstance(targets, (str, list, tuple)):
        raise TypeError(f"LoRA targets must be a name or a list of names from {LORA_TARGETS}; got {targets!r}")
    targets = (targets,) if isinstance(targets, str) else tuple(targets)
    unknown = [t for t in targets if t not in LORA_TARGETS]
    if unknown or not targets:
        raise ValueError(f"unknown LoRA target(s) {unknown or list(targets)}; expected a non-empty subset of "
                         f"{LORA_TARGETS}")
    return tuple(t for t in LORA_TARGETS if t in targets)


def _check_rank(rank):
    if isinstance(rank, bool) or not isinstance(rank, (int, np.integer)) or rank <= 0:
        raise ValueError(f"LoRA rank must be a positive integer; got {rank!r}")
    return int(rank)


def _check_alpha(alpha):
    number = not isinstance(alpha, bool) and isinstance(alpha, (int, float, np.floating, np.integer))
    if not (number and alpha > 0 and np.isfinite(alpha)):
        raise ValueError(f"LoRA alpha must be a positive number or None (= rank); got {alpha!r}")
    return alpha


def target_layers(model, targets=DEFAULT_TARGETS):
    """The Dense/EinsumDense layers of `model`'s encoder blocks that `targets` name, in block order:
    "query", "key", "value", "out" (the attention projections) and "mlp" (both MLP layers)."""
    targets = _check_targets(targets)
    layers = []
    for block in (b for block in _blocks(model) for b in getattr(block, "branch_blocks", [block])):  # each branch's
        for target in targets:
            layers += [block.mlp_0, block.mlp_1] if target == "mlp" else [getattr(block.attention, target)]
    return layers


def _head_weights(model):
    """The weights of `model`'s classifier head (`HEAD_LAYERS`), which LoRA fine-tuning trains too."""
    return [v for layer in model.layers if layer.name in HEAD_LAYERS for v in layer.weights]


def lora_layers(model):
    """The layers of `model` with LoRA on."""
    return [layer for layer in model._flatten_layers(include_self=False) if getattr(layer, "lora_enabled", False)]


def enable_lora(model, rank, targets=DEFAULT_TARGETS, alpha=None):
    """Adapts the `targets` projections of every encoder block of `model` with rank-`rank` LoRA and
    freezes every other weight except the classifier head (`HEAD_LAYERS`); compile after this.

    Args:
        model: a built keras-vit model.
        rank: the adapters' rank, a positive integer.
        targets: names from `LORA_TARGETS`: "query", "key", "value", "out" (attention projections),
            "mlp" (both MLP layers). Default: query and value, as in the LoRA paper.
        alpha: the adapters' scale numerator (`alpha / rank` multiplies `A @ B`); default `rank`.

    Returns:
        the same model, with `len(model.trainable_weights)` the adapters and the head.
    """
    _check_model(model)
    rank = _check_rank(rank)
    if alpha is not None:
        _check_alpha(alpha)
    layers = target_layers(model, targets)
    if lora_layers(model):
        raise ValueError(f"LoRA is already on in model {model.name!r} (rank {lora_layers(model)[0].lora_rank}); "
                         "build a fresh model to change rank or targets")
    if any(layer.quantization_mode is not None for layer in layers):
        raise ValueError("LoRA on a quantized model is not supported: enable LoRA before quantizing")
    for layer in layers:
        layer.enable_lora(rank, lora_alpha=alpha)
    adapters = {id(v) for layer in layers for v in (layer.lora_kernel_a, layer.lora_kernel_b)}
    head = {id(v) for v in _head_weights(model)}
    for variable in model.weights:
        if variable.trainable and id(variable) not in adapters | head:
            variable.trainable = False
    return model


def _state(model):
    """{variable path: variable} of what LoRA fine-tuning trains: the adapters and the head."""
    layers = lora_layers(model)
    if not layers:
        raise ValueError(f"model {model.name!r} has no LoRA adapters; call keras_vit.enable_lora(model, rank) first")
    state = {v.path: v for layer in layers for v in (layer.lora_kernel_a, layer.lora_kernel_b)}
    state |= {v.path: v for v in _head_weights(model)}
    return state


def _meta(model):
    layers = lora_layers(model)
    paths, first = sorted(layer.path for layer in layers), layers[0]
    return {"rank": int(first.lora_rank), "alpha": float(first.lora_alpha), "layers": paths,
            "targets": list(_targets_of(model, paths, f"model {model.name!r}"))}


def save_lora(model, path):
    """Writes `model`'s LoRA adapters and its head (nothing else) to the `.npz` file `path`, atomically.

    Args:
        model: a model on which `enable_lora` was called (and usually `fit`).
        path: the file to write: an `.npz` archive, whatever the name's suffix.
    """
    state = _state(_check_model(model))
    path = check_writable(path)
    # a full disk refused before the write, or named if it fills meanwhile; a file there before is kept whole
    what = f"the LoRA adapters {path}"
    check_free_space(path, variables_bytes(state.values()) + NPZ_OVERHEAD, what)
    arrays = {name: keras.ops.convert_to_numpy(v) for name, v in state.items()}
    arrays[_META] = np.array(json.dumps(_meta(model)))
    with full_disk_named(path, what), atomic_write(path) as tmp, open(tmp, "wb") as f:  # numpy adds no ".npz"
        np.savez(f, **arrays)


def load_lora(model, path):
    """Reads adapters written by `save_lora` into `model`, turning LoRA on with the file's rank, targets
    and alpha if it is off. Everything is checked before anything is assigned: a file of another rank,
    targets or model is refused with what was expected and what came, the model untouched.

    Args:
        model: a keras-vit model of the architecture the adapters were trained on.
        path: an `.npz` file written by `save_lora`.

    Returns:
        the same model.
    """
    _check_model(model)
    try:
        why = not_npz(path)
        if why:
            raise ValueError(why)
        with np.load(path, allow_pickle=False) as f:
            arrays = {name: f[name] for name in f.files}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as err:  # BadZipFile: a cut or damaged archive
        raise ValueError(f"cannot read {path} as a LoRA adapter file (.npz from save_lora): "
                         f"{err or type(err).__name__}") from None
    if _META not in arrays:
        raise ValueError(f"{path} is not a LoRA adapter file: it has no {_META!r} entry (write it with save_lora)")
    meta = _read_meta(arrays.pop(_META), path)
    not_float = sorted(name for name, a in arrays.items() if not np.issubdtype(a.dtype, np.floating))
    if not_float:
        raise ValueError(f"{path} holds {len(not_float)} arrays that are not floating point "
                         f"({not_float[0]}: {arrays[not_float[0]].dtype}); expected the float adapters save_lora writes")
    targets = _targets_of(model, meta["layers"], path)
    if lora_layers(model):
        expected = _meta(model)
        if (expected["rank"], expected["layers"]) != (meta["rank"], meta["layers"]):
            raise ValueError(f"{path} holds rank-{meta['rank']} adapters of {len(meta['layers'])} layers; model "
                             f"{model.name!r} has rank-{expected['rank']} LoRA on {len(expected['layers'])} layers")
        state = _state(model)
        shapes = {name: tuple(v.shape) for name, v in state.items()}
    else:
        shapes = _shapes_after_enable(model, meta["rank"], targets)
    got = {name: a.shape for name, a in arrays.items()}
    if got != shapes:
        missing, extra = sorted(set(shapes) - set(got)), sorted(set(got) - set(shapes))
        wrong = sorted(n for n in set(got) & set(shapes) if got[n] != shapes[n])
        parts = [f"{n}: expected {shapes[n]}, got {got[n]}" for n in wrong[:4]]
        parts += [f"missing {missing[:4]}"] * bool(missing) + [f"unexpected {extra[:4]}"] * bool(extra)
        raise ValueError(f"{path} does not fit model {model.name!r}: " + "; ".join(parts))
    if not lora_layers(model):
        enable_lora(model, meta["rank"], targets, alpha=meta["alpha"])
    for name, variable in _state(model).items():
        variable.assign(arrays[name])
    return model


def _read_meta(entry, path):
    """The rank, alpha and adapted layers that `save_lora` wrote beside the arrays, checked."""
    try:
        meta = json.loads(str(entry))
        rank, alpha, layers = meta["rank"], meta["alpha"], meta["layers"]
    except (ValueError, TypeError, KeyError) as err:
        raise ValueError(f"{path}: its {_META!r} entry is not the JSON save_lora writes ({err!r})") from None
    if not (isinstance(layers, list) and all(isinstance(p, str) for p in layers)):
        raise ValueError(f"{path}: its {_META!r} entry names no list of layers, got {layers!r}")
    try:
        _check_rank(rank), _check_alpha(alpha)
    except ValueError as err:
        raise ValueError(f"{path}: {err}") from None
    return meta


def _targets_of(model, layer_paths, source):
    """The LoRA targets whose layers in `model` are `layer_paths` (sorted), or a ValueError."""
    for n in range(1, 2 ** len(LORA_TARGETS)):
        targets = tuple(t for i, t in enumerate(LORA_TARGETS) if n >> i & 1)
        if sorted(layer.path for layer in target_layers(model, targets)) == layer_paths:
            return targets
    raise ValueError(f"{source} adapts {len(layer_paths)} layers ({layer_paths[:2]}...), which are not the "
                     f"projections {LORA_TARGETS} of all {len(_blocks(model))} blocks of model {model.name!r}")


def _shapes_after_enable(model, rank, targets):
    shapes = {}
    for layer in target_layers(model, targets):
        kernel = tuple(layer.kernel.shape)
        shapes[f"{layer.path}/lora_kernel_a"] = (*kernel[:-1], rank)
        shapes[f"{layer.path}/lora_kernel_b"] = (rank, kernel[-1])
    shapes |= {v.path: tuple(v.shape) for v in _head_weights(model)}
    return shapes


def merge_lora(model):
    """A new model of `model`'s architecture without adapters, each adapted kernel replaced by
    `W + (alpha / rank) * A @ B`: what to export and serve. `model` is left as it is.

    Args:
        model: a keras-vit model with LoRA on.

    Returns:
        the merged model (all weights trainable, not compiled).
    """
    if not lora_layers(_check_model(model)):
        raise ValueError(f"model {model.name!r} has no LoRA adapters to merge")
    merged = model.__class__.from_config(model.get_config())
    pairs = list(zip(model._flatten_layers(include_self=False), merged._flatten_layers(include_self=False)))
    for source, target in pairs:
        if type(source) is not type(target):
            raise ValueError(f"cannot merge: {source.name} ({type(source).__name__}) rebuilt as "
                             f"{target.name} ({type(target).__name__})")
    for source, target in pairs:
        store = {}
        source.save_own_variables(store)  # Keras writes an adapted kernel merged
        target.load_own_variables(store)
    return merged
