"""The key map of Hugging Face folders of the ViT family: a key of transformers' state dict (after the model's
prefix) -> its official ViT key (template, `{0}` the block index) and how the array is transformed; `to_official`
applies it. What each model_type is, and the builder arguments its config.json gives, are `keras_vit.weights.hf`'s."""

import logging
import math
import re

import numpy as np

from keras_vit.weights.timm import module_rules, place, transform

logger = logging.getLogger("keras_vit")

# ---------------------------------------------------------------------------------------------------
# key map: HF key (after the model prefix, see vision_tensors) -> official key template and transform

# the model prefix of a head-bearing class (ViTForImageClassification: "vit.", CLIPModel: "vision_model.")
_PREFIX = re.compile(r"^(?:vit|deit|dinov2|dinov2_with_registers|vision_model|beit|data2vec_vision|ijepa)\.")
VISION_MODEL = re.compile(r"^vision_model\.")
# the other tower of a CLIP / SigLIP model and its contrastive scalars
_TEXT = re.compile(r"^(?:text_model\.|text_projection\.|logit_scale$|logit_bias$)")
# ViTMAEForPreTraining's decoder (its pixel reconstruction): keras-vit builds the encoder
_DECODER = re.compile(r"^decoder\.")
# in the files but no parameter of the ViT: DINOv2/DeiT/ViT's masked-image-modelling token, the
# position_ids buffer that older transformers saved
_IGNORED = re.compile(r"^embeddings\.(?:mask_token|position_ids)$|relative_position_index$")
# BEiT's relative position bias shared by every block (transformers 4's name, then 5's): copied into each
_SHARED_BIAS = re.compile(r"^(?:encoder\.relative_position_bias|shared_position_bias)\.relative_position_bias_table$")

# ViT/DINOv2: encoder.layer.i; CLIP/SigLIP: encoder.layers.i; transformers 5: layers.i; DINOv3: layer.i (model.layer.i)
_L = r"(?:encoder\.layers?|layers?|model\.layer)\.(\d+)\."
_B = "Transformer/encoderblock_{0}/"
_A = _B + "MultiHeadDotProductAttention_1/"
_MAP = "MAPHead_0/"
_QKV = {"q": "query", "k": "key", "v": "value"}
_RULES = (
    # the stem: ViT/DeiT/DINOv2 call the conv patch_embeddings.projection, CLIP/SigLIP patch_embedding;
    # SigLIP 2's patch_embedding is a Linear on flattened patches ("patch": a conv's or a Linear's kernel)
    *module_rules(r"embeddings\.patch_embeddings(?:\.projection)?", "embedding", "conv"),  # DINOv3: no .projection
    *module_rules(r"embeddings\.patch_embed", "embedding", "conv"),  # AIMv2's
    *module_rules(r"embeddings\.rms_norm", "embed_norm", "norm"),
    *module_rules(r"embeddings\.patch_embedding", "embedding", "patch"),
    (r"embeddings\.cls_token", "cls", "same"),
    (r"embeddings\.class_embedding", "cls", "token"),  # CLIP: (D,)
    (r"embeddings\.distillation_token", "dist", "same"),
    (r"embeddings\.register_tokens", "registers", "same"),
    (r"embeddings\.position_embeddings", "Transformer/posembed_input/pos_embedding", "same"),
    (r"embeddings\.position_embedding\.weight", "Transformer/posembed_input/pos_embedding", "table"),  # nn.Embedding
    *module_rules("pre_layrnorm", "Transformer/pre_norm", "norm"),
    # encoder blocks
    *module_rules(_L + "(?:layernorm_before|norm1|layer_norm1|rms_norm1)", _B + "LayerNorm_0", "norm"),
    (_L + r"(?:attention\.attention\.|attention\.|self_attn\.)(query|key|value|q|k|v)(?:_proj)?\.weight",
     _A + "{1}/kernel", "heads_kernel"),
    (_L + r"(?:attention\.attention\.|attention\.|self_attn\.)(query|key|value|q|k|v)(?:_proj)?\.bias",
     _A + "{1}/bias", "heads_bias"),
    *module_rules(_L + r"(?:attention\.output\.dense|attention\.o_proj|attention\.out_proj|self_attn\.out_proj)",
                  _A + "out", "out_kernel"),
    # BEiT: a block's own relative position bias (under its attention in transformers 4, beside it in 5)
    (_L + r"(?:attention\.attention\.)?relative_position_bias\.relative_position_bias_table",
     _A + "relative_position_bias_table", "same"),
    (_L + r"layer_scale1\.lambda1", _B + "LayerScale_0/scale", "same"),  # DINOv2: attention branch
    (_L + r"lambda_1", _B + "LayerScale_0/scale", "same"),  # BEiT's
    (_L + r"lambda_2", _B + "LayerScale_1/scale", "same"),
    (_L + r"layer_scale2\.lambda1", _B + "LayerScale_1/scale", "same"),  # MLP branch
    *module_rules(_L + "(?:layernorm_after|norm2|layer_norm2|rms_norm2)", _B + "LayerNorm_2", "norm"),
    # the MLP; DINOv2's SwiGLU packs [gate; value] in weights_in, as the builder's Dense_0 (silu on the first half)
    *module_rules(_L + r"(?:intermediate\.dense|mlp\.fc1|mlp\.weights_in)", _B + "MlpBlock_3/Dense_0", "linear"),
    (_L + r"(?:mlp|ffn)\.(gate|up)_proj\.weight", _B + "MlpBlock_3/Dense_0/kernel", "swiglu_half"),  # ffn: AIMv2
    (_L + r"(?:mlp|ffn)\.(gate|up)_proj\.bias", _B + "MlpBlock_3/Dense_0/bias", "swiglu_half"),
    *module_rules(_L + r"(?:output\.dense|mlp\.fc2|mlp\.weights_out|(?:mlp|ffn)\.down_proj)", _B + "MlpBlock_3/Dense_1",
                  "linear"),
    # after the encoder
    *module_rules("(?:layernorm|post_layernorm|norm|rms_norm)", "Transformer/encoder_norm", "norm"),
    *module_rules(r"pooler\.dense", "pre_logits", "linear"),  # ViTModel's pooler: Dense + tanh on [class]
    *module_rules(r"pooler\.layernorm", "fc_norm", "norm"),  # BEiT's pooler: a LayerNorm on the patch tokens' mean
    *module_rules("(?:classifier|cls_classifier)", "head", "linear"),
    *module_rules("distillation_classifier", "head_dist", "linear"),
    (r"visual_projection\.weight", "head/kernel", "linear"),  # CLIP's projection (no bias: foreign.py's zero one)
    # SigLIP's attention-pooling head: torch.nn.MultiheadAttention packs q, k, v in in_proj
    (r"head\.probe", _MAP + "probe", "same"),
    (r"head\.attention\.in_proj_weight", _MAP + "MultiHeadDotProductAttention_0/{{}}/kernel", "qkv_kernel"),
    (r"head\.attention\.in_proj_bias", _MAP + "MultiHeadDotProductAttention_0/{{}}/bias", "qkv_bias"),
    *module_rules(r"head\.attention\.out_proj", _MAP + "MultiHeadDotProductAttention_0/out", "out_kernel"),
    *module_rules(r"head\.layernorm", _MAP + "LayerNorm_0", "norm"),
    *module_rules(r"head\.mlp\.fc1", _MAP + "MlpBlock_0/Dense_0", "linear"),
    *module_rules(r"head\.mlp\.fc2", _MAP + "MlpBlock_0/Dense_1", "linear"),
    # AIMv2's attention-pooling head: its class token is the query as it is (`to_official` adds the identity
    # projection), k and v projections, an output projection, no norm or MLP after
    (r"head\.cls_token", _MAP + "probe", "same"),
    (r"head\.(k|v)_proj\.weight", _MAP + "MultiHeadDotProductAttention_0/{0}/kernel", "heads_kernel"),
    (r"head\.(k|v)_proj\.bias", _MAP + "MultiHeadDotProductAttention_0/{0}/bias", "heads_bias"),
    *module_rules(r"head\.output_proj", _MAP + "MultiHeadDotProductAttention_0/out", "out_kernel"),
)
_COMPILED = tuple((re.compile(p + "$"), t, h) for p, t, h in _RULES)


def vision_tensors(tensors):
    """{key without the model prefix: array} of the vision tower's tensors (the text tower left out)."""
    return {_PREFIX.sub("", k): v for k, v in tensors.items() if not _TEXT.match(k)}



def _patch_kernel(weight):
    """The (P, P, C, D) kernel of a patch embedding: a Conv2d's (D, C, P, P), or SigLIP 2's Linear
    (D, P * P * C) whose input is the patch flattened row-major with the channels fastest (its image
    processor's `convert_image_to_patches`: (C, H, W) -> (gh, gw, P, P, C)), keras-vit's NaFlex layout:
    a reshape, no permutation."""
    if weight.ndim == 4:
        return weight.transpose(2, 3, 1, 0)
    side = math.isqrt(weight.shape[1] // 3)
    return weight.T.reshape(side, side, 3, weight.shape[0])



def to_official(tensors, num_heads):
    """(official arrays, HF keys no rule maps) of a Hugging Face state dict of the ViT family.

    The text tower of a CLIP / SigLIP model is dropped (logged); so is the unused MAP head of a
    SiglipForImageClassification, whose classifier reads the mean of the tokens, and the unused final norm
    of a CLIPForImageClassification, whose classifier reads the mean of the patch tokens before it, and the
    decoder of a ViTMAEForPreTraining.
    """
    text = sorted(k for k in tensors if _TEXT.match(k))
    local = vision_tensors(tensors)
    drop = set()
    if "classifier.weight" in local and "head.probe" in local:  # SiglipForImageClassification
        drop = {k for k in local if k.startswith("head.")}
        logger.info("keras_vit: SiglipForImageClassification classifies the mean of the tokens; its vision "
                    "tower's attention-pooling head (%d arrays) is not used", len(drop))
    if "classifier.weight" in local and "pre_layrnorm.weight" in local:  # CLIPForImageClassification
        unused = {k for k in local if k.startswith("post_layernorm.")}
        drop |= unused
        logger.info("keras_vit: CLIPForImageClassification classifies the mean of the patch tokens before the "
                    "final norm; its post_layernorm (%d arrays), which only its pooler reads, is not used", len(unused))
    if text:
        logger.info("keras_vit: dropped the text tower of a two-tower model (%d arrays: %s); keras_vit builds the "
                    "vision tower", len(text), ", ".join(sorted({k.split(".")[0] for k in text})))
    decoder = {k for k in local if _DECODER.match(k)}
    if decoder:
        drop |= decoder
        logger.info("keras_vit: dropped the decoder of a ViT-MAE pre-training model (%d arrays); keras_vit builds "
                    "its encoder", len(decoder))
    if "classifier.weight" in local and "embeddings.distillation_token" in local:
        logger.info("keras_vit: DeiTForImageClassification's classifier reads the class token alone beside the "
                    "distillation token; the builder has no such head: build with distillation_token=True, "
                    "include_top=False, pooling='token' for the class token it reads (its classifier goes to "
                    "'head', unused there)")
    arrays, unmapped, halves, shared = {}, [], {}, None
    for key, value in local.items():
        if _IGNORED.search(key) or key in drop or (key == "embeddings.register_tokens" and not value.size):
            continue  # (DINOv3 keeps an empty table where it has no registers)
        if _SHARED_BIAS.match(key):
            shared = value
            continue
        for pattern, template, how in _COMPILED:
            match = pattern.match(key)
            if match:
                groups = tuple(_QKV.get(g, g) for g in match.groups())
                official = re.sub(r"\{(\d)\}", lambda m: groups[int(m.group(1))], template).replace("{{}}", "{}")
                if how == "swiglu_half":
                    halves.setdefault(official, {})[groups[1]] = (key, value)
                elif how == "token":
                    arrays[official] = value.reshape(1, 1, -1)
                elif how == "table":
                    arrays[official] = value[None]
                elif how == "patch":
                    arrays[official] = _patch_kernel(value)
                else:
                    place(arrays, official, transform(how, value, num_heads))
                break
        else:
            unmapped.append(key)
    for official, parts in halves.items():  # transformers 5's gate_proj / up_proj: [gate; up] is weights_in
        if set(parts) == {"up"}:  # DINOv3's ungated MLP: up_proj is the first dense layer
            arrays[official] = parts["up"][1].T if official.endswith("kernel") else parts["up"][1]
            continue
        if set(parts) != {"gate", "up"}:
            unmapped += [key for key, _ in parts.values()]
            continue
        packed = np.concatenate([parts["gate"][1], parts["up"][1]], axis=0)
        arrays[official] = packed.T if official.endswith("kernel") else packed
    if "head.cls_token" in local:  # AIMv2's head: the probe is the query, no projection (the identity; its zero bias
        eye = np.eye(local["head.cls_token"].shape[-1], dtype=local["head.cls_token"].dtype)  # from _zero_biases)
        arrays[_MAP + "MultiHeadDotProductAttention_0/query/kernel"] = transform("heads_kernel", eye, num_heads)
    if shared is not None:
        blocks = {m.group(1) for k in arrays for m in [re.match(r"Transformer/encoderblock_(\d+)/", k)] if m}
        arrays |= {_A.format(b) + "relative_position_bias_table": shared for b in blocks}
        logger.info("keras_vit: the relative position bias that the blocks share is copied into each of the %d "
                    "blocks (as BEiT's fine-tuning starts from it)", len(blocks))
    _zero_biases(arrays)
    return arrays, unmapped


def _zero_biases(arrays):
    """Zero biases for the blocks' and the attention pool's projections that have none in the file (DINOv3's key
    projection, any q/v/output/MLP projection its config leaves without, AIMv2's all): the builder's all have one."""
    for key in [k for k in arrays if k.startswith(("Transformer/encoderblock_", _MAP)) and k.endswith("/kernel")]:
        bias = key[:-len("kernel")] + "bias"
        if bias not in arrays:
            kernel = arrays[key]
            heads = re.search(r"/(query|key|value)/kernel$", key)
            arrays[bias] = np.zeros(kernel.shape[1:] if heads else kernel.shape[-1:], kernel.dtype)
