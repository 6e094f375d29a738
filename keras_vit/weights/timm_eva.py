"""timm's `Eva` state dicts (eva.py: EVA-01, EVA-02, DINOv3, LingBot-Vision and timm's own rotary ViTs; and
beit.py's BEiT, of the same key layout) in the key names of its `VisionTransformer`, which `keras_vit.weights.timm` reads, and what each architecture's name
tells that its state dict does not: the head count, the rotary embedding and the pretrained size."""

import re

import numpy as np

DINOV3_ROPE = {"kind": "dinov3", "temperature": 100.0}
# EVA-02's (and timm's `vit_*_rope_reg*_gap_256`): timm's RotaryEmbeddingCat on a grid index rescaled to the
# 16 x 16 grid the models were pre-trained on (224 px / 14)
EVA02_ROPE = {"kind": "eva", "temperature": 10000.0, "reference_grid": (16, 16), "offset": 0.0, "axes": "ij"}
# timm's `vit_{small,base,large}_patch16_rope[_ape]_224` (Heo et al. 2024's axial RoPE): columns first, no rescale
AXIAL_ROPE = {"kind": "eva", "temperature": 100.0, "reference_grid": None, "offset": 0.0, "axes": "xy"}
# their `vit_*_patch16_rope_mixed[_ape]_224`: RoPE-Mixed's learned frequencies, a (2, heads, head_dim / 2) set a block
MIXED_ROPE = {"kind": "mixed", "temperature": 10.0, "axes": "xy"}

# timm's ViTs of DINOv3's layout (rope_type='dinov3': DINOv3's `vit_*_dinov3*`, their `_qkvb` twins the same with
# q/v biases, and LingBot-Vision's `vit_*_lingbot`) -> (head count, the size of timm's pretrained configs). Each has
# DINOv3's rotary position embedding (DINOV3_ROPE) and no other, 4 registers, layer scale and LayerNorm epsilon
# 1e-5; a state dict records the registers and the layer scale only, and huge_plus's width 1280 has 20 heads where
# timm's other 1280-wide ViTs have 16. tests/test_dinov3.py checks the table against timm's definitions.
TIMM_DINOV3_LAYOUT = {
    "vit_tiny_patch16_dinov3": (3, 256), "vit_small_patch16_dinov3": (6, 256),
    "vit_small_plus_patch16_dinov3": (6, 256), "vit_base_patch16_dinov3": (12, 256), "vit_large_patch16_dinov3": (16, 256),
    "vit_huge_plus_patch16_dinov3": (20, 256), "vit_7b_patch16_dinov3": (32, 256),
    "vit_small_patch16_lingbot": (6, 512), "vit_base_patch16_lingbot": (12, 512),
    "vit_large_patch16_lingbot": (16, 512), "vit_giant_patch16_lingbot": (24, 512)}


def _layout(heads, size, rope=None, **options):
    return {"heads": heads, "size": size, "rope": rope, "options": options}


def _pe(heads, size, reference, offset, **options):
    """A Perception Encoder tower's layout: its rotary rule, LayerNorm epsilon 1e-5, [-1, 1] inputs."""
    rope = {"kind": "eva", "temperature": 10000.0, "reference_grid": (reference, reference), "offset": offset,
            "axes": "xy"}
    return _layout(heads, size, rope, layer_norm_epsilon=1e-5, input_mode="vit", **options)


# Every timm architecture of the Eva layout keras-vit reads -> its head count, the size of its pretrained configs,
# its rotary embedding (None: none) and the builder options its state dict does not record. The state dict records
# the rest (q/v biases, SwiGLU, the norms in the MLP and the attention, fc_norm, registers, layer scale).
# tests/test_eva.py checks the table against timm's definitions.
TIMM_EVA_LAYOUT = {
    **{arch: _layout(heads, size, DINOV3_ROPE, layer_norm_epsilon=1e-5)
       for arch, (heads, size) in TIMM_DINOV3_LAYOUT.items()},
    **{f"eva02_{width}_patch14_{size}": _layout(heads, size, EVA02_ROPE)
       for width, heads, sizes in (("tiny", 3, (224, 336)), ("small", 6, (224, 336)), ("base", 12, (224, 448)),
                                   ("large", 16, (224, 448))) for size in sizes},
    "eva02_base_patch16_clip_224": _layout(12, 224, EVA02_ROPE),
    "eva02_large_patch14_clip_224": _layout(16, 224, EVA02_ROPE),
    "eva02_large_patch14_clip_336": _layout(16, 336, EVA02_ROPE),
    **{f"eva_giant_patch14_{size}": _layout(16, size) for size in (224, 336, 560)},
    "eva_giant_patch14_clip_224": _layout(16, 224),
    "eva02_enormous_patch14_clip_224": _layout(16, 224, post_norm=True),  # EVA-CLIP's post-norm blocks
    "vit_medium_patch16_rope_reg1_gap_256": _layout(8, 256, EVA02_ROPE),
    "vit_mediumd_patch16_rope_reg1_gap_256": _layout(8, 256, EVA02_ROPE),
    "vit_betwixt_patch16_rope_reg4_gap_256": _layout(10, 256, EVA02_ROPE),
    "vit_base_patch16_rope_reg1_gap_256": _layout(12, 256, EVA02_ROPE),
    **{f"vit_{width}_patch16_rope{ape}_224": _layout(heads, 224, AXIAL_ROPE)
       for width, heads in (("small", 6), ("base", 12), ("large", 16)) for ape in ("", "_ape")},
    **{f"vit_{width}_patch16_rope_mixed{ape}_224": _layout(heads, 224, MIXED_ROPE)
       for width, heads in (("small", 6), ("base", 12), ("large", 16)) for ape in ("", "_ape")},
    # Perception Encoder: core (an attention-pool head of 8 heads over every token), lang and spatial (the patch
    # tokens averaged, no final norm); rotary on a grid index from 1 (0 for gigantic), columns first
    **{f"vit_pe_core_{arch}": _pe(heads, size, ref, offset, map_num_heads=8, map_include_prefix=True)
       for arch, heads, size, ref, offset in (
           ("tiny_patch16_384", 3, 384, 24, 1.0), ("small_patch16_384", 6, 384, 24, 1.0),
           ("base_patch16_224", 12, 224, 14, 1.0), ("large_patch14_336", 16, 336, 24, 1.0),
           ("gigantic_patch14_448", 16, 448, 32, 0.0))},
    **{f"vit_pe_{arch}": _pe(heads, size, 32, offset, pooling="avg", encoder_norm=False)
       for arch, heads, size, offset in (
           ("lang_large_patch14_448", 16, 448, 1.0), ("lang_gigantic_patch14_448", 16, 448, 0.0),
           ("spatial_tiny_patch16_512", 3, 512, 1.0), ("spatial_small_patch16_512", 6, 512, 1.0),
           ("spatial_base_patch16_512", 12, 512, 1.0), ("spatial_large_patch14_448", 16, 448, 1.0),
           ("spatial_gigantic_patch14_448", 16, 448, 0.0))},
    # beit.py's BEiT and BEiT v2 (the same key layout: layer scale as gamma, q/v biases apart; a relative position
    # bias in every block, which the state dict records)
    **{f"beit_{width}_patch16_{size}": _layout(heads, size) for width, heads, sizes in (
        ("base", 12, (224, 384)), ("large", 16, (224, 384, 512))) for size in sizes},
    "beitv2_base_patch16_224": _layout(12, 224), "beitv2_large_patch16_224": _layout(16, 224),
}


def is_eva(tensors):
    """A state dict of timm's `Eva` layout: layer scale as `gamma_1`, q/v biases apart (`q_bias`), or q, k and v
    as three projections (`q_proj`)."""
    return "patch_embed.proj.weight" in tensors and any(
        f"blocks.0.{k}" in tensors for k in ("gamma_1", "attn.q_bias", "attn.q_proj.weight"))


def halves(heads, head_dim):
    """The order of a projection's rows that lays each head's neighbouring pairs (2c, 2c + 1) of channels out
    as halves (c, c + head_dim / 2): EVA-02's rotation of pairs as the "rotate half" one of
    `keras_vit.layers.rotary`. Queries and keys in the same order leave every q . k as it was."""
    within = np.concatenate([np.arange(0, head_dim, 2), np.arange(1, head_dim, 2)])
    return (np.arange(heads)[:, None] * head_dim + within[None, :]).reshape(-1)


def _fused_qkv(tensors, block, heads, pairs):
    """(weight (3D, D), bias (3D,)) of a block's q, k and v as timm's fused `qkv`: the three projections
    concatenated, the biases a model lacks (Eva's k, or all) zero, and with `pairs` (an "eva" rope) the query and
    key rows of each head laid out as `halves`."""
    get = lambda key: tensors.get(f"{block}attn.{key}")  # noqa: E731
    weight = get("qkv.weight")
    if weight is None:
        weight = np.concatenate([get(f"{n}_proj.weight") for n in "qkv"])
    bias = get("qkv.bias")
    if bias is None:
        dim = weight.shape[0] // 3
        parts = [get(f"{n}_bias") if get(f"{n}_bias") is not None else get(f"{n}_proj.bias") for n in "qkv"]
        bias = np.concatenate([np.zeros(dim, weight.dtype) if p is None else p for p in parts])
    if pairs:
        dim = weight.shape[0] // 3
        order = halves(heads, dim // heads)
        order = np.concatenate([order, dim + order, 2 * dim + np.arange(dim)])  # q and k; v as it is
        weight, bias = weight[order], bias[order]
    return weight, bias


def from_eva(tensors, layout):
    """A timm state dict of an architecture of TIMM_EVA_LAYOUT (its entry `layout`; the Eva layout, `is_eva`) in the
    key names of timm's `VisionTransformer`: `gamma_i` -> `lsi.gamma`; q, k and v (fused or apart, their biases
    apart or none) as one `qkv` (`_fused_qkv`). Any other state dict, or no layout, is returned as it is."""
    if layout is None or "patch_embed.proj.weight" not in tensors:  # a named architecture: its pairs laid out too
        return tensors
    pairs = (layout["rope"] or {}).get("kind") in ("eva", "mixed")
    out = {}
    for key, value in tensors.items():
        if key == "rope.freqs":  # RoPE-Mixed's (2, depth, heads, head_dim / 2): each block's own
            out |= {f"blocks.{i}.rope_freqs": value[:, i] for i in range(value.shape[1])}
            continue
        block = re.match(r"(blocks\.\d+\.)(.*)$", key)
        rest = block and block.group(2)
        if block is None:
            out[key] = value
        elif rest in ("gamma_1", "gamma_2"):
            out[f"{block.group(1)}ls{rest[-1]}.gamma"] = value
        elif rest in ("attn.qkv.weight", "attn.q_proj.weight"):
            qkv = _fused_qkv(tensors, block.group(1), layout["heads"], pairs)
            out[f"{block.group(1)}attn.qkv.weight"], out[f"{block.group(1)}attn.qkv.bias"] = qkv
        elif re.fullmatch(r"attn\.(qkv\.bias|[qkv]_bias|[qkv]_proj\.\w+)", rest):
            continue  # in the fused q/k/v above
        else:
            out[key] = value
    return out
