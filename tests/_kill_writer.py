"""Kill trials of keras_vit's writers (run by test_writer_kill.py): for each writer, a destination holding
version A, then trial after trial a forked child that rewrites it with B, A, B, ... without pause is killed
with SIGKILL after a random delay. After each kill the destination must read whole as A or B, and the next
write of it (the package's own) must leave no temporary behind. Prints one JSON object of what was seen.

    python tests/_kill_writer.py FOLDER TRIALS SEED [WRITER ...]

The writers run under Keras' numpy backend: their files do not depend on the backend, and a forked child of
a process with no backend threads (JAX's, TensorFlow's, torch's) can run them safely.
"""

import json
import os
import random
import signal
import sys
import time
import zipfile

os.environ["KERAS_BACKEND"] = "numpy"
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import h5py  # noqa: E402
import numpy as np  # noqa: E402

import keras_vit  # noqa: E402
from keras_vit import fileio  # noqa: E402

TINY = dict(image_size=32, patch_size=8, hidden_size=32, mlp_dim=64, num_heads=2, num_layers=2, classes=10,
            approximate_gelu=False)


def model(seed, lora=False):
    m = keras_vit.VisionTransformer(**TINY)
    if lora:
        keras_vit.enable_lora(m, 2)
    for i, v in enumerate(m.weights):
        v.assign(np.random.default_rng(seed * 1000 + i).normal(0, 0.1, v.shape).astype("float32"))
    return m


def h5_arrays(source):
    out = {}
    with h5py.File(source, "r") as f:
        f.visititems(lambda name, obj: out.__setitem__(name, obj[()]) if isinstance(obj, h5py.Dataset) else None)
    return out


def npz_arrays(path):
    with np.load(path, allow_pickle=False) as f:
        return {k: f[k] for k in f.files}


def keras_arrays(path):
    with zipfile.ZipFile(path) as archive, archive.open("model.weights.h5") as member:
        return h5_arrays(member)


def preset_arrays(path):
    with open(os.path.join(path, "config.json")) as f:
        config = json.load(f)
    return {"config": np.array(json.dumps(config, sort_keys=True)), **h5_arrays(os.path.join(path, "model.weights.h5"))}


def png_arrays(path):
    from PIL import Image

    with Image.open(path) as image:
        return {"pixels": np.asarray(image)}


def json_arrays(path):
    with open(path) as f:
        return {"json": np.array(json.dumps(json.load(f), sort_keys=True))}


def _figure(seed):
    """A figure of a fixed layout (a constrained one moves between its first draws: no two PNGs would match)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(2, 2), dpi=100)
    FigureCanvasAgg(fig)
    fig.add_subplot().imshow(np.random.default_rng(seed).uniform(size=(8, 8)))
    return fig


def _backup(m, folder):
    backup = keras_vit.recipes.TrainingBackup(folder)
    backup.set_model(m)
    return backup


def writers(folder):
    """{name: (destination, {version: write()}, read(destination) -> {name: array})}."""
    from keras_vit.convert import save_keras
    from keras_vit.inspection.plots import save_figure
    from keras_vit.weights import save_npz
    from keras_vit.weights.keras_hub_save import save_keras_hub_preset

    def path(name):
        return os.path.join(folder, name)

    models = {v: model(v) for v in (1, 2)}
    adapted = {v: model(v, lora=True) for v in (1, 2)}
    figures = {v: _figure(v) for v in (1, 2)}
    backups = {v: _backup(models[v], path("backup")) for v in (1, 2)}
    return {
        "npz": (path("vit.npz"), {v: lambda v=v: save_npz(models[v], path("vit.npz")) for v in (1, 2)}, npz_arrays),
        "lora": (path("adapters.lora"), {v: lambda v=v: keras_vit.save_lora(adapted[v], path("adapters.lora"))
                                         for v in (1, 2)}, npz_arrays),
        "json": (path("report.json"), {v: lambda v=v: fileio.write_json(path("report.json"), {"accuracy": v / 4,
                                                                                               "rows": [v] * 500})
                                       for v in (1, 2)}, json_arrays),
        "figure": (path("curves.png"), {v: lambda v=v: save_figure(figures[v], path("curves.png")) for v in (1, 2)},
                   png_arrays),
        "keras": (path("model.keras"), {v: lambda v=v: save_keras(models[v], path("model.keras")) for v in (1, 2)},
                  keras_arrays),
        "backup": (backups[1].path, {v: lambda v=v: backups[v].on_epoch_end(0, {"loss": 1.0}) for v in (1, 2)},
                   h5_arrays),
        "keras-hub": (path("preset"), {v: lambda v=v: save_keras_hub_preset(models[v], path("preset"))
                                       for v in (1, 2)}, preset_arrays),
    }


def same(a, b):
    return a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


def trial_run(name, destination, write, read, trials, rng):
    """Kills a child rewriting `destination` `trials` times; returns what each kill left."""
    write[1]()  # untimed: a writer's first call imports what it needs (the .keras one: seconds), no write's time
    start = time.perf_counter()
    for v in (1, 2, 1):
        write[v]()
    period = (time.perf_counter() - start) / 3  # one write's time
    versions = {}
    for v in (2, 1):
        write[v]()
        versions[v] = read(destination)
    assert not same(versions[1], versions[2]), f"{name}: versions 1 and 2 read the same"
    folder = os.path.dirname(destination)
    seen = {"writer": name, "trials": trials, "old_or_new": {1: 0, 2: 0}, "temporaries_after_kill": 0,
            "write_s": period, "failures": []}
    for trial in range(trials):
        delay = rng.uniform(0, 3 * period)
        pid = os.fork()
        if pid == 0:  # the child: rewrite without pause until killed
            try:
                while True:
                    write[2]()
                    write[1]()
            finally:
                os._exit(3)
        time.sleep(delay)
        os.kill(pid, signal.SIGKILL)
        _, status = os.waitpid(pid, 0)
        if not os.WIFSIGNALED(status):
            seen["failures"].append(f"trial {trial}: the writer stopped by itself (status {status})")
            continue
        try:
            got = read(destination)
        except Exception as err:  # noqa: BLE001  (what a kill left must read whole)
            seen["failures"].append(f"trial {trial} (killed after {delay:.3f} s): {destination} does not read "
                                    f"whole: {type(err).__name__}: {err}")
            write[1]()
            continue
        match = [v for v in (1, 2) if same(got, versions[v])]
        if not match:
            seen["failures"].append(f"trial {trial}: {destination} reads as neither version")
        else:
            seen["old_or_new"][match[0]] += 1
        base = os.path.basename(destination)
        left = sorted(n for n in os.listdir(folder) if n.startswith(f".{base}."))
        seen["temporaries_after_kill"] += bool(left)
        write[1]()  # the next write of the same destination
        after = sorted(n for n in os.listdir(folder) if n.startswith(f".{base}."))
        if after:
            seen["failures"].append(f"trial {trial}: the next write left {after} beside {destination} "
                                    f"(after the kill: {left})")
    return seen


def main():
    folder, trials, seed, *names = sys.argv[1:]
    rng = random.Random(int(seed))
    table = writers(folder)
    results = [trial_run(name, *table[name], int(trials), rng) for name in names or table]
    print(json.dumps(results))


if __name__ == "__main__":
    main()
