#!/usr/bin/env python
"""Three ways to fine-tune the demo's pre-trained ViT on digits 5-9, offline, with one budget:
full fine-tuning (the paper's), full fine-tuning with layer-wise learning-rate decay, and LoRA.

    make demo                                           # writes runs/demo/pretrained.npz
    KERAS_BACKEND=jax python examples/lora_digits.py    # reads it, writes runs/lora/

Each arm loads the demo's official-layout checkpoint into the 32-px ViT (new zero head), trains with
`compile_for_finetuning` for the same number of updates and reports the held-out test accuracy, the
number of trainable parameters and, for LoRA, the size of the adapter file (`save_lora`), which is
reloaded into a fresh model and checked to give the same predictions. Results go to
`--out/metrics.json`, written only once every arm has finished.
"""

import argparse
import os
import sys

os.environ.setdefault("KERAS_BACKEND", "jax")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from demo import FINETUNE_CLASSES, FULL, QUICK, build_vit, evaluate, fit, load_digit_splits  # noqa: E402
from _digits import make_batches, to_rgb  # noqa: E402

from keras_vit.extras import require_or_exit  # noqa: E402
from keras_vit.fileio import write_json  # noqa: E402

# LoRA trains far fewer weights from a zero start of B: a higher rate, as LoRA practice has it
ARMS = {"full": dict(), "layer_decay": dict(layer_decay=0.75), "lora": dict(lora_rank=8, lr_scale=10.0)}
LORA_TARGETS = ("query", "value", "mlp")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description="Full fine-tuning, layer-wise learning-rate decay and LoRA "
                                     "from the demo's pre-trained ViT on digits 5-9 (offline).")
    parser.add_argument("--pretrained", default=os.path.join("runs", "demo", "pretrained.npz"),
                        help="the demo's official-layout checkpoint (default: runs/demo/pretrained.npz; "
                             "`make demo` writes it)")
    parser.add_argument("--out", default=os.path.join("runs", "lora"), help="output folder (default: runs/lora)")
    parser.add_argument("--quick", action="store_true", help="the demo's --quick model and 1 epoch (tests)")
    parser.add_argument("--seed", type=int, default=0, help="random seed (default: 0)")
    parser.add_argument("--verbose", type=int, choices=(0, 1, 2), default=2, help="Keras fit verbosity")
    args = parser.parse_args(argv)
    if not os.path.isfile(args.pretrained):
        parser.error(f"no checkpoint at {args.pretrained}: run `make demo` first (or the demo with --out and "
                     "pass --pretrained OUT/pretrained.npz)")
    return args, dict(QUICK if args.quick else FULL)


def trainable_parameters(model):
    return int(sum(np.prod(v.shape) for v in model.trainable_weights))


def run_arm(name, arm, args, config, data):
    import keras

    import keras_vit
    from keras_vit import recipes

    keras.utils.set_random_seed(args.seed)
    model = build_vit(config, config["finetune_size"], classes=len(FINETUNE_CLASSES), classifier_activation=None,
                      name=f"vit_{name}")
    keras_vit.load_weights(model, args.pretrained)
    if "lora_rank" in arm:
        keras_vit.enable_lora(model, arm["lora_rank"], targets=LORA_TARGETS)
    (x_train, y_train), test = data
    train = make_batches(x_train, y_train, config["batch_size"], args.seed + 1)
    steps = len(train) * config["finetune_epochs"]
    recipes.compile_for_finetuning(model, total_steps=steps, base_lr=config["finetune_lr"] * arm.get("lr_scale", 1.0),
                                   warmup_steps=max(1, steps // 10), batch_size=config["batch_size"],
                                   layer_decay=arm.get("layer_decay"))
    print(f"\n[{name}] {trainable_parameters(model):,} trainable of {int(sum(np.prod(v.shape) for v in model.weights)):,} "
          f"parameters, {steps} updates")
    fit(model, train, test, config["finetune_epochs"], args.verbose)
    result = {"test_accuracy": evaluate(model, *test)["accuracy"], "trainable_parameters": trainable_parameters(model),
              "parameters": int(sum(np.prod(v.shape) for v in model.weights)), "updates": steps, **arm}
    if "lora_rank" in arm:
        result |= adapters_round_trip(model, args, config, test[0])
    return result


def adapters_round_trip(model, args, config, images):
    """Writes the adapters, reloads them into a fresh model from the checkpoint: the same predictions."""
    import keras

    import keras_vit

    path = os.path.join(args.out, "adapters.npz")
    keras_vit.save_lora(model, path)
    fresh = build_vit(config, config["finetune_size"], classes=len(FINETUNE_CLASSES), classifier_activation=None)
    keras_vit.load_weights(fresh, args.pretrained)
    keras_vit.load_lora(fresh, path)
    gap = float(np.abs(keras.ops.convert_to_numpy(fresh(images[:32])) - keras.ops.convert_to_numpy(model(images[:32]))).max())
    if gap > 1e-5:
        raise RuntimeError(f"the reloaded adapters predict differently (max |difference| {gap:.2e})")
    return {"adapter_file_bytes": os.path.getsize(path), "adapter_reload_max_abs_difference": gap}


def main(argv=None):
    import keras

    args, config = parse_args(argv)
    require_or_exit("the digits examples")
    os.makedirs(args.out, exist_ok=True)
    fin = load_digit_splits(args.seed)["finetune"]
    size = config["finetune_size"]
    data = ((to_rgb(fin["x_train"], size), fin["y_train"]), (to_rgb(fin["x_test"], size), fin["y_test"]))
    results = {name: run_arm(name, arm, args, config, data) for name, arm in ARMS.items()}
    metrics = {"arms": results, "backend": keras.backend.backend(), "seed": args.seed, "quick": args.quick,
               "lora_targets": list(LORA_TARGETS), "pretrained": os.path.abspath(args.pretrained)}
    write_json(os.path.join(args.out, "metrics.json"), metrics)
    print("\narm           test accuracy   trainable parameters")
    for name, r in results.items():
        print(f"{name:<13} {r['test_accuracy']:.4f}          {r['trainable_parameters']:,}")
    lora = results["lora"]
    print(f"LoRA adapter file: {lora['adapter_file_bytes']:,} bytes ({args.out}/adapters.npz)")
    return metrics


if __name__ == "__main__":
    from keras_vit.startup import run_main

    run_main(main)
