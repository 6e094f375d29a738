"""timm and Hugging Face weights: recognise the layout, read the architecture, map to official keys
and load through the official loader (all or nothing)."""

import logging
import math
import os
from typing import Any, Callable, NamedTuple

import numpy as np

from keras_vit.configs import FAMILY_DEFAULTS, family_name
from keras_vit.structure import find_vit
from keras_vit.weights import hf, keras_hub, timm
from keras_vit.weights.npz import load_arrays
from keras_vit.weights.tensors import TORCH_SUFFIXES, read_tensors

logger = logging.getLogger("keras_vit")


def is_foreign(path):
    """True for a timm / Hugging Face weights file or folder, or a keras-hub preset folder (by name, or a
    folder with config.json)."""
    return str(path).endswith(TORCH_SUFFIXES) or hf.is_hf_folder(path)


class ForeignFile(NamedTuple):
    """What `read` took from a foreign file, read once and passed on to `describe`, `load_foreign`,
    `keras_vit.load_weights`, the factories' `weights=` and `keras_vit.convert.build_from`."""

    source: str  # "timm", "Hugging Face" or "keras-hub"
    arch: dict  # the builder arguments the file dictates (`describe`)
    tensors: dict  # name -> numpy array, as the file holds them
    to_official: Callable[..., Any]  # (tensors, num_heads) -> (official arrays, unmapped names)
    path: str


def read(path):
    """The `ForeignFile` of a timm file, a Hugging Face folder or a keras-hub preset folder (`path`
    itself when it is one already: nothing is read twice)."""
    if isinstance(path, ForeignFile):
        return path
    path = os.fspath(path)
    return ForeignFile(*_read(path), path)


def _read(path):
    if keras_hub.is_preset(path):
        try:
            backbone, task, tensors = keras_hub.read_preset(path)
            arch = keras_hub.architecture(backbone, task, tensors)
        except ValueError as err:
            raise ValueError(str(err) if str(err).startswith(path) else f"{path}: {err}") from None
        return "keras-hub", arch, tensors, keras_hub.to_official(backbone)
    if os.path.isdir(path):
        if not hf.is_hf_folder(path):
            raise ValueError(f"{path} is a folder without config.json; expected a Hugging Face ViT folder")
        config, tensors = hf.read_folder(path)
        _refuse(path, tensors)
        return "Hugging Face", hf.architecture(config, tensors), tensors, hf.to_official
    tensors = read_tensors(path)
    _refuse(path, tensors)
    if timm.is_timm(tensors):
        return "timm", timm.architecture(tensors, name=path), tensors, timm.to_official
    if any(k.endswith("embeddings.patch_embeddings.projection.weight") for k in tensors):
        raise ValueError(f"{path} holds Hugging Face ViT weights: pass the folder with its config.json instead")
    shown = ", ".join(sorted(tensors)[:6])
    raise ValueError(
        f"{path} is no timm ViT state dict (expected keys such as patch_embed.proj.weight, blocks.0.attn.qkv.weight); "
        f"it holds {len(tensors)} tensors: {shown}{' ...' if len(tensors) > 6 else ''}"
    )


def _refuse(path, tensors):
    found = timm.unsupported(tensors)
    if found:
        raise ValueError(f"{path} holds another architecture than the paper's ViT: " + "; ".join(found))


# what a timm file / Hugging Face folder dictates beyond the dimensions: numerics, family options, resize rule,
# and the stochastic depth its config records (Hugging Face's DINOv2; a timm state dict records none)
FILE_OPTIONS = ("approximate_gelu", "layer_norm_epsilon", "position_interpolation", *FAMILY_DEFAULTS,
                "position_embedding", "position_aspect_preserving",  # these two: timm's NaFlex models
                "drop_path_rate")


def file_options(arch):
    """The builder arguments of FILE_OPTIONS that a file's architecture names (None: it does not say)."""
    return {k: arch[k] for k in FILE_OPTIONS if k in arch and (arch[k] is not None or k == "layer_scale")}


def file_image_size(arch, stride):
    """A file's resolution: its config's, else its square position-embedding grid times `stride` (None if not square)."""
    if arch.get("image_size"):
        return arch["image_size"]
    if not arch.get("tokens"):
        return None
    covered = int(arch["classifier"] == "token") + int(arch.get("distillation_token", False))
    grid = arch["tokens"] - (covered if arch.get("prefix_position_embedding", True) else 0)
    side = math.isqrt(grid)
    return side * stride if side * side == grid else None


def settle_layout(arch, grid):
    """`arch` with `prefix_position_embedding` read off its position-embedding count for a known patch
    `grid` (gh, gw): a timm count alone is ambiguous when the grid may be non-square (4x6 + a class token
    = 25 = 5x5)."""
    prefix = int(arch["classifier"] == "token") + int(arch.get("distillation_token", False))
    if arch.get("tokens") and prefix and grid:
        exact = timm.covers_prefix(arch["tokens"], prefix, arch.get("num_register_tokens", 0), grid=grid[0] * grid[1])
        if exact is not None:
            arch = {**arch, "prefix_position_embedding": exact}
    return arch


def describe(path, grid=None):
    """The architecture (builder arguments, `tokens` for the position embeddings) of a foreign file
    (a path or a `ForeignFile`), its layout settled for the patch `grid` when known (`settle_layout`)."""
    return settle_layout(read(path).arch, grid)


def numerics(model):
    """(approximate_gelu, layer_norm_epsilon) of the ViT in `model`."""
    block = find_vit(model).blocks[0]
    return block.approximate_gelu, block.layer_norm_epsilon


def _same(key, ours, theirs):
    if key == "layer_scale":
        return (ours is None) == (theirs is None)
    # None: the file does not say (timm's GELU form, the layout of a non-square grid), or a feature-map model's pooling
    if theirs is None or ours is None:
        return True
    return ours == theirs


def family_mismatch(model, arch, path):
    """One error naming the file's ViT, the model's, and the options that differ; None when they agree."""
    ours = find_vit(model).family()
    differ = [k for k in ours if k in arch and not _same(k, ours[k], arch[k])]
    if not differ:
        return None
    show = ", ".join(f"{k}={arch[k]!r} in the file, {ours[k]!r} in the model" for k in differ)
    return ValueError(f"{path} holds {family_name(arch)}; model {model.name!r} is {family_name(ours)}: {show}. "
                      "Build the model with the file's options (keras_vit.from_timm / from_huggingface, or a factory "
                      "with weights=..., read them from the file); the model's weights were left unchanged")


def load_foreign(model, path):
    """Loads a timm file, a Hugging Face folder or a keras-hub preset (a path or its `ForeignFile`) into
    `model`: all or nothing, like `load_npz`."""
    source, arch, tensors, to_official, path = read(path)
    arch = settle_layout(arch, find_vit(model).grid_size)
    mismatch = family_mismatch(model, arch, path)
    if mismatch:
        raise mismatch
    block = find_vit(model).blocks[0]
    heads = arch.get("num_heads")
    if heads is not None and heads != block.num_heads:
        raise ValueError(f"{path} has {heads} attention heads, model {model.name!r} has {block.num_heads}; "
                         "the model's weights were left unchanged")
    arrays, unmapped = to_official(tensors, block.num_heads)
    for layer in ("embedding", "head"):  # CLIP's patch embedding and projection have no bias: a zero one
        kernel = arrays.get(f"{layer}/kernel")
        if kernel is not None and f"{layer}/bias" not in arrays:
            arrays[f"{layer}/bias"] = np.zeros(kernel.shape[-1], kernel.dtype)
    if unmapped:
        raise ValueError(f"{path}: {len(unmapped)} {source} keys that the ViT has no place for: "
                         + ", ".join(unmapped[:8]) + (" ..." if len(unmapped) > 8 else "")
                         + "; the model's weights were left unchanged")
    notes = []
    want = (arch["approximate_gelu"], arch["layer_norm_epsilon"])
    if numerics(model) != want:
        notes.append(f"the model computes GELU approximate={numerics(model)[0]}, LayerNorm epsilon "
                     f"{numerics(model)[1]:g}; the {source} model used approximate={want[0]}, epsilon {want[1]:g} "
                     "(build with approximate_gelu/layer_norm_epsilon to reproduce it; factories do it from the file)")
        logger.warning("keras_vit: %s", notes[-1])
    return load_arrays(model, arrays, path, notes)
