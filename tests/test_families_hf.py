"""Hugging Face folders of the ViT family (DeiT, DINOv2 with and without registers, CLIP, SigLIP):
parity with transformers' own outputs on tiny random models saved by save_pretrained, every
parameter moved off its initial value, the model built from `hf.architecture` and loaded by
`keras_vit.load_weights`; and what the reader refuses, by name."""

import inspect
import json
import logging

import keras
import numpy as np
import pytest

import keras_vit
from keras_vit.model import build_vit
from keras_vit.weights import foreign, hf

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

SIZE = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, patch_size=8, image_size=32)
TOWER = dict(SIZE, intermediate_size=64)
TEXT = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64, vocab_size=64,
            bos_token_id=0, eos_token_id=1, pad_token_id=1)
# the architecture's builder arguments (its input_mode is how to scale images, given only for uint8 input)
BUILDER = set(inspect.signature(build_vit).parameters) - {"input_mode"}
ATOL = 1e-5


def _perturb(module, seed=0):
    """Every parameter moved off its initial value (zero heads, unit LayerNorms, layer scales of 1
    and zero register tokens would hide mistakes)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=gen))
    return module.eval()


def _save(tmp_path, cls, config, seed=0):
    """(the perturbed transformers model, the folder save_pretrained wrote it to)."""
    torch.manual_seed(seed)
    model = _perturb(cls(config), seed)
    folder = str(tmp_path / cls.__name__)
    model.save_pretrained(folder)
    return model, folder


def _images(n=2, size=32, seed=0):
    return np.random.default_rng(seed).uniform(-1, 1, (n, size, size, 3)).astype("float32")


def _theirs(fn, x):
    with torch.no_grad():
        return fn(pixel_values=torch.from_numpy(x).permute(0, 3, 1, 2))


def _build(folder, **kw):
    """The ViT that `hf.architecture` describes, built with `kw` on top, loaded by load_weights."""
    config, tensors = hf.read_folder(folder)
    arch = hf.architecture(config, tensors)
    args = {k: v for k, v in arch.items() if k in BUILDER}
    if arch["pre_logits"]:
        args["representation_size"] = arch["hidden_size"]
    model = keras_vit.VisionTransformer(**{**args, "classes": arch["classes"] or 1000, "classifier_activation": None,
                                           **kw})
    assert keras_vit.load_weights(model, folder) is not None
    return model, arch


def _ours(model, x):
    return keras.ops.convert_to_numpy(model(x))


def _close(ours, theirs, what):
    theirs = theirs.detach().numpy() if hasattr(theirs, "detach") else np.asarray(theirs)
    err = float(np.abs(ours - theirs).max())
    print(f"{what}: max abs error {err:.2e} ({keras.backend.backend()})")
    np.testing.assert_allclose(ours, theirs, atol=ATOL, rtol=0, err_msg=what)
    assert np.abs(theirs).max() > 0.1  # a real signal


@pytest.mark.parametrize("swiglu", [False, True], ids=["mlp", "swiglu"])
def test_dinov2_pooler_and_patch_tokens_equal_transformers(swiglu, tmp_path):
    ref, folder = _save(tmp_path, transformers.Dinov2Model,
                        transformers.Dinov2Config(**SIZE, mlp_ratio=2, use_swiglu_ffn=swiglu, layerscale_value=0.5))
    pooled, arch = _build(folder, include_top=False)
    assert arch["layer_scale"] == 0.5 and arch["mlp_activation"] == ("swiglu" if swiglu else "gelu")
    assert arch["mlp_dim"] == (48 if swiglu else 64) and arch["position_interpolation"] == "bicubic"
    features, _ = _build(folder, include_top=False, pooling=None)
    x = _images()
    out = _theirs(ref, x)
    _close(_ours(pooled, x), out.pooler_output, f"dinov2 ({arch['mlp_activation']}) pooler_output")
    _close(_ours(features, x).reshape(2, 16, 32), out.last_hidden_state[:, 1:],
           f"dinov2 ({arch['mlp_activation']}) patch tokens")


def test_dinov2_with_registers_equals_transformers(tmp_path):
    """transformers adds the position embeddings to [class] + patches, then inserts the registers
    after the class token: the builder's default layout (prefix_position_embedding=True)."""
    ref, folder = _save(tmp_path, transformers.Dinov2WithRegistersModel,
                        transformers.Dinov2WithRegistersConfig(**SIZE, mlp_ratio=2, num_register_tokens=3))
    pooled, arch = _build(folder, include_top=False)
    assert arch["num_register_tokens"] == 3 and arch["prefix_position_embedding"] is True
    assert arch["position_interpolation"] == "bicubic_antialias"
    features, _ = _build(folder, include_top=False, pooling=None)
    x = _images()
    out = _theirs(ref, x)
    _close(_ours(pooled, x), out.pooler_output, "dinov2_with_registers pooler_output")
    _close(_ours(features, x).reshape(2, 16, 32), out.last_hidden_state[:, 4:], "dinov2_with_registers patch tokens")


@pytest.mark.parametrize("registers", [False, pytest.param(True, marks=pytest.mark.backend_independent)],
                         ids=["dinov2", "with_registers"])
def test_dinov2_classifiers_read_the_class_token_and_the_patch_mean_side_by_side(registers, tmp_path):
    """Dinov2ForImageClassification (and, on torch's lane, its registers twin) read by from_huggingface with no
    argument: the classifier's logits over the class token and the mean of the patch tokens (the registers left
    out) side by side (`classifier="token_gap"`), reloaded in safe mode; include_top=False gives the 2 x hidden
    representation the classifier reads."""
    cls, config = ((transformers.Dinov2WithRegistersForImageClassification, transformers.Dinov2WithRegistersConfig)
                   if registers else (transformers.Dinov2ForImageClassification, transformers.Dinov2Config))
    ref, folder = _save(tmp_path, cls, config(**SIZE, mlp_ratio=2, num_labels=3))
    model = keras_vit.from_huggingface(folder, classifier_activation=None)
    x = _images()
    _close(_ours(model, x), _theirs(ref, x).logits, f"{cls.__name__} logits")
    model.save(tmp_path / "m.keras")
    _close(_ours(keras.saving.load_model(tmp_path / "m.keras", safe_mode=True), x), _ours(model, x), "reloaded")
    features = keras_vit.from_huggingface(folder, include_top=False)
    tokens = _theirs(ref.base_model, x).last_hidden_state.numpy()
    prefix = 1 + (ref.config.num_register_tokens if registers else 0)
    _close(_ours(features, x), np.concatenate([tokens[:, 0], tokens[:, prefix:].mean(1)], -1), "the representation")


def test_clip_vision_tower_and_projection_equal_transformers(tmp_path):
    ref, folder = _save(tmp_path, transformers.CLIPVisionModel, transformers.CLIPVisionConfig(**TOWER))
    model, arch = _build(folder, include_top=False, pooling="representation")
    assert arch["pre_norm"] and arch["mlp_activation"] == "quick_gelu" and arch["layer_norm_epsilon"] == 1e-5
    x = _images()
    _close(_ours(model, x), _theirs(ref, x).pooler_output, "CLIPVisionModel pooler_output")

    ref, folder = _save(tmp_path, transformers.CLIPVisionModelWithProjection,
                        transformers.CLIPVisionConfig(**TOWER, projection_dim=16), seed=1)
    model, arch = _build(folder, include_top=True)
    assert arch["classes"] == 16
    _close(_ours(model, x), _theirs(ref, x).image_embeds, "CLIPVisionModelWithProjection image_embeds")


def test_clip_classifier_reads_the_patch_mean_before_the_final_norm(tmp_path, caplog):
    """CLIPForImageClassification: the class token in the sequence, the patch tokens' mean without the final
    norm (whose weights, read only by the pooler, are not loaded, logged) into the classifier."""
    config = transformers.CLIPConfig(vision_config=TOWER, text_config=TEXT, num_labels=3)
    ref, folder = _save(tmp_path, transformers.CLIPForImageClassification, config)
    with caplog.at_level(logging.INFO, logger="keras_vit"):
        model, arch = _build(folder, include_top=True)
    assert (arch["classifier"], arch["class_token"], arch["encoder_norm"], arch["classes"]) == ("gap", True, False, 3)
    assert arch["source_head"] == "classifier" and "post_layernorm (2 arrays)" in caplog.text
    x = _images()
    _close(_ours(model, x), _theirs(ref, x).logits, "CLIPForImageClassification logits")


def test_vit_mae_encoder_gives_the_whole_images_tokens(tmp_path, caplog):
    """ViT-MAE (ViTMAEModel, and the encoder of a ViTMAEForPreTraining, its decoder dropped and logged): the tokens of
    the whole image, as transformers' encoder gives them with no token masked (mask_ratio 0, the noise that keeps
    the tokens in order); the representation is the class token after the final norm."""
    config = transformers.ViTMAEConfig(**TOWER, mask_ratio=0.0, decoder_hidden_size=16, decoder_num_hidden_layers=1,
                                       decoder_num_attention_heads=2, decoder_intermediate_size=32)
    x = _images()
    in_order = torch.arange(16, dtype=torch.float32).expand(2, 16)
    for cls, seed in ((transformers.ViTMAEModel, 0), (transformers.ViTMAEForPreTraining, 1)):
        ref, folder = _save(tmp_path, cls, config, seed=seed)
        tokens = _theirs(lambda **kw: getattr(ref, "vit", ref)(**kw, noise=in_order), x).last_hidden_state
        with caplog.at_level(logging.INFO, logger="keras_vit"):
            model, arch = _build(folder, include_top=False)
        assert (arch["classifier"], arch["classes"], arch["source_head"], arch["input_mode"]) == (
            "token", None, "backbone", "imagenet")
        _close(_ours(model, x), tokens[:, 0], f"{cls.__name__} class token")
        features, _ = _build(folder, include_top=False, pooling=None)
        _close(_ours(features, x).reshape(2, 16, 32), tokens[:, 1:], f"{cls.__name__} patch tokens")
    assert "dropped the decoder of a ViT-MAE pre-training model" in caplog.text


def test_a_whole_clip_model_folder_loads_its_vision_tower(tmp_path, caplog):
    config = transformers.CLIPConfig(vision_config=TOWER, text_config=TEXT, projection_dim=16)
    ref, folder = _save(tmp_path, transformers.CLIPModel, config)
    with caplog.at_level(logging.INFO, logger="keras_vit"):
        model, arch = _build(folder, include_top=True)
    assert arch["classes"] == 16
    assert "dropped the text tower" in caplog.text and "text_model" in caplog.text and "logit_scale" in caplog.text
    x = _images()
    _close(_ours(model, x), _theirs(ref.get_image_features, x).pooler_output, "CLIPModel image features")


def test_siglip_vision_tower_and_whole_model_equal_transformers(tmp_path):
    ref, folder = _save(tmp_path, transformers.SiglipVisionModel, transformers.SiglipVisionConfig(**TOWER))
    model, arch = _build(folder, include_top=False)
    assert arch["classifier"] == "map" and arch["approximate_gelu"] is True and arch["layer_norm_epsilon"] == 1e-6
    x = _images()
    _close(_ours(model, x), _theirs(ref, x).pooler_output, "SiglipVisionModel pooler_output")

    config = transformers.SiglipConfig(vision_config=TOWER, text_config=TEXT)
    ref, folder = _save(tmp_path, transformers.SiglipModel, config, seed=1)
    model, _ = _build(folder, include_top=False)
    _close(_ours(model, x), _theirs(ref.get_image_features, x).pooler_output, "SiglipModel image features")


def test_siglip_classifier_and_headless_tower_take_the_token_mean(tmp_path):
    """SiglipForImageClassification classifies the mean of the tokens (classifier 'gap'); a tower
    without its head (vision_use_head false) leaves the tokens after post_layernorm."""
    config = transformers.SiglipConfig(vision_config=TOWER, text_config=TEXT, num_labels=5)
    ref, folder = _save(tmp_path, transformers.SiglipForImageClassification, config)
    model, arch = _build(folder, include_top=True)
    assert (arch["classifier"], arch["classes"]) == ("gap", 5)
    x = _images()
    _close(_ours(model, x), _theirs(ref, x).logits, "SiglipForImageClassification logits")

    ref, folder = _save(tmp_path, transformers.SiglipVisionModel,
                        transformers.SiglipVisionConfig(**TOWER, vision_use_head=False), seed=1)
    model, arch = _build(folder, include_top=False, pooling=None)
    assert arch["classifier"] == "gap"
    _close(_ours(model, x).reshape(2, 16, 32), _theirs(ref, x).last_hidden_state, "SigLIP headless tokens")


def test_deit_with_teacher_logits_and_deit_model_tokens_equal_transformers(tmp_path):
    ref, folder = _save(tmp_path, transformers.DeiTForImageClassificationWithTeacher,
                        transformers.DeiTConfig(**TOWER, num_labels=5))
    model, arch = _build(folder, include_top=True)
    assert arch["distillation_token"] and arch["classes"] == 5
    x = _images()
    _close(_ours(model, x), _theirs(ref, x).logits, "DeiTForImageClassificationWithTeacher logits")

    # DeiTModel's pooler (Dense + tanh on the class token) is loaded as pre-logits, which a
    # distillation model does not take: it is left out, the tokens are the model's
    ref, folder = _save(tmp_path, transformers.DeiTModel, transformers.DeiTConfig(**TOWER), seed=1)
    model, arch = _build(folder, include_top=False, pooling=None)
    assert arch["pre_logits"] is False
    _close(_ours(model, x).reshape(2, 16, 32), _theirs(ref, x).last_hidden_state[:, 2:], "DeiTModel patch tokens")


def test_deit_classifier_reads_the_class_token_beside_the_distillation_token(tmp_path):
    """DeiTForImageClassification is no plain ViT: the distillation token stays in the sequence and
    its head reads the class token alone, a head the builder does not make; its backbone loads."""
    ref, folder = _save(tmp_path, transformers.DeiTForImageClassification,
                        transformers.DeiTConfig(**TOWER, num_labels=5))
    model, arch = _build(folder, include_top=False, pooling="token")
    assert arch["distillation_token"] and arch["classes"] is None
    x = _images()
    _, tensors = hf.read_folder(folder)
    kernel, bias = tensors["classifier.weight"], tensors["classifier.bias"]
    _close(_ours(model, x) @ kernel.T + bias, _theirs(ref, x).logits, "DeiTForImageClassification logits")


@pytest.mark.backend_independent  # the paper's ViT, whose numerics every backend's ViT tests show
def test_vit_msn_and_ijepa_classifiers_and_tokens_equal_transformers(tmp_path):
    """ViT-MSN is the paper's ViT (LayerNorm epsilon 1e-6, no pooler): its classifier reads the class token after
    the final norm. I-JEPA has no class token: its classifier reads the mean of the tokens (classifier 'gap'),
    its model the final tokens."""
    x = _images()
    for cls, config_cls, classifier in ((transformers.ViTMSNForImageClassification, transformers.ViTMSNConfig,
                                         "token"),
                                        (transformers.IJepaForImageClassification, transformers.IJepaConfig, "gap")):
        ref, folder = _save(tmp_path, cls, config_cls(**TOWER, num_labels=5))
        model, arch = _build(folder, include_top=True)
        assert (arch["classifier"], arch["classes"]) == (classifier, 5)
        _close(_ours(model, x), _theirs(ref, x).logits, f"{cls.__name__} logits")
    ref, folder = _save(tmp_path, transformers.IJepaModel, transformers.IJepaConfig(**TOWER), seed=1)
    model, arch = _build(folder, include_top=False, pooling=None)
    _close(_ours(model, x).reshape(2, 16, 32), _theirs(ref, x).last_hidden_state, "IJepaModel tokens")


# --- facts that do not depend on the backend --------------------------------------------------------


@pytest.mark.backend_independent
def test_a_folders_image_processor_says_how_its_images_are_scaled(tmp_path, caplog):
    """`input_mode` comes from the folder's preprocessor_config.json where it has one (ImageNet's statistics in a
    ViT-MSN folder, CLIP's in another), else from the family (a ViT's [-1, 1]); statistics of no mode, or a file
    without them, leave the family's, logged."""
    _, folder = _save(tmp_path, transformers.ViTMSNModel, transformers.ViTMSNConfig(**TOWER))
    processor = tmp_path / "ViTMSNModel" / hf.PROCESSOR_FILE
    assert foreign.read(folder).arch["input_mode"] == "vit"
    for mean, std, mode in (([0.485, 0.456, 0.406], [0.229, 0.224, 0.225], "imagenet"),
                            ([0.48145466, 0.4578275, 0.40821073], [0.26862954, 0.26130258, 0.27577711], "clip"),
                            ([0.5, 0.4, 0.3], [0.2, 0.2, 0.2], "vit")):
        processor.write_text(json.dumps({"image_mean": mean, "image_std": std, "do_normalize": True}))
        with caplog.at_level(logging.INFO, logger="keras_vit"):
            assert foreign.read(folder).arch["input_mode"] == mode
    assert "are no mode of preprocess_input; 'vit' scaling is assumed" in caplog.text
    processor.write_text("{}")
    assert foreign.read(folder).arch["input_mode"] == "vit"

FAMILIES = {
    "vit": (transformers.ViTModel, lambda: transformers.ViTConfig(**TOWER)),
    "deit": (transformers.DeiTForImageClassificationWithTeacher,
             lambda: transformers.DeiTConfig(**TOWER, num_labels=3)),
    "dinov2": (transformers.Dinov2Model, lambda: transformers.Dinov2Config(**SIZE, mlp_ratio=2, use_swiglu_ffn=True)),
    "dinov2_with_registers": (transformers.Dinov2WithRegistersModel,
                              lambda: transformers.Dinov2WithRegistersConfig(**SIZE, mlp_ratio=2)),
    "clip_vision_model": (transformers.CLIPVisionModelWithProjection,
                          lambda: transformers.CLIPVisionConfig(**TOWER, projection_dim=8)),
    "siglip_vision_model": (transformers.SiglipVisionModel, lambda: transformers.SiglipVisionConfig(**TOWER)),
}


@pytest.mark.backend_independent
@pytest.mark.parametrize("kind", FAMILIES)
def test_the_saved_names_and_transformers_5_module_names_map_alike(kind, tmp_path):
    """save_pretrained writes the names of the hub checkpoints; transformers 5 renames modules in
    memory (q_proj, o_proj, gate_proj/up_proj, layers.i): a state dict of either maps the same."""
    cls, config = FAMILIES[kind]
    module, folder = _save(tmp_path, cls, config())
    cfg, saved = hf.read_folder(folder)
    assert cfg["model_type"] == kind
    memory = {k: v.detach().numpy() for k, v in module.state_dict().items()}
    a, unmapped_a = hf.to_official(saved, 2)
    b, unmapped_b = hf.to_official(memory, 2)
    assert unmapped_a == [] and unmapped_b == []
    assert sorted(a) == sorted(b)
    for key in a:
        np.testing.assert_array_equal(a[key], b[key], err_msg=key)


@pytest.mark.backend_independent
def test_position_interpolation_and_activations_per_family(tmp_path):
    expected = {"vit": "bicubic", "deit": "bicubic", "dinov2": "bicubic", "dinov2_with_registers": "bicubic_antialias",
                "clip_vision_model": "bicubic", "siglip_vision_model": "bicubic"}
    for kind, (cls, config) in FAMILIES.items():
        _, folder = _save(tmp_path / kind, cls, config())
        arch = hf.architecture(*hf.read_folder(folder))
        assert arch["position_interpolation"] == expected[kind], kind
        assert {"distillation_token", "num_register_tokens", "prefix_position_embedding", "layer_scale", "pre_norm",
                "fc_norm", "mlp_activation"} <= set(arch), kind
    for act, (mlp, approximate) in {"gelu": ("gelu", False), "gelu_new": ("gelu", True),
                                    "gelu_pytorch_tanh": ("gelu", True), "quick_gelu": ("quick_gelu", False)}.items():
        arch = hf.architecture({"model_type": "clip_vision_model", "hidden_act": act, **TOWER},
                               {"embeddings.patch_embedding.weight": np.zeros((32, 3, 8, 8))})
        assert (arch["mlp_activation"], arch["approximate_gelu"]) == (mlp, approximate), act


def _config(folder, config):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    return str(folder)


@pytest.mark.backend_independent
@pytest.mark.parametrize("config, match", [
    ({"model_type": "clip", "text_config": {}}, "describes no vision tower"),
    ({"model_type": "clip_text_model"}, "a CLIP text tower"),
    ({"model_type": "siglip2"}, "SigLIP 2"),
    ({"model_type": "swin"}, "model_type 'swin'"),
    ({"model_type": "dinov2", "hidden_act": "relu"}, "hidden_act 'relu'"),
    ({"model_type": "siglip", "vision_config": {"hidden_act": "silu"}}, "hidden_act 'silu'"),
    ({"model_type": "deit", "qkv_bias": False}, "qkv_bias"),
    ({"model_type": "vit", "patch_size": [16, 8]}, "square"),
])
def test_configs_the_builder_cannot_make_are_refused_by_name(config, match, tmp_path):
    with pytest.raises(ValueError, match=match):
        hf.read_config(_config(tmp_path, config))


@pytest.mark.backend_independent
def test_a_folder_without_a_vision_tower_is_refused():
    text_only = {"text_model.embeddings.token_embedding.weight": np.zeros((4, 32)), "logit_scale": np.zeros(())}
    with pytest.raises(ValueError, match="no vision tower"):
        hf.architecture({"model_type": "clip", "vision_config": TOWER}, text_only)



def _predicted(model, x):
    """`model.predict`: one compiled program (jax's op-by-op first call compiles each op for each new size)."""
    return model.predict(x, verbose=0)


def test_siglip_so400m_geometry_patch_14_at_384_px_equals_transformers(tmp_path):
    """SigLIP so400m/14 at 384 px (issue 53): transformers' patch convolution (no padding) cuts 27 x 27
    patches and leaves the last 6 rows and columns unread; the model loaded from the folder takes the
    same 384 px images (crop_to_patches) and gives transformers' outputs, and so does one of any size
    there and at 400 px (interpolate_pos_encoding: 28 x 28 patches, 8 pixels unread)."""
    geometry = dict(TOWER, image_size=384, patch_size=14, num_hidden_layers=1)
    ref, folder = _save(tmp_path, transformers.SiglipVisionModel, transformers.SiglipVisionConfig(**geometry))
    model = keras_vit.from_huggingface(folder, include_top=False)
    assert model.input_shape[1:3] == (384, 384) and keras_vit.structure.find_vit(model).grid_size == (27, 27)
    anysize = keras_vit.from_huggingface(folder, include_top=False, input_shape=(None, None, 3))
    for size in (384, 400):
        x = _images(size=size)
        with torch.no_grad():
            theirs = ref(pixel_values=torch.from_numpy(x).permute(0, 3, 1, 2), interpolate_pos_encoding=size != 384)
        if size == 384:
            _close(_predicted(model, x), theirs.pooler_output, "SiglipVisionModel 384/14 at 384 px")
        _close(_predicted(anysize, x), theirs.pooler_output, f"SiglipVisionModel 384/14 of any size at {size} px")
