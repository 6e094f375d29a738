"""Serving artefacts (`keras-vit export`): the model behind a signature that takes uint8 images of
any batch size, preprocessing included, exported to a folder that appears only once complete.

Every backend writes every format. Keras' `model.export` writes most of them; ONNX from torch goes
through torch's dynamo-based exporter directly (Keras' path for a dynamic batch, the TorchScript
exporter, fails on LayerNorm), and LiteRT from torch at a fixed batch through litert-torch where it
is installed. What no exporter of a backend writes (THROUGH_TENSORFLOW) is written from the
TensorFlow backend in a fresh process, from the model saved as `.keras`: the weights and the
computation are the same in every backend. Every ONNX file is then rewritten to run faster
(`_optimize_onnx`), and can be quantized to int8 by onnxruntime's tools (see `export`).

"""

import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np

FORMATS = ("tf_saved_model", "onnx", "litert")
QUANTIZATIONS = ("int8",)
# the artefact inside the output folder (a SavedModel is the folder itself)
FILES = {"onnx": "model.onnx", "litert": "model.tflite"}
# (backend, format) pairs no exporter of that backend writes for any batch size, and why: written from
# the TensorFlow backend in a fresh process instead (README's table)
THROUGH_TENSORFLOW = {
    ("jax", "litert"): "Keras exports LiteRT from TensorFlow and torch only",
    ("torch", "tf_saved_model"): "Keras exports a SavedModel from torch through torch_xla, which has no CPU "
                                 "build for this torch",
    ("torch", "litert"): "litert-torch 0.10 fails to lower a dynamic batch dimension (torch 2.13), even for a "
                         "single Linear layer; with --batch-size N and litert-torch installed, it writes the file",
}
# the packages LiteRT from torch at a fixed batch imports (litert-torch's own full requirements also pin
# typing-extensions<4.13 through xdsl, and bring transformers, kagglehub, sentencepiece, ...; none of that
# is needed to convert)
LITERT_TORCH_INSTALL = ("pip install --no-deps litert-torch==0.10.0 litert-converter==0.5.0 torchao==0.18.0 "
                        "ai-edge-quantizer==0.10.0 multipledispatch")
# images read from a calibration folder for static int8 quantization, at most
CALIBRATION_LIMIT = 1000


def writer(backend, format, batch_size=None):
    """The backend that writes `format` for a model of `backend` (at `batch_size`, None: any): `backend`
    itself, or "tensorflow" for the pairs of THROUGH_TENSORFLOW (LiteRT from torch at a fixed batch is
    litert-torch's where it is installed)."""
    import importlib.util

    if (backend, format) == ("torch", "litert") and batch_size is not None \
            and importlib.util.find_spec("litert_torch") is not None:
        return backend
    return "tensorflow" if (backend, format) in THROUGH_TENSORFLOW else backend


def check_format(backend, format, quantize=None, batch_size=None):
    """Raises ValueError (one line) when `format` (with `quantize`) cannot be exported from `backend`:
    an unknown format or quantization, or the TensorFlow package missing where it writes the file."""
    import importlib.util

    if format not in FORMATS:
        raise ValueError(f"unknown export format {format!r}; expected one of {', '.join(FORMATS)}")
    if writer(backend, format, batch_size) != backend and importlib.util.find_spec("tensorflow") is None:
        raise ValueError(f"{format} from the {backend} backend is written from the TensorFlow backend in a separate "
                         f"process ({THROUGH_TENSORFLOW[backend, format]}), and tensorflow is not installed: "
                         "pip install 'keras-vit[tensorflow]'")
    if quantize is not None:
        if quantize not in QUANTIZATIONS:
            raise ValueError(f"unknown quantization {quantize!r}; expected one of {', '.join(QUANTIZATIONS)}")
        if format != "onnx":
            raise ValueError(f"--quantize {quantize} applies to onnx (onnxruntime's quantization), not {format}; "
                             "Keras' own model.quantize('int8') makes smaller .keras files")


# what a model's output is called in its artefacts (`keras_vit.structure.output_kind`); a model of
# another make is taken for a classifier
CLASS_OUTPUTS = ("probabilities", "scores", "logits")


def output_name(model):
    """The name of `model`'s output in its artefacts: "probabilities", "logits", "embeddings", ..."""
    from keras_vit.structure import output_kind

    return output_kind(model) or "probabilities"


def serving_model(model, top_k=None, input_mode="vit"):
    """`model` behind a uint8 input, scaled first as `keras_vit.preprocess_input(x, input_mode)` does
    ("vit": x / 127.5 - 1; "imagenet", "clip": per channel) by a `Rescaling` layer (a model built
    with `input_dtype="uint8"` takes that input as it is).

    Outputs a dict: the model's output under `output_name(model)` ("probabilities" of a classifier,
    "embeddings" of a projection, "features" of a backbone, ...), and with `top_k` (classifiers only)
    "top_k_scores" and "top_k_classes" (int32) beside it.
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


def export(model, out, format="tf_saved_model", top_k=None, batch_size=None, quantize=None, calibration=None,
           input_mode="vit"):
    """Exports `serving_model(model, top_k, input_mode)` as `format` into the new folder `out`; returns the
    artefact's path. `input_mode` is the scaling the model's weights were trained with (a
    `keras_vit.preprocess_input` mode: "vit", "imagenet", "clip"), done inside the artefact.

    Written into a temporary folder beside `out` and renamed into place when complete; `out` must
    not exist yet. `batch_size` fixes the batch dimension; None keeps it dynamic. The pairs of
    THROUGH_TENSORFLOW are written from the TensorFlow backend in a fresh process (`writer`).

    `quantize="int8"` (ONNX only) quantizes the exported file with onnxruntime: the matrix products'
    weights and activations in int8, dynamically (activation ranges measured per call), or
    statically with `calibration`, uint8 images (N, h, w, 3) whose activation ranges are fixed
    into the file (see `calibration_images`).
    """
    import keras

    backend = keras.backend.backend()
    check_format(backend, format, quantize, batch_size)
    if calibration is not None and quantize is None:
        raise ValueError("calibration images are for quantize='int8'")
    out = os.path.abspath(os.fspath(out))
    if os.path.exists(out):
        raise FileExistsError(f"{out} already exists; export writes a new folder (remove it or pick another)")
    parent = os.path.dirname(out)
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(out)}.", dir=parent)
    try:
        path = artefact(tmp, format)
        if writer(backend, format, batch_size) == backend:
            _write(model, path, format, top_k, batch_size, input_mode)
        else:
            _through_tensorflow(model, path, format, top_k, batch_size, input_mode)
        if quantize:
            _quantize_int8(path, calibration)
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return artefact(out, format)


def _write(model, path, format, top_k, batch_size, input_mode="vit"):
    """Writes `serving_model(model, top_k, input_mode)` as `format` at `path` from the running backend."""
    import keras

    backend = keras.backend.backend()
    serving = serving_model(model, top_k, input_mode)
    if backend == "torch" and format == "onnx":
        _torch_onnx(serving, path, batch_size)
    elif backend == "torch" and format == "litert":
        _torch_litert(serving, path, batch_size)
    else:
        spec = keras.InputSpec(shape=(batch_size, *model.input_shape[1:]), dtype="uint8", name="images")
        serving.export(path, format=format, input_signature=[spec], verbose=False)
    if format == "onnx":
        _fix_onnx(path, sorted(serving.output))
        _optimize_onnx(path)


def _through_tensorflow(model, path, format, top_k, batch_size, input_mode="vit"):
    """Writes the artefact at `path` from the TensorFlow backend: `model` saved as `.keras`, then loaded
    (safe mode) and exported by `python -m keras_vit.export` in a fresh process, on the CPU (a GPU
    stays with the calling process). Raises RuntimeError with the child's last error line."""
    with tempfile.TemporaryDirectory(prefix="keras_vit_export.") as folder:
        saved = os.path.join(folder, "model.keras")
        model.save(saved)
        command = [sys.executable, "-m", "keras_vit.export", saved, path, format]
        command += [] if top_k is None else ["--top-k", str(top_k)]
        command += [] if batch_size is None else ["--batch-size", str(batch_size)]
        command += ["--input-mode", input_mode]
        env = dict(os.environ, KERAS_BACKEND="tensorflow", CUDA_VISIBLE_DEVICES="", TF_CPP_MIN_LOG_LEVEL="3")
        done = subprocess.run(command, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        lines = [line for line in done.stderr.strip().splitlines() if line.strip()]
        raise RuntimeError(f"writing {format} from the TensorFlow backend, in a fresh process that reloads the model "
                           f"from .keras, failed (exit {done.returncode}): "
                           f"{lines[-1] if lines else 'no message'}")


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
    return dict(runner(images=images))


def compare(model, path, format, images, input_mode="vit"):
    """The artefact against Keras on uint8 `images` (scaled for Keras by `preprocess_input(images,
    input_mode)`): (max abs difference of the outputs, agreement):
    for a classifier the fraction of images with the same top-1 class, for an embedding or features
    the smallest cosine similarity of an image's two outputs."""
    import keras

    from keras_vit.preprocessing import preprocess_input

    expected = keras.ops.convert_to_numpy(model(preprocess_input(images, input_mode)))
    name = output_name(model)
    got = run(path, format, images)[name].reshape(expected.shape)
    if name in CLASS_OUTPUTS:
        agreement = float(np.mean(got.argmax(-1) == expected.argmax(-1)))
    else:
        a, b = (v.reshape(len(v), -1).astype(np.float64) for v in (got, expected))
        agreement = float(np.min(np.sum(a * b, -1) / np.linalg.norm(a, axis=-1) / np.linalg.norm(b, axis=-1)))
    return float(np.abs(got - expected).max()), agreement


def _images_module(serving):
    """`serving` (a Keras model on the torch backend) as a module whose forward takes one argument
    named `images` (for dynamic_shapes and the artefact's input name), in eval mode."""
    import torch

    class Images(torch.nn.Module):
        def __init__(self, model):
            super().__init__()
            self.model = model

        def forward(self, images):
            return self.model(images)

    return Images(serving).eval()


def _torch_onnx(serving, path, batch_size):
    """ONNX from the torch backend through torch's dynamo exporter, the batch dynamic unless fixed."""
    import torch

    # an example batch of 2: torch.export specialises a dimension it sees as 1
    example = torch.zeros((batch_size or 2, *serving.input_shape[1:]), dtype=torch.uint8)
    dynamic = None if batch_size else {"images": {0: torch.export.Dim("batch")}}
    program = torch.onnx.export(_images_module(serving), (example,), dynamo=True, input_names=["images"],
                                dynamic_shapes=dynamic, verbose=False)
    program.optimize()
    program.save(path)


def _torch_litert(serving, path, batch_size):
    """LiteRT from the torch backend through litert-torch, at a fixed batch (THROUGH_TENSORFLOW says why).

    Called directly rather than through Keras' `model.export`, which traces with the batch set to
    1 and names the input `args_0`; here the input is `images`, like the other artefacts'.
    litert-torch turns JAX's 64-bit mode on when imported; it is restored after.
    """
    import contextlib
    import io

    import torch

    try:
        import jax

        x64 = jax.config.jax_enable_x64
    except ImportError:
        jax = None
    try:
        import litert_torch

        example = torch.zeros((batch_size, *serving.input_shape[1:]), dtype=torch.uint8)
        with contextlib.redirect_stdout(io.StringIO()):  # its progress lines
            litert_torch.convert(_images_module(serving), sample_kwargs={"images": example}).export(path)
    finally:
        if jax is not None:
            jax.config.update("jax_enable_x64", x64)


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


# weights folded into initializers up to this many elements (onnxscript's default, 8192, leaves the
# reshaped and concatenated kernels of any real ViT as nodes computed at load time)
FOLD_LIMIT = 1 << 31


def _optimize_onnx(path):
    """Rewrites the ONNX file at `path` into a form that runs faster, outputs unchanged.

    1. Every weight computed from constants (the q/k/v kernels concatenated at call time, the
       patch and output kernels reshaped) is folded into one initializer (onnxscript's constant
       folding, with no size limit). onnxruntime folds them too when it loads a float file, but
       its int8 quantizer only quantizes a MatMul whose weight is an initializer: without this,
       the q/k/v and output projections of every block stayed float32.
    2. `_separate_qkv`: the attention of torch's exporter, one (D, 3D) matmul whose output is
       sliced three times, becomes three matmuls that write q, k^T and v in the layout the
       attention products read, the query scale folded into the query kernel.
    3. `_einsum_to_matmul`: jax2onnx's projections, Einsum nodes of a constant kernel
       ("btd,dnh->btnh"), become MatMul between Reshapes (onnxruntime quantizes MatMul, not
       Einsum, and runs MatMul without Einsum's own transposes).

    The rewritten file is checked against the exporter's in onnxruntime on random images; where
    they differ (beyond 1e-5) the exporter's file is kept and a warning logged.
    """
    import onnx
    import onnxscript.optimizer

    original = onnx.load(path)
    model = onnxscript.optimizer.optimize(original, input_size_limit=FOLD_LIMIT, output_size_limit=FOLD_LIMIT)
    separated = _separate_qkv(model.graph) + _einsum_to_matmul(model.graph)
    _remove_unused(model.graph)
    if separated:
        error = _max_difference(original, model)
        if error is None or error > 1e-5:
            import logging

            logging.getLogger("keras_vit").warning(
                "keras_vit.export: the rewritten projections changed the outputs (%s); "
                "keeping the exporter's graph (its weights folded)", "failed to run" if error is None else f"by {error:.1e}")
            model = onnxscript.optimizer.optimize(original, input_size_limit=FOLD_LIMIT,
                                                  output_size_limit=FOLD_LIMIT)
    onnx.save(model, path)


def _consumers(graph):
    uses = {}
    for node in graph.node:
        for name in node.input:
            uses.setdefault(name, []).append(node)
    return uses


def _constant(graph, name):
    """The initializer `name` as a numpy array, or None."""
    import onnx

    for init in graph.initializer:
        if init.name == name:
            return onnx.numpy_helper.to_array(init)
    return None


def _attr(node, name, default=None):
    import onnx

    for a in node.attribute:
        if a.name == name:
            return onnx.helper.get_attribute_value(a)
    return default


def _separate_qkv(graph):
    """In place: each attention of the pattern torch's dynamo exporter writes for keras-vit,

        X = Reshape(MatMul(h, W) + b, [-1, T, 3, heads, head_dim])
        q, k, v = (Transpose(Gather(X, i, axis=2), [0, 2, 1, 3]) for i in 0, 1, 2)
        softmax((q * s) @ (transpose(k, -1, -2) * s)) @ v

    (k^T through Shape, Reshape, Transpose, Reshape), becomes three MatMul + Add + Reshape +
    Transpose, q already scaled (s * s folded into its kernel and bias), k transposed in one step.
    Returns how many attentions were rewritten; anything else is left as it is.
    """
    import onnx
    from onnx import helper, numpy_helper

    uses = _consumers(graph)
    producer = {o: n for n in graph.node for o in n.output}
    new_nodes, new_inits, rewritten = {}, [], 0

    def scalar(node, tensor):
        """`node` = Mul(tensor, scalar constant): the scalar, else None."""
        if node is None or node.op_type != "Mul" or tensor not in node.input:
            return None
        other = _constant(graph, node.input[1 - list(node.input).index(tensor)])
        return None if other is None or other.size != 1 else float(other.reshape(()))

    for softmax in [n for n in graph.node if n.op_type == "Softmax" and _attr(n, "axis", -1) in (-1, 3)]:
        logits = producer.get(softmax.input[0])
        after = uses.get(softmax.output[0], [])
        if logits is None or logits.op_type != "MatMul" or len(after) != 1 or after[0].op_type != "MatMul" \
                or after[0].input[0] != softmax.output[0]:
            continue
        # query side: Mul(Transpose(Gather(X, 0)), s)
        q_mul = producer.get(logits.input[0])
        q_t = producer.get(q_mul.input[0]) if q_mul is not None and q_mul.op_type == "Mul" else None
        s_q = scalar(q_mul, q_t.output[0]) if q_t is not None else None
        # key side: Mul(Reshape(Transpose[0,2,1](Reshape(Transpose(Gather(X, 1))))), s)
        k_mul = producer.get(logits.input[1])
        chain, node = [], producer.get(k_mul.input[0]) if k_mul is not None and k_mul.op_type == "Mul" else None
        s_k = scalar(k_mul, node.output[0]) if node is not None else None
        for op in ("Reshape", "Transpose", "Reshape"):
            if node is None or node.op_type != op:
                break
            chain.append(node)
            node = producer.get(node.input[0])
        k_t = node
        v_t = producer.get(after[0].input[1])
        if s_q is None or s_k is None or len(chain) != 3 or _attr(chain[1], "perm") != [0, 2, 1]:
            continue
        gathers = []
        for t in (q_t, k_t, v_t):
            g = producer.get(t.input[0]) if t is not None and t.op_type == "Transpose" \
                and _attr(t, "perm") == [0, 2, 1, 3] else None
            index = _constant(graph, g.input[1]) if g is not None and g.op_type == "Gather" else None
            if index is None or index.size != 1 or _attr(g, "axis", 0) != 2:
                break
            gathers.append((g, int(index.reshape(()))))
        if len(gathers) != 3 or [i for _, i in gathers] != [0, 1, 2] or len({g.input[0] for g, _ in gathers}) != 1:
            continue
        reshape = producer.get(gathers[0][0].input[0])
        shape = _constant(graph, reshape.input[1]) if reshape is not None and reshape.op_type == "Reshape" else None
        add = producer.get(reshape.input[0]) if shape is not None else None
        if shape is None or shape.size != 5 or shape[2] != 3 or add is None or add.op_type != "Add":
            continue
        matmul = producer.get(add.input[0])
        bias = _constant(graph, add.input[1])
        kernel = _constant(graph, matmul.input[1]) if matmul is not None and matmul.op_type == "MatMul" else None
        tokens, heads, head_dim = int(shape[1]), int(shape[3]), int(shape[4])
        width = heads * head_dim
        if kernel is None or bias is None or kernel.ndim != 2 or kernel.shape[1] != 3 * width \
                or bias.shape != (3 * width,) or tokens <= 0:
            continue
        prefix = f"{matmul.name or matmul.output[0]}/separate_qkv"
        scale = s_q * s_k
        kernels = [kernel[:, :width] * np.float32(scale), kernel[:, width:2 * width], kernel[:, 2 * width:]]
        biases = [bias[:width] * np.float32(scale), bias[width:2 * width], bias[2 * width:]]
        split_shape = f"{prefix}/shape"
        new_inits.append(numpy_helper.from_array(np.array([-1, tokens, heads, head_dim], np.int64), split_shape))
        # q replaces the scaled query, k^T the scaled key, v the value: the logits MatMul and the
        # weights-times-values MatMul read them directly
        targets = [(logits, 0, [0, 2, 1, 3]), (logits, 1, [0, 2, 3, 1]), (after[0], 1, [0, 2, 1, 3])]
        nodes = []
        for (name, w, b), (reader, slot, perm) in zip(zip("qkv", kernels, biases), targets):
            p = f"{prefix}/{name}"
            new_inits += [numpy_helper.from_array(w.astype(kernel.dtype), f"{p}/kernel"),
                          numpy_helper.from_array(b.astype(bias.dtype), f"{p}/bias")]
            nodes += [helper.make_node("MatMul", [matmul.input[0], f"{p}/kernel"], [f"{p}/matmul"], name=f"{p}/matmul"),
                      helper.make_node("Add", [f"{p}/matmul", f"{p}/bias"], [f"{p}/add"], name=f"{p}/add"),
                      helper.make_node("Reshape", [f"{p}/add", split_shape], [f"{p}/heads"], name=f"{p}/heads"),
                      helper.make_node("Transpose", [f"{p}/heads"], [f"{p}/out"], name=f"{p}/out", perm=perm)]
            reader.input[slot] = f"{p}/out"
        new_nodes[id(matmul)] = nodes
        rewritten += 1
    if rewritten:
        nodes = []
        for node in graph.node:  # the new nodes where the fused matmul was: its input is defined there
            nodes += new_nodes.get(id(node), []) + [node]
        del graph.node[:]
        graph.node.extend(nodes)
        graph.initializer.extend(new_inits)
    return rewritten


def _einsum_to_matmul(graph):
    """In place: each Einsum `x . W` of a constant W whose equation contracts the trailing axes of x
    with the leading axes of W, in order ("btd,dnh->btnh", "btnh,nhd->btd"), becomes
    Reshape(x, [0, .., prod K]) @ W (prod K, prod N) -> Reshape([0, .., N...]). Returns how many."""
    from onnx import helper, numpy_helper

    done = 0
    nodes = []
    for node in graph.node:
        kernel = _constant(graph, node.input[1]) if node.op_type == "Einsum" and len(node.input) == 2 else None
        equation = _attr(node, "equation", b"")
        equation = (equation.decode() if isinstance(equation, bytes) else equation).replace(" ", "")
        if kernel is None or "..." in equation or "->" not in equation or equation.count(",") != 1:
            nodes.append(node)
            continue
        (lhs, rhs), out = equation.split("->")[0].split(","), equation.split("->")[1]
        contracted = [c for c in lhs if c not in out]
        batch = lhs[:len(lhs) - len(contracted)]
        kept = rhs[len(contracted):]
        if len(set(lhs)) != len(lhs) or len(set(rhs)) != len(rhs) or lhs[len(batch):] != "".join(contracted) \
                or rhs[:len(contracted)] != "".join(contracted) or out != batch + kept or not contracted \
                or any(c in rhs for c in batch) or kernel.ndim != len(rhs):
            nodes.append(node)
            continue
        k = int(np.prod(kernel.shape[:len(contracted)]))
        p = f"{node.name or node.output[0]}/matmul"
        graph.initializer.extend([
            numpy_helper.from_array(kernel.reshape(k, -1), f"{p}/kernel"),
            numpy_helper.from_array(np.array([0] * len(batch) + [k], np.int64), f"{p}/in_shape"),
            numpy_helper.from_array(np.array([0] * len(batch) + list(kernel.shape[len(contracted):]), np.int64),
                                    f"{p}/out_shape")])
        nodes += [helper.make_node("Reshape", [node.input[0], f"{p}/in_shape"], [f"{p}/x"], name=f"{p}/x"),
                  helper.make_node("MatMul", [f"{p}/x", f"{p}/kernel"], [f"{p}/y"], name=p),
                  helper.make_node("Reshape", [f"{p}/y", f"{p}/out_shape"], list(node.output), name=f"{p}/out")]
        done += 1
    if done:
        del graph.node[:]
        graph.node.extend(nodes)
    return done


def _remove_unused(graph):
    """Drops the nodes and initializers no graph output depends on."""
    needed = {o.name for o in graph.output}
    kept = []
    for node in reversed(graph.node):
        if any(o in needed for o in node.output):
            kept.append(node)
            needed.update(node.input)
    del graph.node[:]
    graph.node.extend(reversed(kept))
    inits = [i for i in graph.initializer if i.name in needed]
    del graph.initializer[:]
    graph.initializer.extend(inits)
    infos = [v for v in graph.value_info if v.name in needed]
    del graph.value_info[:]
    graph.value_info.extend(infos)


def _max_difference(a, b, batch=2):
    """Max |difference| of every float output of the ONNX models `a` and `b` (ModelProto) under
    onnxruntime on `batch` random images (integer outputs must be equal); None when either fails."""
    import onnxruntime as ort

    try:
        sessions = [ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]) for m in (a, b)]
        spec = sessions[0].get_inputs()[0]
        shape = [d if isinstance(d, int) else batch for d in spec.shape]
        dtype = {"tensor(uint8)": np.uint8, "tensor(float)": np.float32}[spec.type]
        images = np.random.default_rng(0).integers(0, 256, shape).astype(dtype)
        outputs = [s.run(None, {spec.name: images}) for s in sessions]
    except Exception:  # noqa: BLE001 - any failure keeps the exporter's file
        return None
    error = 0.0
    for x, y in zip(*outputs):
        if x.dtype.kind == "f":
            error = max(error, float(np.abs(x - y).max()))
        elif not np.array_equal(x, y):
            return float("inf")
    return error


def _quantize_int8(path, calibration):
    """Replaces the float ONNX file at `path` by its int8 quantization (dynamic, or static with
    `calibration` images): the matrix products of a weight, per output channel for static. The
    attention's two products of activations (q k^T, and the weights times v) stay float32 either
    way (dynamic quantization only takes products of a weight): statically quantized, they changed
    the class of 1 of the demo model's 224 test digits (benchmarks/README.md)."""
    import onnx
    from onnxruntime import quantization as q

    source = path + ".float32.onnx"
    os.replace(path, source)
    if calibration is None:
        q.quantize_dynamic(source, path, weight_type=q.QuantType.QInt8)
    else:
        model = onnx.load(source)
        weights = {i.name for i in model.graph.initializer}
        for i, node in enumerate(model.graph.node):  # the quantizer picks nodes by name
            node.name = node.name or f"{node.op_type}_{i}"
        onnx.save(model, source)
        weighted = [n.name for n in model.graph.node if n.op_type in ("MatMul", "Gemm") and n.input[1] in weights]
        # calibrated: the matrix products' inputs only (calibrating every tensor of jax2onnx's graphs
        # fails in onnxruntime, "scale issue": a tensor whose range gives no scale)
        reader = _Calibration(model.graph.input[0].name, calibration)
        q.quantize_static(source, path, reader, quant_format=q.QuantFormat.QDQ,
                          op_types_to_quantize=["MatMul", "Gemm"], nodes_to_quantize=weighted,
                          activation_type=q.QuantType.QUInt8,
                          weight_type=q.QuantType.QInt8, per_channel=True)
    os.remove(source)


class _Calibration:
    """onnxruntime's CalibrationDataReader over uint8 images, one batch of 1 at a time."""

    def __init__(self, name, images):
        self.name = name  # the model's input
        self.images = iter(images)

    def get_next(self):
        image = next(self.images, None)
        return None if image is None else {self.name: image[None]}


def _main(argv=None):
    """`python -m keras_vit.export MODEL.keras PATH FORMAT [--top-k K] [--batch-size N] [--input-mode M]`: writes the
    artefact of a saved model from the running backend (`_through_tensorflow` runs it)."""
    import argparse

    p = argparse.ArgumentParser(prog="python -m keras_vit.export")
    p.add_argument("model")
    p.add_argument("path")
    p.add_argument("format", choices=FORMATS)
    p.add_argument("--top-k", type=int, default=None)
    p.add_argument("--batch-size", type=int, default=None)
    p.add_argument("--input-mode", default="vit")
    args = p.parse_args(argv)
    import keras

    import keras_vit  # noqa: F401  (registers the package's layers for safe-mode loading)

    _write(keras.saving.load_model(args.model), args.path, args.format, args.top_k, args.batch_size, args.input_mode)
