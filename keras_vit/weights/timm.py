"""timm `VisionTransformer` state dicts -> official ViT keys: the key map as data, the array
transforms as small functions. timm keeps q, k, v as one fused `qkv` Linear; it is split into the
official per-head kernels here. timm models use the exact erf GELU and LayerNorm epsilon 1e-6 (its
CLIP towers 1e-5); `architecture` reads the family options (DeiT, DeiT III, DINOv2, CLIP, SigLIP) off the keys."""

import math
import re

import numpy as np

from keras_vit.weights.heads import timm_head
from keras_vit.weights.timm_names import (  # noqa: F401  the tables: this module's names too
    TIMM_AIMV2_HEADS, TIMM_EPSILON_1E5, TIMM_HEADS, TIMM_NAMED_HEADS, TIMM_POOL_INCLUDE_PREFIX, TIMM_POST_NORM,
    TIMM_RMS_NORM, TIMM_SIGLIP_GELU, TIMM_SIGLIP_HEADS, _name_parts, _named_image_size, _names_other_vit, _relpos_size,
    name_options, named_architecture)
from keras_vit.weights.timm_blocks import branches_as_blocks, first_branch, parallel_as_block
from keras_vit.weights.timm_eva import TIMM_DINOV3_LAYOUT, TIMM_EVA_LAYOUT, from_eva, is_eva  # noqa: F401

# Keys of architectures the builder does not make -> what they are.
UNSUPPORTED = (
    (r"\.rel_pos\.(?!mlp\.)|^rel_pos_bias\.|^shared_rel_pos\.(?!mlp\.)", "a ViT with timm's relative position bias "
     "table in place of its MLP, or a BEiT whose relative position bias its blocks share (use_shared_rel_pos_bias)"),
    (r"\.attn\.[qv]_bias$|\.attn\.q_proj\.", "a ViT of timm's Eva layout (q/v biases apart, or q, k and v apart) whose name "
     "is none of timm's architectures that keras_vit reads (keras_vit.weights.timm_eva.TIMM_EVA_LAYOUT): name the file "
     "after its timm architecture"),
    (r"(^|\.)rope\.|\.freqs", "a ViT with learned rotary frequencies (timm's `*_rope_mixed_*`)"),
    (r"\.mlp\.ffn_ln\.", "a ViT in the original EVA repository's layout (ffn_ln): use timm's file of it"),
    (r"^attn_pool\.(q_norm|k_norm|pos_embed)", "an attention-pooling head with q/k norms or position embeddings"),
    (r"^(visual|vision_model)\.", "a CLIP tower in OpenAI / open_clip layout (use timm's or Hugging Face's layout)"),
    (r"^patch_embed\.backbone\.(?!stem\.|stages\.|conv\.|norm\.)", "a hybrid whose backbone is no ResNetV2 (timm's "
     "ResNet-D hybrids vit_*_resnet26d/50d_*, MobileCLIP's vit_base_mci_224)"),
)
def module_rules(src, dst, how):
    """The two rules of one torch module: its weight (a LayerNorm's, how="norm", is the scale;
    otherwise the kernel, transformed as `how` says) and its bias (as it is)."""
    weight = (src + r"\.weight", f"{dst}/scale", "same") if how == "norm" else (src + r"\.weight", f"{dst}/kernel", how)
    return weight, (src + r"\.bias", f"{dst}/bias", "same")


_BLOCK, _T = r"blocks\.(\d+)\.", "Transformer/encoderblock_{0}/"
_ATTN = _T + "MultiHeadDotProductAttention_1/"
_MAP = "MAPHead_0/"
# timm key (regex) -> official key (template) and how the array is transformed.
_RULES = (
    *module_rules(r"patch_embed\.proj", "embedding", "conv"),
    *module_rules(r"patch_embed\.norm", "embed_norm", "norm"),
    (r"cls_token", "cls", "same"),
    (r"dist_token", "dist", "same"),
    (r"reg_token", "registers", "same"),
    (r"pos_embed", "Transformer/posembed_input/pos_embedding", "same"),
    *module_rules("norm_pre", "Transformer/pre_norm", "norm"),
    *module_rules(_BLOCK + "norm1", _T + "LayerNorm_0", "norm"),
    (_BLOCK + r"attn\.qkv\.weight", _ATTN + "{{}}/kernel", "qkv_kernel"),
    (_BLOCK + r"attn\.qkv\.bias", _ATTN + "{{}}/bias", "qkv_bias"),
    *module_rules(_BLOCK + r"attn\.proj", _ATTN + "out", "out_kernel"),
    *module_rules(_BLOCK + r"attn\.norm", _ATTN + "inner_norm", "norm"),
    *module_rules(_BLOCK + r"attn\.q_norm", _ATTN + "q_norm", "norm"),
    *module_rules(_BLOCK + r"attn\.k_norm", _ATTN + "k_norm", "norm"),
    (_BLOCK + r"attn\.(lambda_[qk][12])", _ATTN + "{1}", "same"),  # differential attention's
    (_BLOCK + r"attn\.sub_norm\.weight", _ATTN + "sub_norm/scale", "same"),
    (_BLOCK + r"attn\.relative_position_bias_table", _ATTN + "relative_position_bias_table", "same"),
    *module_rules(_BLOCK + r"attn\.rel_pos\.mlp\.fc1", _ATTN + "RelPosMlp/Dense_0", "linear"),  # vit_relpos_*
    *module_rules(_BLOCK + r"attn\.rel_pos\.mlp\.fc2", _ATTN + "RelPosMlp/Dense_1", "linear"),
    (_BLOCK + r"ls1\.gamma", _T + "LayerScale_0/scale", "same"),
    (_BLOCK + r"rope_freqs", _T + "rope_freqs", "same"),
    *module_rules(_BLOCK + "norm2", _T + "LayerNorm_2", "norm"),
    *module_rules(_BLOCK + r"mlp\.fc1", _T + "MlpBlock_3/Dense_0", "linear"),
    *module_rules(_BLOCK + r"mlp\.norm", _T + "MlpBlock_3/norm", "norm"),
    *module_rules(_BLOCK + r"mlp\.fc2", _T + "MlpBlock_3/Dense_1", "linear"),
    (_BLOCK + r"ls2\.gamma", _T + "LayerScale_1/scale", "same"),
    *module_rules("norm", "Transformer/encoder_norm", "norm"),
    (r"attn_pool\.latent", _MAP + "probe", "same"),
    (r"attn_pool\.q\.weight", _MAP + "MultiHeadDotProductAttention_0/query/kernel", "heads_kernel"),
    (r"attn_pool\.q\.bias", _MAP + "MultiHeadDotProductAttention_0/query/bias", "heads_bias"),
    (r"attn_pool\.kv\.weight", _MAP + "MultiHeadDotProductAttention_0/{{}}/kernel", "kv_kernel"),
    (r"attn_pool\.kv\.bias", _MAP + "MultiHeadDotProductAttention_0/{{}}/bias", "kv_bias"),
    *module_rules(r"attn_pool\.proj", _MAP + "MultiHeadDotProductAttention_0/out", "out_kernel"),
    *module_rules(r"attn_pool\.norm", _MAP + "LayerNorm_0", "norm"),
    *module_rules(r"attn_pool\.mlp\.fc1", _MAP + "MlpBlock_0/Dense_0", "linear"),
    *module_rules(r"attn_pool\.mlp\.fc2", _MAP + "MlpBlock_0/Dense_1", "linear"),
    *module_rules("fc_norm", "fc_norm", "norm"),
    *module_rules("head", "head", "linear"),
    *module_rules("head_dist", "head_dist", "linear"),
    # timm's NaFlex ViTs (naflexvit_*): a Linear patch embedding on (P, P, C)-flattened patches, the
    # position embeddings as a (1, H, W, D) grid or per-axis tables
    *module_rules(r"embeds\.proj", "embedding", "patch_linear"),
    (r"embeds\.cls_token", "cls", "same"),
    (r"embeds\.reg_token", "registers", "same"),
    (r"embeds\.pos_embed", "Transformer/posembed_input/pos_embedding", "grid_flat"),
    (r"embeds\.pos_embed_(y|x)", "Transformer/posembed_input/pos_embed_{0}", "unbatch"),
)
# the ResNetV2 of timm's hybrids (vit_*_r26_*, vit_*_r50_*): the official stem's layout, units counted from 1
_STAGE, _UNIT = r"patch_embed\.backbone\.stages\.(\d+)\.blocks\.(\d+)\.", "block{0+}/unit{1+}/"
_RULES += (
    (r"patch_embed\.backbone\.(?:stem\.)?conv\.weight", "conv_root/kernel", "conv"),  # no stem.: the root alone
    *module_rules(r"patch_embed\.backbone\.(?:stem\.)?norm", "gn_root", "norm"),
    (_STAGE + r"(conv\d)\.weight", _UNIT + "{2}/kernel", "conv"),
    (_STAGE + r"downsample\.conv\.weight", _UNIT + "conv_proj/kernel", "conv"),
    *module_rules(_STAGE + r"norm(\d)", _UNIT + "gn{2}", "norm"),
    *module_rules(_STAGE + r"downsample\.norm", _UNIT + "gn_proj", "norm"),
)
_COMPILED = tuple((re.compile(pattern + "$"), template, how) for pattern, template, how in _RULES)


def _fill(template, groups):
    """Formats `{i}` with group i and `{i+}` with group i plus one (timm counts from 0, the official files from 1)."""
    out = re.sub(r"\{(\d)\+\}", lambda m: str(int(groups[int(m.group(1))]) + 1), template)
    return re.sub(r"\{(\d)\}", lambda m: groups[int(m.group(1))], out).replace("{{}}", "{}")


def _per_head(w, num_heads):
    """(D_out, D_in) torch Linear weight -> official (D_in, heads, head_dim) kernel."""
    return w.T.reshape(w.shape[1], num_heads, -1)


def transform(how, value, num_heads):
    """One timm array in the official layout (a dict {q/k/v name: array} for the fused q/k/v)."""
    if how == "same":
        return value
    if how == "linear":
        return value.T
    if how == "conv":  # (out, in, kh, kw) -> (kh, kw, in, out)
        return value.transpose(2, 3, 1, 0)
    if how == "patch_linear":  # (out, P * P * 3), channels fastest -> (P, P, 3, out)
        side = math.isqrt(value.shape[1] // 3)
        return value.T.reshape(side, side, 3, value.shape[0])
    if how == "grid_flat":  # (1, H, W, D) -> (1, H * W, D)
        return value.reshape(1, -1, value.shape[-1])
    if how == "unbatch":  # (1, n, D) -> (n, D)
        return value[0]
    if how in ("qkv_kernel", "kv_kernel"):
        names = ("query", "key", "value")[3 - len(how.split("_")[0]):]
        return dict(zip(names, (_per_head(w, num_heads) for w in np.split(value, len(names), axis=0))))
    if how in ("qkv_bias", "kv_bias"):
        names = ("query", "key", "value")[3 - len(how.split("_")[0]):]
        return dict(zip(names, (b.reshape(num_heads, -1) for b in np.split(value, len(names)))))
    if how == "heads_kernel":  # one (D_out, D_in) projection -> (D_in, heads, head_dim)
        return _per_head(value, num_heads)
    if how == "heads_bias":
        return value.reshape(num_heads, -1)
    if how == "out_kernel":  # (D, D_in = heads * head_dim) -> (heads, head_dim, D)
        return value.T.reshape(num_heads, -1, value.shape[0])
    raise ValueError(f"unknown transform {how!r}")


def unsupported(keys):
    """The list of 'what it is (keys)' for keys of architectures the ViT builder does not make."""
    found = []
    for pattern, what in UNSUPPORTED:
        hits = [k for k in keys if re.search(pattern, k)]
        if hits:
            found.append(f"{what}: {', '.join(hits[:3])}" + (" ..." if len(hits) > 3 else ""))
    return found


def complete(tensors):
    """A timm state dict with SwiGLU's `fc1_g` and `fc1_x` as one `fc1` (the gate first, as the builder's "swiglu"
    reads it), and zero biases for a kind of block projection (q/k/v, output, MLP) that has none in any block (AIMv2's,
    DINOv3's): the builder's projections have one, and zero computes the same; one block's missing bias stays missing.
    A parallel block's keys, and a block of branches', are read as a block's first (`timm_blocks`)."""
    tensors, out = branches_as_blocks(parallel_as_block(tensors)), {}
    for key, value in tensors.items():
        gate = re.fullmatch(r"(blocks\.\d+\.mlp\.)fc1_([gx])\.(weight|bias)", key)
        partner = gate and f"{gate.group(1)}fc1_{'x' if gate.group(2) == 'g' else 'g'}.{gate.group(3)}"
        if gate is None or partner not in tensors:  # a half without its partner: left to be named as unmapped
            out[key] = value
        elif gate.group(2) == "g":
            out[f"{gate.group(1)}fc1.{gate.group(3)}"] = np.concatenate([value, tensors[partner]])
    shared = {k: out.pop(k) for k in [k for k in out if k.startswith("shared_rel_pos.mlp.")]}
    for i in sorted({m.group(1) for k in out for m in [re.match(r"blocks\.(\d+)\.norm1\.weight$", k)] if m}):
        # vit_srelpos_*: the relative position MLP the blocks share is each block's (the same weights compute the same)
        out |= {f"blocks.{i}.attn.rel_pos.{k[len('shared_rel_pos.'):]}": v for k, v in shared.items()}
    for name in ("attn.qkv", "attn.proj", "mlp.fc1", "mlp.fc2"):  # a kind of projection no block has a bias for
        weights = [k for k in out if re.fullmatch(rf"blocks\.\d+\.{re.escape(name)}\.weight", k)]
        if not any(k[:-len("weight")] + "bias" in out for k in weights):
            out |= {k[:-len("weight")] + "bias": np.zeros(out[k].shape[0], out[k].dtype) for k in weights}
    return out


def readable(tensors, name=""):
    """`tensors` in the key names the rules read: a timm state dict of the Eva layout whose `name` says its
    architecture converted (`from_eva`), then `complete`d; any other state dict as it is.

    Raises:
        ValueError: a file without some projection's biases whose name names no timm ViT: post-norm blocks store
            the keys of pre-norm ones, so only the name tells."""
    tensors = from_eva(tensors, TIMM_EVA_LAYOUT.get(named_architecture(name, TIMM_EVA_LAYOUT)))
    if not is_timm(tensors):
        return tensors
    biasless = any(k.endswith(".weight") and k[:-len("weight")] + "bias" not in tensors
                   for k in tensors if re.fullmatch(r"blocks\.0\.(attn\.(qkv|proj)|mlp\.fc[12](_g)?)\.weight", k))
    named = _relpos_size(name) or any(re.search(r"(?<![a-z0-9])(naflex)?(vit|aimv2)_[a-z0-9_]*patch\d+", part)
                                      for part in _name_parts(name))
    if biasless and not is_eva(tensors) and not unsupported(tensors) and not named:
        raise ValueError("a timm ViT with projections without bias whose name names no timm architecture: timm's pre-norm "
                         "blocks (e.g. vit_betwixt_patch16_gap_256, aimv2_*) and its post-norm ones "
                         f"({', '.join(TIMM_POST_NORM)}) store the same keys; name the file after its timm architecture "
                         "(e.g. vit_betwixt_patch16_gap_256.sw_in12k.safetensors) or pass that name to "
                         "keras_vit.from_timm")
    return complete(tensors)


def is_timm(tensors):
    return "patch_embed.proj.weight" in tensors or is_naflex(tensors)


def is_naflex(tensors):
    """A timm NaFlex ViT (`naflexvit_*`)."""
    return "embeds.proj.weight" in tensors


def place(arrays, official, value):
    """Puts a transformed array in `arrays` at its `official` key, or a dict of q/k/v ones at theirs (`{}` their name)."""
    if isinstance(value, dict):
        arrays |= {official.format(name): v for name, v in value.items()}
    else:
        arrays[official] = value


def to_official(tensors, num_heads):
    """(official arrays, timm keys no rule maps) of a timm state dict, q/k/v split into `num_heads`."""
    arrays, unmapped = {}, []
    for key, value in tensors.items():
        branch = re.fullmatch(r"(blocks\.\d+\.)branch\.(\d+)\.(.+)", key)  # a branch's (`timm_blocks`)
        for pattern, template, how in _COMPILED:
            match = pattern.match(branch.group(1) + branch.group(3) if branch else key)
            if match:
                official = _fill(template, match.groups())
                if branch:
                    official = re.sub(r"^(Transformer/encoderblock_\d+/)", rf"\g<1>branch_{branch.group(2)}/", official)
                place(arrays, official, transform(how, value, num_heads))
                break
        else:
            unmapped.append(key)
    return arrays, unmapped


def _covers_registers(tokens, prefix, registers):
    """Whether `tokens` position embeddings cover the register tokens too (timm's no_embed_class=False with
    reg_tokens: its `vit_so150m*` models): a square grid with the prefix and the registers, and no other reading."""
    return bool(registers) and _square(tokens - prefix - registers) and not _square(tokens - prefix) \
        and not _square(tokens)


def _square(n):
    return n > 0 and math.isqrt(n) ** 2 == n


def covers_prefix(tokens, prefix, registers=0, grid=None):
    """Whether `tokens` position embeddings cover the `prefix` class/distillation tokens (timm's
    no_embed_class=False) or the patch grid only, read from their count: the grid (gh * gw, or any
    square count when `grid` is None) plus the prefix, or the grid alone. None when the count does
    not say (a non-square grid: pass the image size)."""
    fits = (lambda n: n == grid) if grid else _square
    if prefix and fits(tokens - prefix):
        return True
    if fits(tokens):
        return False
    if registers and fits(tokens - prefix - registers):
        raise ValueError(f"{tokens} position embeddings cover the {registers} register tokens too; keras_vit's "
                         "registers carry no position embedding (as timm's released register models, "
                         "no_embed_class=True, and Hugging Face's DINOv2 with registers)")
    return None


def architecture(tensors, name=""):
    """Builder arguments readable from a timm state dict (the head count is not among them).

    `name` (a timm model name or file name) tells what a state dict does not (`name_options`): OpenAI
    CLIP's QuickGELU, a SigLIP architecture's GELU and resolution. `gelu_assumed` is True where neither
    tells the GELU of a file of SigLIP's layout (no class token, no fc_norm): the exact one is taken.
    `timm_heads`: the head count timm's ViTs of this width and layout have (TIMM_SIGLIP_HEADS for
    SigLIP's, else TIMM_HEADS; None for another width)."""
    if is_naflex(tensors):
        return _naflex_architecture(tensors, name)
    branches, tensors = first_branch(tensors)  # a block of branches: each branch has the block's options
    kernel = tensors["patch_embed.proj.weight"]
    depth = sum(1 for k in tensors if re.fullmatch(r"blocks\.\d+\.norm1\.weight", k))
    head = tensors.get("head.weight")
    has_cls, has_dist = "cls_token" in tensors, "dist_token" in tensors
    registers = int(tensors["reg_token"].shape[1]) if "reg_token" in tensors else 0
    fc1, fc2 = (tensors.get(f"blocks.0.mlp.fc{i}.weight") for i in (1, 2))
    swiglu = fc1 is not None and fc2 is not None and fc1.shape[0] == 2 * fc2.shape[1]
    tokens = int(tensors["pos_embed"].shape[1]) if "pos_embed" in tensors else None
    fc_norm = "fc_norm.weight" in tensors
    clip = "norm_pre.weight" in tensors  # timm's only pre-norm ViTs are its CLIP towers, LayerNorm eps 1e-5
    eva, aimv2, rms_named = _named_layouts(tensors, name)
    prefix = int(has_cls) + int(has_dist)
    relpos = tensors.get("blocks.0.attn.rel_pos.mlp.fc1.weight")  # timm's relative position MLP (2 -> hidden)
    with_registers = bool(tokens) and _covers_registers(tokens, prefix, registers)  # vit_so150m*
    named = name_options(name)
    siglip = not (prefix or fc_norm or registers or clip or swiglu or "blocks.0.ls1.gamma" in tensors)
    arch = dict(
        patch_size=int(kernel.shape[-1]), hidden_size=int(kernel.shape[0]), num_layers=depth,
        timm_heads=TIMM_NAMED_HEADS.get(named_architecture(name, TIMM_NAMED_HEADS)) or (
            TIMM_SIGLIP_HEADS if siglip and not _names_other_vit(name) else TIMM_HEADS).get(int(kernel.shape[0])),
        mlp_dim=None if fc2 is None else int(fc2.shape[1]), resnet=_resnet(tensors),
        classifier="map" if "attn_pool.latent" in tensors else "token" if has_cls else "gap",
        classes=None if head is None else int(head.shape[0]),
        tokens=tokens, pre_logits=False, approximate_gelu=named.get("approximate_gelu", False),
        gelu_assumed=siglip and not (named.keys() & {"approximate_gelu", "mlp_activation"}
                                     or _names_other_vit(name)),
        image_size=_named_image_size(name, int(kernel.shape[-1]), tokens),
        layer_norm_epsilon=1e-5 if clip or named_architecture(name, dict.fromkeys(TIMM_EPSILON_1E5)) else 1e-6,
        distillation_token=has_dist, num_register_tokens=registers,
        # without a class token there is nothing to skip: True, as the builder takes it then
        prefix_position_embedding=True if tokens is None or with_registers
        else covers_prefix(tokens, prefix, registers) or not prefix,
        register_position_embedding=with_registers,
        layer_scale=1e-5 if "blocks.0.ls1.gamma" in tensors else None, pre_norm=clip, fc_norm=fc_norm, rope=None,
        mlp_norm="blocks.0.mlp.norm.weight" in tensors, attention_norm="blocks.0.attn.norm.weight" in tensors,
        embed_norm="patch_embed.norm.weight" in tensors,
        # no final norm where the file has none before or after pooling (RADIO's final_norm=False)
        encoder_norm=None if "norm.weight" in tensors or fc_norm else False,
        relative_position_bias="blocks.0.attn.relative_position_bias_table" in tensors,
        relative_position_mlp=None if relpos is None else int(relpos.shape[0]),
        # post-norm blocks (ResPostBlock) store the keys of pre-norm ones: the name tells (TIMM_POST_NORM)
        post_norm=bool(named_architecture(name, dict.fromkeys(TIMM_POST_NORM))),
        qk_norm="blocks.0.attn.q_norm.weight" in tensors, parallel_branches=branches,
        differential_attention="blocks.0.attn.lambda_q1" in tensors,
        # a block of one norm: a parallel block (`timm_blocks.parallel_as_block`)
        parallel_blocks="blocks.0.norm1.weight" in tensors and "blocks.0.norm2.weight" not in tensors,
        # a class token beside attention pooling (Perception Encoder's), and the pool's MLP where not the encoder's
        class_token=True if has_cls and "attn_pool.latent" in tensors else None,
        map_include_prefix=bool(named_architecture(name, dict.fromkeys(TIMM_POOL_INCLUDE_PREFIX))) or None,
        map_mlp_dim=_map_mlp_dim(tensors, fc2),
        # a class token beside an average of the patch tokens (timm's global_pool='avg' with fc_norm: EVA, MAE)
        pooling="avg" if fc_norm and has_cls else None,
        # GELU or QuickGELU a state dict does not say (None: the builder's GELU), its name may
        mlp_activation="swiglu" if swiglu else named.get("mlp_activation"),
        position_interpolation="bicubic_antialias", source_head=timm_head(tensors),
        # timm's pretrained configs: CLIP's statistics for its CLIP towers, ImageNet's for DeiT (III) and
        # DINOv2, [-1, 1] for the paper's and AugReg's ViTs (and SigLIP)
        input_mode="clip" if clip else "imagenet" if has_dist or "blocks.0.ls1.gamma" in tensors else "vit",
    )
    if relpos is not None and tokens is None:  # no position embeddings: the resolution a vit_relpos_* name ends in
        arch.update(position_embedding="none", image_size=_relpos_size(name))
    if rms_named is not None:  # what the name tells (TIMM_RMS_NORM)
        arch.update(normalization="rms_norm", layer_norm_epsilon=TIMM_RMS_NORM[rms_named], input_mode="vit")
    if aimv2 is not None:  # what the name tells (TIMM_AIMV2_HEADS)
        arch.update(timm_heads=TIMM_AIMV2_HEADS[aimv2], normalization="rms_norm", layer_norm_epsilon=1e-5,
                    input_mode="clip")
    if eva is not None:  # what the name tells (TIMM_EVA_LAYOUT)
        layout = TIMM_EVA_LAYOUT[eva]
        arch.update(timm_heads=layout["heads"], rope=layout["rope"] and dict(layout["rope"]),
                    image_size=(layout["size"],) * 2, **layout["options"])
        if tokens is None:  # rotary only (DINOv3, timm's rope ViTs without `_ape`)
            arch["position_embedding"] = "none"
    return arch


def _named_layouts(tensors, name):
    """(eva, aimv2, rms): the architectures of TIMM_EVA_LAYOUT, TIMM_AIMV2_HEADS and TIMM_RMS_NORM that `name` names
    (or None), a file of timm's RmsNorm or of its Eva layout whose name names none refused: their state dicts do not
    record what the name tells."""
    eva, aimv2 = named_architecture(name, TIMM_EVA_LAYOUT), named_architecture(name, TIMM_AIMV2_HEADS)
    rms = "blocks.0.norm1.weight" in tensors and "blocks.0.norm1.bias" not in tensors  # timm's RmsNorm has no bias
    rms_named = named_architecture(name, TIMM_RMS_NORM)
    if rms and aimv2 is None and rms_named is None:
        raise ValueError("a ViT whose norms have no bias (timm's RmsNorm: AIMv2) whose head count and epsilon its state "
                         "dict does not record: name the file after its timm architecture (one of "
                         f"{', '.join((*TIMM_AIMV2_HEADS, *TIMM_RMS_NORM))}, e.g. aimv2_large_patch14_224.apple_pt.safetensors) "
                         "or pass that name to keras_vit.from_timm")
    if eva is None and is_eva(tensors):
        raise ValueError("a ViT of timm's Eva layout (eva.py: layer scale gamma_1, q/v biases apart) whose position "
                         "encoding its state dict does not record: name the file after its timm architecture (one of "
                         f"{', '.join(TIMM_EVA_LAYOUT)}, e.g. vit_small_patch16_dinov3.lvd1689m.safetensors) or "
                         "pass that name to keras_vit.from_timm")
    return eva, aimv2, rms_named


def _resnet(tensors):
    """The `resnet` option of a timm hybrid's ResNetV2 (its units per stage, its width, timm's numerics), else None."""
    root = tensors.get("patch_embed.backbone.stem.conv.weight", tensors.get("patch_embed.backbone.conv.weight"))
    if root is None:
        return None
    units = [int(m.group(1)) for k in tensors
             for m in [re.fullmatch(r"patch_embed\.backbone\.stages\.(\d+)\.blocks\.\d+\.conv1\.weight", k)] if m]
    return {"num_layers": tuple(units.count(i) for i in range(max(units, default=-1) + 1)),
            "width_factor": int(root.shape[0]) // 64,
            "numerics": "timm"}


def _map_mlp_dim(tensors, fc2):
    """The attention-pool head's MLP width where it is not the encoder's, else None."""
    pool = tensors.get("attn_pool.mlp.fc1.weight")
    return int(pool.shape[0]) if pool is not None and fc2 is not None and pool.shape[0] != fc2.shape[1] else None


def _naflex_architecture(tensors, name):
    """`architecture` of a timm NaFlex ViT: the classic ViT's, with its patch size read off the Linear
    patch embedding, its grid off the position embeddings (added to the patches only: the prefix tokens
    come after), and their rule: bicubic antialiased for the learned grid, linear for the factorized tables."""
    proj = tensors["embeds.proj.weight"]
    side = math.isqrt(proj.shape[1] // 3)
    renamed = {"patch_embed.proj.weight": np.zeros((proj.shape[0], 3, side, side), "float32"),
               **{k.replace("embeds.", "", 1): v for k, v in tensors.items()
                  if k.startswith("embeds.") and not k.startswith(("embeds.proj", "embeds.pos_embed"))},
               **{k: v for k, v in tensors.items() if not k.startswith("embeds.")}}
    arch = architecture(renamed, name)
    factorized = "embeds.pos_embed_y" in tensors
    grid = (tensors["embeds.pos_embed_y"].shape[1], tensors["embeds.pos_embed_x"].shape[1]) if factorized \
        else tuple(tensors["embeds.pos_embed"].shape[1:3]) if "embeds.pos_embed" in tensors else None
    options = name_options(name)
    arch.update(
        tokens=None if factorized or grid is None else grid[0] * grid[1],
        image_size=None if grid is None else (grid[0] * side, grid[1] * side),
        position_embedding="factorized" if factorized else "learned_1d" if grid else "none",
        position_interpolation="bilinear_half_pixel" if factorized else options.get("position_interpolation",
                                                                                    "bicubic_antialias"),
        position_aspect_preserving=options.get("position_aspect_preserving", False),
        prefix_position_embedding="embeds.cls_token" not in tensors, input_mode="vit")
    return arch
