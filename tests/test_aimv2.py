"""AIMv2 (RMSNorm for every norm, one on the patch embeddings, SwiGLU, no biases): timm's `aimv2_*` files read by
`from_timm`, equal to timm's own random-weight models at two image sizes and at any size, reloaded in safe mode; the
head counts their names tell, checked against timm's definitions; an unnamed file refused in one line."""

import os
import sys

import keras
import numpy as np
import pytest

import keras_vit

torch = pytest.importorskip("torch")
pytest.importorskip("safetensors.torch")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
from timm_files import close, equal_to_timm_at, redraw, timm_file, to_numpy  # noqa: E402
from timm_peer import import_timm  # noqa: E402

timm = import_timm()
ARCH = "aimv2_large_patch14_224"
SIZES = ((56, 56), (42, 70))  # the size timm's model is made at, and another (not square)


def _timm(seed=0):
    """timm's AIMv2-L/14 at depth 2 made at 56 px, 5 classes, its weights all drawn anew."""
    return redraw(timm.create_model(ARCH, pretrained=False, depth=2, img_size=SIZES[0], num_classes=5), seed)


def test_timm_aimv2_files_equal_timm_at_two_sizes(tmp_path):
    """The logits at the size timm's model is made at and another (position embeddings resized by timm's rule),
    the head count (8 at width 1024), RMSNorm and its epsilon read off the name."""
    ref = _timm()
    equal_to_timm_at(ref, SIZES, ARCH, path=timm_file(ref, tmp_path, ARCH))


@pytest.mark.backend_independent
def test_an_aimv2_model_of_any_size_reloads_and_an_unnamed_file_is_refused(tmp_path):
    """`any_size` of an AIMv2 model gives timm's outputs at two sizes and reloads from `.keras` in safe mode; a file
    whose name does not say its architecture is refused in one line asking for it."""
    ref = _timm()
    model = keras_vit.any_size(keras_vit.from_timm(timm_file(ref, tmp_path, ARCH), image_size=SIZES[0],
                                                   classifier_activation=None))
    assert model.get_layer("embed_norm").__class__ is keras.layers.RMSNormalization
    x, expected = equal_to_timm_at(ref, SIZES, "any size", model=model)
    model.save(tmp_path / "m.keras")
    close(to_numpy(keras.saving.load_model(tmp_path / "m.keras", safe_mode=True)(x)), expected, "reloaded")
    with pytest.raises(ValueError, match=r"projections without bias whose name names no timm architecture.* name the "
                                         r"file after its timm architecture"):
        keras_vit.from_timm(timm_file(ref, tmp_path, "model"))


@pytest.mark.backend_independent
def test_every_timm_aimv2_architecture_is_read_as_timm_defines_it():
    """For every AIMv2 architecture timm has, made at depth 1 on the meta device: the state dict read with its name
    gives timm's head count, RMSNorm and its epsilon, the norm on the patch embeddings, SwiGLU, CLIP's input
    statistics and the pretrained size; and each is in the table."""
    from keras_vit.preprocessing import NORMALIZATIONS
    from keras_vit.weights import timm as timm_keys

    archs = timm.list_models("aimv2_*")
    assert set(archs) == set(timm_keys.TIMM_AIMV2_HEADS)
    for arch in archs:
        with torch.device("meta"):
            ref = timm.create_model(arch, pretrained=False, depth=1)
        tensors = {k: np.broadcast_to(np.float32(0), tuple(v.shape)) for k, v in ref.state_dict().items()}
        read = timm_keys.architecture(timm_keys.readable(tensors, arch), arch)
        norm, cfg = ref.blocks[0].norm1, timm.models.get_pretrained_cfg(arch)
        assert type(norm).__name__ == "RmsNorm" and type(ref.patch_embed.norm).__name__ == "RmsNorm", arch
        assert (read["timm_heads"], read["normalization"], read["layer_norm_epsilon"], read["embed_norm"]) == (
            ref.blocks[0].attn.num_heads, "rms_norm", norm.eps, True), arch
        assert read["mlp_activation"] == "swiglu" and read["mlp_dim"] == ref.blocks[0].mlp.fc2.in_features, arch
        assert tuple(NORMALIZATIONS[read["input_mode"]][0]) == pytest.approx(cfg.mean), arch
        assert read["classifier"] == "gap" and not read["fc_norm"], arch


@pytest.mark.parametrize("kind", ["tower_with_head", *(pytest.param(k, marks=pytest.mark.backend_independent)
                                                       for k in ("tower", "two_towers"))])  # these: torch's lane
def test_transformers_aimv2_folders_equal_transformers(kind, tmp_path):
    """An Aimv2VisionModel saved by `save_pretrained`, read by `from_huggingface` with no argument: with its
    attention-pooling head (its class token the query as it is, no MLP after) the pooler output, without it the
    tokens' mean; the tokens themselves as a grid (`pooling=None`). A whole Aimv2Model: its image embedding (the
    pooled tower through the visual projection). RMSNorm's epsilon, the gated SiLU MLP and the missing biases come
    from the config."""
    import transformers

    vision = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=48, image_size=32,
                  patch_size=8, use_head=kind != "tower", rms_norm_eps=1e-4)
    torch.manual_seed(0)
    if kind == "two_towers":
        config = transformers.Aimv2Config(vision_config=vision, projection_dim=24, text_config=dict(
            hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=48, vocab_size=50,
            eos_token_id=49))
        ref = transformers.Aimv2Model(config).eval()
        with torch.no_grad():  # every parameter moved off its initial value (the logit scale is a 0-d tensor)
            for p in ref.parameters():
                p.add_(0.3 * torch.randn(p.shape))
    else:
        ref = redraw(transformers.Aimv2VisionModel(transformers.Aimv2VisionConfig(**vision)))
    ref.save_pretrained(tmp_path / "hf")
    x = np.random.default_rng(0).uniform(-1, 1, (2, 32, 32, 3)).astype("float32")
    pixels = torch.from_numpy(x).permute(0, 3, 1, 2)
    with torch.no_grad():
        if kind == "two_towers":
            features = ref.get_image_features(pixel_values=pixels)
            expected = getattr(features, "pooler_output", features).numpy()
        else:
            out = ref(pixel_values=pixels)
            expected = (out.pooler_output if kind == "tower_with_head" else out.last_hidden_state.mean(1)).numpy()
    model = keras_vit.from_huggingface(tmp_path / "hf")
    close(to_numpy(model(x)), expected, kind)
    if kind == "tower_with_head":  # the head without an MLP (map_mlp_dim=0) reloads in safe mode; a native tower
        model.save(tmp_path / "m.keras")
        close(to_numpy(keras.saving.load_model(tmp_path / "m.keras", safe_mode=True)(x)), expected, "reloaded")
        config = (tmp_path / "hf" / "config.json").read_text()
        (tmp_path / "hf" / "config.json").write_text(config.replace('"is_native": false', '"is_native": true'))
        with pytest.raises(ValueError, match="an AIMv2 'native' tower .* which keras-vit does not build yet"):
            keras_vit.from_huggingface(tmp_path / "hf")
        (tmp_path / "hf" / "config.json").write_text(config)
    if kind != "two_towers":
        grid = to_numpy(keras_vit.from_huggingface(tmp_path / "hf", pooling=None)(x))
        close(grid.reshape(2, 16, 32), out.last_hidden_state.numpy(), f"{kind}: the tokens")
