"""The `keras-vit` command: `predict`, `list`, `inspect`."""

import argparse
import os
import sys


def _build(args):
    import keras_vit

    if args.model not in keras_vit.VARIANTS:
        raise SystemExit(f"keras-vit: unknown model {args.model!r}; expected one of {', '.join(keras_vit.VARIANTS)}")
    weights = None if args.weights in (None, "none") else args.weights
    return getattr(keras_vit, args.model)(weights=weights, image_size=args.image_size)


def _predict(args):
    import numpy as np

    from keras_vit.preprocessing import decode_predictions, load_image, preprocess_input

    model = _build(args)
    size = model.input_shape[1:3]
    images = np.stack([load_image(path, size) for path in args.images])
    probs = model.predict(preprocess_input(images), batch_size=args.batch_size, verbose=0)
    classes = probs.shape[-1]
    if classes in (1000, 21843):
        decoded = decode_predictions(probs, top=args.top)
    else:  # a head of the user's own classes: indices only
        order = np.argsort(-probs, axis=-1)[:, : args.top]
        decoded = [[(str(i), f"class {i}", float(p[i])) for i in row] for p, row in zip(probs, order)]
    for path, rows in zip(args.images, decoded):
        print(path)
        for rank, (synset, name, score) in enumerate(rows, 1):
            print(f"  {rank}. {score:7.2%}  {name}  ({synset})")


def _list(args):
    from keras_vit.variants import VARIANTS
    from keras_vit.weights.registry import format_table

    print("Variants (factory, official name, patch, hidden, MLP, heads, layers, ResNet stem):")
    for name, (official, patch, dim, mlp, heads, depth, resnet) in VARIANTS.items():
        stem = "-" if resnet is None else str(tuple(resnet["num_layers"]))
        print(f"  {name:12s} {official:14s} {patch:>3d} {dim:>5d} {mlp:>5d} {heads:>3d} {depth:>3d}  {stem}")
    print("\nReleased weights (weights=TAG):")
    print(format_table(args.variant))


def main(argv=None):
    parser = argparse.ArgumentParser(prog="keras-vit", description="Vision Transformer model zoo for Keras 3.")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("predict", help="classify images and print the top classes")
    p.add_argument("images", nargs="+", metavar="IMAGE")
    p.add_argument("--model", default="ViT_B16", help="variant factory name (default ViT_B16)")
    p.add_argument("--weights", default="imagenet21k+imagenet2012", help="registry tag or a path (.npz, .weights.h5)")
    p.add_argument("--image-size", type=int, default=None, help="input size; default: the weights' resolution")
    p.add_argument("--top", type=int, default=5)
    p.add_argument("--batch-size", type=int, default=8)
    p.set_defaults(func=_predict)

    p = sub.add_parser("list", help="list the variants and the registered released weights")
    p.add_argument("--variant", default=None, help="only this variant's weights")
    p.set_defaults(func=_list)

    from keras_vit.inspection import add_cli

    add_cli(sub)
    args = parser.parse_args(argv)
    try:
        args.func(args)
    except (ValueError, FileNotFoundError, OSError) as err:
        print(f"keras-vit {args.command}: error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
