"""`srun -n 2 keras-vit finetune DIR` through a real SLURM: a one-node cluster of this machine on loopback
(slurmctld, slurmd and munged started by the test, as root, with their files in a temporary folder), where
Debian's `slurm-wlm` and `munge` are installed; skipped with one line elsewhere (CI's machine has neither:
tests/test_launchers.py runs two processes with exactly the variables srun sets). The two tasks join one
run through JAX as `keras-vit finetune` detects them, process 0 alone writes --out, and the model is the one
of the same command on one process."""

import os
import shutil
import socket
import subprocess
import sys
import time

import pytest
from conftest import backend, photo_folder
from test_finetune_multiprocess import lane_env_of, same_model

from keras_vit.distribute.launchers import free_ports

DAEMONS = ("munged", "slurmctld", "slurmd", "srun", "sinfo")
pytestmark = [
    pytest.mark.skipif(backend() != "jax", reason="one backend: srun's tasks join through JAX (tests/test_launchers.py "
                       "runs TensorFlow's workers under srun's variables)"),
    pytest.mark.skipif(any(shutil.which(name) is None for name in DAEMONS) or os.geteuid() != 0,
                       reason="a one-node SLURM needs Debian's slurm-wlm and munge, run as root"),
]


SLURM_CONF = """\
ClusterName=loopback
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={root}/munge.socket
CredType=cred/munge
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd.pid
SlurmctldLogFile={root}/slurmctld.log
SlurmdLogFile={root}/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
ReturnToService=2
SlurmdTimeout=300
NodeName={host} NodeAddr=127.0.0.1 CPUs={cpus} State=UNKNOWN
PartitionName=local Nodes={host} Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE
"""


@pytest.fixture
def cluster(tmp_path):
    """The environment of a one-node SLURM cluster on loopback (SLURM_CONF set), its daemons ended afterwards."""
    root = tmp_path / "slurm"
    for folder in ("state", "spool"):
        (root / folder).mkdir(parents=True)
    (root / "munge.key").write_bytes(os.urandom(1024))
    (root / "munge.key").chmod(0o400)
    ctld_port, slurmd_port = free_ports(2)
    conf = root / "slurm.conf"
    conf.write_text(SLURM_CONF.format(host=socket.gethostname(), root=root, ctld_port=ctld_port,
                                      slurmd_port=slurmd_port, cpus=os.cpu_count()))
    env = {**os.environ, "SLURM_CONF": str(conf)}
    munge = subprocess.run(["munged", "--force", f"--key-file={root / 'munge.key'}", f"--socket={root / 'munge.socket'}",
                            f"--pid-file={root / 'munged.pid'}", f"--log-file={root / 'munged.log'}",
                            f"--seed-file={root / 'munged.seed'}"], capture_output=True, text=True, timeout=30)
    assert munge.returncode == 0, munge.stdout + munge.stderr
    daemons = [subprocess.Popen([name, "-D", "-f", str(conf)], env=env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.STDOUT) for name in ("slurmctld", "slurmd")]
    try:
        deadline = time.monotonic() + 60
        while "idle" not in subprocess.run(["sinfo", "-h", "-o", "%t"], env=env, capture_output=True,
                                           text=True).stdout:
            assert time.monotonic() < deadline and all(d.poll() is None for d in daemons), \
                "\n".join(p.read_text()[-2000:] for p in root.glob("*.log"))
            time.sleep(0.5)
        yield env
    finally:
        for daemon in daemons:
            daemon.terminate()
            daemon.wait(30)
        subprocess.run(["kill", (root / "munged.pid").read_text().strip()], check=False)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_srun_two_tasks_train_the_one_process_model(cluster, tmp_path):
    photos = photo_folder(tmp_path / "photos", per_class=3, size=(40, 48))
    flags = [str(photos), "--model", "ViT_Ti16", "--weights", "none", "--image-size", "32", "--steps", "2", "--lr",
             "0.05", "--validation-split", "0.2", "--quiet", "--out"]
    env = lane_env_of(SLURM_CONF=cluster["SLURM_CONF"])
    one = subprocess.run([sys.executable, "-m", "keras_vit.cli", "finetune", *flags, str(tmp_path / "one")], env=env,
                         capture_output=True, text=True, timeout=400)
    assert one.returncode == 0, one.stdout[-4000:] + one.stderr[-4000:]
    two = subprocess.run(["srun", "-n", "2", "--label", "--overcommit", sys.executable, "-m", "keras_vit.cli",
                          "finetune", *flags, str(tmp_path / "two")], env=env, capture_output=True, text=True,
                         timeout=400)
    said = two.stdout + two.stderr
    print(said)  # the run's lines under `pytest -s`, each task's with srun's label
    assert two.returncode == 0, said[-6000:]
    lines = said.splitlines()
    # process 0 alone reads the folder, says the schedule and writes --out
    reads = [line for line in lines if line.split(": ", 1)[-1].startswith("reading ")]
    assert len(reads) == 1 and reads[0].startswith("0: reading "), said
    assert any(line.startswith("0: batch 8 (1 x 8 on the devices of 2 processes)") for line in lines), said
    assert not [line for line in lines if line.startswith("1: ") and "wrote" in line], said
    same_model(tmp_path / "two", tmp_path / "one")
