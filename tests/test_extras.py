"""A missing optional package (issue 47): every feature that needs one refuses in one line naming the package
and the extra that installs it, before anything is built (`keras_vit.extras`); `keras-vit` exits with 1.

A package is made missing as on a machine without it: its entry in sys.modules set to None, so that
`importlib.util.find_spec` finds nothing and `import` raises ModuleNotFoundError."""

import os
import pathlib
import re
import subprocess
import sys

import keras
import numpy as np
import pytest

from keras_vit import cli, data
from keras_vit.export import check_format, run
from keras_vit.extras import FEATURES, PACKAGES, MissingPackageError, require, require_or_exit
from keras_vit.weights.tensors import read_torch

ROOT = pathlib.Path(__file__).parents[1]
BACKEND = keras.backend.backend()
# the module each backend's own ONNX exporter needs
ONNX_WRITER = {"jax": "jax2onnx", "tensorflow": "tf2onnx", "torch": "onnxscript"}
# what keras-vit export prints when the backend's ONNX exporter is missing
EXPORT_LINE = (f"keras-vit export: error: writing onnx from the {BACKEND} backend needs {ONNX_WRITER[BACKEND]}, "
               'which is not installed: pip install "keras-vit[export]"')
ONE_LINE = r'^[^\n]+ needs [\w-]+(?: and [\w-]+)*, which (?:is|are) not installed: pip install "keras-vit\[[\w,]+\]"'


def hide(monkeypatch, *modules):
    for name in modules:
        monkeypatch.setitem(sys.modules, name, None)


@pytest.mark.backend_independent
def test_the_table_names_packages_and_extras_that_exist():
    project = (ROOT / "pyproject.toml").read_text()
    for module, (package, extra) in PACKAGES.items():
        listed = re.search(rf"^{extra} = \[(.*?)\]$", project, re.M | re.S)
        assert listed and f'"{package}' in listed.group(1), f"{module}: {package} is not in the {extra!r} extra"
    assert {m for modules, _ in FEATURES.values() for m in modules} <= set(PACKAGES)


@pytest.mark.backend_independent
def test_require_says_which_package_and_which_extra(monkeypatch):
    require("writing onnx from the jax backend")  # all installed here: nothing raised
    hide(monkeypatch, "jax2onnx", "onnxruntime")
    with pytest.raises(MissingPackageError) as caught:
        require("writing onnx from the jax backend")
    assert isinstance(caught.value, ModuleNotFoundError) and caught.value.name == "jax2onnx"
    assert str(caught.value) == ('writing onnx from the jax backend needs jax2onnx and onnxruntime, which are not '
                                 'installed: pip install "keras-vit[export]"')
    hide(monkeypatch, "tensorflow_datasets", "torch")
    with pytest.raises(MissingPackageError, match=ONE_LINE + r" \(or convert it to .safetensors.*\)$"):
        require("reading a .pth or .bin checkpoint")
    with pytest.raises(SystemExit) as stopped:  # a script's main: the line, exit status 1
        require_or_exit("reading a TFDS dataset (keras_vit.data)")
    assert stopped.value.code == ('error: reading a TFDS dataset (keras_vit.data) needs tensorflow-datasets, which is '
                                  'not installed: pip install "keras-vit[tensorflow]"')


@pytest.mark.backend_independent
def test_public_functions_refuse_before_they_build(monkeypatch, tmp_path):
    """check_format (export's first step), run, read_torch, keras_vit.data and the fine-tuning recipe."""
    for backend, module in ONNX_WRITER.items():
        with monkeypatch.context() as m:
            hide(m, module)
            with pytest.raises(MissingPackageError, match=ONE_LINE.replace("[^\\n]+", f"writing onnx from the "
                                                                           f"{backend} backend") + "$"):
                check_format(backend, "onnx")
    with monkeypatch.context() as m:
        hide(m, "tensorflow", "onnxruntime", "ai_edge_litert")
        with pytest.raises(MissingPackageError, match=ONE_LINE):
            check_format("jax", "tf_saved_model")
        for format in ("tf_saved_model", "onnx", "litert"):
            with pytest.raises(MissingPackageError, match=f"^running {format} artefacts needs"):
                run(tmp_path / "missing", format, np.zeros((1, 8, 8, 3), np.uint8))
    with monkeypatch.context() as m:
        hide(m, "torch")
        with pytest.raises(MissingPackageError, match=r"^reading .*m\.pth needs torch"):
            read_torch(str(tmp_path / "m.pth"))
    hide(monkeypatch, "tensorflow_datasets")
    with pytest.raises(MissingPackageError, match=r'needs tensorflow-datasets, .*"keras-vit\[tensorflow\]"'):
        data.dataset_info("cifar10")
    from keras_vit.recipes.finetune import main

    out = tmp_path / "run"
    with pytest.raises(SystemExit, match="^error: reading a TFDS dataset"):
        main("cifar10", ["--output-dir", str(out), "--steps", "1"])
    assert not out.exists()


def test_the_cli_refuses_in_one_line_with_status_1(monkeypatch, capsys, tmp_path):
    argv = ["export", "--weights", str(tmp_path / "m.keras"), "--format", "onnx", "--out", str(tmp_path / "out")]
    hide(monkeypatch, ONNX_WRITER[BACKEND])
    assert cli.main(argv) == 1
    assert capsys.readouterr().err == EXPORT_LINE + "\n"
    hide(monkeypatch, "ai_edge_litert")  # the runtime export checks its artefact in: refused before building too
    assert cli.main([*argv[:4], "litert", *argv[5:]]) == 1
    assert "running litert artefacts needs ai-edge-litert" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_a_fresh_interpreter_without_the_exporter_prints_one_line():
    """`python -m keras_vit.cli export ... --format onnx` where the backend's ONNX exporter is not installed:
    one line on stderr (no traceback, no TensorFlow start-up notes), exit status 1."""
    script = (f"import runpy, sys\nsys.modules[{ONNX_WRITER[BACKEND]!r}] = None\n"
              "sys.argv = ['keras-vit', 'export', '--weights', 'm.keras', '--format', 'onnx', '--out', 'out']\n"
              "runpy.run_module('keras_vit.cli', run_name='__main__')\n")
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    done = subprocess.run([sys.executable, "-c", script], env=dict(env, PYTHONPATH=str(ROOT)), capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 1, done.stderr[-2000:]
    assert done.stderr.splitlines() == [EXPORT_LINE]
