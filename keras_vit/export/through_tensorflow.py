"""What a backend's own exporters cannot write (THROUGH_TENSORFLOW): the model saved as `.keras` and written
by the TensorFlow backend in a fresh process, `python -m keras_vit.export`, whose side is `_main`."""

import os
import subprocess
import sys
import tempfile

from keras_vit.configs import pair
from keras_vit.export.formats import FORMATS
from keras_vit.export.inputs import SERVED_INPUTS
from keras_vit.export.writers import _write


def _through_tensorflow(model, path, format, top_k, batch_size, input_mode, served):
    """Writes the artefact at `path` from the TensorFlow backend: `model` saved as `.keras`, then loaded
    (safe mode) and exported by `python -m keras_vit.export` in a fresh process, on the CPU (a GPU
    stays with the calling process), behind the input `served` (a `keras_vit.export.inputs.ServedInput`,
    passed on by its name and `resize_to`). Raises RuntimeError with the child's last error line."""
    resize_to = served.resize_to
    with tempfile.TemporaryDirectory(prefix="keras_vit_export.") as folder:
        saved = os.path.join(folder, "model.keras")
        model.save(saved)
        command = [sys.executable, "-m", "keras_vit.export", saved, path, format, "--served", served.name]
        command += [] if top_k is None else ["--top-k", str(top_k)]
        command += [] if batch_size is None else ["--batch-size", str(batch_size)]
        command += ["--input-mode", input_mode]
        command += [] if resize_to is None else ["--resize-to", *map(str, pair(resize_to, "resize_to"))]
        env = dict(os.environ, KERAS_BACKEND="tensorflow", CUDA_VISIBLE_DEVICES="", TF_CPP_MIN_LOG_LEVEL="3")
        done = subprocess.run(command, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        lines = [line for line in done.stderr.strip().splitlines() if line.strip()]
        raise RuntimeError(f"writing {format} from the TensorFlow backend, in a fresh process that reloads the model "
                           f"from .keras, failed (exit {done.returncode}): "
                           f"{lines[-1] if lines else 'no message'}")


def _main(argv=None):
    """`python -m keras_vit.export MODEL.keras PATH FORMAT [--served NAME] [--top-k K] [--batch-size N]
    [--input-mode M] [--resize-to H W]`: writes the artefact of a saved model from the running backend,
    behind the input of SERVED_INPUTS that NAME names (`_through_tensorflow` runs it)."""
    import argparse

    p = argparse.ArgumentParser(prog="python -m keras_vit.export")
    p.add_argument("model")
    p.add_argument("path")
    p.add_argument("format", choices=FORMATS)
    p.add_argument("--served", choices=sorted(SERVED_INPUTS), default="fixed")
    p.add_argument("--top-k", type=int, default=None)
    p.add_argument("--batch-size", type=int, default=None)
    p.add_argument("--input-mode", default="vit")
    p.add_argument("--resize-to", type=int, nargs=2, default=None)
    args = p.parse_args(argv)
    import keras

    import keras_vit  # noqa: F401  (registers the package's layers for safe-mode loading)

    _write(keras.saving.load_model(args.model), args.path, args.format, args.top_k, args.batch_size, args.input_mode,
           SERVED_INPUTS[args.served](args.resize_to))
