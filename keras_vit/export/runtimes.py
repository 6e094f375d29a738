"""Running an artefact in its own runtime (TensorFlow, onnxruntime, LiteRT), and comparing it with Keras."""

import collections
import os

import numpy as np

from keras_vit.export.formats import FORMATS
from keras_vit.export.serving import CLASS_OUTPUTS, output_name, serving_model
from keras_vit.extras import require


def run(path, format, images):
    """Runs the artefact at `path` in its own runtime (TensorFlow's loader, onnxruntime, the LiteRT
    interpreter) on uint8 `images`, or on the NaFlex batch an artefact of a NaFlex model takes;
    returns {output name: numpy array}. The artefact is loaded once while its files are unchanged: the two
    run last stay loaded, so that `run` in a loop over batches loads it once.

    Args:
        path: the artefact, as `export` returns it (a SavedModel folder, a .onnx or a .tflite file).
        format: its format, one of FORMATS.
        images: uint8 images (N, h, w, 3), N a batch size the artefact takes (h and w any the
            artefact takes: its own size, or any multiple of the patch for a model of any size);
            or, for an artefact of a NaFlex model, its dict of numpy arrays: "patches" (B, L, P * P * C)
            of the dtype it takes (float32, or uint8), "patch_coord" (B, L, 2) int32 and
            "patch_valid" (B, L) bool, B and L any (`keras_vit.naflex.patchify_images` cuts them).

    Raises:
        keras_vit.extras.MissingPackageError: the format's runtime is not installed (tensorflow,
            onnxruntime, ai-edge-litert), before anything runs.
        ValueError: `images` not uint8 (N, h, w, 3), or a NaFlex batch that is not one (its keys,
            shapes, dtypes, coordinates that do not tile each image's grid) or of patches of another
            dtype or width than the artefact's. TensorFlow's loader would cast a float numpy array
            to uint8 silently (0.6 becomes 0); the other runtimes refuse it in their own words.
    """
    if format in FORMATS:
        require(f"running {format} artefacts")
    if isinstance(images, dict):
        return _run_naflex(path, format, images)
    images = np.asarray(images)
    if images.dtype != np.uint8 or images.ndim != 4 or images.shape[-1] != 3:
        raise ValueError(f"an artefact takes uint8 images (N, h, w, 3) with values 0-255, got {images.dtype} of shape "
                         f"{images.shape}; e.g. np.clip(x * 255, 0, 255).round().astype(np.uint8) for floats in [0, 1]")
    loaded = _loaded(path, format)
    if format == "tf_saved_model":
        outputs = loaded.serve(images)
        if not isinstance(outputs, dict):
            outputs = {"probabilities": outputs}
        return {k: v.numpy() for k, v in outputs.items()}
    if format == "onnx":
        names = [o.name for o in loaded.get_outputs()]
        return dict(zip(names, loaded.run(None, {loaded.get_inputs()[0].name: images})))
    return dict(loaded.get_signature_runner()(images=images))


_LOADED = collections.OrderedDict()  # (format, path, files' stats) -> the loaded artefact, the latest last
_KEEP_LOADED = 2


def _loaded(path, format):
    """The artefact at `path` loaded in its runtime (a SavedModel, an onnxruntime session, a LiteRT interpreter):
    the same object while its files are unchanged, so that `run` in a loop loads it once. The two artefacts run
    last are kept; a file rewritten since (another size, mtime or inode) is loaded again."""
    files = ([os.path.join(d, f) for d, _, names in sorted(os.walk(path)) for f in sorted(names)]
             if os.path.isdir(path) else [path])
    key = (format, os.path.realpath(path),
           tuple((f, s.st_size, s.st_mtime_ns, s.st_ino) for f in files for s in [os.stat(f)]))
    if key in _LOADED:
        _LOADED.move_to_end(key)
        return _LOADED[key]
    if format == "tf_saved_model":
        import tensorflow as tf

        loaded = tf.saved_model.load(path)
    elif format == "onnx":
        import onnxruntime as ort

        loaded = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    else:
        from ai_edge_litert.interpreter import Interpreter

        loaded = Interpreter(model_path=path)
    _LOADED[key] = loaded
    while len(_LOADED) > _KEEP_LOADED:
        _LOADED.popitem(last=False)
    return loaded


def _run_naflex(path, format, batch):
    """`run` on the NaFlex `batch` (a dict of numpy arrays): checked as a NaFlex batch, then against the
    artefact's patches (width and dtype), before it runs."""
    from keras_vit.calls import NAFLEX_KEYS, check_naflex_batch

    if format not in ("tf_saved_model", "onnx"):
        raise ValueError(f"a NaFlex batch (a dict) is for an artefact of a NaFlex model, ONNX or a SavedModel; "
                         f"{format} takes uint8 images (N, h, w, 3)")
    batch = {k: np.asarray(v) for k, v in batch.items()}
    patches = batch.get("patches", np.zeros(0))
    # keys, shapes, dtypes and coordinates before the artefact is loaded; its patches' width after
    check_naflex_batch(batch, patches.shape[-1] if patches.ndim == 3 else "P * P * C", what="the artefact")
    specs, call = _naflex_runner(path, format)
    if set(specs) != set(NAFLEX_KEYS):
        raise ValueError(f"the artefact at {path} takes {sorted(specs)}, not a NaFlex batch (a dict of "
                         f"{', '.join(NAFLEX_KEYS)}): it is no NaFlex model's")
    shape, dtype = specs["patches"]
    if patches.shape[-1] != shape[-1]:
        raise ValueError(f"the artefact takes patches of shape (batch, tokens, {shape[-1]}), got {patches.shape}: "
                         f"{shape[-1]} values are one patch of its model's patch size, flattened")
    if patches.dtype != dtype:
        raise ValueError(f"the artefact takes {dtype} patches, got {patches.dtype}"
                         + ("; a model built with input_dtype='uint8' takes them unscaled, 0-255" * (dtype == "uint8")))
    batch["patch_coord"] = batch["patch_coord"].astype(np.int32)
    outputs = call(batch)
    if not isinstance(outputs, dict):
        outputs = {"probabilities": outputs}
    return {k: np.asarray(v) for k, v in outputs.items()}


def _naflex_runner(path, format):
    """({input name: (shape, dtype name)}, a function of the input dict to the outputs) of the artefact."""
    loaded = _loaded(path, format)
    if format == "tf_saved_model":
        return _saved_model_inputs(loaded), lambda inputs: loaded.serve(inputs)
    session = loaded
    specs = {i.name: (i.shape, {"tensor(float)": "float32"}.get(i.type, i.type[len("tensor("):-1]))
             for i in session.get_inputs()}
    names = [o.name for o in session.get_outputs()]
    return specs, lambda inputs: dict(zip(names, session.run(None, inputs)))


def _saved_model_inputs(loaded):
    """{input name: (shape, dtype name)} of a loaded SavedModel's `serve` endpoint."""
    args, kwargs = loaded.serve.concrete_functions[0].structured_input_signature
    specs = {}
    for spec in [*args, *kwargs.values()]:
        for name, one in (spec.items() if isinstance(spec, dict) else [(spec.name, spec)]):
            specs[name] = (tuple(one.shape), one.dtype.name)
    return specs


def compare(model, path, format, images, input_mode="vit", resize_to=None):
    """The artefact against Keras on uint8 `images` (scaled for Keras by `preprocess_input(images,
    input_mode)`, or as they are for a model built with `input_dtype="uint8"`): (max abs difference
    of the outputs, agreement):
    for a classifier the fraction of images with the same top-1 class, for an embedding or features
    the smallest cosine similarity of an image's two outputs.

    A NaFlex model's artefact is compared on a NaFlex batch (the dict `run` takes), fed to the model
    as it is (`input_mode` does not apply); of patch tokens (B, L, D) (`pooling=None`), the padding's
    are left out (zero in both).

    Args:
        model: the Keras model that was exported.
        path: the artefact, as `export` returns it.
        format: its format, one of FORMATS.
        images: uint8 images (N, h, w, 3), or a NaFlex batch for a NaFlex model's artefact.
        input_mode: the `keras_vit.preprocess_input` mode the artefact was exported with.
        resize_to: the `resize_to` the artefact was exported with (Keras resizes by the same layer).

    Returns:
        A tuple (max abs difference, agreement) of two floats.

    Raises:
        keras_vit.extras.MissingPackageError: the format's runtime is not installed, before Keras runs.
    """
    import keras

    from keras_vit.preprocessing import model_input

    if format in FORMATS:
        require(f"running {format} artefacts")

    name = output_name(model)
    if isinstance(images, dict):  # one compiled call (JAX runs an eager call op by op: many times slower)
        expected = keras.ops.convert_to_numpy(model.predict_on_batch(images))
    elif resize_to is None:
        expected = keras.ops.convert_to_numpy(model(model_input(model, images, input_mode)))
    else:
        expected = keras.ops.convert_to_numpy(serving_model(model, None, input_mode, resize_to)(images)[name])
    got = run(path, format, images)[name].reshape(expected.shape)
    if isinstance(images, dict) and expected.ndim == 3:  # patch tokens: the padding's left out
        valid = np.asarray(images["patch_valid"])[..., None]
        got, expected = np.where(valid, got, 0), np.where(valid, expected, 0)
    if name in CLASS_OUTPUTS:
        agreement = float(np.mean(got.argmax(-1) == expected.argmax(-1)))
    else:
        a, b = (v.reshape(len(v), -1).astype(np.float64) for v in (got, expected))
        agreement = float(np.min(np.sum(a * b, -1) / np.linalg.norm(a, axis=-1) / np.linalg.norm(b, axis=-1)))
    return float(np.abs(got - expected).max()), agreement
