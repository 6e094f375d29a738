"""Hugging Face folders (config.json + model.safetensors or pytorch_model.bin) of the ViT family ->
official ViT keys, the architecture read from config.json.

config.json `model_type` -> what the folder holds and how the builder makes it:

    vit                    ViTModel / ViTForImageClassification: the paper's ViT (exact GELU, eps 1e-12)
    deit                   DeiTModel / DeiTForImageClassification(WithTeacher): a distillation token
                           after the class token; the teacher model's two heads -> head, head_dist
    vit_msn                ViTMSNModel / ViTMSNForImageClassification: the paper's ViT (eps 1e-6), no pooler
    ijepa                  IJepaModel / IJepaForImageClassification: no class token; the tokens' mean
    dinov2                 Dinov2Model / Dinov2Backbone: layer scale on both residual branches,
                           a SwiGLU MLP with use_swiglu_ffn
    dinov2_with_registers  the same plus register tokens after the class token (no position embedding)
    clip_vision_model      CLIPVisionModel(WithProjection): a LayerNorm before block 0 (pre_layrnorm),
                           QuickGELU; the projection (no bias) is the head, with a zero bias
    siglip_vision_model    SiglipVisionModel: no class token, an attention-pooling (MAP) head
    siglip2_vision_model   Siglip2VisionModel: SigLIP 2's NaFlex tower, built with naflex=True (a dict of
                           patches, their coordinates and validity, each image at its own grid): a
                           Linear patch embedding on (P, P, C)-flattened patches (channels fastest,
                           as Siglip2ImageProcessor cuts them: the kernel is reshaped, not permuted), a
                           learned num_patches table laid out as a sqrt x sqrt grid, resized to each
                           image's grid by torch's antialiased bilinear rule, the MAP head masked
    clip, siglip, siglip2  a whole CLIPModel / SiglipModel / Siglip2Model: its vision tower; the text
                           tower is dropped
    dinov3_vit             DINOv3ViTModel / DINOv3ViTBackbone: DINOv3's rotary position embedding (rope_theta)
                           and no other, registers, layer scale; q/k/v, output and MLP biases each where
                           the config has them (zero elsewhere), a gated SiLU MLP as the builder's SwiGLU
    beit                   BeitModel / BeitForImageClassification: a relative position bias in every block
                           (one shared by the blocks is copied into each, as BEiT's fine-tuning does), layer
                           scale, q and v biases (no k bias); the patch tokens averaged and normed (the
                           pooler's layernorm, as fc_norm) or, without use_mean_pooling, the class token
    data2vec-vision        Data2VecVisionModel / ...ForImageClassification: BEiT's layout and rules
    aimv2_vision_model     Aimv2VisionModel: RMSNorm for every norm (one on the patch embeddings too), a
                           gated SiLU MLP, no biases (zero); its attention-pooling head (use_head) is a MAP head
                           whose probe is the query as it is (an identity query projection) and that has no
                           MLP (map_mlp_dim=0); without it, the tokens' mean
    aimv2                  a whole Aimv2Model: its vision tower and visual projection (as CLIP's)

The image scaling a model takes (`input_mode`) is its folder's image processor's (`folder_input_mode`), where the
folder has one, else the family's. The folders are read as transformers' save_pretrained writes them (`encoder.layer.0.attention.
attention.query`, `mlp.weights_in`, ...); the renamed modules of transformers 5 (`q_proj`,
`o_proj`, `gate_proj`/`up_proj`/`down_proj`, `layers.0`) are read too.
"""

import json
import logging
import math
import os
from dataclasses import dataclass

from keras_vit.preprocessing import NORMALIZATIONS
from keras_vit.weights.heads import CLASSIFIER, PROJECTION, hf_head
from keras_vit.weights.hf_keys import VISION_MODEL, to_official, vision_tensors  # noqa: F401  to_official: here too
from keras_vit.weights.tensors import read_tensors

logger = logging.getLogger("keras_vit")

WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
PROCESSOR_FILE = "preprocessor_config.json"  # the image processor's: its image_mean and image_std
# config.json hidden_act -> approximate_gelu of the "gelu" MLP ("quick_gelu" is an MLP activation of its own)
GELUS = {"gelu": False, "gelu_new": True, "gelu_pytorch_tanh": True}
ACTIVATIONS = (*GELUS, "quick_gelu")


@dataclass(frozen=True)
class Family:
    """One config.json model_type: what it is, transformers' config defaults (what a sparse config.json
    means), and how its `interpolate_pos_encoding` resizes the position embeddings."""

    what: str
    defaults: dict
    position_interpolation: str
    vision_type: str = None  # a whole two-tower model: the model_type of its vision_config
    input_mode: str = "vit"  # the image processor's scaling, as `keras_vit.preprocess_input(mode=...)`


_VIT = dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072, hidden_act="gelu",
            layer_norm_eps=1e-12, image_size=224, patch_size=16, num_channels=3, qkv_bias=True, pooler_act="tanh")
_DINOV2 = dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, mlp_ratio=4, hidden_act="gelu",
               layer_norm_eps=1e-6, image_size=224, patch_size=14, num_channels=3, qkv_bias=True,
               layerscale_value=1.0, use_swiglu_ffn=False, drop_path_rate=0.0)
_DINOV3 = dict(hidden_size=384, num_hidden_layers=12, num_attention_heads=6, intermediate_size=1536, hidden_act="gelu",
               layer_norm_eps=1e-5, rope_theta=100.0, image_size=224, patch_size=16, num_channels=3,
               layerscale_value=1.0, use_gated_mlp=False, num_register_tokens=0, drop_path_rate=0.0,
               pos_embed_shift=None, pos_embed_jitter=None, pos_embed_rescale=2.0)
_BEIT = dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072, hidden_act="gelu",
             layer_norm_eps=1e-12, image_size=224, patch_size=16, num_channels=3, use_mean_pooling=True,
             layer_scale_init_value=0.1, drop_path_rate=0.1)
_AIMV2 = dict(hidden_size=1024, num_hidden_layers=24, num_attention_heads=8, intermediate_size=2816, hidden_act="silu",
              rms_norm_eps=1e-5, image_size=224, patch_size=14, num_channels=3, qkv_bias=False, mlp_bias=False,
              use_head=True, is_native=False)
_TOWER = dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072, image_size=224,
              num_channels=3)
# torch's F.interpolate as each model's interpolate_pos_encoding calls it (transformers 5): bicubic with
# align_corners=False everywhere; DINOv2 with registers adds antialias=True
FAMILIES = {
    "vit": Family("a ViT", _VIT, "bicubic"),
    "deit": Family("a DeiT (class and distillation tokens)", _VIT, "bicubic", input_mode="imagenet"),
    "vit_msn": Family("a ViT-MSN", {**_VIT, "layer_norm_eps": 1e-6}, "bicubic"),
    # its encoder, the whole image's tokens: the random masking of pre-training is an input of its forward (noise,
    # mask_ratio), the decoder of a ViTMAEForPreTraining is dropped (logged)
    "vit_mae": Family("a ViT-MAE encoder", {**_VIT, "mask_ratio": 0.75}, "bicubic", input_mode="imagenet"),
    "ijepa": Family("an I-JEPA ViT (no class token)", _VIT, "bicubic"),
    "dinov2": Family("a DINOv2 ViT (layer scale)", _DINOV2, "bicubic", input_mode="imagenet"),
    "dinov2_with_registers": Family("a DINOv2 ViT with registers",
                                    {**_DINOV2, "patch_size": 16, "num_register_tokens": 4}, "bicubic_antialias",
                                    input_mode="imagenet"),
    "clip_vision_model": Family("a CLIP vision tower", {**_TOWER, "patch_size": 32, "hidden_act": "quick_gelu",
                                                        "layer_norm_eps": 1e-5, "projection_dim": 512}, "bicubic",
                                input_mode="clip"),
    "siglip_vision_model": Family("a SigLIP vision tower", {**_TOWER, "patch_size": 16, "layer_norm_eps": 1e-6,
                                                            "hidden_act": "gelu_pytorch_tanh", "vision_use_head": True},
                                  "bicubic"),
    # SigLIP 2: no image_size, a num_patches table; its resize_positional_embeddings computes
    # F.interpolate(mode="bilinear", align_corners=False, antialias=True) per image
    "siglip2_vision_model": Family("a SigLIP 2 vision tower (NaFlex)",
                                   {**{k: v for k, v in _TOWER.items() if k != "image_size"}, "patch_size": 16,
                                    "layer_norm_eps": 1e-6, "hidden_act": "gelu_pytorch_tanh",
                                    "vision_use_head": True, "num_patches": 256}, "bilinear_antialias"),
    "dinov3_vit": Family("a DINOv3 ViT", _DINOV3, "bicubic", input_mode="imagenet"),  # no table to resize
    "beit": Family("a BEiT (relative position bias)", _BEIT, "bicubic"),
    "data2vec-vision": Family("a data2vec ViT (BEiT's layout)", _BEIT, "bicubic"),
    # no resize in transformers (its table is for one grid): keras-vit's bicubic one where built at another
    "aimv2_vision_model": Family("an AIMv2 vision tower (RMSNorm)", _AIMV2, "bicubic", input_mode="clip"),
    "clip": Family("a CLIP model", {}, "bicubic", vision_type="clip_vision_model"),
    "aimv2": Family("an AIMv2 model", {}, "bicubic", vision_type="aimv2_vision_model", input_mode="clip"),
    "siglip": Family("a SigLIP model", {}, "bicubic", vision_type="siglip_vision_model"),
    "siglip2": Family("a SigLIP 2 model", {}, "bilinear_antialias", vision_type="siglip2_vision_model"),
}
# model types of the same neighbourhood that the builder does not make -> why
OTHERS = {
    "clip_text_model": "a CLIP text tower (no vision tower)",
    "siglip_text_model": "a SigLIP text tower (no vision tower)",
    "siglip2_text_model": "a SigLIP 2 text tower (no vision tower)",
    "vit_hybrid": "a hybrid ViT with a BiT backbone",
}


def is_hf_folder(path):
    return os.path.isdir(path) and os.path.exists(os.path.join(path, "config.json"))


def _supported():
    return ", ".join(repr(k) for k in FAMILIES)


def vision_config(config):
    """(model_type, config of the vision tower with transformers' defaults filled in) of a config.json."""
    kind = config.get("model_type")
    family = FAMILIES.get(kind)
    if family is None:
        what = OTHERS.get(kind, f"model_type {kind!r}")
        raise ValueError(f"a Hugging Face folder of {what}; keras_vit loads model_type {_supported()}")
    if family.vision_type is not None:
        vision = config.get("vision_config")
        if not isinstance(vision, dict):
            raise ValueError(f"{family.what} config without a vision_config: it describes no vision tower to load")
        kind, family = family.vision_type, FAMILIES[family.vision_type]
        config = vision
    return kind, {**family.defaults, **config}


def read_config(folder):
    """config.json of a Hugging Face folder of the ViT family, refused when the builder cannot make it."""
    path = os.path.join(folder, "config.json")
    try:
        with open(path) as f:
            config = json.load(f)
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"{path} is not a readable JSON model config: {err}") from None
    if not isinstance(config, dict):
        raise ValueError(f"{path} is not a model config (a JSON object), got {type(config).__name__}")
    try:
        kind, vision = vision_config(config)
    except ValueError as err:
        raise ValueError(f"{folder}: {err}") from None
    act = vision.get("hidden_act")
    gated = kind == "aimv2_vision_model" or (kind == "dinov3_vit" and vision.get("use_gated_mlp"))
    if gated and act != "silu":
        raise ValueError(f"{path}: a gated MLP of hidden_act {act!r}; the builder's gated MLP is SwiGLU (silu)")
    if act not in ACTIVATIONS and not gated:
        raise ValueError(f"{path}: hidden_act {act!r} is not one the ViT builder makes; "
                         f"expected one of {list(ACTIVATIONS)}")
    if kind == "aimv2_vision_model" and vision.get("is_native"):
        raise ValueError(f"{path}: an AIMv2 'native' tower (is_native: sin-cos position embeddings computed for each "
                         "image's grid), which keras-vit does not build yet; the fixed-resolution towers load")
    if not (vision.get("qkv_bias", True) or kind == "aimv2_vision_model") or vision.get("num_channels", 3) != 3:
        raise ValueError(f"{path}: expected qkv_bias true and 3 channels, got qkv_bias={vision.get('qkv_bias')}, "
                         f"num_channels={vision.get('num_channels')}")
    if vision.get("pooler_act", "tanh") != "tanh":
        raise ValueError(f"{path}: pooler_act {vision['pooler_act']!r}; the builder's pre-logits layer is Dense + tanh")
    patch = _pair(vision.get("patch_size"))
    if patch[0] != patch[1]:
        raise ValueError(f"{path}: patch_size {list(patch)}; the builder's patches are square")
    return config


def read_folder(folder):
    """(config, {name: array}) of a Hugging Face folder.

    The vision tower of a two-tower model (CLIPModel, SiglipModel, CLIPVisionModelWithProjection)
    sits under `vision_model.`: its tensors are returned under the standalone tower's names (as
    transformers itself loads a CLIPVisionModel), the text tower's as they are.
    """
    config = read_config(folder)
    for name in WEIGHT_FILES:
        path = os.path.join(folder, name)
        if os.path.exists(path):
            tensors = read_tensors(path)
            return config, {VISION_MODEL.sub("", k): v for k, v in tensors.items()}
    raise FileNotFoundError(f"{folder} has a config.json but no weights file "
                            f"(expected one of {', '.join(WEIGHT_FILES)})")


def folder_input_mode(folder, default):
    """The `keras_vit.preprocess_input` mode of a folder's image processor (its PROCESSOR_FILE's image_mean and
    image_std), else `default` (the family's: a folder without the file, or with statistics of no mode, logged)."""
    path = os.path.join(folder, PROCESSOR_FILE)
    if not os.path.exists(path):
        return default
    try:
        with open(path) as f:
            processor = json.load(f)
        mean, std = (tuple(map(float, processor[k])) for k in ("image_mean", "image_std"))
    except (OSError, ValueError, KeyError, TypeError) as err:
        logger.info("keras_vit: %s gives no image_mean and image_std (%s); %r scaling is assumed", path, err, default)
        return default
    for mode, stats in NORMALIZATIONS.items():
        if len(mean) == len(std) == 3 and all(abs(a - b) < 1e-4 for a, b in zip(mean + std, stats[0] + stats[1])):
            return mode
    logger.info("keras_vit: %s's image_mean %s and image_std %s are no mode of preprocess_input; %r scaling is "
                "assumed", path, list(mean), list(std), default)
    return default


def _pair(size):
    return tuple(size) if isinstance(size, (list, tuple)) else (size, size)


def _siglip2(cfg, local, name, head):
    """The builder arguments of a SigLIP 2 tower beyond the SigLIP ones: a NaFlex model whose learned
    table of `num_patches` positions is a square grid, `image_size` that grid in pixels; with a classifier
    `head` (Siglip2ForImageClassification's), the mean of the valid tokens into it ("gap": a NaFlex model pools
    its valid tokens)."""
    patch = int(_pair(cfg["patch_size"])[0])
    table = local.get("embeddings.position_embedding.weight")
    positions = int(cfg["num_patches"] if table is None else table.shape[0])
    side = math.isqrt(positions)
    if side * side != positions:
        raise ValueError(f"{name}: {positions} position embeddings (num_patches) are no square grid; SigLIP 2 lays "
                         "its table out as sqrt(num_patches) x sqrt(num_patches)")
    kernel = local["embeddings.patch_embedding.weight"]
    if kernel.ndim != 2 or kernel.shape[1] != patch * patch * 3:
        raise ValueError(f"{name}: a patch embedding of shape {list(kernel.shape)}; SigLIP 2's is a Linear "
                         f"(hidden_size, {patch} * {patch} * 3) for patch_size {patch}")
    return dict(classifier="map" if "head.probe" in local and head is None else "gap",
                classes=None if head is None else int(head.shape[0]), image_size=(side * patch, side * patch),
                naflex=True)


def _beit(cfg, local, name, head):
    """The builder arguments of a BEiT or data2vec ViT beyond the ViT's: its position encodings as the file has
    them (the relative tables, a block's own or shared; an absolute table), layer scale where the blocks have it,
    and what it pools: with use_mean_pooling the patch tokens' mean, normed by the pooler's layernorm (fc_norm)
    where the folder has a pooler, with no final norm on the tokens; else the class token after the final norm."""
    relative = any(k.endswith("relative_position_bias_table") for k in local)
    mean = bool(cfg["use_mean_pooling"])
    if mean and head is not None and "pooler.layernorm.weight" not in local:
        raise ValueError(f"{name}: a classifier over the mean of the patch tokens without the pooler's layernorm")
    return dict(relative_position_bias=relative, drop_path_rate=float(cfg["drop_path_rate"]),
                layer_scale=float(cfg["layer_scale_init_value"]) if "layers.0.lambda_1" in local or
                "encoder.layer.0.lambda_1" in local else None,
                position_embedding="learned_1d" if "embeddings.position_embeddings" in local else "none",
                classes=None if head is None else int(head.shape[0]),
                **(dict(pooling="avg", fc_norm="pooler.layernorm.weight" in local, encoder_norm=False) if mean else {}))


def _swiglu_width(hidden_size, mlp_ratio):
    """DINOv2's SwiGLU width: two thirds of the MLP's, rounded up to a multiple of 8."""
    return (int(int(hidden_size * mlp_ratio) * 2 / 3) + 7) // 8 * 8


def architecture(config, tensors):
    """Builder arguments of the model a Hugging Face folder holds (its vision tower for CLIP/SigLIP).

    Besides the builder's arguments: `pre_logits` (a pooler to load as pre-logits),
    `position_interpolation` (how transformers' `interpolate_pos_encoding` resizes this model's
    position embeddings: "bicubic" is torch's bicubic with align_corners=False), `source_head` (what the
    class returns by default: `keras_vit.weights.heads`), `input_mode` (its image processor's
    scaling, a `keras_vit.preprocess_input` mode), and for SigLIP 2 `naflex` (True: the model takes a NaFlex
    batch; `image_size` is then its position table's grid in pixels). Of the training options, DINOv2's
    config records `drop_path_rate` (transformers drops every block at that rate; keras-vit's rate rises
    linearly to it); the other families' configs record none.
    """
    kind, cfg = vision_config(config)
    local = vision_tensors(tensors)
    name = (config.get("architectures") or [kind])[0]
    if not {"embeddings.patch_embeddings.projection.weight", "embeddings.patch_embedding.weight",
            "embeddings.patch_embeddings.weight", "embeddings.patch_embed.weight"} & set(local):
        raise ValueError(f"{name}: the weights hold no vision tower (no patch embedding among {len(tensors)} tensors)")
    hidden = int(cfg["hidden_size"])
    act = cfg["hidden_act"]
    dinov2 = kind.startswith("dinov2")
    swiglu = (dinov2 and bool(cfg.get("use_swiglu_ffn"))) or bool(cfg.get("use_gated_mlp")) or kind.startswith("aimv2")
    if dinov2:
        mlp_dim = _swiglu_width(hidden, cfg["mlp_ratio"]) if swiglu else int(hidden * cfg["mlp_ratio"])
    else:
        mlp_dim = int(cfg["intermediate_size"])
    arch = dict(
        patch_size=int(_pair(cfg["patch_size"])[0]), hidden_size=hidden, mlp_dim=mlp_dim,
        num_heads=int(cfg["num_attention_heads"]), num_layers=int(cfg["num_hidden_layers"]), resnet=None,
        classifier="token", classes=None, image_size=_pair(cfg.get("image_size")), pre_logits=False,
        approximate_gelu=GELUS.get(act, False), layer_norm_epsilon=float(cfg.get("layer_norm_eps", cfg.get("rms_norm_eps"))),
        distillation_token=False, num_register_tokens=0, prefix_position_embedding=True, layer_scale=None,
        pre_norm=False, fc_norm=False, rope=None,
        mlp_activation="swiglu" if swiglu else "quick_gelu" if act == "quick_gelu" else "gelu",
        position_interpolation=FAMILIES[kind].position_interpolation, input_mode=FAMILIES[kind].input_mode,
    )
    head = local.get("classifier.weight")
    if kind == "ijepa":  # its classifier reads the mean of the tokens
        arch.update(classifier="gap", classes=None if head is None else int(head.shape[0]))
    elif kind in ("vit", "vit_msn", "vit_mae"):
        arch.update(classes=None if head is None else int(head.shape[0]), pre_logits="pooler.dense.weight" in local)
    elif kind == "deit":
        teacher = local.get("cls_classifier.weight")
        # DeiTForImageClassification's head reads the class token alone while the distillation token
        # stays in the sequence: no builder head; its backbone is the distillation model's
        arch.update(distillation_token=True, classes=None if teacher is None else int(teacher.shape[0]))
    elif dinov2:  # its classifier reads the class token and the patch tokens' mean side by side
        arch.update(classifier="token" if head is None else "token_gap",
                    classes=None if head is None else int(head.shape[0]))
        registers = local.get("embeddings.register_tokens")
        arch.update(layer_scale=float(cfg["layerscale_value"]), drop_path_rate=_drop_path_rate(cfg, name),
                    num_register_tokens=0 if kind == "dinov2" else int(
                        cfg["num_register_tokens"] if registers is None else registers.shape[1]))
    elif kind == "dinov3_vit":
        if head is not None:
            raise ValueError(f"{name}: a classifier on DINOv3; save its DINOv3ViTModel to load the backbone")
        registers = local.get("embeddings.register_tokens")
        arch.update(layer_scale=float(cfg["layerscale_value"]), drop_path_rate=_drop_path_rate(cfg, name),
                    num_register_tokens=int(cfg["num_register_tokens"] if registers is None else registers.shape[1]),
                    rope={"kind": "dinov3", "temperature": float(cfg["rope_theta"]), "shift": cfg["pos_embed_shift"],
                          "jitter": cfg["pos_embed_jitter"], "rescale": cfg["pos_embed_rescale"]},
                    position_embedding="none")
    elif kind in ("beit", "data2vec-vision"):
        arch.update(_beit(cfg, local, name, head))
    elif kind == "aimv2_vision_model":
        if head is not None:
            raise ValueError(f"{name}: a classifier on AIMv2; save its Aimv2VisionModel to load the tower")
        projection = local.get("visual_projection.weight")
        pooled = "head.cls_token" in local
        arch.update(normalization="rms_norm", embed_norm=True, classifier="map" if pooled else "gap",
                    map_mlp_dim=0 if pooled else None, classes=None if projection is None else int(projection.shape[0]))
    elif kind == "clip_vision_model" and head is not None:
        # CLIPForImageClassification: its classifier reads the mean of the patch tokens before the final
        # norm (post_layernorm, which only its pooler reads: not used, `hf_keys.to_official`)
        arch.update(pre_norm=True, classifier="gap", class_token=True, encoder_norm=False, classes=int(head.shape[0]))
    elif kind == "clip_vision_model":
        projection = local.get("visual_projection.weight")
        arch.update(pre_norm=True, classes=None if projection is None else int(projection.shape[0]))
    elif kind == "siglip2_vision_model":
        arch.update(_siglip2(cfg, local, name, head))
    else:  # siglip_vision_model
        pooled = "map" if "head.probe" in local else "gap"
        arch.update(classifier="gap" if head is not None else pooled,
                    classes=None if head is None else int(head.shape[0]))
    built = None if arch["classes"] is None else CLASSIFIER if head is not None \
        else PROJECTION if kind in ("clip_vision_model", "aimv2_vision_model") else CLASSIFIER
    arch["source_head"] = hf_head((config.get("architectures") or [None])[0], built)
    return arch


def _drop_path_rate(cfg, name):
    """The stochastic depth a DINOv2 or DINOv3 config records, kept as keras-vit's `drop_path_rate`."""
    rate = float(cfg["drop_path_rate"])
    if rate:
        logger.info("keras_vit: %s records drop_path_rate=%g, which transformers applies to every block; "
                    "keras-vit's rate rises linearly over the blocks to it (timm's rule)", name, rate)
    return rate


