"""timm / Hugging Face weights -> a `.keras` file of the same ViT (`keras-vit convert`)."""

import os

from keras_vit.configs import VARIANTS, find_variant, get_variant, resnet_stride
from keras_vit.fileio import atomic_write
from keras_vit.variants import VisionTransformer
from keras_vit.weights import load_weights
from keras_vit.weights.foreign import describe

_ARCH = ("patch_size", "hidden_size", "mlp_dim", "num_layers", "resnet")


def build_from(path, variant=None, num_heads=None, image_size=None, classifier_activation="softmax"):
    """The ViT of a timm file or a Hugging Face folder, with its weights loaded.

    The head count is read from a Hugging Face config.json; a timm state dict does not hold it, so
    it comes from `variant` (e.g. "ViT_B16"), `num_heads`, or the variant table entry whose
    patch, width, MLP and depth match the file.
    """
    arch = describe(path)
    heads = arch.get("num_heads") or num_heads
    name = variant
    if heads is None:
        if variant is None:
            variant = next((v for v in VARIANTS if all(get_variant(v).build_args()[k] == arch[k] for k in _ARCH[:-1])
                            and (get_variant(v).resnet is None) == (arch["resnet"] is None)), None)
            if variant is None:
                raise ValueError(
                    f"{path}: no variant has patch {arch['patch_size']}, width {arch['hidden_size']}, MLP "
                    f"{arch['mlp_dim']}, depth {arch['num_layers']}, and a timm file does not record its head "
                    "count: pass num_heads (--num-heads)")
        config = get_variant(variant).build_args()
        mismatch = [k for k in _ARCH[:-1] if config[k] != arch[k]]
        if mismatch:
            raise ValueError(f"{path} does not fit {variant}: " + ", ".join(
                f"{k} {arch[k]} in the file, {config[k]} in {variant}" for k in mismatch))
        heads = config["num_heads"]
    size = image_size or arch.get("image_size")
    if size is None:
        prefix = int(arch["classifier"] == "token")
        side = int(round((arch["tokens"] - prefix) ** 0.5))
        if side * side != arch["tokens"] - prefix:
            raise ValueError(f"{path}: {arch['tokens']} position embeddings are no square grid; pass image_size")
        stride = arch["patch_size"] * resnet_stride(arch["resnet"] and arch["resnet"]["num_layers"])
        size = side * stride
    model = VisionTransformer(
        image_size=size, num_heads=heads, classes=arch["classes"] or 1000, classifier=arch["classifier"],
        representation_size=arch["hidden_size"] if arch["pre_logits"] else None,
        include_top=arch["classes"] is not None, classifier_activation=classifier_activation,
        approximate_gelu=arch["approximate_gelu"], layer_norm_epsilon=arch["layer_norm_epsilon"],
        name=name or find_variant({**{k: arch[k] for k in _ARCH}, "num_heads": heads}) or "vit",
        **{k: arch[k] for k in _ARCH},
    )
    load_weights(model, path)
    return model


def save_keras(model, out):
    """`model.save(out)`, written to a temporary file beside `out`, then renamed."""
    out = os.fspath(out)
    if not out.endswith(".keras"):
        raise ValueError(f"output must be a .keras file, got {out!r}")
    with atomic_write(out) as tmp:
        model.save(tmp)
    return out


def convert(src, out, variant=None, num_heads=None, image_size=None):
    """Writes the ViT of a timm file / Hugging Face folder `src` as the `.keras` file `out`."""
    return save_keras(build_from(src, variant, num_heads, image_size), out)
