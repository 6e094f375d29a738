"""The `keras-vit` command: `predict`, `list`, `inspect`, `convert`, `export`, `finetune`.

`--weights X.keras` is the whole model the file holds (`model.save`, `keras-vit convert`): any
keras-vit model, any head, its class names (`model.class_names`) printed by `predict`.

`import keras_vit` imports Keras and its backend, so every command starts with it; the commands
that run a model keep the backend's later log lines (XLA, CUDA, absl) off the terminal unless
`--verbose`.

This module owns the parser of every sub-command and `main` (exit statuses, one-line errors, the quiet
backend); each sub-command is a module of this package (its arguments and its run): `predict`, `listing`
(`list`), `inspect`, `convert`, `export`, with what `predict`, `inspect` and `export` share in `model_args`;
`finetune`'s are `keras_vit.recipes.own_images` and `own_images_args`. `python -m keras_vit.cli` runs `main`.
"""

import argparse
import contextlib
import errno
import logging
import os
import sys

from keras_vit.cli import convert, export, inspect, listing, predict
from keras_vit.extras import FEATURES, MissingPackageError, require
from keras_vit.startup import interrupted, watching_ctrl_c

# The commands that build a model (their later backend logs are kept off the terminal).
MODEL_COMMANDS = ("predict", "inspect", "export", "finetune")


@contextlib.contextmanager
def quiet_backend():
    """TensorFlow, XLA and CUDA log from C++ straight to file descriptor 2 (absl's early messages ignore
    TF_CPP_MIN_LOG_LEVEL): while a command runs, descriptor 2 goes to /dev/null and Python's
    `sys.stderr` to a copy of the terminal, so our own messages and Python warnings still show."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    for name in ("absl", "tensorflow", "jax"):
        logging.getLogger(name).setLevel(logging.ERROR)
    if sys.stderr is not sys.__stderr__:  # already redirected (e.g. captured by a test runner)
        yield
        return
    sys.stderr.flush()
    terminal = os.dup(2)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)
    os.close(devnull)
    sys.stderr = os.fdopen(os.dup(terminal), "w", buffering=1)
    try:
        yield
    finally:
        sys.stderr.close()
        sys.stderr = sys.__stderr__
        os.dup2(terminal, 2)
        os.close(terminal)


def parser():
    """The argument parser of `keras-vit` (every sub-command)."""
    top = argparse.ArgumentParser(prog="keras-vit", description="Vision Transformer model zoo for Keras 3.")
    top.add_argument("--verbose", action="store_true",
                     help="show the backend's log messages (TensorFlow, XLA, CUDA), hidden by default")
    sub = top.add_subparsers(dest="command", required=True)

    from keras_vit.preprocessing import NORMALIZATIONS

    modes = tuple(NORMALIZATIONS)
    predict.add_parser(sub, modes)
    listing.add_parser(sub)
    inspect.add_parser(sub)
    convert.add_parser(sub)
    export.add_parser(sub, modes)
    from keras_vit.recipes import own_images

    own_images.add_parser(sub)
    return top


def main(argv=None):
    """`keras-vit ARGV` (default sys.argv[1:]); returns the exit status: 0, 1 when an optional package the
    command needs is not installed (one line naming it and its extra, before anything is built) or the disk
    is full (one line naming the file, the filesystem, the space needed and free), 2 for another error (one
    line), 130 on Ctrl-C."""
    args = parser().parse_args(argv)
    quiet = args.command in MODEL_COMMANDS and not args.verbose
    try:
        runtime = f"running {getattr(args, 'format', None)} artefacts"
        if args.command == "export" and runtime in FEATURES:  # export runs the artefact it writes
            require(runtime)
        with watching_ctrl_c(), quiet_backend() if quiet else contextlib.nullcontext():
            args.func(args)
    except MissingPackageError as err:
        print(f"keras-vit {args.command}: error: {err}", file=sys.stderr)
        return 1
    except (ValueError, FileNotFoundError, OSError) as err:
        print(f"keras-vit {args.command}: error: {err}", file=sys.stderr)
        return 1 if getattr(err, "errno", None) == errno.ENOSPC else 2
    except KeyboardInterrupt as err:  # Ctrl-C: one line, what was kept, a shell's exit status
        return interrupted(f"keras-vit {args.command}", str(err) or _kept(args))
    return 0


def _kept(args):
    """What a command interrupted by Ctrl-C kept and how to continue (a command that kept something to continue
    from, finetune, says it in its KeyboardInterrupt's message instead); None: `startup.INTERRUPTED`."""
    out = getattr(args, "out", None)
    if args.command == "predict":
        csv = "" if args.csv is None else f"; nothing was written to {args.csv} (written once every image is done)"
        return f"the top classes printed above are kept{csv}: the same command again classifies every image"
    if args.command == "export" and out and os.path.isdir(out):  # export refuses a folder already there
        return f"{out} was written whole; the check against Keras that follows it was cut short"
    if args.command in ("convert", "export") and out:
        return (f"nothing new was written to {out} (written whole beside it, then moved into place): the same "
                "command again starts over")
    return None
