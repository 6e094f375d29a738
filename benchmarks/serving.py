#!/usr/bin/env python
"""CPU serving: keras-vit's exported ONNX model under onnxruntime against timm eager, same run.

    KERAS_BACKEND=torch python benchmarks/serving.py --batches 1 8 --repeats 10

Exports ViT-B/16 (random weights: speed does not depend on them) at 224 px with the uint8 serving
signature, one ONNX file per batch size from torch (tf2onnx, TensorFlow's route, needed about 18 GB
of memory for ViT-B/16 and was killed on a 23 GB machine), then times
onnxruntime and timm's `vit_base_patch16_224` under `torch.inference_mode()`, alternating one call
of each so both see the same machine load; prints the median seconds per batch and images/s.
"""

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--model", default="ViT_B16")
    parser.add_argument("--timm-name", default="vit_base_patch16_224")
    args = parser.parse_args(argv)
    os.environ.setdefault("KERAS_BACKEND", "torch")
    import onnxruntime as ort
    import torch

    import keras_vit
    from workers import _import_timm
    from keras_vit.export import export

    import keras

    model = getattr(keras_vit, args.model)(image_size=args.image_size)
    fixed = keras.backend.backend() == "torch"
    folder = tempfile.mkdtemp()
    reference = _import_timm().create_model(args.timm_name, pretrained=False, img_size=args.image_size).eval()
    rows = []
    for batch in args.batches:
        path = export(model, os.path.join(folder, f"onnx{batch}"), "onnx", batch_size=batch if fixed else None)
        session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
        name = session.get_inputs()[0].name
        images = np.random.default_rng(0).integers(0, 256, (batch, args.image_size, args.image_size, 3), np.uint8)
        tensor = torch.from_numpy(images).permute(0, 3, 1, 2).float() / 127.5 - 1

        def onnx_call():
            session.run(None, {name: images})

        def timm_call():
            with torch.inference_mode():
                reference(tensor)

        times = {"onnxruntime": [], "timm": []}
        for r in range(args.repeats + 2):
            for label, fn in (("onnxruntime", onnx_call), ("timm", timm_call))[:: 1 if r % 2 else -1]:
                start = time.perf_counter()
                fn()
                if r >= 2:  # two warm-up rounds
                    times[label].append(time.perf_counter() - start)
        for label, values in times.items():
            median = statistics.median(values)
            rows.append({"runtime": label, "batch": batch, "seconds": median, "images_per_s": batch / median})
        rows[-2]["ratio_to_timm"] = rows[-1]["seconds"] / rows[-2]["seconds"]
    versions = {"onnxruntime": ort.__version__, "torch": torch.__version__, "threads": torch.get_num_threads()}
    print(json.dumps({"versions": versions, "rows": rows}, indent=1))
    for row in rows:
        print(f"{row['runtime']:12s} batch {row['batch']:2d}: {row['seconds'] * 1e3:8.1f} ms  "
              f"{row['images_per_s']:6.2f} img/s" + (f"  {row['ratio_to_timm']:.2f}x timm" if "ratio_to_timm" in row else ""))


if __name__ == "__main__":
    main()
