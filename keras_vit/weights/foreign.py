"""timm and Hugging Face weights: recognise the layout, read the architecture, map to official keys
and load through the official loader (all or nothing)."""

import logging
import math
import os
from typing import Any, Callable, NamedTuple

import numpy as np

from keras_vit.configs import FAMILY_DEFAULTS, family_name, pair
from keras_vit.layers.relative_position_bias import resize_relative_position_bias
from keras_vit.layers.rotary import check_rope, without_augmentation
from keras_vit.structure import find_vit
from keras_vit.vit_config import CLASS_TOKEN_CLASSIFIERS
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
        arch = hf.architecture(config, tensors)
        arch["input_mode"] = hf.folder_input_mode(path, arch["input_mode"])
        return "Hugging Face", arch, tensors, hf.to_official
    tensors = timm.readable(read_tensors(path), path)  # in the key names the rules read
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
                "drop_path_rate", "class_token", "map_num_heads", "map_mlp_dim", "map_include_prefix",
                "register_position_embedding")


def file_options(arch):
    """The builder arguments of FILE_OPTIONS that a file's architecture names (None: it does not say)."""
    return {k: arch[k] for k in FILE_OPTIONS if k in arch and (arch[k] is not None or k == "layer_scale")}


def file_image_size(arch, stride):
    """A file's resolution: its config's, else its square position-embedding grid times `stride` (None if not square)."""
    if arch.get("image_size"):
        return arch["image_size"]
    if not arch.get("tokens"):
        return None
    covered = int(arch["classifier"] in CLASS_TOKEN_CLASSIFIERS) + int(arch.get("distillation_token", False)) + (
        arch.get("num_register_tokens", 0) if arch.get("register_position_embedding") else 0)
    grid = arch["tokens"] - (covered if arch.get("prefix_position_embedding", True) else 0)
    side = math.isqrt(grid)
    return side * stride if side * side == grid else None


def crop_option(file_size, stride, resnet=None):
    """{"crop_to_patches": True} for a foreign file whose own image size (`file_image_size`) is no multiple of its
    patch (SigLIP so400m/14 at 384 px): its source's patch convolution (timm's, Hugging Face's, keras-hub's: no
    padding) reads the whole patches that fit and leaves the rest, and so does the model, at every size; else {}
    (another size that does not tile is refused, naming the option; a hybrid's stem reads every pixel)."""
    if file_size is None or resnet is not None:
        return {}
    h, w = pair(file_size, "image_size")
    return {"crop_to_patches": True} if h % stride or w % stride else {}


def warn_assumed_gelu(arch, path):
    """Says in one line (logged as a warning) which GELU a timm file of SigLIP's layout is built with when
    neither its state dict nor its name tells (`keras_vit.weights.timm.architecture`'s `gelu_assumed`), and
    how to choose the other; returns the line, or None when the file or its name told."""
    if not arch.get("gelu_assumed"):
        return None
    naflex = "position_embedding" in arch  # a timm NaFlex ViT's (`keras_vit.weights.timm._naflex_architecture`)
    tanh = ("naflexvit_base_patch16_siglip, naflexvit_so400m_patch16_siglip" if naflex else
            "vit_so400m_patch16_siglip_*, vit_giantopt_patch16_siglip_*, vit_large_patch16_siglip_512, "
            "vit_base_patch32_siglip_256 and their _gap twins")
    choose = "approximate_gelu=True" + (", position_interpolation='bilinear_antialias'" if naflex else "")
    example = "naflexvit_base_patch16_siglip" if naflex else "vit_so400m_patch16_siglip_384.v2_webli"
    line = (f"keras_vit: {path}: a timm state dict does not record its MLP's GELU, nor does this name: built with "
            f"the exact GELU (timm's SigLIP 1 towers'); timm's SigLIP 2 ones ({tanh}) compute the tanh GELU: for one "
            f"of those pass {choose} to keras_vit.from_timm, or name the file after its architecture "
            f"({example}.safetensors)")
    logger.warning("%s", line)
    return line


def settle_layout(arch, grid):
    """`arch` with `prefix_position_embedding` read off its position-embedding count for a known patch
    `grid` (gh, gw): a timm count alone is ambiguous when the grid may be non-square (4x6 + a class token
    = 25 = 5x5). Where the file's own size is known (its config's, or its architecture's name's), its own grid
    reads the count, not the `grid` it is resized to (a 4x4 table of patches only is no 3x5 grid and a class
    token)."""
    if arch.get("register_position_embedding"):  # the count read with the registers: one reading only
        return arch
    own = arch.get("image_size")
    if own and arch.get("resnet") is None and arch.get("patch_size"):
        grid = tuple(side // arch["patch_size"] for side in pair(own, "image_size"))
    prefix = int(arch["classifier"] in CLASS_TOKEN_CLASSIFIERS) + int(arch.get("distillation_token", False))
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
    if key == "rope":  # None is no rotary embedding, not "not said"; a training-time augmentation changes no weight
        return without_augmentation(check_rope(ours)) == without_augmentation(check_rope(theirs))
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


def _map_head_split(model, arrays):
    """`arrays` with the attention-pool head's projections split into that head's own head count, where it has its
    own (`map_num_heads`: the readers split every attention by the encoder's)."""
    container = find_vit(model).container  # the ViT itself, where another model holds it
    if "map_head" not in {layer.name for layer in container.layers}:
        return arrays
    heads = container.get_layer("map_head").num_heads
    prefix = "MAPHead_0/MultiHeadDotProductAttention_0/"
    out = dict(arrays)
    for key, value in arrays.items():
        if not key.startswith(prefix) or value.ndim < 2:
            continue
        if key.endswith("out/kernel"):  # (heads, head_dim, D)
            out[key] = value.reshape(heads, -1, value.shape[-1])
        elif key.endswith("kernel"):  # (D, heads, head_dim)
            out[key] = value.reshape(value.shape[0], heads, -1)
        else:  # bias (heads, head_dim)
            out[key] = value.reshape(heads, -1)
    return out


def _relative_tables_to_grid(model, arrays, arch, source, path):
    """`arrays` with BEiT's relative position tables laid out for the model's grid where the file's are for another
    (`resize_relative_position_bias`): by transformers' rule for a Hugging Face folder (bilinear, as its
    `interpolate_pos_encoding`), else by timm's (geometric). The file's grid is the model's where the table has its
    size, else the square its table implies, else the one its config names; a ValueError naming both where none fits."""
    grid = getattr(find_vit(model).blocks[0], "relative_bias_grid", None)
    tables = [k for k in arrays if k.endswith("relative_position_bias_table")]
    if grid is None or not tables:
        return arrays
    rows = arrays[tables[0]].shape[0]
    side = (math.isqrt(rows - 3) + 1) // 2 if rows > 3 else 0
    named = [tuple(grid), (side, side)]  # the model's own first: a table of its size is laid out for it
    if arch.get("image_size") and arch.get("patch_size"):
        (h, w), (ph, pw) = pair(arch["image_size"], "image_size"), pair(arch["patch_size"], "patch_size")
        named.append((h // ph, w // pw))
    old = next((g for g in named if (2 * g[0] - 1) * (2 * g[1] - 1) + 3 == rows), None)
    if old is None:
        raise ValueError(f"{path}: its relative position tables (BEiT's) hold {rows} offsets, of no square grid nor "
                         f"of the grid its config names; model {model.name!r} has a {grid[0]}x{grid[1]} grid. Build at "
                         "the file's image size (leave out image_size); the model's weights were left unchanged")
    method = "bilinear" if source == "Hugging Face" else "geometric"
    return {**arrays, **{k: resize_relative_position_bias(arrays[k], old, grid, method) for k in tables}}


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
    arrays = _relative_tables_to_grid(model, arrays, arch, source, path)
    arrays = _map_head_split(model, arrays)
    if unmapped:
        raise ValueError(f"{path}: {len(unmapped)} {source} keys that the ViT has no place for: "
                         + ", ".join(unmapped[:8]) + (" ..." if len(unmapped) > 8 else "")
                         + "; the model's weights were left unchanged")
    notes = []
    want = (arch["approximate_gelu"], arch["layer_norm_epsilon"])
    if arch.get("gelu_assumed"):  # either GELU may be the file's (warn_assumed_gelu): the model's is kept
        want = (numerics(model)[0], want[1])
    if numerics(model) != want:
        notes.append(f"the model computes GELU approximate={numerics(model)[0]}, LayerNorm epsilon "
                     f"{numerics(model)[1]:g}; the {source} model used approximate={want[0]}, epsilon {want[1]:g} "
                     "(build with approximate_gelu/layer_norm_epsilon to reproduce it; factories do it from the file)")
        logger.warning("keras_vit: %s", notes[-1])
    return load_arrays(model, arrays, path, notes)
