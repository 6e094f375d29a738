"""Speed of the newer ViT families against timm's own models (issue 54, item 5), on this backend.

    KERAS_BACKEND=torch python benchmarks/family_speed.py --depth 4 --batch 8 --repeats 7 --json torch.json
    KERAS_BACKEND=jax python benchmarks/family_speed.py --depth 4 --batch 8 --repeats 7 --json jax.json

Per family: timm's architecture of that name (its width, heads, patch and position scheme; `--depth` blocks, or
all of them with 0), its weights drawn at random and written as a file named after it, which
`keras_vit.from_timm` reads (the outputs agree to float32 rounding, as tests/test_eva.py and its neighbours show).
In one process, calls alternating and the order flipped every round, medians of `--repeats`:
- inference: keras-vit's `predict_on_batch` (the backend's compiled forward: XLA on JAX and TensorFlow, eager
  on torch) against timm eager under `torch.inference_mode()`;
- training: keras-vit's `train_on_batch` (AdamW, sparse cross-entropy on logits) against timm's forward,
  backward and `torch.optim.AdamW` step.
`x_timm` is timm's time over keras-vit's: above 1, keras-vit is faster. The plain ViT's row is the baseline of the
backend (XLA's CPU code against timm's oneDNN kernels shows there); a family's own cost is its ratio against that.
"""

import argparse
import os
import pathlib
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))

from timing import alternate  # noqa: E402

# family -> timm's architecture of it (the smallest width timm defines for the family); the plain ViT first, the
# baseline: a family's ratio to timm next to it tells what the family's own layers cost
FAMILIES = {
    "ViT": "vit_small_patch16_224",
    "DINOv3": "vit_small_patch16_dinov3",
    "EVA-02": "eva02_small_patch14_224",
    "Perception Encoder": "vit_pe_core_small_patch16_384",
    "AIMv2": "aimv2_large_patch14_224",
    "BEiT v2": "beitv2_base_patch16_224",
    "RoPE-Mixed": "vit_small_patch16_rope_mixed_224",
}
MODES = ("inference", "training")


def measure(family, arch, args, folder):
    """The rows of one family: per mode, keras-vit's and timm's median ms and their ratio."""
    import keras
    import torch
    from timm_files import redraw, timm_file, timm_module

    import keras_vit

    timm = timm_module()
    patch = int(arch.split("patch")[1].split("_")[0])
    side = max(patch, args.image_size - args.image_size % patch)  # a whole number of patches
    size = (side, side)
    options = dict(img_size=size, num_classes=args.classes)
    if args.depth:
        options["depth"] = args.depth
    peer = redraw(timm.create_model(arch, pretrained=False, **options))
    ours = keras_vit.from_timm(timm_file(peer, folder, arch), image_size=size, classifier_activation=None)
    ours.compile(optimizer=keras.optimizers.AdamW(1e-4),
                 loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    rng = np.random.default_rng(0)
    x = rng.uniform(-1, 1, (args.batch, *size, 3)).astype("float32")
    y = rng.integers(0, args.classes, args.batch).astype("int32")
    x_peer, y_peer = torch.from_numpy(x).permute(0, 3, 1, 2).contiguous(), torch.from_numpy(y).long()
    optimizer = torch.optim.AdamW(peer.parameters(), lr=1e-4)

    def peer_infer():
        with torch.inference_mode():
            peer(x_peer)

    def peer_train():
        optimizer.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(peer(x_peer), y_peer).backward()
        optimizer.step()

    rows = []
    for mode in args.modes:
        peer.train(mode == "training")
        fns = ({"keras-vit": lambda: ours.predict_on_batch(x), "timm": peer_infer} if mode == "inference" else
               {"keras-vit": lambda: ours.train_on_batch(x, y), "timm": peer_train})
        ms = alternate(fns, args.warmup, args.repeats)
        rows.append(dict(family=family, arch=arch, mode=mode, depth=len(peer.blocks), batch=args.batch,
                         image_size=side, keras_vit_ms=ms["keras-vit"], timm_ms=ms["timm"],
                         x_timm=ms["timm"] / ms["keras-vit"]))
    return rows


def table(rows, backend):
    """The rows as a Markdown table."""
    lines = [f"| family (timm's architecture) | mode | keras-vit, {backend} (ms) | timm eager (ms) | x timm |",
             "|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['family']} (`{r['arch']}`, {r['depth']} blocks, {r['image_size']} px) | {r['mode']} | {r['keras_vit_ms']:.1f} | "
                     f"{r['timm_ms']:.1f} | {r['x_timm']:.2f} |")
    return "\n".join(lines)


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--families", nargs="+", default=list(FAMILIES), choices=list(FAMILIES), metavar="FAMILY",
                   help=f"of {', '.join(FAMILIES)} (default: all)")
    p.add_argument("--depth", type=int, default=4, help="blocks of each model (0: the architecture's own)")
    p.add_argument("--image-size", type=int, default=224, help="rounded down to a whole number of patches")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--classes", type=int, default=10)
    p.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    p.add_argument("--warmup", type=int, default=2, help="untimed rounds first (the first compiles)")
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--json", default=None, help="write the rows here")
    args = p.parse_args(argv)
    for name in ("depth", "image_size", "batch", "classes", "warmup", "repeats"):
        low = 0 if name in ("depth", "warmup") else 1
        if getattr(args, name) < low:
            p.error(f"--{name.replace('_', '-')} must be at least {low}, got {getattr(args, name)}")
    return args


def main(argv=None):
    args = parse_args(argv)
    import keras

    from keras_vit.fileio import write_json

    rows = []
    with tempfile.TemporaryDirectory() as folder:
        for family in args.families:
            rows.extend(measure(family, FAMILIES[family], args, pathlib.Path(folder)))
            print(f"{family}: " + ", ".join(f"{r['mode']} x timm {r['x_timm']:.2f}" for r in rows[-len(args.modes):]),
                  flush=True)
    print(table(rows, keras.backend.backend()))
    if args.json:
        write_json(args.json, {"backend": keras.backend.backend(), "rows": rows})
    return rows


if __name__ == "__main__":
    main()
