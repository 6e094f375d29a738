"""Which formats there are, which backend writes each (`writer`), and what cannot be exported (`check_format`)."""

import os

from keras_vit.export.inputs import served_kind
from keras_vit.extras import require

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


def writer(backend, format, batch_size=None, any_size=False, naflex=False):
    """The backend that writes `format` for a model of `backend` (at `batch_size`, None: any): `backend`
    itself, or "tensorflow" for the pairs of THROUGH_TENSORFLOW (LiteRT from torch at a fixed batch is
    litert-torch's where it is installed), with `any_size` those of THROUGH_TENSORFLOW_ANY_SIZE, and with
    `naflex` those of THROUGH_TENSORFLOW_NAFLEX.

    Args:
        backend: the Keras backend the model runs on: "jax", "tensorflow" or "torch".
        format: one of FORMATS: "tf_saved_model", "onnx" or "litert".
        batch_size: the fixed batch dimension of the artefact, or None for any batch size.
        any_size: whether the model takes images of any height and width (`takes_any_size`).
        naflex: whether the model takes a NaFlex dict (`keras_vit.naflex.is_naflex`).

    Returns:
        `backend`, or "tensorflow" when the artefact is written from the TensorFlow backend in a
        fresh process.
    """
    return _writer(backend, format, batch_size, served_kind(any_size, naflex))


def _writer(backend, format, batch_size, served):
    """`writer` of the artefact's input `served` (a `keras_vit.export.inputs.ServedInput`)."""
    import importlib.util

    if (backend, format) in served.through_tensorflow:
        return "tensorflow"
    if (backend, format) == ("torch", "litert") and batch_size is not None \
            and importlib.util.find_spec("litert_torch") is not None:
        return backend
    return "tensorflow" if (backend, format) in THROUGH_TENSORFLOW else backend


def check_format(backend, format, quantize=None, batch_size=None, any_size=False, naflex=False):
    """Raises ValueError (one line) when `format` (with `quantize`) cannot be exported from `backend`:
    an unknown format or quantization, or a format of NAFLEX_REFUSED for a NaFlex model; and
    MissingPackageError (one line) when a package the writing backend needs is not installed
    (`keras_vit.extras`: TensorFlow where it writes the file, tf2onnx, jax2onnx, onnxscript, ...).

    Args:
        backend: the Keras backend the model runs on: "jax", "tensorflow" or "torch".
        format: the artefact's format; one of FORMATS is accepted.
        quantize: None, or a quantization of QUANTIZATIONS ("int8", ONNX only).
        batch_size: the fixed batch dimension of the artefact, or None for any batch size (it
            decides which backend writes LiteRT from torch, see `writer`).
        any_size: whether the model takes images of any height and width (see `writer`).
        naflex: whether the model takes a NaFlex dict (see `writer`; LiteRT is refused).

    Raises:
        ValueError: with the reason.
        keras_vit.extras.MissingPackageError: with the package and the command that installs it.
    """
    _check_format(backend, format, quantize, batch_size, served_kind(any_size, naflex))


def _check_format(backend, format, quantize, batch_size, served):
    """`check_format` of the artefact's input `served` (a `keras_vit.export.inputs.ServedInput`)."""
    if format not in FORMATS:
        raise ValueError(f"unknown export format {format!r}; expected one of {', '.join(FORMATS)}")
    if format in served.refused:
        takes = [f for f in FORMATS if f not in served.refused]
        raise ValueError(f"{served.described} cannot be exported to {format}: {served.refused[format]}; expected one "
                         f"of {', '.join(takes)}")
    if quantize is not None:
        if quantize not in QUANTIZATIONS:
            raise ValueError(f"unknown quantization {quantize!r}; expected one of {', '.join(QUANTIZATIONS)}")
        if format != "onnx":
            raise ValueError(f"--quantize {quantize} applies to onnx (onnxruntime's quantization), not {format}; "
                             "Keras' own model.quantize('int8') makes smaller .keras files")
    writes = _writer(backend, format, batch_size, served)
    subject = None
    if writes != backend:
        why = THROUGH_TENSORFLOW.get((backend, format)) or served.through_tensorflow[backend, format]
        subject = (f"{format} from the {backend} backend{served.phrase}, written from the TensorFlow backend in a "
                   f"separate process ({why}),")
        require("writing in a TensorFlow process", subject)  # TensorFlow itself, then what it writes with
    require(f"writing {format} from the {writes} backend", subject)


def artefact(out, format):
    """The path of the exported file (or SavedModel folder) inside the output folder `out`.

    Args:
        out: the output folder of `export`.
        format: one of FORMATS: a SavedModel is the folder itself, the other formats a file in it
            (FILES).
    """
    return os.path.join(out, FILES[format]) if format in FILES else out
