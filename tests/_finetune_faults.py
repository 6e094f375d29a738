"""`keras-vit finetune DIR` for tests/test_finetune_multiprocess.py to start through a launcher, with a
callback that kills or stops a process at the end of the first epoch it runs (after its other callbacks: on
process 0, the backup). argv: the command's arguments after `finetune`. KILL_PROCESS=i: process i kills itself
with SIGKILL. STOP_PROCESS=i and STOP_S=s: process i is stopped (SIGSTOP) for s seconds, as a loaded host holds
up a process, then goes on. SAY_LEAVING=1: every process but 0 says, as it exits, whether process 0's report is
in --out by then."""

import atexit
import os
import signal
import subprocess
import sys

import keras

from keras_vit import cli
from keras_vit.distribute import launchers
from keras_vit.recipes import own_images


class AfterFirstEpoch(keras.callbacks.Callback):
    """Prints `said`, then calls `fault()`, at the end of the first epoch this process runs."""

    def __init__(self, said, fault):
        super().__init__()
        self.said, self.fault, self.done = said, fault, False

    def on_epoch_end(self, epoch, logs=None):
        if not self.done:
            self.done = True
            print(self.said, flush=True)
            self.fault()


def stop(seconds):
    subprocess.Popen(["sh", "-c", f"sleep {seconds}; kill -CONT {os.getpid()}"])
    os.kill(os.getpid(), signal.SIGSTOP)


launch = launchers.detect()  # keras_vit.launch's variables, or mpiexec's
me = None if launch is None else str(launch.index)
faults = []
if me and os.environ.get("KILL_PROCESS") == me:
    faults.append(AfterFirstEpoch(f"killing process {me}", lambda: os.kill(os.getpid(), signal.SIGKILL)))
if me and os.environ.get("STOP_PROCESS") == me:
    seconds = float(os.environ["STOP_S"])
    faults.append(AfterFirstEpoch(f"stopping process {me} for {seconds:g} s", lambda: stop(seconds)))
args = cli.parser().parse_args(["finetune", *sys.argv[1:]])
if me and me != "0" and os.environ.get("SAY_LEAVING") == "1":
    report = os.path.join(args.out, own_images.REPORT)
    atexit.register(lambda: print(f"process {me} leaves, the report written: {os.path.exists(report)}", flush=True))
own_images.run(args, faults)
