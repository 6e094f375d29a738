"""Hugging Face `ViTModel` / `ViTForImageClassification` folders (config.json + model.safetensors
or pytorch_model.bin) -> official ViT keys, the architecture read from config.json."""

import json
import os
import re

from keras_vit.weights.tensors import read_tensors
from keras_vit.weights.timm import module_rules, transform

WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
# config.json hidden_act -> approximate_gelu
GELUS = {"gelu": False, "gelu_new": True, "gelu_pytorch_tanh": True}

_L = r"encoder\.layer\.(\d+)\."
_B = "Transformer/encoderblock_{0}/"
_A = _B + "MultiHeadDotProductAttention_1/"
# HF key (regex, after an optional "vit." prefix) -> official key and transform (as timm.transform)
_RULES = (
    *module_rules(r"embeddings\.patch_embeddings\.projection", "embedding", "conv"),
    (r"embeddings\.cls_token", "cls", "same"),
    (r"embeddings\.position_embeddings", "Transformer/posembed_input/pos_embedding", "same"),
    *module_rules(_L + "layernorm_before", _B + "LayerNorm_0", "norm"),
    (_L + r"attention\.attention\.(query|key|value)\.weight", _A + "{1}/kernel", "heads_kernel"),
    (_L + r"attention\.attention\.(query|key|value)\.bias", _A + "{1}/bias", "heads_bias"),
    *module_rules(_L + r"attention\.output\.dense", _A + "out", "out_kernel"),
    *module_rules(_L + "layernorm_after", _B + "LayerNorm_2", "norm"),
    *module_rules(_L + r"intermediate\.dense", _B + "MlpBlock_3/Dense_0", "linear"),
    *module_rules(_L + r"output\.dense", _B + "MlpBlock_3/Dense_1", "linear"),
    *module_rules("layernorm", "Transformer/encoder_norm", "norm"),
    *module_rules(r"pooler\.dense", "pre_logits", "linear"),  # ViTModel's pooler: Dense + tanh on [class]
    *module_rules("classifier", "head", "linear"),
)
_COMPILED = tuple((re.compile(r"(?:vit\.)?" + p + "$"), t, h) for p, t, h in _RULES)
# keys the ViT does not use and may be dropped (the masked-image-modelling token)
IGNORED = re.compile(r"(?:vit\.)?embeddings\.mask_token$")


def is_hf_folder(path):
    return os.path.isdir(path) and os.path.exists(os.path.join(path, "config.json"))


def read_config(folder):
    """config.json of a Hugging Face ViT folder, refused when it describes another model."""
    path = os.path.join(folder, "config.json")
    try:
        with open(path) as f:
            config = json.load(f)
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"{path} is not a readable JSON model config: {err}") from None
    kind = config.get("model_type")
    if kind != "vit":
        what = {"deit": "a DeiT (distillation token)", "clip_vision_model": "a CLIP vision tower",
                "clip": "a CLIP model", "dinov2": "a DINOv2 ViT (layer scale, registers)",
                "dinov2_with_registers": "a ViT with registers"}.get(kind, f"model_type {kind!r}")
        raise ValueError(f"{folder} holds {what}; keras_vit loads Hugging Face ViT folders (model_type 'vit')")
    act = config.get("hidden_act", "gelu")
    if act not in GELUS:
        raise ValueError(f"{path}: hidden_act {act!r} is not one the ViT builder makes; expected one of {list(GELUS)}")
    if not config.get("qkv_bias", True) or config.get("num_channels", 3) != 3:
        raise ValueError(f"{path}: expected qkv_bias true and 3 channels, got qkv_bias={config.get('qkv_bias')}, "
                         f"num_channels={config.get('num_channels')}")
    return config


def read_folder(folder):
    """(config, {name: array}) of a Hugging Face ViT folder."""
    config = read_config(folder)
    for name in WEIGHT_FILES:
        path = os.path.join(folder, name)
        if os.path.exists(path):
            return config, read_tensors(path)
    raise FileNotFoundError(f"{folder} has a config.json but no weights file (expected one of {', '.join(WEIGHT_FILES)})")


def _pair(size):
    return tuple(size) if isinstance(size, (list, tuple)) else (size, size)


def architecture(config, tensors):
    """Builder arguments of the model a Hugging Face ViT folder holds."""
    head = tensors.get("classifier.weight")
    return dict(
        patch_size=int(config["patch_size"]), hidden_size=int(config["hidden_size"]),
        mlp_dim=int(config["intermediate_size"]), num_heads=int(config["num_attention_heads"]),
        num_layers=int(config["num_hidden_layers"]), resnet=None, classifier="token",
        classes=None if head is None else int(head.shape[0]),
        image_size=_pair(config.get("image_size", 224)),
        pre_logits=any(k.endswith("pooler.dense.weight") for k in tensors),
        approximate_gelu=GELUS[config.get("hidden_act", "gelu")],
        layer_norm_epsilon=float(config.get("layer_norm_eps", 1e-12)),
    )


def to_official(tensors, num_heads):
    """(official arrays, HF keys no rule maps) of a Hugging Face ViT state dict."""
    arrays, unmapped = {}, []
    for key, value in tensors.items():
        if IGNORED.match(key):
            continue
        for pattern, template, how in _COMPILED:
            match = pattern.match(key)
            if match:
                groups = match.groups()
                official = re.sub(r"\{(\d)\}", lambda m: groups[int(m.group(1))], template)
                if how == "heads_kernel":
                    value, how = value.T.reshape(value.shape[1], num_heads, -1), "same"
                elif how == "heads_bias":
                    value, how = value.reshape(num_heads, -1), "same"
                arrays[official] = transform(how, value, num_heads)
                break
        else:
            unmapped.append(key)
    return arrays, unmapped
