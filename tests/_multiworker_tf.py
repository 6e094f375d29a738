"""One worker of a TensorFlow MultiWorkerMirroredStrategy run, started by tests/test_multiprocess.py through
keras_vit.launch (which sets TF_CONFIG), or alone (`reference` as argv[2]) for a MirroredStrategy over 2
logical CPU devices and the default strategy. Trains a tiny ViT with the fine-tuning recipe (global-norm
clipping binding) on numpy arrays that every worker passes whole, evaluates, and writes from worker 0 the
losses, metrics and weights to argv[1]/<name>.npz."""

import json
import os
import sys

import numpy as np
import tensorflow as tf

reference = sys.argv[2:] == ["reference"]
if reference:
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)

import keras

import keras_vit
from keras_vit import distribute, recipes

assert keras.backend.backend() == "tensorflow"
BATCH, STEPS = 16, 4
rng = np.random.default_rng(0)
X = rng.uniform(-1, 1, (STEPS * BATCH, 16, 16, 3)).astype("float32")
Y = rng.integers(0, 3, STEPS * BATCH)


class StepLosses(keras.callbacks.Callback):
    def on_train_begin(self, logs=None):
        self.losses = []

    def on_train_batch_end(self, batch, logs=None):
        self.losses.append(float(logs["loss"]))


def train(strategy):
    keras.utils.set_random_seed(0)
    with strategy.scope():
        replicas = distribute.num_replicas()
        model = keras_vit.VisionTransformer(image_size=16, patch_size=8, hidden_size=16, mlp_dim=32, num_heads=2,
                                            num_layers=1, classes=3, classifier_activation=None)
        recipes.compile_for_finetuning(model, total_steps=STEPS, base_lr=0.1, warmup_steps=1, batch_size=BATCH)
    losses = StepLosses()
    history = model.fit(X, Y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0, callbacks=[losses])
    metrics = model.evaluate(X[::-1], Y[::-1], batch_size=BATCH, verbose=0, return_dict=True)
    return dict(replicas=replicas, losses=losses.losses, fit_accuracy=history.history["accuracy"][-1],
                eval_loss=metrics["loss"], eval_accuracy=metrics["accuracy"],
                **{f"weights/{i}": w for i, w in enumerate(model.get_weights())})


os.makedirs(sys.argv[1], exist_ok=True)
if reference:
    np.savez(os.path.join(sys.argv[1], "mirrored.npz"), **train(tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])))
    np.savez(os.path.join(sys.argv[1], "default.npz"),
             **train(distribute.tf_strategy(distribute.Machine(tpu=None, gpus=0, tf_config=None))))
else:
    strategy = distribute.tf_strategy()
    assert isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy), strategy
    result = train(strategy)
    if json.loads(os.environ["TF_CONFIG"])["task"]["index"] == 0:
        np.savez(os.path.join(sys.argv[1], "multi_worker.npz"), **result)
