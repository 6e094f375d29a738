"""Serving artefacts run in their own runtimes (TensorFlow's loader, onnxruntime, the LiteRT
interpreter) on real photographs give the Keras model's probabilities and top-k."""

import importlib.util
import os

import keras
import numpy as np
import pytest

import keras_vit
from conftest import TINY, photos as _photos, tensorflows_file
from keras_vit.export import FORMATS, THROUGH_TENSORFLOW, artefact, export, read_class_names, run, writer
from keras_vit.extras import MissingPackageError

BACKEND = keras.backend.backend()
RUNTIMES = {"tf_saved_model": "tensorflow", "onnx": "onnxruntime", "litert": "ai_edge_litert"}
# the class names the model carries (`model.class_names`), one not ASCII, one with a space
CLASS_NAMES = ("café", "sea lion", *(f"c{i}" for i in range(2, TINY["classes"])))


def _runtime_or_skip(format):
    pytest.importorskip(RUNTIMES[format])
    if writer(BACKEND, format) != BACKEND:
        pytest.importorskip("tensorflow")  # writes it in a fresh process


def _erf_once(request, format=None):
    """The erf GELU's model where its form reaches a writer of this lane: `format` written by this backend
    (TensorFlow writes the others in a fresh process, with both forms on its own lane), or on jax the
    backend-independent steps (int8 over the file, the CLI)."""
    if "erf_gelu" not in request.node.callspec.id:
        return
    if format is not None and tensorflows_file(format):
        pytest.skip(f"{format} from {BACKEND} is TensorFlow's file: the erf GELU's is checked on the tensorflow lane")
    if format is None and BACKEND != "jax":
        pytest.skip("the erf GELU's export is checked above; the steps over the file once, on jax")


# the official tanh GELU, and the exact erf form of every timm and Hugging Face checkpoint
@pytest.fixture(scope="module", params=[True, False], ids=["tanh_gelu", "erf_gelu"])
def model(request):
    m = keras_vit.VisionTransformer(**TINY, approximate_gelu=request.param)
    for i, var in enumerate(m.weights):  # a head and embeddings that spread the probabilities
        var.assign(np.random.default_rng(i).normal(0, 0.3, var.shape).astype("float32"))
    m.class_names = CLASS_NAMES
    return m


def _onnx_dimensions(path):
    """{input or output name: its dimensions, a name or a size each} of an ONNX file."""
    import onnx

    graph = onnx.load(path).graph
    return {v.name: [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim]
            for v in [*graph.input, *graph.output]}


@pytest.mark.parametrize("format", FORMATS)
def test_artefact_in_its_runtime_equals_keras_on_photos(format, model, tmp_path, request):
    """Every format from every backend: what the backend's exporters cannot write (jax: litert; torch:
    tf_saved_model, litert of any batch) comes from the TensorFlow backend in a fresh process."""
    _erf_once(request, format)
    photos = _photos((TINY["image_size"], TINY["image_size"]))
    _runtime_or_skip(format)
    expected = keras.ops.convert_to_numpy(model(keras_vit.preprocess_input(photos.astype("float32"))))
    path = export(model, tmp_path / "out", format, top_k=3)
    assert path == artefact(str(tmp_path / "out"), format)
    assert os.listdir(tmp_path) == ["out"]  # no temp folder left
    # the class names travel with the artefact, whoever wrote it: a SavedModel's asset, the file beside the others
    names = tmp_path / "out" / ("assets" if format == "tf_saved_model" else "") / "class_names.txt"
    assert names.read_text(encoding="utf-8") == "".join(f"{n}\n" for n in CLASS_NAMES)
    assert read_class_names(path) == CLASS_NAMES
    if format == "onnx":  # in its metadata too, and dimensions named
        import onnx

        assert {p.key: p.value for p in onnx.load(path).metadata_props}["class_names"] == \
            '["café", "sea lion", ' + ", ".join(f'"{n}"' for n in CLASS_NAMES[2:]) + "]"
        assert _onnx_dimensions(path) == {"images": ["batch", 32, 32, 3], "probabilities": ["batch", 10],
                                          "top_k_classes": ["batch", 3], "top_k_scores": ["batch", 3]}
    for n in (1, 3):  # one file, any batch size
        got = run(path, format, photos[:n])
        np.testing.assert_allclose(got["probabilities"], expected[:n], atol=1e-4, rtol=0)
        np.testing.assert_array_equal(got["top_k_classes"], np.argsort(-expected[:n], axis=-1)[:, :3])
        np.testing.assert_allclose(got["top_k_scores"], np.sort(expected[:n], axis=-1)[:, ::-1][:, :3], atol=1e-4)
    assert expected.max() - expected.min() > 0.05  # the photos give distinct probabilities


@pytest.mark.skipif(BACKEND != "torch", reason="litert-torch converts torch modules")
def test_litert_from_torch_at_a_fixed_batch_through_litert_torch(model, tmp_path, request):
    """One file per batch size (1 and 3) of the tanh GELU's model; the erf GELU's, whose fact is its ops, at 3."""
    if importlib.util.find_spec("litert_torch") is None:
        # not "could not import" (a failure under CI=true): the export extra does not install it
        pytest.skip("litert-torch is not installed (outside the export extra; README: Serving)")
    pytest.importorskip("ai_edge_litert")
    assert writer("torch", "litert", batch_size=1) == "torch" and writer("torch", "litert") == "tensorflow"
    photos = _photos((TINY["image_size"], TINY["image_size"]))
    expected = keras.ops.convert_to_numpy(model(keras_vit.preprocess_input(photos.astype("float32"))))
    sizes = (3,) if "erf_gelu" in request.node.callspec.id else (1, 3)
    for n in sizes:  # one file per batch size
        got = run(export(model, tmp_path / f"out{n}", "litert", top_k=3, batch_size=n), "litert", photos[:n])
        np.testing.assert_allclose(got["probabilities"], expected[:n], atol=1e-4, rtol=0)
        np.testing.assert_array_equal(got["top_k_classes"], np.argsort(-expected[:n], axis=-1)[:, :3])
    assert sorted(os.listdir(tmp_path)) == [f"out{n}" for n in sizes]


def test_unknown_format_and_an_existing_folder_write_nothing(model, tmp_path):
    with pytest.raises(ValueError, match="unknown export format 'pickle'; expected one of tf_saved_model, onnx, litert"):
        export(model, tmp_path / "a", "pickle")
    (tmp_path / "taken").mkdir()
    with pytest.raises(FileExistsError, match="already exists"):
        export(model, tmp_path / "taken", "onnx")
    try:  # names read from a file with Windows' line ends: class_names.txt could not keep them
        model.class_names = ["café\r", *CLASS_NAMES[1:]]
        with pytest.raises(ValueError, match=r"^class name 'café\\r' holds a line break, which class_names.txt"):
            export(model, tmp_path / "b", "onnx")
    finally:
        model.class_names = CLASS_NAMES
    assert sorted(os.listdir(tmp_path)) == ["taken"]
    assert read_class_names(tmp_path / "taken") is None
    with pytest.raises(FileNotFoundError, match="no artefact at"):
        read_class_names(tmp_path / "b")


@pytest.mark.backend_independent
def test_formats_written_through_tensorflow_need_it_installed(monkeypatch):
    """Each backend writes its own formats in process; the rest need TensorFlow, refused in one line
    naming the install when it is missing."""
    from keras_vit.export import check_format

    assert {(b, f) for b in ("tensorflow", "jax", "torch") for f in FORMATS if writer(b, f) != b} \
        == set(THROUGH_TENSORFLOW) == {("jax", "litert"), ("torch", "tf_saved_model"), ("torch", "litert")}
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "tensorflow" else real(name, *a))
    for backend, format in THROUGH_TENSORFLOW:
        with pytest.raises(MissingPackageError, match=rf"^{format} from the {backend} backend, written from the "
                           r"TensorFlow backend in a separate process \(.+\), needs tensorflow, which is not installed: "
                           r'pip install "keras-vit\[tensorflow\]"$'):
            check_format(backend, format)
    check_format("jax", "onnx")  # written in process: no TensorFlow needed


@pytest.mark.parametrize("format", FORMATS)
def test_interrupted_export_leaves_no_folder(format, model, tmp_path, monkeypatch):
    import keras_vit.export

    def interrupted(self, path, *args, **kwargs):  # every writer: half a file, then Ctrl-C
        os.makedirs(os.path.dirname(path), exist_ok=True)
        open(path if path.endswith((".onnx", ".tflite")) else os.path.join(path, "part"), "w").write("half")
        raise KeyboardInterrupt

    monkeypatch.setattr(keras.Model, "export", interrupted)
    monkeypatch.setattr(keras_vit.export.writers, "_torch_onnx", interrupted)
    monkeypatch.setattr(keras_vit.export.writers, "_torch_litert", interrupted)
    monkeypatch.setattr(keras_vit.export, "_through_tensorflow", interrupted)
    with pytest.raises(KeyboardInterrupt):
        export(model, tmp_path / "out", format)
    assert os.listdir(tmp_path) == []


@pytest.mark.skipif(BACKEND == "tensorflow", reason="the TensorFlow backend writes every format itself")
def test_a_failed_export_through_tensorflow_names_the_cause_and_leaves_no_folder(tmp_path):
    """The fresh process reloads the model from `.keras` in safe mode: a layer it cannot find there
    (registered only in the caller's session) fails the export with the child's error, nothing written."""
    pytest.importorskip("tensorflow")
    format = next(f for b, f in THROUGH_TENSORFLOW if b == BACKEND)

    @keras.saving.register_keras_serializable(package="only_here")
    class Doubled(keras.layers.Layer):
        def call(self, x):
            return x * 2

    inputs = keras.Input((TINY["image_size"], TINY["image_size"], 3))
    unknown = keras.Model(inputs, keras_vit.VisionTransformer(**TINY)(Doubled()(inputs)))
    with pytest.raises(RuntimeError, match=rf"^writing {format} from the TensorFlow backend, in a fresh process that "
                       r"reloads the model from \.keras, failed \(exit 1\): .*Could not locate class 'Doubled'.*"
                       "only_here>Doubled"):
        export(unknown, tmp_path / "out", format)
    assert os.listdir(tmp_path) == []


@pytest.mark.skipif(BACKEND != "tensorflow", reason="tf2onnx converts the TensorFlow backend's graph")
def test_tf2onnx_optimizes_in_place_and_an_optimizer_that_raises_is_skipped_as_before(tmp_path, monkeypatch):
    """The ONNX export on TensorFlow runs tf2onnx's optimizers on the graph itself (catch_errors False: no
    copy of the graph before each); where one of them raises there, the file is written again as tf2onnx
    writes it by default (that optimizer skipped), equal to Keras, and the variable that asked for it is
    gone again."""
    optimizer = pytest.importorskip("tf2onnx.optimizer")
    optimize_graph, asked = optimizer.optimize_graph, []

    def raising_in_place(graph, catch_errors=True, optimizers=None):
        asked.append(catch_errors)
        if not catch_errors:
            raise RuntimeError("an optimizer that fails on this graph")
        return optimize_graph(graph, catch_errors, optimizers=optimizers)

    monkeypatch.setattr(optimizer, "optimize_graph", raising_in_place)
    photos, model = _photos((TINY["image_size"], TINY["image_size"])), keras_vit.VisionTransformer(**TINY)
    path = export(model, tmp_path / "out", "onnx")
    assert asked == [False, True] and "TF2ONNX_CATCH_ERRORS" not in os.environ
    expected = keras.ops.convert_to_numpy(model(keras_vit.preprocess_input(photos.astype("float32"))))
    np.testing.assert_allclose(run(path, "onnx", photos)["probabilities"], expected, atol=1e-4, rtol=0)


def test_export_cli_refuses_an_unknown_format_before_building(tmp_path, capsys):
    from keras_vit.cli import main

    assert main(["export", "--weights", "none", "--format", "tflite", "--out", str(tmp_path / "x")]) == 2
    assert "unknown export format 'tflite'" in capsys.readouterr().err
    assert os.listdir(tmp_path) == []


@pytest.mark.skipif(BACKEND != "tensorflow", reason="a SavedModel of dynamic height and width: the TensorFlow export")
def test_runtime_resolution_saved_model_takes_any_size(tmp_path):
    """A model of `image_size=None` exports with dynamic height and width (issue: any input)."""
    import tensorflow as tf

    m = keras_vit.VisionTransformer(**dict(TINY, image_size=None))
    for i, var in enumerate(m.weights):
        var.assign(np.random.default_rng(i).normal(0, 0.3, var.shape).astype("float32"))
    loaded = tf.saved_model.load(export(m, tmp_path / "any", "tf_saved_model"))
    for hw in ((32, 32), (48, 24)):
        photos = _photos(hw)
        expected = keras.ops.convert_to_numpy(m(keras_vit.preprocess_input(photos.astype("float32"))))
        np.testing.assert_allclose(loaded.serve(photos)["probabilities"].numpy(), expected, atol=1e-4, rtol=0)


@pytest.mark.parametrize("calibrated", [False, True], ids=["dynamic", "static"])
def test_int8_onnx_is_quantized_and_close_to_keras(calibrated, model, tmp_path, request):
    """onnxruntime's int8: dynamic (integer matrix products) or static (QDQ pairs from calibration
    images); on the tiny model the probabilities stay within 0.05 of float32's."""
    _erf_once(request)
    onnx = pytest.importorskip("onnx")
    pytest.importorskip("onnxruntime")
    photos = _photos((TINY["image_size"], TINY["image_size"]))
    calibration = np.concatenate([photos, photos[:, ::-1]]) if calibrated else None
    path = export(model, tmp_path / "int8", "onnx", quantize="int8", calibration=calibration)
    assert sorted(os.listdir(tmp_path / "int8")) == ["class_names.txt", "model.onnx"]
    assert read_class_names(path) == CLASS_NAMES  # the metadata of the quantized file
    assert _onnx_dimensions(path)["images"] == ["batch", 32, 32, 3]
    ops = {n.op_type for n in onnx.load(path).graph.node}
    assert ({"QuantizeLinear", "DequantizeLinear"} if calibrated else {"MatMulInteger", "DynamicQuantizeLinear"}) <= ops
    expected = keras.ops.convert_to_numpy(model(keras_vit.preprocess_input(photos.astype("float32"))))
    got = run(path, "onnx", photos)["probabilities"]
    np.testing.assert_allclose(got, expected, atol=0.05, rtol=0)


def _int8_copy(float_path, folder, calibration=None):
    """A copy in `folder` of the float ONNX file at `float_path`, quantized to int8 (static with `calibration`)."""
    import shutil

    from keras_vit.export.int8 import _quantize_int8

    folder.mkdir()
    path = str(folder / "model.onnx")
    shutil.copyfile(float_path, path)
    _quantize_int8(path, calibration)
    return path


def test_onnx_weights_are_folded_and_int8_quantizes_every_projection(tmp_path):
    """Kernels above the exporters' folding limit (8192 values, so every real ViT) become
    initializers: nothing is computed from constants alone at load time, and onnxruntime's int8
    quantizer, which only quantizes a MatMul whose weight is an initializer, quantizes all of them.
    On torch the attention's fused q/k/v matmul becomes three, with no slicing left; on JAX the
    projections' Einsum nodes become MatMul."""
    onnx = pytest.importorskip("onnx")
    pytest.importorskip("onnxruntime")
    m = keras_vit.VisionTransformer(**dict(TINY, hidden_size=64, mlp_dim=128))  # q/k/v kernels: 12,288 values
    for i, var in enumerate(m.weights):
        var.assign(np.random.default_rng(i).normal(0, 0.3, var.shape).astype("float32"))
    graph = onnx.load(export(m, tmp_path / "float", "onnx")).graph
    assert os.listdir(tmp_path / "float") == ["model.onnx"]  # a model without class names: none written
    assert read_class_names(tmp_path / "float" / "model.onnx") is None
    constants = {i.name for i in graph.initializer}
    assert [n.op_type for n in graph.node if n.input and all(i in constants for i in n.input if i)] == []
    weighted = [n for n in graph.node if n.op_type == "MatMul" and n.input[1] in constants]
    ops = [n.op_type for n in graph.node]
    # per block: q, k, v, out, MLP in and out (TensorFlow's graph keeps one q/k/v matmul, sliced after)
    per_block = 4 if BACKEND == "tensorflow" else 6
    assert len(weighted) == 2 + TINY["num_layers"] * per_block and "Einsum" not in ops  # + patches, head
    if BACKEND == "torch":
        assert "Split" not in ops and ops.count("Gather") == 1  # the class token's only
    photos = _photos((TINY["image_size"], TINY["image_size"]))
    expected = keras.ops.convert_to_numpy(m(keras_vit.preprocess_input(photos.astype("float32"))))
    np.testing.assert_allclose(run(str(tmp_path / "float" / "model.onnx"), "onnx", photos)["probabilities"],
                               expected, atol=1e-4, rtol=0)
    # the int8 step that export(..., quantize="int8") ends with, on copies of this float file (that whole call is
    # test_int8_onnx_is_quantized_and_close_to_keras's)
    int8 = [n.op_type for n in onnx.load(_int8_copy(tmp_path / "float" / "model.onnx", tmp_path / "int8")).graph.node]
    assert int8.count("MatMulInteger") == len(weighted) and int8.count("MatMul") == ops.count("MatMul") - len(weighted)
    # static: every product of a weight between QDQ pairs, the attention's products of activations float32
    static = onnx.load(_int8_copy(tmp_path / "float" / "model.onnx", tmp_path / "static", photos)).graph
    producer = {o: n.op_type for n in static.node for o in n.output}
    quantized = [n for n in static.node if n.op_type == "MatMul"
                 and [producer.get(i) for i in n.input] == ["DequantizeLinear"] * 2]
    assert len(quantized) == len(weighted) and len([n for n in static.node if n.op_type == "MatMul"]) == ops.count("MatMul")


@pytest.mark.backend_independent
def test_int8_bad_requests_are_refused_before_writing(tmp_path):
    from keras_vit.export import calibration_images, check_format

    with pytest.raises(ValueError, match="--quantize int8 applies to onnx"):
        check_format("tensorflow", "tf_saved_model", "int8")
    with pytest.raises(ValueError, match="unknown quantization 'int4'"):
        check_format("tensorflow", "onnx", "int4")
    (tmp_path / "calib").mkdir()
    (tmp_path / "calib" / "notes.txt").write_text("not an image")
    with pytest.raises(ValueError, match="holds no readable images"):
        calibration_images(str(tmp_path / "calib"), 32)
    assert sorted(os.listdir(tmp_path)) == ["calib"]


@pytest.fixture(scope="module")
def tiny_onnx(tmp_path_factory):
    """A TINY model's float ONNX file, exported once: what the writer leaves before the int8 step of the
    full-disk tests (whose fact is that step), copied by them instead of exporting the same file twice."""
    return export(keras_vit.VisionTransformer(**TINY), tmp_path_factory.mktemp("tiny_onnx") / "out", "onnx")


@pytest.mark.backend_independent
@pytest.mark.parametrize("when", ["foreseen", "while_writing"])
def test_a_full_disk_at_the_int8_step_is_one_oserror_and_leaves_no_folder(when, tiny_onnx, tmp_path, monkeypatch):
    """The int8 step finds no room: foreseen (what it takes more than is free), or met when onnxruntime has
    written part of the int8 file (ENOSPC injected there): one OSError(ENOSPC) naming the artefact, its
    filesystem and (foreseen) the space needed; no folder and no temporary left."""
    import errno
    import shutil

    pytest.importorskip("onnxruntime")
    import keras_vit.export.int8
    from onnxruntime.quantization.onnx_model import ONNXModel

    def written(model, path, *args):  # the writer's float file, as tiny_onnx's export wrote it
        os.makedirs(os.path.dirname(path), exist_ok=True)
        shutil.copyfile(tiny_onnx, path)

    monkeypatch.setattr(keras_vit.export, "_write", written)

    if when == "foreseen":
        monkeypatch.setattr(keras_vit.export.int8, "_int8_needed", lambda source: 2**60)
    else:
        def disk_fills(self, output_path, *args, **kwargs):
            with open(output_path, "wb") as f:
                f.write(self.model.SerializeToString()[:4096])
            raise OSError(errno.ENOSPC, "No space left on device", output_path)

        monkeypatch.setattr(ONNXModel, "save_model_to_file", disk_fills)
    out = tmp_path / "out"
    with pytest.raises(OSError) as failed:
        export(keras_vit.VisionTransformer(**TINY), out, "onnx", quantize="int8")
    message = str(failed.value)
    assert failed.value.errno == errno.ENOSPC and ("it needs about" in message) == (when == "foreseen")
    assert f"no space left for the int8 quantization of {out / 'model.onnx'}: " in message
    assert "MiB are free on the filesystem at /" in message and message.count("no space") == 1
    assert os.listdir(tmp_path) == []


def test_export_cli_writes_checks_and_reports_an_int8_onnx(model, tmp_path, capsys, request):
    from keras_vit.cli import main

    _erf_once(request)

    model.save(tmp_path / "tiny.keras")
    calibration = tmp_path / "calibration"
    calibration.mkdir()
    for i, photo in enumerate(_photos((40, 40))):
        keras.utils.save_img(calibration / f"{i}.png", photo)
    out = tmp_path / "int8"
    argv = ["export", "--weights", str(tmp_path / "tiny.keras"), "--format", "onnx", "--out", str(out),
            "--quantize", "int8", "--calibration", str(calibration)]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert f"wrote {out / 'model.onnx'} (" in printed and " MiB)" in printed
    assert "checked in onnxruntime against Keras on 2 random 32x32 images: output 'probabilities', max |difference|" in printed
    assert main(argv) == 2  # the folder exists now: refused, left as it was
    assert "already exists" in capsys.readouterr().err
    assert sorted(os.listdir(out)) == ["class_names.txt", "model.onnx"]  # the names kept in the .keras file
    assert read_class_names(out / "model.onnx") == CLASS_NAMES


def test_export_cli_bad_requests_name_what_works_and_write_nothing(model, tmp_path, capsys):
    from keras_vit.cli import main

    model.save(tmp_path / "tiny.keras")
    (tmp_path / "empty").mkdir()
    base = ["export", "--weights", str(tmp_path / "tiny.keras"), "--out", str(tmp_path / "x")]
    assert main([*base, "--format", "onnx", "--quantize", "int8", "--calibration", str(tmp_path / "empty")]) == 2
    assert "holds no readable images" in capsys.readouterr().err
    assert main([*base, "--format", "onnx", "--calibration", str(tmp_path / "empty")]) == 2
    assert "--calibration is for --quantize int8" in capsys.readouterr().err
    assert sorted(os.listdir(tmp_path)) == ["empty", "tiny.keras"]
