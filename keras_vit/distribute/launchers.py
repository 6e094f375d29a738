"""Which launcher started this process, and how many processes it started: `detect` reads the environment
alone (nothing joined, no device touched, nothing sent), in the order `jax.distributed.initialize()` with no
argument looks (the variables `python -m keras_vit.launch` sets first); `coordinator` is where process 0
listens, and `wait_for_coordinator` waits, up to a limit, until it can be reached.

- ``keras``: KERAS_DISTRIBUTION_NUM_PROCESSES / _PROCESS_ID / _JOB_ADDRESSES (`keras_vit.launch`, or set by
  hand, e.g. from a Kubernetes JobSet's environment);
- ``tf_config``: TF_CONFIG's workers (TensorFlow only);
- ``slurm``: a step of `srun` (the variables of one task: SLURM_JOB_ID, SLURM_STEP_NODELIST, SLURM_NTASKS,
  SLURM_PROCID, SLURM_LOCALID, as JAX requires them; a batch script outside `srun` has no step: one process);
- ``mpi``: `mpiexec` / `mpirun` of Open MPI (OMPI_COMM_WORLD_SIZE / _RANK) or of MPICH, Intel MPI and other
  PMI launchers (PMI_SIZE / PMI_RANK). Open MPI 4's launcher names its own host (JAX reads it); otherwise
  process 0's host is sent over MPI itself (mpi4py, as JAX's ``cluster_detection_method="mpi4py"`` does);
- ``tpu``: a Cloud TPU VM (its accelerator devices, `tpu_address`, which `probe_machine` reads too): JAX asks
  the TPU's metadata for the slice's hosts when it joins, so the count is known only then (None here).

A launcher that says one process (``mpiexec -n 1``, a one-task step) is no launcher: None.
"""

import collections
import glob
import os
import random
import re
import socket
import time

__all__ = ["JOIN_TIMEOUT_S", "Launch", "coordinator", "detect", "first_slurm_host", "free_ports", "joined_count",
           "mpi_coordinator", "slurm_port", "tpu_address", "wait_for_coordinator"]

Launch = collections.namedtuple("Launch", ["launcher", "count", "index"])
Launch.__doc__ = """`launcher` one of the names above; `count` the number of processes (None: known once joined, a
TPU slice); `index` this process's (None likewise)."""

# how each launcher is named in messages ("this is one of 2 processes (mpiexec)")
SAID = {"keras": "KERAS_DISTRIBUTION_NUM_PROCESSES", "tf_config": "TF_CONFIG", "slurm": "srun: SLURM_NTASKS",
        "mpi": "mpiexec", "tpu": "the TPU slice", "arguments": "the arguments"}
SLURM_STEP = ("SLURM_JOB_ID", "SLURM_STEP_NODELIST", "SLURM_NTASKS", "SLURM_PROCID", "SLURM_LOCALID")
# process 0 not reachable within this many seconds: the join is refused (JAX's own limit for its processes)
JOIN_TIMEOUT_S = 300
# the ports `free_ports` draws from: above the well-known and registered services' usual ones, below the
# kernel's ephemeral range (Linux's default starts at 32768, the IANA range that macOS and Windows use at 49152)
PORTS_FROM, EPHEMERAL_FROM = 20000, 32768


def detect(environ=None, backend=None):
    """The `Launch` of this process, or None for a process started alone.

    Args:
        environ: the variables to read (None: `os.environ`).
        backend: the Keras backend to decide for (None: Keras' own); TF_CONFIG counts on TensorFlow only.
    """
    env = os.environ if environ is None else environ
    if backend is None:
        import keras

        backend = keras.backend.backend()
    found = None
    if env.get("KERAS_DISTRIBUTION_NUM_PROCESSES"):
        found = Launch("keras", int(env["KERAS_DISTRIBUTION_NUM_PROCESSES"]),
                       int(env.get("KERAS_DISTRIBUTION_PROCESS_ID") or 0))
    elif backend == "tensorflow" and env.get("TF_CONFIG"):
        import json

        config = json.loads(env["TF_CONFIG"])
        found = Launch("tf_config", len(config.get("cluster", {}).get("worker", [])),
                       int(config.get("task", {}).get("index", 0)))
    elif all(env.get(name) for name in SLURM_STEP):
        found = Launch("slurm", int(env["SLURM_NTASKS"]), int(env["SLURM_PROCID"]))
    elif env.get("OMPI_COMM_WORLD_SIZE"):
        found = Launch("mpi", int(env["OMPI_COMM_WORLD_SIZE"]), int(env.get("OMPI_COMM_WORLD_RANK") or 0))
    elif env.get("PMI_SIZE"):
        found = Launch("mpi", int(env["PMI_SIZE"]), int(env.get("PMI_RANK") or 0))
    elif backend == "jax" and _on_a_tpu_vm(env):
        found = Launch("tpu", None, None)
    if found is None or found.count == 1:
        return None
    return found


def joined_count():
    """The number of processes JAX joined (`jax.distributed`), None where it joined none or one: a TPU
    slice's size, known once joined."""
    import jax

    return jax.process_count() if jax.distributed.is_initialized() and jax.process_count() > 1 else None


def _on_a_tpu_vm(env):
    return tpu_address(env) == "local"


def tpu_address(environ=None):
    """"local" on a Cloud TPU VM (its accelerator devices), TPU_NAME of `environ` (None: `os.environ`) where
    set (a TPU node), else None."""
    env = os.environ if environ is None else environ
    return env.get("TPU_NAME") or ("local" if glob.glob("/dev/accel*") or glob.glob("/dev/vfio/[0-9]*") else None)


def slurm_port(env):
    """The port process 0 of a SLURM job listens on, from SLURM_JOB_ID of `env` (the variables): JAX's rule (an
    ephemeral port from the job id), which TensorFlow's workers take as their first port too."""
    return int(env["SLURM_JOB_ID"]) % 2**12 + (65535 - 2**12 + 1)


def first_slurm_host(nodelist):
    """The first host of the SLURM node list `nodelist`: 'node001', 'node001,gpu2', 'node[001-015],gpu2' and
    'node[001,007-015]' -> 'node001'."""
    first = re.match(r"[^,\[]*(\[[^\]]*\])?", nodelist).group(0)
    if "[" not in first:
        return first
    prefix, ranges = first.rstrip("]").split("[")
    return prefix + re.split("[,-]", ranges)[0]


def coordinator(launch, environ=None):
    """'host:port' where process 0 of `launch` listens, read from `environ` (None: `os.environ`), or None where
    JAX finds it itself (a TPU slice, Open MPI 4) or MPI sends it (`mpi_coordinator`)."""
    env = os.environ if environ is None else environ
    if launch.launcher == "keras":
        return (env.get("KERAS_DISTRIBUTION_JOB_ADDRESSES") or "").split(",")[0] or None
    if launch.launcher == "slurm":
        port = env.get("JAX_COORDINATOR_PORT") or slurm_port(env)
        return f"{first_slurm_host(env['SLURM_STEP_NODELIST'])}:{port}"
    return None


def _ephemeral_from():
    """The first port of the kernel's ephemeral range (Linux's ip_local_port_range), else EPHEMERAL_FROM."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return min(int(f.read().split()[0]), EPHEMERAL_FROM)
    except (OSError, ValueError, IndexError):
        return EPHEMERAL_FROM


def _bindable(port):
    """Whether a TCP server could listen at `port` on every interface now (as TensorFlow's and JAX's do)."""
    with socket.socket() as s:
        try:
            s.bind(("", port))
        except OSError:
            return False
        return True


def free_ports(count):
    """`count` distinct TCP ports that a server could listen at on every interface of this host, drawn at random
    from below the kernel's ephemeral range (between PORTS_FROM and its start, where the range leaves a
    thousand ports there; else from the range itself).

    The processes that listen at them start later, and a port the kernel gave out in between (to any program's
    outgoing connection, or a `bind` to port 0) would be taken: the kernel gives out only ports of its
    ephemeral range, so those drawn below it stay free unless a program asks for one by number.
    """
    end = _ephemeral_from()
    pool = range(PORTS_FROM, end) if end - PORTS_FROM >= 1000 else range(end, 65536)
    ports = []
    for port in random.SystemRandom().sample(pool, len(pool)):
        if len(ports) == count:
            break
        if _bindable(port):
            ports.append(port)
    if len(ports) < count:
        raise OSError(f"free_ports: expected {count} free TCP ports in {pool.start}-{pool.stop - 1}, found {len(ports)}")
    return ports


def mpi_coordinator(launch):
    """'host:port' of process 0 of an MPI launch, sent by process 0 to every process over MPI (mpi4py): its
    host name and a port free on it (JAX_COORDINATOR_PORT if set)."""
    try:
        from mpi4py import MPI
    except ImportError:
        raise RuntimeError(
            f"process {launch.index} of {launch.count} started by mpiexec: joining them needs mpi4py, which sends "
            "process 0's address to the others (`pip install mpi4py`), or the variables KERAS_DISTRIBUTION_"
            "JOB_ADDRESSES / _NUM_PROCESSES / _PROCESS_ID set for each process") from None
    address = None
    if MPI.COMM_WORLD.Get_rank() == 0:
        port = os.environ.get("JAX_COORDINATOR_PORT") or free_ports(1)[0]
        address = f"{socket.gethostname()}:{port}"
    return MPI.COMM_WORLD.bcast(address, root=0)


def wait_for_coordinator(launch, address, timeout=None):
    """Waits until process 0's `address` ('host:port') takes a connection (process 0 of `launch` itself does not
    wait); raises a ConnectionError naming the address, the launcher and the limit once `timeout` seconds
    (KERAS_VIT_JOIN_TIMEOUT_S, else JOIN_TIMEOUT_S) have passed."""
    if launch.index in (0, None) or address is None:  # process 0 (or not known to be another) listens itself
        return
    limit = float(os.environ.get("KERAS_VIT_JOIN_TIMEOUT_S") or JOIN_TIMEOUT_S) if timeout is None else timeout
    host, port = address.rsplit(":", 1)
    deadline = time.monotonic() + limit
    while True:
        try:
            with socket.create_connection((host, int(port)), timeout=5):
                return
        except OSError as err:
            if time.monotonic() >= deadline:
                raise ConnectionError(
                    f"process {launch.index} of {launch.count} ({launch.launcher}) could not reach process 0 at "
                    f"{address} within {limit:g} s ({err}); expected process 0 of the same launch listening there "
                    "(set KERAS_VIT_JOIN_TIMEOUT_S to wait longer)") from None
        time.sleep(0.5)
