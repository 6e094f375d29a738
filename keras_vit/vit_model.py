"""The model class the builder returns (`ViTModel`: class names, a NaFlex model's token budget, calls
that keep the weights when they fail) and the questions asked of a built ViT that both `any_size` and
`naflex` ask (`one_grid_only`)."""

import functools

import keras

from keras_vit import layers as L
from keras_vit.calls import KeepsStateOnError, is_naflex
from keras_vit.layers.initial import overwritten
from keras_vit.preprocessing import check_class_names
from keras_vit.structure import output_kind

# the position layers that read any grid: a model with one takes any size, and a NaFlex batch
ANY_SIZE_LAYERS = (L.AddPositionEmbs, L.AddFactorizedPositionEmbs, L.NoPositionEmbs)
ANY_SIZE_EXPECTED = "learned 1-D, factorized or no position embeddings added once"  # what ANY_SIZE_LAYERS are


@keras.saving.register_keras_serializable(package="keras_vit")
class ViTModel(KeepsStateOnError, keras.Model):
    """The functional `keras.Model` the builder returns: a plain functional model whose `fit`,
    `evaluate` and `predict` (and `*_on_batch`) check the images first and leave the weights as they
    were when they fail or are interrupted (see `keras_vit.calls`).

    `class_names`: None, or a tuple of str, one per output of the classifier head, kept in the
    model's config so that `model.save("x.keras")` and `keras.saving.load_model` keep them, and
    what `keras_vit.decode_predictions(..., class_names=model)` and `keras-vit predict` print. Set
    them by assignment, `model.class_names = ["cat", "dog", ...]`, which checks them (the one way:
    a str per class of the head, distinct) and stores a tuple; `None` removes them. A model
    without a classifier head (`include_top=False`, `head="projection"`) takes none.

    `naflex_tokens`: None, or for a NaFlex model (`keras_vit.naflex.naflex`) the token budget its
    images are cut to (`keras-vit finetune --naflex TOKENS` records it), kept in the config as the
    class names are: what `keras-vit predict` resizes each image to fit. A positive int; None removes it.
    """

    _class_names = None
    _naflex_tokens = None

    @property
    def class_names(self):
        return self._class_names

    @class_names.setter
    def class_names(self, names):
        if names is not None:
            kind = output_kind(self)
            if kind in ("embeddings", "features") or len(self.output_shape) != 2:
                raise ValueError(f"model {self.name!r} outputs {kind or f'shape {self.output_shape}'}, not classes: "
                                 "class names are for a classifier head")
            names = check_class_names(names, self.output_shape[-1], f"the head of model {self.name!r}")
        self._class_names = names

    @property
    def naflex_tokens(self):
        return self._naflex_tokens

    @naflex_tokens.setter
    def naflex_tokens(self, tokens):
        if tokens is not None:
            if not is_naflex(self):
                raise ValueError(f"model {self.name!r} takes images, not a NaFlex batch: naflex_tokens is the token "
                                 "budget of a NaFlex model's images (keras_vit.naflex.naflex makes one)")
            if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 1:
                raise ValueError(f"naflex_tokens must be a positive int (the patches an image is cut into at "
                                 f"most); got {tokens!r}")
        self._naflex_tokens = tokens

    def call(self, inputs, training=None, mask=None, **kwargs):
        if keras.backend.backend() != "torch" or training or mask is not None or kwargs or \
                not _direct_inference(self):
            return super().call(inputs, training=training, mask=mask, **kwargs)
        # each node's own computation, without Keras' layer call around it: a host cost per node on eager torch
        # that an inference forward in float32 needs nothing of (no casts, no masks, no training flag to pass on)
        flat = self._standardize_inputs(inputs)
        if any(not isinstance(x, _torch_tensor()) or x.device.type == "meta" for x in flat):
            return super().call(inputs, training=training, mask=mask, **kwargs)
        outputs = self._run_through_graph(flat, operation_fn=_own_call)
        return outputs[0] if isinstance(outputs, (list, tuple)) and len(outputs) == 1 else outputs

    def get_config(self):
        config = super().get_config()
        if self.class_names is not None:
            config["class_names"] = list(self.class_names)
        if self.naflex_tokens is not None:
            config["naflex_tokens"] = self.naflex_tokens
        return config

    @classmethod
    def from_config(cls, config, custom_objects=None):
        config = dict(config)
        names = config.pop("class_names", None)  # absent from files saved before it existed
        tokens = config.pop("naflex_tokens", None)
        model = super().from_config(config, custom_objects=custom_objects)
        model.class_names = names
        model.naflex_tokens = tokens
        return model


def _direct_inference(model):
    """Whether an inference call of `model` may run its nodes' `call` directly: on torch, every layer in float32
    and not quantized (Keras' layer call casts to a mixed policy's dtypes and dispatches a quantized kernel)."""
    return all(layer.dtype_policy.name == "float32" and getattr(layer, "quantization_mode", None) is None
               for layer in model._flatten_layers(include_self=False))


def _torch_tensor():
    import torch

    return torch.Tensor


def _own_call(op):
    """A node's operation as an inference forward runs it: a layer's own `call` (training=False where it takes
    the flag), any other operation as it is."""
    if not isinstance(op, keras.layers.Layer):
        return op
    return functools.partial(op.call, training=False) if op._call_has_training_arg else op.call


def one_grid_only(model, parts):
    """Why the ViT `parts` found in `model` reads its positions on one grid only (so neither `any_size`
    nor `naflex` can give it other grids), or None."""
    if parts.container is not model:
        return f"its ViT sits inside {parts.path!r}; pass that model"
    if type(parts.posembed) not in ANY_SIZE_LAYERS:
        return (f"its position embedding {type(parts.posembed).__name__} is laid out for one grid (Table 8's 2-D "
                "and relative variants)")
    if any(layer.name.startswith("posembed_") and layer.name != "posembed_input" for layer in model.layers) or \
            any(b is parts.posembed for b in parts.block_posembeds[1:]):
        return "its position embeddings are added before every block (position_placement)"
    if any(isinstance(b, L.RelativeTransformerBlock) for b in parts.blocks):
        return "its blocks carry relative position attention (Table 8's relative variant)"
    return None


def one_grid_a_batch(parts):
    """Why the blocks of the ViT `parts` take one grid for a whole batch (a relative position bias, BEiT's table or
    timm's MLP, is made for the grid of each call: `any_size` gives it any grid, a NaFlex batch of several grids
    it cannot take), or None."""
    if any(getattr(b, "relative_bias_grid", None) is not None for b in parts.blocks):
        return "its blocks carry BEiT's relative position bias, a table made for one grid a call"
    if any(getattr(b, "relative_mlp", None) is not None for b in parts.blocks):
        return "its blocks' relative position MLP gives its bias for one grid a call"
    return None


def any_size(model):
    """A copy of `model`, a keras-vit model built for one image size, that takes images of any height and
    width divisible by its token size (patch size times a hybrid's ResNet stride; any size of at least one
    patch, cut to whole patches, for a model built with `crop_to_patches=True`): the same layers
    and weights, the position embeddings kept on their grid and resized at each call by the model's
    rule, as if built with `input_shape=(None, None, 3)`; class names kept. Rotary tables and relative position
    biases are made for the grid of each call (BEiT's relative tables resized as transformers'
    `interpolate_pos_encoding` resizes them). A model that takes any size already is returned as it is.

    Raises:
        ValueError: a model whose position embeddings cannot be resized at call time (Table 8's
            2-D and relative variants, none, or added before every block), or no keras-vit model.
    """
    from keras_vit.structure import find_vit

    if not isinstance(model.input_shape, tuple) or len(model.inputs) != 1:
        raise ValueError(f"any_size: model {model.name!r} takes {len(model.inputs)} inputs, not images: a NaFlex "
                         "model takes any size already")
    if None in tuple(model.input_shape[1:3]):
        return model
    parts = find_vit(model)
    why = one_grid_only(model, parts)
    if why:
        raise ValueError(f"any_size: model {model.name!r} cannot take any image size: {why}; expected a model of "
                         f"the builder with {ANY_SIZE_EXPECTED}")
    stride = parts.stride
    inputs = keras.Input((None, None, model.input_shape[-1]), dtype=model.inputs[0].dtype, name=model.inputs[0].name)

    def clone(layer):
        config = layer.get_config()
        if layer.name == "posembed_input":
            config["stride"] = stride
        elif layer.name == "feature_map":
            config.update(grid_size=None, stride=stride)
        elif config.get("rope"):  # a rotary block: its tables from the grid of each call's images
            config["rope"] = {**config["rope"], "grid_size": None, "stride": stride}
        if config.get("relative_bias_grid") is not None or config.get("relative_mlp") is not None:
            config["relative_stride"] = stride  # its bias made for the grid of each call's images
        return layer.__class__.from_config(config)

    cropped = []  # with crop_to_patches, the images the layers after it see

    def call(layer, *args, **kwargs):  # the layers that read the grid off the images get them
        if layer.name in ("posembed_input", "feature_map"):
            return layer(*args, cropped[0] if cropped else inputs, **kwargs)
        if getattr(layer, "reads_images", False):
            return layer(*args, images=cropped[0] if cropped else inputs, **kwargs)
        out = layer(*args, **kwargs)
        if layer.name == "crop_to_patches":
            cropped.append(out)
        return out

    with overwritten():  # every weight is copied below
        copy = keras.models.clone_model(model, input_tensors=inputs, clone_function=clone, call_function=call)
    for layer in copy.layers:
        layer.set_weights(model.get_layer(layer.name).get_weights())
    if getattr(model, "class_names", None) is not None:
        copy.class_names = model.class_names
    return copy


__all__ = ["ANY_SIZE_EXPECTED", "ANY_SIZE_LAYERS", "ViTModel", "any_size", "one_grid_a_batch", "one_grid_only"]
