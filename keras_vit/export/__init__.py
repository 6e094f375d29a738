"""Serving artefacts (`keras-vit export`): the model behind a signature that takes uint8 images of
any batch size, preprocessing included, exported to a folder that appears only once complete.

Every backend writes every format. Keras' `model.export` writes most of them; ONNX from torch goes
through torch's dynamo-based exporter directly (Keras' path for a dynamic batch, the TorchScript
exporter, fails on LayerNorm), and LiteRT from torch at a fixed batch through litert-torch where it
is installed. What no exporter of a backend writes (THROUGH_TENSORFLOW) is written from the
TensorFlow backend in a fresh process, from the model saved as `.keras`: the weights and the
computation are the same in every backend. Every ONNX file is then rewritten to run faster
(`_optimize_onnx`), and can be quantized to int8 by onnxruntime's tools (see `export`).

A NaFlex model (`keras_vit.naflex`) is exported behind its own input instead of images: the dict of
patches, their coordinates and their validity, of any batch and sequence length, to ONNX or a
SavedModel (`export`; LiteRT is refused, NAFLEX_REFUSED); `run` and `compare` take that dict.

The class names of a model that has them (`model.class_names`) travel with every artefact, whichever
backend wrote it: a `class_names.txt` (CLASS_NAMES_FILE) in the output folder (a SavedModel's in its
`assets/`), and an ONNX file's metadata too (key ONNX_CLASS_NAMES_KEY); `read_class_names` reads them back.

One file a concern: `inputs` (what the artefact takes: images of the model's size, of any size, or a
NaFlex batch, decided once per `export` and carried to the rest), `formats` (which backend writes what),
`serving` (the signature), `writers` (in process), `through_tensorflow` (the fresh process),
`onnx_rewrites`, `int8`, `labels` (the class names), `runtimes` (run, compare).
"""

import os

from keras_vit.export.formats import (FILES, FORMATS, LITERT_TORCH_INSTALL, QUANTIZATIONS, THROUGH_TENSORFLOW,
                                     _check_format, _writer, artefact, check_format, writer)
from keras_vit.export.inputs import (NAFLEX_REFUSED, THROUGH_TENSORFLOW_ANY_SIZE, THROUGH_TENSORFLOW_NAFLEX,
                                    check_resize_to, served_input, takes_any_size)
from keras_vit.export.int8 import CALIBRATION_LIMIT, _quantize_int8, calibration_images, check_calibration
from keras_vit.export.labels import (CLASS_NAMES_FILE, ONNX_CLASS_NAMES_KEY, _attach_class_names, check_line_names,
                                     read_class_names)
from keras_vit.export.onnx_rewrites import FOLD_LIMIT
from keras_vit.export.runtimes import compare, run
from keras_vit.export.serving import CLASS_OUTPUTS, output_name, serving_model
from keras_vit.export.through_tensorflow import _through_tensorflow
from keras_vit.export.writers import _write
from keras_vit import writer_lock
from keras_vit.fileio import atomic_folder, check_free_space, check_writable, weights_file_bytes

__all__ = [
    "export",
    "check_format",
    "writer",
    "artefact",
    "serving_model",
    "check_resize_to",
    "output_name",
    "calibration_images",
    "check_calibration",
    "run",
    "compare",
    "read_class_names",
    "FORMATS",
    "QUANTIZATIONS",
    "FILES",
    "THROUGH_TENSORFLOW",
    "THROUGH_TENSORFLOW_ANY_SIZE",
    "THROUGH_TENSORFLOW_NAFLEX",
    "NAFLEX_REFUSED",
    "takes_any_size",
    "LITERT_TORCH_INSTALL",
    "CALIBRATION_LIMIT",
    "CLASS_OUTPUTS",
    "FOLD_LIMIT",
    "CLASS_NAMES_FILE",
    "ONNX_CLASS_NAMES_KEY",
]


def export(model, out, format="tf_saved_model", top_k=None, batch_size=None, quantize=None, calibration=None,
           input_mode="vit", resize_to=None):
    """Exports `serving_model(model, top_k, input_mode)` as `format` into the new folder `out`; returns the
    artefact's path. `input_mode` is the scaling the model's weights were trained with (a
    `keras_vit.preprocess_input` mode: "vit", "imagenet", "clip"), done inside the artefact.

    Written into a temporary folder beside `out` and renamed into place when complete; `out` must
    not exist yet. `batch_size` fixes the batch dimension; None keeps it dynamic. A model that takes
    any image size (`input_shape=(None, None, 3)`) gives an artefact that takes any height and width
    divisible by its patch (times a hybrid's stride; any, cut to whole patches, for a model built with
    `crop_to_patches=True`), the position embeddings resized inside it by
    the model's own rule. The pairs of THROUGH_TENSORFLOW (and, for a model of any size, of
    THROUGH_TENSORFLOW_ANY_SIZE) are written from the TensorFlow backend in a fresh process (`writer`).

    A NaFlex model (`keras_vit.naflex(model)`) is exported to "onnx" or "tf_saved_model" behind its own
    input, no images (`serving_model`): the dict of "patches" (B, N, P * P * C) float32 (uint8 for a
    model built with `input_dtype="uint8"`), "patch_coord" (B, N, 2) int32 and "patch_valid" (B, N)
    bool, the inputs of the artefact named so, B and N any (B fixed by `batch_size`); it outputs what
    the Keras model outputs, and the top k with `top_k`. `input_mode`, `resize_to` and
    `calibration` act on images and are refused for it, and so is "litert" (NAFLEX_REFUSED says
    why); the pairs of THROUGH_TENSORFLOW_NAFLEX are written from the TensorFlow backend in a fresh
    process.

    `quantize="int8"` (ONNX only) quantizes the exported file with onnxruntime: the matrix products'
    weights and activations in int8, dynamically (activation ranges measured per call), or
    statically with `calibration`, uint8 images (N, h, w, 3) whose activation ranges are fixed
    into the file (see `calibration_images`).

    A model with class names (`model.class_names`) gives an artefact that carries them, every format
    from every backend: `class_names.txt` (one name a line, UTF-8) beside an ONNX or LiteRT file and
    in a SavedModel's `assets/` folder, and in an ONNX file's metadata (`metadata_props`, key
    ONNX_CLASS_NAMES_KEY, a JSON list); `read_class_names(path)` reads them back. An ONNX file's
    dimensions of unknown size are named: "batch", "height" and "width" of the images ("tokens" of a
    NaFlex model's sequences), "batch" of the outputs.

    Args:
        model: the Keras model to export (a classifier, a projection or a backbone), or a NaFlex
            copy of one (`keras_vit.naflex`).
        out: the output folder (str or path-like), which must not exist yet.
        format: one of FORMATS: "tf_saved_model" (the default), "onnx" or "litert".
        top_k: None, or the number of best classes to output beside the probabilities
            (classifiers only), as `serving_model` does.
        batch_size: the fixed batch dimension of the artefact, or None (dynamic).
        quantize: None, or "int8" (ONNX only).
        calibration: None (dynamic int8), or uint8 images (N, h, w, 3) for static int8.
        input_mode: the scaling the model's weights were trained with, a
            `keras_vit.preprocess_input` mode: "vit", "imagenet" or "clip".
        resize_to: None, or an int or (h, w): the artefact takes images of any height and width
            and resizes them to this size inside (bicubic, antialiased; see `serving_model`).

    Returns:
        The artefact's path inside `out` (see `artefact`).

    Raises:
        ValueError: a format or quantization that cannot be exported (`check_format`; LiteRT of a
            NaFlex model), `calibration` without `quantize`, or `input_mode`, `resize_to` or
            `calibration` for a NaFlex model, a class name holding a line break; before anything is
            written.
        FileExistsError: `out` exists.
        RuntimeError: the fresh TensorFlow process failed, with its last error line.
    """
    import keras

    backend = keras.backend.backend()
    served = served_input(model, resize_to)  # what the artefact takes, decided here once and carried
    _check_format(backend, format, quantize, batch_size, served)
    if calibration is not None and quantize is None:
        raise ValueError("calibration images are for quantize='int8'")
    served.check(model, input_mode, calibration)
    names = getattr(model, "class_names", None)
    if names is not None:
        check_line_names(names)
    out = os.path.abspath(os.fspath(out))
    if os.path.exists(out):
        raise FileExistsError(f"{out} already exists; export writes a new folder (remove it or pick another)")
    out = check_writable(out, "the export folder", folder=True)  # a read-only or blocked place, by name
    # an artefact holds the weights (a quantized one less): a full disk refused before any writer starts
    check_free_space(out, weights_file_bytes(model), f"the {format} artefact {out}")
    # one export writes `out` at a time (its lock beside it); written in a temporary folder beside `out`,
    # renamed into place when complete, removed on failure (and, if this process is killed, by the next export)
    with writer_lock.hold(out), atomic_folder(out) as tmp:
        path = artefact(tmp, format)
        if _writer(backend, format, batch_size, served) == backend:
            _write(model, path, format, top_k, batch_size, input_mode, served)
        else:
            _through_tensorflow(model, path, format, top_k, batch_size, input_mode, served)
        if quantize:  # a full disk there is one OSError(ENOSPC) naming the artefact, and removes the folder
            _quantize_int8(path, calibration, artefact(out, format))
        if names is not None:  # in the temporary folder: they appear with the artefact, whoever wrote it
            _attach_class_names(path, format, names)
    return artefact(out, format)
