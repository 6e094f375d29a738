"""Every ViT of the paper as one row of a table, and one thin factory per row."""

from keras_vit.model import VisionTransformer

_R50 = {"num_layers": (3, 4, 9), "width_factor": 1}
_R26 = {"num_layers": (2, 2, 2, 2), "width_factor": 1}

# name: (official file stem, patch_size, hidden_size, mlp_dim, num_heads, num_layers, resnet)
VARIANTS = {
    "ViT_Ti16": ("ViT-Ti_16", 16, 192, 768, 3, 12, None),
    "ViT_S16": ("ViT-S_16", 16, 384, 1536, 6, 12, None),
    "ViT_S32": ("ViT-S_32", 32, 384, 1536, 6, 12, None),
    "ViT_B8": ("ViT-B_8", 8, 768, 3072, 12, 12, None),
    "ViT_B16": ("ViT-B_16", 16, 768, 3072, 12, 12, None),
    "ViT_B32": ("ViT-B_32", 32, 768, 3072, 12, 12, None),
    "ViT_L16": ("ViT-L_16", 16, 1024, 4096, 16, 24, None),
    "ViT_L32": ("ViT-L_32", 32, 1024, 4096, 16, 24, None),
    "ViT_H14": ("ViT-H_14", 14, 1280, 5120, 16, 32, None),
    "R26_ViT_S32": ("R26+ViT-S_32", 1, 384, 1536, 6, 12, _R26),
    "R26_ViT_B32": ("R26+ViT-B_32", 1, 768, 3072, 12, 12, _R26),
    "R50_ViT_B16": ("R50+ViT-B_16", 1, 768, 3072, 12, 12, _R50),
    "R50_ViT_L32": ("R50+ViT-L_32", 1, 1024, 4096, 16, 24, {"num_layers": (3, 4, 6, 3), "width_factor": 1}),
}


def variant_config(variant):
    """The builder arguments of a named variant (ViT_B16, R50_ViT_B16, ...)."""
    if variant not in VARIANTS:
        raise ValueError(f"unknown variant {variant!r}; expected one of {', '.join(VARIANTS)}")
    _, patch, dim, mlp, heads, depth, resnet = VARIANTS[variant]
    return dict(patch_size=patch, hidden_size=dim, mlp_dim=mlp, num_heads=heads, num_layers=depth,
                resnet=None if resnet is None else dict(resnet))


def find_variant(config):
    """The variant name whose architecture equals `config` (a dict of builder arguments), or None."""
    keys = ("patch_size", "hidden_size", "mlp_dim", "num_heads", "num_layers")
    for name in VARIANTS:
        ref = variant_config(name)
        same_resnet = (ref["resnet"] is None) == (config.get("resnet") is None) and (
            ref["resnet"] is None or tuple(ref["resnet"]["num_layers"]) == tuple(config["resnet"]["num_layers"])
        )
        if same_resnet and all(ref[k] == config.get(k) for k in keys):
            return name
    return None


_DOC = """Builds {official} ({arch}), the `{name}` variant of the paper's Table 1.

    Args:
        include_top: with the classification head; without it the model returns the pooled
            representation (B, {dim}).
        weights: None (random init), a registry tag such as {tags} (see
            `keras_vit.list_weights("{name}")`), or a path to an official `.npz` or Keras
            `.weights.h5` file. Position embeddings are resized to `image_size` when the file's
            grid differs; a `classes` other than the file's gives a new zero-initialised head.
        input_tensor: optional Keras tensor (NHWC, in [-1, 1]) to build on.
        classes: head width; None takes the weights' classes (1000 without weights).
        classifier_activation: "softmax" by default; None gives logits.
        name: model name; defaults to "{name}".
        image_size: int or (h, w); None takes the weights' resolution (224 without weights).
        classifier: "token" or "gap".
        dropout_rate, attention_dropout_rate: dropout for fine-tuning or pre-training.
        representation_size: pre-logits width; "auto" keeps the file's pre-logits when the model
            keeps its head and classes, None drops them.
        remat: recompute each encoder block in the backward pass instead of keeping its
            activations (gradient checkpointing): about 5x more images per step in the same
            memory for 8-26% more time (benchmarks/README.md).
    Returns:
        A `keras.Model`.
    """


def _factory(variant):
    official, patch, dim, _, heads, depth, resnet = VARIANTS[variant]

    def build(include_top=True, weights=None, input_tensor=None, classes=None,
              classifier_activation="softmax", name=None, image_size=None, classifier="token",
              dropout_rate=0.0, attention_dropout_rate=0.0, representation_size="auto", remat=False):
        from keras_vit.weights import resolve_build_args

        args = resolve_build_args(variant, weights, image_size, classes, include_top, representation_size)
        return VisionTransformer(
            **variant_config(variant), **args, classifier=classifier, dropout_rate=dropout_rate,
            attention_dropout_rate=attention_dropout_rate, include_top=include_top, weights=weights,
            input_tensor=input_tensor, classifier_activation=classifier_activation, name=name or variant,
            remat=remat,
        )

    arch = f"D={dim}, {heads} heads, {depth} layers, patch {patch}" + (
        f", ResNet stem {tuple(resnet['num_layers'])}" if resnet else "")
    build.__name__ = build.__qualname__ = variant
    build.__doc__ = _DOC.format(official=official, arch=arch, name=variant, dim=dim,
                                tags='"imagenet21k" or "imagenet21k+imagenet2012"')
    return build


ViT_Ti16 = _factory("ViT_Ti16")
ViT_S16 = _factory("ViT_S16")
ViT_S32 = _factory("ViT_S32")
ViT_B8 = _factory("ViT_B8")
ViT_B16 = _factory("ViT_B16")
ViT_B32 = _factory("ViT_B32")
ViT_L16 = _factory("ViT_L16")
ViT_L32 = _factory("ViT_L32")
ViT_H14 = _factory("ViT_H14")
R26_ViT_S32 = _factory("R26_ViT_S32")
R26_ViT_B32 = _factory("R26_ViT_B32")
R50_ViT_B16 = _factory("R50_ViT_B16")
R50_ViT_L32 = _factory("R50_ViT_L32")
