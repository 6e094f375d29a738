"""`keras-vit finetune` on a folder of photographs, measured: the real DINOv2 ViT-S/14 against fresh weights.

    python examples/own_images.py            # minutes on a 2-core CPU (docs/own-images.md)
    python examples/own_images.py --quick    # under a minute: what the test runs

Writes an image folder as a user's photographs come: scikit-image's textures (brick, grass, gravel) as
class subfolders of pieces of different sizes and aspect ratios, each with its own exposure and white
balance, JPEG and PNG files mixed, a few of each class in a nested folder. Then runs `keras-vit finetune`
on it twice with the same budget (epochs, batch, image size): from the real DINOv2 ViT-S/14 backbone
(examples/real_dinov2.py) and from fresh weights of ViT_S16, the registry's variant of that size (patch 16
instead of 14). Prints validation accuracy and minutes for each and where each run's outputs are.
"""

import argparse
import json
import os
import shutil
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # its helpers beside it

import real_dinov2  # noqa: E402

TEXTURES = ("brick", "grass", "gravel")  # 512x512 grey photographs shipped with scikit-image
OUTPUTS = ("model.keras", "curves.png", "confusion_matrix.png", "mistakes.png", "report.json")


def tiles(height, width, count, rng):
    """`count` (top, left, h, w) rectangles that tile a height x width image without overlap: the largest
    piece is cut across its longer side at 35-65% until there are `count`."""
    pieces = [(0, 0, height, width)]
    while len(pieces) < count:
        top, left, h, w = pieces.pop(int(np.argmax([p[2] * p[3] for p in pieces])))
        if h > w:
            cut = int(h * rng.uniform(0.35, 0.65))
            pieces += [(top, left, cut, w), (top + cut, left, h - cut, w)]
        else:
            cut = int(w * rng.uniform(0.35, 0.65))
            pieces += [(top, left, h, cut), (top, left + cut, h, w - cut)]
    return pieces


def write_folder(root, per_class, seed=0):
    """Writes `root`/<texture>/ photographs: `per_class` non-overlapping pieces of each texture (so no
    validation image shows a spot seen in training), each with its own exposure, contrast and white
    balance, saved as JPEG and PNG in turn, every fifth in a nested folder. Returns `root`."""
    from PIL import Image
    from skimage import data

    rng = np.random.default_rng(seed)
    for name in TEXTURES:
        texture = getattr(data, name)().astype(np.float32)
        for i, (top, left, h, w) in enumerate(tiles(*texture.shape, per_class, rng)):
            piece = texture[top:top + h, left:left + w]
            piece = (piece - piece.mean()) * rng.uniform(0.6, 1.4) + rng.uniform(70, 190)
            rgb = np.clip(piece[..., None] * rng.uniform(0.85, 1.15, 3), 0, 255).round().astype(np.uint8)
            folder = os.path.join(root, name, "more" if i % 5 == 4 else "")
            os.makedirs(folder, exist_ok=True)
            Image.fromarray(rgb).save(os.path.join(folder, f"{name}_{i:03d}.{'png' if i % 2 else 'jpg'}"))
    return root


def finetune(argv):
    """`keras-vit finetune ARGV...`; returns its report.json (the run's `--out` is the last of ARGV)."""
    from keras_vit.cli import main
    from keras_vit.startup import INTERRUPTED_STATUS

    status = main(["finetune", *argv])
    if status == INTERRUPTED_STATUS:  # Ctrl-C: keras-vit said what was kept in one line
        raise SystemExit(status)
    if status:
        raise SystemExit(f"keras-vit finetune {' '.join(argv)} failed (its error is above)")
    with open(os.path.join(argv[-1], "report.json")) as f:
        return json.load(f)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="6 images a class, 2 updates (what the test runs)")
    parser.add_argument("--out", default=os.path.join("runs", "own-images"),
                        help="where the folder (photos/) and the runs (dinov2/, fresh/) go")
    parser.add_argument("--per-class", type=int, default=40, help="photographs per class (default 40)")
    parser.add_argument("--image-size", type=int, default=112, help="pixels, a multiple of 14 and 16 (default 112)")
    parser.add_argument("--epochs", type=int, default=10, help="passes over the training images (default 10)")
    args = parser.parse_args(argv)
    budget = ["--image-size", str(args.image_size), "--epochs", str(args.epochs)]
    if args.quick:
        args.per_class, budget = 6, ["--image-size", str(args.image_size), "--steps", "2", "--batch-size", "6",
                                     "--quiet"]
    import keras

    photos = os.path.join(args.out, "photos")
    shutil.rmtree(photos, ignore_errors=True)
    write_folder(photos, args.per_class)
    runs = {"DINOv2 ViT-S/14": ["--weights", real_dinov2.dinov2_folder()],
            "fresh ViT_S16": ["--model", "ViT_S16", "--weights", "none"]}
    results = {}
    for (name, weights), out in zip(runs.items(), ("dinov2", "fresh")):
        out = os.path.join(args.out, out)
        print(f"\n== {name}: keras-vit finetune {photos} {' '.join(weights + budget)} --out {out}", flush=True)
        start = time.perf_counter()
        report = finetune([photos, *weights, *budget, "--validation-split", "0.25", "--overwrite", "--out", out])
        results[name] = {"report": report, "minutes": (time.perf_counter() - start) / 60, "out": out}
    first = next(iter(results.values()))["report"]
    counts, schedule = first["images"], first["schedule"]
    sizes = ", ".join(f"{k} {v['train']}+{v['validation']}" for k, v in counts.items())
    print(f"\n{sizes} images (training + validation), {args.image_size} px, batch {schedule['batch_size']}, "
          f"{schedule['epochs']} epochs of {schedule['updates_per_epoch']} updates, {keras.backend.backend()}")
    print("| weights | validation accuracy | minutes |\n|---|---|---|")
    for name, r in results.items():
        print(f"| {name} | {r['report']['validation_accuracy']:.3f} | {r['minutes']:.1f} |")
    for name, r in results.items():
        print(f"{name}: {', '.join(os.path.join(r['out'], f) for f in OUTPUTS)}")
    return results


if __name__ == "__main__":
    from keras_vit.startup import run_main

    run_main(main)
