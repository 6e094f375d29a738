"""The models users call: `VisionTransformer` (any configuration) and one thin factory per row of
the variant table (keras_vit/configs.py), each loading weights through the weights package."""

import inspect
import math
import os

from keras_vit.configs import VARIANTS, get_variant, pair, resnet_stride
from keras_vit.layers.initial import overwritten
from keras_vit.model import build_vit
from keras_vit.weights import KERAS_SUFFIXES, fetch, get_weights, is_path, list_weights, load_weights, peek_npz
from keras_vit.weights.foreign import (ForeignFile, crop_option, describe, file_image_size, file_options, is_foreign,
                                      read, warn_assumed_gelu)
from keras_vit.weights.heads import CLASSIFIER, PROJECTION, default_activation


def VisionTransformer(*args, weights=None, **kwargs):
    """Builds a Vision Transformer as a functional `keras.Model`, then loads `weights`.

    Takes the arguments of `keras_vit.model.build_vit` (architecture, head, dropout, remat) plus
    `weights`: None, a path (official `.npz`, or a Keras `.weights.h5` / `.keras`) or a registry tag
    of the variant this configuration equals (see `keras_vit.list_weights()`). A model of runtime
    resolution (`image_size=None`) keeps the position-embedding grid of an `.npz` in `weights`.
    """
    bound = inspect.signature(build_vit).bind(*args, **kwargs)
    bound.apply_defaults()
    build = bound.arguments
    if build["image_size"] is None and build["input_tensor"] is None and isinstance(weights, (str, os.PathLike)) \
            and os.fspath(weights).endswith(".npz") and os.path.exists(weights):
        resnet = build["resnet"]
        stride = build["patch_size"] * resnet_stride(resnet and resnet["num_layers"])
        build["image_size"] = _npz_image_size(peek_npz(os.fspath(weights)), stride) or 224
        build["input_shape"] = build["input_shape"] or (None, None, 3)
    if weights is None:
        return build_vit(**build)
    with overwritten():  # the weights replace every initial value
        model = build_vit(**build)
    load_weights(model, weights)
    return model


VisionTransformer.__doc__ += "\n" + build_vit.__doc__.split("\n", 2)[2]


def weights_file(variant, weights, image_size=None):
    """`weights` as a path: a registry tag of `variant` is downloaded (once) and its file named."""
    if weights is None or isinstance(weights, ForeignFile) or is_path(os.fspath(weights)):
        return weights
    record = get_weights(variant, weights, image_size)
    return fetch(record.url, record.filename)


OFFICIAL_NUMERICS = dict(approximate_gelu=True, layer_norm_epsilon=1e-6)


def _foreign_facts(variant, path, image_size=None):
    """(image_size, classes, has_pre_logits, classifier, options) of a timm file / HF folder; options are the
    numerics and family options it dictates (`keras_vit.weights.foreign.file_options`)."""
    grid = None if image_size is None else tuple(v // variant.stride for v in pair(image_size, "image_size"))
    arch = describe(path, grid)
    warn_assumed_gelu(arch, getattr(path, "path", path))
    return file_image_size(arch, variant.stride), arch["classes"], arch["pre_logits"], arch["classifier"], \
        {**file_options(arch), "source_head": arch["source_head"],
         "representation_size": arch.get("representation_size")}


def _file_facts(variant, weights, image_size):
    """(image_size, classes, has_pre_logits, classifier, numerics) of the weights (None where they do not say)."""
    if weights is None:
        return None, None, False, None, OFFICIAL_NUMERICS
    if isinstance(weights, ForeignFile):
        return _foreign_facts(variant, weights, image_size)
    if not isinstance(weights, (str, os.PathLike)):
        raise TypeError(f"weights must be None, a registry tag or a path, got {type(weights).__name__}")
    # a foreign file that exists came here read (the factory's `read`); this is an official file or tag
    return (*_official_facts(variant, os.fspath(weights), image_size), None, OFFICIAL_NUMERICS)


def _official_facts(variant, weights, image_size):
    """(image_size, classes, has_pre_logits) of an official file or registry tag (None where they do not say)."""
    if not is_path(weights):
        record = get_weights(variant.name, weights, image_size)
        return record.image_size, record.classes, record.pre_logits
    if weights.endswith(KERAS_SUFFIXES) or not (weights.endswith(".npz") or os.path.exists(weights)):
        return None, None, False
    peek = peek_npz(weights)
    return _npz_image_size(peek, variant.stride), peek[0], peek[1]


def _npz_image_size(peek, stride):
    """The square resolution of an official `.npz`'s position-embedding grid, from `peek_npz`'s answer
    (None if not square)."""
    _, _, tokens, has_cls = peek
    side = math.isqrt(tokens - int(has_cls)) if tokens else 0
    return side * stride if side and side * side == tokens - int(has_cls) else None


def resolve_build_args(variant, weights, image_size, classes, include_top, representation_size="auto",
                       classifier=None):
    """Fills `image_size`, `classes`, `representation_size` and `classifier` from the weights when
    not given, and the numerics (`approximate_gelu`, `layer_norm_epsilon`), family options
    (layer scale, registers, ...) and recorded `drop_path_rate` of timm / Hugging Face files; `head`
    is "projection" for a file's projection kept as it is (`keras_vit.weights.heads`), else "classifier"."""
    config = get_variant(variant)
    if classes is not None and (isinstance(classes, bool) or not isinstance(classes, int) or classes < 1):
        raise ValueError(f"classes must be a positive int (or None for the weights' classes), got {classes!r}")
    file_size, file_classes, file_pre, file_classifier, numerics = _file_facts(config, weights, image_size)
    numerics = dict(numerics)
    file_head = numerics.pop("source_head", None)
    file_width = numerics.pop("representation_size", None)  # a keras-hub task's pre-logits width (else D)
    # None means "take the weights' value"; any other value (0 included) goes to the builder's checks.
    image_size = image_size if image_size is not None else file_size or 224
    if isinstance(weights, ForeignFile):  # a file of a size that is no multiple of its patch: its source's crop
        numerics.update(crop_option(file_size, config.stride, config.resnet))
    classes = classes if classes is not None else file_classes or 1000
    if representation_size == "auto":
        keep = include_top and file_pre and classes == file_classes
        representation_size = (file_width or config.hidden_size) if keep else None
    head = "projection" if file_head == PROJECTION and classes == file_classes else "classifier"
    return dict(image_size=image_size, classes=classes, representation_size=representation_size,
                classifier=classifier or file_classifier or "token", head=head, **numerics)


_DOC = """Builds {checkpoint} ({arch}), the `{name}` variant of the paper.

    Args:
        include_top: with the classification head; without it the model returns what `pooling`
            says, by default the pooled representation (B, {dim}).
        weights: None (random init), {tags}, or a path to an official `.npz`, a Keras
            `.weights.h5`, a timm `.safetensors` / `.pth` / `.bin` file or a Hugging Face
            folder (config.json + model.safetensors) of a ViT, DeiT, DeiT III, DINOv2, CLIP or
            SigLIP image tower of this size: the GELU, LayerNorm epsilon and family options
            (distillation / register tokens, layer scale, pre-norm, attention-pool head, ...)
            follow the file. Position embeddings are resized to `image_size` when the file's
            grid differs; a `classes` other than the file's gives a new zero-initialised head.
        input_tensor: optional Keras tensor (NHWC, in [-1, 1]) to build on.
        classes: head width; None takes the weights' classes (1000 without weights).
        classifier_activation: "auto" (default): "softmax" for a classifier, none for a file's
            projection (a CLIP tower's, kept when `classes` is the file's: the output is the
            embedding, see `keras_vit.weights.heads`); None gives logits.
        name: model name; defaults to "{name}".
        image_size: int or (h, w); None takes the weights' resolution (224 without weights).
        classifier: "token" or "gap"; None takes the weights' ("token" without weights).
        dropout_rate, attention_dropout_rate: dropout for fine-tuning or pre-training.
        drop_path_rate: stochastic depth for training, in [0, 1): each block's residual branches
            dropped per sample, the rate rising linearly from 0 (first block) to this (last block),
            timm's rule; None takes the weights' (a Hugging Face DINOv2 config's), else 0.
        representation_size: pre-logits width; "auto" keeps the file's pre-logits when the model
            keeps its head and classes, None drops them.
        remat: recompute each encoder block in the backward pass instead of keeping its
            activations (gradient checkpointing): several times more images per step in the
            same memory for more time (measured in benchmarks/README.md).
        input_shape: (H, W, 3) as keras.applications, agreeing with `image_size`; None for H and
            W builds a model that takes any size divisible by the patch (times the ResNet stride),
            resizing the position embeddings of `image_size` (the weights' grid) at call time.
        pooling: with include_top=False: "representation" (default: what the head reads), None
            (the (B, H/P, W/P, {dim}) feature map after the final LayerNorm), "token" (the class
            token) or "avg" (the mean of the patch tokens).
        patch_size: None for {patch}; another size loads the weights through FlexiViT's
            pseudo-inverse resize of the patch embedding (`keras_vit.resize_patch_embedding`),
            position embeddings resized to the new grid.
        input_dtype: "float32" ([-1, 1] images) or "uint8" ([0, 255] images, scaled to [-1, 1] by
            the model's first layer on the device: a quarter of the bytes sent to it).
        distillation_token: DeiT's distillation token and second head, trained on a teacher by
            `keras_vit.recipes.distill.Distiller`; None takes the weights' (a DeiT distilled file's),
            else False.
    Returns:
        A `keras.Model`.
    """


def _tags(name):
    tags = sorted({r.tag: None for r in list_weights(name)})
    listed = " or ".join(f'"{t}"' for t in tags)
    return f"a registry tag ({listed}; see `keras_vit.list_weights(\"{name}\")`)" if tags else "no registry tag"


def _factory(variant):
    config = VARIANTS[variant]  # for the docstring; a call reads the table again (one source for every caller)

    def build(include_top=True, weights=None, input_tensor=None, classes=None,
              classifier_activation="auto", name=None, image_size=None, classifier=None,
              dropout_rate=0.0, attention_dropout_rate=0.0, representation_size="auto", remat=False,
              input_shape=None, pooling="representation", patch_size=None, input_dtype="float32",
              drop_path_rate=None, distillation_token=None):
        if image_size is None and input_shape is not None and len(input_shape) == 3 and None not in input_shape[:2]:
            image_size = tuple(input_shape[:2])
        if isinstance(weights, (str, os.PathLike)) and is_foreign(os.fspath(weights)) and os.path.exists(weights):
            weights = read(weights)  # once: its facts shape the model, then its tensors load into it
        args = resolve_build_args(variant, weights, image_size, classes, include_top, representation_size, classifier)
        if drop_path_rate is not None:
            args["drop_path_rate"] = drop_path_rate  # else the file's, if it names one
        if distillation_token is not None:
            args["distillation_token"] = distillation_token  # else the file's (a DeiT distilled one's)
        arch = get_variant(variant).build_args()
        if patch_size is not None and patch_size != arch["patch_size"]:
            arch["patch_size"] = patch_size  # the builder checks it; a registry tag names the file to resize
            weights = weights_file(variant, weights, image_size)
        if classifier_activation == "auto":
            classifier_activation = None if args["head"] == "projection" else default_activation(CLASSIFIER)
        return VisionTransformer(
            **arch, **args, dropout_rate=dropout_rate,
            attention_dropout_rate=attention_dropout_rate, include_top=include_top, weights=weights,
            input_tensor=input_tensor, classifier_activation=classifier_activation, name=name or variant,
            remat=remat, input_shape=input_shape, pooling=pooling, input_dtype=input_dtype,
        )

    build.__name__ = build.__qualname__ = variant
    build.__doc__ = _DOC.format(checkpoint=config.checkpoint, arch=config.describe(), name=variant,
                                dim=config.hidden_size, tags=_tags(variant), patch=config.patch_size)
    return build


# One factory per row of the table: ViT_Ti16, ViT_S16, ..., R50_ViT_L32.
for _name in VARIANTS:
    globals()[_name] = _factory(_name)
del _name

__all__ = ["VisionTransformer", *VARIANTS]
