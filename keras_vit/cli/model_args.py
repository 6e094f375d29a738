"""What `predict`, `inspect` and `export` share: their --model and --weights (the help texts, the weights
taken when none are given) and the model those name, built, with the size of the images it is fed."""

import os

from keras_vit.calls import is_naflex
from keras_vit.configs import get_variant, none_or

# `--weights` when not given: the variant's ImageNet-1k fine-tuned release, in this order of
# preference, else the variant's first release (an ImageNet-21k one: every variant has one)
DEFAULT_TAGS = ("imagenet21k+imagenet2012", "augreg-imagenet21k+imagenet2012")
MODEL_HELP = ("variant factory name, e.g. ViT_B16 or R50_ViT_B16; default: what a timm file or Hugging Face folder "
              "in --weights holds (given, it must agree with the file), else ViT_B16")
DEFAULT_WEIGHTS_HELP = (f"default: the variant's ImageNet-1k fine-tuned release ({', else '.join(DEFAULT_TAGS)}), "
                        "else its ImageNet-21k one")
WEIGHTS_HELP = ("registry tag, a path (.npz, .weights.h5, timm file, Hugging Face folder), or a .keras file: the whole "
                "model it holds (model.save, keras-vit convert; no --model then)")


def default_weights(variant):
    """The registry tag `--weights` takes for `variant` when not given (see DEFAULT_TAGS)."""
    from keras_vit.weights.registry import default_tag

    return default_tag(get_variant(variant).name, DEFAULT_TAGS)


def build(args):
    """(model, preprocess_input mode) of the command's --model / --weights (`args`): a .keras file is the
    whole model it holds (mode "vit"), a timm file or a Hugging Face folder builds what the file holds
    (with --model, the file must be that variant), anything else the variant's factory (--model,
    default ViT_B16)."""
    import keras_vit
    from keras_vit.weights.foreign import is_foreign, read

    size = getattr(args, "image_size", None)
    if size is not None and size < 1:
        raise ValueError(f"--image-size must be a positive number of pixels, got {size}")
    any_size = getattr(args, "any_size", False)
    if args.weights is not None and args.weights.endswith(".keras"):
        model = _saved_model(args.weights, args.model, None if any_size else size)
        return (keras_vit.any_size(model) if any_size else model), "vit"
    # --any-size: images of any height and width, the position embeddings laid out for the weights' own size
    # (--image-size is then the size the command checks the model at)
    shape = {"input_shape": (None, None, 3)} if any_size else {"image_size": size} if size is not None else {}
    if args.weights is not None and is_foreign(args.weights) and os.path.exists(args.weights):
        from keras_vit.convert import build_from

        file = read(args.weights)  # once, for the model and its input mode
        return build_from(file, args.model, **shape), file.arch["input_mode"]
    name = get_variant(args.model or "ViT_B16").name
    weights = none_or(default_weights(name) if args.weights is None else args.weights)
    return getattr(keras_vit, name)(weights=weights, **shape), "vit"


def _saved_model(path, variant, size):
    """The whole model of the .keras file `path`, which takes no --model and, unless the model takes
    any size, no --image-size."""
    from keras_vit.weights.keras_files import load_keras_model

    if variant is not None:
        raise ValueError(f"{path} is a whole model (a .keras file); --model is not used with it (got --model {variant})")
    model = load_keras_model(path)
    if is_naflex(model):  # takes patches: predict says what it does with --image-size
        return model
    h, w = model.input_shape[1:3]
    if size is not None and None not in (h, w):
        raise ValueError(f"--image-size {size}: the model in {path} takes {h}x{w} images only (a model takes "
                         "--image-size when it was saved for any size, input shape (None, None, 3))")
    return model


def image_size(model, size):
    """(h, w) of the images the command feeds `model`: its input's, else --image-size `size`, else the
    size its position embeddings are laid out for (a model that takes any size)."""
    from keras_vit.structure import find_vit

    h, w = model.input_shape[1:3]
    if None not in (h, w):
        return h, w
    if size is not None:
        return size, size
    return find_vit(model).image_size
