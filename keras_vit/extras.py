"""The optional packages: which feature needs which module (FEATURES), and which extra of keras-vit installs
it (PACKAGES); `require(feature)` checks them before anything is built.

A feature whose module is missing is refused in one line naming the package and the command that installs
it, `writing onnx from the jax backend needs jax2onnx, which is not installed: pip install
"keras-vit[export]"`, as a `MissingPackageError` (a ModuleNotFoundError); `keras-vit` and the examples
(`require_or_exit`) print that line and exit with status 1. A module is looked up without being imported
(`importlib.util.find_spec`), so a check costs nothing when the package is there.

Standard library only: every module that needs an optional package imports it.
"""

import importlib.util

__all__ = ["FEATURES", "PACKAGES", "MissingPackageError", "missing", "require", "require_or_exit"]

# module: (the package pip installs it from, the keras-vit extra that brings it)
PACKAGES = {
    "tensorflow": ("tensorflow", "tensorflow"),
    "tensorflow_datasets": ("tensorflow-datasets", "tensorflow"),
    "torch": ("torch", "torch"),
    "tf2onnx": ("tf2onnx", "export"),
    "jax2onnx": ("jax2onnx", "export"),
    "onnx": ("onnx", "export"),
    "onnxscript": ("onnxscript", "export"),
    "onnxruntime": ("onnxruntime", "export"),
    "ai_edge_litert": ("ai-edge-litert", "export"),
    "huggingface_hub": ("huggingface_hub", "convert"),
    "sklearn": ("scikit-learn", "examples"),
    "tqdm": ("tqdm", "examples"),
}
# feature (as the message words it): (the modules it imports, what else the user can do, or None).
# Every ONNX file is rewritten by onnxscript's optimizer and checked in onnxruntime (export/onnx_rewrites.py).
FEATURES = {
    "writing tf_saved_model from the tensorflow backend": (("tensorflow",), None),
    "writing tf_saved_model from the jax backend": (("tensorflow",), None),  # Keras' jax2tf
    "writing onnx from the tensorflow backend": (("tf2onnx", "onnx", "onnxscript", "onnxruntime"), None),
    "writing onnx from the jax backend": (("jax2onnx", "onnx", "onnxscript", "onnxruntime"), None),
    "writing onnx from the torch backend": (("onnxscript", "onnx", "onnxruntime"), None),  # torch's dynamo exporter
    "writing litert from the tensorflow backend": (("tensorflow",), None),
    "writing litert from the torch backend": (("torch",), None),  # litert-torch, chosen only when installed
    "writing in a TensorFlow process": (("tensorflow",), None),  # formats.THROUGH_TENSORFLOW
    "running tf_saved_model artefacts": (("tensorflow",), None),
    "running onnx artefacts": (("onnxruntime",), None),
    "running litert artefacts": (("ai_edge_litert",), None),
    "reading a TFDS dataset (keras_vit.data)": (("tensorflow", "tensorflow_datasets"), None),
    "the tf.data pipeline of an image folder": (("tensorflow",), "pipeline='pydataset' or 'auto' runs without it"),
    "reading a .pth or .bin checkpoint": (("torch",), "or convert it to .safetensors, which keras-vit reads itself"),
    "fetching a timm model by name": (("huggingface_hub",), "or pass the path of its .safetensors file"),
    "the digits examples": (("sklearn", "tqdm"), None),
}


class MissingPackageError(ModuleNotFoundError):
    """A feature's optional package is not installed: the message names it and the extra that installs
    it (`require`). `name` is the first missing module, as ModuleNotFoundError's."""


def missing(feature):
    """The modules of FEATURES[feature] that are not installed (none imported to find out).

    Args:
        feature: a key of FEATURES.
    """
    modules, _ = FEATURES[feature]
    return [m for m in modules if importlib.util.find_spec(m) is None]


def require(feature, subject=None):
    """Raises MissingPackageError, one line, when a module `feature` needs is not installed: which
    package, and the `pip install "keras-vit[EXTRA]"` that brings it. Call it before building anything.

    Args:
        feature: a key of FEATURES, e.g. "writing onnx from the jax backend".
        subject: what the message says needs the package, in place of `feature` (e.g. the format and
            the backend the user asked for, when another backend writes it); None: `feature`.

    Raises:
        MissingPackageError: a module is missing.
    """
    absent = missing(feature)
    if not absent:
        return
    names = [PACKAGES[m][0] for m in absent]
    extras = ",".join(dict.fromkeys(PACKAGES[m][1] for m in absent))
    which = "which is" if len(names) == 1 else "which are"
    message = (f"{subject or feature} needs {' and '.join(names)}, {which} not installed: "
               f'pip install "keras-vit[{extras}]"')
    instead = FEATURES[feature][1]
    raise MissingPackageError(message + (f" ({instead})" if instead else ""), name=absent[0])


def require_or_exit(feature):
    """`require` for a script's `main`: a missing module ends the process with the one line ("error: ...",
    exit status 1), no traceback.

    Args:
        feature: a key of FEATURES.
    """
    try:
        require(feature)
    except MissingPackageError as err:
        raise SystemExit(f"error: {err}") from None
