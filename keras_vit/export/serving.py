"""The serving signature: the model behind a uint8 input, its output named by what the model returns."""

# what a model's output is called in its artefacts (`keras_vit.structure.output_kind`); a model of
# another make is taken for a classifier
CLASS_OUTPUTS = ("probabilities", "scores", "logits")


def output_name(model):
    """The name of `model`'s output in its artefacts: "probabilities", "logits", "embeddings", ...

    Args:
        model: a Keras model; one keras-vit did not build is taken for a classifier ("probabilities").
    """
    from keras_vit.structure import output_kind

    return output_kind(model) or "probabilities"


def serving_model(model, top_k=None, input_mode="vit", resize_to=None):
    """`model` behind a uint8 input, scaled first as `keras_vit.preprocess_input(x, input_mode)` does
    ("vit": x / 127.5 - 1; "imagenet", "clip": per channel) by a `Rescaling` layer (a model built
    with `input_dtype="uint8"` takes that input as it is). With `resize_to`, the input takes images
    of any height and width, resized to `resize_to` first (`keras_vit.layers.ResizeImages`:
    bicubic, antialiased when shrinking).

    Outputs a dict: the model's output under `output_name(model)` ("probabilities" of a classifier,
    "embeddings" of a projection, "features" of a backbone, ...), and with `top_k` (classifiers only)
    "top_k_scores" and "top_k_classes" (int32) beside it.

    A NaFlex model (`keras_vit.naflex`) is served on its own input instead, no images: the dict of
    "patches" (B, N, P * P * C), float32 as the model takes them (already scaled), or uint8 for a
    model built with `input_dtype="uint8"`, which scales them itself, "patch_coord" (B, N, 2) int32
    and "patch_valid" (B, N) bool, B and N any; `input_mode` and `resize_to` do not apply to it
    (a ValueError unless "vit" and None). Its outputs are those above.

    Args:
        model: the Keras model to serve (a classifier, a projection or a backbone).
        top_k: None, or the number of best classes to output beside the model's output
            (classifiers only: a ValueError otherwise).
        input_mode: the scaling the model's weights were trained with, a
            `keras_vit.preprocess_input` mode: "vit", "imagenet" or "clip".
        resize_to: None, or an int or (h, w): the size images are resized to inside, one `model`
            takes (ValueError otherwise).

    Returns:
        A functional `keras.Model` named `<model.name>_serving`, its input named "images" (a
        NaFlex model's: its three inputs, named as their keys).
    """
    import keras

    from keras_vit.layers import ResizeImages
    from keras_vit.naflex import is_naflex, naflex_inputs

    name = output_name(model)
    if top_k and name not in CLASS_OUTPUTS:
        raise ValueError(f"top_k is for a classifier; model {model.name!r} outputs {name}")
    if is_naflex(model):
        check_naflex_serving(model, input_mode, resize_to)
        inputs = naflex_inputs(model.input["patches"].shape[-1], model.input["patches"].dtype)
        return _with_outputs(model, inputs, model(inputs), top_k)
    if resize_to is None:
        inputs = x = keras.Input(model.input_shape[1:], dtype="uint8", name="images")
    else:
        size = check_resize_to(model, resize_to)
        inputs = keras.Input((None, None, model.input_shape[-1]), dtype="uint8", name="images")
        x = ResizeImages(size, name="resize")(inputs)  # float32 in [0, 255]
        if model.inputs[0].dtype == "uint8":  # rounded back, as an image file read at that size would be
            x = keras.ops.cast(keras.ops.round(keras.ops.clip(x, 0, 255)), "uint8")
    if model.inputs[0].dtype != "uint8":  # a model built with input_dtype="uint8" scales its input itself
        from keras_vit.preprocessing import input_scaling

        scale, offset = input_scaling(input_mode)
        x = keras.layers.Rescaling(scale, offset=offset, name="rescale")(x)
    return _with_outputs(model, inputs, model(x), top_k)


def _with_outputs(model, inputs, y, top_k):
    """The serving model of `inputs`: {output_name(model): y}, and the `top_k` best classes beside it."""
    import keras

    from keras_vit.layers import TopK

    outputs = {output_name(model): y}
    if top_k:
        outputs["top_k_scores"], outputs["top_k_classes"] = TopK(top_k, name="top_k")(y)
    return keras.Model(inputs, outputs, name=f"{model.name}_serving")


def check_naflex_serving(model, input_mode="vit", resize_to=None):
    """Raises ValueError when `input_mode` or `resize_to`, which act on images, are asked of the NaFlex
    model `model`, whose artefact takes its patches as they are."""
    if resize_to is not None:
        raise ValueError(f"resize_to={resize_to!r}: model {model.name!r} is a NaFlex model, whose artefact takes "
                         "patches of any number (patches, patch_coord, patch_valid), not images; resize each image "
                         "before cutting it into patches (keras_vit.data.naflex_feed)")
    if input_mode != "vit":
        raise ValueError(f"input_mode={input_mode!r}: model {model.name!r} is a NaFlex model, whose artefact takes the "
                         "patches as the model does (scaled as they are fed to it, or uint8 for a model built with "
                         "input_dtype='uint8'); no scaling is added inside")


def check_resize_to(model, resize_to):
    """`resize_to` as (h, w), one `model` takes: its own size, or for a model of any size a multiple of its
    token size; ValueError naming what was expected otherwise."""
    from keras_vit.configs import pair
    from keras_vit.structure import find_vit

    size = pair(resize_to, "resize_to")
    fixed = tuple(model.input_shape[1:3])
    if None not in fixed and size != fixed:
        raise ValueError(f"resize_to {size}: model {model.name!r} takes {fixed[0]}x{fixed[1]} images only; expected "
                         f"resize_to={fixed[0] if fixed[0] == fixed[1] else fixed} (or a model of any size)")
    stride = find_vit(model).stride
    if size[0] % stride or size[1] % stride:
        raise ValueError(f"resize_to {size}: model {model.name!r} cuts images into {stride}-pixel tokens; expected "
                         f"multiples of {stride}")
    return size
