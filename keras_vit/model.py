"""The Vision Transformer builder (paper section 3.1, Figure 1)."""

import keras

from keras_vit import layers as L
from keras_vit.configs import pair, resnet_stride

CLASSIFIERS = ("token", "gap")


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
    approximate_gelu=True,
    layer_norm_epsilon=1e-6,
):
    """Builds a Vision Transformer as a functional `keras.Model` with freshly initialised weights
    (`keras_vit.VisionTransformer` is this plus `weights=`).

    The model takes NHWC images already scaled to [-1, 1] (see `keras_vit.preprocess_input`).

    Args:
        image_size: int or (h, w); must be divisible by the patch size (times the ResNet stride).
        patch_size: P, the side of the square patches.
        hidden_size, mlp_dim, num_heads, num_layers: D, MLP width, heads and depth of the encoder.
        classes: width of the classification head.
        classifier: "token" (the [class] token's output, paper Eq. 4) or "gap" (mean of all tokens,
            no class token).
        representation_size: None, or the width of the pre-logits Dense + tanh layer.
        resnet: None, or a dict `{"num_layers": (3, 4, 9), "width_factor": 1}` for a hybrid.
        dropout_rate, attention_dropout_rate: as the paper's Appendix B.1.
        include_top: with the head; without it the model returns the pooled representation
            y = LN(z_L^0) (or its mean for "gap"), passed through pre-logits when those are set.
        input_tensor: optional Keras tensor to build the model on.
        classifier_activation: activation of the head; None gives logits.
        name: the model's name.
        remat: rematerialise each encoder block in training (gradient checkpointing): the backward
            pass recomputes a block's activations instead of keeping them, so a training step holds
            the residual stream plus one block's activations, for about a third more compute.
            The measured memory and time per backend are in benchmarks/README.md.
        approximate_gelu: the MLP's GELU: the tanh approximation (official checkpoints) or, with
            False, the exact erf form (timm and Hugging Face checkpoints).
        layer_norm_epsilon: epsilon of every LayerNorm: 1e-6 (official, timm) or 1e-12 (Hugging Face).
    """
    if classifier not in CLASSIFIERS:
        raise ValueError(f"unknown classifier {classifier!r}; expected one of {CLASSIFIERS}")
    for key, value in (("patch_size", patch_size), ("hidden_size", hidden_size), ("mlp_dim", mlp_dim),
                       ("num_heads", num_heads), ("num_layers", num_layers), ("classes", classes)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{key} must be a positive int, got {value!r}")
    if hidden_size % num_heads:
        raise ValueError(f"hidden_size {hidden_size} is not divisible by num_heads {num_heads}")
    if resnet is not None:
        unknown = set(resnet) - {"num_layers", "width_factor"}
        if unknown or "num_layers" not in resnet:
            raise ValueError(f"resnet must be None or {{'num_layers': (...), 'width_factor': int}}, got {resnet!r}")
    image_size = pair(image_size, "image_size")
    grid = grid_size(image_size, patch_size, resnet)

    if input_tensor is None:
        inputs = keras.Input((*image_size, 3), name="images")
        x = inputs
    else:
        if not keras.utils.is_keras_tensor(input_tensor):
            input_tensor = keras.Input(tensor=input_tensor)
        if tuple(input_tensor.shape[1:3]) != image_size:
            raise ValueError(f"input_tensor has spatial shape {tuple(input_tensor.shape[1:3])}, expected {image_size}")
        inputs, x = input_tensor, input_tensor

    if resnet is not None:
        x = L.ResNetStem(tuple(resnet["num_layers"]), resnet.get("width_factor", 1), name="resnet")(x)
    x = L.PatchEncoder(patch_size, hidden_size, name="embedding")(x)
    if classifier == "token":
        x = L.ClassToken(name="cls")(x)
    x = L.AddPositionEmbs(grid, num_prefix_tokens=int(classifier == "token"), name="posembed_input")(x)
    x = keras.layers.Dropout(dropout_rate, name="dropout")(x)
    for i in range(num_layers):
        x = L.TransformerBlock(
            num_heads, mlp_dim, dropout_rate, attention_dropout_rate, remat=remat, approximate_gelu=approximate_gelu,
            layer_norm_epsilon=layer_norm_epsilon, name=f"encoderblock_{i}"
        )(x)
    x = keras.layers.LayerNormalization(epsilon=layer_norm_epsilon, name="encoder_norm")(x)
    x = L.SequencePooling(classifier, name="pool")(x)
    if representation_size is not None:
        x = keras.layers.Dense(representation_size, activation="tanh", name="pre_logits")(x)
    if include_top:
        x = keras.layers.Dense(classes, kernel_initializer="zeros", name="head", dtype="float32")(x)
        if classifier_activation is not None:
            x = keras.layers.Activation(classifier_activation, name="predictions", dtype="float32")(x)
    else:
        x = keras.layers.Activation("linear", name="features", dtype="float32")(x)

    if input_tensor is not None:
        inputs = keras.utils.get_source_inputs(input_tensor)
    return keras.Model(inputs, x, name=name)
