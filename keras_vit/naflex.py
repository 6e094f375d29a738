"""NaFlex models (NaViT, "Patch n' Pack"; timm's `naflexvit_*`; SigLIP 2): each image at its own aspect
ratio and resolution, given as a sequence of patches with their (row, col) coordinates, padded to the
batch's length, the padding masked in every attention and pooling."""

import keras
import numpy as np

from keras_vit import layers as L
from keras_vit.calls import is_naflex
from keras_vit.layers.initial import overwritten
from keras_vit.structure import find_vit
from keras_vit.vit_model import ANY_SIZE_EXPECTED, ViTModel, one_grid_a_batch, one_grid_only


def naflex_inputs(patch_width, dtype="float32"):
    """The three `keras.Input`s of a NaFlex model whose patches hold `patch_width` values (P * P * C) of
    `dtype` (the model's input dtype: "float32", or "uint8" scaled on the device)."""
    return {"patches": keras.Input((None, patch_width), name="patches", dtype=dtype),
            "patch_coord": keras.Input((None, 2), name="patch_coord", dtype="int32"),
            "patch_valid": keras.Input((None,), name="patch_valid", dtype="bool")}


def _check_convertible(model, parts):
    """Raises when `model`'s ViT cannot read a NaFlex batch (what it has instead, by name)."""
    why = one_grid_only(model, parts) or one_grid_a_batch(parts)
    if why is None and parts.resnet is not None:
        why = "a hybrid's ResNet stem needs whole images, not patches"
    if why is None and getattr(parts.blocks[0], "rope", None):
        why = "its blocks rotate queries and keys by the tables of one grid a batch, not of each image's own"
    if why:
        raise ValueError(f"naflex: model {model.name!r} cannot take a NaFlex batch: {why}; expected a keras-vit "
                         f"model with {ANY_SIZE_EXPECTED}")


def naflex(model):
    """A copy of `model` (a keras-vit model, any size, its weights and class names) that takes a NaFlex
    batch: a dict of "patches" (B, N, P * P * C), each patch flattened row-major with the channels
    fastest (`keras_vit.data.naflex_feed` cuts them), "patch_coord" (B, N, 2) int32, the (row, col) of each
    patch in its image's grid, and "patch_valid" (B, N) bool, False on the padding after an image's
    patches. Each patch takes the position embedding of its place in its own image's grid, by the
    model's rule; the padding is masked in every block's attention and in the pooling. An image
    given so gives what `model` built at that image's size gives.

    Outputs: the model's (logits, probabilities, pooled features); a model without pooling
    (`pooling=None`) outputs the patch tokens (B, N, D), padding included. A NaFlex model is returned
    as it is.

    Raises:
        ValueError: a model whose position embeddings cannot be read per coordinate (Table 8's 2-D
            and relative variants, per-block placements), a hybrid, or no keras-vit model.
    """
    if is_naflex(model):
        return model
    parts = find_vit(model)
    _check_convertible(model, parts)
    p, channels = parts.embedding.patch_size, model.input_shape[-1]
    inputs = naflex_inputs(p * p * channels, model.inputs[0].dtype)
    valid = L.TokenValidity(parts.num_prefix_tokens, name="token_validity")(inputs["patch_valid"])
    posembed = parts.posembed.name

    def clone(layer):
        if layer.name == "feature_map":  # no grid to lay the tokens on: the patch tokens as they are
            return keras.layers.Cropping1D((parts.num_prefix_tokens, 0), name="feature_map")
        config = layer.get_config()
        if layer.name == "rescale":  # a scale per channel: per value of a patch, the channels fastest
            config.update({k: np.tile(np.ravel(config[k]), p * p).tolist() if np.size(config[k]) > 1 else config[k]
                           for k in ("scale", "offset")})
        return layer.__class__.from_config(config)

    def call(layer, *args, **kwargs):
        if layer.name == posembed:
            return layer(args[0], patch_coord=inputs["patch_coord"], patch_valid=inputs["patch_valid"])
        if isinstance(layer, (L.TransformerBlock, L.MAPHead)) or \
                (isinstance(layer, L.SequencePooling) and layer.method == "gap"):
            return layer(*args, valid=valid, **kwargs)
        if layer.name == "feature_map":
            return layer(args[0])
        if layer.name == "crop_to_patches":  # patches are whole: nothing to crop
            return args[0]
        return layer(*args, **kwargs)

    with overwritten():  # every weight is copied below
        outputs = model._run_through_graph([inputs["patches"]], operation_fn=clone, call_fn=call)
    copy = ViTModel(inputs, outputs, name=model.name)
    for layer in copy.layers:
        if layer.weights:
            layer.set_weights(model.get_layer(layer.name).get_weights())
    if getattr(model, "class_names", None) is not None:
        copy.class_names = model.class_names
    return copy


def patchify_images(images, patch_size):
    """(B, H, W, C) `images` -> the NaFlex dict of their whole grids of `patch_size` patches, no padding,
    no resize (numpy; images of one size: `keras_vit.data.naflex_feed.patchify` resizes to a budget and pads)."""
    from keras_vit.data.naflex_sequence import cut

    patches, coord = cut(np.asarray(images), patch_size)
    return {"patches": patches, "patch_coord": np.repeat(coord[None], len(patches), 0),
            "patch_valid": np.ones(patches.shape[:2], bool)}


__all__ = ["is_naflex", "naflex", "naflex_inputs", "patchify_images"]
