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
"""

import argparse
import contextlib
import json
import math
import os
import shutil
import sys
import time

from keras_vit.configs import VARIANTS, get_variant, none_or
from keras_vit.fileio import atomic_write, write_json
from keras_vit.weights.registry import default_tag

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

# --weights when not given: the variant's ImageNet-21k pre-trained release (what the paper fine-tunes),
# in this order of preference (ViT-Ti and ViT-S were released under augreg tags only)
PRETRAINED_TAGS = ("imagenet21k", "augreg-imagenet21k")
MARKER = "run.json"
BACKUP = "backup"
HISTORY = "history.json"


# --------------------------------------------------------------------------
# command line
# --------------------------------------------------------------------------
def _number(kind, minimum, strict):
    """An argparse type: `kind` (int or float) finite and > `minimum` (>= when not `strict`)."""
    what = {(int, 0, True): "a positive integer", (int, 0, False): "an integer >= 0",
            (float, 0, True): "a positive number"}[kind, minimum, strict]

    def parse(text):
        try:
            value = kind(text)
        except ValueError:
            value = None
        if value is None or not math.isfinite(value) or value < minimum or (strict and value == minimum):
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
        return value

    return parse


_positive_int, _non_negative_int, _positive_float = _number(int, 0, True), _number(int, 0, False), _number(float, 0, True)


def parse_args(dataset, argv=None):
    from keras_vit.recipes import FINETUNE_SETUPS

    setup = FINETUNE_SETUPS[dataset]
    parser = argparse.ArgumentParser(
        description=f"Fine-tune a ViT on {dataset} with the paper's recipe (Table 4: "
        f"{setup.total_steps} steps, batch {setup.batch_size}, lr grid {list(setup.base_lrs)}).")
    parser.add_argument("--model", default="ViT_B16",
                        help="factory name (ViT_B16, ViT_L16, R50_ViT_B16, ...) or a JSON object "
                        "of VisionTransformer arguments (default: ViT_B16)")
    parser.add_argument("--weights", default=None,
                        help="registry tag, .npz/.weights.h5 path, or 'none' (default: the variant's ImageNet-21k "
                        f"pre-trained release, {' else '.join(PRETRAINED_TAGS)})")
    parser.add_argument("--image-size", type=_positive_int, default=setup.image_size,
                        help=f"training and test resolution (default: {setup.image_size})")
    parser.add_argument("--batch-size", type=_positive_int, default=setup.batch_size,
                        help=f"images per update (default: {setup.batch_size})")
    parser.add_argument("--device-batch-size", type=_positive_int, default=None,
                        help="images per device (per replica) and train step; gradients of "
                        "batch-size/(device-batch-size x replicas) steps are accumulated "
                        "(default: the batch size split over the replicas, no accumulation)")
    parser.add_argument("--steps", type=_positive_int, default=setup.total_steps,
                        help=f"optimizer updates (default: {setup.total_steps})")
    parser.add_argument("--lr", type=_positive_float, default=setup.default_lr,
                        help=f"base learning rate (default: {setup.default_lr}; the paper sweeps "
                        f"{list(setup.base_lrs)})")
    parser.add_argument("--warmup-steps", type=_non_negative_int, default=None,
                        help=f"linear warm-up updates (default: {setup.warmup_steps}, at most --steps)")
    parser.add_argument("--eval-every", type=_positive_int, default=None,
                        help="updates per Keras epoch: the curve points and backups "
                        "(default: a tenth of --steps when it divides evenly)")
    parser.add_argument("--validate", action="store_true",
                        help="also evaluate on the test split after every epoch (curves)")
    parser.add_argument("--data-dir", default=None, help="TFDS data folder (already downloaded data)")
    parser.add_argument("--output-dir", default=os.path.join("runs", f"finetune_{dataset}"),
                        help=f"output folder (default: runs/finetune_{dataset})")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace an output folder holding another run of these examples")
    parser.add_argument("--distribute", nargs="?", const="data", default="none", choices=("none", "data", "model"),
                        help="none (default); data: data parallel over all devices (Keras DataParallel on JAX, "
                        "tf.distribute.tf_strategy() on TensorFlow: TPU, several GPUs, TF_CONFIG workers); "
                        "model: JAX ModelParallel over a --mesh of batch x model devices. --batch-size stays "
                        "the global batch, accumulated over steps when the devices hold less")
    parser.add_argument("--mesh", default=None, metavar="BxM",
                        help="with --distribute model: devices along the batch and the model axis, e.g. 2x4 "
                        "(default: 1 x all devices)")
    parser.add_argument("--steps-per-execution", type=_positive_int, default=1,
                        help="train steps per compiled call (TPUs: e.g. 32; default: 1)")
    parser.add_argument("--input-dtype", choices=("uint8", "float32"), default="uint8",
                        help="what the pipeline sends to the device: uint8 images scaled to [-1, 1] by the "
                        "model (default: a quarter of the bytes, no scaling on the host), or float32 "
                        "images scaled on the host; the saved model.keras takes the same")
    parser.add_argument("--ema", action="store_true", help="Polyak averaging of the weights (0.9999)")
    parser.add_argument("--remat", action="store_true",
                        help="recompute each encoder block in the backward pass: far less memory per "
                        "image (TensorFlow, torch, GPUs) for about 15%% more time")
    parser.add_argument("--seed", type=int, default=0, help="seed of the init, data order and "
                        "augmentation (default: 0)")
    parser.add_argument("--shuffle-buffer", type=_positive_int, default=10_000,
                        help="shuffle buffer of encoded images (default: 10000)")
    parser.add_argument("--verbose", type=int, choices=(0, 1, 2), default=1,
                        help="Keras verbosity: 1 progress bars (default), 2 a line an epoch, 0 none")
    args = parser.parse_args(argv)
    args.dataset = dataset
    import keras

    from keras_vit import distribute

    if args.distribute == "model" and keras.backend.backend() != "jax":
        parser.error(f"--distribute model runs on the jax backend (Keras ModelParallel); this is "
                     f"{keras.backend.backend()!r}: use --distribute data"
                     + (" or torchrun" if keras.backend.backend() == "torch" else ""))
    if args.distribute == "data" and keras.backend.backend() == "torch":
        parser.error("--distribute data covers the jax and tensorflow backends; on 'torch' run one process "
                     "per device with torchrun")
    if args.mesh is not None:
        if args.distribute != "model":
            parser.error(f"--mesh goes with --distribute model, got --distribute {args.distribute}")
        try:
            args.mesh = "x".join(map(str, distribute.parse_mesh(args.mesh)))
        except ValueError as e:
            parser.error(f"--mesh: {e}")
    if args.warmup_steps is None:
        args.warmup_steps = min(setup.warmup_steps, args.steps)
    if args.eval_every is None:
        args.eval_every = args.steps // 10 if args.steps % 10 == 0 else args.steps
    if args.steps % args.eval_every:
        parser.error(f"--steps ({args.steps}) must be a multiple of --eval-every ({args.eval_every})")
    if args.warmup_steps > args.steps:
        parser.error(f"--warmup-steps ({args.warmup_steps}) must not exceed --steps ({args.steps})")
    from keras_vit.recipes import gradient_accumulation_steps

    try:
        args.accumulation = gradient_accumulation_steps(args.batch_size, args.device_batch_size)
    except ValueError as e:
        parser.error(str(e))
    if args.weights is None:  # a JSON --model names no variant: its registry tag is found from its architecture
        args.weights = default_tag(args.model, PRETRAINED_TAGS) if args.model in VARIANTS else PRETRAINED_TAGS[0]
    args.weights = none_or(args.weights)
    return args


def run_flags(args):
    """The flags that define a run (a resumed run must repeat them)."""
    keys = ("dataset", "model", "weights", "image_size", "batch_size", "device_batch_size",
            "steps", "lr", "warmup_steps", "eval_every", "ema", "seed", "shuffle_buffer",
            "validate", "distribute", "mesh", "input_dtype")
    return {k: getattr(args, k) for k in keys}


# --------------------------------------------------------------------------
# output folder
# --------------------------------------------------------------------------
def prepare_output_dir(out, flags, overwrite):
    """Create ``out`` or decide to resume in it; refuse to mix two runs. Returns True when resuming."""
    marker = os.path.join(out, MARKER)
    if os.path.exists(out) and not os.path.isdir(out):
        raise SystemExit(f"error: --output-dir {out!r} exists and is not a folder.")
    if os.path.isdir(out) and os.listdir(out):
        ours = os.path.isfile(marker)
        if overwrite:
            if not ours:
                raise SystemExit(
                    f"error: --output-dir {out!r} is not empty and holds no {MARKER} of these "
                    "examples; not deleting it. Remove it yourself or choose another folder.")
            shutil.rmtree(out)
        elif not ours:
            raise SystemExit(
                f"error: --output-dir {out!r} exists and is not empty; choose another folder "
                "(or remove it).")
        else:
            with open(marker) as f:
                previous = json.load(f)
            finished = os.path.exists(os.path.join(out, "metrics.json"))
            if finished:
                raise SystemExit(
                    f"error: --output-dir {out!r} holds a finished run; pass --overwrite to "
                    "replace it or choose another folder.")
            if previous != flags:
                changed = {k: (previous.get(k), v) for k, v in flags.items() if previous.get(k) != v}
                raise SystemExit(
                    f"error: --output-dir {out!r} holds an interrupted run with other flags "
                    f"(was -> now: {changed}); repeat its flags to resume it, or pass "
                    "--overwrite to start over.")
            return True
    os.makedirs(out, exist_ok=True)
    write_json(marker, flags)
    return False


# --------------------------------------------------------------------------
# devices
# --------------------------------------------------------------------------
def _distribution(args):
    """The context to build and compile in for --distribute (refusing a mesh that does not fit)."""
    from keras_vit import distribute

    if args.distribute == "none":
        return contextlib.nullcontext()
    try:
        if args.distribute == "model":
            mesh = distribute.parse_mesh(args.mesh) if args.mesh else None
            return distribute.model_parallel(mesh, auto_shard_dataset=False)
        import keras

        if keras.backend.backend() == "tensorflow":
            return distribute.tf_strategy().scope()
        return distribute.data_parallel()
    except ValueError as e:
        raise SystemExit(f"error: --distribute {args.distribute}: {e}") from None


def _step_batch(args):
    """Images per train step over all replicas; sets args.accumulation (refuses what does not divide)."""
    from keras_vit import distribute, recipes

    replicas = distribute.num_replicas()
    per_device = args.device_batch_size
    args.replicas = replicas
    if per_device is None:
        try:
            distribute.check_batch_size(args.batch_size, "--batch-size")
        except ValueError as e:
            raise SystemExit(f"error: {e}") from None
        step_batch = args.batch_size
    else:
        step_batch = per_device * replicas
    try:
        args.accumulation = recipes.gradient_accumulation_steps(args.batch_size, step_batch)
    except ValueError as e:
        raise SystemExit(
            f"error: --batch-size {args.batch_size} is not a multiple of --device-batch-size {per_device} x "
            f"{replicas} replicas = {step_batch} images per step: {e}") from None
    return step_batch


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
        config.update(image_size=args.image_size, classes=classes, classifier_activation=None)
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
    return factory(weights=args.weights, image_size=args.image_size, classes=classes,
                   classifier_activation=None, remat=args.remat, input_dtype=args.input_dtype)


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
    flags = run_flags(args)
    out = args.output_dir
    resuming = prepare_output_dir(out, flags, args.overwrite)

    import keras

    from keras_vit import data, distribute, recipes

    info = data.dataset_info(dataset, data_dir=args.data_dir)
    keras.utils.set_random_seed(args.seed)
    with _distribution(args):
        step_batch = _step_batch(args)
        model = build_model(args, info.num_classes)
        recipes.compile_for_finetuning(
            model, total_steps=args.steps, base_lr=args.lr, warmup_steps=args.warmup_steps,
            batch_size=args.batch_size, device_batch_size=step_batch, ema=args.ema,
            steps_per_execution=args.steps_per_execution)

    # kept until metrics.json is written, so a run killed after training
    # but before its files are saved resumes at the end instead of restarting
    backup = recipes.TrainingBackup(os.path.join(out, BACKUP), delete_on_end=False)
    done = backup.restore(model)  # train steps already done (0 for a new run)
    steps_per_epoch = args.eval_every * args.accumulation
    total_micro = args.steps * args.accumulation
    initial_epoch = done // steps_per_epoch
    epochs = args.steps // args.eval_every
    if resuming:
        print(f"resuming {out}: {done // args.accumulation} of {args.steps} updates done")

    from keras_vit.recipes import FINETUNE_SETUPS

    setup = FINETUNE_SETUPS[dataset]
    process_index, process_count = distribute.process_shard() if args.distribute != "none" else (0, 1)
    try:
        train, test = data.load(
            dataset, args.image_size, step_batch, split=(setup.train_split, setup.test_split),
            data_dir=args.data_dir, seed=args.seed, shuffle_buffer=args.shuffle_buffer,
            skip_batches=done, process_index=process_index, process_count=process_count,
            image_dtype=args.input_dtype)
    except OSError as e:  # the data could not be downloaded: the message says what to do
        raise SystemExit(f"error: {e}") from None

    history_path = os.path.join(out, BACKUP, HISTORY)
    history = {}
    if done and os.path.exists(history_path):
        with open(history_path) as f:
            history = {k: v[:initial_epoch] for k, v in json.load(f).items()}

    class KeepHistory(keras.callbacks.Callback):
        # runs before the backup callback, so the saved history never lags the weights
        def on_epoch_end(self, epoch, logs=None):
            for key, value in (logs or {}).items():
                history.setdefault(key, []).append(float(value))
            os.makedirs(os.path.dirname(history_path), exist_ok=True)
            write_json(history_path, history)

    class EpochTimes(keras.callbacks.Callback):
        # training time of each epoch (without the per-epoch validation)
        def __init__(self):
            super().__init__()
            self.times = []

        def on_epoch_begin(self, epoch, logs=None):
            self.start = time.perf_counter()

        def on_test_begin(self, logs=None):
            self.times.append(time.perf_counter() - self.start)

        def on_epoch_end(self, epoch, logs=None):
            if not args.validate:
                self.times.append(time.perf_counter() - self.start)

    stop = recipes.NonFiniteLossStop(checkpoint_hint=backup.path)
    timer = EpochTimes()
    start = time.perf_counter()
    if initial_epoch < epochs:
        model.fit(train, epochs=epochs, initial_epoch=initial_epoch, steps_per_epoch=steps_per_epoch,
                  validation_data=test if args.validate else None, verbose=args.verbose,
                  shuffle=False, callbacks=[stop, timer, KeepHistory(), backup, *callbacks])
    elif model.optimizer.use_ema:
        # killed after the last backup but before saving: fit would have
        # ended by loading the averaged weights
        model.optimizer.finalize_variable_values(model.trainable_variables)
    seconds = time.perf_counter() - start
    trained_images = (total_micro - done) * step_batch

    result = model.evaluate(test, verbose=args.verbose, return_dict=True)

    with atomic_write(os.path.join(out, "model.keras")) as tmp:
        model.save(tmp)
    plot_curves(os.path.join(out, "curves.png"), history, args.eval_every,
                f"{args.model if not args.model.startswith('{') else 'ViT'} on {dataset}")
    metrics = {
        "dataset": dataset,
        "test_accuracy": float(result.get("accuracy", float("nan"))),
        "test_loss": float(result["loss"]),
        "test_examples": info.splits.get(setup.test_split),
        "steps": args.steps,
        "batch_size": args.batch_size,
        "device_batch_size": step_batch // args.replicas,
        "replicas": args.replicas,
        "seconds": round(seconds, 3),
        "images_per_second": round(trained_images / seconds, 3) if seconds > 0 else None,
        # the same after the first epoch of this process (no compilation, no warm-up)
        "steady_images_per_second": (
            round(steps_per_epoch * step_batch * (len(timer.times) - 1)
                  / sum(timer.times[1:]), 3) if len(timer.times) > 1 else None),
        "resumed_from_step": done // args.accumulation,
        "backend": keras.backend.backend(),
        "flags": flags,
        "history": history,
    }
    write_json(os.path.join(out, "metrics.json"), metrics)
    shutil.rmtree(os.path.join(out, BACKUP), ignore_errors=True)
    print(f"test accuracy {metrics['test_accuracy']:.4f}, loss {metrics['test_loss']:.4f}; "
          f"{metrics['images_per_second']} images/s; wrote {out}")
    return metrics


if __name__ == "__main__":  # pragma: no cover
    sys.exit("run one of examples/finetune_{cifar10,cifar100,pets,flowers}.py")
