#!/usr/bin/env python
"""Feed throughput of tar shards against the same images as a folder, and against timm's readers of each
(issue 46, item 4).

    .venv/bin/python benchmarks/shard_throughput.py --timm-python /tmp/timmvenv/bin/python
    .venv/bin/python benchmarks/shard_throughput.py --quick        # a small folder: the test

Writes a folder of `--images` small JPEGs (160x120, quality 90: photo_folder.py's crops of scikit-image's
photographs, four class folders) and the same images as tar shards of `--shard-size` samples
(`keras_vit.data.shard_writer.write_shards`), then times decoding + the training crop and flip to 224 px uint8
batches, in images per second, of: keras-vit's `data.from_directory` (the folder) and
`keras_vit.data.shard_feed.from_shards` (the shards), each through tf.data and through its PyDataset (as
`model.fit` iterates it: Keras' adapter and its threads); and timm's readers in a `DataLoader(num_workers=2)`
with folder_feed.py's uint8 transform and `fast_collate` (timm's own uint8 path), in another interpreter
(`--timm-python`, with torch, torchvision, timm and webdataset): `timm.data.ImageDataset` on the folder and
`timm.data.create_dataset("wds/...", split="train-{000000..000009}.tar|N", is_training=True)` (timm's
WebDataset reader: shards split between the workers, its own shuffle buffer) on the shards. Each pipeline
yields a warm-up batch first (its threads, processes and shuffle buffers filled), then `--batches` batches are
timed; the pipelines take turns, one repeat each per round, the order reversed every other round; the median
of `--repeats` rounds is reported with its ratio to timm's folder reader.

The time to scan the folder or open the shards is left out (benchmarks/folder_scan.py measures the scan).
"""

import argparse
import functools
import json
import os
import sys
import tempfile

from folder_feed import IMAGE_SIZE, TimmWorker, rate_table, rounds, timed, timm_transform, versions
from photo_folder import cpu_name, write_folder

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
JPEG_SIZE = (160, 120)  # width, height: small JPEGs
FULL = {"images": 10_000, "shard_size": 1000, "batch": 64, "batches": 20, "repeats": 7}
QUICK = {"images": 64, "shard_size": 16, "batch": 8, "batches": 2, "repeats": 1}
FOLDER_TF = "keras-vit from_directory (folder), tf.data"
FOLDER_PY = "keras-vit from_directory (folder), PyDataset"
SHARDS_TF = "keras-vit from_shards (shards), tf.data"
SHARDS_PY = "keras-vit from_shards (shards), PyDataset"
TIMM_FOLDER = "timm ImageDataset (folder), DataLoader(num_workers=2)"
TIMM_WDS = "timm wds reader (shards), DataLoader(num_workers=2)"
TIMM = {"folder": TIMM_FOLDER, "wds": TIMM_WDS}


def keras_vit_pipelines(folder, pattern, batch):
    """{name: start()} of keras-vit's feeds of the folder and of the shards (`pattern`)."""
    from keras.src.trainers.data_adapters.py_dataset_adapter import PyDatasetAdapter

    sys.path.insert(0, ROOT)
    from keras_vit import data
    from keras_vit.data.shard_feed import from_shards

    def tf_data(ds):
        return lambda: (ds.as_numpy_iterator(), lambda: None)

    def pydataset(ds):
        def start():
            adapter = PyDatasetAdapter(ds, shuffle=False)
            adapter.on_epoch_begin()
            return adapter.get_numpy_iterator(), adapter.on_epoch_end

        return start

    starts = {}
    for pipeline, name, wrap in (("tf.data", (FOLDER_TF, SHARDS_TF), tf_data),
                                 ("pydataset", (FOLDER_PY, SHARDS_PY), pydataset)):
        train, _ = data.from_directory(folder, IMAGE_SIZE, batch, validation_split=0.0, pipeline=pipeline,
                                       image_dtype="uint8", verify="header")
        starts[name[0]] = wrap(train)
        starts[name[1]] = wrap(from_shards(pattern, IMAGE_SIZE, batch, image_dtype="uint8", pipeline=pipeline))
    return starts


def timm_worker(args):
    """Runs in the timm interpreter: one timed repeat of a reader per 'run folder|wds' line on stdin, a JSON
    line each."""
    import PIL
    import timm
    import torch
    import torchvision
    import webdataset
    from timm.data import ImageDataset, create_dataset
    from timm.data.loader import fast_collate

    shard_root, split = os.path.split(args.timm_shards)
    datasets = {"folder": ImageDataset(args.timm_worker, transform=timm_transform()),
                "wds": create_dataset(f"wds/{os.path.basename(shard_root)}", root=shard_root,
                                      split=f"{split}|{args.images}", is_training=True, batch_size=args.batch)}
    datasets["wds"].transform = timm_transform()
    print(json.dumps({"torch": torch.__version__, "torchvision": torchvision.__version__, "timm": timm.__version__,
                      "pillow": PIL.__version__, "webdataset": webdataset.__version__}), flush=True)

    def start(reader):
        def begin():
            kwargs = {"num_workers": 2, "collate_fn": fast_collate, "drop_last": True}
            if reader == "folder":
                kwargs["sampler"] = torch.utils.data.RandomSampler(
                    datasets[reader], num_samples=(args.batches + 1) * args.batch)
            iterator = iter(torch.utils.data.DataLoader(datasets[reader], batch_size=args.batch, **kwargs))
            return iterator, iterator._shutdown_workers

        return begin

    for line in sys.stdin:
        words = line.split()
        if len(words) != 2 or words[0] != "run" or words[1] not in datasets:
            break
        rate, first = timed(start(words[1]), args.batches)
        assert first[0].dtype == torch.uint8 and tuple(first[0].shape) == (args.batch, 3, IMAGE_SIZE, IMAGE_SIZE)
        print(json.dumps({"images_per_s": rate}), flush=True)


def measure(args, folder, pattern):
    """{name: [img/s per round]} and what ran (versions, load)."""
    starts = keras_vit_pipelines(folder, pattern, args.batch)
    timm, timm_info = None, {}
    if args.timm_python:
        try:
            timm = TimmWorker(args.timm_python, folder, args.batch, args.batches, script=os.path.abspath(__file__),
                              extra=["--timm-shards", pattern, "--images", str(args.images)])
            timm_info = timm.versions
        except (OSError, RuntimeError, ValueError) as err:
            timm_info = {"not_run": f"{args.timm_python} could not run timm's readers ({err})"}
    else:
        timm_info = {"not_run": "no --timm-python given (an interpreter with torch, torchvision, timm and webdataset)"}
    peers = {label: functools.partial(timm.run, reader) for reader, label in TIMM.items()} if timm else {}
    try:
        rates, loads = rounds(args, starts, peers)
    finally:
        if timm:
            timm.close()
    return rates, {"timm": timm_info, "load_average": loads}


def table(rates, timm_info):
    """The markdown table of `rates` ({name: [img/s per round]}) against timm's folder reader (`timm_info`:
    why timm did not run, where it did not)."""
    lines = rate_table(rates, lambda name: TIMM_FOLDER, "timm's folder reader")
    if "not_run" in timm_info:
        lines += [f"| {name} | not run: {timm_info['not_run']} | - | - |" for name in TIMM.values()]
    return "\n".join(lines)


def parse(argv):
    """The command line `argv`, the presets filled in (`--quick`: QUICK, else FULL)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a small folder and few batches (the test)")
    parser.add_argument("--images", type=int, help=f"JPEGs written (default {FULL['images']:,})")
    parser.add_argument("--shard-size", type=int, help=f"samples a shard (default {FULL['shard_size']})")
    parser.add_argument("--batch", type=int, help=f"images a batch (default {FULL['batch']})")
    parser.add_argument("--batches", type=int, help="batches timed per repeat, after a warm-up batch")
    parser.add_argument("--repeats", type=int, help="rounds (the median is reported)")
    parser.add_argument("--timm-python", help="an interpreter with torch, torchvision, timm and webdataset")
    parser.add_argument("--work", help="write the folder and shards here (kept) instead of a temporary folder")
    parser.add_argument("--out", help="also write the figures as JSON here")
    parser.add_argument("--timm-worker", help=argparse.SUPPRESS)
    parser.add_argument("--timm-shards", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    for key, value in (QUICK if args.quick else FULL).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    for key in FULL:
        if getattr(args, key) < 1:
            parser.error(f"--{key.replace('_', '-')} must be a positive integer, got {getattr(args, key)}")
    return args


def write_data(work, images, shard_size):
    """(folder, shard pattern) of `images` small JPEGs under `work`, written once (kept for a later run)."""
    from keras_vit.data.shard_writer import write_shards

    folder, shards = os.path.join(work, f"photos-{images}"), os.path.join(work, f"shards-{images}-{shard_size}")
    done = os.path.join(shards, "pattern.txt")
    if not os.path.exists(done):
        if not os.path.isdir(folder):
            write_folder(folder + ".tmp", images, size=JPEG_SIZE)
            os.replace(folder + ".tmp", folder)
        os.makedirs(shards, exist_ok=True)
        pattern = write_shards(folder, os.path.join(shards, "train-%06d.tar"), shard_size=shard_size, verify="header")
        with open(done, "w") as f:
            f.write(pattern)
    with open(done) as f:
        return folder, f.read()


def main(argv=None):
    args = parse(argv)
    if args.timm_worker:
        return timm_worker(args)
    with tempfile.TemporaryDirectory(prefix="shard_throughput_") as tmp:
        os.environ.setdefault("KERAS_HOME", os.path.join(tmp, "keras_home"))  # the scan cache: not the user's
        folder, pattern = write_data(args.work or tmp, args.images, args.shard_size)
        print(f"CPU: {cpu_name()}; {args.images:,} JPEGs of {JPEG_SIZE[0]}x{JPEG_SIZE[1]} in {folder}, shards "
              f"{pattern}", flush=True)
        rates, info = measure(args, folder, pattern)
    print(f"\nDecoding + crop and flip to {IMAGE_SIZE} px uint8, batch {args.batch}, {args.batches} batches timed "
          f"after a warm-up batch, median of {args.repeats} rounds; load average {info['load_average'][0]}-"
          f"{info['load_average'][1]}")
    print(table(rates, info["timm"]))
    if "not_run" not in info["timm"]:
        print(f"timm's side: {json.dumps(info['timm'])}")
    report = {"cpu": cpu_name(), "versions": versions(), "jpeg_size": JPEG_SIZE, "pipelines": rates, **info,
              "args": {k: v for k, v in vars(args).items() if k not in ("timm_worker", "timm_shards")}}
    print(f"\nversions: {json.dumps(report['versions'])}")
    if args.out:
        from keras_vit.fileio import write_json

        write_json(args.out, report)
    return report


if __name__ == "__main__":
    if "--timm-worker" in sys.argv:  # timm's interpreter, which has no Keras
        main()
        sys.exit()
    os.environ["KERAS_BACKEND"] = "tensorflow"  # numpy batches whatever the backend: tf.data's own
    from keras_vit.startup import run_main

    run_main(main)
