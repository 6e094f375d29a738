"""Running an artefact in its own runtime (TensorFlow, onnxruntime, LiteRT), and comparing it with Keras."""

import numpy as np

from keras_vit.export.serving import CLASS_OUTPUTS, output_name, serving_model


def run(path, format, images):
    """Runs the artefact at `path` in its own runtime (TensorFlow's loader, onnxruntime, the LiteRT
    interpreter) on uint8 `images`; returns {output name: numpy array}.

    Args:
        path: the artefact, as `export` returns it (a SavedModel folder, a .onnx or a .tflite file).
        format: its format, one of FORMATS.
        images: uint8 images (N, h, w, 3), N a batch size the artefact takes (h and w any the
            artefact takes: its own size, or any multiple of the patch for a model of any size).

    Raises:
        ValueError: `images` not uint8 (N, h, w, 3). TensorFlow's loader would cast a float numpy
            array to uint8 silently (0.6 becomes 0); the other runtimes refuse it in their own words.
    """
    images = np.asarray(images)
    if images.dtype != np.uint8 or images.ndim != 4 or images.shape[-1] != 3:
        raise ValueError(f"an artefact takes uint8 images (N, h, w, 3) with values 0-255, got {images.dtype} of shape "
                         f"{images.shape}; e.g. np.clip(x * 255, 0, 255).round().astype(np.uint8) for floats in [0, 1]")
    if format == "tf_saved_model":
        import tensorflow as tf

        loaded = tf.saved_model.load(path)  # kept alive while its outputs are read
        outputs = loaded.serve(images)
        if not isinstance(outputs, dict):
            outputs = {"probabilities": outputs}
        return {k: v.numpy() for k, v in outputs.items()}
    if format == "onnx":
        import onnxruntime as ort

        session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
        names = [o.name for o in session.get_outputs()]
        return dict(zip(names, session.run(None, {session.get_inputs()[0].name: images})))
    from ai_edge_litert.interpreter import Interpreter

    runner = Interpreter(model_path=path).get_signature_runner()
    return dict(runner(images=images))


def compare(model, path, format, images, input_mode="vit", resize_to=None):
    """The artefact against Keras on uint8 `images` (scaled for Keras by `preprocess_input(images,
    input_mode)`, or as they are for a model built with `input_dtype="uint8"`): (max abs difference
    of the outputs, agreement):
    for a classifier the fraction of images with the same top-1 class, for an embedding or features
    the smallest cosine similarity of an image's two outputs.

    Args:
        model: the Keras model that was exported.
        path: the artefact, as `export` returns it.
        format: its format, one of FORMATS.
        images: uint8 images (N, h, w, 3).
        input_mode: the `keras_vit.preprocess_input` mode the artefact was exported with.
        resize_to: the `resize_to` the artefact was exported with (Keras resizes by the same layer).

    Returns:
        A tuple (max abs difference, agreement) of two floats.
    """
    import keras

    from keras_vit.preprocessing import model_input

    name = output_name(model)
    if resize_to is None:
        expected = keras.ops.convert_to_numpy(model(model_input(model, images, input_mode)))
    else:
        expected = keras.ops.convert_to_numpy(serving_model(model, None, input_mode, resize_to)(images)[name])
    got = run(path, format, images)[name].reshape(expected.shape)
    if name in CLASS_OUTPUTS:
        agreement = float(np.mean(got.argmax(-1) == expected.argmax(-1)))
    else:
        a, b = (v.reshape(len(v), -1).astype(np.float64) for v in (got, expected))
        agreement = float(np.min(np.sum(a * b, -1) / np.linalg.norm(a, axis=-1) / np.linalg.norm(b, axis=-1)))
    return float(np.abs(got - expected).max()), agreement
