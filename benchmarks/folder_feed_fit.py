"""Part 2 of folder_feed.py: `model.fit` fed from the folder against the same batches held in memory, per
Keras backend (a process each, folder_feed.py run with `--fit-worker`): the step time of each feed, the
time the loop waits for its next batch, and the table of their ratios."""

import json
import os
import statistics
import subprocess
import sys
import time

import numpy as np

from photo_folder import PHOTOS, load_average

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
SCRIPT = os.path.join(HERE, "folder_feed.py")  # the command, whose --fit-worker runs `fit_worker`
TINY = {"patch_size": 8, "hidden_size": 32, "mlp_dim": 64, "num_heads": 2, "num_layers": 2}
FEEDS = ("in memory", "folder, tf.data", "folder, PyDataset")


def _time_fetches(backend, record):
    """Makes `model.fit` call `record((when, seconds))` for each batch its loop takes from the feed (the wait for a
    batch that is not ready), on JAX and torch, where the loop takes batches from a Python iterator (Keras' epoch
    iterator's, patched here); TensorFlow takes them inside its compiled step: returns False there."""
    if backend == "jax":
        from keras.src.backend.jax.trainer import JAXEpochIterator as epoch_iterator
    elif backend == "torch":
        from keras.src.backend.torch.trainer import TorchEpochIterator as epoch_iterator
    else:
        return False
    get_iterator = epoch_iterator._get_iterator

    def timed(self):
        batches = iter(get_iterator(self))
        while True:
            start = time.perf_counter()
            try:
                batch = next(batches)
            except StopIteration:
                return
            now = time.perf_counter()
            record((now, now - start))
            yield batch

    epoch_iterator._get_iterator = timed
    return True


def fit_worker(args, augment=None):
    """Runs with KERAS_BACKEND set: one JSON line of the step times per feed and round. `augment`: None (the
    plain feed), or {"feed": from_directory's augmentation arguments, "mixup": MixUp's} (augmented_feed.py):
    the folder's batches augmented and mixed (`mixed_feeds`), the in-memory ones the same batches, soft
    targets."""
    import keras

    sys.path.insert(0, ROOT)
    import keras_vit
    from keras_vit import data

    size, batch, steps = args.fit_image_size, args.fit_batch, args.fit_steps
    if args.model == "tiny":
        model = keras_vit.VisionTransformer(image_size=size, classes=len(PHOTOS), input_dtype="uint8", **TINY)
    else:
        model = getattr(keras_vit, args.model)(weights=None, image_size=size, classes=len(PHOTOS), input_dtype="uint8")
    fits = args.fit_rounds * len(FEEDS) + 1
    augment = augment or {}
    keras_vit.recipes.compile_for_finetuning(model, total_steps=fits * (steps + 1), base_lr=0.01, warmup_steps=steps,
                                             batch_size=batch, sparse_labels="mixup" not in augment)
    feeds = {}
    for pipeline, name in (("tf.data", "folder, tf.data"), ("pydataset", "folder, PyDataset")):
        feeds[name], _ = data.from_directory(args.fit_worker, size, batch, validation_split=0.0, pipeline=pipeline,
                                             image_dtype="uint8", **augment.get("feed", {}))
    if "mixup" in augment:
        from keras_vit.data.mixup import MixUp, mixed_feeds

        mix = MixUp(num_classes=len(PHOTOS), **augment["mixup"])
        feeds = {name: mixed_feeds(feed, None, mix)[0] for name, feed in feeds.items()}
    cached = [b for _, b in zip(range(steps + 1), feeds["folder, tf.data"].as_numpy_iterator())]
    x, y = np.concatenate([b[0] for b in cached]), np.concatenate([b[1] for b in cached])

    class Clock(keras.callbacks.Callback):
        def on_train_begin(self, logs=None):
            self.ends = []

        def on_train_batch_end(self, batch, logs=None):
            keras.tree.map_structure(np.asarray, logs or {})  # the step's results reached: JAX dispatches ahead
            self.ends.append(time.perf_counter())

    clock = Clock()
    fetched = []  # (when, seconds waited) of each batch the loop took
    fetches = _time_fetches(keras.backend.backend(), fetched.append)

    def step_seconds(feed):
        """(seconds per step, seconds per step the loop waited for its next batch, None where not seen)."""
        fetched.clear()
        if feed == "in memory":
            model.fit(x, y, batch_size=batch, shuffle=False, epochs=1, verbose=0, callbacks=[clock])
        else:
            model.fit(feeds[feed], steps_per_epoch=steps + 1, epochs=1, verbose=0, callbacks=[clock])
        assert len(clock.ends) == steps + 1
        timed = [seconds for when, seconds in fetched if clock.ends[0] < when <= clock.ends[-1]]
        assert not fetches or len(timed) == steps, (len(timed), steps)
        wait = sum(timed) / steps if fetches else None
        return (clock.ends[-1] - clock.ends[0]) / steps, wait

    step_seconds("in memory")  # compiles
    rounds, waits = [], []
    for r in range(args.fit_rounds):
        order = FEEDS if r % 2 == 0 else FEEDS[::-1]
        times = {feed: step_seconds(feed) for feed in order}
        rounds.append({feed: step for feed, (step, _) in times.items()})
        waits.append({feed: wait for feed, (_, wait) in times.items()})
    print(json.dumps({"backend": keras.backend.backend(), "rounds": rounds, "waits": waits}), flush=True)


def measure_fits(args, folder, script=SCRIPT):
    """{backend: worker result or {"error": ...}}, each from `script --fit-worker folder ...` (a process each)."""
    out = {}
    for backend in args.backends:
        env = {**os.environ, "KERAS_BACKEND": backend}
        command = [sys.executable, script, "--fit-worker", folder]
        for key in ("model", "fit_image_size", "fit_batch", "fit_steps", "fit_rounds"):
            command += [f"--{key.replace('_', '-')}", str(getattr(args, key))]
        load = load_average()
        proc = subprocess.run(command, env=env, capture_output=True, text=True, cwd=HERE)
        lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
        if proc.returncode or not lines:
            out[backend] = {"error": f"exit status {proc.returncode}: {proc.stderr.strip()[-1500:]}"}
        else:
            out[backend] = {**json.loads(lines[-1]), "load_average": [load, load_average()]}
    return out


def fit_table(fits, args):
    lines = [f"| backend | step, {FEEDS[0]} (s) | " + " | ".join(f"step, {f} (s) | x in memory" for f in FEEDS[1:])
             + " | ms per step taking the next batch: " + "; ".join(f.split(", ")[-1] for f in FEEDS) + " |",
             "|---" * (3 + 2 * (len(FEEDS) - 1)) + "|"]
    for backend, result in fits.items():
        if "error" in result:
            lines.append(f"| {backend} | not run: {result['error'].splitlines()[-1]} |")
            continue
        rounds = result["rounds"]
        cells = [f"{statistics.median(r[FEEDS[0]] for r in rounds):.3f}"]
        for feed in FEEDS[1:]:
            ratio = statistics.median(r[feed] / r[FEEDS[0]] for r in rounds)
            cells += [f"{statistics.median(r[feed] for r in rounds):.3f}", f"{ratio:.3f}x"]
        if result["waits"][0][FEEDS[0]] is None:
            cells.append("- (taken inside the compiled step)")
        else:
            waits = [statistics.median(r[feed] for r in result["waits"]) for feed in FEEDS]
            cells.append("; ".join(f"{1e3 * wait:.1f}" for wait in waits))
        lines.append(f"| {backend} | " + " | ".join(cells) + " |")
    return "\n".join(lines)
