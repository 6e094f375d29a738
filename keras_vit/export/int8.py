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
