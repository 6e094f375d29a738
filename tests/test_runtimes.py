"""keras_vit.export.run keeps an artefact loaded while its file is unchanged, and loads a rewritten one again."""

import numpy as np
import pytest

from keras_vit.export import runtimes


def _onnx_file(path, scale):
    """A .onnx file whose graph takes uint8 images (N, h, w, 3) and returns them as float32 times `scale`."""
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Cast", ["images"], ["floats"], to=TensorProto.FLOAT),
         helper.make_node("Mul", ["floats", "scale"], ["features"])],
        "scaled", [helper.make_tensor_value_info("images", TensorProto.UINT8, ["N", "h", "w", 3])],
        [helper.make_tensor_value_info("features", TensorProto.FLOAT, ["N", "h", "w", 3])],
        [helper.make_tensor("scale", TensorProto.FLOAT, [], [scale])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return str(path)


@pytest.mark.backend_independent
def test_run_loads_an_artefact_once_and_a_rewritten_one_again(tmp_path):
    """Two calls on one file share one onnxruntime session; the file rewritten in place (another graph) is
    loaded again, so its own outputs come back, never the old file's."""
    pytest.importorskip("onnxruntime")
    images = np.arange(2 * 4 * 4 * 3, dtype=np.uint8).reshape(2, 4, 4, 3)
    path = _onnx_file(tmp_path / "a.onnx", 2.0)
    first = runtimes.run(path, "onnx", images)["features"]
    session = runtimes._loaded(path, "onnx")
    np.testing.assert_array_equal(runtimes.run(path, "onnx", images[:1])["features"], first[:1])
    assert runtimes._loaded(path, "onnx") is session  # no second load
    np.testing.assert_array_equal(first, images.astype(np.float32) * 2)
    _onnx_file(tmp_path / "a.onnx", 3.0)  # the same name, another graph
    np.testing.assert_array_equal(runtimes.run(path, "onnx", images)["features"], images.astype(np.float32) * 3)
    assert runtimes._loaded(path, "onnx") is not session
