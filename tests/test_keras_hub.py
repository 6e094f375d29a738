"""keras-hub presets as a weights source: tiny random keras-hub models (every weight moved off its initial
value) saved with `save_to_preset`, loaded by keras_vit (which reads the folder with h5py, without
keras-hub), and compared with keras-hub's own outputs; then the refused inputs."""

import dataclasses
import json
import os
import shutil
import sys

import keras
import numpy as np
import pytest

import keras_vit
from keras_vit.convert import from_keras_hub

if sys.version_info < (3, 11):  # keras-hub 0.32 needs Python >= 3.11: pyproject's test extra installs it from there
    pytest.skip("keras-hub needs Python >= 3.11", allow_module_level=True)
import keras_hub  # noqa: E402

TINY = dict(patch_size=8, num_layers=2, num_heads=2, hidden_dim=32)
# the keras-vit builder arguments of TINY's ViTBackbone (exact GELU, LayerNorm epsilon 1e-6)
OURS = dict(patch_size=8, num_layers=2, num_heads=2, hidden_size=32, mlp_dim=64, approximate_gelu=False)
ATOL = 1e-5


def _shake(model, seed):
    """Every float weight set to random normals (zero biases, unit LayerNorms would hide mistakes); CLIP's
    int position_ids to a permutation, so that the gather it stands for is exercised."""
    rng = np.random.default_rng(seed)
    for var in model.weights:
        if "int" in str(var.dtype):
            var.assign(rng.permutation(var.shape[-1]).reshape(var.shape).astype(str(var.dtype)))
        else:
            var.assign(rng.normal(0, 0.5, var.shape).astype("float32"))


def _images(h, w, n=2, seed=1):
    return np.random.default_rng(seed).uniform(-1, 1, (n, h, w, 3)).astype("float32")


def _np(x):
    return keras.ops.convert_to_numpy(x)


# name -> (build the keras-hub model, image size)
CASES = {
    # a class token, pre-logits of another width than the tokens', logits out
    "classifier_token": (lambda: keras_hub.models.ViTImageClassifier(
        backbone=keras_hub.models.ViTBackbone(image_shape=(32, 32, 3), mlp_dim=64, **TINY),
        num_classes=5, intermediate_dim=24, activation=None), (32, 32)),
    # no class token (mean of the tokens), no biases anywhere (zero ones), a non-square image, softmax out
    "classifier_gap": (lambda: keras_hub.models.ViTImageClassifier(
        backbone=keras_hub.models.ViTBackbone(image_shape=(32, 48, 3), mlp_dim=64, use_class_token=False,
                                              use_mha_bias=False, use_mlp_bias=False, use_patch_bias=False, **TINY),
        num_classes=3, pooling="gap", activation="softmax"), (32, 48)),
    "backbone": (lambda: keras_hub.models.ViTBackbone(image_shape=(32, 32, 3), mlp_dim=64, layer_norm_epsilon=1e-5,
                                                      **TINY), (32, 32)),
    "clip": (lambda: keras_hub.models.CLIPVisionEncoder(image_shape=(32, 32, 3), intermediate_dim=64, **TINY),
             (32, 32)),
    "siglip": (lambda: keras_hub.models.SigLIPVisionEncoder(image_shape=(32, 32, 3), intermediate_dim=64, **TINY),
               (32, 32)),
    # so400m/14's geometry at 44 px: 3 x 3 patches of 14, the last 2 rows and columns unread (issue 53)
    "siglip_patch14": (lambda: keras_hub.models.SigLIPVisionEncoder(
        image_shape=(44, 44, 3), intermediate_dim=64, **{**TINY, "patch_size": 14, "num_layers": 1}), (44, 44)),
    # layer scale, 2 registers, the SwiGLU MLP, position embeddings at the image size
    "dinov2_swiglu": (lambda: keras_hub.models.DINOV2Backbone(
        image_shape=(32, 32, 3), position_embedding_shape=(32, 32, 3), intermediate_dim=64, num_register_tokens=2,
        use_swiglu_ffn=True, layer_scale_init_value=0.1, **TINY), (32, 32)),
    # the plain MLP, position embeddings kept at 48 px and interpolated by keras-hub to the 32 px image
    "dinov2_resized": (lambda: keras_hub.models.DINOV2Backbone(
        image_shape=(32, 32, 3), position_embedding_shape=(48, 48, 3), intermediate_dim=64, **TINY), (32, 32)),
    # DINOv3: rotary position embedding on a non-square grid, 4 registers, layer scale, no key bias (a zero one)
    "dinov3": (lambda: keras_hub.models.DINOV3Backbone(
        image_shape=(32, 48, 3), intermediate_dim=64, use_key_bias=False, **TINY), (32, 48)),
    # the gated SiLU MLP (the builder's SwiGLU), no mask token, 2 registers, another rope_theta
    "dinov3_gated": (lambda: keras_hub.models.DINOV3Backbone(
        image_shape=(32, 32, 3), intermediate_dim=48, use_gated_mlp=True, hidden_activation="silu",
        use_mask_token=False, num_register_tokens=2, rope_theta=50.0, **TINY), (32, 32)),
}


@pytest.fixture(scope="module")
def presets(tmp_path_factory):
    """{case: (preset folder, images, keras-hub's output on them)}, each model built, shaken and saved once."""
    root = tmp_path_factory.mktemp("presets")
    out = {}
    for seed, (name, (make, size)) in enumerate(CASES.items()):
        model = make()
        _shake(model, seed)
        if name.startswith("dinov2"):  # the table the model adds is keras-hub's interpolation of the stored one,
            # as after from_preset (a shaken model holds two unrelated tables)
            emb = model.get_layer("embeddings")
            emb.interpolated_position_embeddings.assign(emb._interpolate_position_embeddings(
                emb.position_embeddings, patch_size=8, source_shape=emb.position_embedding_shape,
                target_shape=emb.image_shape))
        folder = str(root / name)
        model.save_to_preset(folder)
        x = _images(*size)
        out[name] = (folder, x, _np(model(x)))
    keras.utils.clear_session()
    return out


@pytest.mark.parametrize("case", ["classifier_token", "classifier_gap"])
def test_vit_image_classifier_outputs_equal_keras_hub(presets, case):
    folder, x, expected = presets[case]
    model = from_keras_hub(folder)
    got = _np(model(x))
    assert got.shape == expected.shape
    np.testing.assert_allclose(got, expected, atol=ATOL, rtol=0)
    assert np.abs(expected).max() > 0.1  # a real signal
    if case == "classifier_token":
        assert got.min() < 0  # logits, as the task's activation=None says
        assert model.get_layer("pre_logits").kernel.shape == (32, 24)
    else:
        np.testing.assert_allclose(got.sum(-1), 1, atol=1e-6)
        assert model.input_shape[1:3] == (32, 48)


def test_vit_backbone_outputs_equal_keras_hub(presets):
    """keras-hub's backbone returns the token sequence after the final LayerNorm: keras-vit's model returns
    its class token by default, and the patch tokens as a (B, gh, gw, D) map with pooling=None."""
    folder, x, sequence = presets["backbone"]
    pooled = from_keras_hub(folder)
    assert pooled.get_layer("encoderblock_0").layer_norm_epsilon == 1e-5  # from config.json
    np.testing.assert_allclose(_np(pooled(x)), sequence[:, 0], atol=ATOL, rtol=0)
    grid = from_keras_hub(folder, pooling=None)
    np.testing.assert_allclose(_np(grid(x)), sequence[:, 1:].reshape(2, 4, 4, 32), atol=ATOL, rtol=0)


def test_clip_vision_encoder_outputs_equal_keras_hub(presets):
    folder, x, sequence = presets["clip"]
    model = from_keras_hub(folder, pooling=None)
    block = model.get_layer("encoderblock_0")
    assert block.layer_norm_epsilon == 1e-5 and block.mlp_activation == "quick_gelu"
    np.testing.assert_allclose(_np(model(x)), sequence[:, 1:].reshape(2, 4, 4, 32), atol=ATOL, rtol=0)
    np.testing.assert_allclose(_np(from_keras_hub(folder)(x)), sequence[:, 0], atol=ATOL, rtol=0)


@pytest.mark.parametrize("case", ["siglip", "siglip_patch14"])
def test_siglip_vision_encoder_outputs_equal_keras_hub(presets, case):
    """SigLIP's tower ends in its attention-pooling head: keras-vit's "map" classifier, same output (B, D);
    at an image size that is no multiple of the patch, the whole patches (crop_to_patches), as keras-hub's."""
    folder, x, pooled = presets[case]
    model = from_keras_hub(folder)
    assert model.get_layer("encoderblock_0").approximate_gelu is True and model.output_shape == (None, 32)
    assert model.input_shape[1:3] == x.shape[1:3]
    np.testing.assert_allclose(_np(model(x)), pooled, atol=ATOL, rtol=0)


@pytest.mark.parametrize("case", ["dinov2_swiglu", "dinov2_resized"])
def test_dinov2_backbone_outputs_equal_keras_hub(presets, case):
    """The sequence is [class, registers, patches]: keras-vit's default output is the class token, pooling=None
    the patch tokens (registers dropped)."""
    folder, x, sequence = presets[case]
    registers = 2 if case == "dinov2_swiglu" else 0
    model = from_keras_hub(folder, pooling=None)
    block = model.get_layer("encoderblock_0")
    assert block.mlp_activation == ("swiglu" if registers else "gelu") and block.layer_scale is not None
    np.testing.assert_allclose(_np(model(x)), sequence[:, 1 + registers:].reshape(2, 4, 4, 32), atol=ATOL, rtol=0)
    np.testing.assert_allclose(_np(from_keras_hub(folder)(x)), sequence[:, 0], atol=ATOL, rtol=0)


def test_weights_argument_and_cli_convert_take_a_preset_folder(presets, tmp_path):
    folder, x, expected = presets["classifier_token"]
    model = keras_vit.VisionTransformer(**OURS, image_size=32, classes=5, representation_size=24,
                                        classifier_activation=None, weights=folder)
    np.testing.assert_allclose(_np(model(x)), expected, atol=ATOL, rtol=0)

    from keras_vit.cli import main

    out = str(tmp_path / "vit.keras")
    assert main(["convert", folder, out]) in (None, 0)
    np.testing.assert_allclose(_np(keras.saving.load_model(out)(x)), expected, atol=ATOL, rtol=0)


def test_a_factory_takes_a_preset_folder(presets, monkeypatch):
    """`weights=preset_dir` of a factory: ViT_Ti16's row of the variant table at the preset's tiny size; the
    image size, classes, pre-logits and numerics come from the preset."""
    from keras_vit import configs

    tiny = dataclasses.replace(configs.get_variant("ViT_Ti16"), patch_size=8, hidden_size=32, mlp_dim=64,
                               num_heads=2, num_layers=2)
    monkeypatch.setitem(configs.VARIANTS, "ViT_Ti16", tiny)
    folder, x, expected = presets["classifier_token"]
    model = keras_vit.ViT_Ti16(weights=folder, classifier_activation=None)
    assert model.output_shape == (None, 5) and model.get_layer("encoderblock_0").approximate_gelu is False
    np.testing.assert_allclose(_np(model(x)), expected, atol=ATOL, rtol=0)


def test_the_docs_example_runs(presets, tmp_path, monkeypatch):
    """docs/keras-hub.md's python block, on a copy of the classifier preset under the name it uses."""
    import re

    page = open(os.path.join(os.path.dirname(__file__), os.pardir, "docs", "keras-hub.md")).read()
    (code,) = re.findall(r"```python\n(.*?)```", page, re.S)
    folder, x, expected = presets["classifier_token"]
    shutil.copytree(folder, tmp_path / "vit_preset")
    monkeypatch.chdir(tmp_path)
    namespace = {}
    exec(compile(code, "docs/keras-hub.md", "exec"), namespace)  # noqa: S102  the project's own page
    np.testing.assert_allclose(_np(namespace["model"](x)), expected, atol=ATOL, rtol=0)
    assert _np(namespace["features"](x)).shape == (2, 4, 4, 32)


@pytest.mark.parametrize("classifier, size", [("token", (32, 32)), ("gap", (32, 48))])
def test_a_keras_vit_model_saved_as_a_preset_is_the_same_vit_backbone_in_keras_hub(classifier, size, tmp_path):
    """The reverse: keras_vit's plain layout written as a ViTBackbone preset that keras-hub's from_preset loads."""
    from keras_vit.weights.keras_hub_save import save_keras_hub_preset

    ours = keras_vit.VisionTransformer(**OURS, image_size=size, classifier=classifier, include_top=False,
                                       pooling=None)
    _shake(ours, 7)
    folder = save_keras_hub_preset(ours, tmp_path / "preset")
    theirs = keras_hub.models.ViTBackbone.from_preset(folder)
    x = _images(*size)
    sequence = _np(theirs(x))
    prefix = int(classifier == "token")
    grid = (size[0] // 8, size[1] // 8, 32)
    np.testing.assert_allclose(_np(ours(x)), sequence[:, prefix:].reshape(2, *grid), atol=ATOL, rtol=0)
    assert np.abs(sequence).max() > 0.1
    np.testing.assert_allclose(_np(from_keras_hub(folder, pooling=None)(x)), _np(ours(x)), atol=ATOL, rtol=0)


@pytest.mark.parametrize("case", ["dinov3", "dinov3_gated"])
def test_dinov3_backbone_outputs_equal_keras_hub_and_write_back_the_same(presets, case, tmp_path):
    """The class token (keras-vit's default output) and the patch tokens (pooling=None) of keras-hub's
    [class, registers, patches]; the feature-map model written back as a preset is a DINOV3Backbone whose
    keras-hub model gives the same sequence."""
    from keras_vit.weights.keras_hub_save import save_keras_hub_preset

    folder, x, sequence = presets[case]
    prefix, (h, w) = 1 + (4 if case == "dinov3" else 2), x.shape[1:3]
    model = from_keras_hub(folder, pooling=None)
    assert model.get_layer("encoderblock_0").rope_options["kind"] == "dinov3"
    np.testing.assert_allclose(_np(model(x)), sequence[:, prefix:].reshape(2, h // 8, w // 8, 32), atol=ATOL, rtol=0)
    np.testing.assert_allclose(_np(from_keras_hub(folder)(x)), sequence[:, 0], atol=ATOL, rtol=0)
    save_keras_hub_preset(model, tmp_path / "back")
    assert json.loads((tmp_path / "back" / "config.json").read_text())["class_name"] == "DINOV3Backbone"
    again = keras_hub.models.DINOV3Backbone.from_preset(str(tmp_path / "back"))
    np.testing.assert_allclose(_np(again(x)), sequence, atol=ATOL, rtol=0)


@pytest.mark.backend_independent
def test_a_model_keras_hub_cannot_compute_is_not_written(tmp_path):
    from keras_vit.weights.keras_hub_save import save_keras_hub_preset

    official_gelu = keras_vit.VisionTransformer(**{**OURS, "approximate_gelu": True}, image_size=32)
    with pytest.raises(ValueError, match=r"no keras-hub ViTBackbone: approximate_gelu=True .*nothing was written"):
        save_keras_hub_preset(official_gelu, tmp_path / "preset")
    registers = keras_vit.VisionTransformer(**OURS, image_size=32, num_register_tokens=2)
    with pytest.raises(ValueError, match="num_register_tokens=2"):
        save_keras_hub_preset(registers, tmp_path / "preset")
    assert not (tmp_path / "preset").exists()


# ---------------------------------------------------------------------------------------------------
# refused inputs

def _copy(presets, case, tmp_path):
    return shutil.copytree(presets[case][0], tmp_path / case)


def _edit_json(path, **changes):
    value = json.loads(open(path).read())
    value.update(changes)
    with open(path, "w") as f:
        json.dump(value, f)


@pytest.mark.backend_independent
@pytest.mark.parametrize("kind", ["DeiTBackbone", "SigLIPBackbone", "SomeNewBackbone"])
def test_another_architecture_is_refused_by_name(presets, tmp_path, kind):
    folder = _copy(presets, "backbone", tmp_path)
    _edit_json(folder / "config.json", class_name=kind, registered_name=f"keras_hub>{kind}")
    with pytest.raises(ValueError, match=rf"{kind}.*keras_vit reads ViTBackbone, CLIPVisionEncoder, "
                                         r"SigLIPVisionEncoder, DINOV2Backbone, DINOV3Backbone, ViTImageClassifier"):
        from_keras_hub(folder)


@pytest.mark.backend_independent
def test_another_task_is_refused_by_name(presets, tmp_path):
    folder = _copy(presets, "classifier_token", tmp_path)
    _edit_json(folder / "task.json", class_name="ViTObjectDetector")
    with pytest.raises(ValueError, match="'ViTObjectDetector' task; keras_vit reads the tasks ViTImageClassifier"):
        from_keras_hub(folder)


@pytest.mark.backend_independent
def test_a_folder_that_is_no_preset_is_refused(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "vit"}))
    with pytest.raises(ValueError, match="no keras-hub preset"):
        from_keras_hub(tmp_path)
    with pytest.raises(ValueError, match="is not a folder"):
        from_keras_hub(tmp_path / "config.json")


@pytest.mark.backend_independent
def test_sharded_weights_are_refused(presets, tmp_path):
    folder = _copy(presets, "backbone", tmp_path)
    os.remove(folder / "model.weights.h5")
    (folder / "model.weights.json").write_text("{}")
    with pytest.raises(ValueError, match=r"sharded weights \(model.weights.json\)"):
        from_keras_hub(folder)


@pytest.mark.parametrize("damage", ["truncated", "garbage"])
def test_corrupt_weights_are_refused_before_anything_is_assigned(presets, tmp_path, damage):
    folder = _copy(presets, "classifier_token", tmp_path)
    path = folder / "model.weights.h5"
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2] if damage == "truncated" else b"\x00not hdf5" * 100)
    with pytest.raises(ValueError, match="model.weights.h5 is not a readable Keras weights file"):
        from_keras_hub(folder)
    model = keras_vit.VisionTransformer(**OURS, image_size=32, classes=5, representation_size=24)
    before = [_np(v) for v in model.weights]
    with pytest.raises(ValueError, match="not a readable Keras weights file"):
        keras_vit.load_weights(model, str(folder))
    assert all(np.array_equal(a, _np(v)) for a, v in zip(before, model.weights))


def test_mismatched_shapes_are_refused_before_anything_is_assigned(presets):
    folder = presets["classifier_token"][0]
    model = keras_vit.VisionTransformer(**{**OURS, "mlp_dim": 48}, image_size=32, classes=5, representation_size=24)
    before = [_np(v) for v in model.weights]
    with pytest.raises(ValueError, match=r"(?s)left unchanged.*shape mismatch.*MlpBlock_3/Dense_0/kernel: "
                                         r"file \(32, 64\), model \(32, 48\)"):
        keras_vit.load_weights(model, folder)
    assert all(np.array_equal(a, _np(v)) for a, v in zip(before, model.weights))
