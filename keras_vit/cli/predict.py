"""`keras-vit predict`: classify image files, or every image of folders, print each one's top classes
and optionally write them as a CSV; its arguments and the reading of an image into what the model takes
(resized pixels, or a NaFlex model's patches)."""

import os
import sys

from keras_vit.calls import is_naflex
from keras_vit.cli.model_args import DEFAULT_WEIGHTS_HELP, MODEL_HELP, WEIGHTS_HELP, build, image_size
from keras_vit.data.folder import IMAGE_EXTENSIONS, image_files  # what predict reads of a folder, as finetune does
from keras_vit.fileio import check_writable


def add_parser(sub, modes):
    """`keras-vit predict`'s arguments, a parser of the sub-parsers `sub`; modes: the --input-mode choices."""
    p = sub.add_parser("predict", help="classify images (files, or folders of them) and print the top classes",
                       description="Classify images and print each one's top classes: the model's own class names "
                       "(model.class_names, kept in a .keras file), else ImageNet's for a 1000- or 21843-class "
                       "head, else 'class i'.")
    p.add_argument("images", nargs="+", metavar="IMAGE",
                   help=f"image files, or folders: every image file under one ({' '.join(IMAGE_EXTENSIONS)}, any "
                   "case), recursively, sorted")
    p.add_argument("--model", default=None, help=MODEL_HELP)
    p.add_argument("--weights", default=None, help=f"{WEIGHTS_HELP}; {DEFAULT_WEIGHTS_HELP}")
    p.add_argument("--image-size", type=int, default=None,
                   help="input size; default: the weights' resolution (with a .keras file: only for a model "
                   "saved for any size)")
    p.add_argument("--top", type=int, default=5, help="classes printed per image (default 5)")
    p.add_argument("--batch-size", type=int, default=8, help="images loaded and run at a time (default 8)")
    p.add_argument("--csv", default=None, metavar="PATH",
                   help="also write the results as a CSV: file,class_1,score_1,...,class_k,score_k (k = --top)")
    p.add_argument("--input-mode", default=None, choices=modes,
                   help="the input scaling the weights were trained with (keras_vit.preprocess_input's modes); "
                   "default: the timm file's / Hugging Face folder's, else vit. A model built with "
                   "input_dtype='uint8' is fed uint8 images and scales them itself")
    p.add_argument("--naflex-tokens", type=int, default=None, metavar="N",
                   help="a NaFlex model (finetune --naflex): each image at its own aspect ratio, resized to fit N "
                   "patches; default: the budget the model was trained with")
    p.set_defaults(func=run)


def run(args):
    """`keras-vit predict` of the parsed arguments `args`: prints each image's top classes (a folder's
    unreadable files are skipped and counted, a file named unreadable fails the command)."""
    from keras_vit.export import CLASS_OUTPUTS, output_name
    from keras_vit.preprocessing import decode_predictions

    for flag, value in (("--top", args.top), ("--batch-size", args.batch_size), ("--naflex-tokens", args.naflex_tokens)):
        if value is not None and value < 1:
            raise ValueError(f"{flag} must be a positive number, got {value}")
    if args.csv is not None:  # a place the CSV cannot go: refused before a model is built or an image read
        check_writable(args.csv)
    files = _image_files(args.images)
    model, mode = build(args)
    mode = args.input_mode or mode
    kind = output_name(model)
    if kind not in CLASS_OUTPUTS:
        raise ValueError(f"model {model.name!r} outputs {kind} ({model.output_shape[-1]} dimensions), not classes: "
                         "it has none to print. Use it as a feature extractor from Python "
                         "(keras_vit.from_huggingface / from_timm), or export it (keras-vit export)")
    classes = model.output_shape[-1]
    # the model's own names, else ImageNet's for a 1000- or 21843-class head, else the indices
    names = getattr(model, "class_names", None) or (
        None if classes in (1000, 21843) else tuple(f"class {i}" for i in range(classes)))
    read, model_batch = _reader(model, args, mode)
    table, skipped, given = [], 0, set(args.images)
    for start in range(0, len(files), args.batch_size):  # a batch of images in memory at a time
        batch, pixels = [], []
        for path in files[start:start + args.batch_size]:
            try:
                pixels.append(read(path))
                batch.append(path)
            except ValueError as err:
                if path in given:  # a file asked for by name: the command fails on it
                    raise
                print(f"skipped {err}", file=sys.stderr)  # one of a folder's: the others go on
                skipped += 1
        if not batch:
            continue
        probs = model.predict_on_batch(model_batch(pixels))
        for path, rows in zip(batch, decode_predictions(probs, top=args.top, class_names=names)):
            print(path)
            for rank, (index, name, score) in enumerate(rows, 1):
                print(f"  {rank}. {score:7.2%}  {name}  ({index})")
            table.append((path, rows))
    if skipped:
        print(f"{skipped} file(s) of the folders given could not be read as images and were skipped", file=sys.stderr)
    if args.csv is not None:
        _write_csv(args.csv, table)
        print(f"wrote {args.csv}")


def _image_files(paths):
    """The image files `predict` reads, in order: each file given, and every image file under each
    folder given (recursively, sorted; hidden files and other suffixes than IMAGE_EXTENSIONS are skipped).
    FileNotFoundError for a path that is neither, ValueError for a folder without images."""
    files = []
    for path in paths:
        if os.path.isdir(path):
            found = [os.path.join(path, f) for f in image_files(path)]
            if not found:
                raise ValueError(f"the folder {path} holds no image files ({', '.join(IMAGE_EXTENSIONS)}), "
                                 "in it or in folders under it")
            files += found
        elif os.path.isfile(path):
            files.append(path)
        else:
            raise FileNotFoundError(f"image file not found: {path}")
    return files


def _write_csv(path, rows):
    """`rows` of (file, [(index, name, score), ...]) as a CSV with the header
    file,class_1,score_1,...,class_k,score_k, written atomically."""
    import csv

    from keras_vit.fileio import atomic_write

    k = max(len(top) for _, top in rows)
    with atomic_write(path) as tmp, open(tmp, "w", newline="", encoding="utf-8") as f:
        out = csv.writer(f)
        out.writerow(["file", *(f"{what}_{i}" for i in range(1, k + 1) for what in ("class", "score"))])
        out.writerows([file, *(v for _, name, score in top for v in (name, f"{score:.8g}"))] for file, top in rows)


def _reader(model, args, mode):
    """(read a file into what one image gives the model, stack those into the model's batch) for `predict`:
    an image resized to the model's size, or for a NaFlex model the image at its own aspect ratio cut into
    the patches of --naflex-tokens (default: the budget the model was trained with, `naflex_tokens`)."""
    import numpy as np

    from keras_vit.preprocessing import load_image, model_input

    if not is_naflex(model):
        if args.naflex_tokens is not None:
            raise ValueError(f"--naflex-tokens is for a NaFlex model; model {model.name!r} takes images")
        size = image_size(model, args.image_size)
        return (lambda path: load_image(path, size)), (lambda pixels: model_input(model, np.stack(pixels), mode))
    from keras_vit.data.folder import read_image
    from keras_vit.data.naflex_feed import patchify
    from keras_vit.structure import find_vit

    if args.image_size is not None:
        raise ValueError(f"--image-size is not used with a NaFlex model (model {model.name!r}): each image keeps "
                         "its aspect ratio and is resized to fit --naflex-tokens patches")
    tokens = args.naflex_tokens or getattr(model, "naflex_tokens", None)
    if tokens is None:
        raise ValueError(f"model {model.name!r} is a NaFlex model that records no token budget (naflex_tokens); "
                         "pass --naflex-tokens N, the patches each image is cut into at most (e.g. 256)")
    p, dtype = find_vit(model).embedding.patch_size, next(t.dtype for t in model.inputs if t.name == "patches")

    def read(path):
        return patchify(read_image(path), p, tokens, tokens, mode=mode, image_dtype=dtype)

    return read, lambda sequences: {k: np.stack([s[k] for s in sequences]) for k in sequences[0]}
