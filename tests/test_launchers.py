"""The launchers a cluster starts its processes with (keras_vit.distribute.launchers): what each one's
environment says (a table), a coordinator that cannot be reached (refused in one line, naming it, at the
limit), and two processes started with exactly the variables SLURM's `srun -n 2` gives its tasks, joined as
`keras-vit finetune DIR` joins them (JAX's processes; TensorFlow's workers through its own
`SlurmClusterResolver`), and what such a launch refuses at its first barrier (two commands, an --out one
process cannot see, a batch the processes do not divide). `mpiexec` itself runs `keras-vit finetune` in
tests/test_finetune_multiprocess.py."""

import json
import os
import pathlib
import random
import socket
import subprocess
import sys

import pytest
from conftest import backend

from keras_vit import cli
from keras_vit.distribute import launchers

HERE = pathlib.Path(__file__).parent
JOIN = str(HERE / "_join.py")


def srun_env(index, count=2, job=None, host=None):
    """The SLURM variables of task `index` of `srun -n count` on one node (`host`: this machine's name), as
    srun sets them (those of the job, of the step and of the task)."""
    host = host or socket.gethostname()
    job = str(job or random.randrange(10_000, 99_999))
    return {"SLURM_JOB_ID": job, "SLURM_JOBID": job, "SLURM_JOB_NAME": "keras-vit", "SLURM_JOB_NODELIST": host,
            "SLURM_NODELIST": host, "SLURM_JOB_NUM_NODES": "1", "SLURM_NNODES": "1", "SLURM_NTASKS": str(count),
            "SLURM_NPROCS": str(count), "SLURM_TASKS_PER_NODE": str(count), "SLURM_CPUS_ON_NODE": "2",
            "SLURM_SUBMIT_HOST": host, "SLURM_SUBMIT_DIR": os.getcwd(), "SLURM_CLUSTER_NAME": "loopback",
            "SLURM_STEP_ID": "0", "SLURM_STEPID": "0", "SLURM_STEP_NODELIST": host, "SLURM_STEP_NUM_NODES": "1",
            "SLURM_STEP_NUM_TASKS": str(count), "SLURM_STEP_TASKS_PER_NODE": str(count),
            "SLURM_SRUN_COMM_HOST": "127.0.0.1", "SLURM_LAUNCH_NODE_IPADDR": "127.0.0.1", "SLURM_DISTRIBUTION": "block",
            "SLURM_PROCID": str(index), "SLURM_LOCALID": str(index), "SLURM_NODEID": "0", "SLURM_TOPOLOGY_ADDR": host}


def _clean(environ):
    """`environ` without any launcher's variables (a CI machine's own are not the test's)."""
    prefixes = ("SLURM_", "OMPI_", "PMI_", "PMIX_", "KERAS_DISTRIBUTION_", "TF_CONFIG", "TPU_NAME")
    return {key: value for key, value in environ.items() if not key.startswith(prefixes)}


@pytest.mark.backend_independent
def test_each_launchers_environment_says_how_many_processes_and_which_this_is(monkeypatch):
    """detect() on the variables of each launcher (one of two processes), of a launcher of one process and
    of none; the first host of SLURM's node lists; JAX's port for a SLURM job."""
    monkeypatch.setattr(launchers, "_on_a_tpu_vm", lambda env: False)  # this machine's /dev is not the test's
    tf_config = json.dumps({"cluster": {"worker": ["a:1", "b:2", "c:3"]}, "task": {"type": "worker", "index": 2}})
    batch_script = {k: v for k, v in srun_env(0, 4).items() if not k.startswith("SLURM_STEP")}
    cases = [
        ({"KERAS_DISTRIBUTION_NUM_PROCESSES": "2", "KERAS_DISTRIBUTION_PROCESS_ID": "1"}, "jax", ("keras", 2, 1)),
        ({"TF_CONFIG": tf_config}, "tensorflow", ("tf_config", 3, 2)),
        ({"TF_CONFIG": tf_config}, "jax", None),  # TF_CONFIG is TensorFlow's
        (srun_env(1), "jax", ("slurm", 2, 1)),
        (srun_env(1), "tensorflow", ("slurm", 2, 1)),
        (batch_script, "jax", None),  # an allocation's batch script outside srun: no step, one process
        (srun_env(0, 1), "jax", None),  # srun -n 1
        ({"OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_RANK": "3"}, "jax", ("mpi", 4, 3)),
        ({"OMPI_COMM_WORLD_SIZE": "1", "OMPI_COMM_WORLD_RANK": "0"}, "jax", None),  # mpiexec -n 1
        ({"PMI_SIZE": "2", "PMI_RANK": "1"}, "jax", ("mpi", 2, 1)),  # MPICH's Hydra, Intel MPI
        ({}, "jax", None),
    ]
    for environ, on, expected in cases:
        got = launchers.detect(environ, backend=on)
        assert (tuple(got) if got else None) == expected, (environ, on)
    monkeypatch.setattr(launchers, "_on_a_tpu_vm", lambda env: True)
    assert launchers.detect({}, backend="jax") == ("tpu", None, None)  # JAX counts the slice's hosts when joining
    assert launchers.detect({}, backend="tensorflow") is None  # TensorFlow's TPUStrategy: one process a slice
    for nodes in ("node001", "node001,gpu2", "node[001-015],gpu2", "node[001,007-015]"):
        assert launchers.first_slurm_host(nodes) == "node001", nodes
    assert launchers.coordinator(launchers.Launch("slurm", 2, 1), {**srun_env(1, job=4097), "SLURM_STEP_NODELIST": "n[3-4]"}) == \
        "n3:61441"


@pytest.mark.backend_independent
def test_free_ports_are_drawn_where_the_kernel_gives_out_none_and_a_taken_one_is_passed_over(monkeypatch):
    """`free_ports` (`python -m keras_vit.launch`'s, MPI's coordinator's): distinct ports below the kernel's
    ephemeral range, where no outgoing connection or bind to port 0 can take one before the processes listen
    (a TensorFlow worker whose port was taken ends "Could not start gRPC server"); one a server already listens
    at, on any interface, is passed over; a range that leaves no room below it is drawn from itself."""
    low, high = map(int, pathlib.Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    ports = launchers.free_ports(50)
    assert len(set(ports)) == 50 and all(launchers.PORTS_FROM <= port < min(low, 32768) for port in ports), ports
    with socket.socket() as given:  # the kernel's choice lies in its range
        given.bind(("", 0))
        assert low <= given.getsockname()[1] <= high
    with socket.socket() as taken:
        taken.bind(("", ports[0]))
        taken.listen()
        offered = [ports[0], ports[1]]
        monkeypatch.setattr(launchers.random.SystemRandom, "sample", lambda self, pool, k: offered)
        assert launchers.free_ports(1) == [ports[1]]
        with pytest.raises(OSError, match=r"expected 2 free TCP ports in 20000-\d+, found 1"):
            launchers.free_ports(2)
    monkeypatch.undo()
    monkeypatch.setattr(launchers, "_ephemeral_from", lambda: 20500)
    assert all(20500 <= port <= 65535 for port in launchers.free_ports(20))


@pytest.mark.skipif(backend() == "torch", reason="several processes: jax and tensorflow")
def test_a_coordinator_that_cannot_be_reached_is_refused_at_the_limit(tmp_path, monkeypatch, capsys):
    """Process 1 of `srun -n 2` whose process 0 never started: `keras-vit finetune` waits up to
    KERAS_VIT_JOIN_TIMEOUT_S (here 2 s) and ends in one line naming the address and the limit; nothing written,
    no process joined. (TensorFlow's workers are named by TF_CONFIG from srun's variables: the same wait.)"""
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for key in [key for key in os.environ if key not in _clean(os.environ)]:
        monkeypatch.delenv(key)
    monkeypatch.setenv("TF_CONFIG", "")  # none (empty), and removed again after the test: the join sets it from srun's
    for key, value in {**srun_env(1, host="127.0.0.1"), "JAX_COORDINATOR_PORT": str(port),
                       "KERAS_VIT_JOIN_TIMEOUT_S": "2"}.items():
        monkeypatch.setenv(key, value)
    argv = ["finetune", str(tmp_path / "photos"), "--weights", "none", "--image-size", "32", "--out",
            str(tmp_path / "out")]
    if backend() == "tensorflow":  # the workers' own ports: process 0's is the one waited for
        monkeypatch.setattr(launchers, "slurm_port", lambda env: port)
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("keras-vit finetune: error: process 1 of 2 (slurm) could not reach "
                                               f"process 0 at 127.0.0.1:{port} within 2 s"), err
    assert not (tmp_path / "out").exists()


def srun_tasks(argvs, cwd, prefixes=None):
    """Runs each of `argvs` (after python) as a task of one `srun -n len(argvs)` (its variables, no other
    launcher's) on this lane's backend, task i's command after `prefixes[i]` (a list) if given; returns their
    (exit statuses, outputs, pids)."""
    env = {**_clean(os.environ), "KERAS_BACKEND": backend(), "TF_CPP_MIN_LOG_LEVEL": "2",
           "PYTHONPATH": os.pathsep.join([str(HERE.parent), os.environ.get("PYTHONPATH", "")])}
    job = random.randrange(10_000, 99_999)
    prefixes = prefixes or [[] for _ in argvs]
    tasks = [subprocess.Popen([*prefix, sys.executable, *map(str, argv)], cwd=cwd, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, env={**env, **srun_env(i, len(argvs), job=job)})
             for i, (argv, prefix) in enumerate(zip(argvs, prefixes))]
    try:
        said = [task.communicate(timeout=240)[0] for task in tasks]
    finally:
        for task in tasks:
            task.kill()
    return [task.returncode for task in tasks], said, [task.pid for task in tasks]


several = pytest.mark.skipif(backend() == "torch", reason="several processes: jax and tensorflow")


@several
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_two_tasks_of_srun_join_one_run(tmp_path):
    """Two processes with exactly the variables `srun -n 2` gives its tasks (and no other launcher's) join one
    run: each says it is one of 2 and gets process 0's value, then they pass a barrier."""
    codes, said, pids = srun_tasks([[JOIN], [JOIN]], tmp_path)
    assert codes == [0, 0], said
    lines = [[line for line in out.splitlines() if line.startswith("process ")] for out in said]
    first = lines[0][0].split(": ", 1)[1]
    assert lines == [[f"process 0 of 2: {first}"], [f"process 1 of 2: {first}"]], said
    assert first.split()[1] == str(pids[0])  # process 0 is task 0


def _finetune(photos, out, *more):
    return ["-m", "keras_vit.cli", "finetune", photos, "--model", "ViT_Ti16", "--weights", "none", "--image-size",
            "32", "--steps", "2", "--validation-split", "0.2", "--quiet", "--out", out, *more]


def _errors(said):
    return [[line for line in out.splitlines() if line.startswith("keras-vit finetune: error:")] for out in said]


@several
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_two_commands_under_one_launcher_are_refused_at_the_first_barrier(tmp_path):
    """Task 1 started with another --lr than task 0: both end at the barrier where process 0 sends its scan,
    each in one line naming process 1 (task 1's naming the flag, its value and process 0's); nothing trained,
    --out left as process 0 made it (no model, no report)."""
    from conftest import photo_folder

    photos = photo_folder(tmp_path / "photos", per_class=3, size=(40, 48))
    out = tmp_path / "out"
    codes, said, _ = srun_tasks([_finetune(photos, out, "--lr", "0.05"), _finetune(photos, out, "--lr", "0.1")],
                                tmp_path)
    assert codes == [2, 2], said
    expected = "keras-vit finetune: error: process 1 of 2 was started with other flags than process 0"
    errors = _errors(said)
    assert [len(e) for e in errors] == [1, 1] and all(e[0].startswith(expected) for e in errors), said
    assert errors[0][0].endswith("; expected the same command on every process"), said
    assert "(here lr 0.1 against 0.05)" in errors[1][0], said
    assert not (out / "model.keras").exists() and not (out / "report.json").exists()


@pytest.mark.skipif(backend() != "jax", reason="the refusals of a launch, before any backend work: one backend")
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_out_unseen_by_a_process_and_a_batch_the_processes_do_not_divide_are_refused(tmp_path):
    """Task 1 of 2 sees another filesystem where --out is (its own mount over the folder above --out, as on
    a host without the shared disk): every process ends in one line naming --out and process 1. Then 3 tasks
    for a batch of 8 images: each ends in one line naming the 3 processes and what would divide. Nothing
    trained either time."""
    from conftest import photo_folder

    if os.geteuid() != 0 or subprocess.run(["unshare", "--mount", "true"], capture_output=True).returncode:
        pytest.skip("another filesystem for one process needs `unshare --mount` (root)")
    photos = photo_folder(tmp_path / "photos", per_class=3, size=(40, 48))
    shared = tmp_path / "shared"
    shared.mkdir()
    own_disk = ["unshare", "--mount", "sh", "-c", f'mount -t tmpfs none {shared} && exec "$@"', "sh"]
    codes, said, _ = srun_tasks([_finetune(photos, shared / "out")] * 2, tmp_path, prefixes=[[], own_disk])
    assert codes == [2, 2], said
    expected = (f"keras-vit finetune: error: --out {shared / 'out'}, written by process 0, cannot be seen by "
                f"process 1 of 2 (which does not find there the lock process 0 holds, {shared / 'out.lock'}); expected "
                "a folder every process can read")
    assert [[e[0].startswith(expected)] for e in _errors(said)] == [[True], [True]], said

    codes, said, _ = srun_tasks([_finetune(photos, tmp_path / "three")] * 3, tmp_path)
    assert codes == [2, 2, 2], said
    expected = ("keras-vit finetune: error: the device batch (8 images a step) splits over the 3 devices of 3 "
                "processes: expected a multiple of 3")
    assert [[e[0].startswith(expected)] for e in _errors(said)] == [[True]] * 3, said
    assert not (tmp_path / "three" / "model.keras").exists()
