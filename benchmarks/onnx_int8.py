#!/usr/bin/env python
"""int8 ONNX (onnxruntime's quantization, `keras-vit export --quantize int8`) against float32 ONNX:
speed on ViT-B/16, accuracy and top-1 agreement on the offline demo's fine-tuned model.

    make demo                                            # writes runs/demo/model.keras
    KERAS_BACKEND=torch python benchmarks/onnx_int8.py --demo runs/demo/model.keras

Speed: ViT-B/16 at 224 px (random weights: speed does not depend on them) exported float32, int8
dynamic, and int8 static (calibrated on `--calibration-count` random-noise images: ranges, not
accuracy, matter for speed), timed under onnxruntime at each batch, one call of each file in turn
after two warm-up rounds; median seconds per batch and the ratio to float32, and the same for the
process CPU time per call (with `--threads 1`, the compute itself whatever else the machine runs).
Fidelity: the demo model exported the same three ways (static calibrated on its training digits),
run in onnxruntime on its held-out test digits: accuracy and top-1 agreement with float32.
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

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "examples"))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))


def _files(model, folder, name, calibration):
    from keras_vit.export import export

    return {
        "float32": export(model, os.path.join(folder, name), "onnx"),
        "int8 dynamic": export(model, os.path.join(folder, f"{name}_dyn"), "onnx", quantize="int8"),
        "int8 static": export(model, os.path.join(folder, f"{name}_static"), "onnx", quantize="int8",
                              calibration=calibration),
    }


def _to_uint8(x):
    """[-1, 1] floats -> the serving signature's uint8 pixels."""
    return np.round((x + 1) * 127.5).clip(0, 255).astype(np.uint8)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--demo", default=os.path.join("runs", "demo", "model.keras"))
    parser.add_argument("--seed", type=int, default=0, help="the demo run's seed (its splits)")
    parser.add_argument("--model", default="ViT_B16")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--repeats", type=int, default=6)
    parser.add_argument("--calibration-count", type=int, default=32)
    parser.add_argument("--threads", type=int, default=0,
                        help="onnxruntime intra-op threads (0: its default); with 1, the per-call CPU time is the "
                        "compute itself on a shared machine")
    args = parser.parse_args(argv)
    os.environ.setdefault("KERAS_BACKEND", "torch")
    import keras
    import onnxruntime as ort

    import demo

    folder = tempfile.mkdtemp()
    result = {"backend": keras.backend.backend(), "onnxruntime": ort.__version__}
    cpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    result["cpu"] = next((line.split(":", 1)[1].strip() for line in cpu.splitlines() if line.startswith("Model name")), "?")

    # fidelity on the demo model
    data = demo.load_digit_splits(args.seed)["finetune"]
    model = keras.saving.load_model(args.demo, compile=False)
    size = model.input_shape[1]
    x_test = _to_uint8(demo.to_rgb(data["x_test"], size))
    x_train = _to_uint8(demo.to_rgb(data["x_train"], size))
    keras_probs = keras.ops.convert_to_numpy(model(x_test.astype("float32") / 127.5 - 1))
    fidelity = {"keras float32": {"accuracy": float(np.mean(keras_probs.argmax(-1) == data["y_test"]))}}
    predictions = {}
    for label, path in _files(model, folder, "demo", x_train[:300]).items():
        session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
        predictions[label] = session.run(None, {"images": x_test})[0].argmax(-1)
        fidelity[label] = {"accuracy": float(np.mean(predictions[label] == data["y_test"])),
                           "top1_agreement_with_float32": float(np.mean(predictions[label] == predictions["float32"])),
                           "bytes": os.path.getsize(path)}
    result["demo"] = {"test_images": len(x_test), "calibration_images": min(300, len(x_train)), **fidelity}

    # speed on a full-size model
    from serving import timm_like

    vit = timm_like(args.model, 224)
    rng = np.random.default_rng(0)
    calibration = rng.integers(0, 256, (args.calibration_count, 224, 224, 3), np.uint8)
    options = ort.SessionOptions()
    if args.threads:
        options.intra_op_num_threads = args.threads
    files = _files(vit, folder, args.model, calibration)
    sessions = {label: ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
                for label, path in files.items()}
    result["bytes"] = {label: os.path.getsize(path) for label, path in files.items()}
    speed = []
    for batch in args.batches:
        images = rng.integers(0, 256, (batch, 224, 224, 3), np.uint8)
        times = {label: [] for label in sessions}
        cpu = {label: [] for label in sessions}
        for r in range(args.repeats + 2):
            for label, session in list(sessions.items())[:: 1 if r % 2 else -1]:
                start, start_cpu = time.perf_counter(), time.process_time()
                session.run(None, {"images": images})
                if r >= 2:
                    times[label].append(time.perf_counter() - start)
                    cpu[label].append(time.process_time() - start_cpu)
        medians = {label: statistics.median(values) for label, values in times.items()}
        cpu_medians = {label: statistics.median(values) for label, values in cpu.items()}
        for label, median in medians.items():
            speed.append({"model": args.model, "file": label, "batch": batch, "seconds": median,
                          "images_per_s": batch / median, "speed_over_float32": medians["float32"] / median,
                          "cpu_seconds": cpu_medians[label],
                          "cpu_speed_over_float32": cpu_medians["float32"] / cpu_medians[label]})
    result["speed"] = speed
    result["load_average"] = os.getloadavg()
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
