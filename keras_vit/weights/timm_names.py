"""What a timm architecture's name tells that its state dict does not: head counts, GELU forms, epsilons, position
rules (the tables, each checked against timm's model definitions by the tests), and how a model or file name is read
for them (`named_architecture`, `name_options`)."""

import os
import re

# Embedding widths of timm's ViTs -> their head counts (a state dict does not record them; the model
# definitions in timm/models/vision_transformer.py and deit.py do)
TIMM_HEADS = {64: 2, 96: 3, 192: 3, 256: 4, 320: 5, 384: 6, 512: 8, 640: 10, 768: 12, 832: 13, 896: 14, 1024: 16, 1152: 16,
              1280: 16, 1408: 16, 1536: 24, 1664: 16}
# timm's ViTs whose head count is not TIMM_HEADS' for their width (tests/test_families.py reads every architecture)
TIMM_NAMED_HEADS = {"vit_base_patch16_gap_224": 16}
# timm's SigLIP architectures (timm 1.0's model definitions, vision_transformer.py and naflexvit.py) -> whether
# their MLP computes the tanh GELU (act_layer='gelu_tanh': SigLIP 2's towers, and the SigLIP 1 weights timm
# loads into them) rather than the exact one, which a state dict does not record; tests/test_families.py
# checks it against timm's own models
_SIGLIP_TANH = ("vit_base_patch32_siglip_256", "vit_base_patch32_siglip_gap_256", "vit_large_patch16_siglip_512",
                "vit_large_patch16_siglip_gap_512", "naflexvit_base_patch16_siglip", "naflexvit_so400m_patch16_siglip",
                *(f"vit_{size}_siglip_{gap}{res}" for gap in ("", "gap_") for size, sizes in (
                    ("so400m_patch16", (256, 384, 512)), ("giantopt_patch16", (256, 384))) for res in sizes))
_SIGLIP_EXACT = (*(f"vit_{size}_siglip_{gap}{res}" for gap in ("", "gap_") for size, sizes in (
    ("base_patch16", (224, 256, 384, 512)), ("large_patch16", (256, 384))) for res in sizes),
    *(f"vit_so400m_patch14_siglip_{res}" for res in (224, 378, 384)),
    *(f"vit_so400m_patch14_siglip_gap_{res}" for res in (224, 378, 384, 448, 896)))
TIMM_SIGLIP_GELU = {**dict.fromkeys(_SIGLIP_EXACT, False), **dict.fromkeys(_SIGLIP_TANH, True)}
# timm's AIMv2 image towers (vision_transformer.py: RMSNorm of epsilon 1e-5 for every norm, one on the patch
# embeddings too, SwiGLU, no biases but the patch embedding's, heads of 128, CLIP's input statistics) -> their head
# count, which neither the state dict nor TIMM_HEADS tells; tests/test_aimv2.py checks it against timm's definitions
TIMM_AIMV2_HEADS = {f"aimv2_{size}_patch14_{res}": heads for size, heads in (
    ("large", 8), ("huge", 12), ("1b", 16), ("3b", 24)) for res in (224, 336, 448)}
# timm's other ViTs of RMSNorm (no bias) -> its epsilon, which a state dict does not record (their inputs in [-1, 1],
# timm's default statistics): the parallel-block `*_xp_*` and test_vit4; tests/test_families.py checks them against timm
TIMM_RMS_NORM = {**dict.fromkeys((f"vit_{size}_xp_224" for size in ("base_patch16", "large_patch14", "huge_patch14")),
                                 1e-6), "test_vit4": 1e-6}
# timm's ViTs of the classic layout whose LayerNorm epsilon is 1e-5 though they have no norm before the blocks (the
# CLIP towers, which have one, are read by it): BEiT 3, remapped by timm with norms in the attention and the MLP
TIMM_EPSILON_1E5 = ("beit3_base_patch16_224", "beit3_large_patch16_224", "beit3_giant_patch14_224",
                    "beit3_giant_patch14_336")
# timm's ViTs whose attention pool reads the prefix tokens too (pool_include_prefix=True), which a state dict does not
# record; tests/test_families.py checks every architecture's against timm's
TIMM_POOL_INCLUDE_PREFIX = ("test_vit3",)
# timm's ViTs of post-norm blocks (ResPostBlock: x + norm(branch(x))) that store the keys of its pre-norm ones: read
# by name (post_norm=True)
TIMM_POST_NORM = ("vit_base_patch16_rpn_224", "vit_relpos_small_patch16_rpn_224", "vit_relpos_medium_patch16_rpn_224",
                  "vit_relpos_base_patch16_rpn_224", "vit_relpos_base_patch32_plus_rpn_256")
# timm's RADIO NaFlex towers (C-RADIOv3, v4): their 128 x 128 position table resized bilinearly, without antialiasing,
# to a square of the larger grid side, then cropped; with its corners aligned in the v3 towers whose code still did so
# (timm's pos_embed_align_corners), at pixel centres in the others
TIMM_RADIO_CORNERS = {"naflexvit_base_patch16_radio_v3": True, "naflexvit_huge_patch16_radio_v3": True,
                      "naflexvit_large_patch16_radio_v3": False, "naflexvit_giant_patch16_radio_v3": False,
                      "naflexvit_so400m_patch16_radio_v4": False, "naflexvit_huge_patch16_radio_v4": False}
# the head counts of those SigLIP architectures by width, one a width (giantopt's 1536 has 16 where DINOv2-giant's
# 1536 has 24): what a state dict of SigLIP's layout takes in place of TIMM_HEADS
TIMM_SIGLIP_HEADS = {768: 12, 1024: 16, 1152: 16, 1536: 16}


def _name_parts(name):
    """The parts of a timm model or file name that may name its architecture: the file's name, and the
    `models--timm--NAME` folder of a hub cache path, lower-cased."""
    text = str(name)
    return [part.lower() for part in (os.path.basename(text), *re.findall(r"models--timm--([^/\\]+)", text))]


def named_architecture(name, table=TIMM_SIGLIP_GELU):
    """The architecture of `table` (TIMM_SIGLIP_GELU, TIMM_DINOV3_LAYOUT) that a timm model or file name names
    (the longest found, a word of its own in `_name_parts`), or None."""
    for part in _name_parts(name):
        found = [a for a in table if re.search(rf"(?<![a-z0-9]){a}(?![a-z0-9])", part)]
        if found:
            return max(found, key=len)
    return None


def _names_other_vit(name):
    """Whether `name` names a timm ViT that is no SigLIP (e.g. naflexvit_base_patch16_map, vit_medium_patch16_gap_256),
    whose MLP computes the exact GELU: the name tells it as well."""
    return any(re.search(r"(?<![a-z0-9])(?:naflex)?vit_[a-z0-9_]*patch\d+", part) and "siglip" not in part
               for part in _name_parts(name))


def name_options(name):
    """What a timm model or file name tells that its state dict does not: OpenAI CLIP's QuickGELU
    (timm's `*_quickgelu_*` models; its `*_clip_*` models without it compute the exact GELU), the
    aspect-preserving position embeddings of its NaFlex "par" models (`*_par_*`, `*_parfac_*`), and a
    SigLIP architecture's GELU (TIMM_SIGLIP_GELU; its NaFlex ones resize their position embeddings by
    torch's antialiased bilinear rule: pos_embed_interp_mode='bilinear')."""
    base = os.path.basename(str(name))
    options = {"mlp_activation": "quick_gelu"} if "quickgelu" in base else {}
    if re.search(r"_parf?a?c?_", base) and "naflex" in base:
        options["position_aspect_preserving"] = True
    radio = named_architecture(name, TIMM_RADIO_CORNERS)
    if radio is not None:
        options.update(position_aspect_preserving=True,
                       position_interpolation="bilinear" if TIMM_RADIO_CORNERS[radio] else "bilinear_half_pixel")
    arch = named_architecture(name)
    if arch is not None:
        options["approximate_gelu"] = TIMM_SIGLIP_GELU[arch]
        if arch.startswith("naflexvit_"):
            options["position_interpolation"] = "bilinear_antialias"
    return options


def _named_image_size(name, patch, tokens):
    """The resolution a SigLIP architecture's name ends in (e.g. 384), where its whole patches are the file's
    `tokens` square grid and it is no multiple of the patch (so400m/14 at 384 px: 27 x 27); else None."""
    arch = named_architecture(name)
    size = int(arch.rsplit("_", 1)[1]) if arch and arch.rsplit("_", 1)[1].isdigit() else None
    return (size, size) if size and tokens and size % patch and (size // patch) ** 2 == tokens else None


# timm's relative-position ViTs whose name does not end in their resolution -> its pretrained config's
TIMM_RELPOS_SIZES = {"test_vit_relpos": 160}


def _relpos_size(name):
    """(n, n) where `name` names a timm vit_relpos_* / vit_srelpos_* architecture ending in its resolution n, or one
    of TIMM_RELPOS_SIZES, else None."""
    for part in _name_parts(name):
        found = re.search(r"(?<![a-z0-9])vit_s?relpos_[a-z0-9_]*?_(\d{3})(?![0-9])", part)
        if found:
            return (int(found.group(1)),) * 2
    named = named_architecture(name, TIMM_RELPOS_SIZES)
    return None if named is None else (TIMM_RELPOS_SIZES[named],) * 2
