"""Seconds per training step of full fine-tuning against LoRA fine-tuning of one ViT, in the same run,
on the current KERAS_BACKEND: the cost of LoRA's adapted kernels on keras-vit's fused paths.

    KERAS_BACKEND=jax python benchmarks/lora.py --variant ViT_S16 --batch 8 --steps 6

Both arms run `compile_for_finetuning` and `train_on_batch` on the same batch; the first two steps
(compilation) are left out of the median. Prints one line per arm and the LoRA / full ratio.
"""

import argparse
import statistics
import time


def step_seconds(model, x, y, steps):
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        model.train_on_batch(x, y)
        times.append(time.perf_counter() - start)
    return statistics.median(times[2:]) if len(times) > 2 else times[-1]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--variant", default="ViT_S16", help="a factory of keras_vit (default: ViT_S16)")
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--steps", type=int, default=6, help="steps per arm, the first two not counted")
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument("--targets", default="query,value", help="comma-separated LoRA targets")
    args = parser.parse_args(argv)
    import keras
    import numpy as np

    import keras_vit
    from benchmark import machine  # the CPU's or GPU's name, as benchmark.py reports it
    from keras_vit import recipes

    rng = np.random.default_rng(0)
    x = rng.uniform(-1, 1, (args.batch, args.image_size, args.image_size, 3)).astype("float32")
    y = (np.arange(args.batch) % 10).astype("int32")
    results = {}
    for arm in ("full", "lora"):
        model = getattr(keras_vit, args.variant)(image_size=args.image_size, classes=10, classifier_activation=None)
        if arm == "lora":
            keras_vit.enable_lora(model, args.rank, targets=tuple(args.targets.split(",")))
        recipes.compile_for_finetuning(model, total_steps=100, warmup_steps=5)
        trainable = int(sum(np.prod(v.shape) for v in model.trainable_weights))
        results[arm] = step_seconds(model, x, y, args.steps)
        print(f"{arm:>4}: {results[arm]:.3f} s/step, {trainable:,} trainable parameters", flush=True)
    print(f"{args.variant} {args.image_size}px batch {args.batch}, KERAS_BACKEND={keras.backend.backend()}, "
          f"{machine().get('gpu') or machine().get('cpu')}: LoRA / full = {results['lora'] / results['full']:.2f}")


if __name__ == "__main__":
    from keras_vit.startup import run_main

    run_main(main)
