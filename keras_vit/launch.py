"""Try a multi-host run on one machine: start N processes of one command, as N hosts would run it.

    python -m keras_vit.launch -n 2 --cpu-devices 2 -- examples/finetune_cifar10.py --distribute data ...

Each process gets the variables a cluster would give it: KERAS_DISTRIBUTION_JOB_ADDRESSES (the
coordinator, 127.0.0.1 and a free port: `launchers.free_ports`), KERAS_DISTRIBUTION_NUM_PROCESSES and
KERAS_DISTRIBUTION_PROCESS_ID, which `keras_vit.distribute.initialize_multihost()` reads (JAX), and
TF_CONFIG naming N workers on loopback ports, which `keras_vit.distribute.tf_strategy()` turns into a
`MultiWorkerMirroredStrategy` (TensorFlow). `--cpu-devices K` gives each process K virtual CPU devices
(XLA_FLAGS), to try a mesh without accelerators.

The processes' output is forwarded line by line, each line prefixed with the process index. When
one process fails (a non-zero exit or a signal, e.g. killed), the others are stopped (SIGTERM, then
SIGKILL) instead of waiting forever for it in a collective, and one message says which process
ended how; the exit status is then 1. When every process ends with 0, so does the launcher.

Only for trying things on one machine: on real hosts, the cluster's own launcher (`srun`, `mpiexec`, a TPU
VM slice, a Kubernetes JobSet) starts one process per host, and `keras_vit.distribute.launchers` reads what
it gives each process (docs/scaling.md, "Under a cluster's launcher").
"""

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time

from keras_vit.distribute.launchers import free_ports

__all__ = ["launch"]

GRACE_S = 10


def process_env(index, count, ports, cpu_devices=None, base=None):
    """The environment of process `index` of `count` (ports[0] the JAX coordinator, ports[1:] TF's workers)."""
    env = dict(os.environ if base is None else base)
    env.update({
        "KERAS_DISTRIBUTION_JOB_ADDRESSES": f"127.0.0.1:{ports[0]}",
        "KERAS_DISTRIBUTION_NUM_PROCESSES": str(count),
        "KERAS_DISTRIBUTION_PROCESS_ID": str(index),
        "TF_CONFIG": json.dumps({"cluster": {"worker": [f"127.0.0.1:{p}" for p in ports[1:]]},
                                 "task": {"type": "worker", "index": index}}),
        "PYTHONUNBUFFERED": "1",
    })
    if cpu_devices:
        env["XLA_FLAGS"] = with_cpu_devices(env.get("XLA_FLAGS", ""), cpu_devices)
    return env


def with_cpu_devices(xla_flags, count):
    """The XLA_FLAGS string `xla_flags` with its virtual CPU device count (if any) replaced by `count`."""
    flags = [f for f in xla_flags.split() if "xla_force_host_platform_device_count" not in f]
    return " ".join([*flags, f"--xla_force_host_platform_device_count={count}"])


def _describe(code):
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with status {code}"


def _forward(stream, prefix, out, lock):
    for line in iter(stream.readline, b""):
        with lock:
            out.write(prefix + line.decode(errors="replace"))
            out.flush()
    stream.close()


def _stop(procs):
    """SIGTERM to each process group still running, SIGKILL to those alive after GRACE_S."""
    for p in procs:
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
    deadline = time.monotonic() + GRACE_S
    for p in procs:
        try:
            p.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait()


def launch(command, processes, cpu_devices=None, timeout=None, out=None):
    """Run `command` (a list: a Python script and its arguments, or any program) as `processes` processes.

    Args:
        command: argv of one process; a first item ending in ".py" runs with this Python.
        processes: the number of processes (as many "hosts").
        cpu_devices: virtual CPU devices per process (XLA_FLAGS), or None.
        timeout: seconds before every process is stopped (None: no limit).
        out: where the prefixed output goes (default sys.stdout).
    Returns:
        0 when every process ended with 0, else 1 (after one message naming the first to fail).
    """
    out = sys.stdout if out is None else out
    if processes < 1:
        raise ValueError(f"launch: the number of processes must be positive, got {processes}")
    if not command:
        raise ValueError("launch: no command given; expected e.g. examples/finetune_cifar10.py --distribute data")
    command = list(command)
    if command[0].endswith(".py"):
        command = [sys.executable, *command]
    ports = free_ports(processes + 1)
    lock = threading.Lock()
    procs, threads = [], []
    for index in range(processes):
        p = subprocess.Popen(command, env=process_env(index, processes, ports, cpu_devices), stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        procs.append(p)
        t = threading.Thread(target=_forward, args=(p.stdout, f"[{index}] ", out, lock), daemon=True)
        t.start()
        threads.append(t)
    start, failed, message = time.monotonic(), None, None

    def stop_all(signum, frame):
        raise KeyboardInterrupt

    main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, stop_all) if main_thread else None
    try:
        while True:
            codes = [p.poll() for p in procs]
            failed = next((i for i, c in enumerate(codes) if c not in (None, 0)), None)
            if failed is not None:
                message = (f"keras_vit.launch: process {failed} of {processes} {_describe(codes[failed])}; "
                           "stopped the others")
                break
            if all(c == 0 for c in codes):
                break
            if timeout is not None and time.monotonic() - start > timeout:
                message = f"keras_vit.launch: the processes ran past --timeout {timeout:g} s; stopped them all"
                break
            time.sleep(0.2)
    except KeyboardInterrupt:
        message = "keras_vit.launch: interrupted; stopped every process"
    finally:
        _stop(procs)
        for t in threads:
            t.join(5)
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    if message:
        with lock:
            out.write(message + "\n")
            out.flush()
        return 1
    return 0


def main(argv=None):
    """`python -m keras_vit.launch`: parse `argv` (default sys.argv[1:]) and run `launch`; returns its status."""
    parser = argparse.ArgumentParser(
        prog="python -m keras_vit.launch",
        description="Start N processes of a command on this machine, as N hosts of a multi-host run "
                    "(loopback coordinator; JAX's KERAS_DISTRIBUTION_* variables and TensorFlow's TF_CONFIG set).")
    parser.add_argument("-n", "--processes", type=int, default=2, help="processes to start (default 2)")
    parser.add_argument("--cpu-devices", type=int, default=None,
                        help="virtual CPU devices per process (XLA_FLAGS), to try a mesh on a CPU")
    parser.add_argument("--timeout", type=float, default=None, help="stop every process after this many seconds")
    parser.add_argument("command", nargs=argparse.REMAINDER,
                        help="the script and its arguments (after --), e.g. -- examples/finetune_cifar10.py ...")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if args.processes < 1:
        parser.error(f"--processes must be positive, got {args.processes}")
    if args.cpu_devices is not None and args.cpu_devices < 1:
        parser.error(f"--cpu-devices must be positive, got {args.cpu_devices}")
    if not command:
        parser.error("no command given; expected e.g. -- examples/finetune_cifar10.py --distribute data")
    return launch(command, args.processes, args.cpu_devices, args.timeout)


if __name__ == "__main__":
    sys.exit(main())
