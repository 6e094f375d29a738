#!/usr/bin/env python
"""CPU serving in one run: keras-vit's ONNX against timm's ONNX, both under the same onnxruntime
session options and under OpenVINO, and against timm eager.

    KERAS_BACKEND=torch python benchmarks/serving.py --models ViT_B16 ViT_S16 --batches 1 8 32

Exports each model at 224 px (random weights: speed does not depend on them), both with a dynamic
batch and the same signature, so that the two files do the same work: uint8 NHWC images in,
scaling to [-1, 1] and the softmax inside, probabilities out. keras-vit's through
`keras_vit.export.export`, timm's `vit_*_patch16_224` wrapped in that signature through torch's
dynamo exporter (exact GELU, like keras-vit's timm-converted models, which the keras-vit model
here is built as); timm eager runs the same wrapper. Both files run under onnxruntime with
ORT_ENABLE_ALL (the default, set explicitly) and the same thread count; under OpenVINO in float32
(set explicitly: OpenVINO computes in bf16 by default on a CPU with AVX512_BF16 or AMX;
`--openvino-precision f32 bf16` adds rows for that). Each round calls every
runtime once, in an order that alternates between rounds, so all see the same machine load; two
warm-up rounds. Prints, per batch, the median and 90th percentile seconds per call, images/s,
and each keras-vit row's speed as a ratio to its peers in the same round set; also the median
CPU time of the process per call and its ratios. With `--threads 1` the CPU time is the compute
itself, whatever else the machine runs: the figure to compare graphs by on a shared machine
(with more threads it also counts the thread pools' spinning).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

TIMM_NAMES = {"ViT_B16": "vit_base_patch16_224", "ViT_S16": "vit_small_patch16_224", "ViT_Ti16": "vit_tiny_patch16_224"}


# the Keras backend it runs on unless KERAS_BACKEND names another (set before Keras is imported)
BACKEND = "torch"


def timm_like(name, image_size):
    """keras-vit's variant `name` as a timm checkpoint converts to (exact GELU), random weights."""
    import keras_vit
    from keras_vit.configs import get_variant

    v = get_variant(name)
    return keras_vit.VisionTransformer(image_size=image_size, patch_size=v.patch_size, hidden_size=v.hidden_size,
                                       mlp_dim=v.mlp_dim, num_heads=v.num_heads, num_layers=v.num_layers,
                                       approximate_gelu=False)


def timm_serving(model):
    """timm's `model` behind keras-vit's serving signature: uint8 (B, H, W, 3) images in, the same
    scaling to [-1, 1] as keras-vit's serving model, probabilities out."""
    import torch

    class Serving(torch.nn.Module):
        def __init__(self, model):
            super().__init__()
            self.model = model

        def forward(self, images):
            x = images.permute(0, 3, 1, 2).float() / 127.5 - 1
            return torch.softmax(self.model(x), dim=-1)

    return Serving(model).eval()


def _timm_onnx(model, path, image_size):
    import torch

    example = torch.zeros((2, image_size, image_size, 3), dtype=torch.uint8)
    program = torch.onnx.export(timm_serving(model), (example,), dynamo=True, input_names=["images"],
                                dynamic_shapes={"images": {0: torch.export.Dim("batch")}}, verbose=False)
    program.optimize()
    program.save(path)


def _runners(args, name, folder):
    """{label: (call(batch of uint8 NHWC images) -> None)} for one model."""
    import onnxruntime as ort
    import torch

    from keras_vit.export import export
    from timm_peer import import_timm

    model = timm_like(name, args.image_size)
    timm_model = import_timm().create_model(TIMM_NAMES[name], pretrained=False, img_size=args.image_size).eval()
    files = {"keras-vit": export(model, os.path.join(folder, name), "onnx"),
             "timm": os.path.join(folder, f"{name}_timm.onnx")}
    _timm_onnx(timm_model, files["timm"], args.image_size)
    runners = {}
    options = ort.SessionOptions()  # the same for every file
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    if args.threads:
        options.intra_op_num_threads = args.threads
    for label, path in files.items():
        session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
        runners[f"{label} ONNX onnxruntime"] = (lambda s: lambda images: s.run(None, {"images": images}))(session)
    if args.openvino:
        import openvino

        core = openvino.Core()
        for precision in args.openvino_precision:
            config = {"INFERENCE_PRECISION_HINT": precision}
            config.update({"INFERENCE_NUM_THREADS": args.threads} if args.threads else {})
            for label in ("keras-vit", "timm"):
                compiled = core.compile_model(files[label], "CPU", config)
                runner = f"{label} ONNX OpenVINO" + ("" if precision == "f32" else f" {precision}")
                runners[runner] = (lambda c: lambda images: c(images))(compiled)
    serving = timm_serving(timm_model)

    def eager(images):
        with torch.inference_mode():
            serving(torch.from_numpy(images))

    runners["timm eager"] = eager
    return runners


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["ViT_B16", "ViT_S16"], choices=sorted(TIMM_NAMES))
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--no-openvino", dest="openvino", action="store_false")
    parser.add_argument("--openvino-precision", nargs="+", default=["f32"], choices=["f32", "bf16"],
                        help="OpenVINO's inference precision, one set of rows each (default f32; OpenVINO's own "
                        "default on a CPU with AVX512_BF16 or AMX is bf16, whose results are not float32's)")
    parser.add_argument("--threads", type=int, default=0,
                        help="threads of every runtime (onnxruntime intra-op, OpenVINO, torch); 0: each one's default")
    args = parser.parse_args(argv)
    os.environ.setdefault("KERAS_BACKEND", BACKEND)
    import onnxruntime as ort
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)

    folder = tempfile.mkdtemp()
    rows = []
    for name in args.models:
        runners = _runners(args, name, folder)
        for batch in args.batches:
            images = np.random.default_rng(0).integers(0, 256, (batch, args.image_size, args.image_size, 3), np.uint8)
            times = {label: [] for label in runners}
            cpu = {label: [] for label in runners}
            for r in range(args.repeats + 2):
                for label, call in list(runners.items())[:: 1 if r % 2 else -1]:
                    start, start_cpu = time.perf_counter(), time.process_time()
                    call(images)
                    if r >= 2:  # two warm-up rounds
                        times[label].append(time.perf_counter() - start)
                        cpu[label].append(time.process_time() - start_cpu)
            for label, values in times.items():
                median = statistics.median(values)
                rows.append({"model": name, "runtime": label, "batch": batch, "seconds": median,
                             "p90_seconds": float(np.percentile(values, 90)), "images_per_s": batch / median,
                             "cpu_seconds": statistics.median(cpu[label])})
    _ratios(rows)
    cpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    model_name = next((line.split(":", 1)[1].strip() for line in cpu.splitlines() if line.startswith("Model name")), "?")
    versions = {"cpu": model_name, "cpus": os.cpu_count(), "load_average": os.getloadavg(),
                "onnxruntime": ort.__version__, "torch": torch.__version__, "torch_threads": torch.get_num_threads()}
    if args.openvino:
        import openvino

        versions["openvino"] = openvino.__version__
    print(json.dumps({"versions": versions, "rows": rows}, indent=1))
    for row in rows:
        ratios = "  ".join(f"{v:.2f}x {k[9:]}" for k, v in row.items() if k.startswith("ratio_to_"))
        cpu_ratios = "  ".join(f"{v:.2f}x" for k, v in row.items() if k.startswith("cpu_ratio_to_"))
        print(f"{row['model']:8s} {row['runtime']:30s} batch {row['batch']:2d}: median {row['seconds'] * 1e3:8.1f} ms"
              f"  p90 {row['p90_seconds'] * 1e3:8.1f} ms  {row['images_per_s']:7.2f} img/s  {ratios}"
              f"  | CPU {row['cpu_seconds'] * 1e3:8.1f} ms {cpu_ratios}")


def _ratios(rows):
    """Adds to each keras-vit row its speed over timm's ONNX in the same runtime and over timm eager."""
    by_key = {(r["model"], r["batch"], r["runtime"]): r for r in rows}
    for row in rows:
        if not row["runtime"].startswith("keras-vit"):
            continue
        runtime = row["runtime"].split(" ONNX ")[1]
        peers = {f"timm ONNX {runtime}": f"timm ONNX {runtime}", "timm eager": "timm eager"}
        for label, peer in peers.items():
            other = by_key.get((row["model"], row["batch"], peer))
            if other is not None:
                row[f"ratio_to_{label}"] = other["seconds"] / row["seconds"]
                row[f"cpu_ratio_to_{label}"] = other["cpu_seconds"] / row["cpu_seconds"]


if __name__ == "__main__":
    os.environ.setdefault("KERAS_BACKEND", BACKEND)  # before keras_vit imports Keras
    from keras_vit.startup import run_main

    run_main(main)
