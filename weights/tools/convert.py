"""Converts an official ViT checkpoint (registry tag or .npz) into a Keras `.keras` or `.weights.h5`
file, and checks that the converted file gives the same outputs as the model it came from.

    python weights/tools/convert.py --model ViT_B16 --weights imagenet21k+imagenet2012 --out vit_b16.keras
    python weights/tools/convert.py --model ViT_Ti16 --weights my.npz --image-size 224 --out ti16.weights.h5

The file is written to a temporary name beside --out and renamed only after the check passes.
"""

import argparse
import sys

import numpy as np

from keras_vit.fileio import atomic_write


def convert(model_name, weights, out, image_size=None, classes=None, tolerance=1e-5, seed=0):
    import keras

    import keras_vit

    if not out.endswith((".keras", ".weights.h5")):
        raise ValueError(f"--out must end in .keras or .weights.h5, got {out!r}")
    factory = getattr(keras_vit, keras_vit.get_variant(model_name).name)
    model = factory(weights=weights, image_size=image_size, classes=classes, classifier_activation=None)
    x = np.random.default_rng(seed).uniform(-1, 1, (2, *model.input_shape[1:])).astype("float32")
    before = model.predict(x, verbose=0)

    with atomic_write(out) as tmp:
        if out.endswith(".keras"):
            model.save(tmp)
            reloaded = keras.saving.load_model(tmp, safe_mode=True)
        else:
            model.save_weights(tmp)
            reloaded = factory(image_size=model.input_shape[1:3], classes=model.output_shape[-1],
                               classifier_activation=None, representation_size=_rep(model))
            reloaded.load_weights(tmp)
        after = reloaded.predict(x, verbose=0)
        err = float(np.abs(after - before).max())
        if err > tolerance:
            raise ValueError(f"converted model differs from the source by {err:.3g} > {tolerance}")
    return err


def _rep(model):
    names = {layer.name for layer in model.layers}
    return model.get_layer("pre_logits").units if "pre_logits" in names else None


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="variant factory name, e.g. ViT_B16")
    parser.add_argument("--weights", required=True, help="registry tag or path to an official .npz")
    parser.add_argument("--out", required=True, help="output .keras or .weights.h5 file")
    parser.add_argument("--image-size", type=int, default=None)
    parser.add_argument("--classes", type=int, default=None)
    args = parser.parse_args(argv)
    err = convert(args.model, args.weights, args.out, args.image_size, args.classes)
    print(f"wrote {args.out}; max abs difference of the reloaded model's logits: {err:.2e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
