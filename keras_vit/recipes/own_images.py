"""`keras-vit finetune DIR`: a folder of your own photographs to a fine-tuned, served model, in one command.

    keras-vit finetune photos/ --weights dinov2-folder/ --out runs/mine     # photos/<class name>/*.jpg

1. the folder through `keras_vit.data.from_directory` (split written to `split.json`, unusable files
   skipped and listed, or refused with `--strict`), as uint8 images the model scales itself;
2. a ViT from `--model` / `--weights` (a registry tag, a timm or Hugging Face file or folder, a keras-hub
   preset, a `.keras` model) with a new zero-initialised head of the folder's classes; `--lora RANK`
   trains adapters and the head only, `--layer-decay` lowers the rate of the early blocks;
3. the paper's recipe (`compile_for_finetuning`: SGD with momentum 0.9, warm-up then cosine decay,
   clipping at global norm 1) with batch and steps from the folder's size (`folder_plan.plan`);
4. `model.fit` with a progress bar, the validation split evaluated after every epoch, the best epoch's
   weights kept; a backup at every epoch end, so `--resume` continues an interrupted run to the same
   weights as an uninterrupted one;
5. into `--out`: `model.keras` (the best epoch, class names inside, takes uint8 images, outputs
   probabilities), `curves.png`, `confusion_matrix.png`, `mistakes.png`, `per_class.csv`, `split.json`,
   `run.json` (the flags), with `--export FORMAT` a served artefact in `export/` (the class names in it),
   and `report.json` last (its presence marks a finished run).

With `--naflex TOKENS` the model is trained and saved as a NaFlex model (`keras_vit.naflex.naflex` of
the model of step 2): each image keeps its aspect ratio and is resized to fit TOKENS patches
(`keras_vit.data.naflex_feed.folder_batches`, a PyDataset on every backend, flips in training), and
model.keras takes {"patches", "patch_coord", "patch_valid"} batches of uint8 patches and records TOKENS
(`model.naflex_tokens`, what `keras-vit predict` cuts images to). The schedule is the square run's
(`folder_plan.plan`: both feeds stream endlessly, so an epoch is a whole number of updates and `--resume` is
exact), and so are the figures and the report (mistakes.png draws the photographs as they are); `--export` and
`--lora` are refused with it, `--pipeline` is not used and `--image-size` is only the resolution the start
model is built at (its position-embedding grid), not the images'.

A DIR ending in ``.tar`` names WebDataset-style tar shards (a shard, a glob or a brace range; `own_shards`), with
``--validation-shards PATTERN`` their held-out set: the same run, its classes and schedule from the shards'
info files.
"""

import json
import os
import shutil
import time

from keras_vit import writer_lock
from keras_vit.configs import get_variant, none_or
from keras_vit.data.shards import is_shard_pattern
from keras_vit.distribute import num_replicas
from keras_vit.fileio import atomic_write, check_free_space, check_writable, weights_file_bytes, write_json
from keras_vit.recipes import finetune_devices, own_images_args, own_images_processes, own_shards, presets, run_folder
from keras_vit.recipes.folder_plan import plan
from keras_vit.recipes.own_images_args import FLAGS
from keras_vit.startup import by_ctrl_c

MARKER, REPORT, BACKUP, SPLIT = "run.json", "report.json", "backup", "split.json"
FIGURES_BYTES = 4 * 2**20  # about what the figures, per_class.csv, split.json and report.json take


def add_parser(sub):
    """Adds `finetune` to the `keras-vit` sub-command parsers `sub` (its flags: `own_images_args`)."""
    p = own_images_args.add_parser(sub)
    p.set_defaults(func=run)
    return p


def _prepare_out(args, flags):
    """True when resuming (the interrupted run's flags filled into `flags` and `args`); refuses a folder that
    holds something else (`run_folder.decide`). Writes nothing."""
    resuming = run_folder.decide(args.out, flags, option="--out", marker=MARKER, finished=REPORT,
                                 overwrite=args.overwrite, resume=args.resume,
                                 defaults=getattr(args, "flag_defaults", {}))
    for key, value in flags.items():
        setattr(args, key, value)
    return resuming


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

    common = dict(classes=len(classes), input_dtype="uint8", **presets.model_options(args))  # --recipe's flags
    if getattr(args, "distillation", None):
        common["distillation_token"] = True  # DeiT's second head, trained on --teacher (_distilled)
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

    history_path, best_path = (os.path.join(out, BACKUP, name) for name in ("history.json", "best.weights.h5"))

    class KeepHistory(keras.callbacks.Callback):  # before the backup: the history never lags the weights
        def on_epoch_end(self, epoch, logs=None):
            for key, value in (logs or {}).items():
                history.setdefault(key, []).append(float(value))
            write_json(history_path, history)

    class KeepBest(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            scores = history.get("val_accuracy", [])
            if scores and scores[-1] >= max(scores):  # ties: the later epoch
                check_free_space(best_path, weights_file_bytes(self.model, optimizer=True), "the best epoch's weights")
                with atomic_write(best_path) as tmp, finetune_devices.saving_alone():
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
    own_images_args.check_args(args)
    if own_images_processes.join(args):  # one of several processes, not the first: it writes nothing
        return _run(args, callbacks, writer=False)
    check_writable(args.out, "--out", folder=True)  # before the lock beside it, the folder read or a model built
    with writer_lock.hold(args.out):  # one run writes --out at a time
        return _run(args, callbacks)


def _run(args, callbacks, writer=True):
    """The run (`run` holds --out's lock); `writer`: False on the processes of several other than the first,
    which train their rows of every batch and write nothing (`own_images_processes`)."""
    import keras

    flags = {k: getattr(args, k) for k in FLAGS}
    resuming, folder = own_images_processes.shared_start(args, flags, _prepare_out, _read_folder)  # process 0's
    counts = folder.counts()
    sched = plan(len(folder.train), args.batch_size, args.device_batch_size, args.epochs, args.steps)
    processes = own_images_processes.distribute(sched, folder)
    # every refusal comes before --out is written: bad weights, a schedule or a feed that cannot be made
    model = _build_and_compile(args, folder.class_names, sched)
    out = args.out
    backup = finetune_devices.backup(os.path.join(out, BACKUP))
    done = backup.restore(model) if resuming else 0  # train steps done before an interruption
    train, validation, read_skips = _feeds(model, args, folder, sched, done)
    if not writer:
        _fit(model, args, train, validation, backup, {}, done // sched.steps_per_epoch, sched, callbacks, writer)
        _best_model(model, args, os.path.join(out, BACKUP, "best.weights.h5"))  # with process 0, which saves it
        finetune_devices.run_written()
        return None
    # a full disk refused now, not at the first backup: the backup and the best epoch (weights and optimizer),
    # model.keras, the figures and the report
    check_free_space(out, 2 * weights_file_bytes(model, optimizer=True) + weights_file_bytes(model) + FIGURES_BYTES,
                     f"the run in {out}")
    _start_out(args, flags, resuming, folder)
    print(f"batch {sched.batch_size} ({sched.accumulation} x {sched.device_batch_size} on the "
          + (f"devices of {processes} processes" if processes > 1 else "device") + "), "
          f"{sched.epochs} epochs of {sched.updates_per_epoch} updates, {sched.warmup} warm-up, base learning rate "
          f"{args.lr}" + (f", LoRA rank {args.lora}" if args.lora else ""))
    initial_epoch = done // sched.steps_per_epoch
    history = _history_so_far(out, done, initial_epoch, sched.epochs)
    seconds, best_path = _fit(model, args, train, validation, backup, history, initial_epoch, sched, callbacks)
    best = _best_model(model, args, best_path)
    with finetune_devices.saving_alone():  # several processes: process 0 alone from here, with a copy of the weights
        result, exported = _evaluate_and_save(best, args, validation, folder, history, counts, read_skips)
    scores = history.get("val_accuracy", [])
    summary = {
        "directory": os.path.abspath(args.directory), "class_names": list(folder.class_names),
        "images": {k: {"train": v[0], "validation": v[1]} for k, v in counts.items()},
        "skipped": [{"file": p, "reason": r} for p, r in folder.skipped],
        "skipped_while_reading": [{"file": p, "reason": r} for p, r in read_skips],  # failed to decode in the feed
        "schedule": {"batch_size": sched.batch_size, "device_batch_size": sched.device_batch_size,
                     "epochs": sched.epochs, "updates_per_epoch": sched.updates_per_epoch,
                     "warmup_updates": sched.warmup, "base_lr": args.lr},
        "best_epoch": len(scores) - scores[::-1].index(max(scores)) if scores else None,  # ties: the later, as kept
        "validation_accuracy": result["accuracy"], "per_class_accuracy": result["per_class"],
        "confusion_matrix": result["confusion"], "history": history,
        "train_seconds": round(seconds, 3), "resumed_from_epoch": initial_epoch,
        "backend": keras.backend.backend(), "processes": processes, "replicas": num_replicas(),
        "export": exported, "flags": flags,
    }
    if getattr(args, "naflex", None):
        summary["naflex"] = {"tokens": args.naflex, "patch_size": train.plan.patch_size,
                             "inputs": ["patches", "patch_coord", "patch_valid"],
                             "steps_per_epoch": sched.steps_per_epoch}
    write_json(os.path.join(out, REPORT), summary)
    shutil.rmtree(os.path.join(out, BACKUP), ignore_errors=True)
    finetune_devices.run_written()
    print(f"validation accuracy {result['accuracy']:.4f} (best epoch {summary['best_epoch']} of {sched.epochs}); "
          f"wrote {out}")
    return summary


def _feeds(model, args, folder, sched, done):
    """(train, validation, the files that failed as they were read: `(path, reason)`s, filled in while training)
    of the scanned `folder` for `model`: endless training streams from device step `done` on,
    `sched.device_batch_size` uint8 images a step, square images of --image-size or, with --naflex, NaFlex's."""
    if getattr(args, "naflex", None):
        return _naflex_batches(model, folder, args.naflex, sched.device_batch_size, args.seed, done)
    read_skips = ()
    if isinstance(folder, own_shards.ShardSource):
        train, validation = own_shards.feeds(args, folder, sched, done, **own_images_processes.rows())
    else:
        import dataclasses

        from keras_vit import data
        from keras_vit.data.augment import Augment

        augment = dataclasses.asdict(Augment.from_flags(args))  # --aa, --reprob, --remode, --recount, --aug-repeats
        train, validation = data.from_directory(folder, args.image_size, sched.device_batch_size, skip_batches=done,
                                                image_dtype="uint8", pipeline=args.pipeline, **augment,
                                                **own_images_processes.rows())  # this process's rows of each batch
        read_skips = train.skipped_files
    validation = own_images_processes.whole_validation(validation, folder, args, sched)
    mix = presets.mixup_of(args, len(folder.class_names))  # --mixup / --cutmix: the examples' runner's rule
    if mix is None:
        return train, validation, read_skips
    from keras_vit.data.mixup import mixed_feeds

    return (*mixed_feeds(train, validation, mix, skip_batches=done), read_skips)


def _naflex_batches(model, folder, tokens, device_batch, seed, done):
    """(train, validation, the files that failed as they were read) NaFlex batches of the scanned `folder` for
    the NaFlex `model`: `device_batch` images of `tokens` patches each (uint8: the model scales them itself),
    the training stream endless from batch `done` on."""
    from keras_vit.data import naflex_feed
    from keras_vit.structure import find_vit

    plan = naflex_feed.NaFlexPlan(patch_size=find_vit(model).embedding.patch_size, seq_lens=(tokens,),
                                  max_tokens_per_batch=tokens * device_batch, eval_seq_len=tokens, seed=seed)
    train, validation = naflex_feed.folder_batches(folder, plan, image_dtype="uint8", repeat=True, skip_batches=done)
    return train, validation, train.skipped_files


def _read_folder(args):
    """The scanned --directory (its split by --validation-split and --seed), its counts said; a DIR of tar
    shards read as `own_shards.ShardSource`."""
    from keras_vit.data.folder import scan

    if is_shard_pattern(args.directory):
        return own_shards.read_shards(args)
    print(f"reading {args.directory} ...", flush=True)
    folder = scan(args.directory, args.validation_split, args.seed, labels_csv=args.labels_csv, strict=args.strict,
                  verbose=not args.quiet, verify=own_images_args.verify_level(args))
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
    mixing = presets.mixup_of(args, len(class_names)) is not None  # MixUp's soft targets hold the smoothing
    options = presets.compile_options(args, sched.batch_size)  # --recipe's optimizer, rate at this batch, loss
    args.lr = options["base_lr"]  # the run's rate, said and reported (run.json keeps the flag as given)
    recipes.compile_for_finetuning(model, total_steps=sched.updates_per_epoch * sched.epochs,
                                   warmup_steps=sched.warmup, batch_size=sched.batch_size,
                                   device_batch_size=sched.device_batch_size, layer_decay=args.layer_decay,
                                   label_smoothing=0.0 if mixing else getattr(args, "smoothing", None) or 0.0,
                                   sparse_labels=not mixing, **options)
    return _distilled(args, model, mixing)


def _distilled(args, model, mixing):
    """With --distillation, a `Distiller` of the compiled `model` and --teacher, compiled with the same optimizer
    (what is fitted, backed up and restored; `_evaluate_and_save` saves its student); else `model`."""
    if not getattr(args, "distillation", None):
        return model
    from keras_vit.recipes.distill import Distiller, load_teacher

    distiller = Distiller(model, load_teacher(args.teacher), args.distillation, tau=args.distillation_tau,
                          alpha=args.distillation_alpha,
                          label_smoothing=0.0 if mixing else getattr(args, "smoothing", None) or 0.0)
    optimizer, model.optimizer = model.optimizer, None  # the distiller's alone: one copy in the backups
    distiller.compile(optimizer=optimizer, metrics=["accuracy"], jit_compile=model.jit_compile)
    return distiller


def _start_out(args, flags, resuming, folder):
    """--out made (emptied first with --overwrite), the run's flags written to a new run's marker, and
    the folder's split to split.json."""
    run_folder.start(args.out, flags, resuming, marker=MARKER, overwrite=args.overwrite)
    folder.save(os.path.join(args.out, SPLIT))


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


def _fit(model, args, train, validation, backup, history, initial_epoch, sched, callbacks, writer=True):
    """Trains the epochs of the `Plan` `sched` from `initial_epoch` on, backing up at each end and keeping
    the best one's weights (the `writer` only, which alone prints); returns the seconds it took and the best
    weights' file."""
    from keras_vit import recipes

    out, epochs, steps_per_epoch = args.out, sched.epochs, sched.steps_per_epoch
    keep_history, keep_best, time_left, best_path = _callbacks(out, history, epochs, initial_epoch)
    start = time.perf_counter()
    if initial_epoch < epochs:
        try:
            model.fit(train, epochs=epochs, initial_epoch=initial_epoch, steps_per_epoch=steps_per_epoch,
                      validation_data=validation, verbose=0 if args.quiet or not writer else 1, shuffle=False,
                      callbacks=[recipes.NonFiniteLossStop(checkpoint_hint=backup.path), recipes.StopOnCtrlC(),
                                 *([keep_history, keep_best, time_left, backup] if writer else []), *callbacks])
        except BaseException as err:
            if by_ctrl_c(err):  # the CLI says it in one line, exit status 130
                raise KeyboardInterrupt(f"the same command with --resume continues from the last epoch's backup "
                                        f"in {out}") from None
            if isinstance(err, recipes.NonFiniteLossError):  # the CLI's one-line error; the last good backup kept
                raise ValueError(f"{err} (--lr {args.lr}: a lower --lr, then --resume or --overwrite)") from None
            raise
    return time.perf_counter() - start, best_path


def _best_model(model, args, best_path):
    """The best epoch's model of the trained `model` (its weights in `best_path`, once every process can read
    them), a Distiller's student, with --lora (of the parsed flags `args`) its adapters merged."""
    own_images_processes.best_epoch_written()
    model.load_weights(best_path)
    from keras_vit.recipes.distill import student_of

    model = student_of(model)  # a Distiller's student, its two heads averaged
    if args.lora:
        from keras_vit.lora import merge_lora

        model = merge_lora(model)  # the best weights were written merged: the adapters now hold zeros
    return model


def _evaluate_and_save(model, args, validation, folder, history, counts, read_skips=()):
    """The best epoch's `model` (`_best_model`) evaluated on the validation split and written to --out:
    model.keras, the figures, per_class.csv, with --export the served artefact. Returns (the evaluation, the
    artefact's path or None)."""
    model = _served(model, folder.class_names)  # the copy evaluated and saved
    from keras_vit.recipes import report

    out = args.out
    result = report.evaluate(model, validation, folder, read_skips)
    from keras_vit.convert import save_keras

    save_keras(model, os.path.join(out, "model.keras"))
    report.write_figures(out, history, result, folder, own_shards.photograph_of(folder))
    report.write_per_class(os.path.join(out, "per_class.csv"), result, counts)
    exported = None
    if args.export:
        from keras_vit.export import export

        shutil.rmtree(os.path.join(out, "export"), ignore_errors=True)  # a resumed run's half-written one
        exported = export(model, os.path.join(out, "export"), args.export)  # the class names travel with it
    return result, exported


__all__ = ["add_parser", "build_model", "run"]
