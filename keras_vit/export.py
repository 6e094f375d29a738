"""Serving artefacts (`keras-vit export`): the model behind a signature that takes uint8 images of
any batch size, preprocessing included, exported with Keras' `model.export` to a folder that
appears only once complete."""

import os
import shutil
import tempfile

import keras

from keras_vit.layers import TopK

FORMATS = ("tf_saved_model", "onnx", "litert")
# the artefact inside the output folder (a SavedModel is the folder itself)
FILES = {"onnx": "model.onnx", "litert": "model.tflite"}
# (backend, format) pairs Keras cannot export here, and why (README's table)
UNSUPPORTED = {
    ("jax", "onnx"): "Keras exports ONNX from JAX through the jax2onnx package (which pulls in flax, orbax, "
                     "tensorstore); export a tf_saved_model from JAX, or ONNX from TensorFlow or torch",
    ("jax", "litert"): "Keras exports LiteRT from TensorFlow and torch only",
    ("torch", "tf_saved_model"): "Keras exports a SavedModel from torch through torch_xla, which has no CPU "
                                 "build for this torch",
    ("torch", "litert"): "Keras exports LiteRT from torch through the litert-torch package, not installed here",
}


def serving_model(model, top_k=None):
    """`model` (taking [-1, 1] images) behind a uint8 input: Rescaling(x / 127.5 - 1) first.

    Outputs the probabilities, or with `top_k` a dict of "probabilities", "top_k_scores" and
    "top_k_classes" (int32).
    """
    inputs = keras.Input(model.input_shape[1:], dtype="uint8", name="images")
    x = keras.layers.Rescaling(1 / 127.5, offset=-1.0, name="rescale")(inputs)
    probabilities = model(x)
    if not top_k:
        return keras.Model(inputs, probabilities, name=f"{model.name}_serving")
    scores, classes = TopK(top_k, name="top_k")(probabilities)
    outputs = {"probabilities": probabilities, "top_k_scores": scores, "top_k_classes": classes}
    return keras.Model(inputs, outputs, name=f"{model.name}_serving")


def artefact(out, format):
    """The path of the exported file (or SavedModel folder) inside the output folder `out`."""
    return os.path.join(out, FILES[format]) if format in FILES else out


def export(model, out, format="tf_saved_model", top_k=None, batch_size=None):
    """Exports `serving_model(model, top_k)` as `format` into the new folder `out`.

    Written into a temporary folder beside `out` and renamed into place when complete; `out` must
    not exist yet. `batch_size` fixes the batch dimension (needed where the backend cannot export
    a dynamic one); None keeps it dynamic.
    """
    if format not in FORMATS:
        raise ValueError(f"unknown export format {format!r}; expected one of {', '.join(FORMATS)}")
    backend = keras.backend.backend()
    if (backend, format) in UNSUPPORTED:
        raise ValueError(f"cannot export {format} from the {backend} backend: {UNSUPPORTED[backend, format]}")
    if backend == "torch" and format == "onnx" and batch_size is None:
        raise ValueError("ONNX from the torch backend needs a fixed batch_size (Keras' dynamic-batch path, "
                         "the TorchScript exporter, fails on LayerNorm); export from TensorFlow for any batch size")
    out = os.path.abspath(os.fspath(out))
    if os.path.exists(out):
        raise FileExistsError(f"{out} already exists; export writes a new folder (remove it or pick another)")
    serving = serving_model(model, top_k)
    parent = os.path.dirname(out)
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(out)}.", dir=parent)
    try:
        spec = keras.InputSpec(shape=(batch_size, *model.input_shape[1:]), dtype="uint8", name="images")
        serving.export(artefact(tmp, format), format=format, input_signature=[spec], verbose=False)
        if backend == "tensorflow" and format == "onnx":
            _replace_erfc(artefact(tmp, format))
        if backend == "torch" and format == "onnx":
            _name_onnx_outputs(artefact(tmp, format), sorted(serving.output) if top_k else ["probabilities"])
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return artefact(out, format)


def _name_onnx_outputs(path, names):
    """Renames the graph outputs of an ONNX file (torch's exporter numbers them) to `names`, in order."""
    import onnx

    model = onnx.load(path)
    for output, name in zip(model.graph.output, names):
        old, output.name = output.name, name
        for node in model.graph.node:
            node.output[:] = [name if o == old else o for o in node.output]
            node.input[:] = [name if i == old else i for i in node.input]
    onnx.save(model, path)


def _replace_erfc(path):
    """Rewrites each Erfc node of an ONNX file as 1 - Erf (ONNX has no Erfc op).

    TensorFlow's exact GELU is 0.5 x erfc(-x / sqrt 2); tf2onnx copies the Erfc through, and
    onnxruntime then refuses the whole file.
    """
    import numpy as np
    import onnx

    model = onnx.load(path)
    nodes = []
    for node in model.graph.node:
        if node.op_type != "Erfc":
            nodes.append(node)
            continue
        one, erf = f"{node.name}/one", f"{node.name}/erf"
        model.graph.initializer.append(onnx.numpy_helper.from_array(np.ones((), np.float32), one))
        nodes.append(onnx.helper.make_node("Erf", list(node.input), [erf], name=erf))
        nodes.append(onnx.helper.make_node("Sub", [one, erf], list(node.output), name=node.name))
    if len(nodes) == len(model.graph.node):
        return
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    onnx.save(model, path)
