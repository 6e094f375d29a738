"""The fine-tuning recipe's command line (`keras_vit.recipes.finetune`): its flags, their checks and defaults."""

import argparse
import math
import os

from keras_vit.configs import VARIANTS, none_or
from keras_vit.weights.registry import default_tag

# --weights when not given: the variant's ImageNet-21k pre-trained release (what the paper fine-tunes),
# in this order of preference (ViT-Ti and ViT-S were released under augreg tags only)
PRETRAINED_TAGS = ("imagenet21k", "augreg-imagenet21k")


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


def several_processes():
    """The number of processes of this run when it is more than one (None otherwise): what the launcher that
    started this process says (`keras_vit.distribute.launchers`: `python -m keras_vit.launch`'s variables,
    TF_CONFIG on TensorFlow, `srun`, `mpiexec`), on a TPU slice what JAX joined."""
    from keras_vit.distribute import launchers

    launch = launchers.detect()
    if launch is None:
        return None
    return launchers.joined_count() if launch.count is None else launch.count


def parse_args(dataset, argv=None):
    """The recipe's flags for `dataset`, checked, with the defaults of its Table 4 setup filled in
    (warm-up, --eval-every, gradient accumulation, --weights); exits with a usage error otherwise.

    Args:
        dataset: a key of `keras_vit.recipes.FINETUNE_SETUPS` ("cifar10", "oxford_iiit_pet", ...).
        argv: the command line's arguments; None reads `sys.argv[1:]`.

    Returns:
        An `argparse.Namespace` of the flags, plus `dataset` and `accumulation`.
    """
    from keras_vit.recipes import FINETUNE_SETUPS

    setup = FINETUNE_SETUPS[dataset]
    parser = _parser(dataset, setup)
    args = parser.parse_args(argv)
    args.dataset = dataset
    if args.naflex and args.distribute != "none":  # a clash of flags, on any backend: named before the backend's
        parser.error("--naflex feeds one process (its batches are not sharded): leave out --distribute")
    _check_distribution(parser, args)
    _check_schedule(parser, args, setup)
    _apply_recipe(parser, args, setup)
    if args.weights is None:  # a JSON --model names no variant: its registry tag is found from its architecture
        args.weights = default_tag(args.model, PRETRAINED_TAGS) if args.model in VARIANTS else PRETRAINED_TAGS[0]
    args.weights = none_or(args.weights)
    return args


def _parser(dataset, setup):
    """The recipe's argument parser for `dataset`, whose Table 4 setup is `setup`."""
    parser = argparse.ArgumentParser(
        description=f"Fine-tune a ViT on {dataset} with the paper's recipe (Table 4: "
        f"{setup.total_steps} steps, batch {setup.batch_size}, lr grid {list(setup.base_lrs)}).")
    _add_model_arguments(parser, setup)
    _add_schedule_arguments(parser, setup)
    _add_folder_arguments(parser, dataset)
    _add_device_arguments(parser)
    _add_training_arguments(parser)
    return parser


def _add_model_arguments(parser, setup):
    """What is fine-tuned: --model, --weights, --image-size."""
    parser.add_argument("--model", default="ViT_B16",
                        help="factory name (ViT_B16, ViT_L16, R50_ViT_B16, ...) or a JSON object "
                        "of VisionTransformer arguments (default: ViT_B16)")
    parser.add_argument("--weights", default=None,
                        help="registry tag, .npz/.weights.h5 path, or 'none' (default: the variant's ImageNet-21k "
                        f"pre-trained release, {' else '.join(PRETRAINED_TAGS)})")
    parser.add_argument("--image-size", type=_positive_int, default=setup.image_size,
                        help=f"training and test resolution (default: {setup.image_size}); with --naflex the grid "
                        "the position embeddings are laid out for")
    parser.add_argument("--naflex", type=_positive_int, default=None, metavar="TOKENS",
                        help="fine-tune a NaFlex model: each image at its own aspect ratio, resized to fit TOKENS "
                        "patches and fed as patches with their coordinates (keras_vit.data.naflex_feed); model.keras "
                        "then takes {'patches', 'patch_coord', 'patch_valid'}; one process, not with "
                        "--distribute (default: square images)")


def _add_schedule_arguments(parser, setup):
    """The batches, updates, learning rate and evaluations: --batch-size to --validate."""
    parser.add_argument("--batch-size", type=_positive_int, default=setup.batch_size,
                        help=f"images per update (default: {setup.batch_size})")
    parser.add_argument("--device-batch-size", type=_positive_int, default=None,
                        help="images per device (per replica) and train step; gradients of "
                        "batch-size/(device-batch-size x replicas) steps are accumulated "
                        "(default: the batch size split over the replicas, no accumulation)")
    parser.add_argument("--steps", type=_positive_int, default=setup.total_steps,
                        help=f"optimizer updates (default: {setup.total_steps})")
    parser.add_argument("--lr", type=_positive_float, default=None,
                        help=f"base learning rate (default: {setup.default_lr}, the paper's sweeps "
                        f"{list(setup.base_lrs)}; with --recipe the preset's, scaled to --batch-size where it is)")
    parser.add_argument("--warmup-steps", type=_non_negative_int, default=None,
                        help=f"linear warm-up updates (default: {setup.warmup_steps}, at most --steps)")
    parser.add_argument("--eval-every", type=_positive_int, default=None,
                        help="updates per Keras epoch: the curve points and backups "
                        "(default: a tenth of --steps when it divides evenly)")
    parser.add_argument("--validate", action="store_true",
                        help="also evaluate on the test split after every epoch (curves)")


def _add_folder_arguments(parser, dataset):
    """Where the data is read and the run written: --data-dir, --output-dir, --overwrite."""
    parser.add_argument("--data-dir", default=None, help="TFDS data folder (already downloaded data)")
    parser.add_argument("--output-dir", default=os.path.join("runs", f"finetune_{dataset}"),
                        help=f"output folder (default: runs/finetune_{dataset})")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace an output folder holding another run of these examples")


def _add_device_arguments(parser):
    """How the devices run it: --distribute, --mesh, --steps-per-execution, --input-dtype."""
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


def _add_training_arguments(parser):
    """The rest of the training: --ema, --layer-decay, --remat, --seed, --shuffle-buffer, --verbose."""
    parser.add_argument("--recipe", default=None, metavar="NAME",
                        help="a training recipe by name (keras_vit.recipes.presets): paper (default: Table 4's), "
                        "deit, deit3 or augreg, each its optimizer, weight decay, clipping, loss, stochastic depth, "
                        "dropout, MixUp/CutMix, RandAugment, random erasing and repeats (docs/finetuning.md)")
    parser.add_argument("--ema", action="store_true", help="Polyak averaging of the weights (0.9999)")
    parser.add_argument("--layer-decay", type=_positive_float, default=None, metavar="DECAY",
                        help="layer-wise learning-rate decay in (0, 1], e.g. 0.75: block i of L learns at "
                        "DECAY**(L-i) times the rate, the head at the full rate (default: off, as in the paper)")
    parser.add_argument("--remat", action="store_true",
                        help="recompute each encoder block in the backward pass: far less memory per "
                        "image (TensorFlow, torch, GPUs) for about 15%% more time")
    parser.add_argument("--seed", type=int, default=0, help="seed of the init, data order and "
                        "augmentation (default: 0)")
    parser.add_argument("--shuffle-buffer", type=_positive_int, default=10_000,
                        help="shuffle buffer of encoded images (default: 10000)")
    parser.add_argument("--verbose", type=int, choices=(0, 1, 2), default=1,
                        help="Keras verbosity: 1 progress bars (default), 2 a line an epoch, 0 none")


def _check_distribution(parser, args):
    """Exits with a usage error where --distribute and --mesh do not fit the backend or the processes;
    --mesh written as BxM."""
    import keras

    from keras_vit import distribute

    if args.distribute == "model" and keras.backend.backend() != "jax":
        parser.error(f"--distribute model runs on the jax backend (Keras ModelParallel); this is "
                     f"{keras.backend.backend()!r}: use --distribute data"
                     + (" on the jax or tensorflow backend" if keras.backend.backend() == "torch" else ""))
    if args.distribute == "data" and keras.backend.backend() == "torch":
        parser.error(f"--distribute data covers the jax and tensorflow backends; Keras {keras.__version__} has "
                     "no distribution for 'torch' (fit trains on one device there): set KERAS_BACKEND=jax or "
                     "tensorflow")
    processes = several_processes()
    if processes and args.distribute == "none":
        from keras_vit.distribute import launchers

        told = launchers.SAID[launchers.detect().launcher]
        parser.error(f"this is one of {processes} processes ({told}); "
                     "pass --distribute data so that they train one model together, each on its rows of "
                     "every global batch")
    if processes and args.distribute == "model":
        parser.error(f"--distribute model over {processes} processes: the saved model and backups need every "
                     "process's shards of the variables, which this recipe does not gather; use --distribute data "
                     "(or keras_vit.distribute.model_parallel() in your own script)")
    if args.mesh is not None:
        if args.distribute != "model":
            parser.error(f"--mesh goes with --distribute model, got --distribute {args.distribute}")
        try:
            args.mesh = "x".join(map(str, distribute.parse_mesh(args.mesh)))
        except ValueError as e:
            parser.error(f"--mesh: {e}")


def _check_schedule(parser, args, setup):
    """Exits with a usage error where --layer-decay, --steps, --eval-every, --warmup-steps or the batch
    sizes do not fit together; fills in --warmup-steps, --eval-every and args.accumulation."""
    if args.layer_decay is not None and args.layer_decay > 1:
        parser.error(f"--layer-decay must be in (0, 1] (1 is no decay), got {args.layer_decay}")
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


def _apply_recipe(parser, args, setup):
    """Fills the flags of --recipe's preset (`presets.apply`; a paper run is recorded as before, recipe None)
    and --lr's default: Table 4's for the paper's recipe, else the preset's rate at --batch-size."""
    from keras_vit.recipes import presets

    try:
        said = presets.apply(args)
    except ValueError as e:
        parser.error(str(e))
    if args.recipe == presets.DEFAULT:
        args.recipe = None
        args.lr = setup.default_lr if args.lr is None else args.lr
    elif args.naflex and (args.mixup or args.cutmix or args.aa or args.reprob or args.aug_repeats):
        parser.error(f"--recipe {args.recipe} augments square images (MixUp, RandAugment, repeats): not with --naflex")
    args.lr = presets.scaled_lr(args, args.batch_size)
    if said and args.recipe:  # the paper's --lr is Table 4's here, not the folder command's 0.01
        print(said, flush=True)


def run_flags(args):
    """The flags that define a run (a resumed run must repeat them)."""
    keys = ("dataset", "model", "weights", "image_size", "batch_size", "device_batch_size",
            "steps", "lr", "warmup_steps", "eval_every", "ema", "layer_decay", "seed", "shuffle_buffer",
            "validate", "distribute", "mesh", "input_dtype", "naflex", "recipe")
    return {k: getattr(args, k) for k in keys}
