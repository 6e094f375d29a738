#!/usr/bin/env python
"""A feed that keeps up: images per second from a folder of JPEGs (issue 34, item 5).

    .venv/bin/python benchmarks/folder_feed.py --timm-python /tmp/timmvenv/bin/python
    .venv/bin/python benchmarks/folder_feed.py --quick          # a small folder and a tiny model: the test

Writes a folder of `--images` JPEGs (500x375, quality 90) in four class subfolders, random crops of
scikit-image's photographs (astronaut, coffee, chelsea, rocket), into a temporary folder, then:

1. Decoding + training augmentation to 224 px uint8 batches, in images per second, of:
   keras-vit's `data.from_directory` through tf.data and through its PyDataset (iterated as `model.fit`
   iterates it: Keras' PyDataset adapter and its worker threads), Keras'
   `keras.utils.image_dataset_from_directory` (decode and resize only, float32: no augmentation, its
   own best case), and timm's loader (`timm.data.ImageDataset`, `create_transform(224, is_training=True,
   scale=(0.05, 1), ratio=(3/4, 4/3), interpolation="bilinear", hflip=0.5, color_jitter=None,
   use_prefetcher=True)`: RandomResizedCrop, flip, a uint8 tensor, batched by timm's `fast_collate` in a
   `torch.utils.data.DataLoader(num_workers=2)`, timm's own uint8 path). timm needs torchvision, which
   has no build beside this project's torch, so it runs in a worker process of another interpreter
   (`--timm-python`) on the same folder; without one its row reads "not run". Every pipeline yields a
   warm-up batch first (threads and processes started), then `--batches` batches are timed; the
   pipelines take turns, one repeat each per round, and the median of `--repeats` rounds is reported
   with its ratio to timm's loader.
2. Per Keras backend (a process each), `model.fit` step time of ViT-S/16 (`input_dtype="uint8"`, the
   fine-tuning recipe) fed from the folder (`from_directory`, uint8, each pipeline) against the same
   batches held in memory as numpy arrays: the ratio says whether training is input-bound (1.0: the
   folder costs nothing). The step is timed between the ends of the first and the last step of each
   `fit` (compilation and the first batch left out); the feeds take turns, `--fit-rounds` rounds, the
   median ratio of each round's pair is reported. On JAX and torch `fit` takes each batch from a Python
   iterator (Keras' epoch iterator's, timed here): the milliseconds per step it waits there for a batch
   are the feed's own cost to the step, which other jobs on a shared machine inflate far less than the
   step itself (TensorFlow takes its batches inside the compiled step).

This file holds the command and part 1; part 2 is folder_feed_fit.py, the folder and the machine's facts
photo_folder.py.
"""

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

from folder_feed_fit import fit_table, fit_worker, measure_fits
from photo_folder import cpu_name, load_average, write_folder

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
IMAGE_SIZE = 224
# the Inception crop of keras_vit.data (AREA_RANGE, ASPECT_RATIO_RANGE), as timm's transform takes it
SCALE, RATIO = (0.05, 1.0), (3 / 4, 4 / 3)
FULL = {"images": 256, "batch": 32, "batches": 16, "repeats": 9, "model": "ViT_S16", "fit_image_size": 224,
        "fit_batch": 16, "fit_steps": 4, "fit_rounds": 3}
QUICK = {"images": 32, "batch": 8, "batches": 2, "repeats": 2, "model": "tiny", "fit_image_size": 32,
         "fit_batch": 4, "fit_steps": 2, "fit_rounds": 1}
KERAS_VIT_TF = "keras-vit from_directory, tf.data"
KERAS_VIT_PY = "keras-vit from_directory, PyDataset (Keras' adapter, 2 threads)"
KERAS_IDFD = "keras.utils.image_dataset_from_directory (decode + resize only, float32)"
TIMM = "timm ImageDataset + DataLoader(num_workers=2), uint8"


# --------------------------------------------------------------------------
# part 1: decoding + augmentation
# --------------------------------------------------------------------------
def timed(start, batches):
    """Images per second of `batches` batches from the iterator `start()` returns (with its `stop`), after
    one warm-up batch."""
    iterator, stop = start()
    try:
        first = next(iterator)
        count = 0
        t0 = time.perf_counter()
        for _ in range(batches):
            count += len(next(iterator)[1])
        seconds = time.perf_counter() - t0
    finally:
        stop()
    return count / seconds, first


def keras_vit_pipelines(folder, batch):
    """{name: start()} of the pipelines that run in this interpreter."""
    from keras.src.trainers.data_adapters.py_dataset_adapter import PyDatasetAdapter

    sys.path.insert(0, ROOT)
    from keras_vit import data

    tf_train, _ = data.from_directory(folder, IMAGE_SIZE, batch, validation_split=0.0, pipeline="tf.data",
                                      image_dtype="uint8")
    py_train, _ = data.from_directory(folder, IMAGE_SIZE, batch, validation_split=0.0, pipeline="pydataset",
                                      image_dtype="uint8")
    import keras

    idfd = keras.utils.image_dataset_from_directory(folder, image_size=(IMAGE_SIZE, IMAGE_SIZE), batch_size=batch,
                                                    shuffle=True, seed=0, interpolation="bilinear", verbose=False)
    idfd = idfd.repeat()

    def tf_data(ds):
        def start():
            iterator = ds.as_numpy_iterator()
            return iterator, lambda: None

        return start

    def pydataset():  # as model.fit iterates it: the adapter's worker threads, one epoch
        adapter = PyDatasetAdapter(py_train, shuffle=False)
        adapter.on_epoch_begin()
        return adapter.get_numpy_iterator(), adapter.on_epoch_end

    return {KERAS_VIT_TF: tf_data(tf_train), KERAS_VIT_PY: pydataset, KERAS_IDFD: tf_data(idfd)}


class TimmWorker:
    """timm's loader in a process of `python` (an interpreter with torch, torchvision and timm), one timed
    repeat per `run()`: `script --timm-worker folder --batch B --batches N [extra]` (this file's, or another
    benchmark's that answers the same lines: its versions first, then a JSON line per "run [name]")."""

    def __init__(self, python, folder, batch, batches, script=None, extra=()):
        self.proc = subprocess.Popen([python, script or os.path.abspath(__file__), "--timm-worker", folder,
                                      "--batch", str(batch), "--batches", str(batches), *extra],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=HERE)
        self.versions = self._read()

    def _read(self):
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the timm worker stopped (exit status {self.proc.wait()})")
        return json.loads(line)

    def run(self, name=""):
        self.proc.stdin.write(f"run {name}".rstrip() + "\n")
        self.proc.stdin.flush()
        return self._read()["images_per_s"]

    def close(self):
        if self.proc.poll() is None:
            self.proc.stdin.write("quit\n")
            self.proc.stdin.flush()
            self.proc.wait(timeout=60)


def timm_transform(use_prefetcher=True, **kwargs):
    """Runs in the timm interpreter: timm's training transform of this benchmark (the crop and flip of
    keras_vit.data; `use_prefetcher`: to a uint8 tensor, timm's own uint8 path), more of
    `create_transform`'s arguments in `kwargs` (the augmentations of augmented_feed.py)."""
    from timm.data import create_transform

    return create_transform(IMAGE_SIZE, is_training=True, scale=SCALE, ratio=RATIO, hflip=0.5, vflip=0.0,
                            color_jitter=None, interpolation="bilinear", use_prefetcher=use_prefetcher, **kwargs)


def timm_worker(args):
    """Runs in the timm interpreter: one timed repeat per 'run' line on stdin, a JSON line each."""
    import PIL
    import timm
    import torch
    import torchvision
    from timm.data import ImageDataset
    from timm.data.loader import fast_collate

    transform = timm_transform()
    dataset = ImageDataset(args.timm_worker, transform=transform)
    print(json.dumps({"torch": torch.__version__, "torchvision": torchvision.__version__, "timm": timm.__version__,
                      "pillow": PIL.__version__, "transform": " ".join(str(transform).split())}), flush=True)

    def start():
        sampler = torch.utils.data.RandomSampler(dataset, num_samples=(args.batches + 1) * args.batch)
        loader = torch.utils.data.DataLoader(dataset, batch_size=args.batch, sampler=sampler, num_workers=2,
                                             collate_fn=fast_collate, drop_last=True)
        iterator = iter(loader)
        return iterator, iterator._shutdown_workers

    for line in sys.stdin:
        if line.strip() != "run":
            break
        rate, first = timed(start, args.batches)
        assert first[0].dtype == torch.uint8 and tuple(first[0].shape) == (args.batch, 3, IMAGE_SIZE, IMAGE_SIZE)
        print(json.dumps({"images_per_s": rate}), flush=True)


def measure_pipelines(args, folder):
    """{name: [img/s per round]} and what ran (versions, load)."""
    starts = keras_vit_pipelines(folder, args.batch)
    timm, timm_info = None, {}
    if args.timm_python:
        try:
            timm = TimmWorker(args.timm_python, folder, args.batch, args.batches)
            timm_info = timm.versions
        except (OSError, RuntimeError, ValueError) as err:
            timm_info = {"not_run": f"{args.timm_python} could not run timm's loader ({err})"}
    else:
        timm_info = {"not_run": "no --timm-python given (timm needs torchvision, which cannot be installed beside "
                                "this torch: give an interpreter that has torch, torchvision and timm)"}
    try:
        rates, loads = rounds(args, starts, {TIMM: timm.run} if timm else {})
    finally:
        if timm:
            timm.close()
    return rates, {"timm": timm_info, "load_average": loads}


def rounds(args, starts, peers, check=None):
    """({name: [img/s per round]}, [lowest, highest load average]) of the keras-vit pipelines `starts` ({name:
    start}) and the `peers` ({name: a call returning img/s}), `args.repeats` rounds of `args.batches` batches, each
    pipeline in turn, the order reversed every other round (each sees the same load); `check(name, first batch)`
    beside the shape check of the images."""
    names = list(starts) + list(peers)
    rates, loads = {name: [] for name in names}, [load_average()]
    for r in range(args.repeats):
        for name in names if r % 2 == 0 else names[::-1]:
            if name in starts:
                rate, first = timed(starts[name], args.batches)
                assert first[0].shape == (args.batch, IMAGE_SIZE, IMAGE_SIZE, 3), (name, first[0].shape)
                if check:
                    check(name, first)
            else:
                rate = peers[name]()
            rates[name].append(rate)
            loads.append(load_average())
    return rates, [min(loads), max(loads)]


def rate_table(rates, peer_of, peer_label):
    """The markdown lines of `rates` ({name: [img/s per round]}): each pipeline's median, range and the ratio
    of its median to its peer's, the row `peer_of(name)` names (no ratio where that row is not in `rates`),
    under a column headed "x `peer_label`"."""
    lines = [f"| pipeline | img/s (median) | range | x {peer_label} |", "|---|---|---|---|"]
    for name, values in rates.items():
        median, peer = statistics.median(values), rates.get(peer_of(name))
        ratio = f"{median / statistics.median(peer):.2f}x" if peer else "-"
        lines.append(f"| {name} | {median:,.0f} | {min(values):,.0f}-{max(values):,.0f} | {ratio} |")
    return lines


def pipeline_table(rates, timm_info):
    lines = rate_table(rates, lambda name: TIMM, "timm's loader")
    if TIMM not in rates:
        lines.append(f"| {TIMM} | not run: {timm_info['not_run']} | - | - |")
    return "\n".join(lines)



def versions():
    import importlib.metadata

    out = {"python": platform.python_version()}
    for dist in ("keras", "tensorflow", "jax", "torch", "numpy", "pillow", "scikit-image"):
        try:
            out[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            out[dist] = None
    return out


# --------------------------------------------------------------------------
def parse(argv, description=None):
    """The command line `argv` of this benchmark (and of augmented_feed.py, which takes the same, its own
    `description`)."""
    parser = argparse.ArgumentParser(description=description or __doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a small folder, few batches and a tiny model (the test)")
    parser.add_argument("--images", type=int, help=f"JPEGs written (default {FULL['images']})")
    parser.add_argument("--folder", help="use this folder of class subfolders instead of writing one")
    parser.add_argument("--batch", type=int, help="batch of the throughput part")
    parser.add_argument("--batches", type=int, help="batches timed per repeat, after a warm-up batch")
    parser.add_argument("--repeats", type=int, help="rounds of the throughput part (the median is reported)")
    parser.add_argument("--timm-python", help="an interpreter with torch, torchvision and timm, for timm's loader")
    parser.add_argument("--backends", default="jax,tensorflow,torch",
                        help="Keras backends of the fit part ('' for none)")
    parser.add_argument("--model", help="ViT_S16, another variant's factory name, or tiny")
    parser.add_argument("--fit-image-size", type=int)
    parser.add_argument("--fit-batch", type=int)
    parser.add_argument("--fit-steps", type=int, help="timed steps per fit (after one untimed step)")
    parser.add_argument("--fit-rounds", type=int, help="rounds of the fit part (each runs every feed)")
    parser.add_argument("--out", help="also write the figures as JSON here")
    parser.add_argument("--timm-worker", help=argparse.SUPPRESS)
    parser.add_argument("--fit-worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    preset = QUICK if args.quick else FULL
    for key, value in preset.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    for key in ("images", "batch", "batches", "repeats", "fit_image_size", "fit_batch", "fit_steps", "fit_rounds"):
        if getattr(args, key) < 1:
            parser.error(f"--{key.replace('_', '-')} must be a positive integer, got {getattr(args, key)}")
    args.backends = [b for b in args.backends.split(",") if b]
    unknown = set(args.backends) - {"jax", "tensorflow", "torch"}
    if unknown:
        parser.error(f"--backends: unknown {', '.join(sorted(unknown))} (jax, tensorflow, torch)")
    return args


def main(argv=None):
    args = parse(argv)
    if args.timm_worker:
        return timm_worker(args)
    if args.fit_worker:
        return fit_worker(args)
    with tempfile.TemporaryDirectory(prefix="folder_feed_") as tmp:
        folder = args.folder or write_folder(os.path.join(tmp, "photos"), args.images)
        print(f"CPU: {cpu_name()}; folder: {folder} ({args.images if not args.folder else 'given'} JPEGs)", flush=True)
        rates, info = measure_pipelines(args, folder)
        print(f"\nDecoding + augmentation to {IMAGE_SIZE} px, batch {args.batch}, {args.batches} batches timed after "
              f"a warm-up batch, median of {args.repeats} rounds; load average {info['load_average'][0]}-"
              f"{info['load_average'][1]}")
        print(pipeline_table(rates, info["timm"]))
        if "not_run" not in info["timm"]:
            print(f"timm's side: {json.dumps(info['timm'])}")
        fits = measure_fits(args, folder) if args.backends else {}
        if fits:
            print(f"\nmodel.fit step, {args.model} at {args.fit_image_size} px, batch {args.fit_batch}, "
                  f"{args.fit_steps} steps timed per fit, median of {args.fit_rounds} rounds")
            print(fit_table(fits, args))
    report = {"cpu": cpu_name(), "versions": versions(), "args": {k: v for k, v in vars(args).items()
                                                                  if not k.endswith("_worker")},
              "pipelines": rates, **info, "fits": fits}
    print(f"\nversions: {json.dumps(report['versions'])}")
    if args.out:  # written whole, then moved into place: a Ctrl-C leaves no half file
        from keras_vit.fileio import write_json

        write_json(args.out, report)
    return report


if __name__ == "__main__":
    if not {"--timm-worker", "--fit-worker"} & set(sys.argv):
        # the throughput part iterates numpy batches whatever the backend: TensorFlow's, whose imports tf.data
        # needs anyway (the fit part's processes get theirs from --backends); set before Keras is imported
        os.environ["KERAS_BACKEND"] = "tensorflow"
    from keras_vit.startup import run_main

    run_main(main)
