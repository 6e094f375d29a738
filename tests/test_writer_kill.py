"""Every writer of keras_vit survives a SIGKILL at any point (issue 36, 2): its destination reads whole as the
old version or the new one, and the temporaries a killed writer leaves beside it (hidden, `.NAME.HOST-PID.
XXXXXXXX.tmp...`) are removed by the next write of the same destination. The trials run in one process that
forks a writer per trial (tests/_kill_writer.py); the delays before each kill are drawn from SEED."""

import json
import os
import socket
import subprocess
import sys

import pytest

from keras_vit import fileio

HERE = os.path.dirname(os.path.abspath(__file__))
TRIALS, SEED = 8, 36
WRITERS = ("npz", "lora", "json", "figure", "keras", "backup", "keras-hub")


@pytest.mark.backend_independent
@pytest.mark.timeout(400)
@pytest.mark.skipif(not hasattr(os, "fork"), reason="the trials fork a writer per kill")
def test_every_writer_killed_at_random_points_leaves_the_old_or_the_new_file(tmp_path):
    run = subprocess.run([sys.executable, os.path.join(HERE, "_kill_writer.py"), str(tmp_path), str(TRIALS),
                          str(SEED), *WRITERS], capture_output=True, text=True, timeout=360)
    assert run.returncode == 0, run.stderr[-3000:]
    results = {r["writer"]: r for r in json.loads(run.stdout.strip().splitlines()[-1])}
    assert sorted(results) == sorted(WRITERS)
    for name, seen in results.items():
        assert seen["failures"] == [], name
        assert sum(seen["old_or_new"].values()) == TRIALS, name
    # most kills land inside a write (the child writes without pause): they did leave temporaries to clean
    assert sum(seen["temporaries_after_kill"] for seen in results.values()) >= TRIALS


def _temporary(folder, target, host, pid):
    name = f".{target}.{host}-{pid}.abcd1234.tmp.npz"
    (folder / name).write_bytes(b"partial")
    return name


@pytest.mark.backend_independent
def test_only_temporaries_of_dead_writers_of_this_host_are_removed(tmp_path):
    """A live writer's temporary (this process) and another host's (on a shared folder, whose processes
    cannot be seen from here) stay; a dead writer's of this host goes, and so do its temporary folders."""
    host = fileio.host_name()
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(dead.stdout)
    live = _temporary(tmp_path, "vit.npz", host, os.getpid())
    other_host = _temporary(tmp_path, "vit.npz", host + "-elsewhere", dead_pid)
    stale = _temporary(tmp_path, "vit.npz", host, dead_pid)
    (tmp_path / f".vit.npz.{host}-{dead_pid}.wxyz0987.tmp").mkdir()
    (tmp_path / f".vit.npz.{host}-{dead_pid}.wxyz0987.tmp" / "model.weights.h5").write_bytes(b"partial")
    unrelated = _temporary(tmp_path, "other.npz", host, dead_pid)
    with fileio.atomic_write(tmp_path / "vit.npz") as tmp:
        with open(tmp, "w") as f:
            f.write("new")
    assert sorted(os.listdir(tmp_path)) == sorted([live, other_host, unrelated, "vit.npz"])
    assert socket.gethostname()  # the host part is this machine's name
