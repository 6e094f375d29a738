"""One worker of a two-worker TensorFlow run under keras_vit.launch, for tests/test_multiprocess.py: joins
`tf_strategy()` with a heartbeat timeout of argv[1] seconds, meets the other worker, then worker 1 stays argv[2]
seconds more at its exit than worker 0 (the leader, which holds the coordination service): awake (argv[4] ==
"awake", still sending heartbeats) or stopped (argv[4] == "stopped", SIGSTOP: no heartbeats, while the kernel
still takes connections at its server's port, as a process stuck in its exit); with argv[3] == "last", every
worker calls `keras_vit.distribute.leave_last_at_exit()`. Each says when it leaves."""

import atexit
import json
import os
import signal
import subprocess
import sys
import time

from keras_vit import distribute
from keras_vit.distribute import strategies
from keras_vit.recipes import finetune_devices

strategies.HEARTBEAT_TIMEOUT_S = int(sys.argv[1])
me = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
with distribute.tf_strategy().scope():
    finetune_devices.wait_for_every_process("joined")


def stopped(seconds):
    print(f"process {me} stops at {time.time():.3f}", flush=True)
    subprocess.Popen(["sh", "-c", f"sleep {seconds}; kill -CONT {os.getpid()}"])
    os.kill(os.getpid(), signal.SIGSTOP)


atexit.register(lambda: print(f"process {me} leaves at {time.time():.3f}", flush=True))
if me == 1:
    atexit.register(time.sleep if sys.argv[4] == "awake" else stopped, float(sys.argv[2]))
if sys.argv[3] == "last":
    distribute.leave_last_at_exit()
