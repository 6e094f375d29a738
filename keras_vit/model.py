"""The Vision Transformer builder (paper section 3.1, Figure 1)."""

import keras

from keras_vit import layers as L
from keras_vit.calls import KeepsStateOnError
from keras_vit.configs import pair, resnet_stride
from keras_vit.interpolation import check_interpolation
from keras_vit.layers.attention import check_attention_implementation
from keras_vit.layers.mlp import check_mlp_activation
from keras_vit.preprocessing import NORMALIZATIONS, check_class_names, input_scaling
from keras_vit.structure import output_kind

CLASSIFIERS = ("token", "gap", "map")
POOLINGS = ("representation", None, "token", "avg")
# paper appendix D.4 / Table 8: what encodes position, and where it is added
POSITION_EMBEDDINGS = ("learned_1d", "learned_2d", "relative", "none")
POSITION_PLACEMENTS = ("once", "every_layer", "every_layer_shared")
# what the model's input holds: images already in [-1, 1], or uint8 [0, 255] scaled on the device
INPUT_DTYPES = ("float32", "uint8")
# what the top is: a classifier (logits, or probabilities through classifier_activation) or a projection
# into an embedding space (CLIP's), whose output is named "embeddings" and takes no activation
HEADS = ("classifier", "projection")


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
    """

    _class_names = None

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

    def get_config(self):
        config = super().get_config()
        if self.class_names is not None:
            config["class_names"] = list(self.class_names)
        return config

    @classmethod
    def from_config(cls, config, custom_objects=None):
        config = dict(config)
        names = config.pop("class_names", None)  # absent from files saved before it existed
        model = super().from_config(config, custom_objects=custom_objects)
        model.class_names = names
        return model


def grid_size(image_size, patch_size, resnet=None):
    """The (gh, gw) patch grid of a configuration; raises when the image does not tile."""
    h, w = pair(image_size, "image_size")
    stride = patch_size * resnet_stride(resnet and resnet["num_layers"])
    if h % stride or w % stride:
        what = f"patch size {patch_size}" + (f" x ResNet stride {stride // patch_size}" if resnet else "")
        raise ValueError(
            f"image_size {(h, w)} is not divisible by the {what} = {stride}; "
            f"use a multiple of {stride}, e.g. {(max(1, round(h / stride)) * stride, max(1, round(w / stride)) * stride)}"
        )
    return h // stride, w // stride


def _input_size(image_size, input_shape, input_tensor, stride):
    """(image_size the position embeddings are laid out for, (H, W) of the input, channels).

    H or W None means the model takes any size along that axis; `image_size=None` lays the position
    embeddings out for 224 px then (`keras_vit.VisionTransformer` passes the grid of its weights).
    """
    if input_tensor is not None:
        if len(input_tensor.shape) != 4:
            raise ValueError(f"input_tensor must be NHWC (4D), got shape {tuple(input_tensor.shape)}")
        shape = tuple(input_tensor.shape[1:])
        if input_shape is not None and tuple(input_shape) != shape:
            raise ValueError(f"input_shape {tuple(input_shape)} disagrees with input_tensor's shape {shape}")
        input_shape = shape
    if input_shape is not None:
        input_shape = tuple(input_shape)
        if len(input_shape) != 3 or not all(v is None or (isinstance(v, int) and v > 0) for v in input_shape) \
                or input_shape[2] is None:
            raise ValueError(
                f"input_shape must be (height, width, channels) with positive ints (None for any height or "
                f"width), got {input_shape!r}")
        hw, channels = input_shape[:2], input_shape[2]
    else:
        hw, channels = ((None, None) if image_size is None else pair(image_size, "image_size")), 3
    if image_size is not None:
        image_size = pair(image_size, "image_size")
        clash = [(a, b) for a, b in zip(hw, image_size) if a is not None and a != b]
        if clash:
            what = (f"input_tensor's spatial shape {tuple(hw)}" if input_tensor is not None
                    else f"input_shape {tuple(input_shape)}")
            raise ValueError(f"{what} disagrees with image_size {image_size}; "
                             "pass one of them, or None for height and width to take any size")
    elif None not in hw:
        image_size = hw
    else:
        image_size = 224
    for axis, size in zip(("height", "width"), hw if None in hw else ()):  # else grid_size() says it
        if size is not None and size % stride:
            raise ValueError(f"input {axis} {size} is not divisible by {stride} pixels per token (patch size x "
                             f"ResNet stride); use a multiple of {stride}")
    return image_size, hw, channels


def build_vit(
    image_size=224,
    patch_size=16,
    hidden_size=768,
    mlp_dim=3072,
    num_heads=12,
    num_layers=12,
    classes=1000,
    classifier="token",
    representation_size=None,
    resnet=None,
    dropout_rate=0.0,
    attention_dropout_rate=0.0,
    include_top=True,
    input_tensor=None,
    classifier_activation="softmax",
    name="vit",
    remat=False,
    input_shape=None,
    pooling="representation",
    position_embedding="learned_1d",
    position_placement="once",
    approximate_gelu=True,
    layer_norm_epsilon=1e-6,
    input_dtype="float32",
    input_mode="vit",
    attention_implementation="auto",
    distillation_token=False,
    num_register_tokens=0,
    prefix_position_embedding=True,
    layer_scale=None,
    pre_norm=False,
    fc_norm=False,
    mlp_activation="gelu",
    position_interpolation="bilinear",
    head="classifier",
):
    """Builds a Vision Transformer as a functional `keras.Model` with freshly initialised weights
    (`keras_vit.VisionTransformer` is this plus `weights=`).

    The model takes NHWC images already scaled to [-1, 1] (see `keras_vit.preprocess_input`), or
    with `input_dtype="uint8"` the images as uint8 in [0, 255].

    Args:
        image_size: int or (h, w); must be divisible by the patch size (times the ResNet stride).
        patch_size: P, the side of the square patches.
        hidden_size, mlp_dim, num_heads, num_layers: D, MLP width, heads and depth of the encoder.
        classes: width of the classification head.
        classifier: "token" (the [class] token's output, paper Eq. 4), "gap" (mean of all tokens,
            no class token) or "map" (SigLIP: multihead attention pooling, a learned probe
            attending over the patch tokens then a residual MLP; no class token).
        representation_size: None, or the width of the pre-logits Dense + tanh layer.
        resnet: None, or a dict `{"num_layers": (3, 4, 9), "width_factor": 1}` for a hybrid.
        dropout_rate, attention_dropout_rate: as the paper's Appendix B.1.
        include_top: with the head; without it the model returns what `pooling` says.
        input_tensor: optional Keras tensor to build the model on (None height/width: any size).
        classifier_activation: activation of the head; None gives logits.
        head: with `include_top`, "classifier" (the default) or "projection": the top is a linear
            map into an embedding space (CLIP's visual projection, `classes` its width), and the
            model's output layer is named "embeddings"; `classifier_activation` must be None.
        name: the model's name.
        remat: rematerialise each encoder block in training (gradient checkpointing): the backward
            pass recomputes a block's activations instead of keeping them, so a training step holds
            the residual stream plus one block's activations, for about a third more compute.
            The measured memory and time per backend are in benchmarks/README.md.
        input_shape: (H, W, C) as keras.applications; must agree with `image_size`. None for H
            and/or W (or `image_size=None`) builds a model that takes any size divisible by the
            patch (times the ResNet stride) and resizes the position embeddings, laid out for
            `image_size` (None: 224 here; `keras_vit.VisionTransformer` takes the grid of an `.npz`
            in `weights`), at call time by the official rule.
        pooling: with `include_top=False`: "representation" (the default, what the head reads:
            y = LN(z_L^0), or the token mean for "gap", through pre-logits when set), None (the
            patch tokens after the final LayerNorm as a (B, gh, gw, D) feature map), "token" (the
            class token after the final LayerNorm) or "avg" (the mean of the patch tokens after it).
        position_embedding: the paper's ablation of appendix D.4 (Table 8): "learned_1d" (the
            official model), "learned_2d" (row and column tables of D/2 each, concatenated),
            "relative" (1-D relative attention bias in every block, nothing added to the tokens)
            or "none" (a bag of patches).
        position_placement: for the learned embeddings, where they are added: "once" after the
            stem (official), "every_layer" (its own table before each block) or
            "every_layer_shared" (one table added before each block).
        approximate_gelu: the MLP's GELU: the tanh approximation (official checkpoints) or, with
            False, the exact erf form (timm and Hugging Face checkpoints).
        layer_norm_epsilon: epsilon of every LayerNorm: 1e-6 (official, timm) or 1e-12 (Hugging Face).
        input_dtype: "float32" (the input is [-1, 1] images) or "uint8": the input is uint8 images in
            [0, 255], scaled to [-1, 1] in float32 by the model's first layer (`Rescaling`, named
            "rescale"), so a pipeline sends a quarter of the bytes to the device and does no
            scaling on the host. The weights are the same either way.
        input_mode: with input_dtype="uint8", the scaling the weights were trained with, a
            `keras_vit.preprocess_input` mode: "vit" ([-1, 1]), "imagenet" (DeiT, DINOv2) or "clip".
        attention_implementation: "auto", "flash" or "standard": whether the encoder's attention
            runs the GPU's fused kernel (see `keras_vit.layers.MultiHeadDotProductAttention`);
            "flash" where it cannot run is a ValueError here, before anything is compiled.

    The options below make the ViTs of later papers from the same builder; each is off by default
    (the paper's model) and is one named difference:

        distillation_token: DeiT's second token after the class token; with `include_top` a second
            head `head_dist` reads it and the two heads' logits are averaged (DeiT's inference);
            the representation is the mean of the two tokens.
        num_register_tokens: learned tokens after the class (and distillation) token that get no
            position embedding and are dropped by every pooling (DINOv2 with registers).
        prefix_position_embedding: True: the position embeddings cover the class/distillation
            token too (the paper's); False: the patch tokens only, added before the class token is
            prepended (DeiT III, timm's DINOv2 with registers: timm's `no_embed_class`).
        layer_scale: None, or the initial value of a learned per-channel scale on every residual
            branch (DeiT III, DINOv2; see `keras_vit.layers.TransformerBlock`).
        pre_norm: a LayerNorm `pre_norm` on the tokens before the first block (CLIP's `norm_pre`
            / `pre_layrnorm`).
        fc_norm: the final LayerNorm after pooling instead of on every token (timm's `fc_norm`:
            its average-pooled models); the feature map (`pooling=None`) is then un-normalised.
        mlp_activation: "gelu" (with `approximate_gelu`), "quick_gelu" (OpenAI CLIP) or "swiglu"
            (DINOv2-giant; `mlp_dim` is the width after gating).
        position_interpolation: how the learned 1-D position embeddings are resized to another
            grid (when weights of another resolution are loaded, or at call time): "bilinear" (the
            paper's rule, corners aligned), or the rule of another source of weights:
            "bicubic_antialias" (timm), "bicubic" (most Hugging Face models), "bilinear_half_pixel"
            (see `keras_vit.interpolation.POSITION_INTERPOLATIONS`).
    """
    if position_embedding not in POSITION_EMBEDDINGS:
        raise ValueError(f"unknown position_embedding {position_embedding!r}; expected one of {POSITION_EMBEDDINGS}")
    if position_placement not in POSITION_PLACEMENTS:
        raise ValueError(f"unknown position_placement {position_placement!r}; expected one of {POSITION_PLACEMENTS}")
    if position_placement != "once" and not position_embedding.startswith("learned"):
        raise ValueError(
            f"position_placement={position_placement!r} needs a learned position embedding, got "
            f"position_embedding={position_embedding!r} (Table 8 has no such variant)"
        )
    if input_dtype not in INPUT_DTYPES:
        raise ValueError(f"unknown input_dtype {input_dtype!r}; expected one of {INPUT_DTYPES}")
    if input_mode not in NORMALIZATIONS or (input_mode != "vit" and input_dtype != "uint8"):
        raise ValueError(f"input_mode {input_mode!r} must be one of {tuple(NORMALIZATIONS)}, and other than 'vit' "
                         f"only with input_dtype='uint8' (got input_dtype={input_dtype!r})")
    check_attention_implementation(attention_implementation)
    if head not in HEADS:
        raise ValueError(f"unknown head {head!r}; expected one of {HEADS}")
    if head == "projection" and include_top and (classifier_activation is not None or distillation_token):
        raise ValueError(f"head='projection' outputs an embedding: it takes classifier_activation=None and no "
                         f"distillation token, got classifier_activation={classifier_activation!r}, "
                         f"distillation_token={distillation_token!r}")
    if classifier not in CLASSIFIERS:
        raise ValueError(f"unknown classifier {classifier!r}; expected one of {CLASSIFIERS}")
    if classifier_activation is not None:  # checked with or without a top, as every other argument
        try:
            keras.activations.get(classifier_activation)
        except (ValueError, TypeError):
            raise ValueError(f"unknown classifier_activation {classifier_activation!r}; expected None, the name of "
                             "a Keras activation (e.g. 'softmax') or a callable") from None
    for key, value in (("patch_size", patch_size), ("hidden_size", hidden_size), ("mlp_dim", mlp_dim),
                       ("num_heads", num_heads), ("num_layers", num_layers), ("classes", classes)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{key} must be a positive int, got {value!r}")
    if hidden_size % num_heads:
        raise ValueError(f"hidden_size {hidden_size} is not divisible by num_heads {num_heads}")
    if resnet is not None:
        unknown = set(resnet) - {"num_layers", "width_factor"}
        if unknown or "num_layers" not in resnet:
            raise ValueError(f"resnet must be None or {{'num_layers': (...), 'width_factor': int}}, got {resnet!r}")
    if pooling not in POOLINGS:
        raise ValueError(f"unknown pooling {pooling!r}; expected one of {POOLINGS}")
    if include_top and pooling != "representation":
        raise ValueError(f"pooling={pooling!r} is for include_top=False (the head reads the representation)")
    if pooling == "token" and classifier != "token":
        raise ValueError(f'pooling="token" needs a class token; this model has classifier={classifier!r} (use "avg")')
    if pooling != "representation" and representation_size is not None:
        raise ValueError(f"representation_size (pre-logits) goes with pooling='representation', got pooling={pooling!r}")
    check_mlp_activation(mlp_activation)
    check_interpolation(position_interpolation, "position_interpolation")
    if isinstance(num_register_tokens, bool) or not isinstance(num_register_tokens, int) or num_register_tokens < 0:
        raise ValueError(f"num_register_tokens must be a non-negative int, got {num_register_tokens!r}")
    layout = [f"num_register_tokens={num_register_tokens}"] if num_register_tokens else []
    layout += [] if prefix_position_embedding else ["prefix_position_embedding=False"]
    if position_placement != "once" and layout:
        raise ValueError(f"position_placement={position_placement!r} adds position embeddings to every block's "
                         f"tokens, which {', '.join(layout)} does not lay out; use position_placement='once'")
    if not prefix_position_embedding and not position_embedding.startswith("learned"):
        raise ValueError(f"prefix_position_embedding=False is about learned position embeddings, got "
                         f"position_embedding={position_embedding!r}")
    if distillation_token and classifier != "token":
        raise ValueError(f"distillation_token=True sits beside a class token (classifier='token'), got "
                         f"classifier={classifier!r}")
    if distillation_token and (representation_size is not None or fc_norm):
        raise ValueError("distillation_token=True takes no representation_size (pre-logits) and no fc_norm "
                         "(DeiT has neither)")
    cls_tokens = int(classifier == "token") + int(bool(distillation_token))
    prefix = cls_tokens + num_register_tokens  # tokens before the patch grid
    if input_tensor is not None and not keras.utils.is_keras_tensor(input_tensor):
        input_tensor = keras.Input(tensor=input_tensor)
    stride = patch_size * resnet_stride(resnet and resnet["num_layers"])
    image_size, hw, channels = _input_size(image_size, input_shape, input_tensor, stride)
    grid = grid_size(image_size, patch_size, resnet)
    runtime = None in hw
    if runtime and (position_embedding != "learned_1d" or position_placement != "once"):
        raise ValueError(
            "a model of runtime resolution (image_size=None or a None height/width) takes "
            "position_embedding='learned_1d' added once; got "
            f"position_embedding={position_embedding!r}, position_placement={position_placement!r}")

    if input_tensor is None:
        inputs = keras.Input((*hw, channels), name="images", dtype=input_dtype)
        x = inputs
    else:
        inputs, x = input_tensor, input_tensor
    if input_dtype == "uint8" and input_mode == "vit":
        x = keras.layers.Rescaling(1 / 127.5, offset=-1.0, name="rescale", dtype="float32")(x)
    elif input_dtype == "uint8":
        scale, offset = input_scaling(input_mode)
        x = keras.layers.Rescaling(scale, offset=offset, name="rescale", dtype="float32")(x)
    images = x

    if resnet is not None:
        x = L.ResNetStem(tuple(resnet["num_layers"]), resnet.get("width_factor", 1), name="resnet")(x)
    x = L.PatchEncoder(patch_size, hidden_size, name="embedding")(x)
    posemb = {"learned_1d": L.AddPositionEmbs, "learned_2d": L.AddPositionEmbs2D}.get(position_embedding, L.NoPositionEmbs)
    posemb_args = dict(grid_size=grid, num_prefix_tokens=cls_tokens if prefix_position_embedding else 0)
    if runtime and position_embedding == "learned_1d":
        posembed = L.AddPositionEmbs(**posemb_args, stride=stride, interpolation=position_interpolation,
                                     name="posembed_input")
        add_positions = lambda x: posembed(x, images)  # noqa: E731
    else:
        if posemb is L.AddPositionEmbs:
            posemb_args["interpolation"] = position_interpolation
        posembed = posemb(**posemb_args, name="posembed_input")
        add_positions = posembed
    if not prefix_position_embedding:
        x = add_positions(x)
    if classifier == "token":
        x = L.ClassToken(name="cls")(x)
    if distillation_token:
        x = L.PrefixTokens(1, index=1, name="dist")(x)
    if prefix_position_embedding:
        x = add_positions(x)
    if num_register_tokens:
        x = L.PrefixTokens(num_register_tokens, index=cls_tokens, name="registers")(x)
    x = keras.layers.Dropout(dropout_rate, name="dropout")(x)
    if pre_norm:
        x = keras.layers.LayerNormalization(epsilon=layer_norm_epsilon, name="pre_norm")(x)
    block = L.RelativeTransformerBlock if position_embedding == "relative" else L.TransformerBlock
    for i in range(num_layers):
        if i and position_placement == "every_layer_shared":
            x = posembed(x)
        elif i and position_placement == "every_layer":
            x = posemb(**posemb_args, name=f"posembed_{i}")(x)
        x = block(num_heads, mlp_dim, dropout_rate, attention_dropout_rate, remat=remat, approximate_gelu=approximate_gelu,
                  layer_norm_epsilon=layer_norm_epsilon, attention_implementation=attention_implementation,
                  mlp_activation=mlp_activation, layer_scale=layer_scale, name=f"encoderblock_{i}")(x)
    if not fc_norm:
        x = keras.layers.LayerNormalization(epsilon=layer_norm_epsilon, name="encoder_norm")(x)
    if pooling is None:
        if runtime:
            x = L.TokensToMap(num_prefix_tokens=prefix, stride=stride, name="feature_map")(x, images)
        else:
            x = L.TokensToMap(grid, num_prefix_tokens=prefix, name="feature_map")(x)
    elif pooling == "representation" and distillation_token:
        x, dist = (L.SequencePooling("token", token_index=i, name=n)(x) for i, n in ((0, "pool"), (1, "pool_dist")))
        if include_top:  # DeiT's inference: the mean of the two heads' logits
            heads = (keras.layers.Dense(classes, kernel_initializer="zeros", name=n, dtype="float32")
                     for n in ("head", "head_dist"))
            x = keras.layers.Average(name="head_average", dtype="float32")([h(t) for h, t in zip(heads, (x, dist))])
        else:
            x = keras.layers.Average(name="pool_average")([x, dist])
    elif pooling == "representation" and classifier == "map":
        x = L.MAPHead(num_heads, mlp_dim, num_prefix_tokens=prefix, layer_norm_epsilon=layer_norm_epsilon,
                      approximate_gelu=approximate_gelu, mlp_activation=mlp_activation, name="map_head")(x)
    elif pooling == "representation":
        x = L.SequencePooling(classifier, num_prefix_tokens=prefix, name="pool")(x)
    else:
        x = L.SequencePooling("token" if pooling == "token" else "gap", num_prefix_tokens=prefix, name="pool")(x)
    if fc_norm and pooling is not None:
        x = keras.layers.LayerNormalization(epsilon=layer_norm_epsilon, name="fc_norm")(x)
    if representation_size is not None:
        x = keras.layers.Dense(representation_size, activation="tanh", name="pre_logits")(x)
    if include_top and distillation_token:
        if classifier_activation is not None:
            x = keras.layers.Activation(classifier_activation, name="predictions", dtype="float32")(x)
    elif include_top:
        x = keras.layers.Dense(classes, kernel_initializer="zeros", name="head", dtype="float32")(x)
        if head == "projection":
            x = keras.layers.Activation("linear", name="embeddings", dtype="float32")(x)
        elif classifier_activation is not None:
            x = keras.layers.Activation(classifier_activation, name="predictions", dtype="float32")(x)
    else:
        x = keras.layers.Activation("linear", name="features", dtype="float32")(x)

    if input_tensor is not None:
        inputs = keras.utils.get_source_inputs(input_tensor)
    return ViTModel(inputs, x, name=name)


def any_size(model):
    """A copy of `model`, a keras-vit model built for one image size, that takes images of any height and
    width divisible by its token size (patch size times a hybrid's ResNet stride): the same layers
    and weights, the position embeddings kept on their grid and resized at each call by the model's
    rule, as if built with `input_shape=(None, None, 3)`; class names kept. A model that takes any
    size already is returned as it is.

    Raises:
        ValueError: a model whose position embeddings cannot be resized at call time (Table 8's
            2-D and relative variants, none, or added before every block), or no keras-vit model.
    """
    from keras_vit.structure import find_vit

    if None in tuple(model.input_shape[1:3]):
        return model
    parts = find_vit(model)
    names = {layer.name for layer in model.layers}
    if parts.container is not model or type(parts.posembed) is not L.AddPositionEmbs \
            or any(n.startswith("posembed_") and n != "posembed_input" for n in names):
        raise ValueError(f"any_size: model {model.name!r} cannot take any image size: expected a model of the "
                         "builder with learned 1-D position embeddings added once (Table 8's 2-D, relative and "
                         f"per-block variants have a table for one grid only); got position layer "
                         f"{type(parts.posembed).__name__} in {parts.path or model.name!r}")
    stride = parts.stride
    inputs = keras.Input((None, None, model.input_shape[-1]), dtype=model.inputs[0].dtype, name=model.inputs[0].name)

    def clone(layer):
        config = layer.get_config()
        if layer.name == "posembed_input":
            config["stride"] = stride
        elif layer.name == "feature_map":
            config.update(grid_size=None, stride=stride)
        return layer.__class__.from_config(config)

    def call(layer, *args, **kwargs):  # the two layers that read the grid off the images get them
        return layer(*args, inputs, **kwargs) if layer.name in ("posembed_input", "feature_map") else layer(*args, **kwargs)

    copy = keras.models.clone_model(model, input_tensors=inputs, clone_function=clone, call_function=call)
    for layer in copy.layers:
        layer.set_weights(model.get_layer(layer.name).get_weights())
    if getattr(model, "class_names", None) is not None:
        copy.class_names = model.class_names
    return copy
