"""timm and Hugging Face weights: recognise the layout, read the architecture, map to official keys
and load through the official loader (all or nothing)."""

import logging
import os

from keras_vit.structure import find_vit
from keras_vit.weights import hf, timm
from keras_vit.weights.npz import load_arrays
from keras_vit.weights.tensors import TORCH_SUFFIXES, read_tensors

logger = logging.getLogger("keras_vit")


def is_foreign(path):
    """True for a timm / Hugging Face weights file or folder (by name, or a folder with config.json)."""
    return str(path).endswith(TORCH_SUFFIXES) or hf.is_hf_folder(path)


def read(path):
    """(source, architecture dict, tensors, mapping function) of a timm file or a Hugging Face folder."""
    path = os.fspath(path)
    if os.path.isdir(path):
        if not hf.is_hf_folder(path):
            raise ValueError(f"{path} is a folder without config.json; expected a Hugging Face ViT folder")
        config, tensors = hf.read_folder(path)
        _refuse(path, tensors)
        return "Hugging Face", hf.architecture(config, tensors), tensors, hf.to_official
    tensors = read_tensors(path)
    _refuse(path, tensors)
    if timm.is_timm(tensors):
        return "timm", timm.architecture(tensors), tensors, timm.to_official
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


def describe(path):
    """The architecture (builder arguments, `tokens` for the position embeddings) of a foreign file."""
    return read(path)[1]


def numerics(model):
    """(approximate_gelu, layer_norm_epsilon) of the ViT in `model`."""
    block = find_vit(model).blocks[0]
    return block.approximate_gelu, block.layer_norm_epsilon


def load_foreign(model, path):
    """Loads a timm file or a Hugging Face folder into `model`: all or nothing, like `load_npz`."""
    source, arch, tensors, to_official = read(path)
    block = find_vit(model).blocks[0]
    heads = arch.get("num_heads")
    if heads is not None and heads != block.num_heads:
        raise ValueError(f"{path} has {heads} attention heads, model {model.name!r} has {block.num_heads}; "
                         "the model's weights were left unchanged")
    arrays, unmapped = to_official(tensors, block.num_heads)
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
