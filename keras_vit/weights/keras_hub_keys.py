"""The key map of keras-hub presets: a variable's path in a preset's `.weights.h5` (regex) -> its official ViT key
(template, `{0}` the block index) and how the array is transformed; the embeddings whose variables Keras saves by
index (`vars/0`, ...) named first (`rename_embedding`)."""

import re

# ---------------------------------------------------------------------------------------------------
# key map: "model/<h5 path>" (regex) -> official key template ({0}: the block index) and transform

def _layer(src, dst, kind):
    """The rules of one Keras layer's `vars/0`, `vars/1`: a LayerNorm's scale and bias (kind "norm"),
    else a kernel (Dense, Conv2D, an attention projection) and its bias."""
    first = "scale" if kind == "norm" else "kernel"
    return (src + "/vars/0", f"{dst}/{first}", "same"), (src + "/vars/1", f"{dst}/bias", "same")


_B = "Transformer/encoderblock_{0}/"
_A = _B + "MultiHeadDotProductAttention_1/"


def _attention_rules(src, dst):
    """The rules of a Keras MultiHeadAttention (already in the official per-head layout) at `src`."""
    return [rule for name, official in (("query", "query"), ("key", "key"), ("value", "value"), ("output", "out"))
            for rule in _layer(f"{src}/{name}_dense", dst + official, "dense")]


def _block_rules(block, norm1, attention, norm2, dense1, dense2):
    """The rules of one encoder block whose h5 group is `block` (its index the regex group 1)."""
    rules = [*_layer(f"{block}/{norm1}", _B + "LayerNorm_0", "norm"), *_layer(f"{block}/{norm2}", _B + "LayerNorm_2",
                                                                               "norm")]
    rules += _attention_rules(f"{block}/{attention}", _A)
    return rules + [*_layer(f"{block}/{dense1}", _B + "MlpBlock_3/Dense_0", "dense"),
                    *_layer(f"{block}/{dense2}", _B + "MlpBlock_3/Dense_1", "dense")]


def _index(name):
    """Keras' unique name of the i-th layer of one class in a list: `name` for 0, `name_i` after."""
    return rf"{name}(?:_(\d+))?"


POSEMB = "Transformer/posembed_input/pos_embedding"
_VIT_EMBED = "model/layers/vi_t_patching_and_embedding"
_CLIP_EMBED = "model/layers/clip_vision_embedding"
_SIGLIP_EMBED = "model/layers/sig_lip_vision_embedding"
_DINO_EMBED = "model/layers/dinov2_embedding"
_DINO3_EMBED = "model/layers/dinov3_embedding"
_DINO3_BLOCK = "model/layers/dinov3_encoder/layers/" + r"dinov3_layer(?:_(\d+))?"
_SIGLIP_MAP = "model/layers/sig_lip_multi_head_attention_pooling"
RULES = {
    "ViTBackbone": (
        (_VIT_EMBED + "/vars/0", "cls", "same"),
        *_layer(_VIT_EMBED + "/patch_embedding", "embedding", "dense"),
        (_VIT_EMBED + "/position_embedding/vars/0", POSEMB, "table"),
        *_block_rules("model/layers/vi_t_encoder/encoder_layers/" + _index("vi_t_encoder_block"),
                      "layer_norm_1", "mha", "layer_norm_2", "mlp/dense_1", "mlp/dense_2"),
        *_layer("model/layers/vi_t_encoder/layer_norm", "Transformer/encoder_norm", "norm"),
    ),
    # the functional model's layers, by class: the pre-norm is the first LayerNormalization, the final the second
    "CLIPVisionEncoder": (
        (_CLIP_EMBED + "/vars/0", "cls", "token"),
        # position_ids, an int variable: the rows of the table that the model adds (0, 1, 2, ... in the released
        # presets; a freshly built CLIPVisionEncoder holds zeros): the official embedding is the table gathered
        (_CLIP_EMBED + "/vars/1", "position_ids", "ids"),
        *_layer(_CLIP_EMBED + "/patch_embedding", "embedding", "dense"),
        (_CLIP_EMBED + "/position_embedding/vars/0", POSEMB, "table"),
        *_layer("model/layers/layer_normalization", "Transformer/pre_norm", "norm"),
        *_block_rules("model/layers/" + _index("clip_encoder_layer"), "layer_norm_1", "attention", "layer_norm_2",
                      "dense_1", "dense_2"),
        *_layer("model/layers/layer_normalization_1", "Transformer/encoder_norm", "norm"),
    ),
    "SigLIPVisionEncoder": (
        (_SIGLIP_EMBED + "/vars/0", "position_ids", "ids"),
        *_layer(_SIGLIP_EMBED + "/patch_embedding", "embedding", "dense"),
        (_SIGLIP_EMBED + "/position_embedding/vars/0", POSEMB, "table"),
        *_block_rules("model/layers/" + _index("sig_lip_encoder_layer"), "layer_norm1", "self_attn", "layer_norm2",
                      "mlp/fc1", "mlp/fc2"),
        *_layer("model/layers/layer_normalization", "Transformer/encoder_norm", "norm"),
        (_SIGLIP_MAP + "/vars/0", "MAPHead_0/probe", "same"),
        *_attention_rules(_SIGLIP_MAP + "/attention", "MAPHead_0/MultiHeadDotProductAttention_0/"),
        *_layer(_SIGLIP_MAP + "/layer_norm", "MAPHead_0/LayerNorm_0", "norm"),
        *_layer(_SIGLIP_MAP + "/mlp/fc1", "MAPHead_0/MlpBlock_0/Dense_0", "dense"),
        *_layer(_SIGLIP_MAP + "/mlp/fc2", "MAPHead_0/MlpBlock_0/Dense_1", "dense"),
    ),
    # the embedding's variables by name (`_name_dinov2_embedding`)
    "DINOV2Backbone": (
        (_DINO_EMBED + "/cls_token", "cls", "same"),
        (_DINO_EMBED + "/register_tokens", "registers", "same"),
        (_DINO_EMBED + "/interpolated_position_embeddings", POSEMB, "same"),
        (_DINO_EMBED + "/(?:mask_token|position_embeddings)", None, "ignore"),  # masked-image modelling; the table
        # at position_embedding_shape, from which keras-hub interpolates the one above
        *_layer(_DINO_EMBED + "/patch_embeddings/projection", "embedding", "dense"),
        *_block_rules("model/layers/dinov2_encoder/layers/" + _index("dinov2_layer"), "norm1", "attention/attention",
                      "norm2", "mlp/(?:fc1|weights_in)", "mlp/(?:fc2|weights_out)"),
        (r"model/layers/dinov2_encoder/layers/" + _index("dinov2_layer") + "/layer_scale1/vars/0",
         _B + "LayerScale_0/scale", "same"),
        (r"model/layers/dinov2_encoder/layers/" + _index("dinov2_layer") + "/layer_scale2/vars/0",
         _B + "LayerScale_1/scale", "same"),
        *_layer("model/layers/layer_normalization", "Transformer/encoder_norm", "norm"),
    ),
    # the embedding's variables by name (`rename_embedding`); q, k, v and the output as plain (D, D) Dense layers
    # ("heads": split by head); the gated MLP's gate and up projections packed as the builder's SwiGLU ("gate",
    # "up": `pack_gated`); no position embedding (rotary)
    "DINOV3Backbone": (
        (_DINO3_EMBED + "/cls_token", "cls", "same"),
        (_DINO3_EMBED + "/register_tokens", "registers", "same"),
        (_DINO3_EMBED + "/mask_token", None, "ignore"),  # masked-image modelling
        *_layer(_DINO3_EMBED + "/patch_embeddings/projection", "embedding", "dense"),
        *[rule for rule in _block_rules(_DINO3_BLOCK, "norm1", "attention", "norm2", "mlp/up_proj", "mlp/down_proj")
          if "MultiHeadDotProductAttention_1" not in rule[1]],
        *[(f"{_DINO3_BLOCK}/attention/{name}_dense/vars/{i}", f"{_A}{official}/{w}", "heads")
          for name, official in (("query", "query"), ("key", "key"), ("value", "value"), ("output", "out"))
          for i, w in enumerate(("kernel", "bias"))],
        *[(f"{_DINO3_BLOCK}/mlp/gate_proj/vars/{i}", f"{_B}MlpBlock_3/Dense_0/{w}", "gate")
          for i, w in enumerate(("kernel", "bias"))],
        (_DINO3_BLOCK + "/layer_scale1/vars/0", _B + "LayerScale_0/scale", "same"),
        (_DINO3_BLOCK + "/layer_scale2/vars/0", _B + "LayerScale_1/scale", "same"),
        *_layer("model/layers/layer_normalization", "Transformer/encoder_norm", "norm"),
    ),
}
COMPILED = {kind: tuple((re.compile(p + "$"), t, h) for p, t, h in rules) for kind, rules in RULES.items()}


# the variables a DINOv2 / DINOv3 embedding saves by index, in their order: which exist depends on the config
_EMBEDDING_VARS = {
    "DINOV2Backbone": (_DINO_EMBED, lambda cfg: ["cls_token", *["mask_token"] * bool(cfg.get("use_mask_token", True)),
                                                  *["register_tokens"] * bool(cfg.get("num_register_tokens", 0)),
                                                  "interpolated_position_embeddings", "position_embeddings"]),
    "DINOV3Backbone": (_DINO3_EMBED, lambda cfg: ["cls_token", *["mask_token"] * bool(cfg.get("use_mask_token", True)),
                                                   *["register_tokens"] * bool(cfg.get("num_register_tokens", 4))]),
}


def rename_embedding(kind, tensors, cfg):
    """`tensors` with the embedding variables of a `kind` backbone (of config `cfg`) that Keras saved by index
    (`vars/0`, ...) under their names; any other backbone's as they are."""
    if kind not in _EMBEDDING_VARS:
        return tensors
    group, names = _EMBEDDING_VARS[kind][0], _EMBEDDING_VARS[kind][1](cfg)
    held = {k for k in tensors if re.fullmatch(group + r"/vars/\d+", k)}
    if held != {f"{group}/vars/{i}" for i in range(len(names))}:
        raise ValueError(f"model.weights.h5: the {kind}'s embedding holds {len(held)} variables, its config "
                         f"({', '.join(names)}) {len(names)}")
    renamed = {k: v for k, v in tensors.items() if k not in held}
    return renamed | {f"{group}/{name}": tensors[f"{group}/vars/{i}"] for i, name in enumerate(names)}


def by_head(official, value, num_heads):
    """A plain Dense layer's (D, D) kernel or (D,) bias in the official per-head layout of `official`'s array."""
    if official.endswith("out/kernel"):
        return value.reshape(num_heads, -1, value.shape[-1])
    if official.endswith("kernel"):
        return value.reshape(value.shape[0], num_heads, -1)
    return value if official.endswith("out/bias") else value.reshape(num_heads, -1)
