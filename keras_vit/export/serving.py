"""The serving signature: the model behind a uint8 input, its output named by what the model returns."""

from keras_vit.export.inputs import served_input

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
    return serve(model, served_input(model, resize_to), top_k, input_mode)


def serve(model, served, top_k=None, input_mode="vit"):
    """`serving_model` of `model` behind the input `served` (a `keras_vit.export.inputs.ServedInput`,
    decided once by `export`), its output(s) named and the `top_k` best classes beside them."""
    name = output_name(model)
    if top_k and name not in CLASS_OUTPUTS:
        raise ValueError(f"top_k is for a classifier; model {model.name!r} outputs {name}")
    inputs, x = served.inputs(model, input_mode)
    return _with_outputs(model, inputs, model(x), top_k)


def _with_outputs(model, inputs, y, top_k):
    """The serving model of `inputs`: {output_name(model): y}, and the `top_k` best classes beside it."""
    import keras

    from keras_vit.layers import TopK

    outputs = {output_name(model): y}
    if top_k:
        outputs["top_k_scores"], outputs["top_k_classes"] = TopK(top_k, name="top_k")(y)
    return keras.Model(inputs, outputs, name=f"{model.name}_serving")
