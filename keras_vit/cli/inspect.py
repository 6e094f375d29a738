"""`keras-vit inspect`: a model's figures of the paper's section 4.5 (attention rollout, attention
distance, position-embedding similarity, embedding filters) as PNGs in a folder."""

import os

from keras_vit.calls import is_naflex
from keras_vit.cli.model_args import MODEL_HELP, WEIGHTS_HELP, build, image_size


def add_parser(sub):
    """`keras-vit inspect`'s arguments, a parser of the sub-parsers `sub`."""
    p = sub.add_parser(
        "inspect",
        help="draw attention rollout, attention distance, position-embedding similarity "
        "and embedding filters (paper section 4.5) as PNGs",
        description="Inspect a ViT as in section 4.5 of the paper: writes attention_rollout.png, "
        "attention_distance.png, position_embedding_similarity.png and embedding_filters.png "
        "(not for hybrids, which have no RGB filters) into --out.",
    )
    p.add_argument("--model", default=None, help=MODEL_HELP)
    p.add_argument("--weights", required=True,
                   help=f"{WEIGHTS_HELP}; 'none' for a randomly initialised model")
    p.add_argument("--image", required=True, action="append", metavar="PATH",
                   help="image file (repeat for several; all are used for the attention distance)")
    p.add_argument("--image-size", type=int, default=None,
                   help="model input size in pixels (images are resized to it); default: the variant's")
    p.add_argument("--out", required=True, help="output folder for the PNGs")
    p.add_argument("--num-components", type=int, default=28,
                   help="embedding-filter principal components to draw (default 28)")
    p.set_defaults(func=run)


def run(args):
    """`keras-vit inspect` of the parsed arguments `args`: writes the PNGs and prints where each went."""
    import warnings

    import numpy as np

    from keras_vit.inspection import find_vit, inspect_model
    from keras_vit.preprocessing import load_image, preprocess_input

    for path in args.image:  # before the model is built
        if os.path.isdir(path):
            raise ValueError(f"--image {path} is a folder; inspect takes image files (repeat --image for several, "
                             "or use keras-vit predict for a folder)")
    if os.path.exists(args.out) and not os.path.isdir(args.out):
        raise NotADirectoryError(f"--out {args.out} is a file; expected the folder to write the PNGs in")
    model, mode = build(args)
    if is_naflex(model):
        raise ValueError(f"--weights {args.weights}: model {model.name!r} is a NaFlex model (it takes patches, not "
                         "images); inspect draws the maps of a model that takes images: inspect the model the run "
                         "started from (finetune's --weights), or classify with keras-vit predict")
    parts = find_vit(model)
    pixels = np.stack([load_image(p, image_size(model, args.image_size)) for p in args.image])
    images = np.asarray(preprocess_input(pixels, mode=mode), dtype=np.float32)
    with warnings.catch_warnings():  # the hybrid note is printed below instead
        warnings.filterwarnings("ignore", message=".*no RGB embedding filters.*")
        paths = inspect_model(model, images, args.out, num_components=args.num_components, input_mode=mode)
    for key, path in paths.items():
        if path is None:
            print(f"{key}: not written ({model.name} is a hybrid: no RGB embedding filters)")
        else:
            print(f"{key}: {path}")
