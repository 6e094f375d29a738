"""Training recipes by name (`keras-vit finetune DIR --recipe NAME`): each a table of the flags it sets, with the
paper and table its numbers come from (`PRESETS`, `SOURCES`), and the rule that merges one with a command
(`apply`): a preset fills the flags the user did not give; a flag the user gives wins, and the run says so in
one line.

The values are in the flags' own units (timm's train.py spelling). ``lr`` is the rate at the paper's batch
``LR_BATCH[name]``; a run's rate is ``lr x batch / LR_BATCH[name]`` (DeiT's linear scaling rule), computed from
the run's batch (`scaled_lr`); a preset without an entry there uses ``lr`` as it is. Every preset keeps
finetune's schedule: its batch from the folder's size, cosine decay, 5% of the updates of warm-up (a folder
run is some ten epochs, not the papers' 300; DeiT's 5 warm-up epochs of 300 are 1.7% of them, AugReg's 10k
warm-up steps of ~94k are 11%).
"""

# the flags a preset sets, in the order the override line names them
PRESET_FLAGS = ("opt", "lr", "weight_decay", "clip_grad", "smoothing", "bce_loss", "bce_target_thresh", "drop",
                "drop_path", "mixup", "cutmix", "mixup_switch_prob", "aa", "color_jitter", "reprob", "aug_repeats")
OPTIMIZERS = ("sgd", "adamw", "lamb")
SWITCH_PROB = 0.5  # --mixup-switch-prob's default, timm's

_OFF = {"smoothing": None, "bce_loss": False, "bce_target_thresh": None, "drop": None, "drop_path": None, "mixup": None,
        "cutmix": None, "mixup_switch_prob": None, "aa": None, "color_jitter": None, "reprob": None, "aug_repeats": None}

PRESETS = {
    # the paper's fine-tuning (Dosovitskiy et al. 2021, appendix B.1.1, Table 4): SGD momentum 0.9, no weight
    # decay, clipping at global norm 1, lr 0.01 (finetune's default of the 0.001-0.03 grid), no augmentation
    "paper": {**_OFF, "opt": "sgd", "lr": 0.01, "weight_decay": 0.0, "clip_grad": 1.0},
    # DeiT (Touvron et al. 2021, Table 9): AdamW lr 5e-4 x batch/512, weight decay 0.05, label smoothing 0.1,
    # stochastic depth 0.1, RandAugment rand-m9-mstd0.5-inc1, MixUp 0.8, CutMix 1.0 (switch 0.5), random
    # erasing 0.25, repeated augmentation 3, no gradient clipping, no dropout
    "deit": {**_OFF, "opt": "adamw", "lr": 5e-4, "weight_decay": 0.05, "clip_grad": None, "smoothing": 0.1,
             "drop_path": 0.1, "mixup": 0.8, "cutmix": 1.0, "mixup_switch_prob": 0.5, "aa": "rand-m9-mstd0.5-inc1",
             "reprob": 0.25, "aug_repeats": 3},
    # DeiT III (Touvron et al. 2022, Table 1, ImageNet-1k, ViT-B): LAMB lr 3e-3 at batch 2048, weight decay
    # 0.02, clipping 1.0, binary cross-entropy without label smoothing on targets binarized at 0 (its code's
    # `targets.gt(0.0)`), MixUp 0.8, CutMix 1.0, repeated augmentation 3, stochastic depth 0.1 (ViT-B's; S
    # 0.0/0.05, L 0.4), no random erasing, 3-Augment (grayscale / solarize / blur) with colour jitter 0.3. Its
    # simple random crop is not in keras-vit: the preset keeps finetune's Inception crop and flip.
    "deit3": {**_OFF, "opt": "lamb", "lr": 3e-3, "weight_decay": 0.02, "clip_grad": 1.0, "bce_loss": True,
              "bce_target_thresh": 0.0, "drop_path": 0.1, "mixup": 0.8, "cutmix": 1.0, "mixup_switch_prob": 0.5,
              "aa": "3a", "color_jitter": 0.3, "aug_repeats": 3},
    # AugReg (Steiner et al. 2021, "How to train your ViT"; big_vision configs/vit_i1k.py, the "medium2" setting
    # it picks for S/16 to L/16 on ImageNet-1k): Adam with decoupled weight decay, lr 1e-3 (batch 4096, not
    # scaled), weight decay 0.1 (big_vision's 1e-4 not multiplied by the lr, Keras' AdamW multiplies it),
    # clipping 1.0, RandAugment(2, 15) as rand-n2-m15-mmax15, MixUp alpha 0.5, no CutMix; dropout 0.1 and
    # stochastic depth 0.1 (the paper's "regularisation" axis, which helps ImageNet-1k's larger models)
    "augreg": {**_OFF, "opt": "adamw", "lr": 1e-3, "weight_decay": 0.1, "clip_grad": 1.0, "drop": 0.1,
               "drop_path": 0.1, "mixup": 0.5, "aa": "rand-n2-m15-mmax15"},
}
# the batch a preset's lr is given at, scaled linearly to the run's batch
LR_BATCH = {"deit": 512, "deit3": 2048}
SOURCES = {
    "paper": "Dosovitskiy et al. 2021, An Image is Worth 16x16 Words, appendix B.1.1 and Table 4",
    "deit": "Touvron et al. 2021, Training data-efficient image transformers, Table 9",
    "deit3": "Touvron et al. 2022, DeiT III: Revenge of the ViT, Table 1 (ImageNet-1k, ViT-B)",
    "augreg": "Steiner et al. 2021, How to train your ViT?, section 3 and big_vision configs/vit_i1k.py (medium2)",
}
DEFAULT = "paper"


def _spelled(flag):
    return "--" + flag.replace("_", "-")


def check_name(name):
    """`name` if it is a preset's, else a ValueError listing the presets.

    Args:
        name: the --recipe value.
    """
    if name not in PRESETS:
        raise ValueError(f"--recipe must be one of {', '.join(PRESETS)}; got {name!r}")
    return name


def apply(args):
    """Fills the flags of `args` (the parsed command) that are None from the preset `args.recipe` (None: the
    paper's), and returns the override line: the preset's name and each flag the user gave that replaces the
    preset's value, or None when the user overrode nothing.

    Args:
        args: the parsed flags (an argparse Namespace); changed in place.
    """
    args.recipe = check_name(args.recipe or DEFAULT)
    preset, overrides = PRESETS[args.recipe], []
    for flag in PRESET_FLAGS:
        given = getattr(args, flag, None)
        if given is None:
            if flag != "lr":  # the preset's rate stays None until the batch is known (`scaled_lr`)
                setattr(args, flag, preset[flag])
        elif given != preset[flag]:
            overrides.append(f"{_spelled(flag)} {given} (the preset's {preset[flag]})")
    if not overrides:
        return None
    return f"recipe {args.recipe}: your {', '.join(overrides)}"


def scaled_lr(args, batch_size):
    """The learning rate of the run `args` (after `apply`) at `batch_size`: a given --lr as it is, else the
    preset's ``lr``, times ``batch_size / LR_BATCH[preset]`` where the preset scales it.

    Args:
        args: the parsed flags, after `apply` (``args.lr`` None: the preset's).
        batch_size: the run's images per update.
    """
    if getattr(args, "lr", None) is not None:
        return args.lr
    name = check_name(getattr(args, "recipe", None) or DEFAULT)
    reference, lr = LR_BATCH.get(name), PRESETS[name]["lr"]
    return lr if reference is None else lr * batch_size / reference


def model_options(args, logits=False):
    """The builder's arguments the flags `args` set: the head's activation (a sigmoid with --bce-loss, else a
    softmax; none with `logits`), and where given the stochastic depth, dropout and patch size.

    Args:
        args: the parsed flags (those a Python caller leaves out read as unset).
        logits: a head without activation (the examples' runner, whose model outputs logits).
    """
    options = {"classifier_activation": None if logits else "sigmoid" if getattr(args, "bce_loss", None) else "softmax"}
    for flag, name in (("drop_path", "drop_path_rate"), ("drop", "dropout_rate"), ("patch_size", "patch_size")):
        if getattr(args, flag, None):
            options[name] = getattr(args, flag)
    return options


def compile_options(args, batch_size):
    """`compile_for_finetuning`'s arguments the flags `args` set: the learning rate at `batch_size`
    (`scaled_lr`), the optimizer, weight decay, clipping (0: off) and loss (with --bce-loss, its
    --bce-target-thresh).

    Args:
        args: the parsed flags, after `apply` (those a Python caller leaves out read as the paper's).
        batch_size: the run's images per update.
    """
    paper = PRESETS[DEFAULT]
    bce = bool(getattr(args, "bce_loss", False))
    return {"base_lr": scaled_lr(args, batch_size), "optimizer": getattr(args, "opt", None) or paper["opt"],
            "weight_decay": getattr(args, "weight_decay", None) or 0.0,
            "global_clipnorm": getattr(args, "clip_grad", paper["clip_grad"]) or None,
            "bce_loss": bce, "bce_target_threshold": getattr(args, "bce_target_thresh", None) if bce else None}


def mixup_of(args, classes):
    """The `keras_vit.data.mixup.MixUp` of the flags `args` (--mixup, --cutmix, --mixup-switch-prob,
    --smoothing folded into its targets, seeded by --seed) for `classes` classes, or None without MixUp and
    CutMix.

    Args:
        args: the parsed flags.
        classes: the number of classes.
    """
    if not (getattr(args, "mixup", None) or getattr(args, "cutmix", None)):
        return None
    from keras_vit.data.mixup import MixUp

    switch = getattr(args, "mixup_switch_prob", None)
    return MixUp(num_classes=classes, mixup_alpha=args.mixup or 0.0, cutmix_alpha=args.cutmix or 0.0,
                 switch_prob=SWITCH_PROB if switch is None else switch,
                 label_smoothing=getattr(args, "smoothing", None) or 0.0, seed=args.seed)


def table(name):
    """The preset `name` as Markdown table rows (flag | value), the unset flags left out.

    Args:
        name: the preset's name.
    """
    preset = PRESETS[check_name(name)]
    rows = [f"| `{_spelled(k)}` | {preset[k]} |" for k in PRESET_FLAGS if preset[k] is not None and preset[k] is not False]
    return "\n".join(["| flag | value |", "|---|---|", *rows])


__all__ = ["DEFAULT", "LR_BATCH", "OPTIMIZERS", "PRESETS", "PRESET_FLAGS", "SOURCES", "SWITCH_PROB", "apply",
           "check_name", "compile_options", "mixup_of", "model_options", "scaled_lr", "table"]
