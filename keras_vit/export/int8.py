"""int8 quantization of an ONNX file by onnxruntime, dynamic or calibrated on a folder of images."""

import os

import numpy as np

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


def _quantize_int8(path, calibration):
    """Replaces the float ONNX file at `path` by its int8 quantization (dynamic, or static with
    `calibration` images): the matrix products of a weight, per output channel for static. The
    attention's two products of activations (q k^T, and the weights times v) stay float32 either
    way (dynamic quantization only takes products of a weight): statically quantized, they changed
    the class of 1 of the demo model's 224 test digits (benchmarks/README.md)."""
    source = path + ".float32.onnx"
    os.replace(path, source)
    try:
        _quantize(source, path, calibration)
    except BaseException as err:
        if os.path.exists(path):
            os.remove(path)
        os.replace(source, path)  # the float32 file back where it was
        if not isinstance(err, Exception):
            raise
        first = (str(err).strip().splitlines() or [""])[0][:300]
        raise ValueError(f"could not quantize {path} to int8 (expected an ONNX file of a model; the file is left as "
                         f"it was): {type(err).__name__}: {first}") from err
    os.remove(source)


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
