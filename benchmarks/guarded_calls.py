"""What keras_vit.calls costs: `predict` and `fit` of a ViTModel against the same calls of Keras'
own Model on the same model object, interleaved in one process, each first in turn (median of --repeats).

    KERAS_BACKEND=jax python benchmarks/guarded_calls.py [--model ViT_Ti16] [--images 64] [--batch-size 32]
"""

import argparse
import platform
import statistics
import time

import keras
import numpy as np

import keras_vit


def _seconds(fn):
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="ViT_Ti16")
    parser.add_argument("--images", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args(argv)

    model = getattr(keras_vit, args.model)(classes=10)
    model.compile(optimizer=keras.optimizers.SGD(0.01), loss="sparse_categorical_crossentropy")
    size = model.input_shape[1]
    x = np.random.default_rng(0).uniform(-1, 1, (args.images, size, size, 3)).astype("float32")
    y = np.arange(args.images) % 10
    calls = {
        "predict": (lambda: model.predict(x, batch_size=args.batch_size, verbose=0),
                    lambda: keras.Model.predict(model, x, batch_size=args.batch_size, verbose=0)),
        "fit": (lambda: model.fit(x, y, batch_size=args.batch_size, verbose=0),
                lambda: keras.Model.fit(model, x, y, batch_size=args.batch_size, verbose=0)),
    }
    print(f"{args.model} at {size} px, {args.images} images, batch {args.batch_size}; backend "
          f"{keras.backend.backend()}, keras {keras.__version__}, {platform.processor() or platform.machine()}")
    for name, (guarded, plain) in calls.items():
        guarded(), plain()  # compile both paths
        g, p = [], []
        for i in range(args.repeats):  # interleaved, each first in turn, so load and caches hit both alike
            if i % 2:
                p.append(_seconds(plain))
                g.append(_seconds(guarded))
            else:
                g.append(_seconds(guarded))
                p.append(_seconds(plain))
        g, p = statistics.median(g), statistics.median(p)
        print(f"  {name:8s} keras-vit {g * 1e3:8.1f} ms   keras.Model {p * 1e3:8.1f} ms   ratio {p / g:.3f}")


if __name__ == "__main__":
    from keras_vit.startup import run_main

    run_main(main)
