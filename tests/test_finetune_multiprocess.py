"""`keras-vit finetune DIR` on several processes (keras_vit.recipes.own_images_processes), on the lane's
backend: 2 processes of one CPU device each (JAX's DataParallel, or TensorFlow's MultiWorkerMirroredStrategy),
started by a cluster's launcher on JAX (Open MPI's `mpiexec`, the `test` extra's; its ranks join through JAX)
and by the package's launcher on TensorFlow, train one model data parallel; process 0 alone scans the folder,
says the schedule and writes --out, and the run ends with the weights of the same command on one process. The
module's 2-process run is killed after its first epoch and resumed from process 0's backup, so its end shows
both; on TensorFlow a worker held up longer than TensorFlow's own heartbeat timeout (10 s) in the resumed run
does not end it, and no process leaves before process 0 has written the run. torch, and --naflex, are refused in
one line."""

import json
import os
import pathlib
import re
import sys

import numpy as np
import pytest
from conftest import backend, mpiexec, photo_folder
from test_examples import weights_in
from test_multiprocess import Lines

from keras_vit import cli, launch

HERE = pathlib.Path(__file__).parent
FAULTS = str(HERE / "_finetune_faults.py")
CLI = ["-m", "keras_vit.cli"]  # `keras-vit`, after python
several = pytest.mark.skipif(backend() not in ("jax", "tensorflow"), reason="several processes: jax and tensorflow")


def _flags(photos, out, start=None):
    """The command's flags after `finetune`: from `start` (a .keras file), else a ViT-Ti/16 from scratch."""
    model = ["--weights", start] if start else ["--model", "ViT_Ti16", "--weights", "none"]
    return [str(photos), *model, "--image-size", "32", "--steps", "2", "--lr", "0.05", "--validation-split", "0.2",
            "--quiet", "--out", str(out)]


@pytest.fixture(scope="module")
def runs(start, tmp_path_factory):
    """(folder of the runs, the Lines of the killed 2-process run with `left`, the paths it left in runs/two,
    those of its resumption): 9 photographs (3 of each of 3 classes, one of each validates: an odd validation
    split, in batches that do not split evenly), the small random model `start` (TINY's, from a .keras file: the
    runs' plumbing, not a released model's 12 layers, is what they show) fine-tuned 2 epochs of one update of 8
    images by `keras-vit finetune` on 2 processes (runs/two) whose process 0 kills itself (SIGKILL) after the backup of the first
    epoch; then the same 2-process command with --resume, whose process 1 says as it exits whether process 0's
    report is written, and the command on one process (runs/one, the reference, run in this process). On
    TensorFlow, process 1 of the resumed run is stopped for 15 s after its epoch, as a loaded machine can hold a
    process up (CI's lanes run side by side)."""
    root = tmp_path_factory.mktemp("finetune_multiprocess")
    photos = photo_folder(root / "photos", per_class=3, size=(40, 48))
    killed = Lines()
    code = two_processes([FAULTS, *_flags(photos, root / "two", start)], killed, KILL_PROCESS="0")
    assert code != 0, killed.text()[-6000:]
    # died of its kill, not before it: a run that fails at its start leaves nothing to resume (one round of 20
    # under load did, its lines unseen), and these lines say why
    assert "[0] killing process 0" in killed.text(), killed.text()[-6000:]
    killed.left = sorted(path.relative_to(root / "two").as_posix() for path in (root / "two").rglob("*"))
    held_up = {"STOP_PROCESS": "1", "STOP_S": "15"} if backend() == "tensorflow" else {}

    def args(out):  # runs/two resumes the killed run; runs/one is the reference
        return [*_flags(photos, out, start), *(["--resume"] if out.name == "two" else [])]

    resumed = run_against_one(args, root, [FAULTS], SAY_LEAVING="1", **held_up)
    return root, killed, resumed


def lane_env_of(**more_env):
    """The environment of a run on this lane's backend with `more_env`."""
    return {**os.environ, "KERAS_BACKEND": backend(), "TF_CPP_MIN_LOG_LEVEL": "2",
            "PYTHONPATH": os.pathsep.join([str(HERE.parent), os.environ.get("PYTHONPATH", "")]), **more_env}


def launch_two(argv, lines, timeout=400, **more_env):
    """Runs `argv` (after python) under the package's launcher on 2 processes of one CPU device each on this
    lane's backend (`more_env`: more variables), its lines into `lines`; returns the launcher's exit status."""
    saved = dict(os.environ)
    os.environ.update(lane_env_of(**more_env))
    try:
        return launch.launch([sys.executable, *argv], 2, cpu_devices=1, timeout=timeout, out=lines)
    finally:
        os.environ.clear()
        os.environ.update(saved)


TAGGED = re.compile(r"\[\d+,(\d+)\]<std(?:out|err)>: ?(.*)")


def two_processes(argv, lines, **more_env):
    """Runs `argv` (after python) on 2 processes of one CPU device each on this lane's backend (`more_env`: more
    variables): on JAX under `mpiexec`, on TensorFlow under the package's launcher. Their lines go into `lines`
    as the launcher writes them ("[i] line", process i's), the launcher's own as they are; returns its exit
    status."""
    if backend() != "jax":
        return launch_two(argv, lines, **more_env)
    code, said = mpiexec(["--output", "tag"], argv, lane_env_of(PYTHONUNBUFFERED="1", **more_env))  # as launch's
    for line in said.splitlines():
        tagged = TAGGED.fullmatch(line)
        lines.write(f"[{tagged[1]}] {tagged[2]}\n" if tagged else line + "\n")
    return code


def run_against_one(args, root, two=(*CLI, "finetune"), fails=False, **more_env):
    """Runs `keras-vit finetune *args(out)` on 2 processes (`two_processes`: python `two`, then the arguments)
    into root/two, on this lane's backend (`more_env`: more variables), then on one process into root/one: in this
    process, as `cli.main` (the reference: a process of its own would import Keras and its backend again, its
    fresh interpreter no part of what it shows). Returns the 2-process run's Lines once it ended with 0, or with
    another status if it `fails` (the package's launcher's 1, mpiexec's that of the rank that died), and the
    one-process run with 0."""
    lines = Lines()
    status = two_processes([*two, *args(root / "two")], lines, **more_env)
    assert (status != 0) == fails, lines.text()[-6000:]
    assert cli.main(["finetune", *args(root / "one")]) == 0
    return lines


def same_model(out, reference, weights_at_least=100):
    """The runs in `out` (2 processes) and `reference` (1) (folders) kept the same best epoch with the same
    history, split and weights (at least `weights_at_least` of them), up to float rounding."""
    a, b = json.loads((reference / "report.json").read_text()), json.loads((out / "report.json").read_text())
    assert a["schedule"] == b["schedule"] and a["best_epoch"] == b["best_epoch"]
    assert (a["processes"], a["replicas"], b["processes"], b["replicas"]) == (1, 1, 2, 2)
    for key in ("loss", "accuracy", "val_loss", "val_accuracy"):
        np.testing.assert_allclose(b["history"][key], a["history"][key], rtol=1e-5, err_msg=key)
    assert b["validation_accuracy"] == a["validation_accuracy"]
    split = [json.loads((run / "split.json").read_text()) for run in (reference, out)]
    assert split[0]["train"] == split[1]["train"] and split[0]["validation"] == split[1]["validation"]
    weights, others = weights_in(reference / "model.keras"), weights_in(out / "model.keras")
    assert weights.keys() == others.keys() and len(weights) > weights_at_least
    assert np.abs(weights["layers/dense/vars/0"]).max() > 0  # the zero-initialised head was trained
    for name in weights:
        np.testing.assert_allclose(others[name], weights[name], rtol=1e-5, atol=1e-6, err_msg=name)


@several
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_two_processes_train_one_model_written_once_equal_to_one_process(runs):
    """`mpiexec -n 2 keras-vit finetune DIR ...` on JAX, `python -m keras_vit.launch -n 2 --cpu-devices 1 --
    keras-vit finetune DIR ...` on TensorFlow, in each of its two parts: the folder read and the schedule said once, by process 0, which alone writes
    --out (process 1 prints none of the run's lines); the two processes' model is the one-process run's."""
    root, killed, resumed = runs
    said = {}
    for part, lines in (("killed", killed), ("resumed", resumed)):
        said[part] = [line for _, line in lines.lines  # the processes' lines (not the launcher's)
                      if line.startswith(("[0] ", "[1] ")) and not line.startswith(("[0] [Gloo]", "[1] [Gloo]"))]
        if backend() == "tensorflow" and part == "resumed":  # held up past TensorFlow's heartbeat timeout, it went on
            assert "[1] stopping process 1 for 15 s" in said[part], lines.text()
            said[part].remove("[1] stopping process 1 for 15 s")
        starts = ("reading ", "batch 8 (1 x 8 on the devices of 2 processes), 2 epochs of 1 updates",
                  *(("validation accuracy",) if part == "resumed" else ()))  # the killed run never got there
        for start in starts:
            assert [line for line in said[part] if line.split(" ", 1)[1].startswith(start)] == [
                next(line for line in said[part] if line.startswith(f"[0] {start}"))], lines.text()
        run_lines = ("[1] reading", "[1] batch", "[1] epoch", "[1] validation", "[1] resuming", "[1] keras-vit")
        assert not [line for line in said[part] if line.startswith(run_lines)], lines.text()
    # process 1 leaves once process 0 has written the run: on TensorFlow, a worker that left before would be
    # declared crashed by the coordination service once its heartbeat timeout has passed, and process 0 says so
    assert "[1] process 1 leaves, the report written: True" in said["resumed"], lines.text()
    assert [line for line in said["resumed"] if line.startswith("[0]")][-1].endswith(f"wrote {root / 'two'}")
    assert sorted(os.listdir(root / "two")) == sorted(os.listdir(root / "one"))  # the backup gone, the lock released
    assert not (root / "two.lock").exists()
    same_model(root / "two", root / "one", weights_at_least=10)  # a TINY model


@several
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_killed_two_process_run_resumes_to_the_uninterrupted_model(runs):
    """Process 0 killed (SIGKILL) after the backup of the first of 2 epochs: the launcher (`mpiexec` on JAX)
    stops process 1 and says which process died, the backup is in --out and no report; the same command with
    --resume on 2 processes, each restoring process 0's backup, continues from epoch 1 and ends with the
    one-process run's model."""
    root, killed, resumed = runs
    assert "[0] killing process 0" in killed.text(), killed.text()[-6000:]
    if backend() == "jax":
        words = " ".join(" ".join(line for _, line in killed.lines if not line.startswith("[")).split())
        assert "process rank 0 with PID" in words and "exited on signal 9 (Killed)" in words, killed.text()[-6000:]
    else:
        assert killed.lines[-1][1].startswith("keras_vit.launch: process 0"), killed.text()[-6000:]
    assert "backup/latest.weights.h5" in killed.left and "report.json" not in killed.left
    assert f"[0] resuming {root / 'two'}: 1 of 2 epochs done" in resumed.text().splitlines()
    same_model(root / "two", root / "one", weights_at_least=10)  # a TINY model


@several
@pytest.mark.timeout(300)
def test_a_refusal_on_process_0_ends_every_process_in_one_line(tmp_path):
    """A folder of one class, refused by process 0's scan: process 0 sends the refusal to process 1, which
    never scans, and each ends with it in one line (no process left waiting); nothing written."""
    photo_folder(tmp_path / "photos", per_class=2, size=(40, 48))
    for name in ("astronaut", "cat"):
        for path in (tmp_path / "photos" / name).rglob("*"):
            if path.is_file():
                path.unlink()
    lines = Lines()
    assert launch_two([*CLI, "finetune", *_flags(tmp_path / "photos", tmp_path / "out")], lines, timeout=200) == 1
    errors = [line for _, line in lines.lines if "keras-vit finetune: error:" in line]
    assert errors and all("class" in line for line in errors), lines.text()
    assert all("(process 0)" in line for line in errors if line.startswith("[1]")), lines.text()
    assert "ran past --timeout" not in lines.text() and not (tmp_path / "out").exists()


def test_several_processes_are_refused_where_they_cannot_run(tmp_path, monkeypatch, capsys):
    """On torch (KERAS_DISTRIBUTION_NUM_PROCESSES=2) finetune DIR refuses a run of several processes in one
    line naming the backend, on JAX and TensorFlow (TF_CONFIG of 2 workers) a --naflex one; nothing written,
    no process joined."""
    photos = tmp_path / "photos"  # never read: the refusal comes first
    monkeypatch.setenv("KERAS_DISTRIBUTION_NUM_PROCESSES", "2")
    monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": {"worker": ["127.0.0.1:1", "127.0.0.1:2"]},
                                                "task": {"type": "worker", "index": 0}}))
    more = ["--naflex", "16"] if backend() != "torch" else []
    assert cli.main(["finetune", *_flags(photos, tmp_path / "out"), *more]) == 2
    expected = ("--naflex runs on one process, not on 2" if backend() != "torch" else
                "keras-vit finetune on 2 processes runs on the jax and tensorflow backends, got torch")
    assert expected in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
