"""Intermediate features of a ViT: the token sequences (or feature maps) of chosen encoder blocks, as
one `keras.Model` over the model's own layers."""

import keras

from keras_vit import layers as L
from keras_vit.vit_model import ViTModel
from keras_vit.structure import _direct_sublayers, find_vit

OUTPUTS = ("tokens", "maps")


def _block_indices(blocks, num_layers):
    if isinstance(blocks, int):
        blocks = [blocks]
    blocks = list(blocks)
    if not blocks:
        raise ValueError("blocks is empty; pass the encoder block indices to read, e.g. [3, 7, 11]")
    out = []
    for b in blocks:
        if isinstance(b, bool) or not isinstance(b, int) or not -num_layers <= b < num_layers:
            raise ValueError(
                f"block index {b!r} is out of range: the ViT has {num_layers} encoder blocks, "
                f"indices 0..{num_layers - 1} (or -{num_layers}..-1 from the end)"
            )
        out.append(b % num_layers)
    return out


def _path(model, target):
    """The chain of (parent, child) models from `model` down to `target`, outermost first."""
    if model is target:
        return []
    for layer in _direct_sublayers(model):
        if layer is target:
            return [(model, layer)]
        if _direct_sublayers(layer):
            sub = _path(layer, target)
            if sub is not None:
                return [(model, layer)] + sub
    return None


def _lift(parent, child, sub):
    """`sub` (a model on `child`'s inputs) re-rooted on `parent`'s inputs through `child`'s call in it."""
    for node in reversed(getattr(child, "_inbound_nodes", [])):
        args = node.arguments
        try:
            return ViTModel(parent.input, sub(*args.args, **args.kwargs), name=sub.name)
        except ValueError:
            continue
    raise ValueError(
        f"cannot reach the ViT {child.name!r} from the inputs of {parent.name!r} (not a functional graph?); "
        f"pass the ViT sub-model itself"
    )


def feature_extractor(model, blocks, output="tokens", name=None):
    """A `keras.Model` returning the outputs of the chosen encoder blocks of the ViT in `model`.

    The model runs the ViT's own layers (the same weights, nothing copied), up to the deepest
    block asked for. The ViT may be nested inside `model` (found as `keras_vit.find_vit` does); the
    extractor then takes `model`'s inputs when every model on the way is a functional graph.

    Args:
        model: a ViT built by keras_vit, or a model containing one.
        blocks: int or list of encoder block indices (negative counts from the end).
        output: "tokens", the residual stream after each block, (B, prefix + gh*gw, D) (before the
            final LayerNorm); or "maps", its patch tokens on their grid, (B, gh, gw, D).
        name: the extractor's name.
    Returns:
        A `keras.Model` with one output per block (a list, in the order of `blocks`).
    """
    if output not in OUTPUTS:
        raise ValueError(f"unknown output {output!r}; expected one of {OUTPUTS}")
    parts = find_vit(model)
    indices = _block_indices(blocks, parts.num_layers)
    container = parts.container
    outs = [parts.blocks[i].output for i in indices]
    if output == "maps":
        prefix, stride = parts.num_prefix_tokens, parts.posembed.stride
        if stride is None:
            outs = [L.TokensToMap(parts.grid_size, prefix)(t) for t in outs]
        else:
            outs = [L.TokensToMap(num_prefix_tokens=prefix, stride=stride)(t, container.inputs[0]) for t in outs]
    sub = ViTModel(container.input, outs, name=name or f"{container.name}_features")
    for parent, child in reversed(_path(model, container) or []):
        sub = _lift(parent, child, sub)
    return sub
