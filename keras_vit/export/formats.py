"""Which formats there are, which backend writes each (`writer`), and what cannot be exported (`check_format`)."""

import os

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
# (backend, format) pairs whose exporter writes a fixed image size only, and why: an artefact of a model that
# takes any size (input shape (None, None, 3)) is written from the TensorFlow backend in a fresh process
# instead, whose exporters keep the height and width as they are (README's any-size table)
THROUGH_TENSORFLOW_ANY_SIZE = {
    ("jax", "onnx"): "jax2onnx 0.17 traces jnp.arange over a size known only when run as a placeholder, which the "
                     "position embeddings' resize takes",
    ("torch", "onnx"): "Keras' ops take torch.export's symbolic sizes for no dtype (a SymInt), which the position "
                       "embeddings' resize takes",
    ("torch", "litert"): "litert-torch 0.10 lowers fixed shapes only",
}
# (backend, format) pairs whose exporter cannot write a NaFlex model (`keras_vit.naflex`: a dict of patches,
# their coordinates and validity, of any batch and sequence length), and why: written from the TensorFlow
# backend in a fresh process instead (the pairs of THROUGH_TENSORFLOW too)
THROUGH_TENSORFLOW_NAFLEX = {
    ("jax", "onnx"): "jax2onnx 0.17 gives a concatenation along the symbolic sequence length (the prefix tokens, "
                     "then the n patches) the shape of its first part, and bakes that length into the reshapes "
                     "after",
}
# formats no backend writes for a NaFlex model, and why (refused by check_format before anything is written)
NAFLEX_REFUSED = {
    "litert": "TensorFlow's LiteRT converter leaves the slices that add an axis to the NaFlex arrays, whose batch and "
              "sequence length are known only when run, as TensorFlow ops (FlexStridedSlice), which the LiteRT "
              "interpreter does not run",
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
    import importlib.util

    if naflex and (backend, format) in THROUGH_TENSORFLOW_NAFLEX:
        return "tensorflow"
    if any_size and (backend, format) in THROUGH_TENSORFLOW_ANY_SIZE:
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
    if format not in FORMATS:
        raise ValueError(f"unknown export format {format!r}; expected one of {', '.join(FORMATS)}")
    if naflex and format in NAFLEX_REFUSED:
        takes = [f for f in FORMATS if f not in NAFLEX_REFUSED]
        raise ValueError(f"a NaFlex model (patches, patch_coord, patch_valid in) cannot be exported to {format}: "
                         f"{NAFLEX_REFUSED[format]}; expected one of {', '.join(takes)}")
    if quantize is not None:
        if quantize not in QUANTIZATIONS:
            raise ValueError(f"unknown quantization {quantize!r}; expected one of {', '.join(QUANTIZATIONS)}")
        if format != "onnx":
            raise ValueError(f"--quantize {quantize} applies to onnx (onnxruntime's quantization), not {format}; "
                             "Keras' own model.quantize('int8') makes smaller .keras files")
    writes = writer(backend, format, batch_size, any_size, naflex)
    subject = None
    if writes != backend:
        why = THROUGH_TENSORFLOW.get((backend, format)) or (naflex and THROUGH_TENSORFLOW_NAFLEX.get((backend, format))) \
            or THROUGH_TENSORFLOW_ANY_SIZE[backend, format]
        what = " at any image size" * any_size + " of a NaFlex model" * naflex
        subject = (f"{format} from the {backend} backend{what}, written from the TensorFlow backend in a separate "
                   f"process ({why}),")
        require("writing in a TensorFlow process", subject)  # TensorFlow itself, then what it writes with
    require(f"writing {format} from the {writes} backend", subject)


def takes_any_size(model):
    """Whether `model` takes images of any height or width (built with `input_shape=(None, None, 3)`);
    False for a NaFlex model, which takes patches (`keras_vit.naflex`)."""
    from keras_vit.naflex import is_naflex

    return not is_naflex(model) and None in tuple(model.input_shape[1:3])


def artefact(out, format):
    """The path of the exported file (or SavedModel folder) inside the output folder `out`.

    Args:
        out: the output folder of `export`.
        format: one of FORMATS: a SavedModel is the folder itself, the other formats a file in it
            (FILES).
    """
    return os.path.join(out, FILES[format]) if format in FILES else out
