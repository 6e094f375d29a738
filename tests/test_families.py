"""The ViT family from timm's files (DeiT, DeiT III, DINOv2 with and without registers and SwiGLU,
CLIP, SigLIP, average pooling with fc_norm): parity with timm's own random-initialised models,
the features a user takes, another resolution by timm's rule, and a file of one family refused by
a model of another."""

import os
import sys
from functools import partial

import keras
import numpy as np
import pytest

import keras_vit

torch = pytest.importorskip("torch")
safetensors_torch = pytest.importorskip("safetensors.torch")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
from timm_peer import import_timm  # noqa: E402

timm = import_timm()
from timm.layers import LayerNorm, SwiGLUPacked  # noqa: E402
from timm.models.deit import VisionTransformerDistilled  # noqa: E402
from timm.models.vision_transformer import VisionTransformer as TimmViT  # noqa: E402

TINY = dict(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2, mlp_ratio=2)
# family -> (timm constructor, its arguments, file name): the arguments of timm's own model
# definitions (vision_transformer.py, deit.py) at a tiny size
FAMILIES = {
    "deit_distilled": (VisionTransformerDistilled, dict(num_classes=10), "deit_tiny_distilled.safetensors"),
    "deit3": (TimmViT, dict(no_embed_class=True, init_values=1e-6, num_classes=10), "deit3_tiny.safetensors"),
    "dinov2": (TimmViT, dict(init_values=1e-5, num_classes=0), "vit_tiny_dinov2.safetensors"),
    "dinov2_reg4": (TimmViT, dict(init_values=1e-5, reg_tokens=4, no_embed_class=True, num_classes=0),
                    "vit_tiny_reg4_dinov2.pth"),
    "dinov2_swiglu": (TimmViT, dict(init_values=1e-5, mlp_layer=SwiGLUPacked, act_layer=torch.nn.SiLU, mlp_ratio=4,
                                    num_classes=0), "vit_giantish_dinov2.safetensors"),
    "clip": (TimmViT, dict(pre_norm=True, norm_layer=partial(LayerNorm, eps=1e-5), num_classes=16),
             "vit_tiny_clip.safetensors"),
    "clip_quickgelu": (TimmViT, dict(pre_norm=True, norm_layer=partial(LayerNorm, eps=1e-5), act_layer="quick_gelu",
                                     num_classes=16), "vit_tiny_clip_quickgelu.bin"),
    "siglip": (TimmViT, dict(class_token=False, global_pool="map", num_classes=10), "vit_tiny_siglip.safetensors"),
    "gap_fc_norm_reg": (TimmViT, dict(class_token=False, global_pool="avg", reg_tokens=4, no_embed_class=True,
                                      num_classes=10), "vit_tiny_reg4_gap.safetensors"),
}


def _timm(family, seed=0, **kw):
    cls, args, _ = FAMILIES[family]
    module = cls(**{**TINY, **args, **kw})
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():  # every parameter off its initial value: zero heads, unit scales would hide mistakes
        for p in module.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=gen))
    return module.eval()


def _file(module, family, folder):
    path = str(folder / FAMILIES[family][2])
    if path.endswith(".safetensors"):
        safetensors_torch.save_file({k: v.contiguous() for k, v in module.state_dict().items()}, path)
    else:
        torch.save(module.state_dict(), path)
    return path


def _images(h, w, n=2, seed=0):
    return np.random.default_rng(seed).uniform(-1, 1, (n, h, w, 3)).astype("float32")


def _nchw(x):
    return torch.from_numpy(x).permute(0, 3, 1, 2)


def _np(y):
    return keras.ops.convert_to_numpy(y)


@pytest.mark.parametrize("family", FAMILIES)
def test_timm_family_outputs_and_features_equal_timm(family, tmp_path):
    ref = _timm(family)
    path = _file(ref, family, tmp_path)
    x = _images(32, 32)
    with torch.no_grad():
        tokens = ref.forward_features(_nchw(x))
        expected = ref.forward_head(tokens).numpy()
        pooled = ref.forward_head(tokens, pre_logits=True).numpy()
    model = keras_vit.from_timm(path, num_heads=2, classifier_activation=None)
    np.testing.assert_allclose(_np(model(x)), expected, atol=1e-5, rtol=0)
    assert np.abs(expected).max() > 0.1  # a real signal
    # the representation a user takes: DeiT's mean of two tokens, CLIP's embedding before the projection, MAP's
    features = keras_vit.from_timm(path, num_heads=2, include_top=False)
    np.testing.assert_allclose(_np(features(x)), pooled, atol=1e-5, rtol=0)
    # patch tokens on their grid (DINOv2's dense features)
    prefix = ref.num_prefix_tokens
    grid = keras_vit.from_timm(path, num_heads=2, include_top=False, pooling=None)
    patches = tokens[:, prefix:].numpy().reshape(2, 4, 4, -1)
    if not keras_vit.structure.find_vit(grid).family()["fc_norm"]:  # with fc_norm, timm's tokens are un-normalised
        np.testing.assert_allclose(_np(grid(x)), patches, atol=1e-5, rtol=0)
    if ref.cls_token is not None:
        token = keras_vit.from_timm(path, num_heads=2, include_top=False, pooling="token")
        np.testing.assert_allclose(_np(token(x)), tokens[:, 0].numpy(), atol=1e-5, rtol=0)


@pytest.mark.parametrize("family", ["deit_distilled", "dinov2_reg4", "siglip", "clip_quickgelu"])
def test_families_save_reload_extract_and_inspect(family, tmp_path):
    """What the zoo builds on applies to the family: `.keras` reload in safe mode, feature
    extraction, attention rollout over several prefix tokens."""
    ref = _timm(family)
    model = keras_vit.from_timm(_file(ref, family, tmp_path), num_heads=2, classifier_activation=None)
    x = _images(32, 32)
    model.save(tmp_path / "m.keras")
    again = keras.saving.load_model(tmp_path / "m.keras", safe_mode=True)
    np.testing.assert_allclose(_np(again(x)), _np(model(x)), atol=1e-6, rtol=0)
    maps = keras_vit.feature_extractor(again, blocks=[0, -1], output="maps")(x)
    assert [tuple(m.shape) for m in maps] == [(2, 4, 4, 32)] * 2
    with torch.no_grad():  # the residual stream after the last block, before the final norm: timm's blocks
        t = ref.patch_embed(_nchw(x))
        t = ref.norm_pre(ref._pos_embed(t))
        stream = ref.blocks(t)[:, ref.num_prefix_tokens:].numpy().reshape(2, 4, 4, -1)
    np.testing.assert_allclose(_np(maps[1]), stream, atol=1e-5, rtol=0)
    from keras_vit.inspection import attention_maps, attention_rollout

    parts = keras_vit.structure.find_vit(model)
    attentions = attention_maps(model, x)
    assert attentions[0].shape == (2, 2, parts.num_prefix_tokens + 16, parts.num_prefix_tokens + 16)
    rollout = attention_rollout(attentions, parts.num_prefix_tokens, parts.grid_size)
    assert rollout.shape == (2, 4, 4) and np.isfinite(rollout).all()


@pytest.mark.backend_independent
def test_a_file_of_one_family_into_a_model_of_another_is_one_error(tmp_path):
    path = _file(_timm("dinov2_reg4"), "dinov2_reg4", tmp_path)
    plain = keras_vit.VisionTransformer(image_size=32, patch_size=8, hidden_size=32, mlp_dim=64, num_heads=2,
                                        num_layers=2, include_top=False, approximate_gelu=False)
    before = [w.numpy().copy() for w in plain.weights]
    with pytest.raises(ValueError, match=r"holds a DINOv2-style ViT \(4 register tokens, layer scale, position "
                                         r"embeddings on the patches only\); model 'vit' is a ViT of the paper's "
                                         r"layout: num_register_tokens=4 in the file, 0 in the model, .*layer_scale=1e-05 in the file, "
                                         r"None in the model\. Build the model with the file's options"):
        keras_vit.load_weights(plain, path)
    assert all(np.array_equal(w.numpy(), b) for w, b in zip(plain.weights, before))
    with pytest.raises(ValueError, match="no timm ViT has width 32.*pass num_heads"):
        keras_vit.from_timm(path)


def test_from_timm_takes_a_model_name_from_the_hugging_face_cache(tmp_path, monkeypatch):
    """A timm name resolves through huggingface_hub's cache (where timm itself keeps its downloads),
    here a cache laid out as the hub client writes it; offline, an uncached name is one error."""
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))  # what HF_HUB_CACHE / HF_HUB_OFFLINE set
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    snapshot = tmp_path / "hub" / "models--timm--vit_tiny_clip_quickgelu.test" / "snapshots" / ("0" * 40)
    snapshot.mkdir(parents=True)
    (snapshot.parent.parent / "refs").mkdir()
    (snapshot.parent.parent / "refs" / "main").write_text("0" * 40)
    ref = _timm("clip_quickgelu")
    safetensors_torch.save_file({k: v.contiguous() for k, v in ref.state_dict().items()},
                                str(snapshot / "model.safetensors"))
    model = keras_vit.from_timm("vit_tiny_clip_quickgelu.test", num_heads=2, classifier_activation=None)
    assert model.get_layer("encoderblock_0").mlp_activation == "quick_gelu"  # from the name
    x = _images(32, 32)
    with torch.no_grad():
        expected = ref(_nchw(x)).numpy()
    np.testing.assert_allclose(_np(model(x)), expected, atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match="'vit_nothing_here' is no file here and timm/vit_nothing_here/model.safetensors "
                                         "could not be fetched"):
        keras_vit.from_timm("vit_nothing_here")


# every family option at once in two models (a class token and an attention-pool head cannot share one)
COMPOSITES = {
    "deit_registers_clip": dict(distillation_token=True, num_register_tokens=2, prefix_position_embedding=False,
                                layer_scale=0.5, pre_norm=True, mlp_activation="quick_gelu", parallel_branches=2),
    "siglip_fc_norm_registers": dict(classifier="map", fc_norm=True, num_register_tokens=1, qk_norm=True,
                                     parallel_blocks=True),
}


@pytest.mark.parametrize("composite", COMPOSITES)
def test_family_models_export_to_every_format_of_the_backend(composite, tmp_path):
    from keras_vit.export import FORMATS, export, run, writer
    from test_export import RUNTIMES, _photos

    model = keras_vit.VisionTransformer(image_size=32, patch_size=8, hidden_size=32, mlp_dim=64, num_heads=2,
                                        num_layers=2, classes=10, **COMPOSITES[composite])
    for i, var in enumerate(model.weights):  # a head and embeddings that spread the probabilities
        var.assign(np.random.default_rng(i).normal(0, 0.3, var.shape).astype("float32"))
    photos = _photos((32, 32))
    expected = _np(model(keras_vit.preprocess_input(photos.astype("float32"))))
    assert expected.max() - expected.min() > 0.05
    backend = keras.backend.backend()
    for format in [f for f in FORMATS if writer(backend, f) == backend]:  # the others: the TensorFlow lane's
        pytest.importorskip(RUNTIMES[format])
        path = export(model, tmp_path / format, format, top_k=3)
        for n in (1, 3):
            got = run(path, format, photos[:n])
            np.testing.assert_allclose(got["probabilities"], expected[:n], atol=1e-4, rtol=0, err_msg=format)
            np.testing.assert_array_equal(got["top_k_classes"], np.argsort(-expected[:n], axis=-1)[:, :3])


def test_a_factory_builds_the_family_of_its_file(tmp_path):
    """`ViT_Ti16(weights=<a DeiT III file of ViT-Ti/16's size>)` is a DeiT III: layer scale and
    position embeddings on the patches only, read from the file."""
    ref = _timm("deit3", img_size=32, patch_size=16, embed_dim=192, depth=12, num_heads=3, mlp_ratio=4, num_classes=7)
    model = keras_vit.ViT_Ti16(weights=_file(ref, "deit3", tmp_path), classifier_activation=None)
    family = keras_vit.structure.find_vit(model).family()
    assert family["layer_scale"] is not None and family["prefix_position_embedding"] is False
    x = _images(32, 32, n=1)
    with torch.no_grad():
        expected = ref(_nchw(x)).numpy()
    np.testing.assert_allclose(_np(model(x)), expected, atol=1e-5, rtol=0)


@pytest.mark.parametrize("family", ["dinov2", "dinov2_reg4"])
def test_another_resolution_follows_timms_resize_rule(family, tmp_path):
    """At 48 px (upsampled grid) and 24 px (downsampled), built at that size or taking any size,
    the model equals timm's own model resizing its position embeddings (bicubic, antialiased)."""
    ref = _timm(family, dynamic_img_size=True)
    path = _file(ref, family, tmp_path)
    anysize = keras_vit.from_timm(path, num_heads=2, input_shape=(None, None, 3), include_top=False)
    for size in (48, 24):
        x = _images(size, size)
        with torch.no_grad():
            expected = ref(_nchw(x)).numpy()
        fixed = keras_vit.from_timm(path, num_heads=2, image_size=size, include_top=False)
        np.testing.assert_allclose(_np(fixed(x)), expected, atol=1e-5, rtol=0, err_msg=f"built at {size}")
        np.testing.assert_allclose(_np(anysize(x)), expected, atol=1e-5, rtol=0, err_msg=f"any size, {size}")


def test_hugging_face_dinov2_at_another_resolution(tmp_path):
    """transformers' DINOv2 resizes its position embeddings by its own rule (bicubic, no antialias)
    whenever the grid differs; a model built from the folder at 48 px gives its outputs."""
    transformers = pytest.importorskip("transformers")
    config = transformers.Dinov2Config(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, patch_size=8,
                                       image_size=32, mlp_ratio=2)
    torch.manual_seed(0)
    ref = transformers.Dinov2Model(config)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in ref.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=gen))
    ref.eval().save_pretrained(str(tmp_path / "hf"))
    model = keras_vit.from_huggingface(str(tmp_path / "hf"), image_size=48, include_top=False)
    x = _images(48, 48)
    with torch.no_grad():
        expected = ref(pixel_values=_nchw(x)).pooler_output.numpy()
    np.testing.assert_allclose(_np(model(x)), expected, atol=1e-5, rtol=0)


@pytest.mark.backend_independent
def test_preprocess_input_modes_are_the_sources_normalisations():
    """DINOv2 / DeiT take ImageNet's mean and std, CLIP its own: timm's constants, on real photos."""
    from skimage import data
    from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD, OPENAI_CLIP_MEAN, OPENAI_CLIP_STD

    photo = data.astronaut()[:64, :64]
    for mode, mean, std in (("imagenet", IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD),
                            ("clip", OPENAI_CLIP_MEAN, OPENAI_CLIP_STD), ("vit", (0.5,) * 3, (0.5,) * 3)):
        expected = (photo / 255.0 - np.array(mean)) / np.array(std)
        np.testing.assert_allclose(keras_vit.preprocess_input(photo, mode=mode), expected, atol=1e-5, rtol=0)
        tensor = keras_vit.preprocess_input(keras.ops.convert_to_tensor(photo[None]), mode=mode)
        np.testing.assert_allclose(_np(tensor)[0], expected, atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match="unknown mode 'dino'"):
        keras_vit.preprocess_input(photo, mode="dino")


@pytest.mark.one_backend
def test_convert_cli_writes_a_family_model_that_reloads(tmp_path):
    """`keras-vit convert` of a DINOv2-with-registers file in a fresh interpreter: the `.keras` file
    reloads in safe mode with the family's layers and timm's outputs. The command's run, once: the family's
    layers, their parity with timm and their `.keras` reload are tested per backend above."""
    import subprocess

    ref = _timm("dinov2_reg4")
    path = _file(ref, "dinov2_reg4", tmp_path)
    out = tmp_path / "out" / "dino.keras"
    done = subprocess.run([sys.executable, "-m", "keras_vit.cli", "convert", path, str(out), "--num-heads", "2"],
                          env=dict(os.environ, PYTHONPATH=ROOT), capture_output=True, text=True, timeout=280)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == f"wrote {out}"
    model = keras.saving.load_model(out, safe_mode=True)
    assert keras_vit.structure.find_vit(model).family()["num_register_tokens"] == 4
    x = _images(32, 32)
    with torch.no_grad():
        expected = ref(_nchw(x)).numpy()
    np.testing.assert_allclose(_np(model(x)), expected, atol=1e-5, rtol=0)


@pytest.mark.backend_independent
@pytest.mark.parametrize("options, match", [
    (dict(distillation_token=True, classifier="gap"), "distillation_token=True sits beside a class token"),
    (dict(distillation_token=True, fc_norm=True), "no representation_size .* and no fc_norm"),
    (dict(num_register_tokens=2, position_placement="every_layer"), "num_register_tokens=2 does not lay out"),
    (dict(prefix_position_embedding=False, position_embedding="relative"), "is about learned position embeddings"),
    (dict(num_register_tokens=-1), "num_register_tokens must be a non-negative int"),
    (dict(mlp_activation="relu"), r"unknown mlp_activation 'relu'; expected one of \('gelu', 'quick_gelu', 'swiglu'\)"),
    (dict(position_interpolation="cubic"), "position_interpolation"),
    (dict(layer_scale="small"), "layer_scale must be None or a float"),
    (dict(classifier="map", mlp_activation="swiglu"), "MAPHead's MLP is a plain two-layer MLP"),
    (dict(classifier="map", map_mlp_dim=-1), r"map_mlp_dim must be None .*, a positive int or 0 \(no MLP\), got -1"),
    (dict(classifier="map", include_top=False, pooling="token"), "needs a class token; this model has classifier='map'"),
    (dict(crop_to_patches=True, resnet={"num_layers": (1,), "width_factor": 1}), "a hybrid's ResNet stem pads"),
    (dict(crop_to_patches="yes"), "crop_to_patches must be True or False, got 'yes'"),
])
def test_family_options_that_do_not_go_together_are_refused(options, match):
    with pytest.raises(ValueError, match=match):
        keras_vit.VisionTransformer(image_size=32, patch_size=8, hidden_size=32, mlp_dim=64, num_heads=2,
                                    num_layers=1, **options)


# --- SigLIP at timm's geometry and numerics (issue 53): narrow and shallow, the real patch and image size --------

def _siglip(img_size, patch_size, act_layer=None, depth=2):
    """A SigLIP tower of timm's own class as its model definitions make it (no class token, attention
    pool), 32 wide, its patches, resolution and MLP activation those of a released architecture."""
    args = dict(img_size=img_size, patch_size=patch_size, embed_dim=32, depth=depth, num_heads=2, mlp_ratio=2,
                class_token=False, global_pool="map", num_classes=0, dynamic_img_size=img_size % patch_size == 0)
    module = TimmViT(**args, **({"act_layer": act_layer} if act_layer else {}))
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=gen))
    return module.eval()


def _save(module, path):
    safetensors_torch.save_file({k: v.contiguous() for k, v in module.state_dict().items()}, str(path))
    return str(path)


def _relative(ours, theirs):
    """The max abs error as a fraction of the output's scale (its max magnitude)."""
    return float(np.abs(ours - theirs).max() / np.abs(theirs).max())


def _predicted(model, x):
    return model.predict(x, verbose=0)  # one compiled program: jax's first eager call compiles op by op


def test_siglip_so400m_patch14_at_384_px_equals_timm(tmp_path):
    """timm's vit_so400m_patch14_siglip_384 cuts its 384 px images into 27 x 27 patches of 14 (the last 6
    rows and columns unread); a file named after it builds at 384 px (crop_to_patches) with timm's outputs,
    and at 400 px (28 x 28 patches) those of timm's model set to that size (position embeddings resampled)."""
    ref = _siglip(384, 14, depth=1)
    path = _save(ref, tmp_path / "vit_so400m_patch14_siglip_384.webli.safetensors")
    model = keras_vit.from_timm(path, num_heads=2)
    assert model.input_shape[1:3] == (384, 384) and keras_vit.structure.find_vit(model).crop is not None
    other = keras_vit.from_timm(path, num_heads=2, image_size=400)
    for size, ours in ((384, model), (400, other)):
        if size != 384:
            ref.set_input_size(img_size=(size, size))
        x = _images(size, size)
        with torch.no_grad():
            expected = ref(_nchw(x)).numpy()
        assert _relative(_predicted(ours, x), expected) <= 1e-5, size


def test_siglip2_files_compute_timms_tanh_gelu_by_name_file_name_or_choice(tmp_path, monkeypatch, caplog):
    """timm builds SigLIP 2 (vit_so400m_patch16_siglip_384 ...) with the tanh GELU, which a state dict does
    not record: a timm model name (from the hub cache) and a file named after it give timm's outputs at 384
    px and, of any size, at 256 px; a file whose name says nothing is built with the exact GELU, one warning
    line says so and how to choose the other, and approximate_gelu=True gives timm's outputs."""
    import logging

    from huggingface_hub import constants

    ref = _siglip(384, 16, act_layer="gelu_tanh")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    repo = tmp_path / "hub" / "models--timm--vit_so400m_patch16_siglip_384.v2_webli"
    (repo / "snapshots" / ("0" * 40)).mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("0" * 40)
    _save(ref, repo / "snapshots" / ("0" * 40) / "model.safetensors")
    named = _save(ref, tmp_path / "vit_so400m_patch16_siglip_384.v2_webli.safetensors")
    unnamed = _save(ref, tmp_path / "model.safetensors")
    with caplog.at_level(logging.WARNING, logger="keras_vit"):
        by_name = keras_vit.from_timm("vit_so400m_patch16_siglip_384.v2_webli", num_heads=2,
                                      input_shape=(None, None, 3))
        by_file = keras_vit.from_timm(named, num_heads=2)
        chosen = keras_vit.from_timm(unnamed, num_heads=2, approximate_gelu=True)
    assert caplog.records == []
    with caplog.at_level(logging.WARNING, logger="keras_vit"):
        assumed = keras_vit.from_timm(unnamed, num_heads=2)
    assert len(caplog.records) == 1 and "exact GELU" in caplog.text and "approximate_gelu=True" in caplog.text
    x = _images(384, 384)
    with torch.no_grad():
        expected = ref(_nchw(x)).numpy()
    for what, model in (("timm name", by_name), ("file name", by_file), ("approximate_gelu=True", chosen)):
        assert model.get_layer("encoderblock_0").approximate_gelu is True, what
        assert _relative(_predicted(model, x), expected) <= 1e-5, what
    assert _relative(_predicted(assumed, x), expected) > 1e-5  # the GELU the file does not record matters
    x = _images(256, 256)
    with torch.no_grad():
        expected = ref(_nchw(x)).numpy()
    assert _relative(_predicted(by_name, x), expected) <= 1e-5


@pytest.mark.backend_independent
def test_what_a_siglip_state_dict_does_not_record_is_read_as_timms_model_definitions_say():
    """For every SigLIP architecture timm lists (built on the meta device: its tensors' shapes only), the
    state dict read with the architecture's name gives the GELU timm builds (act_layer='gelu_tanh' or the
    exact one), the resolution where it is no multiple of the patch, the head count (giantopt's 1536 wide:
    16, not DINOv2-giant's 24) and, for NaFlex, the position resize rule; read without a name, the GELU is
    marked assumed (a warning line) and the head count is the same."""
    from keras_vit.weights.timm import TIMM_SIGLIP_GELU, architecture, name_options

    assert sorted(TIMM_SIGLIP_GELU) == sorted(timm.list_models("*siglip*"))
    for name, tanh in TIMM_SIGLIP_GELU.items():
        with torch.device("meta"):
            module = timm.create_model(name, pretrained=False, depth=1)
        act, tensors = type(module.blocks[0].mlp.act).__name__, module.state_dict()
        assert act in ("GELU", "GELUTanh") and (act == "GELUTanh") == tanh, name
        named = architecture(tensors, name=f"/x/{name}.v2_webli.safetensors")
        unnamed = architecture(tensors, name="/x/model.safetensors")
        assert named["approximate_gelu"] is tanh and not named["gelu_assumed"], name
        assert unnamed["approximate_gelu"] is False and unnamed["gelu_assumed"], name
        assert named["timm_heads"] == unnamed["timm_heads"] == module.blocks[0].attn.num_heads, name
        size = getattr(getattr(module, "patch_embed", None), "img_size", None)
        if size is not None and size[0] % module.patch_embed.patch_size[0]:  # so400m/14 at 384 px
            assert named["image_size"] == tuple(size) and unnamed["image_size"] is None, name
        if name.startswith("naflexvit_"):
            assert module.embeds.pos_embed_interp_mode == "bilinear" and module.embeds.pos_embed_antialias
            assert named["position_interpolation"] == "bilinear_antialias", name
    assert name_options("/cache/models--timm--vit_giantopt_patch16_siglip_gap_384.v2_webli/snapshots/0/"
                        "model.safetensors")["approximate_gelu"] is True
    assert "approximate_gelu" not in name_options("my_vit_so400m_patch16_siglip_3840.safetensors")


@pytest.mark.backend_independent
def test_a_size_that_does_not_tile_is_refused_naming_crop_to_patches():
    """Without crop_to_patches (the paper's model) 44 px in patches of 14 is refused, the option named; with it,
    a side of less than one patch is refused."""
    arch = dict(patch_size=14, hidden_size=32, mlp_dim=64, num_heads=2, num_layers=1)
    with pytest.raises(ValueError, match=r"image_size \(44, 44\) is not divisible by the patch size 14 = 14; use a "
                                         r"multiple of 14, e.g. \(42, 42\), or build with crop_to_patches=True"):
        keras_vit.VisionTransformer(image_size=44, **arch)
    with pytest.raises(ValueError, match="input height 10 is less than one 14-pixel patch"):
        keras_vit.VisionTransformer(image_size=None, input_shape=(10, None, 3), crop_to_patches=True, **arch)


@pytest.mark.backend_independent
def test_what_every_timm_vit_state_dict_does_not_record_is_read_as_timm_defines_it():
    """For every architecture of timm's ViT modules that the reader takes (built at depth 1 on the meta device, read
    with its name): its blocks are pre-norm, and the LayerNorm epsilon and the head count it reads are the ones timm
    builds, so that no architecture loads with other blocks, another epsilon or another head split, which no shape
    would show."""
    from keras_vit.weights.timm import architecture, readable, to_official, unsupported

    checked = 0
    for module_name in ("vision_transformer", "deit", "eva", "naflexvit", "vision_transformer_hybrid", "beit",
                        "vision_transformer_relpos"):
        for name in timm.list_models(module=module_name):
            try:
                with torch.device("meta"):
                    module = timm.create_model(name, pretrained=False, depth=1)
                tensors = {k: np.broadcast_to(np.float32(0), tuple(v.shape)) for k, v in module.state_dict().items()}
                tensors = readable(tensors, name)
                # refused by what its keys name, or by keys no rule maps (timm's relative-position blocks)
                read = None if unsupported(tensors) or to_official(tensors, 1)[1] else architecture(tensors, name)
            except (AssertionError, ValueError):  # timm's own, or refused by name
                continue
            if read is None:
                continue
            block = module.blocks[0]
            # pre-norm blocks, or post-norm ones read as such (by name: they store the same keys), or parallel ones
            kinds = ("ParallelScalingBlock", "DiffParallelScalingBlock") if read["parallel_blocks"] else ("ParallelThingsBlock",) if read[
                "parallel_branches"] > 1 else ("ResPostBlock", "ResPostRelPosBlock", "EvaBlockPostNorm") if read[
                "post_norm"] else ("Block", "EvaBlock", "RelPosBlock")
            assert type(block).__name__ in kinds, name
            if read["parallel_branches"] > 1:  # its branches, each a classic block's parts
                assert read["parallel_branches"] == block.num_parallel, name
                norm, attn = block.attns[0].norm, block.attns[0].attn
            else:
                norm, attn = (block.in_norm, block) if read["parallel_blocks"] else (block.norm1, block.attn)
            assert read["layer_norm_epsilon"] == pytest.approx(norm.eps), name
            assert read["timm_heads"] == attn.num_heads, name
            assert read["qk_norm"] == (type(getattr(attn, "q_norm", None)).__name__ not in ("Identity", "NoneType")), name
            assert read["differential_attention"] == (type(attn).__name__ in ("DiffAttention",
                                                                             "DiffParallelScalingBlock")), name
            if getattr(module, "attn_pool", None) is not None and module_name != "eva":  # eva's pools every token
                assert bool(read.get("map_include_prefix")) == module.pool_include_prefix, name
            checked += 1
    assert checked > 150


@pytest.mark.backend_independent
def test_architectures_whose_state_dict_reads_as_another_vit_are_refused_or_read_by_name(tmp_path):
    """timm's post-norm ViT stores the keys of a pre-norm one: named, it is read as post-norm (`post_norm=True`) and
    equals timm's; unnamed, a file without q/k/v biases is refused asking for the name. `vit_base_patch16_gap_224` has
    16 heads at width 768, read off its name."""
    from timm.models.vision_transformer import ResPostBlock

    module = TimmViT(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2, qkv_bias=False, num_classes=3,
                     class_token=False, global_pool="avg", block_fn=ResPostBlock)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=gen))
    state = {k: v.contiguous() for k, v in module.eval().state_dict().items()}
    x = _images(32, 32)
    with torch.no_grad():
        expected = module(_nchw(x)).numpy()
    path = tmp_path / "vit_base_patch16_rpn_224.sw_in1k.safetensors"
    safetensors_torch.save_file(state, str(path))
    model = keras_vit.from_timm(path, num_heads=2, classifier_activation=None)
    assert keras_vit.structure.find_vit(model).family()["post_norm"] is True
    np.testing.assert_allclose(_np(model(x)), expected, atol=1e-5 * np.abs(expected).max(), rtol=0)
    safetensors_torch.save_file(state, str(tmp_path / "model.safetensors"))
    with pytest.raises(ValueError, match="projections without bias whose name names no timm architecture"):
        keras_vit.from_timm(tmp_path / "model.safetensors")
    from keras_vit.weights.timm import architecture

    with torch.device("meta"):
        gap = timm.create_model("vit_base_patch16_gap_224", pretrained=False, depth=1)
    tensors = {k: np.broadcast_to(np.float32(0), tuple(v.shape)) for k, v in gap.state_dict().items()}
    assert architecture(tensors, "vit_base_patch16_gap_224.sw_in1k.safetensors")["timm_heads"] == 16


@pytest.mark.backend_independent
def test_a_timm_vit_without_a_final_norm_loads_as_one(tmp_path):
    """timm's RADIO ViTs (`final_norm=False`) have no norm before or after pooling; the file records it by the
    keys it lacks, and the model is built without one (`encoder_norm=False`), equal to timm's at two sizes."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from timm_files import equal_to_timm_at, redraw, timm_file

    arch = "vit_base_patch16_radio_v3"
    ref = redraw(timm.create_model(arch, pretrained=False, depth=2, img_size=64))
    path = timm_file(ref, tmp_path, arch)
    assert "encoder_norm" not in {layer.name for layer in keras_vit.from_timm(path, image_size=64).layers}
    equal_to_timm_at(ref, ((64, 64), (48, 96)), arch, path=path)  # 3 x 6: no count a class token could explain


@pytest.mark.backend_independent
def test_position_embeddings_that_cover_the_registers_load(tmp_path):
    """timm's `vit_so150m*` give their register tokens position embeddings too (no_embed_class=False with
    reg_tokens): read off the count (`register_position_embedding=True`), equal to timm's at two sizes, the
    registers' entries kept as they are when the grid's are resized."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from timm_files import equal_to_timm_at, redraw, timm_file

    arch = "vit_so150m_patch16_reg4_gap_256"
    ref = redraw(timm.create_model(arch, pretrained=False, depth=2, img_size=64, num_classes=5))
    path = timm_file(ref, tmp_path, arch)
    equal_to_timm_at(ref, ((64, 64), (48, 96)), arch, path=path)
    with pytest.raises(ValueError, match="register_position_embedding=True gives the register tokens learned position"):
        keras_vit.VisionTransformer(image_size=32, patch_size=8, hidden_size=32, mlp_dim=64, num_heads=2, num_layers=1,
                                    register_position_embedding=True)
