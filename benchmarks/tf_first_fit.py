"""The first `fit` of a model on the TensorFlow backend (and a second one after it), with the step traced once
(`keras_vit.calls.TracesOnce`, the package's default) and as Keras alone traces it (twice: the optimizer's
and the metrics' variables made inside the first trace), each in a fresh process, the two in turn.

    python benchmarks/tf_first_fit.py [--model ViT_Ti16 | JSON] [--image-size 224] [--batch 8] [--rounds 3]

Prints each round's seconds and the medians' ratio; the figures are in benchmarks/README.md.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys

WORKER = """
import json, sys, time
import keras, numpy as np
import keras_vit
from keras_vit.calls import TracesOnce
model_name, size, batch, once = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "once"
if not once:
    del TracesOnce._maybe_symbolic_build  # Keras' own build: inside the step's first trace
if model_name.startswith("{"):  # builder arguments, e.g. a tiny configuration
    model = keras_vit.VisionTransformer(**{**json.loads(model_name), "image_size": size, "classes": 10})
else:
    model = getattr(keras_vit, model_name)(weights=None, image_size=size, classes=10)
model.compile(optimizer=keras.optimizers.AdamW(1e-4), loss="sparse_categorical_crossentropy", metrics=["accuracy"])
x = np.random.default_rng(0).uniform(-1, 1, (2 * batch, size, size, 3)).astype("float32")
y = np.arange(2 * batch) % 10
start = time.perf_counter()
model.fit(x, y, batch_size=batch, epochs=1, verbose=0)
fit = time.perf_counter() - start
start = time.perf_counter()
model.fit(x, y, batch_size=batch, epochs=1, verbose=0)
again = time.perf_counter() - start
print(json.dumps({"first_fit_s": fit, "second_fit_s": again}))
"""


def _round(args, mode):
    env = {**os.environ, "KERAS_BACKEND": "tensorflow", "TF_CPP_MIN_LOG_LEVEL": "2"}
    done = subprocess.run([sys.executable, "-c", WORKER, args.model, str(args.image_size), str(args.batch), mode],
                          env=env, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv=None):
    """Parses `argv` and prints the table (see the module's docstring).

    Args:
        argv: the command-line arguments, or None for sys.argv's.
    """
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="ViT_Ti16",
                        help="a keras_vit factory, or a JSON object of builder arguments (default ViT_Ti16)")
    parser.add_argument("--image-size", type=int, default=224, help="image size (default 224)")
    parser.add_argument("--batch", type=int, default=8, help="batch size; two steps an epoch (default 8)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of the two modes in turn (default 3)")
    args = parser.parse_args(argv)
    times = {"once": [], "keras": []}
    for i in range(args.rounds):
        for mode in times:
            result = _round(args, mode)
            times[mode].append(result["first_fit_s"])
            print(f"round {i + 1} {mode:>5}: first fit {result['first_fit_s']:6.2f} s, "
                  f"second {result['second_fit_s']:6.2f} s", flush=True)
    once, keras_alone = statistics.median(times["once"]), statistics.median(times["keras"])
    print(f"{args.model} at {args.image_size} px, batch {args.batch}: first fit {once:.2f} s traced once, "
          f"{keras_alone:.2f} s as Keras alone traces it ({keras_alone / once:.2f}x)")


if __name__ == "__main__":
    main()
