"""Serving artefacts (`keras-vit export`): the model behind a signature that takes uint8 images of
any batch size, preprocessing included, exported to a folder that appears only once complete.

Keras' `model.export` writes every artefact except ONNX from torch, which goes through torch's
dynamo-based exporter directly (Keras' path for a dynamic batch, the TorchScript exporter, fails
on LayerNorm). ONNX files can be quantized to int8 by onnxruntime's tools (see `export`).

"""

import os
import shutil
import tempfile

import numpy as np

FORMATS = ("tf_saved_model", "onnx", "litert")
BACKENDS = ("tensorflow", "jax", "torch")
QUANTIZATIONS = ("int8",)
# the artefact inside the output folder (a SavedModel is the folder itself)
FILES = {"onnx": "model.onnx", "litert": "model.tflite"}
# (backend, format) pairs this package cannot export, and why (README's table)
UNSUPPORTED = {
    ("jax", "litert"): "Keras exports LiteRT from TensorFlow and torch only",
    ("torch", "tf_saved_model"): "Keras exports a SavedModel from torch through torch_xla, which has no CPU "
                                 "build for this torch",
    ("torch", "litert"): "Keras exports LiteRT from torch through the litert-torch package, not in the export extra",
}
# images read from a calibration folder for static int8 quantization, at most
CALIBRATION_LIMIT = 1000


def formats(backend):
    """The formats `export` writes from `backend`."""
    return [f for f in FORMATS if (backend, f) not in UNSUPPORTED]


def check_format(backend, format, quantize=None):
    """Raises ValueError (one line) when `format` (with `quantize`) cannot be exported from `backend`."""
    if format not in FORMATS:
        raise ValueError(f"unknown export format {format!r}; expected one of {', '.join(FORMATS)}")
    if (backend, format) in UNSUPPORTED:
        others = [b for b in BACKENDS if (b, format) not in UNSUPPORTED]
        raise ValueError(f"cannot export {format} from the {backend} backend ({UNSUPPORTED[backend, format]}); "
                         f"{backend} exports {', '.join(formats(backend))}; {format} exports from "
                         f"{', '.join(others)}")
    if quantize is not None:
        if quantize not in QUANTIZATIONS:
            raise ValueError(f"unknown quantization {quantize!r}; expected one of {', '.join(QUANTIZATIONS)}")
        if format != "onnx":
            raise ValueError(f"--quantize {quantize} applies to onnx (onnxruntime's quantization), not {format}; "
                             "Keras' own model.quantize('int8') makes smaller .keras files")


def serving_model(model, top_k=None):
    """`model` (taking [-1, 1] images) behind a uint8 input: Rescaling(x / 127.5 - 1) first (a
    model built with `input_dtype="uint8"` takes that input as it is).

    Outputs the probabilities, or with `top_k` a dict of "probabilities", "top_k_scores" and
    "top_k_classes" (int32).
    """
    import keras

    from keras_vit.layers import TopK

    inputs = keras.Input(model.input_shape[1:], dtype="uint8", name="images")
    if model.inputs[0].dtype == "uint8":  # built with input_dtype="uint8": it scales its input itself
        x = inputs
    else:
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


def calibration_images(folder, image_size):
    """The readable images of `folder` (at most CALIBRATION_LIMIT, sorted by name) as uint8 (N, h, w, 3).

    Raises ValueError when the folder holds none.
    """
    from keras_vit.fileio import load_image

    if not os.path.isdir(folder):
        raise ValueError(f"calibration folder not found: {folder}")
    images = []
    for name in sorted(os.listdir(folder)):
        try:
            images.append(load_image(os.path.join(folder, name), image_size))
        except (ValueError, FileNotFoundError):  # not an image (or a sub-folder)
            continue
        if len(images) == CALIBRATION_LIMIT:
            break
    if not images:
        raise ValueError(f"calibration folder {folder} holds no readable images")
    return np.stack(images).round().clip(0, 255).astype(np.uint8)


def export(model, out, format="tf_saved_model", top_k=None, batch_size=None, quantize=None, calibration=None):
    """Exports `serving_model(model, top_k)` as `format` into the new folder `out`; returns the artefact's path.

    Written into a temporary folder beside `out` and renamed into place when complete; `out` must
    not exist yet. `batch_size` fixes the batch dimension; None keeps it dynamic.

    `quantize="int8"` (ONNX only) quantizes the exported file with onnxruntime: the matrix products'
    weights and activations in int8, dynamically (activation ranges measured per call), or
    statically with `calibration`, uint8 images (N, h, w, 3) whose activation ranges are fixed
    into the file (see `calibration_images`).
    """
    import keras

    backend = keras.backend.backend()
    check_format(backend, format, quantize)
    if calibration is not None and quantize is None:
        raise ValueError("calibration images are for quantize='int8'")
    out = os.path.abspath(os.fspath(out))
    if os.path.exists(out):
        raise FileExistsError(f"{out} already exists; export writes a new folder (remove it or pick another)")
    serving = serving_model(model, top_k)
    names = sorted(serving.output) if top_k else ["probabilities"]
    parent = os.path.dirname(out)
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(out)}.", dir=parent)
    try:
        path = artefact(tmp, format)
        if backend == "torch" and format == "onnx":
            _torch_onnx(serving, path, batch_size)
        else:
            spec = keras.InputSpec(shape=(batch_size, *model.input_shape[1:]), dtype="uint8", name="images")
            serving.export(path, format=format, input_signature=[spec], verbose=False)
        if format == "onnx":
            _fix_onnx(path, names)
        if quantize:
            _quantize_int8(path, calibration)
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return artefact(out, format)


def run(path, format, images):
    """Runs the artefact at `path` in its own runtime (TensorFlow's loader, onnxruntime, the LiteRT
    interpreter) on uint8 `images`; returns {output name: numpy array}."""
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
    outputs = runner(images=images)
    return outputs if len(outputs) > 1 else {"probabilities": next(iter(outputs.values()))}


def compare(model, path, format, images):
    """The artefact against Keras on uint8 `images`: (max abs difference of the probabilities,
    fraction of images with the same top-1 class)."""
    import keras

    expected = keras.ops.convert_to_numpy(model(images.astype("float32") / 127.5 - 1))
    got = run(path, format, images)["probabilities"]
    return float(np.abs(got - expected).max()), float(np.mean(got.argmax(-1) == expected.argmax(-1)))


def _torch_onnx(serving, path, batch_size):
    """ONNX from the torch backend through torch's dynamo exporter, the batch dynamic unless fixed."""
    import torch

    class Images(torch.nn.Module):  # a forward with one named argument, for dynamic_shapes
        def __init__(self, model):
            super().__init__()
            self.model = model

        def forward(self, images):
            return self.model(images)

    # an example batch of 2: torch.export specialises a dimension it sees as 1
    example = torch.zeros((batch_size or 2, *serving.input_shape[1:]), dtype=torch.uint8)
    dynamic = None if batch_size else {"images": {0: torch.export.Dim("batch")}}
    program = torch.onnx.export(Images(serving).eval(), (example,), dynamo=True, input_names=["images"],
                                dynamic_shapes=dynamic, verbose=False)
    program.optimize()
    program.save(path)


def _fix_onnx(path, names):
    """Names the graph outputs `names` (torch's and jax2onnx's exporters number them), and rewrites
    each Erfc node as 1 - Erf: ONNX has no Erfc op, and tf2onnx copies the one of TensorFlow's exact
    GELU, 0.5 x erfc(-x / sqrt 2), so onnxruntime would refuse the file."""
    import onnx

    model = onnx.load(path)
    renames = {} if {o.name for o in model.graph.output} == set(names) else \
        {o.name: name for o, name in zip(model.graph.output, names)}
    nodes = []
    for node in model.graph.node:
        node.input[:] = [renames.get(i, i) for i in node.input]
        node.output[:] = [renames.get(o, o) for o in node.output]
        if node.op_type != "Erfc":
            nodes.append(node)
            continue
        one, erf = f"{node.name}/one", f"{node.name}/erf"
        model.graph.initializer.append(onnx.numpy_helper.from_array(np.ones((), np.float32), one))
        nodes.append(onnx.helper.make_node("Erf", list(node.input), [erf], name=erf))
        nodes.append(onnx.helper.make_node("Sub", [one, erf], list(node.output), name=node.name))
    if not renames and len(nodes) == len(model.graph.node):
        return
    for output in model.graph.output:
        output.name = renames.get(output.name, output.name)
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    onnx.save(model, path)


def _quantize_int8(path, calibration):
    """Replaces the float ONNX file at `path` by its int8 quantization (dynamic, or static with
    `calibration` images)."""
    from onnxruntime import quantization as q

    source = path + ".float32.onnx"
    os.replace(path, source)
    if calibration is None:
        q.quantize_dynamic(source, path, weight_type=q.QuantType.QInt8)
    else:
        # the matrix products only: calibrating every tensor of jax2onnx's graphs fails in
        # onnxruntime ("scale issue": a tensor whose range gives no scale)
        q.quantize_static(source, path, _Calibration(source, calibration), quant_format=q.QuantFormat.QDQ,
                          op_types_to_quantize=["MatMul", "Gemm"], activation_type=q.QuantType.QUInt8,
                          weight_type=q.QuantType.QInt8, per_channel=True)
    os.remove(source)


class _Calibration:
    """onnxruntime's CalibrationDataReader over uint8 images, one batch of 1 at a time."""

    def __init__(self, path, images):
        import onnx

        self.name = onnx.load(path, load_external_data=False).graph.input[0].name
        self.images = iter(images)

    def get_next(self):
        image = next(self.images, None)
        return None if image is None else {self.name: image[None]}
