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


def serving_model(model, top_k=None, input_mode="vit"):
    """`model` behind a uint8 input, scaled first as `keras_vit.preprocess_input(x, input_mode)` does
    ("vit": x / 127.5 - 1; "imagenet", "clip": per channel) by a `Rescaling` layer (a model built
    with `input_dtype="uint8"` takes that input as it is).

    Outputs a dict: the model's output under `output_name(model)` ("probabilities" of a classifier,
    "embeddings" of a projection, "features" of a backbone, ...), and with `top_k` (classifiers only)
    "top_k_scores" and "top_k_classes" (int32) beside it.

    Args:
        model: the Keras model to serve (a classifier, a projection or a backbone).
        top_k: None, or the number of best classes to output beside the model's output
            (classifiers only: a ValueError otherwise).
        input_mode: the scaling the model's weights were trained with, a
            `keras_vit.preprocess_input` mode: "vit", "imagenet" or "clip".

    Returns:
        A functional `keras.Model` named `<model.name>_serving`, its input named "images".
    """
    import keras

    from keras_vit.layers import TopK
    from keras_vit.preprocessing import input_scaling

    name = output_name(model)
    if top_k and name not in CLASS_OUTPUTS:
        raise ValueError(f"top_k is for a classifier; model {model.name!r} outputs {name}")
    inputs = keras.Input(model.input_shape[1:], dtype="uint8", name="images")
    if model.inputs[0].dtype == "uint8":  # built with input_dtype="uint8": it scales its input itself
        x = inputs
    else:
        scale, offset = input_scaling(input_mode)
        x = keras.layers.Rescaling(scale, offset=offset, name="rescale")(inputs)
    y = model(x)
    outputs = {name: y}
    if top_k:
        outputs["top_k_scores"], outputs["top_k_classes"] = TopK(top_k, name="top_k")(y)
    return keras.Model(inputs, outputs, name=f"{model.name}_serving")
