"""The variants of the paper (Table 1, plus the hybrids of Table 6) as data: one frozen config a row.

This module imports nothing of the package, so every other piece (factories, weights, CLI,
benchmarks, examples) reads its architecture facts from here.
"""

import dataclasses
import numbers

IMAGENET1K_CLASSES = 1000
IMAGENET21K_CLASSES = 21843  # the official imagenet21k checkpoints' head

R26 = (2, 2, 2, 2)
R50 = (3, 4, 9)


@dataclasses.dataclass(frozen=True)
class VariantConfig:
    """One architecture of the paper.

    Attributes:
        name: the factory's name, e.g. "ViT_B16".
        checkpoint: the released file stem, e.g. "ViT-B_16".
        patch_size, hidden_size, mlp_dim, num_heads, num_layers: P, D, MLP width, heads, depth.
        resnet: None, or the hybrid stem's units per stage (width factor 1), e.g. (3, 4, 9).
    """

    name: str
    checkpoint: str
    patch_size: int
    hidden_size: int
    mlp_dim: int
    num_heads: int
    num_layers: int
    resnet: tuple = None

    def build_args(self):
        """The `VisionTransformer` arguments of this architecture."""
        resnet = None if self.resnet is None else {"num_layers": self.resnet, "width_factor": 1}
        return dict(patch_size=self.patch_size, hidden_size=self.hidden_size, mlp_dim=self.mlp_dim,
                    num_heads=self.num_heads, num_layers=self.num_layers, resnet=resnet)

    @property
    def stride(self):
        """Pixels per token along each axis: the patch size times the ResNet stem's stride."""
        return self.patch_size * resnet_stride(self.resnet)

    def describe(self):
        stem = f", ResNet stem {self.resnet}" if self.resnet else ""
        return f"D={self.hidden_size}, {self.num_heads} heads, {self.num_layers} layers, patch {self.patch_size}{stem}"


VARIANTS = {c.name: c for c in (
    VariantConfig("ViT_Ti16", "ViT-Ti_16", 16, 192, 768, 3, 12),
    VariantConfig("ViT_S16", "ViT-S_16", 16, 384, 1536, 6, 12),
    VariantConfig("ViT_S32", "ViT-S_32", 32, 384, 1536, 6, 12),
    VariantConfig("ViT_B8", "ViT-B_8", 8, 768, 3072, 12, 12),
    VariantConfig("ViT_B16", "ViT-B_16", 16, 768, 3072, 12, 12),
    VariantConfig("ViT_B32", "ViT-B_32", 32, 768, 3072, 12, 12),
    VariantConfig("ViT_L16", "ViT-L_16", 16, 1024, 4096, 16, 24),
    VariantConfig("ViT_L32", "ViT-L_32", 32, 1024, 4096, 16, 24),
    VariantConfig("ViT_H14", "ViT-H_14", 14, 1280, 5120, 16, 32),
    VariantConfig("R26_ViT_S32", "R26+ViT-S_32", 1, 384, 1536, 6, 12, R26),
    VariantConfig("R26_ViT_B32", "R26+ViT-B_32", 1, 768, 3072, 12, 12, R26),
    VariantConfig("R50_ViT_B16", "R50+ViT-B_16", 1, 768, 3072, 12, 12, R50),
    VariantConfig("R50_ViT_L32", "R50+ViT-L_32", 1, 1024, 4096, 16, 24, (3, 4, 6, 3)),
)}


def get_variant(name):
    """The config of a variant by its factory name; one error for every caller."""
    try:
        return VARIANTS[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown variant {name!r}; expected one of {', '.join(VARIANTS)}") from None


def resnet_stride(num_layers):
    """Total downsampling of a ResNet stem with `num_layers` units per stage (None: no stem, 1; (): the root
    alone): the root conv and max-pool give 4, each stage after the first halves again."""
    return 1 if num_layers is None else 4 * 2 ** max(len(num_layers) - 1, 0)


def find_variant(config):
    """The variant whose architecture equals `config` (builder arguments), or None."""
    resnet = config.get("resnet")
    stages = None if resnet is None else tuple(resnet["num_layers"] if isinstance(resnet, dict) else resnet)
    for variant in VARIANTS.values():
        args = variant.build_args()
        if variant.resnet == stages and all(args[k] == config.get(k) for k in
                                            ("patch_size", "hidden_size", "mlp_dim", "num_heads", "num_layers")):
            return variant.name
    return None


def none_or(value):
    """`None` for the command-line spellings of no weights ("none", ""), else the value."""
    return None if value is None or (isinstance(value, str) and value.lower() in ("", "none")) else value


def pair(value, what):
    """`value` (an int or an (h, w) pair of positive ints) as an (h, w) tuple; one error for all."""
    def whole(v):
        return isinstance(v, numbers.Integral) and not isinstance(v, bool) and v > 0

    try:
        out = (value, value) if whole(value) else tuple(value)
    except TypeError:
        out = ()
    if len(out) != 2 or not all(whole(v) for v in out):
        raise ValueError(f"{what} must be a positive int or an (h, w) pair of positive ints, got {value!r}")
    return tuple(int(v) for v in out)


# The builder's options for the ViTs of later papers (keras_vit.model.build_vit), at their defaults:
# the paper's model. A timm / Hugging Face file's architecture names its values; `family_name`
# says which published model a set of them is.
FAMILY_DEFAULTS = dict(distillation_token=False, num_register_tokens=0, prefix_position_embedding=True,
                       layer_scale=None, pre_norm=False, fc_norm=False, mlp_activation="gelu", rope=None,
                       mlp_norm=False, attention_norm=False, normalization="layer_norm", embed_norm=False,
                       relative_position_bias=False, relative_position_mlp=None, post_norm=False, encoder_norm=True,
                       qk_norm=False, parallel_blocks=False, parallel_branches=1, differential_attention=False)


def family_options(config):
    """The family options of `config` (builder arguments, or a file's architecture), defaults filled in."""
    return {k: v if config.get(k) is None else config[k] for k, v in FAMILY_DEFAULTS.items()}


def family_name(config):
    """Which ViT a configuration is, in words, e.g. "a DINOv2-style ViT (layer scale, 4 registers)"."""
    opts = family_options(config)
    traits = [t for t, on in (
        ("distillation token", opts["distillation_token"]),
        (f"{opts['num_register_tokens']} register tokens", opts["num_register_tokens"]),
        ("layer scale", opts["layer_scale"] is not None),
        ("position embeddings on the patches only", not opts["prefix_position_embedding"]),
        ("pre-norm", opts["pre_norm"]),
        ("fc_norm", opts["fc_norm"]),
        (opts["mlp_activation"], opts["mlp_activation"] != "gelu"),
        ("attention-pool head", config.get("classifier") == "map"),
        (f"{(opts['rope'] or {}).get('kind')} rotary position embedding", opts["rope"] is not None),
        ("a norm in the MLP", opts["mlp_norm"]), ("a norm in the attention", opts["attention_norm"]),
        ("RMSNorm", opts["normalization"] == "rms_norm"), ("a norm on the patch embeddings", opts["embed_norm"]),
        ("relative position bias", opts["relative_position_bias"]),
        ("relative position MLP", opts["relative_position_mlp"] is not None), ("post-norm blocks", opts["post_norm"]),
        ("no final norm", not opts["encoder_norm"]), ("q/k norms", opts["qk_norm"]),
        ("parallel blocks", opts["parallel_blocks"]),
        (f"{opts['parallel_branches']} branches a block", opts["parallel_branches"] != 1),
        ("differential attention", opts["differential_attention"]),
    ) if on]
    if not traits:
        return "a ViT of the paper's layout"
    kind = next((k for k, on in (
        ("SigLIP-style", config.get("classifier") == "map"), ("CLIP-style", opts["pre_norm"]),
        ("DINOv3-style", (opts["rope"] or {}).get("kind") == "dinov3"),
        ("EVA-style", (opts["rope"] or {}).get("kind") == "eva" or opts["mlp_norm"]),
        ("AIMv2-style", opts["normalization"] == "rms_norm"), ("BEiT-style", opts["relative_position_bias"]),
        ("DeiT", opts["distillation_token"]), ("DINOv2-style", opts["num_register_tokens"]),
        ("DeiT III-style", opts["layer_scale"] is not None and not opts["prefix_position_embedding"]),
        ("DINOv2-style", opts["layer_scale"] is not None)) if on), "")
    return f"a {kind + ' ' if kind else ''}ViT ({', '.join(traits)})"
