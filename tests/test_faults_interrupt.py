"""Ctrl-C in a script (issue 47 item 2): the examples and the benchmarks end through `keras_vit.startup.run_main`
as `keras-vit` does, in one line, exit status 130, no traceback. (`keras-vit finetune`'s is in
test_cli_subprocess.py.)"""

import os
import pathlib
import sys
import time

import pytest
from conftest import ctrl_c, from_a_terminal

from keras_vit.startup import INTERRUPTED

ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.mark.one_backend  # the handling of SIGINT, the same on every backend
def test_ctrl_c_in_a_benchmark_says_one_line_and_exits_130():
    """SIGINT sent as a terminal sends it, while the benchmark measures (its first line printed): the child
    gets Python's handler back (a background job of a non-interactive shell, as CI's, inherits SIGINT ignored)."""
    argv = [sys.executable, "benchmarks/guarded_calls.py", "--images", "4", "--batch-size", "2", "--repeats", "100000"]
    with from_a_terminal(argv, cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT))) as child:
        first = child.stdout.readline()  # the model is built: the measuring has begun
        assert first.startswith("ViT_Ti16 at "), (first, child.stderr.read() if child.poll() is not None else "")
        time.sleep(1)
        err = ctrl_c(child)
    assert child.returncode == 130, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    assert err.strip().splitlines()[-1] == f"guarded_calls.py: interrupted: {INTERRUPTED}"


@pytest.mark.backend_independent
def test_ctrl_c_during_convert_keeps_the_file_there_and_says_so(tmp_path, monkeypatch, capsys):
    """Interrupted while model.save writes: the .keras file that was there is kept whole, no temporary is left
    beside it, and the one line says so."""
    import keras
    from conftest import TINY

    import keras_vit
    from keras_vit import cli
    from keras_vit.weights.keras_hub_save import save_keras_hub_preset

    save_keras_hub_preset(keras_vit.VisionTransformer(**TINY, approximate_gelu=False), tmp_path / "preset")
    out = tmp_path / "out" / "vit.keras"
    out.parent.mkdir()
    out.write_bytes(b"the model converted yesterday")

    def interrupted_save(self, path, *args, **kwargs):  # half a file, then Ctrl-C
        with open(path, "wb") as f:
            f.write(b"PK\x03\x04 half")
        raise KeyboardInterrupt

    monkeypatch.setattr(keras.Model, "save", interrupted_save)
    assert cli.main(["convert", str(tmp_path / "preset"), str(out)]) == 130
    assert capsys.readouterr().err.strip().splitlines() == [
        f"keras-vit convert: interrupted: nothing new was written to {out} (written whole beside it, then moved "
        "into place): the same command again starts over"]
    assert os.listdir(out.parent) == ["vit.keras"] and out.read_bytes() == b"the model converted yesterday"


@pytest.mark.backend_independent
def test_the_gpu_sessions_scripts_end_on_ctrl_c_as_run_main_does(capsys, monkeypatch):
    """benchmarks/gpu.py and gpu_workers.py start before Keras is installed, so they end through their own
    `run_script`: one line, exit status 130, no traceback."""
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    monkeypatch.setattr(sys, "argv", ["gpu.py"])
    from gpu_workers import run_script

    def measuring():
        raise KeyboardInterrupt

    with pytest.raises(SystemExit) as ended:
        run_script(measuring)
    assert ended.value.code == 130
    err = capsys.readouterr().err
    assert err.splitlines() == ["gpu.py: interrupted: the rows written so far are kept; run the same command again"]
    assert run_script(lambda: 7) == 7


@pytest.mark.backend_independent
def test_a_ctrl_c_that_python_drops_still_stops_fit(monkeypatch):
    """SIGINT that arrives while a `__del__` runs (as it once arrived in JAX's garbage-collection callback in the
    middle of `keras-vit finetune`, which then trained on): Python drops that KeyboardInterrupt; under
    `watching_ctrl_c`, with Python's handler (a terminal's program has it; CI's lanes inherit SIGINT ignored),
    the press is kept, the drop not printed, and `StopOnCtrlC` raises it at the end of that batch, so fit stops
    there instead of running on; the handler and the hook are back after the block, the press forgotten."""
    import signal

    import keras
    import numpy as np

    from keras_vit import recipes, startup

    class Dropped:
        def __del__(self):
            signal.raise_signal(signal.SIGINT)
            for _ in range(1000):  # the handler runs at the next instruction of this thread: in here
                pass

    class PressDuringSecondBatch(keras.callbacks.Callback):
        batches = 0

        def on_train_batch_begin(self, batch, logs=None):
            self.batches += 1
            if self.batches == 2:
                Dropped()  # deleted at once: SIGINT lands in its __del__

    dropped = []  # what Python drops goes to sys.unraisablehook ("Exception ignored in ..." by default)
    monkeypatch.setattr(sys, "unraisablehook", lambda unraisable: dropped.append(unraisable.exc_type))
    hook = sys.unraisablehook
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    model.compile("sgd", "mse")
    counter = PressDuringSecondBatch()
    x, y = np.zeros((64, 3), "float32"), np.zeros((64, 2), "float32")
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt), startup.watching_ctrl_c():
            model.fit(x, y, batch_size=2, epochs=5, verbose=0, callbacks=[counter, recipes.StopOnCtrlC()])
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # its own handler gone
    finally:
        signal.signal(signal.SIGINT, previous)
    assert counter.batches == 2  # stopped in the batch it was pressed in, or at its end
    assert dropped == [] and sys.unraisablehook is hook and not startup.CTRL_C.is_set()  # dropped without a word


@pytest.mark.backend_independent
def test_an_error_raised_after_a_ctrl_c_ends_a_script_as_the_ctrl_c(capsys, monkeypatch):
    """C code that checks for signals can put back the error it was handling in the KeyboardInterrupt's place
    (numpy's fallback for an `__array__` without `copy`): under `run_main` an error raised after a press ends
    the script as Ctrl-C does; without a press the error is the error."""
    import signal

    from keras_vit import startup

    def pressed_then_replaced():
        try:
            signal.raise_signal(signal.SIGINT)
        except KeyboardInterrupt:
            pass  # dropped, as numpy drops it
        raise TypeError("Tensor.__array__() got an unexpected keyword argument 'copy'")

    def failing():
        raise TypeError("a real error")

    monkeypatch.setattr(sys, "argv", ["demo.py"])
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)  # a terminal's; CI's lanes ignore SIGINT
    try:
        with pytest.raises(SystemExit) as ended:
            startup.run_main(pressed_then_replaced)
        with pytest.raises(TypeError, match="a real error"):
            startup.run_main(failing)
    finally:
        signal.signal(signal.SIGINT, previous)
    assert ended.value.code == 130
    assert capsys.readouterr().err.splitlines() == [f"demo.py: interrupted: {INTERRUPTED}"]
    assert not startup.CTRL_C.is_set()
