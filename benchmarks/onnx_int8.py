#!/usr/bin/env python
"""int8 ONNX (onnxruntime's quantization, `keras-vit export --quantize int8`) against float32 ONNX:
speed on ViT-B/16, accuracy and top-1 agreement on the offline demo's fine-tuned model and on held-out
photographs under a ViT-B/16 trained on photographs.

    make demo                                            # writes runs/demo/model.keras
    KERAS_BACKEND=jax python benchmarks/onnx_int8.py --demo runs/demo/model.keras

Speed: ViT-B/16 at 224 px (random weights: speed does not depend on them) exported float32, int8
dynamic, and int8 static (calibrated on `--calibration-count` random-noise images: ranges, not
accuracy, matter for speed), timed under onnxruntime at each batch, one call of each file in turn
after two warm-up rounds; median seconds per batch and the ratio to float32, and the same for the
process CPU time per call (with `--threads 1`, the compute itself whatever else the machine runs).
Fidelity: the demo model exported the same three ways (static calibrated on its training digits),
run in onnxruntime on its held-out test digits: accuracy and top-1 agreement with float32.
Photographs (no pretrained checkpoint can be fetched offline, so the model is trained here): the
ViT-B/16 architecture (12 layers, width 768, exact GELU) at `--photo-size` px, trained from scratch
for `--photo-steps` updates to tell apart the photographs shipped with scikit-image and
scikit-learn (one class each), on random crops of the left 70% of each; held out: crops of the
right 30%, pixels never seen in training. Exported the same three ways (static calibrated on
training crops) and compared on the held-out crops: accuracy and top-1 agreement with float32.
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


# the Keras backend it runs on unless KERAS_BACKEND names another (set before Keras is imported)
BACKEND = "torch"


def _files(model, folder, name, calibration):
    from keras_vit.export import export

    return {
        "float32": export(model, os.path.join(folder, name), "onnx"),
        "int8 dynamic": export(model, os.path.join(folder, f"{name}_dyn"), "onnx", quantize="int8"),
        "int8 static": export(model, os.path.join(folder, f"{name}_static"), "onnx", quantize="int8",
                              calibration=calibration),
    }


def _fidelity(model, folder, name, calibration, x_test, y_test):
    """`model` exported as float32, int8 dynamic and int8 static (calibrated on `calibration`) and run
    in onnxruntime on uint8 `x_test`: Keras' accuracy (the model behind the files' uint8 input), and
    per file its accuracy, top-1 agreement with the float32 file, largest probability difference from
    Keras and size."""
    import keras
    import onnxruntime as ort

    from keras_vit.export import serving_model

    served = serving_model(model)
    keras_probs = np.concatenate([keras.ops.convert_to_numpy(served(x_test[i:i + 64])["probabilities"])
                                  for i in range(0, len(x_test), 64)])
    result = {"keras float32": {"accuracy": float(np.mean(keras_probs.argmax(-1) == y_test))}}
    predictions = {}
    for label, path in _files(model, folder, name, calibration).items():
        session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
        probs = np.concatenate([session.run(None, {"images": x_test[i:i + 64]})[0] for i in range(0, len(x_test), 64)])
        predictions[label] = probs.argmax(-1)
        result[label] = {"accuracy": float(np.mean(predictions[label] == y_test)),
                         "top1_agreement_with_float32": float(np.mean(predictions[label] == predictions["float32"])),
                         "max_probability_difference": float(np.abs(probs - keras_probs).max()),
                         "bytes": os.path.getsize(path)}
    return result


# the photographs of scikit-image's data folder (not its drawings, charts, text or binary masks) and
# scikit-learn's two sample images
SKIMAGE_PHOTOS = ("astronaut.png", "brick.png", "camera.png", "chelsea.png", "coffee.png", "coins.png", "grass.png",
                  "gravel.png", "hubble_deep_field.jpg", "ihc.png", "moon.png", "motorcycle_left.png", "retina.jpg",
                  "rocket.jpg")
SKLEARN_PHOTOS = ("china.jpg", "flower.jpg")
TRAIN_PART = 0.7  # of each photograph's width: training crops come from the left part, held-out ones from the rest


def photographs():
    """The photographs as RGB uint8 arrays (grey ones repeated to 3 channels), in a fixed order."""
    import sklearn.datasets
    import skimage
    from PIL import Image

    paths = [os.path.join(os.path.dirname(skimage.__file__), "data", f) for f in SKIMAGE_PHOTOS]
    paths += [os.path.join(os.path.dirname(sklearn.datasets.__file__), "images", f) for f in SKLEARN_PHOTOS]
    photos = []
    for path in paths:
        with Image.open(path) as image:
            photos.append(np.asarray(image.convert("RGB")))
    return photos


def photo_crops(photos, size, count, held_out, seed):
    """`count` random square crops of each photograph resized to `size` (uint8 (N, size, size, 3)) and
    their labels (the photograph's index): from the left TRAIN_PART of its width, flipped at random,
    or with `held_out` from the rest. A crop's side is 20-50% of the photograph's height, at most
    the part's width."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    images, labels = [], []
    for label, photo in enumerate(photos):
        h, w = photo.shape[:2]
        split = int(w * TRAIN_PART)
        left, right = (split, w) if held_out else (0, split)
        for _ in range(count):
            side = int(min(h * rng.uniform(0.2, 0.5), right - left))
            y, x = rng.integers(0, h - side + 1), rng.integers(left, right - side + 1)
            crop = Image.fromarray(photo[y:y + side, x:x + side]).resize((size, size), Image.Resampling.BILINEAR)
            crop = np.asarray(crop)
            images.append(crop[:, ::-1] if not held_out and rng.random() < 0.5 else crop)
            labels.append(label)
    return np.stack(images), np.array(labels)


def photo_fidelity(args, folder):
    """Trains the ViT-B/16 architecture on crops of the photographs; the three exports' accuracy and
    top-1 agreement with float32 on held-out crops."""
    import keras

    import keras_vit
    from keras_vit.configs import get_variant

    photos = photographs()
    x_train, y_train = photo_crops(photos, args.photo_size, args.photo_train_crops, False, args.seed)
    x_test, y_test = photo_crops(photos, args.photo_size, args.photo_test_crops, True, args.seed + 1)
    if args.photo_model and os.path.exists(args.photo_model):  # trained by an earlier run with these settings
        model = keras.saving.load_model(args.photo_model, compile=False)
        trained = json.load(open(args.photo_model + ".json"))
    else:
        v = get_variant(args.model)
        keras.utils.set_random_seed(args.seed)
        model = keras_vit.VisionTransformer(image_size=args.photo_size, patch_size=v.patch_size,
                                           hidden_size=v.hidden_size, mlp_dim=v.mlp_dim, num_heads=v.num_heads,
                                           num_layers=v.num_layers, classes=len(photos), approximate_gelu=False,
                                           input_dtype="uint8")
        keras_vit.recipes.compile_for_pretraining(model, args.photo_steps, base_lr=3e-4, weight_decay=0.05,
                                                  warmup_steps=args.photo_steps // 10, decay="cosine", batch_size=32)
        epochs = -(-args.photo_steps * 32 // len(x_train))
        order = np.random.default_rng(args.seed).permutation(len(x_train))
        start = time.perf_counter()
        model.fit(x_train[order], y_train[order], batch_size=32, epochs=epochs, verbose=2)
        trained = {"updates": epochs * -(-len(x_train) // 32), "train_seconds": time.perf_counter() - start}
        if args.photo_model:
            os.makedirs(os.path.dirname(os.path.abspath(args.photo_model)), exist_ok=True)
            model.save(args.photo_model)
            with open(args.photo_model + ".json", "w") as f:
                json.dump(trained, f)
    return {"model": f"{args.model} architecture at {args.photo_size} px, trained from scratch",
            "photographs": len(photos), "train_crops": len(x_train), "held_out_crops": len(x_test), **trained,
            **_fidelity(model, folder, "photos", x_train[:: max(1, len(x_train) // 300)], x_test, y_test)}


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
    parser.add_argument("--photo-size", type=int, default=64)
    parser.add_argument("--photo-steps", type=int, default=400, help="updates of the photograph model (0: skip it)")
    parser.add_argument("--photo-model", default=os.path.join("runs", "photos", "model.keras"),
                        help="where the trained photograph model is kept, and read from by later runs ('' : not kept)")
    parser.add_argument("--photo-train-crops", type=int, default=200, help="training crops per photograph")
    parser.add_argument("--photo-test-crops", type=int, default=50, help="held-out crops per photograph")
    parser.add_argument("--no-speed", dest="speed", action="store_false", help="fidelity only")
    parser.add_argument("--threads", type=int, default=0,
                        help="onnxruntime intra-op threads (0: its default); with 1, the per-call CPU time is the "
                        "compute itself on a shared machine")
    args = parser.parse_args(argv)
    os.environ.setdefault("KERAS_BACKEND", BACKEND)
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
    fidelity = _fidelity(model, folder, "demo", x_train[:300], x_test, data["y_test"])
    result["demo"] = {"test_images": len(x_test), "calibration_images": min(300, len(x_train)), **fidelity}
    if args.photo_steps:
        result["photographs"] = photo_fidelity(args, folder)
    if not args.speed:
        print(json.dumps(result, indent=1))
        return

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
    os.environ.setdefault("KERAS_BACKEND", BACKEND)  # before keras_vit imports Keras
    from keras_vit.startup import run_main

    run_main(main)
