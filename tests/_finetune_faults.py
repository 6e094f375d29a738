"""`keras-vit finetune DIR` for tests/test_finetune_multiprocess.py to start through keras_vit.launch, with a
callback that kills or stops a process at the end of the first epoch (after its other callbacks: on process 0,
the backup). argv: the command's arguments after `finetune`. KILL_PROCESS=i: process i kills itself with SIGKILL.
STOP_PROCESS=i and STOP_S=s: process i is stopped (SIGSTOP) for s seconds, as a loaded host holds up a process,
then goes on."""

import os
import signal
import subprocess
import sys

import keras

from keras_vit import cli
from keras_vit.recipes import own_images


class KillAfterFirstEpoch(keras.callbacks.Callback):
    def on_epoch_end(self, epoch, logs=None):
        if epoch == 0:
            print(f"killing process {os.environ['KERAS_DISTRIBUTION_PROCESS_ID']}", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)


class StopAfterFirstEpoch(keras.callbacks.Callback):
    def on_epoch_end(self, epoch, logs=None):
        if epoch == 0:
            seconds = float(os.environ["STOP_S"])
            print(f"stopping process {os.environ['KERAS_DISTRIBUTION_PROCESS_ID']} for {seconds:g} s", flush=True)
            subprocess.Popen(["sh", "-c", f"sleep {seconds}; kill -CONT {os.getpid()}"])
            os.kill(os.getpid(), signal.SIGSTOP)


me = os.environ.get("KERAS_DISTRIBUTION_PROCESS_ID")
faults = [KillAfterFirstEpoch()] if me and os.environ.get("KILL_PROCESS") == me else []
faults += [StopAfterFirstEpoch()] if me and os.environ.get("STOP_PROCESS") == me else []
own_images.run(cli.parser().parse_args(["finetune", *sys.argv[1:]]), faults)
