"""`keras-vit finetune DIR`: a folder of your own photographs to a fine-tuned, served model, in one command.

    keras-vit finetune photos/ --weights dinov2-folder/ --out runs/mine     # photos/<class name>/*.jpg

1. the folder through `keras_vit.data.from_directory` (split written to `split.json`, unusable files
   skipped and listed, or refused with `--strict`), as uint8 images the model scales itself;
2. a ViT from `--model` / `--weights` (a registry tag, a timm or Hugging Face file or folder, a keras-hub
   preset, a `.keras` model) with a new zero-initialised head of the folder's classes; `--lora RANK`
   trains adapters and the head only, `--layer-decay` lowers the rate of the early blocks;
3. the paper's recipe (`compile_for_finetuning`: SGD with momentum 0.9, warm-up then cosine decay,
   clipping at global norm 1) with batch and steps from the folder's size (`schedule`);
4. `model.fit` with a progress bar, the validation split evaluated after every epoch, the best epoch's
   weights kept; a backup at every epoch end, so `--resume` continues an interrupted run to the same
   weights as an uninterrupted one;
5. into `--out`: `model.keras` (the best epoch, class names inside, takes uint8 images, outputs
   probabilities), `curves.png`, `confusion_matrix.png`, `mistakes.png`, `per_class.csv`, `split.json`,
   `run.json` (the flags), with `--export FORMAT` a served artefact in `export/` and `class_names.txt`
   beside it, and `report.json` last (its presence marks a finished run).

With `--naflex TOKENS` the model is trained and saved as a NaFlex model (`keras_vit.naflex.naflex` of
the model of step 2): each image keeps its aspect ratio and is resized to fit TOKENS patches
(`keras_vit.naflex_feed.folder_batches`, a PyDataset on every backend, flips in training), and
model.keras takes {"patches", "patch_coord", "patch_valid"} batches of uint8 patches and records TOKENS
(`model.naflex_tokens`, what `keras-vit predict` cuts images to). The schedule is the square run's (`plan`:
both feeds stream endlessly, so an epoch is a whole number of updates and `--resume` is exact), and so are
the figures and the report (mistakes.png draws the photographs as they are); `--export` and `--lora` are
refused with it, `--pipeline` is not used and `--image-size` is only the resolution the start model is
built at (its position-embedding grid), not the images'.
"""

import argparse
import json
import math
import os
import shutil
import time
import typing

from keras_vit.configs import get_variant, none_or
from keras_vit.fileio import atomic_write, write_json

MARKER, REPORT, BACKUP, SPLIT = "run.json", "report.json", "backup", "split.json"
# the paper's fine-tuning batch (Table 4), the ceiling of the size rule
PAPER_BATCH = 512
DEFAULT_EPOCHS = 10
DEVICE_BATCH = 32  # the most images a device step holds by default
WARMUP_FRACTION = 0.05  # the paper's 500 warm-up updates of 10,000 (CIFAR)
FLAGS = ("directory", "model", "weights", "image_size", "epochs", "steps", "batch_size", "device_batch_size", "lr",
         "lora", "layer_decay", "validation_split", "labels_csv", "seed", "strict", "pipeline", "naflex")


class Plan(typing.NamedTuple):
    """The run's schedule (see `plan`): `steps_per_epoch` device steps of `device_batch_size` images make
    `updates_per_epoch` optimizer updates of `batch_size` images, `accumulation` steps an update."""

    batch_size: int
    device_batch_size: int
    accumulation: int
    updates_per_epoch: int
    epochs: int
    warmup: int

    @property
    def steps_per_epoch(self):
        return self.updates_per_epoch * self.accumulation


def plan(num_train, batch_size=None, device_batch_size=None, epochs=None, steps=None):
    """The `Plan` of a run on `num_train` training images, square or NaFlex alike: `schedule`'s batch,
    epochs and warm-up, and the device batch (`device_batch_size`, default the largest divisor of the
    batch at most `DEVICE_BATCH`). Both feeds stream endlessly, so an epoch is a whole number of updates
    whatever the folder's size and every backup falls on an update boundary.

    Raises:
        ValueError: a device batch larger than the batch or not dividing it (naming one that does).
    """
    from keras_vit.recipes.compile import gradient_accumulation_steps

    batch, per_epoch, epochs, warmup = schedule(num_train, batch_size, epochs, steps)
    device = device_batch_size or max(d for d in range(1, min(batch, DEVICE_BATCH) + 1) if batch % d == 0)
    return Plan(batch, device, gradient_accumulation_steps(batch, device), per_epoch, epochs, warmup)


def schedule(num_train, batch_size=None, epochs=None, steps=None):
    """(batch, updates per epoch, epochs, warm-up updates) for `num_train` training images.

    The rule: the batch is the paper's 512, or the largest power of two at most a quarter of the training
    images when that is smaller (8 at least); an epoch is one pass, ceil(num_train / batch) updates;
    10 epochs unless `epochs` or `steps` says otherwise (`steps` is rounded up to whole epochs of at most
    one pass each); the first 5% of the updates warm up.
    """
    if batch_size is None:
        batch_size = max(8, min(PAPER_BATCH, 2 ** int(math.log2(max(1, num_train // 4)))))
    per_epoch = -(-num_train // batch_size)
    if steps is not None:
        per_epoch = min(per_epoch, steps)
        epochs = -(-steps // per_epoch)
    epochs = epochs or DEFAULT_EPOCHS
    return batch_size, per_epoch, epochs, math.ceil(WARMUP_FRACTION * per_epoch * epochs)


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
    """Adds `finetune` to the `keras-vit` sub-command parsers `sub`."""
    from keras_vit.export import FORMATS

    p = sub.add_parser(
        "finetune", help="fine-tune a ViT on a folder of your own images (DIR/<class name>/*.jpg)",
        description="Fine-tune a ViT on DIR: one subfolder of images per class (nested folders are read), or a "
        "labels.csv of 'relative path,class name' rows. The paper's recipe (SGD, warm-up and cosine decay, "
        "clipping), the best epoch on the held-out split kept; writes model.keras (with the class names), the "
        "curves, a confusion matrix, the worst mistakes, per-class accuracy and report.json into --out.")
    p.add_argument("directory", metavar="DIR", help="the image folder")
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
    p.add_argument("--lr", type=_positive(float), default=0.01, help="base learning rate (default 0.01)")
    p.add_argument("--lora", type=_positive(int), default=None, metavar="RANK",
                   help="train rank-RANK LoRA adapters (query, value) and the head only")
    p.add_argument("--layer-decay", type=_positive(float), default=None, metavar="DECAY",
                   help="layer-wise learning-rate decay in (0, 1], e.g. 0.75 (default: off)")
    p.add_argument("--validation-split", type=float, default=0.1,
                   help="fraction of each class held out to validate on (default 0.1)")
    p.add_argument("--labels-csv", default=None, help="a CSV of 'relative path,class name' rows (default: "
                   "DIR/labels.csv when it exists, else the class subfolders)")
    p.add_argument("--seed", type=int, default=0, help="seed of the split, the data order and augmentation")
    p.add_argument("--strict", action="store_true", help="refuse a folder with unusable files (default: skip them)")
    p.add_argument("--pipeline", default="auto", choices=("auto", "tf.data", "pydataset"),
                   help="the input pipeline (default: tf.data where TensorFlow is installed)")
    p.add_argument("--naflex", type=_positive(int), default=None, metavar="TOKENS",
                   help="train and save a NaFlex model: each image at its own aspect ratio, resized to fit TOKENS "
                   "patches (e.g. 256), fed as patches with their coordinates; model.keras then takes "
                   "{'patches', 'patch_coord', 'patch_valid'} (keras_vit.naflex_feed cuts them; keras-vit predict "
                   "too). Not with --export or --lora; --pipeline is not used (default: square images)")
    p.add_argument("--out", default=None, help="output folder (default: runs/finetune-<DIR's name>)")
    what = p.add_mutually_exclusive_group()
    what.add_argument("--overwrite", action="store_true", help="replace the run in --out")
    what.add_argument("--resume", action="store_true", help="continue the interrupted run in --out")
    p.add_argument("--export", default=None, choices=FORMATS, help="also write a served artefact into --out/export")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.set_defaults(func=run, flag_defaults={k: p.get_default(k) for k in FLAGS})
    return p


def _check_args(args):
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
    args.directory = os.path.abspath(args.directory)  # the run's folder, however a resume spells it
    if args.out is None:
        args.out = os.path.join("runs", f"finetune-{os.path.basename(os.path.normpath(args.directory)) or 'images'}")
    if args.weights is not None and args.weights.endswith(".keras") and args.model is not None:
        raise ValueError(f"--weights {args.weights} is a whole model; --model {args.model} is not used with it")


def _prepare_out(args, flags):
    """True when resuming; refuses a folder that holds something else. Writes nothing."""
    out = args.out
    if os.path.exists(out) and not os.path.isdir(out):
        raise ValueError(f"--out {out!r} exists and is not a folder")
    if not os.path.isdir(out) or not os.listdir(out):
        if args.resume:
            raise ValueError(f"--resume: {out!r} holds no run to resume")
        return False
    marker = os.path.join(out, MARKER)
    if not os.path.isfile(marker):
        raise FileExistsError(f"--out {out!r} exists, is not empty and holds no keras-vit finetune run ({MARKER}); "
                              "choose another folder (nothing was written)")
    if args.overwrite:
        return False
    if not args.resume:
        raise FileExistsError(f"--out {out!r} holds a run; pass --resume to continue it, --overwrite to replace "
                              "it, or choose another folder (nothing was written)")
    if os.path.exists(os.path.join(out, REPORT)):
        raise ValueError(f"--resume: the run in {out!r} has finished ({REPORT} is there); --overwrite replaces it")
    with open(marker) as f:
        previous = json.load(f)
    defaults = getattr(args, "flag_defaults", {})
    for key, value in list(flags.items()):  # a flag left out continues as the run had it
        if key in defaults and value == defaults[key] and key in previous:
            flags[key] = previous[key]
            setattr(args, key, previous[key])
    changed = {k: (previous.get(k), v) for k, v in flags.items() if previous.get(k) != v}
    if changed:
        raise ValueError(f"--resume: the run in {out!r} had other flags (was -> now: {changed}); leave them out "
                         "or repeat the run's, or pass --overwrite to start over")
    return True


# --------------------------------------------------------------------------
# the model
# --------------------------------------------------------------------------
def _with_new_head(model, classes):
    """A `.keras` model with a new zero-initialised softmax head of `classes` (a backbone gets one)."""
    import keras

    from keras_vit.vit_model import ViTModel

    names = {layer.name for layer in model.layers}
    if "head" in names and "head_dist" not in names:
        features = model.get_layer("head").input
    elif "features" in names:
        features = model.get_layer("features").output
    else:
        raise ValueError(f"model {model.name!r} has neither a classifier head nor a backbone's 'features' output; "
                         "expected a keras-vit model")
    if len(features.shape) != 2:
        raise ValueError(f"model {model.name!r} outputs {tuple(features.shape)} features, not a pooled "
                         "representation: save it with a pooling (include_top=False, pooling='representation')")
    x = keras.layers.Dense(classes, kernel_initializer="zeros", name="head", dtype="float32")(features)
    x = keras.layers.Activation("softmax", name="predictions", dtype="float32")(x)
    return ViTModel(model.inputs, x, name=model.name)


def build_model(args, classes):
    """The model to fine-tune: `args.weights` with a new head of `classes`, taking uint8 images (scaled
    inside by the weights' own normalisation) and giving probabilities."""
    import keras_vit
    from keras_vit.recipes.finetune_args import PRETRAINED_TAGS
    from keras_vit.weights.foreign import is_foreign
    from keras_vit.weights.registry import default_tag

    common = dict(classes=len(classes), classifier_activation="softmax", input_dtype="uint8")
    weights = args.weights
    if weights is not None and weights.endswith(".keras"):
        from keras_vit.weights.keras_files import load_keras_model

        model = load_keras_model(weights)
        if model.inputs[0].dtype != "uint8" or tuple(model.input_shape[1:3]) not in ((args.image_size,) * 2,
                                                                                      (None, None)):
            raise ValueError(f"--weights {weights}: the model takes {model.inputs[0].dtype} images of "
                             f"{model.input_shape[1:3]}; finetune continues a model that takes uint8 images of "
                             f"--image-size {args.image_size} (what finetune writes), or builds one from weights "
                             "files (.npz, timm, Hugging Face, keras-hub)")
        kept = getattr(model, "class_names", None)
        if kept == tuple(classes) or (kept is None and model.output_shape[-1:] == (len(classes),)):
            return model  # its head is of these classes: trained further
        return _with_new_head(model, len(classes))
    if weights is not None and is_foreign(weights) and os.path.exists(weights):
        from keras_vit.convert import build_from

        return build_from(weights, args.model and get_variant(args.model).name, image_size=args.image_size,
                          **common)  # scaled inside by the file's own normalisation
    name = get_variant(args.model or "ViT_B16").name
    if weights is None:
        weights = default_tag(name, PRETRAINED_TAGS)
    return getattr(keras_vit, name)(weights=none_or(weights), image_size=args.image_size, **common)


# --------------------------------------------------------------------------
# the run
# --------------------------------------------------------------------------
def _callbacks(out, history, epochs, start_epoch):
    """(history keeper, best-epoch keeper, time-left printer) for `fit`."""
    import keras

    history_path = os.path.join(out, BACKUP, "history.json")
    best_path = os.path.join(out, BACKUP, "best.weights.h5")

    class KeepHistory(keras.callbacks.Callback):  # before the backup: the history never lags the weights
        def on_epoch_end(self, epoch, logs=None):
            for key, value in (logs or {}).items():
                history.setdefault(key, []).append(float(value))
            write_json(history_path, history)

    class KeepBest(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            scores = history.get("val_accuracy", [])
            if scores and scores[-1] >= max(scores):  # ties: the later epoch
                with atomic_write(best_path) as tmp:
                    self.model.save_weights(tmp, overwrite=True)

    class TimeLeft(keras.callbacks.Callback):  # said when Keras' progress bar has ended its epoch's line
        def on_train_begin(self, logs=None):
            self.start, self.line = time.perf_counter(), None

        def on_epoch_end(self, epoch, logs=None):
            done = epoch + 1 - start_epoch
            spent = time.perf_counter() - self.start
            left = spent / done * (epochs - epoch - 1)
            scores = history.get("val_accuracy", [0])
            self.line = (f"epoch {epoch + 1}/{epochs}: validation accuracy {scores[-1]:.4f} (best "
                         f"{max(scores):.4f}), {_minutes(spent)} spent, about {_minutes(left)} left")

        def on_epoch_begin(self, epoch, logs=None):
            if self.line:
                print(self.line, flush=True)

        on_train_end = on_epoch_begin

    return KeepHistory(), KeepBest(), TimeLeft(), best_path


def _served(model, class_names):
    """A copy of the trained `model` without its optimizer (whose state would double model.keras: Keras
    writes a compiled model's optimizer variables into it), carrying `class_names`."""
    copy = type(model).from_config(model.get_config())
    copy.set_weights(model.get_weights())
    copy.class_names = class_names
    return copy


def _minutes(seconds):
    return f"{int(seconds // 60)}m{int(seconds % 60):02d}s"


def run(args, callbacks=()):
    """The `keras-vit finetune` command (see the module's docstring); `callbacks`: more Keras callbacks
    for `fit`, called after the backup's."""
    import keras

    from keras_vit import recipes

    _check_args(args)
    flags = {k: getattr(args, k) for k in FLAGS}
    resuming = _prepare_out(args, flags)
    folder = _read_folder(args)
    counts = folder.counts()
    sched = plan(len(folder.train), args.batch_size, args.device_batch_size, args.epochs, args.steps)
    # every refusal comes before --out is written: bad weights, a schedule or a feed that cannot be made
    model = _build_and_compile(args, folder.class_names, sched)
    out = args.out
    backup = recipes.TrainingBackup(os.path.join(out, BACKUP), delete_on_end=False)
    done = backup.restore(model) if resuming else 0  # train steps done before an interruption
    train, validation = _feeds(model, args, folder, sched, done)
    _start_out(args, flags, resuming, folder)
    print(f"batch {sched.batch_size} ({sched.accumulation} x {sched.device_batch_size} on the device), "
          f"{sched.epochs} epochs of {sched.updates_per_epoch} updates, {sched.warmup} warm-up, base learning rate "
          f"{args.lr}" + (f", LoRA rank {args.lora}" if args.lora else ""))
    initial_epoch = done // sched.steps_per_epoch
    history = _history_so_far(out, done, initial_epoch, sched.epochs)
    seconds, best_path = _fit(model, args, train, validation, backup, history, initial_epoch, sched, callbacks)
    result, exported = _evaluate_and_save(model, args, best_path, validation, folder, history, counts)
    scores = history.get("val_accuracy", [])
    summary = {
        "directory": os.path.abspath(args.directory), "class_names": list(folder.class_names),
        "images": {k: {"train": v[0], "validation": v[1]} for k, v in counts.items()},
        "skipped": [{"file": p, "reason": r} for p, r in folder.skipped],
        "schedule": {"batch_size": sched.batch_size, "device_batch_size": sched.device_batch_size,
                     "epochs": sched.epochs, "updates_per_epoch": sched.updates_per_epoch,
                     "warmup_updates": sched.warmup, "base_lr": args.lr},
        "best_epoch": len(scores) - scores[::-1].index(max(scores)) if scores else None,  # ties: the later, as kept
        "validation_accuracy": result["accuracy"], "per_class_accuracy": result["per_class"],
        "confusion_matrix": result["confusion"], "history": history,
        "train_seconds": round(seconds, 3), "resumed_from_epoch": initial_epoch,
        "backend": keras.backend.backend(), "export": exported, "flags": flags,
    }
    if getattr(args, "naflex", None):
        summary["naflex"] = {"tokens": args.naflex, "patch_size": train.plan.patch_size,
                             "inputs": ["patches", "patch_coord", "patch_valid"],
                             "steps_per_epoch": sched.steps_per_epoch}
    write_json(os.path.join(out, REPORT), summary)
    shutil.rmtree(os.path.join(out, BACKUP), ignore_errors=True)
    print(f"validation accuracy {result['accuracy']:.4f} (best epoch {summary['best_epoch']} of {sched.epochs}); "
          f"wrote {out}")
    return summary


def _feeds(model, args, folder, sched, done):
    """(train, validation) of the scanned `folder` for `model`: endless training streams from device step
    `done` on, `sched.device_batch_size` uint8 images a step (the model scales them itself), square
    images of --image-size or, with --naflex, NaFlex batches."""
    if getattr(args, "naflex", None):
        return _naflex_batches(model, folder, args.naflex, sched.device_batch_size, args.seed, done)
    from keras_vit import data

    return data.from_directory(folder, args.image_size, sched.device_batch_size, skip_batches=done,
                               image_dtype="uint8", pipeline=args.pipeline)


def _naflex_batches(model, folder, tokens, device_batch, seed, done):
    """(train, validation) NaFlex batches of the scanned `folder` for the NaFlex `model`: `device_batch`
    images of `tokens` patches each (uint8: the model scales them itself), the training stream endless
    from batch `done` on."""
    from keras_vit import naflex_feed
    from keras_vit.structure import find_vit

    plan = naflex_feed.NaFlexPlan(patch_size=find_vit(model).embedding.patch_size, seq_lens=(tokens,),
                                  max_tokens_per_batch=tokens * device_batch, eval_seq_len=tokens, seed=seed)
    return naflex_feed.folder_batches(folder, plan, image_dtype="uint8", repeat=True, skip_batches=done)


def _read_folder(args):
    """The scanned --directory (its split by --validation-split and --seed), its counts said."""
    from keras_vit.image_folder import scan

    print(f"reading {args.directory} ...", flush=True)
    folder = scan(args.directory, args.validation_split, args.seed, labels_csv=args.labels_csv, strict=args.strict,
                  verbose=not args.quiet)
    print(f"{len(folder.class_names)} classes, {len(folder.train)} training and {len(folder.validation)} validation "
          f"images" + (f"; {len(folder.skipped)} file(s) skipped (listed in {SPLIT})" if folder.skipped else ""))
    return folder


def _build_and_compile(args, class_names, sched):
    """The model to fine-tune (build_model, with --lora its adapters), seeded by --seed and compiled with
    the paper's recipe for the `Plan` `sched`."""
    import keras

    from keras_vit import recipes

    keras.utils.set_random_seed(args.seed)
    model = build_model(args, class_names)
    if getattr(args, "naflex", None):
        from keras_vit.naflex import naflex

        model = naflex(model)  # its weights and head; takes NaFlex batches
        model.naflex_tokens = args.naflex  # the images' budget, what predict cuts them to
    if args.lora:
        from keras_vit.lora import enable_lora

        enable_lora(model, args.lora)
    recipes.compile_for_finetuning(model, total_steps=sched.updates_per_epoch * sched.epochs, base_lr=args.lr,
                                   warmup_steps=sched.warmup, batch_size=sched.batch_size,
                                   device_batch_size=sched.device_batch_size, layer_decay=args.layer_decay)
    return model


def _start_out(args, flags, resuming, folder):
    """--out made (emptied first with --overwrite), the run's flags written to a new run's marker, and
    the folder's split to split.json."""
    out = args.out
    if args.overwrite and os.path.isdir(out):
        shutil.rmtree(out)
    os.makedirs(out, exist_ok=True)
    if not resuming:
        write_json(os.path.join(out, MARKER), flags)
    folder.save(os.path.join(out, SPLIT))


def _history_so_far(out, done, initial_epoch, epochs):
    """The per-epoch metrics of the epochs before `initial_epoch` a resumed run backed up (said); {} for a
    new run."""
    history = {}
    history_path = os.path.join(out, BACKUP, "history.json")
    if done and os.path.exists(history_path):
        with open(history_path) as f:
            history = {k: v[:initial_epoch] for k, v in json.load(f).items()}
        print(f"resuming {out}: {initial_epoch} of {epochs} epochs done")
    return history


def _fit(model, args, train, validation, backup, history, initial_epoch, sched, callbacks):
    """Trains the epochs of the `Plan` `sched` from `initial_epoch` on, backing up at each end and keeping
    the best one's weights; returns the seconds it took and the best weights' file."""
    from keras_vit import recipes

    out, epochs, steps_per_epoch = args.out, sched.epochs, sched.steps_per_epoch
    keep_history, keep_best, time_left, best_path = _callbacks(out, history, epochs, initial_epoch)
    start = time.perf_counter()
    if initial_epoch < epochs:
        try:
            model.fit(train, epochs=epochs, initial_epoch=initial_epoch, steps_per_epoch=steps_per_epoch,
                      validation_data=validation, verbose=0 if args.quiet else 1, shuffle=False,
                      callbacks=[recipes.NonFiniteLossStop(checkpoint_hint=backup.path), keep_history, keep_best,
                                 time_left, backup, *callbacks])
        except KeyboardInterrupt:
            print(f"\ninterrupted: the same command with --resume continues from the last epoch's backup in {out}",
                  flush=True)
            raise
        except recipes.NonFiniteLossError as err:  # the CLI's one-line error; the last good backup is kept
            raise ValueError(f"{err} (--lr {args.lr}: a lower --lr, then --resume or --overwrite)") from None
    return time.perf_counter() - start, best_path


def _evaluate_and_save(model, args, best_path, validation, folder, history, counts):
    """The best epoch's model (its LoRA adapters merged) evaluated on the validation split and written to
    --out: model.keras, the figures, per_class.csv, with --export the served artefact. Returns (the
    evaluation, the artefact's path or None)."""
    model.load_weights(best_path)
    if args.lora:
        from keras_vit.lora import merge_lora

        model = merge_lora(model)  # the best weights were written merged: the adapters now hold zeros
    from keras_vit.recipes import report

    out = args.out
    result = report.evaluate(model, validation, folder)
    model = _served(model, folder.class_names)
    from keras_vit.convert import save_keras

    save_keras(model, os.path.join(out, "model.keras"))
    report.write_figures(out, history, result, folder)
    report.write_per_class(os.path.join(out, "per_class.csv"), result, counts)
    exported = None
    if args.export:
        from keras_vit.export import export

        shutil.rmtree(os.path.join(out, "export"), ignore_errors=True)  # a resumed run's half-written one
        exported = export(model, os.path.join(out, "export"), args.export)
        with atomic_write(os.path.join(out, "export", "class_names.txt")) as tmp, open(tmp, "w", encoding="utf-8") as f:
            f.write("\n".join(folder.class_names) + "\n")
    return result, exported


__all__ = ["Plan", "add_parser", "build_model", "plan", "run", "schedule"]
