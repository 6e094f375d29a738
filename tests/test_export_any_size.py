"""Artefacts of a model that takes any image size (issue 35): every format from every backend takes uint8
images of any batch, height and width divisible by the patch, and equals the Keras model at four sizes
(square and not, smaller and larger than the trained grid, grids of odd and even sides), the position
embeddings resized inside the artefact by each rule; features at any size; bad sizes and dtypes refused."""

import os

import keras
import numpy as np
import pytest

import keras_vit
from conftest import TINY, outputs_of, tensorflows_file
from keras_vit.export import FORMATS, export, read_class_names, run, serving_model, takes_any_size

BACKEND = keras.backend.backend()
RUNTIMES = {"tf_saved_model": "tensorflow", "onnx": "onnxruntime", "litert": "ai_edge_litert"}
ARCH = {k: v for k, v in TINY.items() if k != "image_size"}  # /8 patches
ANY = dict(ARCH, image_size=32, input_shape=(None, None, 3))  # any size, position embeddings laid out for 32x32 (4x4)
# grids of 4x4 (the trained 32x32: no resize), 3x6 (fewer rows, more columns), 8x8 (square, larger) and 5x1 (odd
# sides, one column): square and not, smaller and larger, odd and even
SIZES = [(32, 32), (24, 48), (64, 64), (40, 8)]
# each format with another rule of the position embeddings' resize (ONNX with timm's antialiased bicubic,
# which ONNX's Resize expresses only from opset 18); ONNX's features run the two other rules
# (test_features_at_any_size_by_each_other_rule)
RULE = {"tf_saved_model": "bilinear", "onnx": "bicubic_antialias", "litert": "bicubic"}


# this backend's any-size ONNX is TensorFlow's file, written in a fresh process: the tensorflow lane checks that
# writer's graphs; here the hand-off is checked once (test_any_size_artefact_equals_keras_at_four_sizes[onnx])
TENSORFLOWS_ONNX = pytest.mark.skipif(tensorflows_file("onnx", any_size=True),
                                      reason=f"{BACKEND}'s any-size ONNX is written by TensorFlow: checked on its lane")


def _runtime_or_skip(format, any_size=True):
    pytest.importorskip(RUNTIMES[format])
    if tensorflows_file(format, any_size=any_size):
        pytest.importorskip("tensorflow")  # writes it in a fresh process


def _spread(model):
    """Random weights everywhere (the head too), so that the outputs differ between images and sizes."""
    for i, var in enumerate(model.weights):
        var.assign(np.random.default_rng(i).normal(0, 0.3, var.shape).astype("float32"))
    return model


def _images(hw, n=2, seed=0):
    return np.random.default_rng(seed).integers(0, 256, (n, *hw, 3), dtype=np.uint8)


def _keras(model, images):
    return outputs_of(model, keras_vit.preprocess_input(images.astype("float32")))


def _check_sizes(model, path, format, name, sizes, atol):
    """The artefact against Keras at each of `sizes`; returns Keras' outputs."""
    outputs = []
    for i, hw in enumerate(sizes):
        images = _images(hw, seed=i)
        expected, got = _keras(model, images), run(path, format, images)[name]
        assert got.shape == expected.shape, hw
        np.testing.assert_allclose(got, expected, atol=atol, rtol=0, err_msg=f"{format} at {hw}")
        outputs.append(expected)
    return outputs


@pytest.mark.parametrize("format", FORMATS)
def test_any_size_artefact_equals_keras_at_four_sizes(format, tmp_path):
    """Probabilities within 1e-5 and the top-k, any batch; a size that does not tile and a float image
    are refused by the runtime."""
    _runtime_or_skip(format)
    if tensorflows_file(format, any_size=True) and format != "onnx":
        pytest.skip(f"{BACKEND}'s any-size {format} is written by TensorFlow in a fresh process, as the tensorflow "
                    "lane writes it: the hand-off is checked here once, with ONNX")
    model = _spread(keras_vit.VisionTransformer(**ANY,
                                                position_interpolation=RULE[format]))
    assert takes_any_size(model)
    model.class_names = [f"class {i}" for i in range(10)]
    path = export(model, tmp_path / "out", format, top_k=3)
    assert read_class_names(path) == model.class_names  # with the artefact, whoever wrote it (TensorFlow's process)
    if format == "onnx":  # its dimensions named as a reader understands them, not tf2onnx's "unk__527"
        import onnx

        graph = onnx.load(path).graph
        assert {v.name: [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim]
                for v in [*graph.input, *graph.output]} == {
            "images": ["batch", "height", "width", 3], "probabilities": ["batch", 10],
            "top_k_classes": ["batch", 3], "top_k_scores": ["batch", 3]}
    spread = [expected.max() for expected in _check_sizes(model, path, format, "probabilities", SIZES, 1e-5)]
    assert max(spread) - min(spread) > 0.01  # the sizes give different outputs: the resize is tested
    for n in (1, 3):  # any batch
        images = _images((24, 40), n)
        got, expected = run(path, format, images), _keras(model, images)
        np.testing.assert_allclose(got["probabilities"], expected, atol=1e-5, rtol=0)
        np.testing.assert_array_equal(got["top_k_classes"], np.argsort(-expected, axis=-1)[:, :3])
    for hw in ((30, 32), (4, 8)):  # 30 rows do not tile into 8-pixel patches; 4 is less than one patch
        with pytest.raises(Exception, match="(?i)reshape|shape refinement") as bad:
            run(path, format, _images(hw))
        assert type(bad.value).__name__ in ("Fail", "InvalidArgumentError", "RuntimeError"), bad.value
    with pytest.raises(ValueError, match=r"an artefact takes uint8 images \(N, h, w, 3\) with values 0-255, got float64"):
        run(path, format, _images((32, 32)) / 255.0)
    assert os.listdir(tmp_path) == ["out"]


@TENSORFLOWS_ONNX
@pytest.mark.parametrize("pooling,rule", [(None, "bilinear"), ("representation", "bicubic")],
                         ids=["patch_features", "pooled"])
def test_features_at_any_size_by_each_other_rule(pooling, rule, tmp_path):
    """A backbone's (B, h, w, D) patch features (of the image's own grid) and its pooled representation, the
    position embeddings resized by the paper's bilinear and by Hugging Face's bicubic (timm's antialiased
    bicubic: the classifier's ONNX above): the interpolation matrices are computed inside the graph from the
    image's size, in operations ONNX has."""
    _runtime_or_skip("onnx")
    model = _spread(keras_vit.VisionTransformer(**ANY, include_top=False,
                                                pooling=pooling, position_interpolation=rule))
    path = export(model, tmp_path / "out", "onnx")
    _check_sizes(model, path, "onnx", "features", SIZES, 1e-4)
    if pooling is None:
        assert run(path, "onnx", _images((16, 64)))["features"].shape == (2, 2, 8, 32)
        import onnx

        dims = onnx.load(path).graph.output[0].type.tensor_type.shape.dim
        assert [d.dim_param or d.dim_value for d in dims] == ["batch", "grid_height", "grid_width", 32]


@pytest.mark.skipif(tensorflows_file("tf_saved_model", any_size=True),
                    reason=f"{BACKEND}'s any-size SavedModel is written by TensorFlow: checked on its lane")
def test_a_model_that_crops_to_patches_takes_any_size(tmp_path):
    """crop_to_patches (SigLIP so400m/14 at 384 px, issue 53): the SavedModel takes sides that are no multiple
    of the patch, cut to whole patches as the Keras model cuts them (jax: jax2tf's floor of a symbolic side)."""
    _runtime_or_skip("tf_saved_model")
    model = _spread(keras_vit.VisionTransformer(**ANY, crop_to_patches=True))
    path = export(model, tmp_path / "out", "tf_saved_model")
    _check_sizes(model, path, "tf_saved_model", "probabilities", [(36, 36), (30, 50), (32, 32)], 1e-5)


@TENSORFLOWS_ONNX
def test_hybrid_any_size_in_onnx(tmp_path):
    """A hybrid's tokens are 2 x 4 = 8 pixels (patch x ResNet stride): it takes any multiple of 8."""
    _runtime_or_skip("onnx")
    resnet = {"num_layers": (1,), "width_factor": 1}
    model = _spread(keras_vit.VisionTransformer(**dict(ARCH, patch_size=2), resnet=resnet, image_size=32,
                                                input_shape=(None, None, 3), include_top=False, pooling=None))
    assert model.get_layer("posembed_input").stride == 8
    path = export(model, tmp_path / "out", "onnx")
    _check_sizes(model, path, "onnx", "features", [(32, 32), (16, 48), (56, 40)], 1e-4)


# BEiT's relative table beside a learned 1-D one on a 4 x 7 grid resized bicubically (TensorFlow's converter made a
# clip of integers to [0, 6], the taps on 7 positions, a Relu6, which LiteRT runs on floats only), and timm's
# relative position MLP (ONNX has no log1p)
RELATIVE = {"beit": dict(ARCH, image_size=(32, 56), relative_position_bias=True, layer_scale=0.1,
                         position_interpolation="bicubic"),
            "relpos_mlp": dict(ARCH, image_size=32, position_embedding="none", relative_position_mlp=16)}


@pytest.mark.parametrize("format", FORMATS)
def test_relative_position_biases_in_any_size_artefacts(format, tmp_path):
    """A BEiT model and a relative-position-MLP model that take any size: each artefact this backend writes makes
    their biases for the grid of each call's images (jax: under jax2tf's symbolic sizes), equal to Keras."""
    _runtime_or_skip(format)
    if tensorflows_file(format, any_size=True):
        pytest.skip(f"{BACKEND}'s any-size {format} is written by TensorFlow: checked on its lane")
    for name, options in RELATIVE.items():
        model = _spread(keras_vit.VisionTransformer(**options, input_shape=(None, None, 3)))
        path = export(model, tmp_path / name, format)
        _check_sizes(model, path, format, "probabilities", [(32, 56), (48, 64), (40, 8)], 1e-5)


@pytest.mark.backend_independent
def test_any_size_refusals_name_what_was_expected(tmp_path, capsys):
    """Position embeddings that cannot be resized (Table 8's 2-D and relative variants) refuse any size
    by name, as the model does; the CLI checks --image-size against the token size before writing."""
    from keras_vit.cli import main

    for variant in ("learned_2d", "relative"):
        with pytest.raises(ValueError, match=f"position_embedding='{variant}'"):
            keras_vit.VisionTransformer(**ANY, position_embedding=variant)
    argv = ["export", "--model", "ViT_Ti16", "--weights", "none", "--any-size", "--image-size", "40",
            "--format", "onnx", "--out", str(tmp_path / "x")]
    assert main(argv) == 2
    assert "--image-size 40: the model cuts images into 16-pixel tokens; expected a multiple of 16" \
        in capsys.readouterr().err
    assert os.listdir(tmp_path) == []


def test_resize_images_equals_torch_antialiased_bicubic():
    """The in-graph resize against torch's own `interpolate(bicubic, antialias=True)`: shrinking (the
    kernel stretched) and enlarging, each axis by its own factor."""
    torch = pytest.importorskip("torch")
    from keras_vit.layers import ResizeImages

    x = np.random.default_rng(0).uniform(0, 255, (2, 37, 50, 3)).astype("float32")
    for size in [(16, 16), (24, 80), (64, 30)]:
        ours = keras.ops.convert_to_numpy(ResizeImages(size)(x))
        theirs = torch.nn.functional.interpolate(torch.from_numpy(x).permute(0, 3, 1, 2), size=size, mode="bicubic",
                                                 antialias=True, align_corners=False).permute(0, 2, 3, 1).numpy()
        np.testing.assert_allclose(ours, theirs, atol=2e-4, rtol=0, err_msg=str(size))  # 1e-6 of 255


@pytest.mark.parametrize("any_size", [False, pytest.param(True, marks=TENSORFLOWS_ONNX)],
                         ids=["fixed_model", "any_size_model"])
def test_resize_to_takes_any_image_and_equals_keras(any_size, tmp_path):
    """`resize_to`: any image size in, resized inside to the model's (or, for a model of any size, the
    chosen) size; equal to the same resize and the model in Keras at five sizes: odd sides and even, enlarged
    from far smaller, shrunk from far larger (the antialiasing kernel at its widest), each axis its own way (the
    last, 100x61, checked against the resize layer and the model apart)."""
    _runtime_or_skip("onnx")
    model = _spread(keras_vit.VisionTransformer(**(ANY if any_size else dict(ARCH, image_size=32))))
    resize_to = (48, 24) if any_size else 32
    path = export(model, tmp_path / "out", "onnx", resize_to=resize_to)
    serving = serving_model(model, resize_to=resize_to)
    for i, hw in enumerate([(32, 32), (5, 9), (24, 48), (300, 200)]):
        images = _images(hw, seed=i)
        expected = outputs_of(serving, images)["probabilities"]
        np.testing.assert_allclose(run(path, "onnx", images)["probabilities"], expected, atol=1e-5, rtol=0)
    from keras_vit.layers import ResizeImages  # the serving model is the resize, then preprocess_input and the model

    images = _images((100, 61))
    resized = keras.ops.convert_to_numpy(ResizeImages(resize_to)(images))
    np.testing.assert_allclose(run(path, "onnx", images)["probabilities"], _keras(model, resized), atol=1e-5, rtol=0)


@pytest.mark.backend_independent
def test_resize_to_refusals(tmp_path, capsys):
    from keras_vit.cli import main

    model = keras_vit.VisionTransformer(**ARCH, image_size=32)
    with pytest.raises(ValueError, match=r"takes 32x32 images only; expected resize_to=32"):
        export(model, tmp_path / "a", "onnx", resize_to=48)
    any_size = keras_vit.VisionTransformer(**ANY)
    with pytest.raises(ValueError, match="cuts images into 8-pixel tokens; expected multiples of 8"):
        export(any_size, tmp_path / "a", "onnx", resize_to=(40, 30))
    assert os.listdir(tmp_path) == []


@TENSORFLOWS_ONNX
def test_export_cli_any_size_and_resize_to(tmp_path, capsys):
    """`keras-vit export --any-size` of a model saved for any size, checked at its own size and at one as
    wide again; `--resize-to` of a model saved at 32x32, checked on images of two other sizes; a model
    saved at one size (keras-vit finetune's) made to take any size by `--any-size`."""
    from keras_vit.cli import main

    _runtime_or_skip("onnx")
    named = _spread(keras_vit.VisionTransformer(**ANY))
    named.class_names = [f"class {i}" for i in range(10)]
    named.save(tmp_path / "any.keras")
    _spread(keras_vit.VisionTransformer(**ARCH, image_size=32)).save(tmp_path / "fixed.keras")
    out = tmp_path / "any"
    assert main(["export", "--weights", str(tmp_path / "any.keras"), "--any-size", "--format", "onnx",
                 "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    for hw in ("32x32", "32x64"):
        assert f"checked in onnxruntime against Keras on 2 random {hw} images: output 'probabilities'" in printed
    assert run(str(out / "model.onnx"), "onnx", _images((16, 72)))["probabilities"].shape == (2, 10)
    assert read_class_names(out / "model.onnx") == named.class_names  # the .keras file's names, in the artefact
    assert (out / "class_names.txt").read_text(encoding="utf-8").splitlines() == list(named.class_names)
    assert main(["export", "--weights", str(tmp_path / "fixed.keras"), "--resize-to", "32", "--format", "onnx",
                 "--out", str(tmp_path / "resize")]) == 0
    printed = capsys.readouterr().out
    for hw in ("49x22", "64x64"):
        assert f"on 2 random {hw} images: output 'probabilities', max |difference|" in printed
    assert main(["export", "--weights", str(tmp_path / "fixed.keras"), "--any-size", "--image-size", "16",
                 "--format", "onnx", "--out", str(tmp_path / "fixed_any")]) == 0  # keras_vit.any_size of the file
    printed = capsys.readouterr().out
    for hw in ("16x16", "16x32"):
        assert f"on 2 random {hw} images: output 'probabilities', max |difference|" in printed
    assert sorted(os.listdir(tmp_path)) == ["any", "any.keras", "fixed.keras", "fixed_any", "resize"]


@pytest.mark.parametrize("kind", ["classifier", "uint8_gap", "hybrid_features"])
def test_any_size_copy_of_a_fixed_model(kind, tmp_path):
    """`keras_vit.any_size(model)` of a model built for 32x32 (a fine-tuned model.keras, say) equals the
    same weights in a model built for any size, at other sizes, and is the model itself at 32x32; its
    class names are kept, and it saves and reloads in safe mode."""
    options = {"classifier": dict(ARCH), "uint8_gap": dict(ARCH, classifier="gap", input_dtype="uint8"),
               "hybrid_features": dict(ARCH, patch_size=2, resnet={"num_layers": (1,), "width_factor": 1},
                                       include_top=False, pooling=None)}[kind]
    fixed = _spread(keras_vit.VisionTransformer(**options, image_size=32))
    if "include_top" not in options:
        fixed.class_names = [f"c{i}" for i in range(10)]
    copy = keras_vit.any_size(fixed)
    built = keras_vit.VisionTransformer(**options, image_size=32, input_shape=(None, None, 3))
    built.set_weights(fixed.get_weights())
    dtype = options.get("input_dtype", "float32")
    for hw in [(32, 32), (16, 48), (64, 40)]:
        x = _images(hw, seed=1).astype(dtype)
        np.testing.assert_allclose(keras.ops.convert_to_numpy(copy(x)), keras.ops.convert_to_numpy(built(x)),
                                   atol=1e-6, rtol=0, err_msg=str(hw))
    x = _images((32, 32), seed=2).astype(dtype)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(copy(x)), keras.ops.convert_to_numpy(fixed(x)), atol=1e-6)
    assert getattr(copy, "class_names", None) == getattr(fixed, "class_names", None)
    copy.save(tmp_path / "any.keras")
    again = keras.saving.load_model(tmp_path / "any.keras", safe_mode=True)
    assert again.input_shape == (None, None, None, 3) and again.class_names == copy.class_names
    x = _images((16, 48), seed=3).astype(dtype)  # a size above (jax compiles each shape's operations once)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(again(x)), keras.ops.convert_to_numpy(copy(x)), atol=1e-6)
    assert keras_vit.any_size(copy) is copy


@pytest.mark.backend_independent
def test_any_size_copy_refuses_a_table_of_one_grid():
    for options, why in ((dict(position_embedding="learned_2d"), "position embedding AddPositionEmbs2D is laid out "
                          "for one grid"), (dict(position_embedding="relative"), "relative position attention"),
                         (dict(position_placement="every_layer"), "added before every block")):
        model = keras_vit.VisionTransformer(**ARCH, image_size=32, **options)
        with pytest.raises(ValueError, match=f"cannot take any image size: its .*{why}.*; expected a model of the "
                                             "builder with learned 1-D, factorized or no position embeddings added once"):
            keras_vit.any_size(model)
