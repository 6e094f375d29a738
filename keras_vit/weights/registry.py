"""Registry of the officially released ViT checkpoints (.npz files).

Every file lives in the public Google Cloud Storage bucket ``vit_models`` and is
served at ``https://storage.googleapis.com/vit_models/<folder>/<name>.npz``.
No checksums are published for these files.

Four tags name where a file comes from:

``imagenet21k``
    Original release of the ViT paper (arXiv:2010.11929): pre-trained on
    ImageNet-21k at 224 px, 21,843 classes, with a ``pre_logits`` layer
    (representation size = hidden size).
``imagenet21k+imagenet2012``
    The same models fine-tuned on ImageNet-1k (1,000 classes, no pre-logits),
    at 384 px, plus two files fine-tuned at 224 px (``ViT-B_16-224``,
    ``ViT-L_16-224``).
``augreg-imagenet21k``
    "How to train your ViT?" (AugReg, arXiv:2106.10270) recommended checkpoint:
    ImageNet-21k, 300 epochs, 224 px, 21,843 classes, no pre-logits.
``augreg-imagenet21k+imagenet2012``
    That same AugReg checkpoint fine-tuned on ImageNet-1k (20k steps) at 384 px
    and, where the released name could be confirmed, at 224 px.

Sources of the facts below (looked up, not guessed):

[README]  google-research/vision_transformer README: folder list of the bucket,
          the 29.10.2020 note on ``ViT-B_16-224`` / ``ViT-L_16-224`` (expected
          81.2% / 82.7% top-1), and the table "We recommend using the following
          checkpoints, trained with AugReg" (pre-trained file, 384 px fine-tuned
          file, ImageNet accuracy) for L/16, B/16, S/16, R50+L/32, R26+S/32,
          Ti/16, B/32, S/32, R+Ti/16.
[PAPER]   ViT paper, Table 5 (ImageNet-21k pre-training, fine-tuned at 384 px).
[BV]      google-research/big_vision ``VANITY_NAMES`` ("howto-i21k-*",
          "Recommended models from arXiv:2106.10270"): agrees with [README] for
          every model in its table and adds B/8.
[TIMM]    timm 1.0.31 ``vision_transformer.py`` pretrained cfgs
          (``*.augreg_in21k_ft_in1k``), URLs of fine-tuned AugReg files.
[FILES]   Public code that downloads ``imagenet21k/`` and
          ``imagenet21k+imagenet2012/`` files by these exact names (e.g. a
          ``MODEL_URLS`` table listing the 8 fine-tuned files, TransUNet forks
          listing the 9 ``imagenet21k/`` files).
"""

from __future__ import annotations

import dataclasses
import posixpath

from keras_vit.configs import IMAGENET1K_CLASSES, IMAGENET21K_CLASSES, get_variant

BUCKET_URL = "https://storage.googleapis.com/vit_models"

TAG_I21K = "imagenet21k"
TAG_I21K_I1K = "imagenet21k+imagenet2012"
TAG_AUGREG_I21K = "augreg-imagenet21k"
TAG_AUGREG_I21K_I1K = "augreg-imagenet21k+imagenet2012"

TAGS = (TAG_I21K, TAG_I21K_I1K, TAG_AUGREG_I21K, TAG_AUGREG_I21K_I1K)

# The bucket folder that holds the files of each tag.
TAG_FOLDERS = {
    TAG_I21K: "imagenet21k",
    TAG_I21K_I1K: "imagenet21k+imagenet2012",
    TAG_AUGREG_I21K: "augreg",
    TAG_AUGREG_I21K_I1K: "augreg",
}



@dataclasses.dataclass(frozen=True)
class WeightsRecord:
    """One released checkpoint file.

    Attributes:
        variant: name of the keras_vit factory the file fits, e.g. ``"ViT_B16"``.
        tag: one of ``TAGS``.
        url: download address of the .npz file.
        image_size: resolution (px, square) the file was trained or fine-tuned at.
        classes: size of the file's head, 21843 (ImageNet-21k) or 1000.
        pre_logits: whether the file carries a ``pre_logits`` layer
            (representation size equal to the hidden size).
        accuracy: reported ImageNet-1k top-1 of a 1000-class file, with its
            source in parentheses; ``None`` when nothing was reported.
    """

    variant: str
    tag: str
    url: str
    image_size: int
    classes: int
    pre_logits: bool
    accuracy: str | None = None

    @property
    def folder(self) -> str:
        """Bucket folder of the file (``imagenet21k``, ..., ``augreg``)."""
        return posixpath.basename(posixpath.dirname(self.url))

    @property
    def released_name(self) -> str:
        """The file name as released in the bucket."""
        return posixpath.basename(self.url)

    @property
    def filename(self) -> str:
        """A local file name that is unique across the registry.

        AugReg names are unique already and are kept as released. The original
        release reuses names across folders (``imagenet21k/ViT-B_16.npz`` and
        ``imagenet21k+imagenet2012/ViT-B_16.npz``), so those become
        ``<model>--<tag>-<image_size>.npz``, e.g.
        ``ViT-B_16--imagenet21k+imagenet2012-384.npz``.
        """
        if self.folder == "augreg":
            return self.released_name
        stem = self.released_name[: -len(".npz")]
        suffix = f"-{self.image_size}"
        if stem.endswith(suffix):  # "ViT-B_16-224" -> "ViT-B_16"
            stem = stem[: -len(suffix)]
        return f"{stem}--{self.tag}-{self.image_size}.npz"


# --------------------------------------------------------------------------
# Record builders, one per release family.
# --------------------------------------------------------------------------


def _i21k(variant, model):
    # imagenet21k/: 224 px, 21,843 classes, pre_logits present [README].
    return WeightsRecord(variant, TAG_I21K, f"{BUCKET_URL}/imagenet21k/{model}.npz", 224, IMAGENET21K_CLASSES, True)


def _i21k_i1k(variant, name, image_size, accuracy):
    # imagenet21k+imagenet2012/: 1,000 classes, no pre_logits [README].
    return WeightsRecord(variant, TAG_I21K_I1K, f"{BUCKET_URL}/imagenet21k+imagenet2012/{name}.npz", image_size,
                         IMAGENET1K_CLASSES, False, accuracy)


def _augreg_i21k(variant, pretrain):
    # augreg/<pretrain>.npz: i21k 300 epochs at 224 px, no pre_logits [README].
    return WeightsRecord(variant, TAG_AUGREG_I21K, f"{BUCKET_URL}/augreg/{pretrain}.npz", 224, IMAGENET21K_CLASSES,
                         False)


def _augreg_i1k(variant, pretrain, lr, image_size, accuracy):
    # augreg/<pretrain>--imagenet2012-steps_20k-lr_<lr>-res_<size>.npz
    name = f"{pretrain}--imagenet2012-steps_20k-lr_{lr}-res_{image_size}"
    return WeightsRecord(variant, TAG_AUGREG_I21K_I1K, f"{BUCKET_URL}/augreg/{name}.npz", image_size,
                         IMAGENET1K_CLASSES, False, accuracy)


_T5 = "ViT paper, Table 5"
_README_224 = "vision_transformer README, 29.10.2020 update, 'expected'"
_README_AUGREG = "vision_transformer README, AugReg recommended-checkpoints table"

# Recommended AugReg pre-training runs ([README] table; B/8 from [BV]).
_AUGREG_TI16 = "Ti_16-i21k-300ep-lr_0.001-aug_none-wd_0.03-do_0.0-sd_0.0"
_AUGREG_S16 = "S_16-i21k-300ep-lr_0.001-aug_light1-wd_0.03-do_0.0-sd_0.0"
_AUGREG_S32 = "S_32-i21k-300ep-lr_0.001-aug_none-wd_0.1-do_0.0-sd_0.0"
_AUGREG_B8 = "B_8-i21k-300ep-lr_0.001-aug_medium2-wd_0.1-do_0.0-sd_0.0"
_AUGREG_B16 = "B_16-i21k-300ep-lr_0.001-aug_medium1-wd_0.1-do_0.0-sd_0.0"
_AUGREG_B32 = "B_32-i21k-300ep-lr_0.001-aug_light1-wd_0.1-do_0.0-sd_0.0"
_AUGREG_L16 = "L_16-i21k-300ep-lr_0.001-aug_strong1-wd_0.1-do_0.0-sd_0.0"
_AUGREG_R26_S32 = "R26_S_32-i21k-300ep-lr_0.001-aug_light1-wd_0.1-do_0.0-sd_0.0"

# Order matters: get_weights() falls back to the first record of a
# (variant, tag) pair, so 384 px is listed before 224 px for fine-tuned files.
_RECORDS = (
    # ---- ViT-Ti/16: AugReg only ----
    _augreg_i21k("ViT_Ti16", _AUGREG_TI16),  # [README][BV][TIMM]
    _augreg_i1k("ViT_Ti16", _AUGREG_TI16, "0.03", 384, f"78.22% ({_README_AUGREG})"),  # [README][TIMM]
    _augreg_i1k("ViT_Ti16", _AUGREG_TI16, "0.03", 224, None),  # [TIMM]
    # ---- ViT-S/16: AugReg only ----
    _augreg_i21k("ViT_S16", _AUGREG_S16),  # [README][BV][TIMM]
    _augreg_i1k("ViT_S16", _AUGREG_S16, "0.03", 384, f"83.73% ({_README_AUGREG})"),  # [README][TIMM]
    _augreg_i1k("ViT_S16", _AUGREG_S16, "0.03", 224, None),  # [TIMM]
    # ---- ViT-S/32: AugReg only. A 224 px fine-tune of this run could not be
    # confirmed (timm's 224 px S/32 file comes from another run, aug_light1-wd_0.03).
    _augreg_i21k("ViT_S32", _AUGREG_S32),  # [README][BV]
    _augreg_i1k("ViT_S32", _AUGREG_S32, "0.01", 384, f"79.58% ({_README_AUGREG})"),  # [README]
    # ---- ViT-B/8 ----
    _i21k("ViT_B8", "ViT-B_8"),  # [FILES]
    _i21k_i1k("ViT_B8", "ViT-B_8", 384, None),  # [FILES]; no accuracy published
    # B/8 is not in the [README] AugReg table; [BV] names aug_medium2 as the
    # recommended run (timm uses aug_medium1 instead). Its 224 px fine-tune is
    # named in the GTP-ViT README (WACV 2024); no 384 px B/8 AugReg file is known.
    _augreg_i21k("ViT_B8", _AUGREG_B8),  # [BV]
    _augreg_i1k("ViT_B8", _AUGREG_B8, "0.01", 224, None),  # GTP-ViT README
    # ---- ViT-B/16 ----
    _i21k("ViT_B16", "ViT-B_16"),  # [README]
    _i21k_i1k("ViT_B16", "ViT-B_16", 384, f"83.97% ({_T5})"),  # [README][PAPER]
    _i21k_i1k("ViT_B16", "ViT-B_16-224", 224, f"81.2% ({_README_224})"),  # [README]
    _augreg_i21k("ViT_B16", _AUGREG_B16),  # [README][BV][TIMM]
    _augreg_i1k("ViT_B16", _AUGREG_B16, "0.03", 384, f"85.49% ({_README_AUGREG})"),  # [README]
    _augreg_i1k("ViT_B16", _AUGREG_B16, "0.01", 224, None),  # [TIMM]
    # ---- ViT-B/32 ----
    _i21k("ViT_B32", "ViT-B_32"),  # [README]
    _i21k_i1k("ViT_B32", "ViT-B_32", 384, f"81.28% ({_T5})"),  # [README][PAPER]
    # A 224 px fine-tune of this AugReg run could not be confirmed (timm's 224 px
    # B/32 file comes from another run, aug_medium1-wd_0.03).
    _augreg_i21k("ViT_B32", _AUGREG_B32),  # [README][BV]
    _augreg_i1k("ViT_B32", _AUGREG_B32, "0.01", 384, f"83.59% ({_README_AUGREG})"),  # [README]
    # ---- ViT-L/16 ----
    _i21k("ViT_L16", "ViT-L_16"),  # [README]
    _i21k_i1k("ViT_L16", "ViT-L_16", 384, f"85.15% ({_T5})"),  # [README][PAPER]
    _i21k_i1k("ViT_L16", "ViT-L_16-224", 224, f"82.7% ({_README_224})"),  # [README]
    _augreg_i21k("ViT_L16", _AUGREG_L16),  # [README][BV]
    _augreg_i1k("ViT_L16", _AUGREG_L16, "0.01", 384, f"85.59% ({_README_AUGREG})"),  # [README]
    # 224 px name: timm-style cfg in lpylpy0514/workspace_tracking lib/models/vt/orivit.py
    _augreg_i1k("ViT_L16", _AUGREG_L16, "0.01", 224, None),
    # ---- ViT-L/32 ----
    _i21k("ViT_L32", "ViT-L_32"),  # [README]
    _i21k_i1k("ViT_L32", "ViT-L_32", 384, f"80.99% ({_T5})"),  # [README][PAPER]
    # ---- ViT-H/14 (no fine-tuned file in this registry) ----
    _i21k("ViT_H14", "ViT-H_14"),  # [README]
    # ---- R26+ViT-S/32: AugReg only ----
    _augreg_i21k("R26_ViT_S32", _AUGREG_R26_S32),  # [README]
    _augreg_i1k("R26_ViT_S32", _AUGREG_R26_S32, "0.01", 384, f"83.85% ({_README_AUGREG})"),  # [README]
    # 224 px name: loaded from a local download in public code (code search);
    # timm's 224 px R26+S/32 file comes from another run (aug_light0).
    _augreg_i1k("R26_ViT_S32", _AUGREG_R26_S32, "0.01", 224, None),
    # ---- R26+ViT-B/32 ----
    _i21k("R26_ViT_B32", "R26+ViT-B_32"),  # [FILES]
    # ---- R50+ViT-B/16 ----
    _i21k("R50_ViT_B16", "R50+ViT-B_16"),  # [FILES]
    _i21k_i1k("R50_ViT_B16", "R50+ViT-B_16", 384, None),  # [FILES]; not in Table 5
    # ---- R50+ViT-L/32 ----
    _i21k("R50_ViT_L32", "R50+ViT-L_32"),  # [FILES]
)


# The variants with at least one released file, in registry order.
VARIANTS_WITH_WEIGHTS = tuple(dict.fromkeys(r.variant for r in _RECORDS))


def _check_variant(variant):
    get_variant(variant)
    if variant not in VARIANTS_WITH_WEIGHTS:
        raise ValueError(f"no released checkpoint is registered for {variant!r}; "
                         f"variants with weights: {', '.join(VARIANTS_WITH_WEIGHTS)}")


def list_weights(variant: str | None = None) -> list[WeightsRecord]:
    """Registered checkpoints, in registry order, optionally of one variant.

    Raises:
        ValueError: ``variant`` has no registered checkpoint.
    """
    if variant is None:
        return list(_RECORDS)
    _check_variant(variant)
    return [r for r in _RECORDS if r.variant == variant]


def default_tag(variant: str, preferred) -> str:
    """The first tag of ``preferred`` that ``variant`` was released under, else its first release
    (every variant has one): a default that exists for every variant."""
    tags = [r.tag for r in list_weights(variant)]
    return next((t for t in preferred if t in tags), tags[0])


def get_weights(variant: str, tag: str, image_size: int | None = None) -> WeightsRecord:
    """The checkpoint of ``variant`` released under ``tag``.

    Among the files of that variant and tag, returns the one trained at
    ``image_size`` if there is one, else the default file (the first listed:
    384 px for the ImageNet-1k fine-tuned tags, 224 px for the ImageNet-21k
    ones). The caller resizes position embeddings for any other resolution.

    Raises:
        ValueError: unknown variant, or a tag with no file for that variant;
            the message lists the valid choices.
    """
    _check_variant(variant)
    candidates = [r for r in _RECORDS if r.variant == variant and r.tag == tag]
    if not candidates:
        valid = [t for t in TAGS if any(r.variant == variant and r.tag == t for r in _RECORDS)]
        known = "" if tag in TAGS else f" (known tags: {', '.join(TAGS)})"
        raise ValueError(
            f"Unknown tag {tag!r} for variant {variant!r}{known}. "
            f"Valid tags for {variant}: {', '.join(valid)}."
        )
    if image_size is not None:
        for record in candidates:
            if record.image_size == image_size:
                return record
    return candidates[0]


def format_table(variant: str | None = None) -> str:
    """Plain-text table of the registered checkpoints (for ``keras-vit list``)."""
    records = list_weights(variant)
    header = ("variant", "tag", "px", "classes", "pre-logits", "ImageNet top-1", "file")
    rows = [
        (
            r.variant,
            r.tag,
            str(r.image_size),
            str(r.classes),
            "yes" if r.pre_logits else "no",
            r.accuracy.split(" (", 1)[0] if r.accuracy else "-",
            r.released_name if r.folder == "augreg" else f"{r.folder}/{r.released_name}",
        )
        for r in records
    ]
    widths = [max(len(row[i]) for row in (header, *rows)) for i in range(len(header))]

    def line(cells):
        return "  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip()

    out = [line(header), line(["-" * w for w in widths])]
    out.extend(line(row) for row in rows)
    out.append("")
    out.append(f"{len(records)} checkpoints, served from {BUCKET_URL}/<folder>/<file>")
    return "\n".join(out)


__all__ = [
    "default_tag",
    "BUCKET_URL",
    "TAGS",
    "TAG_FOLDERS",
    "VARIANTS_WITH_WEIGHTS",
    "WeightsRecord",
    "format_table",
    "get_weights",
    "list_weights",
]
