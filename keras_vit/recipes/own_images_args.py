"""`keras-vit finetune DIR`'s command line: its flags (`add_parser`), what `FLAGS` a run records in run.json,
and the checks of their values that need no folder or model (`check_args`)."""

import argparse
import math
import os

from keras_vit.data.folder import VERIFY_LEVELS
from keras_vit.recipes.distill import DEFAULT_ALPHA, DEFAULT_TAU, MODES, check_options, is_release
from keras_vit.recipes import own_shards
from keras_vit.recipes.folder_plan import DEFAULT_EPOCHS, DEVICE_BATCH, PAPER_BATCH
from keras_vit.recipes.presets import DEFAULT, OPTIMIZERS, PRESET_FLAGS, PRESETS, SWITCH_PROB

FLAGS = ("directory", "model", "weights", "image_size", "epochs", "steps", "batch_size", "device_batch_size", "lr",
         "lora", "layer_decay", "validation_split", "labels_csv", "seed", "strict", "verify", "pipeline", "naflex",
         "drop_path", "mixup", "cutmix", "mixup_switch_prob", "smoothing", "aa", "reprob", "remode", "recount",
         "aug_repeats", "color_jitter", "bce_target_thresh",
         "teacher", "distillation", "distillation_tau", "distillation_alpha",
         "recipe", "opt", "weight_decay", "clip_grad", "drop", "bce_loss", "patch_size", "validation_shards")


# --------------------------------------------------------------------------
# the command line
# --------------------------------------------------------------------------
def _positive(kind):
    def parse(text):
        try:
            value = kind(text)
        except ValueError:
            value = None
        if value is None or not value > 0 or not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"expected a positive {kind.__name__}, got {text!r}")
        return value

    return parse


def add_parser(sub):
    """Adds `finetune` to the `keras-vit` sub-command parsers `sub`; returns its parser (the caller sets
    its `func`)."""
    from keras_vit.export import FORMATS

    p = sub.add_parser(
        "finetune", help="fine-tune a ViT on a folder of your own images (DIR/<class name>/*.jpg)",
        description="Fine-tune a ViT on DIR: one subfolder of images per class (nested folders are read), or a "
        "labels.csv of 'relative path,class name' rows. The paper's recipe (SGD, warm-up and cosine decay, "
        "clipping), the best epoch on the held-out split kept; writes model.keras (with the class names), the "
        "curves, a confusion matrix, the worst mistakes, per-class accuracy and report.json into --out. A DIR "
        "ending in .tar names WebDataset-style tar shards instead (keras_vit.data.write_shards writes them), "
        "held out with --validation-shards.")
    p.add_argument("directory", metavar="DIR", help="the image folder, or tar shards: a shard, a glob or a brace "
                   "range, e.g. 'shards/train-{000000..000007}.tar' (quoted)")
    p.add_argument("--model", default=None, help="variant factory name, e.g. ViT_B16 or ViT_S16; default: what "
                   "a timm file, Hugging Face folder or keras-hub preset in --weights holds, else ViT_B16")
    p.add_argument("--weights", default=None, help="registry tag, 'none', a .npz / .weights.h5 file, a timm file, a "
                   "Hugging Face folder, a keras-hub preset folder or a .keras model; default: the variant's "
                   "ImageNet-21k release (what the paper fine-tunes)")
    p.add_argument("--image-size", type=_positive(int), default=224, help="training resolution (default 224); with "
                   "--naflex only the resolution the start model is built at (its position-embedding grid)")
    length = p.add_mutually_exclusive_group()
    length.add_argument("--epochs", type=_positive(int), default=None,
                        help=f"passes over the training images (default {DEFAULT_EPOCHS})")
    length.add_argument("--steps", type=_positive(int), default=None,
                        help="optimizer updates instead (rounded up to whole epochs)")
    p.add_argument("--batch-size", type=_positive(int), default=None,
                   help=f"images per update (default: {PAPER_BATCH}, or the largest power of two at most a "
                   "quarter of the training images, 8 at least)")
    p.add_argument("--device-batch-size", type=_positive(int), default=None,
                   help="images per step on the device; gradients of batch-size / device-batch-size steps are "
                   f"accumulated (default: the largest divisor of the batch at most {DEVICE_BATCH})")
    p.add_argument("--lr", type=_positive(float), default=None, help="base learning rate (default: the "
                   "--recipe's, the paper's 0.01; DeiT's and DeiT III's scaled by the batch)")
    p.add_argument("--lora", type=_positive(int), default=None, metavar="RANK",
                   help="train rank-RANK LoRA adapters (query, value) and the head only")
    p.add_argument("--layer-decay", type=_positive(float), default=None, metavar="DECAY",
                   help="layer-wise learning-rate decay in (0, 1], e.g. 0.75 (default: off)")
    p.add_argument("--validation-split", type=float, default=0.1,
                   help="fraction of each class held out to validate on (default 0.1)")
    p.add_argument("--labels-csv", default=None, help="a CSV of 'relative path,class name' rows (default: "
                   "DIR/labels.csv when it exists, else the class subfolders)")
    p.add_argument("--validation-shards", default=None, metavar="PATTERN",
                   help="with shards as DIR, the held-out shards to validate on (same classes; required with "
                   "shards, as timm's --val-split of a WebDataset)")
    p.add_argument("--seed", type=int, default=0, help="seed of the split, the data order and augmentation")
    p.add_argument("--strict", action="store_true", help="refuse a folder with unusable files (default: skip them)")
    p.add_argument("--verify", default=None, choices=VERIFY_LEVELS,
                   help="header: read each file's header before training (size, orientation), a file that fails to "
                   "decode later is skipped and named, its batch kept full; full: decode every file once before "
                   "training (both cached: the next start reads only new or changed files). Default: header")
    p.add_argument("--pipeline", default="auto", choices=("auto", "tf.data", "pydataset"),
                   help="the input pipeline (default: tf.data where TensorFlow is installed)")
    p.add_argument("--naflex", type=_positive(int), default=None, metavar="TOKENS",
                   help="train and save a NaFlex model: each image at its own aspect ratio, resized to fit TOKENS "
                   "patches (e.g. 256), fed as patches with their coordinates; model.keras then takes "
                   "{'patches', 'patch_coord', 'patch_valid'} (keras_vit.data.naflex_feed cuts them; keras-vit predict "
                   "too). Not with --export or --lora; --pipeline is not used (default: square images)")
    _add_recipe(p)
    _add_regularisation(p)
    _add_augmentation(p)
    _add_distillation(p)
    p.add_argument("--out", default=None, help="output folder (default: runs/finetune-<DIR's name>)")
    what = p.add_mutually_exclusive_group()
    what.add_argument("--overwrite", action="store_true", help="replace the run in --out")
    what.add_argument("--resume", action="store_true", help="continue the interrupted run in --out")
    p.add_argument("--export", default=None, choices=FORMATS, help="also write a served artefact into --out/export")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    # a flag a preset sets defaults, for --resume, to the paper's value (what a run without --recipe records)
    p.set_defaults(flag_defaults={k: PRESETS[DEFAULT][k] if k in PRESET_FLAGS and k != "lr" else p.get_default(k)
                                  for k in FLAGS} | {"recipe": DEFAULT})
    return p


def _number(text):
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None


def verify_level(args):
    """--verify of `args`, or its default: a header scan (every feed skips a file that fails to decode,
    naming it)."""
    return getattr(args, "verify", None) or VERIFY_LEVELS[0]


def _add_recipe(p):
    """--recipe and the optimizer, loss and model flags its presets set (keras_vit.recipes.presets)."""
    p.add_argument("--recipe", default=None, metavar="NAME",
                   help=f"a training recipe by name, one of {', '.join(PRESETS)}: fills every flag below you do not "
                   "give (a flag you give wins, said in one line); see docs/finetuning.md (default: paper)")
    p.add_argument("--opt", default=None, choices=OPTIMIZERS,
                   help="the optimizer (timm's --opt), weight decay decoupled (default: the recipe's; paper: sgd)")
    p.add_argument("--weight-decay", type=_number, default=None, metavar="WD",
                   help="decoupled weight decay, times the learning rate per update as Keras applies it, not on "
                   "biases and norms (timm's --weight-decay; default: the recipe's; paper: 0)")
    p.add_argument("--clip-grad", type=_number, default=None, metavar="NORM",
                   help="clip the gradient at this global norm, 0: off (timm's --clip-grad; default: the recipe's; "
                   "paper: 1)")
    p.add_argument("--drop", type=_number, default=None, metavar="RATE",
                   help="dropout in the blocks (timm's --drop; AugReg 0.1; default: off)")
    p.add_argument("--bce-loss", action=argparse.BooleanOptionalAction, default=None,
                   help="DeiT III's binary cross-entropy on the (mixed, smoothed) targets; the head is then a "
                   "sigmoid (timm's --bce-loss; default: the recipe's, cross-entropy but for deit3)")
    p.add_argument("--bce-target-thresh", type=_number, default=None, metavar="T",
                   help="with --bce-loss, targets above T count as 1, others 0 (timm's --bce-target-thresh; deit3: "
                   "0, DeiT III's binarized MixUp targets; default: soft targets)")
    p.add_argument("--patch-size", type=_positive(int), default=None, metavar="P",
                   help="with --weights none: build --model with P px patches, e.g. 4 on 32 px images "
                   "(default: the variant's)")


def _check_recipe(args):
    """The recipe's name, the flags it filled in (`presets.apply`, its override line printed), --patch-size
    and --bce-loss against --weights."""
    from keras_vit.recipes import presets

    said = presets.apply(args)
    for flag, value in (("--weight-decay", args.weight_decay), ("--clip-grad", args.clip_grad)):
        if value is not None and not value >= 0:
            raise ValueError(f"{flag} must be >= 0, got {value}")
    if args.drop is not None and not 0 <= args.drop < 1:
        raise ValueError(f"--drop must be in [0, 1), got {args.drop}")
    if args.bce_target_thresh is not None and not 0 <= args.bce_target_thresh < 1:
        raise ValueError(f"--bce-target-thresh must be in [0, 1), got {args.bce_target_thresh}")
    if args.patch_size is not None:
        if args.weights != "none":
            raise ValueError(f"--patch-size {args.patch_size} builds a model from scratch: it needs --weights none "
                             f"(a pretrained checkpoint's patch size is fixed), got --weights {args.weights}")
        if args.image_size % args.patch_size:
            raise ValueError(f"--patch-size {args.patch_size} must divide --image-size {args.image_size}")
    if args.weights is not None and args.weights.endswith(".keras"):
        for flag, value in (("--bce-loss", args.bce_loss), ("--drop", args.drop)):
            if value:
                raise ValueError(f"{flag}: --weights {args.weights} is a whole model, which keeps the head and "
                                 "dropout it was built with; build from a weights file or --weights none instead")
    if args.bce_loss and getattr(args, "distillation", None):
        raise ValueError(f"--bce-loss cannot be combined with --distillation {args.distillation}: DeiT's "
                         "distillation losses are cross-entropies of a softmax head")
    if args.layer_decay is not None and args.opt == "lamb":
        raise ValueError(f"--layer-decay {args.layer_decay} works with --opt sgd or adamw, got --opt lamb")
    return said


def _add_regularisation(p):
    """DeiT's and AugReg's regularisers, spelled as timm's train.py spells them (check_args checks ranges)."""
    p.add_argument("--drop-path", type=_number, default=None, metavar="RATE",
                   help="stochastic depth: each block's branches dropped per image, the rate rising linearly to "
                   "RATE over the blocks (timm's --drop-path; DeiT-B 0.1; default: off)")
    p.add_argument("--mixup", type=_number, default=None, metavar="ALPHA",
                   help="MixUp of each batch with itself reversed, lam ~ Beta(ALPHA, ALPHA) (timm's --mixup; DeiT 0.8)")
    p.add_argument("--cutmix", type=_number, default=None, metavar="ALPHA",
                   help="CutMix, lam ~ Beta(ALPHA, ALPHA) (timm's --cutmix; DeiT 1.0); with --mixup one or the "
                   "other per batch")
    p.add_argument("--mixup-switch-prob", type=_number, default=None, metavar="P",
                   help=f"with --mixup and --cutmix, the probability of CutMix (default {SWITCH_PROB})")
    p.add_argument("--smoothing", type=_number, default=None, metavar="S",
                   help="label smoothing in [0, 1) (timm's --smoothing; DeiT 0.1; default: none)")


def _check_regularisation(args):
    """The ranges of the regularisers' flags, and what they cannot be combined with."""
    if args.drop_path is not None and not 0 <= args.drop_path < 1:
        raise ValueError(f"--drop-path must be in [0, 1), got {args.drop_path}")
    for flag, value in (("--mixup", args.mixup), ("--cutmix", args.cutmix)):
        if value is not None and not value >= 0:
            raise ValueError(f"{flag} must be >= 0 (0: off), got {value}")
    if args.mixup_switch_prob is not None and not 0 <= args.mixup_switch_prob <= 1:
        raise ValueError(f"--mixup-switch-prob must be in [0, 1], got {args.mixup_switch_prob}")
    if args.smoothing is not None and not 0 <= args.smoothing < 1:
        raise ValueError(f"--smoothing must be in [0, 1), got {args.smoothing}")
    if getattr(args, "naflex", None) and (args.mixup or args.cutmix):
        raise ValueError(f"--naflex {args.naflex} cannot be combined with --mixup or --cutmix: MixUp and CutMix mix "
                         "whole images, a NaFlex batch holds patch sequences of different shapes")
    if args.drop_path and args.weights is not None and args.weights.endswith(".keras"):
        raise ValueError(f"--drop-path: --weights {args.weights} is a whole model, which keeps the rate it was built "
                         "with; build from a weights file (--model and --weights TAG/.npz/timm/Hugging Face) instead")


def _add_augmentation(p):
    """timm's per-image augmentations (keras_vit.data.augment), spelled as timm's train.py spells them; their
    ranges are checked by `Augment.from_flags` (check_args)."""
    p.add_argument("--aa", default=None, metavar="STRING",
                   help="RandAugment in timm's language on each training crop, e.g. rand-m9-mstd0.5-inc1 (DeiT's), "
                   "or 3a (DeiT III's 3-Augment) (timm's --aa; default: off)")
    p.add_argument("--reprob", type=_number, default=None, metavar="P",
                   help="random erasing: the probability in [0, 1] that a training image is erased (timm's --reprob; "
                   "DeiT 0.25; default: off)")
    p.add_argument("--remode", default=None, metavar="MODE",
                   help="the erased boxes' fill: pixel (noise per pixel), rand (per channel) or const (timm's "
                   "--remode; default: pixel)")
    p.add_argument("--recount", type=int, default=None, metavar="N",
                   help="up to N erased boxes an image (timm's --recount; default 1)")
    p.add_argument("--aug-repeats", type=int, default=None, metavar="K",
                   help="repeated augmentation: each image K times in a row of an epoch, augmented apart, the epoch "
                   "as long (timm's --aug-repeats; DeiT 3; default: 1, off)")
    p.add_argument("--color-jitter", type=_number, default=None, metavar="J",
                   help="with --aa 3a (DeiT III's 3-Augment), the colour jitter's strength in [0, 1] (timm's "
                   "--color-jitter; deit3: 0.3; default 0.4)")


def _check_augmentation(args):
    """The augmentations' ranges (by flag name), and their refusal with --naflex."""
    from keras_vit.data.augment import FLAG_NAMES, Augment, flag_values

    augment = Augment.from_flags(args)
    given = [f"{FLAG_NAMES[k]} {v}" for k, v in flag_values(args).items() if v is not None]
    if getattr(args, "naflex", None) and given:
        raise ValueError(f"--naflex {args.naflex} cannot be combined with {', '.join(given)}: the NaFlex feed flips "
                         "its images only (RandAugment, random erasing and repeats run on square images)")
    return augment


def _add_distillation(p):
    """DeiT's distillation (keras_vit.recipes.distill), spelled as DeiT's main.py spells it where it can."""
    p.add_argument("--teacher", default=None, metavar="PATH",
                   help="the teacher of --distillation: a .keras classifier of the folder's classes, a timm file, "
                   "Hugging Face folder or keras-hub preset, or a registry release VARIANT:TAG (each at its own "
                   "input size and normalisation)")
    p.add_argument("--distillation", default=None, choices=MODES,
                   help="DeiT's distillation from --teacher: the model is built with a distillation token, its second "
                   "head trained on the teacher's argmax (hard) or softened output (soft); model.keras averages the "
                   "two heads (default: off)")
    p.add_argument("--distillation-tau", type=_number, default=DEFAULT_TAU, metavar="TAU",
                   help=f"the soft distillation's temperature, > 0 (DeiT's --distillation-tau; default {DEFAULT_TAU})")
    p.add_argument("--distillation-alpha", type=_number, default=DEFAULT_ALPHA, metavar="ALPHA",
                   help="the distillation term's weight in [0, 1], the labels' 1 - ALPHA (DeiT's --distillation-alpha; "
                   f"default {DEFAULT_ALPHA})")


def _check_distillation(args):
    """--teacher and --distillation together, their values, and what they cannot be combined with."""
    teacher, mode = getattr(args, "teacher", None), getattr(args, "distillation", None)
    if teacher is None and mode is None:
        return
    if teacher is None or mode is None:
        raise ValueError("--teacher PATH and --distillation hard|soft go together: "
                         + (f"--teacher {teacher} without --distillation" if mode is None
                            else f"--distillation {mode} without --teacher"))
    check_options(mode, args.distillation_tau, args.distillation_alpha,
                  names=("--distillation", "--distillation-tau", "--distillation-alpha"))
    if not os.path.exists(teacher) and not is_release(teacher):
        raise ValueError(f"--teacher {teacher}: no such file or folder (nor a registry release VARIANT:TAG)")
    for flag, value in (("--naflex", getattr(args, "naflex", None)), ("--lora", args.lora)):
        if value:
            raise ValueError(f"--distillation cannot be combined with {flag} {value}: the teacher reads square "
                             "images and both of the student's heads are trained")
    if args.weights is None or not (args.weights == "none" or args.weights.endswith(".keras")
                                    or os.path.exists(args.weights)):
        raise ValueError(f"--distillation needs a student with a distillation token: --weights none (from scratch), "
                         f"a DeiT distilled timm file or a .keras model with one; the registry's releases have none "
                         f"(got --weights {args.weights})")


def check_args(args):
    """Refuses flag values and combinations that are wrong whatever the folder; fills --out's default and
    makes --directory absolute (the run's folder, however a resume spells it)."""
    if not 0 < args.validation_split < 1:
        raise ValueError(f"--validation-split must be in (0, 1): finetune keeps the best epoch on the held-out "
                         f"images; got {args.validation_split}")
    if args.layer_decay is not None and args.layer_decay > 1:
        raise ValueError(f"--layer-decay must be in (0, 1] (1 is no decay), got {args.layer_decay}")
    naflex = getattr(args, "naflex", None)
    for flag, value in (("--export", getattr(args, "export", None)), ("--lora", args.lora)):
        if naflex and value:
            raise ValueError(f"--naflex {naflex} cannot be combined with {flag}: a NaFlex run is not exported or "
                             "trained with LoRA by finetune (leave one of them out; keras-vit export --weights "
                             "OUT/model.keras exports its model)")
    said = _check_recipe(args)
    _check_regularisation(args)
    _check_augmentation(args)
    _check_distillation(args)
    own_shards.check_args(args)  # what shards cannot take, by flag name
    args.directory = os.path.abspath(args.directory)  # the run's folder, however a resume spells it
    if args.out is None:
        args.out = os.path.join("runs", f"finetune-{own_shards.run_name(args.directory)}")
    if args.weights is not None and args.weights.endswith(".keras") and args.model is not None:
        raise ValueError(f"--weights {args.weights} is a whole model; --model {args.model} is not used with it")
    if said:
        print(said, flush=True)


__all__ = ["FLAGS", "SWITCH_PROB", "add_parser", "check_args"]
