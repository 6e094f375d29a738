"""Quiet starts (issue 47): `import keras_vit` imports Keras with TensorFlow's start-up notes held back
(`keras_vit.startup`), so every entry point starts without them."""

import os
import pathlib
import subprocess
import sys

import pytest

from conftest import once_on_tensorflow
from keras_vit.startup import DEFAULT_LEVEL, filter_start_lines, import_quietly, start_log_level

ROOT = pathlib.Path(__file__).parents[1]
# what TensorFlow 2.21 printed to stderr when imported here (twice: once per library it loads), with a
# warning, an error and a Python warning of our own between its notes
NOTES = (b"WARNING: All log messages before absl::InitializeLog() is called are written to STDERR\n"
         b"I0000 00:00:1795690777.489341    5342 port.cc:153] oneDNN custom operations are on.\n"
         b"I0000 00:00:1795690777.570841    5342 cpu_feature_guard.cc:227] This TensorFlow binary is optimized.\n"
         b"To enable the following instructions: AVX2 FMA, in other operations, rebuild TensorFlow.\n")
WARNING = b"W0000 00:00:1795690777.6 5342 tensorrt.cc:31] TF-TRT Warning: Could not find TensorRT\n"
ERROR = b"E0000 00:00:1795690777.7 5342 cuda_dnn.cc:8] Unable to register cuDNN factory\n"
PYTHON = b"/x/y.py:12: UserWarning: a warning of Python's\n  warnings.warn(\n"


@pytest.mark.backend_independent
def test_the_notes_below_the_level_are_held_back_and_every_other_line_kept():
    captured = b"a line of our own\n" + NOTES + PYTHON + WARNING + NOTES + ERROR
    assert filter_start_lines(captured, 0) == captured
    assert filter_start_lines(captured, 1) == b"a line of our own\n" + PYTHON + WARNING + ERROR
    assert filter_start_lines(captured, 2) == b"a line of our own\n" + PYTHON + ERROR
    assert filter_start_lines(captured, 3) == b"a line of our own\n" + PYTHON
    assert filter_start_lines(NOTES + NOTES, DEFAULT_LEVEL) == b""
    assert [start_log_level(e) for e in ({}, {"TF_CPP_MIN_LOG_LEVEL": "0"}, {"TF_CPP_MIN_LOG_LEVEL": "2"},
                                         {"TF_CPP_MIN_LOG_LEVEL": "x"})] == [DEFAULT_LEVEL, 0, 2, DEFAULT_LEVEL]


@pytest.mark.backend_independent
def test_a_module_imported_quietly_keeps_only_what_passes(tmp_path, monkeypatch, capfd):
    """What a module writes to file descriptor 2 while it is imported (as TensorFlow's C++ does) comes out once
    it is imported, less the notes; all of it when the import fails."""
    written = NOTES + WARNING + b"a line of the module\n"
    (tmp_path / "noisy_probe.py").write_text(f"import os\nos.write(2, {written!r})\n")
    (tmp_path / "failing_probe.py").write_text(f"import os\nos.write(2, {NOTES!r})\nraise ImportError('broken')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delenv("TF_CPP_MIN_LOG_LEVEL", raising=False)
    assert import_quietly("noisy_probe").__name__ == "noisy_probe"
    assert capfd.readouterr().err == (WARNING + b"a line of the module\n").decode()
    with pytest.raises(ImportError, match="broken"):
        import_quietly("failing_probe")
    assert capfd.readouterr().err == NOTES.decode()
    sys.modules.pop("noisy_probe")


@once_on_tensorflow("JAX and torch print nothing when imported; TensorFlow's notes are what is held back")
def test_launch_help_starts_quietly():
    """`python -m keras_vit.launch --help` (the issue's 16 lines on TensorFlow): its usage, nothing on stderr."""
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    done = subprocess.run([sys.executable, "-m", "keras_vit.launch", "--help"], env=dict(env, PYTHONPATH=str(ROOT)),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.startswith("usage: python -m keras_vit.launch"), done.stderr[-2000:]
    assert done.stderr == ""


def test_what_a_model_outputs_is_read_without_tensorflow_on_jax():
    """`keras_vit.structure.output_kind` (which `keras-vit predict` and the exports ask) reads the head's
    activation function: serializing it (`get_config`) imported TensorFlow into every jax or torch process."""
    import keras

    if keras.backend.backend() != "jax":
        pytest.skip("the fact is a process of a backend other than TensorFlow's; jax starts one fastest")
    code = ("import sys, keras_vit\nfrom keras_vit.structure import output_kind\n"
            "tiny = dict(image_size=16, patch_size=8, hidden_size=8, mlp_dim=8, num_heads=1, num_layers=1, classes=3)\n"
            "kinds = [output_kind(keras_vit.VisionTransformer(**tiny, classifier_activation=a)) for a in "
            "('softmax', 'sigmoid')]\nprint(*kinds, 'tensorflow' in sys.modules)\n")
    done = subprocess.run([sys.executable, "-c", code], env=dict(os.environ, PYTHONPATH=str(ROOT)),
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["probabilities", "scores", "False"], done.stdout
