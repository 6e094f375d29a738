"""The fine-tuning recipe on mocked TFDS cifar10 (12 examples), for tests/test_multiprocess.py to start
through keras_vit.launch. argv: the recipe's flags. PAUSE_AT=k with KILL_PROCESS=i: process i kills itself
with SIGKILL at its k-th train batch (0-based, counted from the start of this process)."""

import os
import signal
import sys

import keras
import tensorflow_datasets as tfds

from keras_vit.recipes import finetune


class KillAt(keras.callbacks.Callback):
    def __init__(self, step):
        super().__init__()
        self.step, self.seen = step, 0

    def on_train_batch_end(self, batch, logs=None):
        if self.seen == self.step:
            print(f"killing process {os.environ['KERAS_DISTRIBUTION_PROCESS_ID']}", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        self.seen += 1


kill = "PAUSE_AT" in os.environ and os.environ.get("KILL_PROCESS") == os.environ.get("KERAS_DISTRIBUTION_PROCESS_ID")
with tfds.testing.mock_data(num_examples=12):
    finetune.main("cifar10", sys.argv[1:], callbacks=[KillAt(int(os.environ["PAUSE_AT"]))] if kill else [])
