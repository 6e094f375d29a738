"""`keras-vit` as a user runs it: the commands in a fresh interpreter (its first import is the CLI's), on
real files; the finetune command's Ctrl-C in a process of its own. `keras-vit convert` is in test_foreign.py,
beside the timm files it converts."""

import json
import os
import pathlib
import re
import subprocess
import sys
import time

import numpy as np
import pytest
import skimage.data
from PIL import Image

import keras_vit
from conftest import TINY, TINY_WIDTHS, backend, tiny_variant
from keras_vit.inspection import FIGURE_NAMES
from keras_vit.preprocessing import decode_predictions, load_image, preprocess_input
from keras_vit.weights import save_npz

ROOT = pathlib.Path(__file__).parents[1]
SUBCOMMANDS = ("predict", "list", "inspect", "convert", "export")


# ViT_Ti16 is built at TINY's depth and widths, here and in the commands' process (which sets it after its first
# import, the CLI's): the fact is each command's plumbing by a released model's name, not its 12 layers, whose
# builds and compiles were most of the commands' time
@pytest.fixture(scope="module", autouse=True)
def _tiny_ti16():
    with pytest.MonkeyPatch.context() as monkeypatch:
        tiny_variant(monkeypatch)
        yield


@pytest.fixture(scope="module")
def ti16_npz(tmp_path_factory):
    """A ViT-Ti/16 (TINY's widths) with a random non-zero head, in the official layout."""
    model = keras_vit.ViT_Ti16()
    head = model.get_layer("head")
    head.kernel.assign(np.random.default_rng(0).normal(scale=0.5, size=head.kernel.shape))
    return save_npz(model, tmp_path_factory.mktemp("w") / "ti16.npz")


@pytest.fixture(scope="module")
def photo(tmp_path_factory):
    path = tmp_path_factory.mktemp("img") / "coffee.png"
    Image.fromarray(skimage.data.coffee()).save(path)
    return path


# One fresh interpreter runs several commands in turn, as `python -m keras_vit.cli` runs one (the CLI's import
# first; each command's exit status is `main`'s, or the SystemExit's argparse raises), each command's stdout and
# stderr ended by a line END: a process start (importing Keras and its backend) is most of a command's time here.
END = "-- end of command --"
COMMANDS = f"""
import dataclasses, json, sys
from keras_vit import cli
from keras_vit.configs import VARIANTS
VARIANTS["ViT_Ti16"] = dataclasses.replace(VARIANTS["ViT_Ti16"], **json.loads(sys.argv[2]))
codes = []
for argv in json.loads(sys.argv[1]):
    try:
        codes.append(cli.main(argv))
    except SystemExit as exit:
        codes.append(exit.code)
    for stream in (sys.stdout, sys.stderr):
        print({END!r}, file=stream, flush=True)
print(json.dumps(codes))
"""


@pytest.fixture(scope="module")
def commands(ti16_npz, photo, tmp_path_factory):
    """{name: (exit status, stdout, stderr)} of the commands run one after another in one fresh interpreter:
    predict first (its stderr then holds the imports' too), inspect, export, list, every --help, a bad argument."""
    tmp = tmp_path_factory.mktemp("commands")
    model = tmp / "tiny.keras"
    keras_vit.VisionTransformer(**TINY).save(model)
    runs = {"predict": ["predict", photo, "--model", "ViT_Ti16", "--weights", ti16_npz, "--image-size", 64, "--top", 3],
            "inspect": ["inspect", "--model", "ViT_Ti16", "--weights", ti16_npz, "--image", photo, "--image-size", 64,
                        "--out", tmp / "figures"],
            "export": ["export", "--weights", model, "--format", "onnx" if backend() == "torch" else "tf_saved_model",
                       "--out", tmp / "served", "--batch-size", 2],
            "list": ["list", "--variant", "ViT_Ti16"],
            "--help": ["--help"], **{f"{sub} --help": [sub, "--help"] for sub in SUBCOMMANDS},
            "bad": ["predict", "x.png", "--top", "many"]}
    argv = json.dumps([[str(a) for a in v] for v in runs.values()])
    done = subprocess.run([sys.executable, "-c", COMMANDS, argv, json.dumps(TINY_WIDTHS)],
                          env=dict(os.environ, PYTHONPATH=str(ROOT)), capture_output=True, text=True, timeout=400)
    assert done.returncode == 0, done.stderr[-3000:]
    *outs, last = done.stdout.split(END + "\n")
    errs = done.stderr.split(END + "\n")[:-1]
    codes = json.loads(last)
    assert len(outs) == len(errs) == len(codes) == len(runs), (done.stdout[-3000:], done.stderr[-3000:])
    return {"tmp": tmp, **{name: r for name, r in zip(runs, zip(codes, outs, errs))}}


@pytest.mark.backend_independent
@pytest.mark.timeout(600)  # the first test of the torch runs: it waits for every command of the fixture
def test_help_of_every_subcommand_and_argument_errors(commands):
    for name in ("--help", *(f"{sub} --help" for sub in SUBCOMMANDS)):
        code, out, err = commands[name]
        assert code == 0, (name, code, err[-2000:])
        assert out.count("usage: keras-vit") == 1, name
    assert all(f"usage: keras-vit {sub}" in commands[f"{sub} --help"][1] for sub in SUBCOMMANDS)
    code, _, err = commands["bad"]
    assert code == 2 and "invalid int value: 'many'" in err


@pytest.mark.backend_independent
def test_list(commands):
    code, out, err = commands["list"]
    assert code == 0, err[-2000:]
    assert "augreg-imagenet21k" in out and all(name in out for name in keras_vit.VARIANTS)


@pytest.mark.timeout(600)  # the first test of the tensorflow and jax runs: it waits for every command of the fixture
def test_predict_prints_the_models_top_classes_and_nothing_on_stderr(ti16_npz, photo, commands):
    code, out, err = commands["predict"]
    assert code == 0, err[-3000:]
    model = keras_vit.ViT_Ti16(weights=ti16_npz, image_size=64)
    expected = decode_predictions(model.predict(preprocess_input(load_image(photo, 64)[None]), verbose=0), top=3)[0]
    lines = out.splitlines()
    assert lines[0] == str(photo) and len(lines) == 4
    assert [re.search(r"\((\w+)\)$", line).group(1) for line in lines[1:]] == [synset for synset, _, _ in expected]
    if backend() == "jax":  # TensorFlow prints its own lines when it is imported
        assert err == ""  # the process's first command: the imports' lines too


def test_inspect_writes_the_four_figures(commands):
    code, _, err = commands["inspect"]
    out = commands["tmp"] / "figures"
    assert code == 0, err[-3000:]
    assert sorted(os.listdir(out)) == sorted(FIGURE_NAMES.values())
    for name in FIGURE_NAMES.values():
        with Image.open(out / name) as image:
            assert image.format == "PNG" and min(image.size) > 100


def test_export_writes_a_serving_artefact(commands):
    code, printed, err = commands["export"]
    out = commands["tmp"] / "served"
    assert code == 0, err[-3000:]
    assert str(out) in printed
    artefact = "model.onnx" if backend() == "torch" else "saved_model.pb"
    assert any(artefact in files for _, _, files in os.walk(out))


def test_a_saved_model_reloads_when_keras_is_imported_after_keras_vit(tmp_path):
    """`import keras_vit; import keras; keras.saving.load_model(...)` finds the registered layers."""
    path = tmp_path / "tiny.keras"
    model = keras_vit.VisionTransformer(**TINY)
    model.save(path)
    x = np.random.default_rng(0).uniform(-1, 1, (2, 32, 32, 3)).astype("float32")
    np.save(tmp_path / "x.npy", x)
    script = ("import keras_vit\nimport keras\nimport numpy as np\nimport sys\n"
              "m = keras.saving.load_model(sys.argv[1], safe_mode=True)\n"
              "np.save(sys.argv[3], m.predict(np.load(sys.argv[2]), verbose=0))\nprint(type(m).__name__)\n")
    done = subprocess.run([sys.executable, "-c", script, path, tmp_path / "x.npy", tmp_path / "y.npy"],
                          env=dict(os.environ, PYTHONPATH=str(ROOT)), capture_output=True, text=True, timeout=280)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "ViTModel"
    np.testing.assert_allclose(np.load(tmp_path / "y.npy"), model.predict(x, verbose=0), atol=1e-6, rtol=0)


@pytest.mark.one_backend  # the CLI's handling of SIGINT; the resume it advises is tested in test_finetune_folder.py
def test_ctrl_c_in_finetune_says_one_line_and_exits_130(start, tmp_path):
    """SIGINT sent as a terminal sends it (to a process that has Python's handler: a background job started by
    a non-interactive shell, as CI's lanes are, would otherwise inherit SIGINT ignored)."""
    from conftest import ctrl_c, from_a_terminal, photo_folder

    photos = photo_folder(tmp_path / "photos", per_class=4)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    argv = ["finetune", photos, "--weights", start, "--image-size", "32", "--epochs", "1000", "--validation-split",
            "0.5", "--out", tmp_path / "run", "--quiet"]
    with from_a_terminal([sys.executable, "-m", "keras_vit.cli", *map(str, argv)], env=env) as child:
        for line in child.stdout:  # training has begun once the schedule is said
            if line.startswith("batch "):
                break
        while not (tmp_path / "run" / "backup").exists():  # an epoch's backup written: something to resume
            assert child.poll() is None, child.stderr.read()
            time.sleep(0.2)
        err = ctrl_c(child)
    assert child.returncode == 130, err
    assert err.strip().splitlines() == [f"keras-vit finetune: interrupted: the same command with --resume continues "
                                        f"from the last epoch's backup in {tmp_path / 'run'}"]
    assert not (tmp_path / "run.lock").exists()  # the lock went with the run
