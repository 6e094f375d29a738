"""Pretrained weights: the registry of released checkpoints, download, and loading into a model."""

import logging
import os

from keras_vit.configs import find_variant
from keras_vit.structure import find_vit
from keras_vit.weights.download import fetch
from keras_vit.weights.foreign import ForeignFile, is_foreign, load_foreign
from keras_vit.weights.keras_files import (
    check_dtypes,
    check_keras_file,
    file_array_count,
    weight_file_mismatch,
)
from keras_vit.weights.npz import (
    load_npz,
    official_variables,
    peek_npz,
    read_npz,
    save_npz,
)
from keras_vit.weights.registry import get_weights
from keras_vit.weights.registry import list_weights as _list_weights
from keras_vit.weights.tensors import TORCH_SUFFIXES

logger = logging.getLogger("keras_vit")

KERAS_SUFFIXES = (".weights.h5", ".keras")


def is_path(weights):
    """True when `weights` (a str) names a file rather than a registry tag."""
    return os.path.exists(weights) or weights.endswith((".npz", *KERAS_SUFFIXES, *TORCH_SUFFIXES)) or os.sep in weights


def list_weights(variant=None):
    """The registered released checkpoints (all, or those of one variant)."""
    return _list_weights(variant)


def model_config(model):
    """The architecture of the ViT in `model`, read off its layers (for registry look-ups)."""
    parts = find_vit(model)
    block = parts.blocks[0]
    resnet = None if parts.resnet is None else {
        "num_layers": parts.resnet.num_layers, "width_factor": parts.resnet.width_factor}
    return dict(patch_size=parts.embedding.patch_size, hidden_size=parts.embedding.hidden_size,
                num_layers=parts.num_layers, num_heads=block.num_heads, mlp_dim=block.mlp_dim, resnet=resnet,
                image_size=parts.image_size)


def _snapshot(model):
    return [v.numpy() for v in model.weights]


def _restore(model, values):
    for var, value in zip(model.weights, values):
        var.assign(value)


def load_weights(model, weights):
    """Loads `weights` (a registry tag, an official `.npz`, a `.weights.h5` or `.keras` file) into
    `model`, in place. All or nothing: on any error the model keeps its weights.

    Official `.npz` files are mapped key by key: GroupNorm params are squeezed, position
    embeddings are resized to the model's patch grid, pre-logits are kept when the model has
    them, and a head of another class count is replaced by a zero-initialised one.
    Returns the list of notes on what was adapted.
    """
    if isinstance(weights, ForeignFile):  # a foreign file already read (by a factory or build_from)
        return load_foreign(model, weights)
    if not isinstance(weights, (str, os.PathLike)):
        raise TypeError(f"weights must be a registry tag or a path, got {type(weights).__name__}")
    weights = os.fspath(weights)
    if not is_path(weights):
        config = model_config(model)
        variant = find_variant(config)
        if variant is None:
            raise ValueError(
                f"weights={weights!r} names a registered checkpoint, but model {model.name!r} is no "
                "registered variant; pass a file path instead"
            )
        h, w = config["image_size"]
        record = get_weights(variant, weights, h if h == w else None)
        path = fetch(record.url, record.filename)
        try:
            return load_npz(model, path)
        except ValueError as err:
            if "not a readable" in str(err):
                os.remove(path)  # never trust it again
                raise ValueError(f"{err}\nThe cached file was removed; call again to download it anew.") from None
            raise
    if is_foreign(weights):
        if not os.path.exists(weights):
            raise FileNotFoundError(f"weights file not found: {weights}")
        return load_foreign(model, weights)
    if weights.endswith(KERAS_SUFFIXES):
        if not os.path.exists(weights):
            raise FileNotFoundError(f"weights file not found: {weights}")
        check_keras_file(weights)
        before = _snapshot(model)
        try:
            check_dtypes(weights, model)
            model.load_weights(weights)
            if file_array_count(weights) != len(model.weights):  # Keras only warns about arrays it did not use
                raise ValueError("the file holds arrays the model has no variables for")
        except Exception as err:
            _restore(model, before)
            diff = "\n".join(weight_file_mismatch(model, weights)) or f"  {str(err)[:500]}"
            raise ValueError(f"could not load {weights} into model {model.name!r} (weights left unchanged):\n{diff}") from None
        return []
    return load_npz(model, weights)


__all__ = ["fetch", "find_vit", "get_weights", "is_path", "list_weights", "load_npz", "load_weights", "model_config", "official_variables",
           "peek_npz", "read_npz", "save_npz"]
