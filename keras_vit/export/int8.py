"""int8 quantization of an ONNX file by onnxruntime, dynamic or calibrated on a folder of images."""

import errno
import os
import shutil

import numpy as np

from keras_vit.fileio import check_free_space, full_disk_named

# images read from a calibration folder for static int8 quantization, at most
CALIBRATION_LIMIT = 1000


def calibration_images(folder, image_size):
    """The readable images of `folder` (at most CALIBRATION_LIMIT, sorted by name) as uint8 (N, h, w, 3).

    Raises ValueError when the folder holds none.

    Args:
        folder: a folder of images (files that are not images, and sub-folders, are skipped).
        image_size: int or (h, w), the model's input size: each image is read as RGB and resized
            (bicubic) to it.

    Returns:
        A numpy uint8 array (N, h, w, 3), the `calibration` of `export`.
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


def check_calibration(calibration, image_size=None):
    """Raises ValueError unless `calibration` is what static int8 quantization reads: a numpy uint8 array
    of images (N, h, w, 3), N >= 1, of the artefact's `image_size` (h, w) (None: any size).

    Args:
        calibration: the images given to `export(..., calibration=...)`.
        image_size: (h, w) the artefact takes, or None for an artefact that takes any size.
    """
    if not isinstance(calibration, np.ndarray):
        raise ValueError(f"calibration must be a numpy array of uint8 images (N, h, w, 3), got "
                         f"{type(calibration).__name__}; calibration_images(folder, size) reads a folder into one")
    if calibration.dtype != np.uint8:
        raise ValueError(f"calibration images must be uint8 (0-255), as the artefact takes them; got {calibration.dtype}")
    h, w = image_size or ("h", "w")
    fits = calibration.ndim == 4 and calibration.shape[-1] == 3 \
        and (image_size is None or tuple(calibration.shape[1:3]) == tuple(image_size))
    if not fits:
        raise ValueError(f"calibration images must have shape (N, {h}, {w}, 3), got {calibration.shape}")
    if not len(calibration):
        raise ValueError("calibration holds no images (N = 0); give a few hundred")


def _quantize_int8(path, calibration, shown=None):
    """Replaces the float ONNX file at `path` by its int8 quantization (dynamic, or static with
    `calibration` images): the matrix products of a weight, per output channel for static. The
    attention's two products of activations (q k^T, and the weights times v) stay float32 either
    way (dynamic quantization only takes products of a weight): statically quantized, they changed
    the class of 1 of the demo model's 224 test digits (benchmarks/README.md).

    A full disk, foreseen (less free than `_int8_needed`) or met while writing, is one OSError(ENOSPC)
    naming the file (`shown`: the path a user knows it by, `path` by default) and its filesystem
    (`keras_vit.fileio.check_free_space`), the float file left as it was and nothing else of the step
    kept; any other failure a ValueError."""
    what = f"the int8 quantization of {shown or path}"
    source = path + ".float32.onnx"
    os.replace(path, source)
    needed = _int8_needed(source)
    # a partial file's free space is worded after the file is gone (full_disk_named outside the cleanup)
    with full_disk_named(path, what):
        try:
            check_free_space(path, needed, what)
            _quantize(source, path, calibration)
        except BaseException as err:
            # onnxruntime's shape inference (C++) writes its copy on a full disk cut short, without an error:
            # a disk left with less room than the step takes is taken for the cause of the failure it gives
            filled = isinstance(err, Exception) and shutil.disk_usage(os.path.dirname(path)).free < needed
            for leftover in (path, _inferred_copy(source)):
                if os.path.exists(leftover):
                    os.remove(leftover)
            os.replace(source, path)  # the float32 file back where it was
            if not isinstance(err, Exception) or getattr(err, "errno", None) == errno.ENOSPC:
                raise
            if filled:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path) from err
            first = (str(err).strip().splitlines() or [""])[0][:300]
            raise ValueError(f"could not quantize {path} to int8 (expected an ONNX file of a model; the file is left "
                             f"as it was): {type(err).__name__}: {first}") from err
    os.remove(source)


def _inferred_copy(source):
    """The shape-inferred copy of the float file `source` that onnxruntime's quantizers write beside it
    (and remove once read): "model.onnx.float32-inferred.onnx"."""
    stem, suffix = os.path.splitext(source)
    return f"{stem}-inferred{suffix}"


def _int8_needed(source):
    """The bytes the int8 step takes beside the float file `source` at its peak: as much again, for the
    shape-inferred copy onnxruntime writes first (`_inferred_copy`); the int8 file, written after that copy
    is removed, is smaller (a quarter of the matrix products' weights, and the rest as it was)."""
    return os.path.getsize(source)


def _quantize(source, path, calibration):
    """onnxruntime's int8 quantization of the float ONNX file `source`, written to `path`."""
    import onnx
    from onnxruntime import quantization as q

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


class _Calibration:
    """onnxruntime's CalibrationDataReader over uint8 images, one batch of 1 at a time."""

    def __init__(self, name, images):
        self.name = name  # the model's input
        self.images = iter(images)

    def get_next(self):
        image = next(self.images, None)
        return None if image is None else {self.name: image[None]}
