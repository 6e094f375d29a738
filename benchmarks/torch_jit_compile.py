"""The torch backend's `jit_compile=True` (Keras' `torch.compile` of the whole training step) on a
tiny ViT under the fine-tuning recipe: seconds per `train_on_batch` call, the first being the
compilation. The reproduction of the InductorError seen on a GPU (benchmarks/README.md).

    python benchmarks/torch_jit_compile.py --policy mixed_bfloat16 --steps 3
"""

import argparse
import os
import time


# the Keras backend it runs on (set before Keras is imported)
BACKEND = "torch"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--policy", default="float32", choices=["float32", "mixed_bfloat16", "mixed_float16"])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--batch", type=int, default=8)
    args = parser.parse_args(argv)
    os.environ["KERAS_BACKEND"] = BACKEND
    import keras
    import numpy as np

    import keras_vit
    from keras_vit import recipes

    keras.mixed_precision.set_global_policy(args.policy)
    model = keras_vit.VisionTransformer(image_size=32, patch_size=8, hidden_size=32, mlp_dim=64, num_heads=2,
                                       num_layers=2, classes=10)
    recipes.compile_for_finetuning(model, total_steps=100, warmup_steps=5, jit_compile=True)
    rng = np.random.default_rng(0)
    x = rng.uniform(-1, 1, (args.batch, 32, 32, 3)).astype("float32")
    y = (np.arange(args.batch) % 10).astype("int32")
    import torch

    print(f"torch {torch.__version__}, device {'cuda' if torch.cuda.is_available() else 'cpu'}, policy {args.policy}")
    for step in range(args.steps):
        start = time.perf_counter()
        loss, accuracy = model.train_on_batch(x, y)
        print(f"step {step}: {time.perf_counter() - start:.1f} s, loss {loss:.4f}", flush=True)


if __name__ == "__main__":
    os.environ["KERAS_BACKEND"] = BACKEND  # before keras_vit imports Keras
    from keras_vit.startup import run_main

    run_main(main)
