"""`keras-vit --help`, `list` and argument errors start without a backend; model commands are quiet.

Each case runs in a fresh interpreter: what a command imports is only visible there."""

import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

ROOT = pathlib.Path(__file__).parents[1]
BACKENDS = ("keras", "tensorflow", "jax", "torch")

PROBE = """
import contextlib, io, json, sys
from keras_vit import cli
out, err = io.StringIO(), io.StringIO()
with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
    try:
        code = cli.main(sys.argv[1:])
    except SystemExit as e:
        code = e.code
print(json.dumps({"code": code, "out": out.getvalue(), "err": err.getvalue(),
                  "imported": sorted(m for m in %r if m in sys.modules)}))
""" % (BACKENDS,)


def _run(*argv, backend="tensorflow"):
    env = dict(os.environ, PYTHONPATH=str(ROOT), KERAS_BACKEND=backend)
    done = subprocess.run([sys.executable, "-c", PROBE, *argv], env=env, capture_output=True, text=True,
                          timeout=300, check=True)
    return json.loads(done.stdout.splitlines()[-1]), done.stderr


@pytest.mark.backend_independent
@pytest.mark.parametrize("argv,code,expected", [
    (["--help"], 0, "usage: keras-vit"),
    (["list"], 0, "ViT_Ti16"),
    (["list", "--variant", "ViT_Ti16"], 0, "augreg-imagenet21k"),
    (["predict"], 2, "the following arguments are required: IMAGE"),
    (["predict", "x.png", "--top", "many"], 2, "invalid int value: 'many'"),
])
def test_help_list_and_argument_errors_import_no_backend(argv, code, expected):
    result, stderr = _run(*argv)
    assert result["code"] == code
    assert expected in result["out"] + result["err"]
    assert result["imported"] == [], f"keras-vit {' '.join(argv)} imported {result['imported']}"
    assert stderr == ""


@pytest.mark.backend_independent
def test_a_model_command_prints_no_framework_logs(tmp_path):
    image = tmp_path / "image.png"
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (40, 40, 3), dtype=np.uint8)).save(image)
    env = dict(os.environ, PYTHONPATH=str(ROOT), KERAS_BACKEND="tensorflow")
    env.pop("TF_CPP_MIN_LOG_LEVEL", None)
    argv = [sys.executable, "-m", "keras_vit.cli", "predict", str(image), "--model", "ViT_Ti16", "--weights", "none",
            "--image-size", "32", "--top", "2"]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0] == str(image) and len(done.stdout.splitlines()) == 3
    assert done.stderr == ""


def test_a_saved_model_reloads_when_keras_is_imported_after_keras_vit(tmp_path):
    """The package loads its Keras parts lazily; importing Keras afterwards must still register the
    layers, so `import keras_vit; import keras; keras.saving.load_model(...)` works."""
    from conftest import TINY

    import keras_vit

    path = tmp_path / "tiny.keras"
    keras_vit.VisionTransformer(**TINY).save(path)
    script = ("import keras_vit\nimport keras\nimport sys\n"
              "print(keras.saving.load_model(sys.argv[1], safe_mode=True).output_shape)")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    done = subprocess.run([sys.executable, "-c", script, str(path)], env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "(None, 10)"
