"""The Vision Transformer builder (paper section 3.1, Figure 1): `build_vit` checks its options as a ViTConfig
(`keras_vit.vit_config`), then builds the model in stages: inputs, embedding, encoder, pooling, top."""

import functools

import keras

from keras_vit import layers as L
from keras_vit.configs import pair, resnet_stride
from keras_vit.preprocessing import input_scaling
from keras_vit.vit_config import (  # noqa: F401 (the option names, importable from here as before)
    CLASSIFIERS, HEADS, INPUT_DTYPES, POOLINGS, POSITION_EMBEDDINGS, POSITION_PLACEMENTS, ViTConfig)
from keras_vit.vit_model import ViTModel, any_size  # noqa: F401 (any_size importable from here as before)

CROP_HINT = ("or build with crop_to_patches=True to cut floor(size / patch) patches and leave the rest unread, as "
             "a patch convolution without padding does (timm's, Hugging Face's)")


def grid_size(image_size, patch_size, resnet=None, crop_to_patches=False):
    """The (gh, gw) patch grid of a configuration; raises when the image does not tile (unless
    `crop_to_patches`: the whole patches that fit)."""
    h, w = pair(image_size, "image_size")
    stride = patch_size * resnet_stride(resnet and resnet["num_layers"])
    if crop_to_patches and h >= stride and w >= stride:
        return h // stride, w // stride
    if h % stride or w % stride:
        what = f"patch size {patch_size}" + (f" x ResNet stride {stride // patch_size}" if resnet else "")
        raise ValueError(
            f"image_size {(h, w)} is not divisible by the {what} = {stride}; "
            f"use a multiple of {stride}, e.g. {(max(1, round(h / stride)) * stride, max(1, round(w / stride)) * stride)}"
            + ("" if resnet or crop_to_patches else f", {CROP_HINT}")
        )
    return h // stride, w // stride


def _input_size(image_size, input_shape, input_tensor, stride, crop_to_patches=False, hybrid=False):
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
        if size is not None and crop_to_patches and size < stride:
            raise ValueError(f"input {axis} {size} is less than one {stride}-pixel patch")
        if size is not None and not crop_to_patches and size % stride:
            raise ValueError(f"input {axis} {size} is not divisible by {stride} pixels per token (patch size x "
                             f"ResNet stride); use a multiple of {stride}" + ("" if hybrid else f", {CROP_HINT}"))
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
    position_aspect_preserving=False,
    naflex=False,
    drop_path_rate=0.0,
    crop_to_patches=False,
    rope=None,
    mlp_norm=False,
    attention_norm=False,
    normalization="layer_norm",
    embed_norm=False,
    relative_position_bias=False,
    relative_position_mlp=None,
    post_norm=False,
    qk_norm=False,
    parallel_blocks=False,
    parallel_branches=1,
    differential_attention=False,
    class_token=None,
    map_num_heads=None,
    map_mlp_dim=None,
    map_include_prefix=False,
    encoder_norm=True,
    register_position_embedding=False,
):
    """Builds a Vision Transformer as a functional `keras.Model` with freshly initialised weights
    (`keras_vit.VisionTransformer` is this plus `weights=`).

    The model takes NHWC images already scaled to [-1, 1] (see `keras_vit.preprocess_input`), or
    with `input_dtype="uint8"` the images as uint8 in [0, 255].

    Args:
        image_size: int or (h, w); must be divisible by the patch size (times the ResNet stride), unless
            `crop_to_patches`.
        patch_size: P, the side of the square patches.
        hidden_size, mlp_dim, num_heads, num_layers: D, MLP width, heads and depth of the encoder.
        classes: width of the classification head.
        classifier: "token" (the [class] token's output, paper Eq. 4), "gap" (mean of all tokens, no class
            token), "map" (SigLIP: multihead attention pooling, a learned probe attending over the patch tokens
            then a residual MLP; no class token) or "token_gap" (DINOv2's linear heads: the class token and the
            patch tokens' mean side by side, 2 x hidden_size wide).
        representation_size: None, or the width of the pre-logits Dense + tanh layer.
        resnet: None, or a dict `{"num_layers": (3, 4, 9), "width_factor": 1}` for a hybrid (`"numerics": "timm"`:
            timm's weight standardisation and GroupNorm epsilons, for its hybrids' files).
        dropout_rate, attention_dropout_rate: as the paper's Appendix B.1.
        drop_path_rate: stochastic depth (DeiT's and timm's `drop_path_rate`), in [0, 1): in training
            each block's two residual branches are dropped for whole samples, block i of L at rate
            i * drop_path_rate / (L - 1) (timm's linear rule; one block gets 0), kept ones scaled by
            1 / keep; 0 (the paper's) or evaluation computes exactly the model without it. Saved in
            the blocks' config (see `keras_vit.layers.TransformerBlock`).
        crop_to_patches: False (the paper's): an image side that is no multiple of the patch is refused;
            True: the images' bottom rows and right columns that fill no whole patch are dropped
            (`keras_vit.layers.CropToPatches`, a layer "crop_to_patches" saved with the model), as the
            patch convolution of timm, Hugging Face and keras-hub (no padding) leaves them unread:
            SigLIP so400m/14 takes 384 px images as 27 x 27 patches. The loaders of those files set it
            for a file whose own size is no multiple of its patch. Not with a ResNet stem.
        include_top: with the head; without it the model returns what `pooling` says (the head reads "avg"
            too: the mean of the patch tokens with a class token beside them, EVA's timm models).
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
        position_aspect_preserving: resize the learned (or factorized) position embeddings to a square
            of the grid's longer side and take its top-left (timm's `pos_embed_ar_preserving`, its NaFlex
            "par" models) instead of each axis by its own factor.
        naflex: the model takes a NaFlex batch instead of images (see `keras_vit.naflex.naflex`): a
            dict of "patches" (B, N, P * P * C), "patch_coord" (B, N, 2) and "patch_valid" (B, N),
            each image at its own size and aspect ratio, the padding masked; `image_size` is the grid
            the position embeddings are laid out on. `position_embedding="factorized"` (NaViT's per-axis
            tables, timm's "parfac" models) goes with it, and with any model that takes any size.
        rope: None, or a rotary position embedding of the patch tokens' queries and keys in every block
            (`keras_vit.layers.rotary`): {"kind": "dinov3", "temperature": 100.0} is DINOv3's (with
            `position_embedding="none"`; "shift", "jitter", "rescale": its training-time coordinate augmentation,
            `layers.RotaryAugment`); {"kind": "eva", "temperature": 10000.0, "reference_grid": (16, 16)} is EVA-02's
            (beside learned position embeddings). Its tables follow the grid: any image size (`any_size` too).
        mlp_norm: a LayerNorm on the MLP's hidden units before its second dense layer (EVA-02's SwiGLU).
        attention_norm: a LayerNorm on the heads' outputs before the attention's output projection
            (EVA-02 CLIP).
        normalization: "layer_norm" (the paper's) or "rms_norm" (AIMv2's RMSNorm: no centring, no bias) for
            every norm of the model (`keras_vit.layers.norms`), of epsilon `layer_norm_epsilon`.
        embed_norm: a norm `embed_norm` on the patch embeddings, before the position embeddings (AIMv2).
        post_norm: every block's norms after their branch, `x + norm(branch(x))` (timm's `*_rpn_*` ViTs), not before.
        qk_norm: a norm (of `normalization`'s kind) on each head's queries and keys in every block (ViT-22B's; timm's
            `qk_norm`, its `*_xp_*` ViTs).
        parallel_blocks: every block's attention and MLP side by side on one norm, their sum added to the tokens
            (ViT-22B's parallel layers; timm's ParallelScalingBlock: `*_xp_*`, `vit_pwee_*`): no second norm, and with
            `layer_scale` one scale a block. Not with `post_norm`.
        parallel_branches: 1 (the paper's), or the number of attentions and of MLPs side by side in every block, each
            with its own norm and layer scale (`layers.ParallelBranchesBlock`; Touvron et al. 2022's parallel blocks,
            timm's `*_18x2_*`). Not with rotary or relative positions, `post_norm`, `parallel_blocks` or `remat`.
        differential_attention: every block's attention differential (`layers.DifferentialAttention`, Ye et al. 2024;
            timm's `vit_dwee_*`, `vit_dlittle_*`, `vit_dpwee_*`), its lambda_init set by the block's index.
        relative_position_bias: BEiT's 2-D relative position bias in every block's attention, a table a block
            (`layers.relative_position_bias`) for a class token and the grid (each call's, where it takes any size).
        relative_position_mlp: None, or the width of timm's relative position MLP (`layers.relative_position_mlp`,
            `vit_relpos_*`) in every block's attention: a bias per head from each patch offset, for the grid as above.
        class_token: None (a class token exactly with classifier="token"), or True: a class token beside the "map"
            or "gap" classifier, with its position embedding, pooled by neither (Perception Encoder's).
        map_num_heads, map_mlp_dim: the attention-pool head's own head count and MLP width (None: the encoder's;
            Perception Encoder's has 8 heads, and its gigantic tower an MLP of 4 D beside the encoder's 5.83 D;
            map_mlp_dim=0: no norm and no MLP after the attention, AIMv2's head).
        map_include_prefix: the attention-pool head attends over the prefix tokens too (Perception Encoder's;
            timm's `pool_include_prefix`), not the patch tokens only.
        encoder_norm: False drops the final norm (Perception Encoder's language and spatial towers have none).
        register_position_embedding: the register tokens get learned position embeddings too, laid out after the
            class token's (timm's `vit_so150m*`, no_embed_class=False with registers).
    """
    # every argument but the input and the name: the config's fields (tests/test_vit_config.py)
    config = ViTConfig(**{k: v for k, v in locals().items() if k not in ("input_tensor", "name")})
    if input_tensor is not None and not keras.utils.is_keras_tensor(input_tensor):
        input_tensor = keras.Input(tensor=input_tensor)
    image_size, hw, channels = _input_size(config.image_size, config.input_shape, input_tensor, config.stride,
                                           config.crop_to_patches, config.resnet is not None)
    grid = grid_size(image_size, config.patch_size, config.resnet, config.crop_to_patches)
    runtime = None in hw  # takes any size: the layers that need the grid read it off the images
    if runtime:
        config.check_any_size()
    inputs, images = _inputs(config, input_tensor, (*hw, channels))
    x, posembed = _embed(config, images, grid, runtime)
    x = _encoder(config, x, posembed, grid, images if runtime else None)
    x = _pool(config, x, images, grid, runtime)
    model = ViTModel(inputs, _top(config, x), name=name)
    if config.naflex:  # the same layers read a padded patch sequence
        from keras_vit.naflex import naflex

        return naflex(model)
    return model


def _inputs(config, input_tensor, shape):
    """(the model's inputs, the images the stem reads: [-1, 1] float32, uint8 scaled on the device)."""
    if input_tensor is None:
        inputs = images = keras.Input(shape, name="images", dtype=config.input_dtype)
    else:
        inputs, images = keras.utils.get_source_inputs(input_tensor), input_tensor
    if config.input_dtype == "uint8":
        scale, offset = (1 / 127.5, -1.0) if config.input_mode == "vit" else input_scaling(config.input_mode)
        images = keras.layers.Rescaling(scale, offset=offset, name="rescale", dtype="float32")(images)
    if config.crop_to_patches:  # what every later layer sees: whole patches only
        images = L.CropToPatches(config.stride, name="crop_to_patches")(images)
    return inputs, images


def _position_embedding(config, grid, name, stride=None):
    """A position layer of the configured kind laid out on `grid` (with `stride`: resized at call time
    to the grid of the images it is given)."""
    resize = dict(stride=stride, interpolation=config.position_interpolation,
                  aspect_preserving=config.position_aspect_preserving)
    if config.position_embedding == "factorized":
        return L.AddFactorizedPositionEmbs(grid, **resize, name=name)
    args = dict(grid_size=grid, num_prefix_tokens=config.position_prefix_tokens, name=name)
    if config.position_embedding == "learned_1d":
        return L.AddPositionEmbs(**args, **resize)
    if config.position_embedding == "learned_2d":
        return L.AddPositionEmbs2D(**args)
    return L.NoPositionEmbs(**args, stride=stride)  # "none"; "relative" biases the attention instead


def _norm(config, name):
    """One of the model's own norms (not a block's): the configured kind and epsilon."""
    return L.make_norm(config.normalization, config.layer_norm_epsilon, name)


def _embed(config, images, grid, runtime):
    """(the tokens the first block reads, the input's position layer): the (hybrid's ResNet stem and)
    patch embedding, the position embeddings and the prefix tokens in their order, dropout, pre_norm."""
    x = images
    if config.resnet is not None:
        x = L.ResNetStem(tuple(config.resnet["num_layers"]), config.resnet.get("width_factor", 1),
                         config.resnet.get("numerics", "official"), name="resnet")(x)
    x = L.PatchEncoder(config.patch_size, config.hidden_size, name="embedding")(x)
    if config.embed_norm:
        x = _norm(config, "embed_norm")(x)
    posembed = _position_embedding(config, grid, "posembed_input", config.stride if runtime else None)
    add_positions = (lambda x: posembed(x, images)) if runtime else posembed
    if not config.prefix_position_embedding:  # to the patch tokens only, before the class token comes
        x = add_positions(x)
    if config.has_class_token:
        x = L.ClassToken(name="cls")(x)
    if config.distillation_token:
        x = L.PrefixTokens(1, index=1, name="dist")(x)
    registers = config.num_register_tokens and L.PrefixTokens(config.num_register_tokens, index=config.cls_tokens,
                                                              name="registers")
    if registers and config.register_position_embedding:  # before the position embeddings, which cover them
        x = registers(x)
    if config.prefix_position_embedding:
        x = add_positions(x)
    if registers and not config.register_position_embedding:  # after the position embeddings: registers get none
        x = registers(x)
    x = keras.layers.Dropout(config.dropout_rate, name="dropout")(x)
    if config.pre_norm:
        x = _norm(config, "pre_norm")(x)
    return x, posembed


def _encoder(config, x, posembed, grid, images=None):
    """The blocks (position embeddings again before each but the first, for the every_layer placements)
    and the final LayerNorm, unless fc_norm moves it after pooling. Rotary and relative blocks read the grid off
    `images` where given (a model that takes any size), else are laid out on `grid`."""
    block = L.RelativeTransformerBlock if config.position_embedding == "relative" else L.TransformerBlock
    if config.parallel_branches > 1:
        block = functools.partial(L.ParallelBranchesBlock, branches=config.parallel_branches)
    drop_path_rates = L.drop_path_rates(config.drop_path_rate, config.num_layers)
    rope = None if config.rope is None else {
        **config.rope, "num_prefix_tokens": config.num_prefix_tokens,
        **({"grid_size": None, "stride": config.stride} if images is not None else {"grid_size": grid, "stride": None})}
    relative = (config.relative_position_bias or config.relative_position_mlp is not None) and images is not None
    on_images = {**({"images": images} if (rope is not None and images is not None) or relative else {}),
                 **L.rotary_augment_inputs(config.rope, x)}  # with DINOv3's training-time draw, one a forward
    for i in range(config.num_layers):
        if i and config.position_placement == "every_layer_shared":
            x = posembed(x)
        elif i and config.position_placement == "every_layer":
            x = _position_embedding(config, grid, f"posembed_{i}")(x)
        x = block(config.num_heads, config.mlp_dim, config.dropout_rate, config.attention_dropout_rate,
                  remat=config.remat, approximate_gelu=config.approximate_gelu,
                  layer_norm_epsilon=config.layer_norm_epsilon,
                  attention_implementation=config.attention_implementation,
                  mlp_activation=config.mlp_activation, layer_scale=config.layer_scale,
                  drop_path_rate=drop_path_rates[i], rope=rope, mlp_norm=config.mlp_norm,
                  attention_norm=config.attention_norm, normalization=config.normalization,
                  relative_bias_grid=grid if config.relative_position_bias else None,
                  relative_mlp=None if config.relative_position_mlp is None else {
                      "grid_size": grid, "hidden_dim": config.relative_position_mlp,
                      "num_prefix_tokens": config.num_prefix_tokens},
                  relative_stride=config.stride if relative else None,
                  post_norm=config.post_norm, qk_norm=config.qk_norm, parallel=config.parallel_blocks,
                  differential=i if config.differential_attention else None,
                  name=f"encoderblock_{i}")(x, **on_images)
    if not config.fc_norm and config.encoder_norm:
        x = _norm(config, "encoder_norm")(x)
    return x


def _pool(config, x, images, grid, runtime):
    """What `pooling` says the encoder's tokens become (the representation: through fc_norm and
    pre-logits when set); with DeiT's two heads, their two tokens."""
    prefix = config.num_prefix_tokens
    if config.pooling is None:
        if runtime:
            return L.TokensToMap(num_prefix_tokens=prefix, stride=config.stride, name="feature_map")(x, images)
        return L.TokensToMap(grid, num_prefix_tokens=prefix, name="feature_map")(x)
    if config.pooling == "representation" and config.distillation_token:  # no fc_norm, no pre-logits
        tokens = [L.SequencePooling("token", token_index=i, name=n)(x) for i, n in ((0, "pool"), (1, "pool_dist"))]
        return tokens if config.include_top else keras.layers.Average(name="pool_average")(tokens)
    if config.pooling == "representation" and config.classifier == "map":
        mlp_dim = config.mlp_dim if config.map_mlp_dim is None else config.map_mlp_dim
        x = L.MAPHead(config.map_num_heads or config.num_heads, mlp_dim,
                      num_prefix_tokens=0 if config.map_include_prefix else prefix,
                      layer_norm_epsilon=config.layer_norm_epsilon, approximate_gelu=config.approximate_gelu,
                      mlp_activation=config.mlp_activation, normalization=config.normalization, name="map_head")(x)
    elif config.pooling == "representation":
        x = L.SequencePooling(config.classifier, num_prefix_tokens=prefix, name="pool")(x)
    else:
        x = L.SequencePooling("token" if config.pooling == "token" else "gap", num_prefix_tokens=prefix, name="pool")(x)
    if config.fc_norm:
        x = _norm(config, "fc_norm")(x)
    if config.representation_size is not None:
        x = keras.layers.Dense(config.representation_size, activation="tanh", name="pre_logits")(x)
    return x


def _top(config, x):
    """The head on the representation `x` (DeiT: the two heads' logits averaged, its inference), or
    the output named "features" without one."""
    if not config.include_top:
        return keras.layers.Activation("linear", name="features", dtype="float32")(x)
    if config.distillation_token:
        heads = (keras.layers.Dense(config.classes, kernel_initializer="zeros", name=n, dtype="float32")
                 for n in ("head", "head_dist"))
        x = keras.layers.Average(name="head_average", dtype="float32")([h(t) for h, t in zip(heads, x)])
    else:
        x = keras.layers.Dense(config.classes, kernel_initializer="zeros", name="head", dtype="float32")(x)
        if config.head == "projection":
            return keras.layers.Activation("linear", name="embeddings", dtype="float32")(x)
    if config.classifier_activation is not None:
        x = keras.layers.Activation(config.classifier_activation, name="predictions", dtype="float32")(x)
    return x
