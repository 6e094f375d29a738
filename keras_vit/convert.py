"""timm / Hugging Face weights and keras-hub presets -> the same ViT as a keras_vit model (`from_timm`,
`from_huggingface`, `from_keras_hub`) and as a `.keras` file (`keras-vit convert`)."""

import os

from keras_vit.configs import VARIANTS, find_variant, get_variant, pair, resnet_stride
from keras_vit.extras import require
from keras_vit.fileio import atomic_write, check_free_space, check_writable, weights_file_bytes
from keras_vit.layers.initial import overwritten
from keras_vit.variants import VisionTransformer
from keras_vit.weights.foreign import (crop_option, file_image_size, file_options, is_foreign, load_foreign, read,
                                      settle_layout, warn_assumed_gelu)
from keras_vit.weights.heads import CLASSIFIER, PROJECTION, default_activation
from keras_vit.weights.keras_hub import is_preset as is_keras_hub_preset
from keras_vit.weights.timm import TIMM_HEADS, name_options

_ARCH = ("patch_size", "hidden_size", "mlp_dim", "num_layers", "resnet")


def _check_variant(path, arch, variant):
    """Raises ValueError naming the file's dimensions and `variant`'s where they differ."""
    config = get_variant(variant).build_args()
    file = {**{k: arch[k] for k in _ARCH[:-1]}, "num_heads": arch.get("num_heads") or config["num_heads"]}
    mismatch = [k for k in file if config[k] != file[k]]
    if mismatch or (get_variant(variant).resnet is None) != (arch["resnet"] is None):
        found = find_variant({**{k: arch[k] for k in _ARCH}, "num_heads": file["num_heads"]})
        raise ValueError(f"{path} holds {found or 'a ViT'} ({', '.join(f'{k} {file[k]}' for k in file)}), not "
                         f"{get_variant(variant).name} ({', '.join(f'{k} {config[k]}' for k in file)}); leave out "
                         "the variant (--model) to build what the file holds")


def _head_count(path, arch, variant, num_heads):
    """The file's head count: its config's, `num_heads`, `variant`'s (`_check_variant` has matched it to
    the file), the variant whose dimensions the file has, else timm's head count for the file's width
    and layout (`keras_vit.weights.timm.TIMM_HEADS`, or TIMM_SIGLIP_HEADS for SigLIP's layout)."""
    if arch.get("num_heads") or num_heads:
        return arch.get("num_heads") or num_heads
    if variant is None:
        variant = next((v for v in VARIANTS if all(get_variant(v).build_args()[k] == arch[k] for k in _ARCH[:-1])
                        and (get_variant(v).resnet is None) == (arch["resnet"] is None)), None)
    if variant is not None:
        return get_variant(variant).num_heads
    heads = arch["timm_heads"] if "timm_heads" in arch else TIMM_HEADS.get(arch["hidden_size"])
    if heads:
        return heads
    raise ValueError(
        f"{path}: no variant has patch {arch['patch_size']}, width {arch['hidden_size']}, MLP {arch['mlp_dim']}, "
        f"depth {arch['num_layers']}, no timm ViT has width {arch['hidden_size']}, and a timm file does not record "
        "its head count: pass num_heads (--num-heads)")


def build_from(path, variant=None, num_heads=None, image_size=None, classifier_activation="auto", **overrides):
    """The ViT of a timm file, a Hugging Face folder or a keras-hub preset (`path`, or the
    `keras_vit.weights.foreign.ForeignFile` already read from it: the file is read once), with its
    weights loaded.

    Everything the file says is taken from it: dimensions, classes, numerics and the family options
    (distillation / register tokens, layer scale, pre-norm, fc_norm, MLP, attention-pool head,
    position-embedding resize rule). The head count is read from a Hugging Face config.json; a
    timm state dict does not hold it, so it comes from `variant` (e.g. "ViT_B16"), `num_heads`, the
    variant table entry whose patch, width, MLP and depth match the file, or timm's head count for
    the file's width. `image_size` builds the model at another resolution (position embeddings
    resized by the source's rule; a file whose own size is no multiple of its patch, e.g. SigLIP so400m/14 at
    384 px, builds with `crop_to_patches=True`, its source's patch convolution); `overrides` are further `build_vit`
    arguments (e.g. `include_top=False, pooling=None`, `mlp_activation="quick_gelu"` for an OpenAI CLIP file
    whose name does not say quickgelu, or `approximate_gelu=True` for a timm SigLIP 2 file whose name does
    not name its architecture: `keras_vit.weights.foreign.warn_assumed_gelu` says so in one line). With
    `input_dtype="uint8"` the model scales its uint8 input by the file's own normalisation (`input_mode`:
    DINOv2's and DeiT's ImageNet mean and deviation, CLIP's) unless `input_mode` is given.

    The model outputs by default what the source class returns (`keras_vit.weights.heads.HEADS`):
    a classifier's probabilities (`classifier_activation="auto"` is "softmax" there; None gives
    logits), a projection's embedding (CLIP's `image_embeds`, output layer "embeddings"), a
    backbone's pooled representation. A `classes` other than the file's is a new classifier (on a
    file without a head too: `classes=` builds one, zero-initialised).
    """
    file = read(path)  # once: the architecture below and the tensors loaded at the end
    path, arch = file.path, file.arch
    if variant is not None:
        _check_variant(path, arch, variant)
    heads = _head_count(path, arch, variant, num_heads)
    naflex = bool(arch.get("naflex")) and overrides.get("naflex", True)  # SigLIP 2: each image at its own grid
    if naflex and image_size is not None:
        raise ValueError(f"{path} holds a NaFlex model (each image at its own grid, its position embeddings "
                         f"resized to each): image_size={image_size!r} has no meaning there; leave it out")
    stride = arch["patch_size"] * resnet_stride(arch["resnet"] and arch["resnet"]["num_layers"])
    size = image_size or file_image_size(arch, stride)
    if size is None:
        raise ValueError(f"{path}: {arch['tokens']} position embeddings are no square grid; pass image_size")
    if image_size is not None:  # the layout of a non-square grid's embeddings is read for this grid
        arch = settle_layout(arch, tuple(v // stride for v in pair(image_size, "image_size")))
    args = dict(
        **({"pooling": arch["pooling"]} if arch.get("pooling") else {}), image_size=size, num_heads=heads, classes=arch["classes"] or 1000, classifier=arch["classifier"],
        representation_size=(arch.get("representation_size") or arch["hidden_size"]) if arch["pre_logits"] else None,
        include_top=arch["classes"] is not None or "classes" in overrides, classifier_activation=classifier_activation,
        name=variant or find_variant({**{k: arch[k] for k in _ARCH}, "num_heads": heads}) or "vit",
        **{k: arch[k] for k in _ARCH}, **file_options(arch), **({"naflex": True} if naflex else {}),
        **crop_option(file_image_size(arch, stride), stride, arch["resnet"]),
    )
    args.update(overrides)
    if "approximate_gelu" not in overrides and args.get("mlp_activation") in (None, "gelu"):
        warn_assumed_gelu(arch, path)
    if args.get("input_dtype") == "uint8":  # a uint8 input is scaled inside by the file's own normalisation
        args.setdefault("input_mode", arch["input_mode"])
    projection = arch["source_head"] == PROJECTION and args["classes"] == arch["classes"]
    if classifier_activation == "auto":
        # a keras-hub task names its own activation (None: logits)
        args["classifier_activation"] = None if projection else arch.get("classifier_activation",
                                                                          default_activation(CLASSIFIER))
    args.setdefault("head", "projection" if projection else "classifier")
    if args.get("pooling", "representation") != "representation":
        args["representation_size"] = None  # pre-logits belong to the pooled representation
    with overwritten():  # the file replaces every initial value
        model = VisionTransformer(**args)
    load_foreign(model, file)
    return model


def from_timm(name_or_file, num_heads=None, image_size=None, classifier_activation="auto", **overrides):
    """A timm ViT, DeiT, DeiT III, DINOv2, CLIP or SigLIP image tower as a keras_vit model, weights loaded.

    Args:
        name_or_file: a timm `.safetensors` / `.pth` / `.bin` file, or a timm model name with its
            pretrained tag (e.g. "vit_small_patch14_dinov2.lvd142m"), whose `model.safetensors`
            is taken from the Hugging Face hub cache (`huggingface_hub.hf_hub_download` of
            "timm/<name>": downloaded once where there is a network). The name (a file's name, or
            its hub cache folder's) also tells what a state dict does not: QuickGELU (`*_quickgelu_*`),
            a SigLIP architecture's GELU (SigLIP 2's tanh form: `keras_vit.weights.timm.TIMM_SIGLIP_GELU`)
            and resolution (so400m/14's 384 px).
        num_heads: the head count when the file's width is not one of timm's ViTs'.
        image_size: build at another resolution (position embeddings resized by timm's rule).
        classifier_activation, overrides: as `build_from`.
    """
    path = os.fspath(name_or_file)
    if not is_foreign(path) and not os.path.exists(path):
        overrides = {**name_options(path), **overrides}
        path = _hub_file(f"timm/{path}", "model.safetensors", path)
    return build_from(path, None, num_heads, image_size, classifier_activation, **overrides)


def from_huggingface(folder, image_size=None, classifier_activation="auto", **overrides):
    """A Hugging Face ViT, DeiT, DINOv2 (with registers), CLIP, SigLIP or SigLIP 2 vision model as a keras_vit
    model.

    Args:
        folder: a folder written by `save_pretrained` (config.json + model.safetensors or
            pytorch_model.bin); of a whole CLIP / SigLIP / SigLIP 2 model the vision tower is taken.
            SigLIP 2 (`Siglip2VisionModel`) is a NaFlex model (`naflex=True`: it takes the dict of
            `keras_vit.naflex.naflex`, each image at its own grid), so `image_size` is refused for it.
        image_size, classifier_activation, overrides: as `build_from`.
    """
    if not os.path.isdir(folder):
        raise ValueError(f"{folder} is not a folder; expected a Hugging Face model folder with config.json "
                         "(use from_timm for a single weights file)")
    return build_from(folder, None, None, image_size, classifier_activation, **overrides)


def from_keras_hub(preset_dir, image_size=None, classifier_activation="auto", **overrides):
    """A keras-hub preset folder (what `save_to_preset` writes) as a keras_vit model, weights loaded.

    Reads config.json, model.weights.h5 and, for a task, task.json and task.weights.h5, with h5py
    (keras-hub is not needed). Classes read: `ViTBackbone`, `ViTImageClassifier`,
    `CLIPVisionEncoder`, `SigLIPVisionEncoder` and `DINOV2Backbone` (`keras_vit.weights.keras_hub`);
    any other is refused by name. A backbone becomes a model without a head that returns the pooled
    representation: the class token for ViT, CLIP and DINOv2 (keras-hub's returns the token sequence;
    `include_top=False, pooling=None` gives the patch tokens), the attention-pooling head's output
    for SigLIP (as keras-hub's). A classifier outputs what its task's `activation` says (None:
    logits), unless `classifier_activation` is given.

    Args:
        preset_dir: the preset folder.
        image_size, classifier_activation, overrides: as `build_from`.
    """
    preset_dir = os.fspath(preset_dir)
    if not os.path.isdir(preset_dir):
        raise ValueError(f"{preset_dir} is not a folder; expected a keras-hub preset folder (config.json + "
                         "model.weights.h5, as save_to_preset writes it)")
    if not is_keras_hub_preset(preset_dir):
        raise ValueError(f"{preset_dir} is no keras-hub preset: expected a config.json whose registered_name "
                         "starts with 'keras_hub>' (as save_to_preset writes it)")
    return build_from(preset_dir, None, None, image_size, classifier_activation, **overrides)


def _hub_file(repo, filename, name):
    """`filename` of the Hugging Face hub repository `repo`, from the local cache or downloaded."""
    require("fetching a timm model by name", f"{name!r} is no file here; fetching a timm model by name")
    from huggingface_hub import hf_hub_download

    try:
        return hf_hub_download(repo, filename, local_files_only=True)  # cached: no network round trip
    except Exception:
        pass
    try:
        return hf_hub_download(repo, filename)
    except Exception as err:  # offline and not cached, unknown repository, ...
        raise ValueError(f"{name!r} is no file here and {repo}/{filename} could not be fetched from the Hugging Face "
                         f"hub ({type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}); pass the "
                         "path of the model's .safetensors file") from None


def _check_out(out):
    """`out` as a path, refused unless a `.keras` file can be written there (`check_writable`)."""
    out = os.fspath(out)
    if not out.endswith(".keras"):
        raise ValueError(f"output must be a .keras file, got {out!r}")
    check_writable(out, "the .keras file")
    return out


def save_keras(model, out):
    """`model.save(out)`, written to a temporary file beside `out`, then renamed."""
    out = _check_out(out)
    check_free_space(out, weights_file_bytes(model), out)  # a full disk refused before h5py writes
    with atomic_write(out) as tmp:
        model.save(tmp)
    return out


def convert(src, out, variant=None, num_heads=None, image_size=None):
    """Writes the ViT of a timm file / Hugging Face folder `src` (or a timm model name, see
    `from_timm`) as the `.keras` file `out`; a place `out` cannot be written is refused before anything is
    read or built (`check_writable`)."""
    src, out = os.fspath(src), _check_out(out)
    if os.path.exists(src) or is_foreign(src):
        return save_keras(build_from(src, variant, num_heads, image_size), out)
    return save_keras(from_timm(src, num_heads, image_size), out)
