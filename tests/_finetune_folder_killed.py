"""`keras-vit finetune DIR` for tests/test_finetune_multiprocess.py to start through keras_vit.launch, with a
callback that kills a process. argv: the command's arguments after `finetune`. KILL_PROCESS=i: process i kills
itself with SIGKILL at the end of the first epoch (after its other callbacks: on process 0, the backup)."""

import os
import signal
import sys

import keras

from keras_vit import cli
from keras_vit.recipes import own_images


class KillAfterFirstEpoch(keras.callbacks.Callback):
    def on_epoch_end(self, epoch, logs=None):
        print(f"killing process {os.environ['KERAS_DISTRIBUTION_PROCESS_ID']}", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)


kill = os.environ.get("KILL_PROCESS") == os.environ.get("KERAS_DISTRIBUTION_PROCESS_ID")
own_images.run(cli.parser().parse_args(["finetune", *sys.argv[1:]]), [KillAfterFirstEpoch()] if kill else [])
