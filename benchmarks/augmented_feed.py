#!/usr/bin/env python
"""A feed that keeps up, augmented: images per second from a folder of JPEGs with RandAugment, random erasing
and MixUp/CutMix (issue 45, item 8).

    .venv/bin/python benchmarks/augmented_feed.py --timm-python /tmp/timmvenv/bin/python --backends ""
    .venv/bin/python benchmarks/augmented_feed.py --batches 2 --repeats 1 --backends jax   # the fit part
    .venv/bin/python benchmarks/augmented_feed.py --quick          # a small folder and a tiny model: the test

folder_feed.py's benchmark (the same folder of 500x375 JPEGs, the same options, rounds and medians) with
DeiT's augmentations on both sides:

1. Decoding + training augmentation to 224 px batches, in images per second: keras-vit's
   `data.from_directory(..., auto_augment="rand-m9-mstd0.5-inc1", re_prob=0.25, re_mode="pixel")` mixed by
   `keras_vit.data.mixup.mixed_feeds` (`MixUp(mixup_alpha=0.8, cutmix_alpha=1.0, label_smoothing=0.1)`, one
   draw a batch), through tf.data and through the PyDataset (Keras' adapter, as `fit` iterates it), in uint8
   and in float32; against timm's loader with the same transforms, `timm.data.ImageDataset` +
   `DataLoader(num_workers=2)` in another interpreter (`--timm-python`, with torch, torchvision and timm), in
   its two ways: float32, `create_transform(224, is_training=True, auto_augment="rand-m9-mstd0.5-inc1",
   re_prob=0.25, re_mode="pixel", ...)` (RandAugment, tensor, normalisation and erasing in the workers) and
   `timm.data.Mixup` on each batch in the main process, as timm's train.py does without its prefetcher; and
   uint8, train.py's default path: the same transform up to a uint8 tensor, `FastCollateMixup` in the
   workers' collate, then `PrefetchLoader` (here on the CPU) normalising and erasing in the main process.
   Each keras-vit row is compared with timm's row of its dtype. The PyDataset is timed twice: as
   `mixed_feeds` wraps it (`MixedBatches` with Keras' default of one worker: the adapter then builds each
   batch in the loop's thread, on demand) and wrapped with the feed's own threads.
2. Per Keras backend, `model.fit` step time fed from the augmented, mixed folder against the same batches
   held in memory (folder_feed_fit.py, soft targets).
"""

import functools
import json
import os
import sys
import tempfile

import folder_feed
from folder_feed import IMAGE_SIZE, TimmWorker, timed, timm_transform
from folder_feed_fit import fit_table, fit_worker, measure_fits
from photo_folder import PHOTOS, cpu_name, write_folder

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
AUTO_AUGMENT, RE_PROB, RE_MODE = "rand-m9-mstd0.5-inc1", 0.25, "pixel"
MIXUP = {"mixup_alpha": 0.8, "cutmix_alpha": 1.0, "label_smoothing": 0.1}  # DeiT's (timm's --mixup, --cutmix)
AUGMENT = {"feed": {"auto_augment": AUTO_AUGMENT, "re_prob": RE_PROB, "re_mode": RE_MODE}, "mixup": MIXUP}
DTYPES = ("uint8", "float32")
TF = "keras-vit tf.data, {}"
PY = "keras-vit PyDataset via mixed_feeds, {}"
PY_THREADS = "keras-vit PyDataset, MixedBatches given the feed's threads, {}"
TIMM = "timm ImageDataset + DataLoader(num_workers=2), {}"


def keras_vit_pipelines(folder, batch):
    """{name: start()} of the keras-vit pipelines, augmented and mixed, each dtype."""
    from keras.src.trainers.data_adapters.py_dataset_adapter import PyDatasetAdapter

    sys.path.insert(0, ROOT)
    from keras_vit import data
    from keras_vit.data.mixup import MixedBatches, MixUp, mixed_feeds

    mix = MixUp(num_classes=len(PHOTOS), **MIXUP)

    def feed(pipeline, dtype):
        train, _ = data.from_directory(folder, IMAGE_SIZE, batch, validation_split=0.0, pipeline=pipeline,
                                       image_dtype=dtype, **AUGMENT["feed"])
        return train

    def tf_data(ds):
        return lambda: (ds.as_numpy_iterator(), lambda: None)

    def pydataset(ds):
        def start():  # as model.fit iterates it: the adapter (and its worker threads where it has more than one)
            adapter = PyDatasetAdapter(ds, shuffle=False)
            adapter.on_epoch_begin()
            return adapter.get_numpy_iterator(), adapter.on_epoch_end

        return start

    starts = {}
    for dtype in DTYPES:
        starts[TF.format(dtype)] = tf_data(mixed_feeds(feed("tf.data", dtype), None, mix)[0])
        plain = feed("pydataset", dtype)
        starts[PY.format(dtype)] = pydataset(mixed_feeds(plain, None, mix)[0])
        starts[PY_THREADS.format(dtype)] = pydataset(MixedBatches(plain, mix, workers=plain.workers,
                                                                  max_queue_size=plain.max_queue_size))
    return starts


def _timm_loaders(folder, batch, batches):
    """Runs in the timm interpreter: {dtype: start()} of timm's two loaders (see the module's docstring)."""
    import torch
    from timm.data import FastCollateMixup, ImageDataset, Mixup
    from timm.data.loader import PrefetchLoader

    datasets = {dtype: ImageDataset(folder, transform=timm_transform(dtype == "uint8", auto_augment=AUTO_AUGMENT,
                                                                     re_prob=RE_PROB, re_mode=RE_MODE))
                for dtype in DTYPES}
    mix = {"num_classes": len(PHOTOS), **MIXUP}

    def loader(dtype, **kwargs):
        sampler = torch.utils.data.RandomSampler(datasets[dtype], num_samples=(batches + 1) * batch)
        return torch.utils.data.DataLoader(datasets[dtype], batch_size=batch, sampler=sampler, num_workers=2,
                                           drop_last=True, **kwargs)

    def float32():
        mixup, iterator = Mixup(**mix), iter(loader("float32"))
        return (mixup(x, y) for x, y in iterator), iterator._shutdown_workers

    def uint8():  # train.py's prefetcher path: mixing in the workers' collate; normalising and erasing after
        prefetch = PrefetchLoader(loader("uint8", collate_fn=FastCollateMixup(**mix)), device=torch.device("cpu"),
                                  re_prob=RE_PROB, re_mode=RE_MODE)
        iterator = iter(prefetch)
        return iterator, iterator.close

    return {"float32": float32, "uint8": uint8}, {"transform": " ".join(str(datasets["float32"].transform).split())}


def timm_worker(args):
    """Runs in the timm interpreter: one timed repeat of timm's loader of a dtype per 'run <dtype>' line on
    stdin, a JSON line each."""
    import PIL
    import timm
    import torch
    import torchvision

    starts, info = _timm_loaders(args.timm_worker, args.batch, args.batches)
    print(json.dumps({"torch": torch.__version__, "torchvision": torchvision.__version__, "timm": timm.__version__,
                      "pillow": PIL.__version__, **info}), flush=True)
    for line in sys.stdin:
        words = line.split()
        if len(words) != 2 or words[0] != "run" or words[1] not in starts:
            break
        rate, first = timed(starts[words[1]], args.batches)
        assert tuple(first[0].shape) == (args.batch, 3, IMAGE_SIZE, IMAGE_SIZE), first[0].shape
        assert tuple(first[1].shape) == (args.batch, len(PHOTOS)), first[1].shape  # soft targets
        print(json.dumps({"images_per_s": rate}), flush=True)


def measure_pipelines(args, folder):
    """{name: [img/s per round]} and what ran (versions, load)."""
    starts = keras_vit_pipelines(folder, args.batch)
    timm, timm_info = None, {}
    if args.timm_python:
        try:
            timm = TimmWorker(args.timm_python, folder, args.batch, args.batches, script=os.path.abspath(__file__))
            timm_info = timm.versions
        except (OSError, RuntimeError, ValueError) as err:
            timm_info = {"not_run": f"{args.timm_python} could not run timm's loader ({err})"}
    else:
        timm_info = {"not_run": "no --timm-python given (timm needs torchvision, which cannot be installed beside "
                                "this torch: give an interpreter that has torch, torchvision and timm)"}
    def soft_targets(name, first):
        assert first[1].shape == (args.batch, len(PHOTOS)), (name, first[1].shape)

    peers = {TIMM.format(dtype): functools.partial(timm.run, dtype) for dtype in DTYPES} if timm else {}
    try:
        rates, loads = folder_feed.rounds(args, starts, peers, soft_targets)
    finally:
        if timm:
            timm.close()
    return rates, {"timm": timm_info, "load_average": loads}


def pipeline_table(rates, timm_info):
    """The markdown table of `rates` ({name: [img/s per round]}), each row against timm's row of its dtype
    (`timm_info`: why timm did not run, where it did not)."""
    lines = folder_feed.rate_table(rates, lambda name: TIMM.format(name.rsplit(", ", 1)[1]),
                                   "timm's loader, same dtype")
    if "not_run" in timm_info:
        lines += [f"| {TIMM.format(dtype)} | not run: {timm_info['not_run']} | - | - |" for dtype in DTYPES]
    return "\n".join(lines)


def main(argv=None):
    args = folder_feed.parse(argv, description=__doc__.split("\n\n")[0])
    if args.timm_worker:
        return timm_worker(args)
    if args.fit_worker:
        return fit_worker(args, augment=AUGMENT)
    with tempfile.TemporaryDirectory(prefix="augmented_feed_") as tmp:
        folder = args.folder or write_folder(os.path.join(tmp, "photos"), args.images)
        print(f"CPU: {cpu_name()}; folder: {folder} ({args.images if not args.folder else 'given'} JPEGs)", flush=True)
        rates, info = measure_pipelines(args, folder)
        print(f"\nDecoding + {AUTO_AUGMENT}, random erasing {RE_PROB} ({RE_MODE}), MixUp/CutMix {json.dumps(MIXUP)} "
              f"to {IMAGE_SIZE} px, batch {args.batch}, {args.batches} batches timed after a warm-up batch, median "
              f"of {args.repeats} rounds; load average {info['load_average'][0]}-{info['load_average'][1]}")
        print(pipeline_table(rates, info["timm"]))
        if "not_run" not in info["timm"]:
            print(f"timm's side: {json.dumps(info['timm'])}")
        fits = measure_fits(args, folder, script=os.path.abspath(__file__)) if args.backends else {}
        if fits:
            print(f"\nmodel.fit step fed augmented and mixed batches, {args.model} at {args.fit_image_size} px, "
                  f"batch {args.fit_batch}, {args.fit_steps} steps timed per fit, median of {args.fit_rounds} rounds")
            print(fit_table(fits, args))
    report = {"cpu": cpu_name(), "versions": folder_feed.versions(), "augment": AUGMENT,
              "args": {k: v for k, v in vars(args).items() if not k.endswith("_worker")}, "pipelines": rates, **info,
              "fits": fits}
    print(f"\nversions: {json.dumps(report['versions'])}")
    if args.out:  # written whole, then moved into place: a Ctrl-C leaves no half file
        from keras_vit.fileio import write_json

        write_json(args.out, report)
    return report


if __name__ == "__main__":
    if "--timm-worker" in sys.argv:  # timm's interpreter, which has no Keras
        main()
        sys.exit()
    if "--fit-worker" not in sys.argv:
        os.environ["KERAS_BACKEND"] = "tensorflow"  # the throughput part iterates numpy batches: tf.data's backend
    from keras_vit.startup import run_main

    run_main(main)
