"""One process of a JAX run over several processes, started by tests/test_multiprocess.py (through
keras_vit.launch, which sets KERAS_DISTRIBUTION_* for each process) or alone on 4 virtual devices for
the reference. Trains a tiny ViT under each way of feeding the data and writes, from process 0, the
losses, metrics and weights of each to argv[1]/<process count>.npz.

Every process passes its own rows of each global batch of 16 (what `keras_vit.distribute` expects on
several processes): numpy arrays cut with `distribute.process_rows`, a PyDataset of those rows, and
`data.load(..., process_index, process_count)` of a mocked TFDS dataset."""

import os
import sys

import keras
import numpy as np
from jax.experimental import multihost_utils

import keras_vit
from keras_vit import distribute, recipes

process_index, process_count = distribute.initialize_multihost()
assert keras.backend.backend() == "jax" and len(keras.distribution.list_devices()) == 4

CONFIG = {"image_size": 16, "patch_size": 8, "hidden_size": 32, "mlp_dim": 64, "num_heads": 4, "num_layers": 2,
          "classes": 10, "classifier_activation": None, "representation_size": 16}
BATCH, STEPS = 16, 4
rng = np.random.default_rng(0)
X = rng.uniform(-1, 1, (STEPS * BATCH, 16, 16, 3)).astype("float32")
Y = rng.integers(0, 10, STEPS * BATCH).astype("int32")
XE, YE = X[::-1].copy(), Y[::-1].copy()


class StepLosses(keras.callbacks.Callback):
    def on_train_begin(self, logs=None):
        self.losses = []

    def on_train_batch_end(self, batch, logs=None):
        self.losses.append(float(logs["loss"]))


class Rows(keras.utils.PyDataset):
    """This process's rows of every global batch, as a PyDataset."""

    def __init__(self, x, y):
        super().__init__()
        self.x, self.y = distribute.process_rows((x, y), BATCH)
        self.rows = BATCH // distribute.process_shard()[1]

    def __len__(self):
        return len(self.x) // self.rows

    def __getitem__(self, i):
        return self.x[i * self.rows:(i + 1) * self.rows], self.y[i * self.rows:(i + 1) * self.rows]


def numpy_feed():
    (x, y), (xe, ye) = distribute.process_rows((X, Y), BATCH), distribute.process_rows((XE, YE), BATCH)
    rows = BATCH // distribute.process_shard()[1]
    return {"x": x, "y": y, "batch_size": rows}, {"x": xe, "y": ye, "batch_size": rows}


def pydataset_feed():
    return {"x": Rows(X, Y)}, {"x": Rows(XE, YE)}


def load_feed():
    import tensorflow_datasets as tfds

    from keras_vit import data

    index, count = distribute.process_shard()
    with tfds.testing.mock_data(num_examples=STEPS * BATCH):
        train, test = data.load("cifar10", 16, BATCH, data_dir="/nonexistent/tfds", shuffle_buffer=1,
                                repeat=False, process_index=index, process_count=count)
    return {"x": train}, {"x": test}


def train(setup, feed):
    keras.distribution.set_distribution(None)
    setup()
    keras.utils.set_random_seed(0)
    model = keras_vit.VisionTransformer(**CONFIG)
    recipes.compile_for_finetuning(model, total_steps=STEPS, base_lr=0.1, warmup_steps=1, batch_size=BATCH)
    fit_data, eval_data = feed()
    losses = StepLosses()
    history = model.fit(**fit_data, epochs=1, shuffle=False, verbose=0, callbacks=[losses])
    metrics = model.evaluate(**eval_data, verbose=0, return_dict=True)
    return {"losses": np.array(losses.losses), "fit_accuracy": history.history["accuracy"][-1],
            "eval_loss": metrics["loss"], "eval_accuracy": metrics["accuracy"],
            "weights": [np.asarray(multihost_utils.process_allgather(v.value, tiled=True)) for v in model.weights]}


RUNS = {
    "data_numpy": (distribute.data_parallel, numpy_feed),
    "model_numpy": (lambda: distribute.model_parallel((2, 2)), numpy_feed),
    "model14_numpy": (lambda: distribute.model_parallel((1, 4)), numpy_feed),
    "data_pydataset": (distribute.data_parallel, pydataset_feed),
    "data_load": (distribute.data_parallel, load_feed),
}
out = {}
for name in sys.argv[2].split(",") if len(sys.argv) > 2 else RUNS:
    result = train(*RUNS[name])
    for key, value in result.items():
        if key == "weights":
            for i, w in enumerate(value):
                out[f"{name}/weights/{i}"] = w
        else:
            out[f"{name}/{key}"] = value
    print(f"process {process_index}: {name} done", flush=True)
if process_index == 0:
    os.makedirs(sys.argv[1], exist_ok=True)
    np.savez(os.path.join(sys.argv[1], f"{process_count}.npz"), **out)
