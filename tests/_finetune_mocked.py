"""The fine-tuning recipe on mocked TFDS cifar10 (12 examples), for tests/test_multiprocess.py to start
through keras_vit.launch. argv: the recipe's flags, after an optional `--kill i k`: process i kills itself with
SIGKILL at its k-th train batch (0-based, counted from the start of this process). (An argument, not a variable:
a launcher in a thread of the test takes the test process's environment, which another run beside it shares.)"""

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


argv, callbacks = sys.argv[1:], []
if argv[:1] == ["--kill"]:
    if argv[1] == os.environ.get("KERAS_DISTRIBUTION_PROCESS_ID"):
        callbacks.append(KillAt(int(argv[2])))
    argv = argv[3:]
with tfds.testing.mock_data(num_examples=12):
    finetune.main("cifar10", argv, callbacks=callbacks)
