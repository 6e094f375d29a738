#!/usr/bin/env python
"""int8 vs float32 on the offline demo's fine-tuned model: test accuracy, file size, CPU latency.

    make demo                                        # writes runs/demo/model.keras
    KERAS_BACKEND=jax python benchmarks/quantize.py --model runs/demo/model.keras

Quantizes with Keras' own `model.quantize("int8")` (weights int8 per output channel, activations
quantized on the fly), evaluates both on the demo's held-out test split of digits 5-9 and times a
batch-1 and a batch-64 forward (compiled where the backend compiles), one call of each model in turn.
"""

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "examples"))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=os.path.join("runs", "demo", "model.keras"))
    parser.add_argument("--seed", type=int, default=0, help="the demo run's seed (its test split)")
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args(argv)
    import keras
    import numpy as np

    import demo
    import keras_vit  # noqa: F401  (registers the layers)

    data = demo.load_digit_splits(args.seed)["finetune"]
    model = keras.saving.load_model(args.model, compile=False)  # weights only, no optimizer state
    x = demo.to_rgb(data["x_test"], model.input_shape[1])
    quantized = keras.saving.load_model(args.model, compile=False)
    quantized.quantize("int8")
    folder = tempfile.mkdtemp()
    sizes = {}
    for name, m in (("float32", model), ("int8", quantized)):
        path = os.path.join(folder, f"{name}.keras")
        m.save(path)
        sizes[name] = os.path.getsize(path)
    reloaded = keras.saving.load_model(os.path.join(folder, "int8.keras"))
    rows = {}
    for name, m in (("float32", model), ("int8", reloaded)):
        probs = m.predict(x, batch_size=len(x), verbose=0)
        rows[name] = {"accuracy": float(np.mean(probs.argmax(-1) == data["y_test"])), "bytes": sizes[name]}
    for batch in (1, 64):
        images = x[:batch]
        times = {"float32": [], "int8": []}
        for r in range(args.repeats + 2):
            for name, m in (("float32", model), ("int8", reloaded)):
                start = time.perf_counter()
                m.predict_on_batch(images)
                if r >= 2:
                    times[name].append(time.perf_counter() - start)
        for name in times:
            rows[name][f"ms_batch{batch}"] = 1e3 * statistics.median(times[name])
    result = {"backend": keras.backend.backend(), "test_images": len(x), **rows,
              "size_ratio": sizes["float32"] / sizes["int8"]}
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    from keras_vit.startup import run_main

    run_main(main)
