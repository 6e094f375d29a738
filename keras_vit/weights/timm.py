"""timm `VisionTransformer` state dicts -> official ViT keys: the key map as data, the array
transforms as small functions. timm keeps q, k, v as one fused `qkv` Linear; it is split into the
official per-head kernels here. timm models use the exact erf GELU and LayerNorm epsilon 1e-6."""

import re

import numpy as np

# Keys of architectures that are not the paper's ViT -> what they are.
UNSUPPORTED = (
    (r"^dist_token$|^head_dist\.", "a DeiT with a distillation token (dist_token / head_dist)"),
    (r"^reg_token$", "a ViT with register tokens (reg_token)"),
    (r"^norm_pre\.", "a CLIP-style ViT (a LayerNorm before the encoder: norm_pre)"),
    (r"^fc_norm\.", "a ViT whose final LayerNorm follows the pooling (fc_norm)"),
    (r"\.ls[12]\.gamma$|\.gamma_[12]$", "a ViT with layer scale (ls1/ls2)"),
    (r"\.attn\.[qk]_norm\.", "a ViT with q/k normalisation (q_norm/k_norm)"),
    (r"\.attn\.[qv]_bias$", "a BEiT-style ViT (separate q/v biases)"),
    (r"^attn_pool\.", "a ViT with an attention-pooling (MAP) head"),
    (r"^(visual|vision_model)\.", "a CLIP vision tower"),
    (r"^patch_embed\.backbone\.", "a hybrid with timm's ResNetV2 stem (patch_embed.backbone), whose weight "
     "standardisation (w - mean) / sqrt(var + 1e-8) and GroupNorm epsilon 1e-5 are not the official stem's "
     "(w - mean) / (std + 1e-5) and 1e-6: its outputs would not be timm's; load the official R50/R26 .npz instead"),
)



def module_rules(src, dst, how):
    """The two rules of one torch module: its weight (a LayerNorm's, how="norm", is the scale;
    otherwise the kernel, transformed as `how` says) and its bias (as it is)."""
    weight = (src + r"\.weight", f"{dst}/scale", "same") if how == "norm" else (src + r"\.weight", f"{dst}/kernel", how)
    return weight, (src + r"\.bias", f"{dst}/bias", "same")


_BLOCK, _T = r"blocks\.(\d+)\.", "Transformer/encoderblock_{0}/"
_ATTN = _T + "MultiHeadDotProductAttention_1/"
# timm key (regex) -> official key (template) and how the array is transformed.
_RULES = (
    *module_rules(r"patch_embed\.proj", "embedding", "conv"),
    (r"cls_token", "cls", "same"),
    (r"pos_embed", "Transformer/posembed_input/pos_embedding", "same"),
    *module_rules(_BLOCK + "norm1", _T + "LayerNorm_0", "norm"),
    (_BLOCK + r"attn\.qkv\.weight", _ATTN + "{{}}/kernel", "qkv_kernel"),
    (_BLOCK + r"attn\.qkv\.bias", _ATTN + "{{}}/bias", "qkv_bias"),
    *module_rules(_BLOCK + r"attn\.proj", _ATTN + "out", "out_kernel"),
    *module_rules(_BLOCK + "norm2", _T + "LayerNorm_2", "norm"),
    *module_rules(_BLOCK + r"mlp\.fc1", _T + "MlpBlock_3/Dense_0", "linear"),
    *module_rules(_BLOCK + r"mlp\.fc2", _T + "MlpBlock_3/Dense_1", "linear"),
    *module_rules("norm", "Transformer/encoder_norm", "norm"),
    *module_rules("head", "head", "linear"),
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
    if how == "qkv_kernel":
        return dict(zip(("query", "key", "value"), (_per_head(w, num_heads) for w in np.split(value, 3, axis=0))))
    if how == "qkv_bias":
        return dict(zip(("query", "key", "value"), (b.reshape(num_heads, -1) for b in np.split(value, 3))))
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


def is_timm(tensors):
    return "patch_embed.proj.weight" in tensors


def to_official(tensors, num_heads):
    """(official arrays, timm keys no rule maps) of a timm state dict, q/k/v split into `num_heads`."""
    arrays, unmapped = {}, []
    for key, value in tensors.items():
        for pattern, template, how in _COMPILED:
            match = pattern.match(key)
            if match:
                official = _fill(template, match.groups())
                out = transform(how, value, num_heads)
                if isinstance(out, dict):
                    arrays |= {official.format(name): v for name, v in out.items()}
                else:
                    arrays[official] = out
                break
        else:
            unmapped.append(key)
    return arrays, unmapped


def architecture(tensors):
    """Builder arguments readable from a timm state dict (the head count is not among them)."""
    kernel = tensors["patch_embed.proj.weight"]
    depth = sum(1 for k in tensors if re.fullmatch(r"blocks\.\d+\.norm1\.weight", k))
    head = tensors.get("head.weight")
    return dict(
        patch_size=int(kernel.shape[-1]), hidden_size=int(kernel.shape[0]), num_layers=depth,
        mlp_dim=int(tensors["blocks.0.mlp.fc1.weight"].shape[0]) if depth else None, resnet=None,
        classifier="token" if "cls_token" in tensors else "gap",
        classes=None if head is None else int(head.shape[0]),
        tokens=int(tensors["pos_embed"].shape[1]) if "pos_embed" in tensors else None,
        pre_logits=False, approximate_gelu=False, layer_norm_epsilon=1e-6,
    )
