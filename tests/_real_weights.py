"""The comparisons and ONNX files of tests/test_real_weights.py (kept apart so that it stays under 450 lines)."""

import os

import numpy as np
import pytest


def agreement(ours, theirs):
    """(smallest cosine of an image's two representations, share of images whose nearest other image
    is the same under both)."""
    ours, theirs = (v.astype(np.float64) for v in (ours, theirs))
    cosine = np.sum(ours * theirs, -1) / np.linalg.norm(ours, axis=-1) / np.linalg.norm(theirs, axis=-1)

    def nearest(v):
        unit = v / np.linalg.norm(v, axis=-1, keepdims=True)
        sim = unit @ unit.T
        np.fill_diagonal(sim, -np.inf)
        return sim.argmax(-1)

    return float(cosine.min()), float(np.mean(nearest(ours) == nearest(theirs)))


def float_onnx(model, tmp_path_factory):
    """`model` exported once as float ONNX (ImageNet scaling inside), read by the tests of the float file and
    of its int8 quantization: an export of these weights is minutes of tf2onnx on the 2-core CI machine."""
    from keras_vit.export import export

    pytest.importorskip("onnxruntime")
    return export(model, tmp_path_factory.mktemp("float_onnx") / "out", "onnx", input_mode="imagenet")


def int8_of(float_path, tmp_path, calibration):
    """A copy of the float ONNX file at `float_path` quantized to int8 (dynamic, or static with `calibration`)
    by the step `export(..., quantize="int8")` ends with (tests/test_export.py runs that whole call)."""
    import shutil

    from keras_vit.export.int8 import _quantize_int8

    path = str(tmp_path / os.path.basename(float_path))
    shutil.copyfile(float_path, path)
    _quantize_int8(path, calibration)
    return path
