"""The training recipes measured: a small ViT trained from scratch on 14 classes of real photographs
(recipe_photos.py: crops of scikit-image's photographs, the test crops from a region of each photograph no
training crop touches), several seeds a row, the test accuracy's mean and spread.

    python benchmarks/recipes_ablation.py                    # the full table (about an hour on 2 CPU cores)
    python benchmarks/recipes_ablation.py --quick            # 1 seed, 1 epoch, 2 rows: seconds
    python benchmarks/recipes_ablation.py --epochs 15 --rows paper augreg "keras.io recipe" \
        --out benchmarks/results/recipes-15-epochs.json      # longer runs of some rows

The rows (`rows`): the presets of `keras-vit finetune --recipe` against each other and keras.io's "Image
classification with Vision Transformer" recipe (its optimizer and augmentation layers, no schedule, no MixUp)
on the same model and epochs; then DeiT's ablation of the best of the presets that have components to
remove (each removed in turn) and that preset distilled (DeiT's hard distillation) from a convnet teacher trained on
the same training crops (`recipes_teacher.py`). Every ViT row is `keras-vit finetune` (`keras_vit.cli.parser`, the
command's own function) but keras.io's, which is `model.fit` on the same model; each run's best epoch on its
10% validation split (of the training crops) is kept, as finetune keeps it, then scored on the test crops.
Results go to benchmarks/results/recipes-ablation.json, written after every run (a run already there is
not run again: an interrupted measurement continues). Two processes started with the same --out share the
runs (`--teacher` then saves training the teacher twice).
"""

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time

import numpy as np

from photo_folder import cpu_name, load_average
from recipe_photos import test_arrays, write_split

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.join(HERE, "results", "recipes-ablation.json")
FULL = {"train_per_class": 40, "test_per_class": 20, "image_size": 32, "patch_size": 8, "model": "ViT_Ti16",
        "epochs": 3, "batch": 64, "seeds": [0, 1, 2, 3, 4], "teacher_epochs": 30, "rows": None}
# --quick: keras.io's row trains on 88 of the 98 crops (validation_split 0.1), two whole batches of 44: one batch
# shape for its eager steps (Keras does not compile its random rotation and zoom)
QUICK = {"train_per_class": 7, "test_per_class": 2, "image_size": 32, "patch_size": 8, "model": "ViT_Ti16",
         "epochs": 1, "batch": 44, "seeds": [0], "teacher_epochs": 1,
         "rows": ["keras.io recipe", "deit without RandAugment"], "ablated": "deit"}
# component -> the preset flags that turn it off, and their values then
COMPONENTS = {
    "stochastic depth": {"drop_path": None},
    "MixUp and CutMix": {"mixup": None, "cutmix": None, "mixup_switch_prob": None},
    "RandAugment": {"aa": None},  # named 3-Augment for a preset whose --aa is DeiT III's "3a"
    "colour jitter": {"color_jitter": None},
    "random erasing": {"reprob": None},
    "label smoothing": {"smoothing": None},
    "repeated augmentation": {"aug_repeats": None},
    "dropout": {"drop": None},
}
KERAS_IO = "keras.io recipe"
CHOOSING_SEEDS = 2  # the seeds of the presets' runs that choose the preset ablated
DISTILLED = " + hard distillation"  # after the ablated preset's name


def spelled(preset, off=(), batch=64, lr=None):
    """The finetune flags of `preset` (keras_vit.recipes.presets) spelled out, with the components `off`
    (names of COMPONENTS) turned off: `--recipe paper` and every flag of the preset the paper's differs from,
    the rate given as the preset scales it to `batch` (or `lr`). Spelled out because a flag a preset sets can
    be overridden but not unset (`--aa` has no "off" value).

    Args:
        preset: the preset's name.
        off: the components turned off.
        batch: the run's batch (the rate's scaling).
        lr: the run's --lr, or None for the preset's.
    """
    from keras_vit.recipes import presets

    values = dict(presets.PRESETS[preset])
    for name in off:
        values.update(COMPONENTS[name])
    values["lr"] = presets.scaled_lr(argparse.Namespace(recipe=preset, lr=lr), batch)
    argv = ["--recipe", "paper"]
    for flag in presets.PRESET_FLAGS:
        value, paper = values[flag], presets.PRESETS["paper"][flag]
        if value == paper:
            continue
        spelling = "--" + flag.replace("_", "-")
        if isinstance(value, bool):
            argv.append(spelling if value else "--no-" + spelling[2:])
        else:
            argv += [spelling, str(0 if value is None else value)]  # opt, lr, wd, clip: None is 0 (off)
    return argv


def rows(ablated=None, only=None):
    """{row name: how it runs} in the table's order: ("recipe", preset, lr) a finetune run of the preset
    (`lr`: its --lr, None for the preset's own), ("without", preset, lr, component) that run with a component
    off (`spelled`), ("keras.io",) keras.io's recipe, ("distilled", preset, lr) the run distilled from the
    teacher. Without `ablated` the first phase: the presets, those whose rate scales with the batch also at
    their published rate as it is (`published`), and keras.io's; with it the second (the first phase's row
    `ablated` with each of its components off, and distilled).

    Args:
        ablated: the name of the first phase's preset row whose components are removed one at a time, or None.
        only: the names of the rows to keep, or None for all.
    """
    from keras_vit.recipes import presets

    first = {name: ("recipe", name, None) for name in presets.PRESETS}
    first |= {published(name): ("recipe", name, presets.PRESETS[name]["lr"]) for name in presets.LR_BATCH}
    if ablated is None:
        table = first | {KERAS_IO: ("keras.io",)}
    else:
        _, name, lr = first[ablated]
        preset = presets.PRESETS[name]
        used = [c for c, flags in COMPONENTS.items() if any(preset.get(f) for f in flags)]
        named = {c: "3-Augment" if c == "RandAugment" and not preset["aa"].startswith("rand") else c for c in used}
        table = {f"{ablated} without {named[c]}": ("without", name, lr, c) for c in used}
        table[ablated + DISTILLED] = ("distilled", name, lr)
    return {k: v for k, v in table.items() if only is None or k in only}


def published(preset):
    """The row name of `preset` run at its published rate, not scaled to the run's batch."""
    from keras_vit.recipes import presets

    return f"{preset}, --lr {presets.PRESETS[preset]['lr']:g}"


def finetune(train_dir, out, flags, seed, size):
    """One `keras-vit finetune` run of `flags` on `train_dir`; returns (its best model, the seconds it trained).

    Args:
        train_dir: the training crops' folder.
        out: the run's --out.
        flags: finetune's flags beyond the folder, model, size and seed.
        seed: --seed.
        size: the benchmark's sizes (FULL or QUICK).
    """
    from keras_vit.cli import parser
    from keras_vit.weights.keras_files import load_keras_model

    argv = ["finetune", train_dir, "--model", size["model"], "--weights", "none", "--image-size",
            str(size["image_size"]), "--patch-size", str(size["patch_size"]), "--epochs", str(size["epochs"]),
            "--batch-size", str(size["batch"]), "--seed", str(seed), "--out", out, "--quiet", "--overwrite", *flags]
    args = parser().parse_args(argv)
    summary = args.func(args)
    return load_keras_model(os.path.join(out, "model.keras")), summary["train_seconds"]


def keras_io(train_dir, seed, size, classes):
    """keras.io's recipe (examples/vision/image_classification_with_vision_transformer.py) on the same model:
    AdamW at a constant 1e-3 with weight decay 1e-4, its augmentation layers in front of the model
    (RandomFlip, RandomRotation(0.02), RandomZoom(0.2, 0.2)), the cross-entropy of logits, model.fit on the
    resized training crops with 10% held out, the best epoch kept; the batch and epochs are the other rows'.
    Returns (the model, the seconds it trained).

    Args:
        train_dir: the training crops' folder.
        seed: the weights' and the split's seed.
        size: the benchmark's sizes.
        classes: the number of classes.
    """
    import keras

    import keras_vit

    keras.utils.set_random_seed(seed)
    x, y = test_arrays(train_dir, size["image_size"])
    order = np.random.default_rng(seed).permutation(len(x))
    x, y = x[order].astype("float32"), y[order]
    vit = getattr(keras_vit, size["model"])(weights=None, image_size=size["image_size"],
                                            patch_size=size["patch_size"], classes=classes, classifier_activation=None)
    inputs = keras.Input((size["image_size"], size["image_size"], 3))
    h = keras.layers.RandomFlip("horizontal")(inputs)
    h = keras.layers.RandomRotation(factor=0.02)(h)
    h = keras.layers.RandomZoom(height_factor=0.2, width_factor=0.2)(h)
    model = keras.Model(inputs, vit(keras.layers.Rescaling(1 / 127.5, offset=-1.0)(h)))  # the ViT's [-1, 1]
    model.compile(optimizer=keras.optimizers.AdamW(learning_rate=1e-3, weight_decay=1e-4),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    with tempfile.TemporaryDirectory() as tmp:
        best = os.path.join(tmp, "best.weights.h5")
        keep = keras.callbacks.ModelCheckpoint(best, monitor="val_accuracy", save_best_only=True,
                                               save_weights_only=True)
        start = time.perf_counter()
        model.fit(x, y, batch_size=size["batch"], epochs=size["epochs"], validation_split=0.1, callbacks=[keep],
                  verbose=0)
        seconds = time.perf_counter() - start
        model.load_weights(best)
    return model, seconds


def accuracy(model, test):
    """The top-1 accuracy of `model` on `test` (images, labels); the images as uint8 or as float pixels,
    whichever the model takes."""
    images, labels = test
    if model.inputs[0].dtype != "uint8":
        images = images.astype("float32")
    scores = model.predict(images, batch_size=64, verbose=0)
    return float(np.mean(np.argmax(scores, axis=-1) == labels))


def run_one(name, how, seed, folders, size, teacher, work):
    """(test accuracy, training seconds) of the row `name` (run as `how` says, see `rows`) at `seed`."""
    train_dir, test = folders
    out = os.path.join(work, f"{name.replace(' ', '_')}-{seed}")
    if how[0] == "keras.io":
        model, seconds = keras_io(train_dir, seed, size, len(os.listdir(train_dir)))
    elif how[0] == "without":
        model, seconds = finetune(train_dir, out, spelled(how[1], [how[3]], size["batch"], how[2]), seed, size)
    else:
        flags = ["--recipe", how[1], *(["--lr", str(how[2])] if how[2] is not None else [])]
        if how[0] == "distilled":  # DeiT III's binary cross-entropy does not combine with DeiT's distillation
            flags += ["--teacher", teacher, "--distillation", "hard", "--no-bce-loss"]  # losses (of a softmax)
        model, seconds = finetune(train_dir, out, flags, seed, size)
    return accuracy(model, test), seconds


def summarise(runs):
    """{row: {"mean", "std", "n", "seconds"}} of `runs` ({row: {seed: {"accuracy", "seconds"}}}); the std
    is the sample standard deviation over the seeds (0 for one)."""
    out = {}
    for name, by_seed in runs.items():
        scores = [r["accuracy"] for r in by_seed.values()]
        out[name] = {"mean": statistics.fmean(scores), "std": statistics.stdev(scores) if len(scores) > 1 else 0.0,
                     "n": len(scores), "seconds": statistics.fmean(r["seconds"] for r in by_seed.values())}
    return out


def paired(runs, name, base):
    """(mean, standard error) of row `name`'s accuracy minus row `base`'s over the seeds both ran (a seed
    gives both rows the same split, initial weights and data order), in points; the error is None for one
    seed."""
    diffs = [100 * (runs[name][seed]["accuracy"] - runs[base][seed]["accuracy"]) for seed in runs[name]
             if seed in runs[base]]
    error = statistics.stdev(diffs) / len(diffs) ** 0.5 if len(diffs) > 1 else None
    return statistics.fmean(diffs), error


def markdown(summary, ablated, teacher=None, runs=None):
    """The table of `summary` (`summarise`'s) as Markdown rows, in percent, each row's difference from the
    preset `ablated` (with `runs`, `summarise`'s input, the mean of the seeds' differences and its standard
    error); `teacher`: the teacher's test accuracy, said in a row of its own."""
    ablated = ablated or next(iter(summary), None)  # no preset ablated: the differences from the first row
    lines = [f"| row | test accuracy (%) | std | vs {ablated} (points) | seeds | train s |",
             "|---|---|---|---|---|---|"]
    for name, row in summary.items():
        delta = ""
        if name != ablated and ablated in summary:
            mean, error = paired(runs, name, ablated) if runs else (100 * (row["mean"] - summary[ablated]["mean"]),
                                                                    None)
            delta = f"{mean:+.1f}" + ("" if error is None else f" ± {error:.1f}")
        lines.append(f"| {name} | {100 * row['mean']:.1f} | {100 * row['std']:.1f} | {delta} | {row['n']} | "
                     f"{row['seconds']:.0f} |")
    if teacher is not None:
        lines.append(f"| (the teacher, a convnet) | {100 * teacher:.1f} | | | 1 | |")
    return "\n".join(lines)


def _problem(size):
    """What makes a run of `size` (FULL's keys): all but the seeds and the rows asked for, so that a run with
    more seeds or other rows keeps the runs made."""
    return {k: v for k, v in size.items() if k not in ("seeds", "rows")}


def _load(path):
    if path and os.path.exists(path):
        with open(path) as f:
            return json.load(f)
    return {}


def _save(path, result):
    if path:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path + ".tmp", "w") as f:
            json.dump(result, f, indent=1)
        os.replace(path + ".tmp", path)


def _claim(path, name, seed):
    """Whether this process takes the run of row `name` at `seed`: a marker made exclusively in the folder
    `path`.claims, so processes started on the same results file share the runs (after an interrupted
    measurement, remove the folder)."""
    if path is None:
        return True
    folder = path + ".claims"
    os.makedirs(folder, exist_ok=True)
    try:
        os.close(os.open(os.path.join(folder, f"{name.replace(' ', '_')}-{seed}"), os.O_CREAT | os.O_EXCL))
    except FileExistsError:
        return False
    return True


def measure(size, work, results_path=None, teacher=None):
    """Every row of `size` at each of its seeds, in two phases (`rows`): the presets and keras.io's at the
    first CHOOSING_SEEDS seeds, then, for the best preset there that has components (the paper's has none;
size["ablated"] where given), its ablation
    and distillation, and every row at the other seeds; seeds outer, so a cut-short measurement has every
    row at fewer seeds. Returns the result (also written to `results_path` after
    each run; the runs already there are not run again, and processes started on the same file share the
    runs, `_claim`).

    Args:
        size: FULL or QUICK (or a dict of the same keys).
        work: a folder for the photographs, the teacher and the runs.
        results_path: the JSON file, or None.
        teacher: the teacher's `.keras` file, trained before (None: trained here when a row needs it).
    """
    import keras

    result = _load(results_path)
    if result.get("size") is not None and _problem(result["size"]) != _problem(size):
        result = {}  # another problem's runs: measured again
    result.update(size=size, machine=cpu_name(), platform=platform.platform(), backend=keras.backend.backend())
    folders = write_split(os.path.join(work, "photos"), size["train_per_class"], size["test_per_class"])
    test = test_arrays(folders[1], size["image_size"])
    first, choosing = rows(only=size["rows"]), size["seeds"][:CHOOSING_SEEDS]
    _run_rows(first, choosing, result, results_path, (folders[0], test), None, work)
    runs = _wait_for(results_path, first, choosing, result)  # the other processes' runs of the phase
    presets_measured = summarise({k: runs[k] for k, how in first.items() if how[0] == "recipe"})
    ablatable = [k for k in presets_measured if any(how[0] == "without" for how in rows(k).values())]
    ablated = size.get("ablated") or max(ablatable, key=lambda k: presets_measured[k]["mean"], default=None)
    second = rows(ablated, only=size["rows"]) if ablated else {}
    if any(how[0] == "distilled" for how in second.values()):
        teacher = _teacher(teacher, folders, test, size, work, result)
    _run_rows({**first, **second}, size["seeds"], result, results_path, (folders[0], test), teacher, work)
    result["ablated"] = ablated
    result["summary"] = summarise({k: result["runs"][k] for k in {**first, **second} if k in result["runs"]})
    _save(results_path, result)
    return result


def _teacher(teacher, folders, test, size, work, result):
    """The teacher's file (`teacher`, else one trained now), its test accuracy put into `result`."""
    if teacher is None:
        from recipes_teacher import train_teacher

        teacher, score = train_teacher(folders[0], test, size, os.path.join(work, "teacher.keras"))
    else:
        from keras_vit.weights.keras_files import load_keras_model

        score = accuracy(load_keras_model(teacher), test)
    result["teacher_accuracy"] = score
    print(f"teacher: test accuracy {score:.4f}", flush=True)
    return teacher


def _run_rows(table, seeds, result, results_path, folders, teacher, work):
    """Runs the rows of `table` at each of `seeds` (seeds outer) that no process has run or taken, into
    `result` (its "size" the sizes)."""
    runs, size = result.setdefault("runs", {}), result["size"]
    for seed in seeds:
        for name, how in table.items():
            if str(seed) in runs.get(name, {}) or not _claim(results_path, name, seed):
                continue
            score, seconds = run_one(name, how, seed, folders, size, teacher, work)
            for other, by_seed in _load(results_path).get("runs", {}).items():  # other processes' runs since
                runs[other] = {**by_seed, **runs.get(other, {})}
            runs.setdefault(name, {})[str(seed)] = {"accuracy": score, "seconds": round(seconds, 1),
                                                     "load_average": load_average()}
            print(f"{name}, seed {seed}: test accuracy {score:.4f} ({seconds:.0f} s)", flush=True)
            _save(results_path, result)


def _wait_for(results_path, table, seeds, result):
    """The runs of `result`, once the results file holds every row of `table` at every seed (runs other
    processes took); polls the file every 10 s."""
    while True:
        for other, by_seed in _load(results_path).get("runs", {}).items():
            result["runs"][other] = {**by_seed, **result["runs"].get(other, {})}
        if all(str(seed) in result["runs"].get(name, {}) for name in table for seed in seeds):
            return result["runs"]
        time.sleep(10)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="1 seed, 1 epoch, 2 rows, a tiny folder (seconds)")
    p.add_argument("--out", default=None, help=f"the results' JSON (default {RESULTS}; none with --quick)")
    p.add_argument("--work", default=None, help="the folder for photographs and runs (default: a temporary one)")
    p.add_argument("--seeds", type=int, nargs="+", default=None, help="these seeds only (e.g. one process each)")
    p.add_argument("--teacher", default=None, help="a teacher .keras file trained before (default: train one)")
    p.add_argument("--epochs", type=int, default=None, help=f"epochs a run (default {FULL['epochs']}; give --out)")
    p.add_argument("--rows", nargs="+", default=None, help="these rows only, by name (default: all)")
    args = p.parse_args(argv)
    given = {"seeds": args.seeds, "epochs": args.epochs, "rows": args.rows}
    size = dict(QUICK if args.quick else FULL, **{k: v for k, v in given.items() if v})
    path = args.out or (None if args.quick else RESULTS)
    with tempfile.TemporaryDirectory() as tmp:
        result = measure(size, args.work or tmp, path, args.teacher)
    print(markdown(result["summary"], result["ablated"], result.get("teacher_accuracy"), result["runs"]))
    return result


if __name__ == "__main__":
    sys.path.insert(0, HERE)
    from keras_vit.startup import run_main

    run_main(main)
