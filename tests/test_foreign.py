"""timm and Hugging Face weights: parity with the libraries themselves on tiny random models written
to files by those libraries, the reverse through timm's own .npz loader, and refused inputs."""

import json
import os
import pickle
import subprocess
import sys

import keras
import numpy as np
import pytest

import keras_vit
from keras_vit.convert import build_from
from keras_vit.weights import save_npz

torch = pytest.importorskip("torch")
safetensors_torch = pytest.importorskip("safetensors.torch")
transformers = pytest.importorskip("transformers")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
from timm_peer import import_timm  # noqa: E402

timm = import_timm()
from timm.models.vision_transformer import VisionTransformer as TimmViT  # noqa: E402

ARCH = dict(patch_size=8, hidden_size=32, mlp_dim=64, num_heads=2, num_layers=2)


def _perturb(module, seed=0):
    """Every parameter moved off its initial value (zero heads, unit LayerNorms would hide mistakes)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=gen))
    return module.eval()


def _timm(image_size=32, classes=10, **kw):
    return _perturb(TimmViT(img_size=image_size, patch_size=8, embed_dim=32, depth=2, num_heads=2, mlp_ratio=2,
                            num_classes=classes, **kw))


def _save(module, path):
    if str(path).endswith(".safetensors"):
        safetensors_torch.save_file(module.state_dict(), str(path))
    else:
        torch.save(module.state_dict(), str(path))
    return str(path)


def _images(h, w, n=2, seed=0):
    return np.random.default_rng(seed).uniform(-1, 1, (n, h, w, 3)).astype("float32")


def _torch_out(module, x):
    with torch.no_grad():
        return module(torch.from_numpy(x).permute(0, 3, 1, 2))


def _ours(model, x):
    return keras.ops.convert_to_numpy(model(x))


TIMM_CASES = {
    "token": (dict(), dict(), ".safetensors"),
    "gap": (dict(class_token=False, global_pool="avg", fc_norm=False), dict(classifier="gap"), ".pth"),
    "non_square": (dict(image_size=(32, 48)), dict(image_size=(32, 48)), ".bin"),
}


@pytest.mark.parametrize("case", TIMM_CASES)
def test_timm_outputs_equal_ours(case, tmp_path):
    timm_kw, ours_kw, suffix = TIMM_CASES[case]
    ref = _timm(**timm_kw)
    path = _save(ref, tmp_path / f"{case}{suffix}")
    model = keras_vit.VisionTransformer(**{**ARCH, "image_size": 32, **ours_kw}, classes=10, approximate_gelu=False,
                                        classifier_activation=None)
    assert keras_vit.load_weights(model, path) == []
    x = _images(*model.input_shape[1:3])
    expected = _torch_out(ref, x).numpy()
    np.testing.assert_allclose(_ours(model, x), expected, atol=1e-5, rtol=0)
    assert np.abs(expected).max() > 0.1  # a real signal, not zeros


def test_factory_takes_architecture_and_numerics_from_a_timm_file(tmp_path):
    ref = _perturb(TimmViT(img_size=32, patch_size=16, embed_dim=192, depth=12, num_heads=3, num_classes=7))
    path = _save(ref, tmp_path / "vit_tiny.safetensors")
    model = keras_vit.ViT_Ti16(weights=path, classifier_activation=None)
    assert model.input_shape[1:3] == (32, 32) and model.output_shape == (None, 7)
    block = model.get_layer("encoderblock_0")
    assert block.approximate_gelu is False and block.layer_norm_epsilon == 1e-6
    x = _images(32, 32, n=1)
    np.testing.assert_allclose(_ours(model, x), _torch_out(ref, x).numpy(), atol=1e-5, rtol=0)


@pytest.mark.backend_independent
def test_a_foreign_file_is_read_once(tmp_path, monkeypatch, capsys):
    """Each way in reads the file once and passes what it read on: the model is shaped by the file's
    facts, then its tensors load, and the CLI's input mode comes from the same reading."""
    from keras_vit.cli import main
    from keras_vit.weights import foreign

    timm_file = _save(_timm(image_size=32), tmp_path / "tiny.safetensors")
    _hf_folder(tmp_path / "hf", transformers.ViTForImageClassification, image_size=32, num_labels=5)
    reads = []
    real = foreign._read
    monkeypatch.setattr(foreign, "_read", lambda path: reads.append(path) or real(path))
    ti_file = _save(TimmViT(img_size=32, patch_size=16, embed_dim=192, depth=12, num_heads=3, num_classes=7),
                    tmp_path / "vit_tiny.safetensors")
    for load in (lambda: keras_vit.from_timm(timm_file, num_heads=2), lambda: build_from(tmp_path / "hf"),
                 lambda: keras_vit.ViT_Ti16(weights=ti_file),
                 lambda: keras_vit.from_huggingface(tmp_path / "hf"),
                 lambda: keras_vit.VisionTransformer(**ARCH, image_size=32, classes=10, approximate_gelu=False,
                                                     weights=timm_file),
                 lambda: main(["predict", "--weights", str(tmp_path / "hf"), str(tmp_path / "img.png")])):
        reads.clear()
        if not os.path.exists(tmp_path / "img.png"):
            from PIL import Image

            Image.fromarray(np.zeros((32, 32, 3), np.uint8)).save(tmp_path / "img.png")
        load()
        assert len(reads) == 1, reads
    capsys.readouterr()


def _hf_folder(path, cls, seed=0, **config):
    cfg = transformers.ViTConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                                 patch_size=8, **config)
    torch.manual_seed(seed)
    kw = {"add_pooling_layer": True} if cls is transformers.ViTModel else {}
    model = _perturb(cls(cfg, **kw), seed)
    model.save_pretrained(str(path))
    return model


@pytest.mark.parametrize("image_size", [32, (32, 48)])
def test_hugging_face_classifier_outputs_equal_ours(image_size, tmp_path):
    ref = _hf_folder(tmp_path / "hf", transformers.ViTForImageClassification, image_size=image_size,
                     num_labels=5)
    assert os.path.exists(tmp_path / "hf" / "model.safetensors")
    model = build_from(tmp_path / "hf", classifier_activation=None)
    block = model.get_layer("encoderblock_0")
    assert block.approximate_gelu is False and block.layer_norm_epsilon == 1e-12
    x = _images(*model.input_shape[1:3])
    expected = _torch_out(ref, x).logits.numpy()
    np.testing.assert_allclose(_ours(model, x), expected, atol=1e-5, rtol=0)


def test_hugging_face_pooler_is_the_pre_logits(tmp_path):
    ref = _hf_folder(tmp_path / "hf", transformers.ViTModel, image_size=32)
    model = keras_vit.VisionTransformer(**ARCH, image_size=32, include_top=False, representation_size=32,
                                        approximate_gelu=False, layer_norm_epsilon=1e-12)
    keras_vit.load_weights(model, str(tmp_path / "hf"))
    x = _images(32, 32)
    np.testing.assert_allclose(_ours(model, x), _torch_out(ref, x).pooler_output.numpy(), atol=1e-5, rtol=0)


def test_convert_cli_writes_a_keras_file_that_reloads_in_safe_mode(tmp_path):
    """`keras-vit convert` as a user runs it: a fresh interpreter whose first import is the CLI's."""
    ref = _timm(image_size=32)
    path = _save(ref, tmp_path / "tiny.safetensors")
    out = tmp_path / "out" / "tiny.keras"
    done = subprocess.run([sys.executable, "-m", "keras_vit.cli", "convert", path, str(out), "--num-heads", "2"],
                          env=dict(os.environ, PYTHONPATH=ROOT), capture_output=True, text=True, timeout=280)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == f"wrote {out}"
    assert sorted(os.listdir(out.parent)) == ["tiny.keras"]  # no temp file left
    model = keras.saving.load_model(out, safe_mode=True)
    x = _images(32, 32)
    expected = torch.softmax(_torch_out(ref, x), -1).numpy()
    np.testing.assert_allclose(_ours(model, x), expected, atol=1e-6, rtol=0)
    assert model.get_layer("encoderblock_1").approximate_gelu is False  # the numerics survive saving


def test_timm_npz_loader_reads_our_save_npz_to_our_outputs(tmp_path):
    from timm.models.vision_transformer import _load_weights

    model = keras_vit.VisionTransformer(**ARCH, image_size=32, classes=10, approximate_gelu=False,
                                        classifier_activation=None)
    for i, var in enumerate(model.weights):
        var.assign(np.random.default_rng(i).normal(0, 0.1, var.shape).astype("float32"))
    path = save_npz(model, str(tmp_path / "ours.npz"))
    ref = TimmViT(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2, mlp_ratio=2, num_classes=10).eval()
    _load_weights(ref, path)
    x = _images(32, 32)
    np.testing.assert_allclose(_torch_out(ref, x).numpy(), _ours(model, x), atol=1e-5, rtol=0)


def _tiny_model():
    model = keras_vit.VisionTransformer(**ARCH, image_size=32, classes=10, approximate_gelu=False)
    return model, [w.numpy().copy() for w in model.weights]


def _unchanged(model, before):
    return all(np.array_equal(w.numpy(), b) for w, b in zip(model.weights, before))


@pytest.mark.backend_independent
@pytest.mark.parametrize("kind, match", [
    ("deit", r"holds a DeiT ViT \(distillation token\); model 'vit' is a ViT of the paper's layout: "
             r"distillation_token=True in the file, False in the model"),
    ("registers", r"4 register tokens\); model 'vit' is a ViT of the paper's layout: num_register_tokens=4 in the file"),
    ("clip", r"CLIP-style ViT \(pre-norm\).*pre_norm=True in the file, False in the model"),
    ("layer_scale", "layer_scale=1e-05 in the file, None in the model"),
    ("beit", r"BEiT-style ViT \(relative position bias\)"),
    ("eva", r"timm's Eva layout .* name the file after its timm architecture"),
    ("rope_mixed", "learned rotary frequencies"),
    ("hybrid", r"a hybrid whose backbone is no ResNetV2 \(timm's ResNet-D hybrids"),
    ("missing", "missing from the file"),
    ("extra", "has no place for"),
    ("shapes", "shape mismatch"),
])
def test_other_architectures_and_broken_state_dicts_are_refused_whole(kind, match, tmp_path):
    if kind == "deit":
        from timm.models.deit import VisionTransformerDistilled

        state = VisionTransformerDistilled(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2,
                                           mlp_ratio=2, num_classes=10).state_dict()
    elif kind == "registers":
        state = _timm(reg_tokens=4).state_dict()
    elif kind == "clip":
        state = _timm(pre_norm=True, class_token=True).state_dict()
    elif kind == "layer_scale":
        state = _timm(init_values=1e-5).state_dict()
    else:
        state = _timm().state_dict()
        if kind == "missing":
            del state["blocks.1.mlp.fc2.weight"]
        elif kind == "beit":
            state["blocks.0.attn.relative_position_bias_table"] = torch.zeros(10, 2)
        elif kind == "eva":  # q/v biases apart, in a file whose name says no architecture
            state["blocks.0.attn.q_bias"] = torch.zeros(32)
        elif kind == "rope_mixed":
            state["rope.freqs"] = torch.zeros(8)
        elif kind == "extra":
            state["blocks.0.attn.extra.weight"] = torch.zeros(3)
        elif kind == "hybrid":  # the stem keys of timm's vit_*_resnet26d_* files (a ResNet-D, BatchNorm)
            state["patch_embed.backbone.conv1.0.weight"] = torch.zeros(32, 3, 3, 3)
            state["patch_embed.backbone.bn1.weight"] = torch.ones(64)
        else:
            state = TimmViT(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2, mlp_ratio=3,
                            num_classes=10).state_dict()
    path = str(tmp_path / "bad.safetensors")
    safetensors_torch.save_file({k: v.contiguous() for k, v in state.items()}, path)
    model, before = _tiny_model()
    with pytest.raises(ValueError, match=match):
        keras_vit.load_weights(model, path)
    assert _unchanged(model, before)


@pytest.mark.backend_independent
def test_a_pth_that_needs_arbitrary_unpickling_is_refused(tmp_path):
    class Payload:
        def __reduce__(self):
            return (os.system, ("echo pwned",))

    path = tmp_path / "evil.pth"
    with open(path, "wb") as f:
        pickle.dump({"patch_embed.proj.weight": Payload()}, f)
    torch.save({"state": _timm().state_dict(), "opt": object.__new__(Payload)}, tmp_path / "objects.pth")
    model, before = _tiny_model()
    for name in ("evil.pth", "objects.pth"):
        with pytest.raises(ValueError, match=r"unpickling objects other than tensors"):
            keras_vit.load_weights(model, str(tmp_path / name))
    assert _unchanged(model, before)


@pytest.mark.backend_independent
def test_truncated_safetensors_and_a_clip_folder_are_refused(tmp_path):
    path = _save(_timm(), tmp_path / "ok.safetensors")
    data = open(path, "rb").read()
    for name, content in (("cut.safetensors", data[: len(data) // 2]), ("tiny.safetensors", b"\x01\x02")):
        (tmp_path / name).write_bytes(content)
        model, before = _tiny_model()
        with pytest.raises(ValueError, match="not a readable weights file"):
            keras_vit.load_weights(model, str(tmp_path / name))
        assert _unchanged(model, before)
    clip = transformers.CLIPVisionModel(transformers.CLIPVisionConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, image_size=32, patch_size=8))
    clip.save_pretrained(str(tmp_path / "clip"))
    with pytest.raises(ValueError, match=r"holds a CLIP-style ViT \(pre-norm, quick_gelu\); model 'vit' is a ViT of "
                                         r"the paper's layout: pre_norm=True in the file, False in the model, "
                                         r"mlp_activation='quick_gelu' in the file, 'gelu' in the model"):
        keras_vit.load_weights(_tiny_model()[0], str(tmp_path / "clip"))
    json.dump({"model_type": "vit", "hidden_act": "relu"}, open(tmp_path / "config.json", "w"))
    with pytest.raises(ValueError, match="hidden_act 'relu'"):
        keras_vit.load_weights(_tiny_model()[0], str(tmp_path))


def test_hf_head_count_must_match_the_model(tmp_path):
    _hf_folder(tmp_path / "hf", transformers.ViTForImageClassification, image_size=32, num_labels=10)
    model = keras_vit.VisionTransformer(**{**ARCH, "num_heads": 4}, image_size=32, classes=10)
    before = [w.numpy().copy() for w in model.weights]
    with pytest.raises(ValueError, match="2 attention heads, model 'vit' has 4"):
        keras_vit.load_weights(model, str(tmp_path / "hf"))
    assert _unchanged(model, before)
