#!/usr/bin/env python
"""Serving at mixed image sizes on a CPU: one ONNX file that takes any size against one fixed-size ONNX
file per size, and against timm's own `dynamic_img_size` export where torch's exporter writes it.

    KERAS_BACKEND=tensorflow python benchmarks/any_size.py --model ViT_S16 --threads 1

keras-vit's files are written by `keras_vit.export.export` from the running backend (the any-size file
of a model built with `input_shape=(None, None, 3)`, laid out for 224 px; each fixed file of the
same weights built at its size, the position embeddings resized once when loading): uint8 images
in, probabilities out. timm's `vit_*_patch16_224` with `dynamic_img_size=True` is wrapped in the
same signature and exported through torch's dynamo exporter with the height and width dynamic; its
row reads "failed: ..." when the exporter refuses it. Random weights (speed does not depend on them).
Every file runs under onnxruntime with the same session options; each round calls every file once,
in an order that alternates between rounds, after two warm-up rounds. Prints, per size, the median
seconds per image of each file, the any-size file's time as a ratio to the fixed file's (goal: within
5%), and the cost of the position embeddings' resize inside the graph, timed alone (a graph that
computes only it) per call. `--threads 1` makes the process CPU time the compute itself, whatever
else the machine runs.
"""

import argparse
import functools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

SIZES = ((224, 224), (160, 320), (384, 384), (96, 512), (448, 448))


# the Keras backend it runs on unless KERAS_BACKEND names another (set before Keras is imported)
BACKEND = "tensorflow"


def _keras_vit_files(name, sizes, folder):
    """{"any": path, (h, w): path}: one any-size file and one fixed file per size, the same weights."""
    from flops import arch_config

    import keras_vit
    from keras_vit.export import export
    from keras_vit.layers import resize_position_embeddings

    if name == "tiny":  # benchmark.py --tiny's configuration
        build = lambda **kwargs: keras_vit.VisionTransformer(**{**arch_config("tiny", 224), **kwargs})  # noqa: E731
    else:
        build = functools.partial(getattr(keras_vit, name), weights=None)
    any_size = build(input_shape=(None, None, 3))
    for i, var in enumerate(any_size.weights):
        var.assign(np.random.default_rng(i).normal(0, 0.02, var.shape).astype("float32"))
    files = {"any": export(any_size, os.path.join(folder, "any"), "onnx")}
    posembed = any_size.get_layer("posembed_input")
    for hw in sizes:
        fixed = build(image_size=hw)
        for layer in fixed.layers:
            values = [v.numpy() if hasattr(v, "numpy") else np.asarray(v) for v in any_size.get_layer(layer.name).weights]
            if layer.name == "posembed_input":
                values = [resize_position_embeddings(values[0], layer.grid_size, old_grid=posembed.grid_size,
                                                     method=posembed.interpolation)]
            layer.set_weights(values)
        files[hw] = export(fixed, os.path.join(folder, f"{hw[0]}x{hw[1]}"), "onnx")
    return files, any_size


def _timm_file(name, folder):
    """timm's dynamic_img_size export, or the exporter's one-line refusal."""
    import torch

    from serving import TIMM_NAMES, timm_serving
    from timm_peer import import_timm

    model = import_timm().create_model(TIMM_NAMES[name], pretrained=False, dynamic_img_size=True).eval()
    path = os.path.join(folder, "timm.onnx")
    h, w = torch.export.Dim("h", min=1, max=64), torch.export.Dim("w", min=1, max=64)
    dynamic = {"images": {0: torch.export.Dim("batch"), 1: 16 * h, 2: 16 * w}}
    try:
        program = torch.onnx.export(timm_serving(model), (torch.zeros((2, 224, 224, 3), dtype=torch.uint8),),
                                    dynamo=True, input_names=["images"], dynamic_shapes=dynamic, verbose=False)
        program.optimize()
        program.save(path)
    except Exception as err:  # the exporter's refusal is the figure
        return None, f"failed: {type(err).__name__}: {str(err).strip().splitlines()[0][:160]}"
    return path, "exported"


def _resize_only_file(any_size, folder):
    """An ONNX graph of the any-size model's position-embedding resize alone (images in, table out)."""
    import keras

    posembed = any_size.get_layer("posembed_input")

    class Resize(keras.layers.Layer):
        def call(self, images):
            from keras_vit.layers.position_embedding import runtime_grid

            return posembed.resized(runtime_grid(images, posembed.stride))

    images = keras.Input((None, None, 3), dtype="float32", name="images")
    graph = keras.Model(images, {"probabilities": Resize()(images)})
    path = os.path.join(folder, "resize_only.onnx")
    spec = keras.InputSpec(shape=(None, None, None, 3), dtype="float32", name="images")
    graph.export(path, format="onnx", input_signature=[spec], verbose=False)
    return path


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="ViT_S16", choices=["ViT_Ti16", "ViT_S16", "ViT_B16", "tiny"],
                        help="a variant, or tiny: benchmark.py --tiny's model, a seconds-long smoke run (with --no-timm)")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--threads", type=int, default=0, help="onnxruntime's intra-op threads; 0: its default")
    parser.add_argument("--sizes", nargs="+", default=[f"{h}x{w}" for h, w in SIZES], metavar="HxW",
                        help="image sizes, multiples of the patch (default: " + " ".join(f"{h}x{w}" for h, w in SIZES) + ")")
    parser.add_argument("--no-timm", dest="timm", action="store_false")
    args = parser.parse_args(argv)
    if args.model == "tiny" and args.timm:
        parser.error("--model tiny has no timm peer: add --no-timm")
    try:
        sizes = [tuple(int(v) for v in size.lower().split("x")) for size in args.sizes]
    except ValueError:
        parser.error(f"--sizes: expected HxW, e.g. 224x224, got {' '.join(args.sizes)}")
    os.environ.setdefault("KERAS_BACKEND", BACKEND)
    import keras
    import onnxruntime as ort
    from flops import ARCHS

    patch = ARCHS[args.model]["patch_size"]
    if any(len(hw) != 2 or min(hw) < patch or hw[0] % patch or hw[1] % patch for hw in sizes):
        parser.error(f"--sizes: expected HxW, multiples of {patch} (the patch), got {' '.join(args.sizes)}")

    folder = tempfile.mkdtemp()
    files, any_size = _keras_vit_files(args.model, sizes, folder)
    timm_path, timm_status = _timm_file(args.model, folder) if args.timm else (None, "not run (--no-timm)")
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    if args.threads:
        options.intra_op_num_threads = args.threads

    def session(path):
        s = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
        return lambda images: s.run(None, {s.get_inputs()[0].name: images})

    runners = {"any-size": session(files["any"])}
    if timm_path:
        runners["timm dynamic_img_size"] = session(timm_path)
    resize = session(_resize_only_file(any_size, folder))
    rows = []
    for hw in sizes:
        images = np.random.default_rng(0).integers(0, 256, (args.batch, *hw, 3), np.uint8)
        calls = dict(runners, fixed=session(files[hw]), resize=lambda _, x=images.astype("float32"): resize(x))
        times = {label: [] for label in calls}
        for r in range(args.repeats + 2):
            for label, call in list(calls.items())[:: 1 if r % 2 else -1]:
                start = time.process_time() if args.threads == 1 else time.perf_counter()
                call(images)
                if r >= 2:
                    times[label].append((time.process_time() if args.threads == 1 else time.perf_counter()) - start)
        row = {"size": f"{hw[0]}x{hw[1]}", **{f"{k}_ms_per_image": statistics.median(v) * 1e3 / args.batch
                                               for k, v in times.items() if k != "resize"},
               "resize_ms_per_call": statistics.median(times["resize"]) * 1e3}
        row["any_over_fixed"] = row["any-size_ms_per_image"] / row["fixed_ms_per_image"]
        if "timm dynamic_img_size_ms_per_image" in row:
            row["timm_over_any"] = row["timm dynamic_img_size_ms_per_image"] / row["any-size_ms_per_image"]
        rows.append(row)
    cpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    model_name = next((line.split(":", 1)[1].strip() for line in cpu.splitlines() if line.startswith("Model name")), "?")
    clock = "process CPU time" if args.threads == 1 else "wall time"
    print(json.dumps({"cpu": model_name, "cpus": os.cpu_count(), "load_average": os.getloadavg(),
                      "backend": keras.backend.backend(), "onnxruntime": ort.__version__, "clock": clock,
                      "timm_export": timm_status, "rows": rows}, indent=1))
    print(f"{args.model}, batch {args.batch}, {clock} per image (median of {args.repeats}); timm: {timm_status}")
    for row in rows:
        timm = f"  timm {row['timm dynamic_img_size_ms_per_image']:7.1f} ms ({row['timm_over_any']:.2f}x any-size)" \
            if "timm_over_any" in row else ""
        print(f"{row['size']:>8s}: any-size {row['any-size_ms_per_image']:7.1f} ms  fixed {row['fixed_ms_per_image']:7.1f} ms"
              f"  any/fixed {row['any_over_fixed']:.3f}  position resize alone {row['resize_ms_per_call']:.3f} ms a call{timm}")


if __name__ == "__main__":
    os.environ.setdefault("KERAS_BACKEND", BACKEND)  # before keras_vit imports Keras
    from keras_vit.startup import run_main

    run_main(main)
