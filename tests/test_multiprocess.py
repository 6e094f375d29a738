"""Several processes on one machine, as several hosts: JAX over 2 processes x 2 virtual CPU devices
(loopback coordinator, gloo collectives) equal to 1 process x 4 devices; TensorFlow's
MultiWorkerMirroredStrategy over 2 workers equal to a MirroredStrategy on one; a process killed in the
middle of fit; the launcher (keras_vit.launch) that starts them all. Every run is bounded in time: a
hang fails the test, and the launcher stops every process it started."""

import io
import json
import os
import pathlib
import re
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
from conftest import backend, mpiexec

from keras_vit import launch

HERE = pathlib.Path(__file__).parent
WORKER = str(HERE / "_multiprocess_worker.py")
RUNS = ("data_numpy", "model_numpy", "model14_numpy", "data_pydataset", "data_load")


class Lines(io.TextIOBase):
    """The launcher's output, each line with the time it arrived."""

    def __init__(self):
        self.lines = []

    def write(self, text):
        self.lines.extend((time.monotonic(), line) for line in text.splitlines())
        return len(text)

    def text(self):
        return "\n".join(line for _, line in self.lines)


def _launch_beside(reference, env, argv, **options):
    """`launch.launch(argv)` on 2 processes under `env` while the `reference` process runs: (exit code,
    the launcher's Lines, the reference's output); the reference is stopped if it outlives its time."""
    lines = Lines()
    saved = dict(os.environ)
    os.environ.update(env)
    try:
        code = launch.launch(argv, 2, timeout=400, out=lines, **options)
    finally:
        os.environ.clear()
        os.environ.update(saved)
    try:
        reference_out, _ = reference.communicate(timeout=420)
    finally:
        if reference.poll() is None:
            reference.kill()
            reference.wait(30)
    return code, lines, reference_out


@pytest.fixture
def jax_env(monkeypatch):
    monkeypatch.setenv("KERAS_BACKEND", "jax")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(HERE.parent), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "2")


@pytest.fixture(scope="module")
def jax_runs(tmp_path_factory):
    """The worker's runs over 2 processes x 2 devices and, at the same time, 1 process x 4 devices."""
    out = tmp_path_factory.mktemp("multiprocess")
    env = {**os.environ, "KERAS_BACKEND": "jax", "TF_CPP_MIN_LOG_LEVEL": "2",
           "PYTHONPATH": os.pathsep.join([str(HERE.parent), os.environ.get("PYTHONPATH", "")])}
    # the reference is the worker itself on 4 virtual devices (no launcher process of its own: one import of
    # Keras and TensorFlow less); _launch_beside bounds its time
    reference = subprocess.Popen([sys.executable, WORKER, str(out)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                 env={**env, "XLA_FLAGS": launch.with_cpu_devices(env.get("XLA_FLAGS", ""), 4)},
                                 text=True)
    code, lines, reference_out = _launch_beside(reference, env, [WORKER, str(out)], cpu_devices=2)
    assert code == 0, lines.text()[-6000:]
    assert reference.returncode == 0, reference_out[-6000:]
    return np.load(out / "2.npz"), np.load(out / "1.npz")


@pytest.mark.backend_independent
@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("run", RUNS)
def test_two_processes_equal_one_process_over_four_devices(jax_runs, run):
    """fit (4 updates of the fine-tuning recipe) and evaluate, each process passing its own rows of every
    global batch of 16: numpy arrays (`process_rows`) under data_parallel(), model_parallel((2, 2)) (each
    process one mesh row) and model_parallel((1, 4)) (one row over both processes, the whole batch each),
    a PyDataset, and data.load(..., process_index, process_count): the losses, metrics and weights of one
    process holding the 4 devices."""
    two, one = jax_runs
    for key in ("losses", "fit_accuracy", "eval_loss", "eval_accuracy"):
        np.testing.assert_allclose(two[f"{run}/{key}"], one[f"{run}/{key}"], rtol=1e-6, atol=1e-7, err_msg=key)
    assert one[f"{run}/losses"].shape == (4,) and one[f"{run}/losses"][-1] != one[f"{run}/losses"][0]
    weights = sorted(k for k in one.files if k.startswith(f"{run}/weights/"))
    assert len(weights) > 20 and sorted(k for k in two.files if k.startswith(f"{run}/weights/")) == weights
    for key in weights:
        np.testing.assert_allclose(two[key], one[key], rtol=1e-6, atol=1e-7, err_msg=key)


@pytest.mark.backend_independent
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_finetune_recipe_killed_on_two_processes_resumes_on_one_and_back(tmp_path, jax_env):
    """The fine-tuning recipe (`--distribute data`, gradient accumulation, 4 epochs) through the launcher
    uninterrupted on 1 process x 4 devices, and on 2 processes x 2 devices a run whose process 1 kills itself
    (SIGKILL) in the middle of its third epoch: the launcher stops process 0, left waiting in a collective,
    within 60 s with one message, the backup of the second epoch is there. That run goes on from it on 1
    process x 4 devices, which kills itself in the fourth epoch in turn, after its own backup of the third; and
    it ends resumed from that one on 2 processes under Open MPI's `mpiexec`, with the uninterrupted run's
    history, test metrics and weights. (One chain: each resumption starts a run of its own, the processes'
    start is most of each run's time; the uninterrupted run on one process, a process start less: 2 processes
    x 2 devices equal 1 x 4, which the chain's resumptions rely on and the test above shows.)"""
    from test_examples import TINY

    script = str(HERE / "_finetune_mocked.py")
    flags = ["--model", TINY, "--weights", "none", "--image-size", "16", "--batch-size", "8", "--device-batch-size",
             "1", "--steps", "8", "--eval-every", "2", "--warmup-steps", "1", "--lr", "0.05", "--data-dir",
             "/nonexistent/tfds", "--verbose", "0", "--distribute", "data", "--output-dir"]
    # the uninterrupted run's launcher in a thread of this process (one import of Keras and TensorFlow less than
    # `python -m keras_vit.launch`), beside the run to be killed
    straight, straight_lines = {}, Lines()
    thread = threading.Thread(target=lambda: straight.update(code=launch.launch(
        [script, *flags, str(tmp_path / "straight")], 1, cpu_devices=4, timeout=400, out=straight_lines)), daemon=True)
    thread.start()
    # 4 micro-steps an epoch (2 updates of 2 accumulated steps): process 1 kills itself at its micro-step 9 of
    # 16, after the backup of epoch 2 (update 4)
    lines = Lines()
    code = launch.launch([script, "--kill", "1", "9", *flags, str(tmp_path / "run")], 2, cpu_devices=2, timeout=400,
                         out=lines)
    thread.join(420)
    assert straight.get("code") == 0, straight_lines.text()[-6000:]
    assert code == 1, lines.text()[-6000:]
    kill = next((t for t, line in lines.lines if line == "[1] killing process 1"), None)
    assert kill is not None, lines.text()[-6000:]
    end, last = lines.lines[-1]
    assert last == "keras_vit.launch: process 1 of 2 was killed by SIGKILL; stopped the others"
    assert end - kill < 60
    backup = tmp_path / "run" / "backup" / "latest.weights.h5"
    assert backup.exists() and not (tmp_path / "run" / "metrics.json").exists()

    # resumed on 1 process x 4 devices from update 4, killed at its micro-step 5 (epoch 4), after its backup of
    # epoch 3 (update 6)
    written = backup.stat().st_mtime_ns
    lines = Lines()
    assert launch.launch([script, "--kill", "0", "5", *flags, str(tmp_path / "run")], 1, cpu_devices=4, timeout=400,
                         out=lines) == 1, lines.text()[-6000:]
    assert re.search(r"resuming \S+: 4 of 8 updates done", lines.text()), lines.text()[-6000:]
    assert "killing process 0" in lines.text() and backup.stat().st_mtime_ns != written
    # resumed under Open MPI's mpiexec (2 ranks x 2 devices), as on hosts of a cluster: process 0 alone says it
    code, said = mpiexec([], [script, *flags, str(tmp_path / "run")],
                         {**os.environ, "XLA_FLAGS": launch.with_cpu_devices(os.environ.get("XLA_FLAGS", ""), 2)})
    assert code == 0, said[-6000:]
    assert len([line for line in said.splitlines() if line.startswith("resuming")]) == 1, said[-6000:]
    _same_run(tmp_path / "run", tmp_path / "straight", from_step=6)


def _same_run(resumed_dir, reference_dir, from_step):
    """The resumed run in `resumed_dir` (from the backup of update `from_step`) ended as the uninterrupted one:
    history, test metrics and every weight."""
    from test_examples import weights_in

    resumed = json.loads((resumed_dir / "metrics.json").read_text())
    reference = json.loads((reference_dir / "metrics.json").read_text())
    assert resumed["resumed_from_step"] == from_step and reference["replicas"] == resumed["replicas"] == 4
    for key in ("loss", "accuracy"):
        np.testing.assert_allclose(resumed["history"][key], reference["history"][key], rtol=1e-6)
    np.testing.assert_allclose(resumed["test_loss"], reference["test_loss"], rtol=1e-6)
    assert resumed["test_accuracy"] == reference["test_accuracy"]
    a, b = weights_in(reference_dir / "model.keras"), weights_in(resumed_dir / "model.keras")
    assert a.keys() == b.keys() and len(a) > 5
    for name in a:
        np.testing.assert_allclose(b[name], a[name], rtol=1e-6, atol=1e-7, err_msg=name)


@pytest.mark.backend_independent
def test_launcher_sets_each_process_environment_and_forwards_output(tmp_path, monkeypatch, capsys):
    """`python -m keras_vit.launch -n 3 --cpu-devices 2 --timeout 60 -- show.py` (its `main`): each process gets
    the coordinator, the count, its index, TF_CONFIG and the virtual devices (the launcher's other XLA flags kept,
    its device count replaced); every line comes back prefixed with the process index; all exit 0, so does the
    launcher."""
    monkeypatch.setenv("XLA_FLAGS", "--xla_backend_optimization_level=0 --xla_force_host_platform_device_count=5")
    script = tmp_path / "show.py"
    script.write_text("import json, os\n"
                      "c, e = json.loads(os.environ['TF_CONFIG']), os.environ\n"
                      "print(e['KERAS_DISTRIBUTION_PROCESS_ID'], e['KERAS_DISTRIBUTION_NUM_PROCESSES'],\n"
                      "      e['KERAS_DISTRIBUTION_JOB_ADDRESSES'], c['task']['index'], len(c['cluster']['worker']),\n"
                      "      e['XLA_FLAGS'])\n")
    assert launch.main(["-n", "3", "--cpu-devices", "2", "--timeout", "60", "--", str(script)]) == 0
    shown = sorted(line.split() for line in capsys.readouterr().out.splitlines())
    assert [s[:3] for s in shown] == [["[0]", "0", "3"], ["[1]", "1", "3"], ["[2]", "2", "3"]]
    assert len({s[3] for s in shown}) == 1 and shown[0][3].startswith("127.0.0.1:")
    flags = ["--xla_backend_optimization_level=0", "--xla_force_host_platform_device_count=2"]
    assert [s[4:] for s in shown] == [["0", "3", *flags], ["1", "3", *flags], ["2", "3", *flags]]


@pytest.mark.backend_independent
def test_launcher_stops_a_hang_at_its_timeout_and_refuses_bad_arguments(tmp_path, capsys):
    script = tmp_path / "hang.py"
    script.write_text("import time\nprint('waiting', flush=True)\ntime.sleep(600)\n")
    lines = Lines()
    start = time.monotonic()
    assert launch.launch([str(script)], 2, timeout=3, out=lines) == 1
    assert time.monotonic() - start < 30
    assert lines.lines[-1][1] == "keras_vit.launch: the processes ran past --timeout 3 s; stopped them all"
    for argv, expected in ((["-n", "0", "--", "x.py"], "--processes must be positive, got 0"),
                           (["-n", "2"], "no command given"),
                           (["--cpu-devices", "0", "--", "x.py"], "--cpu-devices must be positive")):
        with pytest.raises(SystemExit):
            launch.main(argv)
        assert expected in capsys.readouterr().err


@pytest.mark.skipif(backend() != "tensorflow", reason="tf.distribute needs the tensorflow backend")
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_tf_two_workers_equal_mirrored_strategy_on_one(tmp_path):
    """tf_strategy() under the launcher's TF_CONFIG (2 workers on loopback, one CPU each) is a
    MultiWorkerMirroredStrategy whose fit (4 updates of the fine-tuning recipe, clipping binding) and
    evaluate on numpy arrays give the losses, metrics and weights of a MirroredStrategy over 2 devices
    of one process, and of one device; the MirroredStrategy's are also one device's (its losses, and each
    weight within 1e-5 of its largest entry)."""
    env = {**os.environ, "KERAS_BACKEND": "tensorflow", "TF_CPP_MIN_LOG_LEVEL": "2",
           "PYTHONPATH": os.pathsep.join([str(HERE.parent), os.environ.get("PYTHONPATH", "")])}
    worker = str(HERE / "_multiworker_tf.py")
    reference = subprocess.Popen([sys.executable, worker, str(tmp_path), "reference"], env=env,
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    code, lines, reference_out = _launch_beside(reference, env, [worker, str(tmp_path)])
    assert code == 0, lines.text()[-6000:]
    assert reference.returncode == 0, reference_out[-6000:]
    multi = np.load(tmp_path / "multi_worker.npz")
    for name in ("mirrored", "default"):
        other = np.load(tmp_path / f"{name}.npz")
        assert int(multi["replicas"]) == 2 and int(other["replicas"]) == (2 if name == "mirrored" else 1)
        for key in ("losses", "fit_accuracy", "eval_loss", "eval_accuracy"):
            np.testing.assert_allclose(multi[key], other[key], rtol=1e-6, atol=1e-7, err_msg=f"{name} {key}")
        assert multi["losses"][-1] != multi["losses"][0]
        weights = [k for k in other.files if k.startswith("weights/")]
        assert len(weights) > 10 and sorted(weights) == sorted(k for k in multi.files if k.startswith("weights/"))
        for key in weights:
            np.testing.assert_allclose(multi[key], other[key], rtol=1e-6, atol=1e-7, err_msg=f"{name} {key}")
    # the MirroredStrategy of one process against one device, directly: each weight elementwise and within 1e-5
    # of its largest entry
    mirrored, default = np.load(tmp_path / "mirrored.npz"), np.load(tmp_path / "default.npz")
    np.testing.assert_allclose(mirrored["losses"], default["losses"], rtol=1e-5)
    for key in (k for k in default.files if k.startswith("weights/")):
        np.testing.assert_allclose(mirrored[key], default[key], rtol=1e-5, atol=1e-7, err_msg=f"mirrored {key}")
        scale = np.abs(default[key]).max()
        assert scale <= 1e-6 or np.abs(mirrored[key] - default[key]).max() <= 1e-5 * scale, key


@pytest.mark.skipif(backend() != "tensorflow", reason="TensorFlow's coordination service")
@pytest.mark.timeout(300)
def test_tf_leader_leaves_last_so_no_worker_logs_a_lost_coordination_service(monkeypatch):
    """Two TensorFlow workers (tests/_leave_last.py), worker 1 staying longer at its exit than the leader, three
    runs side by side. Awake for 12 s, heartbeat timeout 10 s: as TensorFlow leaves them, worker 1 heartbeats to
    the leader's service once it has gone and logs the error that ended a CI run ("Failed to send RPC to
    coordination service ... Connection refused"; 12 s, two heartbeats' time: a loaded machine can take seconds
    to end the leader's process); awake for 6 s with `leave_last_at_exit` (timeout 40 s), the leader waits for
    it to leave and nothing is logged. Stopped for 14 s (no heartbeats, its port still taking connections, as a
    process stuck in its exit), timeout 24 s: the leader waits a quarter of the timeout, not the whole of it, so
    the service never calls the worker crashed ("The tasks have crashed", which ended a CI run). Each ends with 0."""
    cases = {"first": ("10", "12", "first", "awake"), "last": ("40", "6", "last", "awake"),
             "held": ("24", "14", "last", "stopped")}
    # the three launchers run in threads of this process (a `python -m keras_vit.launch` would import Keras and
    # TensorFlow again, ~10 s of CPU each, for nothing the test reads)
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "2")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(HERE.parent), os.environ.get("PYTHONPATH", "")]))
    lines, codes = {case: Lines() for case in cases}, {}

    def run(case):
        codes[case] = launch.launch([sys.executable, str(HERE / "_leave_last.py"), *cases[case]], 2, timeout=200,
                                    out=lines[case])

    threads = [threading.Thread(target=run, args=(case,), daemon=True) for case in cases]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(250)
    said = {case: lines[case].text() for case in cases}
    assert codes == dict.fromkeys(cases, 0), said
    left = {case: {int(i): float(t) for i, t in re.findall(r"^\[\d\] process (\d) leaves at ([\d.]+)$", text, re.M)}
            for case, text in said.items()}
    assert all(sorted(times) == [0, 1] for times in left.values()), said
    lost = "Failed to send RPC to coordination service"
    assert re.search(f"^\\[1\\] .*{lost}", said["first"], re.M), said["first"]
    assert lost not in said["last"] and "crashed" not in said["last"] and left["last"][0] > left["last"][1], said["last"]
    stopped = float(re.search(r"^\[1\] process 1 stops at ([\d.]+)$", said["held"], re.M)[1])
    assert "crashed" not in said["held"] and left["held"][0] < stopped + 24 / 4 + 3 < left["held"][1], said["held"]


@pytest.mark.skipif(backend() != "jax", reason="keras.distribution runs on the jax backend")
def test_several_processes_default_to_each_holding_its_rows():
    """data_parallel() and model_parallel() leave Keras' tf.data-only auto-sharding off (each process
    passes its own rows, any input kind); one process passes every row."""
    import keras

    from keras_vit import distribute

    distribute.data_parallel()
    assert keras.distribution.distribution().auto_shard_dataset is False
    distribute.model_parallel()
    assert keras.distribution.distribution().auto_shard_dataset is False
    assert distribute.process_shard() == (0, 1)
    x = np.arange(10)
    assert distribute.process_rows(x, 4) is x


@pytest.mark.backend_independent
def test_process_rows_cuts_each_global_batch(monkeypatch):
    """Process i of 2 keeps rows [2i, 2i + 2) of every batch of 4 and its half of a last batch of 2; the
    processes' rows put side by side are the global batches; what does not divide is refused."""
    from keras_vit import distribute
    from keras_vit.distribute import hosts  # process_rows asks its own module's process_shard

    x = {"images": np.arange(10) * 10, "labels": np.arange(10)}
    parts = []
    for index in range(2):
        monkeypatch.setattr(hosts, "process_shard", lambda index=index: (index, 2))
        parts.append(distribute.process_rows(x, 4))
    assert parts[0]["labels"].tolist() == [0, 1, 4, 5, 8] and parts[1]["labels"].tolist() == [2, 3, 6, 7, 9]
    assert parts[1]["images"].tolist() == [20, 30, 60, 70, 90]
    with pytest.raises(ValueError, match=r"global batch \(5\) must be divisible by the 2 parts"):
        distribute.process_rows(x, 5)
    with pytest.raises(ValueError, match=r"last batch has 1 rows \(9 rows in batches of 4\)"):
        distribute.process_rows(np.arange(9), 4)


@pytest.mark.skipif(backend() != "jax", reason="KERAS_DISTRIBUTION_NUM_PROCESSES is the jax backend's")
def test_recipe_on_several_processes_refuses_what_it_cannot_do(monkeypatch, tmp_path, capsys):
    """Several processes without --distribute would train one model each; --distribute model would save
    files that need every process's shards: both refused before anything runs."""
    from keras_vit.recipes import finetune

    monkeypatch.setenv("KERAS_DISTRIBUTION_NUM_PROCESSES", "2")
    for extra, message in (([], "one of 2 processes (KERAS_DISTRIBUTION_NUM_PROCESSES); pass --distribute data"),
                           (["--distribute", "model"], "--distribute model over 2 processes: the saved model")):
        with pytest.raises(SystemExit):
            finetune.parse_args("cifar10", ["--output-dir", str(tmp_path / "x"), *extra])
        assert message in capsys.readouterr().err
    assert not (tmp_path / "x").exists()
