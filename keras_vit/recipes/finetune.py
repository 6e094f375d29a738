"""The fine-tuning recipe shared by examples/finetune_*.py (paper B.1.1, Table 4).

    python examples/finetune_cifar10.py --model ViT_B16 --weights imagenet21k --image-size 384 \\
        --batch-size 512 --device-batch-size 32 --output-dir runs/cifar10_b16

1. the TFDS dataset through ``keras_vit.data.load`` (random crop + flip for
   training, plain resize for testing), as uint8 images the model scales to [-1, 1] on the device
   (``--input-dtype float32`` scales them on the host);
2. a ViT from a factory (``--model ViT_B16``; or a JSON object of
   ``VisionTransformer`` arguments for experiments) with a new zero-initialised
   head of the dataset's classes, loaded from ``--weights``;
3. ``keras_vit.recipes.compile_for_finetuning``: SGD momentum 0.9, warm-up then
   cosine decay, clipping at global norm 1, gradient accumulation when
   ``--device-batch-size`` is smaller than ``--batch-size``, optional EMA;
4. ``model.fit`` with a progress bar, then ``model.evaluate`` on the test split;
5. into ``--output-dir``: ``model.keras`` (outputs logits), ``metrics.json``
   (test_accuracy, test_loss, steps, seconds, images_per_second, ...),
   ``curves.png``, and ``run.json`` (the flags). ``metrics.json`` is written
   last: its presence marks a finished run.

Resuming: the training state is backed up in ``<output-dir>/backup`` at the
end of every evaluation period (``--eval-every`` updates). A run that is
killed and started again with the same flags continues from the last backup,
with the data stream positioned where it stopped, and ends with the same
weights as an uninterrupted run. A folder holding another run (other flags,
or a finished run) is refused unless ``--overwrite``.

The flags are parsed and checked in ``keras_vit.recipes.finetune_args``; where the run goes (several
processes, ``--distribute``, the images per step) is ``keras_vit.recipes.finetune_devices``.
"""

import contextlib
import json
import os
import shutil
import sys
import time

from keras_vit import writer_lock
from keras_vit.configs import get_variant
from keras_vit.extras import require_or_exit
from keras_vit.fileio import atomic_write, check_writable, write_json
from keras_vit.recipes import finetune_devices, presets, run_folder
from keras_vit.recipes.finetune_args import PRETRAINED_TAGS, parse_args, run_flags  # noqa: F401  (read from here)
from keras_vit.startup import interrupted, watching_ctrl_c

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

MARKER = "run.json"
BACKUP = "backup"
HISTORY = "history.json"


# --------------------------------------------------------------------------
# output folder
# --------------------------------------------------------------------------
def prepare_output_dir(out, flags, overwrite):
    """Create ``out`` or decide to resume in it (the same command again continues an interrupted run), by
    `run_folder`'s rule; refuse to mix two runs. Returns True when resuming."""
    try:
        resuming = run_folder.decide(out, flags, option="--output-dir", marker=MARKER, finished="metrics.json",
                                     overwrite=overwrite)
    except (ValueError, OSError) as err:
        raise SystemExit(f"error: {err}") from None
    run_folder.start(out, flags, resuming, marker=MARKER, overwrite=overwrite)
    return resuming


# --------------------------------------------------------------------------
# model
# --------------------------------------------------------------------------
def build_model(args, classes):
    import keras_vit

    spec = args.model.strip()
    if spec.startswith("{"):
        try:
            config = json.loads(spec)
        except json.JSONDecodeError as e:
            raise SystemExit(f"error: --model is not valid JSON: {e}") from None
        if not isinstance(config, dict):
            raise SystemExit("error: --model JSON must be an object of VisionTransformer arguments")
        config.update(image_size=args.image_size, classes=classes, **presets.model_options(args, logits=True))
        config.setdefault("remat", args.remat)
        config.setdefault("input_dtype", args.input_dtype)
        model = keras_vit.VisionTransformer(**config)
        if args.weights:
            for note in keras_vit.load_weights(model, args.weights) or ():
                print(f"weights: {note}")
        return model
    try:
        factory = getattr(keras_vit, get_variant(spec).name)
    except ValueError as err:
        raise SystemExit(f"error: --model: {err}, or a JSON object of VisionTransformer arguments") from None
    return factory(weights=args.weights, image_size=args.image_size, classes=classes, remat=args.remat,
                   input_dtype=args.input_dtype, **presets.model_options(args, logits=True))  # --recipe's


# --------------------------------------------------------------------------
# curves
# --------------------------------------------------------------------------
def plot_curves(path, history, eval_every, title):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    epochs = len(history.get("loss", []))
    steps = [(i + 1) * eval_every for i in range(epochs)]
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, key, label in ((axes[0], "loss", "loss"), (axes[1], "accuracy", "accuracy")):
        if key in history:
            ax.plot(steps, history[key], "o-", label=f"train {label}")
        if f"val_{key}" in history:
            ax.plot(steps, history[f"val_{key}"], "s--", label=f"test {label}")
        ax.set_xlabel("optimizer updates")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle(title)
    fig.tight_layout()
    with atomic_write(path) as tmp:
        fig.savefig(tmp, dpi=100)
    plt.close(fig)


# --------------------------------------------------------------------------
# main
# --------------------------------------------------------------------------
def main(dataset, argv=None, callbacks=()):
    """Run the recipe on ``dataset``; ``callbacks`` are extra Keras callbacks for ``fit``."""
    args = parse_args(dataset, argv)
    require_or_exit("reading a TFDS dataset (keras_vit.data)")  # before the output folder is made
    try:  # a place that cannot be written: refused before the lock beside it, the data or a model
        check_writable(args.output_dir, "--output-dir", folder=True)
    except OSError as err:
        raise SystemExit(f"error: {err}") from None
    # on several processes process 0 alone writes the folder (all read the backup from it), holding its lock
    writer = finetune_devices.join_processes() == 0
    try:
        with writer_lock.hold(args.output_dir) if writer else contextlib.nullcontext(), watching_ctrl_c():
            return _run(dataset, args, writer, callbacks)
    except writer_lock.FolderLockedError as err:
        raise SystemExit(f"error: --output-dir {err}") from None
    except KeyboardInterrupt:  # Ctrl-C: one line and a shell's status, no traceback
        raise SystemExit(interrupted(os.path.basename(sys.argv[0]), "the same command again continues from the last "
                                     f"backup in {args.output_dir}")) from None


def _run(dataset, args, writer, callbacks):
    """The recipe's run in --output-dir (`main` holds its lock)."""
    flags = run_flags(args)
    out = args.output_dir
    resuming = prepare_output_dir(out, flags, args.overwrite) if writer else False
    finetune_devices.wait_for_every_process("the output folder is ready")

    info, step_batch, model = _build_and_compile(dataset, args)
    # kept until metrics.json is written, so a run killed after training
    # but before its files are saved resumes at the end instead of restarting
    backup = finetune_devices.backup(os.path.join(out, BACKUP))
    done = backup.restore(model)  # train steps already done (0 for a new run)
    if resuming:
        print(f"resuming {out}: {done // args.accumulation} of {args.steps} updates done")
    train, test = _load_data(dataset, args, step_batch, done)

    history_path = os.path.join(out, BACKUP, HISTORY)
    history = _history_so_far(history_path, done, done // (args.eval_every * args.accumulation))
    keep_history = _history_keeper(history, history_path, writer)
    timer, seconds = _fit(model, args, train, test, done, backup, keep_history, writer, callbacks)

    result = model.evaluate(test, verbose=args.verbose, return_dict=True)
    if not writer:
        finetune_devices.run_written()
        return {"test_accuracy": float(result.get("accuracy", float("nan"))), "test_loss": float(result["loss"])}

    with atomic_write(os.path.join(out, "model.keras")) as tmp, finetune_devices.saving_alone():
        model.save(tmp)
    plot_curves(os.path.join(out, "curves.png"), history, args.eval_every,
                f"{args.model if not args.model.startswith('{') else 'ViT'} on {dataset}")
    metrics = _metrics(dataset, args, flags, info, result, history, step_batch, done, timer.times, seconds)
    write_json(os.path.join(out, "metrics.json"), metrics)
    shutil.rmtree(os.path.join(out, BACKUP), ignore_errors=True)
    finetune_devices.run_written()
    print(f"test accuracy {metrics['test_accuracy']:.4f}, loss {metrics['test_loss']:.4f}; "
          f"{metrics['images_per_second']} images/s; wrote {out}")
    return metrics


def _build_and_compile(dataset, args):
    """(the dataset's info, images per train step, the model built and compiled for fine-tuning) under
    --distribute, after seeding every generator with --seed."""
    import keras

    from keras_vit import data, recipes

    info = data.dataset_info(dataset, data_dir=args.data_dir)
    keras.utils.set_random_seed(args.seed)
    with finetune_devices.distribution(args):
        step_batch = finetune_devices.step_batch(args)
        model = build_model(args, info.num_classes)
        if args.naflex:
            from keras_vit.naflex import naflex

            model = naflex(model)
        mixing = presets.mixup_of(args, info.num_classes) is not None  # MixUp's soft targets hold the smoothing
        recipes.compile_for_finetuning(
            model, total_steps=args.steps, warmup_steps=args.warmup_steps,
            batch_size=args.batch_size, device_batch_size=step_batch, ema=args.ema, layer_decay=args.layer_decay,
            steps_per_execution=args.steps_per_execution, sparse_labels=not mixing,
            label_smoothing=0.0 if mixing else args.smoothing or 0.0, **presets.compile_options(args, args.batch_size))
    return info, step_batch, model


def _load_data(dataset, args, step_batch, done):
    """(train, test) of the recipe's splits of `dataset`, this process's rows, the train stream
    starting after the `done` train steps."""
    from keras_vit import data, distribute
    from keras_vit.data.mixup import mixed_feeds
    from keras_vit.recipes import FINETUNE_SETUPS

    setup = FINETUNE_SETUPS[dataset]
    if args.naflex:
        return _naflex_data(dataset, args, setup, step_batch, done)
    process_index, process_count = distribute.process_shard() if args.distribute != "none" else (0, 1)
    try:
        train, test = data.load(
            dataset, args.image_size, step_batch, split=(setup.train_split, setup.test_split),
            data_dir=args.data_dir, seed=args.seed, shuffle_buffer=args.shuffle_buffer,
            skip_batches=done, process_index=process_index, process_count=process_count,
            image_dtype=args.input_dtype, auto_augment=args.aa, re_prob=args.reprob or 0.0,
            aug_repeats=args.aug_repeats or 1,
            color_jitter=getattr(args, "color_jitter", None))  # --recipe's augmentations (none in the paper's)
    except OSError as e:  # the data could not be downloaded: the message says what to do
        raise SystemExit(f"error: {e}") from None
    mix = presets.mixup_of(args, data.dataset_info(dataset, data_dir=args.data_dir).num_classes)
    return (train, test) if mix is None else mixed_feeds(train, test, mix, skip_batches=done)


def _naflex_data(dataset, args, setup, step_batch, done):
    """(train, test) NaFlex batches of the recipe's splits (`keras_vit.data.naflex_feed.tf_dataset`): one bucket of
    --naflex tokens, `step_batch` images a step, the train stream starting after the `done` train steps."""
    import tensorflow as tf
    import tensorflow_datasets as tfds

    from keras_vit.data import naflex_feed
    from keras_vit.data.tfds import split_reader

    patch = json.loads(args.model)["patch_size"] if args.model.strip().startswith("{") \
        else get_variant(args.model).patch_size
    plan = naflex_feed.NaFlexPlan(patch_size=patch, seq_lens=(args.naflex,), eval_seq_len=args.naflex,
                                  max_tokens_per_batch=args.naflex * step_batch, seed=args.seed)
    try:
        read = split_reader(tf, tfds, dataset, args.data_dir, download=True)
        train = naflex_feed.tf_dataset(read(setup.train_split), plan, shuffle_buffer=args.shuffle_buffer,
                                       image_dtype=args.input_dtype)
        test = naflex_feed.tf_dataset(read(setup.test_split), plan, training=False, image_dtype=args.input_dtype)
    except OSError as e:  # the data could not be downloaded: the message says what to do
        raise SystemExit(f"error: {e}") from None
    return train.skip(done), test


def _history_so_far(history_path, done, initial_epoch):
    """The per-epoch metrics of the epochs before `initial_epoch` a resumed run backed up; {} for a new run."""
    history = {}
    if done and os.path.exists(history_path):
        with open(history_path) as f:
            history = {k: v[:initial_epoch] for k, v in json.load(f).items()}
    return history


def _history_keeper(history, history_path, writer):
    """A callback appending each epoch's logs to `history`, and (the writer) saving it to `history_path`."""
    import keras

    class KeepHistory(keras.callbacks.Callback):
        # runs before the backup callback, so the saved history never lags the weights
        def on_epoch_end(self, epoch, logs=None):
            for key, value in (logs or {}).items():
                history.setdefault(key, []).append(float(value))
            if writer:
                os.makedirs(os.path.dirname(history_path), exist_ok=True)
                write_json(history_path, history)

    return KeepHistory()


def _epoch_timer(validate):
    """A callback whose `times` are the training seconds of each epoch (without the per-epoch validation)."""
    import keras

    class EpochTimes(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.times = []

        def on_epoch_begin(self, epoch, logs=None):
            self.start = time.perf_counter()

        def on_test_begin(self, logs=None):
            self.times.append(time.perf_counter() - self.start)

        def on_epoch_end(self, epoch, logs=None):
            if not validate:
                self.times.append(time.perf_counter() - self.start)

    return EpochTimes()


def _fit(model, args, train, test, done, backup, keep_history, writer, callbacks):
    """Trains from the `done` train steps to --steps updates, one epoch per evaluation period (the writer
    backing up at the end of each); returns the epoch timer and the seconds it took."""
    from keras_vit import recipes

    steps_per_epoch = args.eval_every * args.accumulation
    initial_epoch = done // steps_per_epoch
    epochs = args.steps // args.eval_every
    stop = recipes.NonFiniteLossStop(checkpoint_hint=backup.path)
    timer = _epoch_timer(args.validate)
    start = time.perf_counter()
    if initial_epoch < epochs:
        model.fit(train, epochs=epochs, initial_epoch=initial_epoch, steps_per_epoch=steps_per_epoch,
                  validation_data=test if args.validate else None, verbose=args.verbose,
                  shuffle=False, callbacks=[stop, recipes.StopOnCtrlC(), timer, keep_history, *([backup] if writer else []),
                                            *callbacks])
    elif model.optimizer.use_ema:
        # killed after the last backup but before saving: fit would have
        # ended by loading the averaged weights
        model.optimizer.finalize_variable_values(model.trainable_variables)
    return timer, time.perf_counter() - start


def _metrics(dataset, args, flags, info, result, history, step_batch, done, times, seconds):
    """metrics.json of a finished run: the test metrics, the speed (`times`: each epoch's training
    seconds), the flags and the history."""
    import keras

    from keras_vit.recipes import FINETUNE_SETUPS

    steps_per_epoch = args.eval_every * args.accumulation
    trained_images = (args.steps * args.accumulation - done) * step_batch
    return {
        "dataset": dataset,
        "test_accuracy": float(result.get("accuracy", float("nan"))),
        "test_loss": float(result["loss"]),
        "test_examples": info.splits.get(FINETUNE_SETUPS[dataset].test_split),
        "steps": args.steps,
        "batch_size": args.batch_size,
        "device_batch_size": step_batch // args.replicas,
        "replicas": args.replicas,
        "seconds": round(seconds, 3),
        "images_per_second": round(trained_images / seconds, 3) if seconds > 0 else None,
        # the same after the first epoch of this process (no compilation, no warm-up)
        "steady_images_per_second": (
            round(steps_per_epoch * step_batch * (len(times) - 1)
                  / sum(times[1:]), 3) if len(times) > 1 else None),
        "resumed_from_step": done // args.accumulation,
        "backend": keras.backend.backend(),
        "flags": flags,
        "history": history,
    }


if __name__ == "__main__":  # pragma: no cover
    sys.exit("run one of examples/finetune_{cifar10,cifar100,pets,flowers}.py")
