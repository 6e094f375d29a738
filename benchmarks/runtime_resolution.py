"""The cost and the exactness of runtime resolution (`input_shape=(None, None, 3)`) on one backend.

ViT-B/16 (random weights) built at a fixed size, and the same weights in a model that takes any
size (its position embeddings laid out for 224 px): inference img/s of both at 224 px (the trained
grid: nothing to resize) and 384 px (resized at every call), timed in alternating pairs because
the CPU may be shared; and the max abs difference of their outputs (pre-logits features).

    KERAS_BACKEND=jax python benchmarks/runtime_resolution.py --pairs 5 --batch 8
"""

import argparse
import json
import time

import numpy as np


def _models(size):
    import keras_vit
    from keras_vit.layers import resize_position_embeddings

    arch = dict(patch_size=16, hidden_size=768, mlp_dim=3072, num_heads=12, num_layers=12, include_top=False)
    fixed = keras_vit.VisionTransformer(image_size=size, **arch, name="fixed")
    dynamic = keras_vit.VisionTransformer(image_size=224, input_shape=(None, None, 3), **arch, name="runtime")
    for src, dst in zip(dynamic.layers, fixed.layers):
        values = [np.asarray(v.numpy()) for v in src.weights]
        if src.name == "posembed_input":
            values = [resize_position_embeddings(values[0], dst.grid_size)]
        dst.set_weights(values)
    return fixed, dynamic


def _rate(model, x, batch):
    start = time.perf_counter()
    model.predict(x, batch_size=batch, verbose=0)
    return len(x) / (time.perf_counter() - start)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[224, 384])
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--batches", type=int, default=2, help="batches per timed predict call")
    args = parser.parse_args(argv)

    import keras

    import keras_vit

    rows = []
    for size in args.sizes:
        fixed, dynamic = _models(size)
        for m in (fixed, dynamic):
            m.compile(jit_compile=keras_vit.jit_compile_default(training=False))
        x = np.random.default_rng(0).uniform(-1, 1, (args.batch * args.batches, size, size, 3)).astype("float32")
        diff = float(np.abs(fixed.predict(x, batch_size=args.batch, verbose=0)
                            - dynamic.predict(x, batch_size=args.batch, verbose=0)).max())  # also warms up
        pairs = []
        for i in range(args.pairs):
            order = (fixed, dynamic) if i % 2 == 0 else (dynamic, fixed)
            rates = {m.name: _rate(m, x, args.batch) for m in order}
            pairs.append((rates["fixed"], rates["runtime"]))
        pairs = np.array(pairs)
        row = dict(backend=keras.backend.backend(), size=size, batch=args.batch,
                   fixed_img_s=float(np.median(pairs[:, 0])), runtime_img_s=float(np.median(pairs[:, 1])),
                   ratio=float(np.median(pairs[:, 1] / pairs[:, 0])), max_abs_diff=diff)
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


if __name__ == "__main__":
    from keras_vit.startup import run_main

    run_main(main)
