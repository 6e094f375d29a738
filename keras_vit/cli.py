"""The `keras-vit` command: `predict`, `list`, `inspect`, `convert`, `export`, `finetune`.

`--weights X.keras` is the whole model the file holds (`model.save`, `keras-vit convert`): any
keras-vit model, any head, its class names (`model.class_names`) printed by `predict`.

`import keras_vit` imports Keras and its backend, so every command starts with it; the commands
that run a model keep the backend's later log lines (XLA, CUDA, absl) off the terminal unless
`--verbose`.
"""

import argparse
import contextlib
import logging
import os
import sys

from keras_vit.calls import is_naflex
from keras_vit.configs import VARIANTS, get_variant, none_or
from keras_vit.extras import FEATURES, MissingPackageError, require
from keras_vit.image_folder import IMAGE_EXTENSIONS, image_files  # what predict reads of a folder, as finetune does

# Ctrl-C: what every command says and its exit status (128 + SIGINT, as a shell's); a command that kept
# something to continue from says that instead (the KeyboardInterrupt's message)
INTERRUPTED = "no file was left half-written (each is written whole, then moved into place)"
INTERRUPTED_STATUS = 130
# The commands that build a model (their later backend logs are kept off the terminal).
MODEL_COMMANDS = ("predict", "inspect", "export", "finetune")
# `--weights` when not given: the variant's ImageNet-1k fine-tuned release, in this order of
# preference, else the variant's first release (an ImageNet-21k one: every variant has one)
DEFAULT_TAGS = ("imagenet21k+imagenet2012", "augreg-imagenet21k+imagenet2012")
MODEL_HELP = ("variant factory name, e.g. ViT_B16 or R50_ViT_B16; default: what a timm file or Hugging Face folder "
              "in --weights holds (given, it must agree with the file), else ViT_B16")
DEFAULT_WEIGHTS_HELP = (f"default: the variant's ImageNet-1k fine-tuned release ({', else '.join(DEFAULT_TAGS)}), "
                        "else its ImageNet-21k one")
WEIGHTS_HELP = ("registry tag, a path (.npz, .weights.h5, timm file, Hugging Face folder), or a .keras file: the whole "
                "model it holds (model.save, keras-vit convert; no --model then)")


@contextlib.contextmanager
def quiet_backend():
    """TensorFlow, XLA and CUDA log from C++ straight to file descriptor 2 (absl's early messages ignore
    TF_CPP_MIN_LOG_LEVEL): while a command runs, descriptor 2 goes to /dev/null and Python's
    `sys.stderr` to a copy of the terminal, so our own messages and Python warnings still show."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    for name in ("absl", "tensorflow", "jax"):
        logging.getLogger(name).setLevel(logging.ERROR)
    if sys.stderr is not sys.__stderr__:  # already redirected (e.g. captured by a test runner)
        yield
        return
    sys.stderr.flush()
    terminal = os.dup(2)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)
    os.close(devnull)
    sys.stderr = os.fdopen(os.dup(terminal), "w", buffering=1)
    try:
        yield
    finally:
        sys.stderr.close()
        sys.stderr = sys.__stderr__
        os.dup2(terminal, 2)
        os.close(terminal)


def default_weights(variant):
    """The registry tag `--weights` takes for `variant` when not given (see DEFAULT_TAGS)."""
    from keras_vit.weights.registry import default_tag

    return default_tag(get_variant(variant).name, DEFAULT_TAGS)


def _build(args):
    """(model, preprocess_input mode) of the command's --model / --weights: a .keras file is the whole
    model it holds (mode "vit"), a timm file or a Hugging Face folder builds what the file holds
    (with --model, the file must be that variant), anything else the variant's factory (--model,
    default ViT_B16)."""
    import keras_vit
    from keras_vit.weights.foreign import is_foreign, read

    size = getattr(args, "image_size", None)
    if size is not None and size < 1:
        raise ValueError(f"--image-size must be a positive number of pixels, got {size}")
    any_size = getattr(args, "any_size", False)
    if args.weights is not None and args.weights.endswith(".keras"):
        model = _saved_model(args.weights, args.model, None if any_size else size)
        return (keras_vit.any_size(model) if any_size else model), "vit"
    # --any-size: images of any height and width, the position embeddings laid out for the weights' own size
    # (--image-size is then the size the command checks the model at)
    shape = {"input_shape": (None, None, 3)} if any_size else {"image_size": size} if size is not None else {}
    if args.weights is not None and is_foreign(args.weights) and os.path.exists(args.weights):
        from keras_vit.convert import build_from

        file = read(args.weights)  # once, for the model and its input mode
        return build_from(file, args.model, **shape), file.arch["input_mode"]
    name = get_variant(args.model or "ViT_B16").name
    weights = none_or(default_weights(name) if args.weights is None else args.weights)
    return getattr(keras_vit, name)(weights=weights, **shape), "vit"


def _saved_model(path, variant, size):
    """The whole model of the .keras file `path`, which takes no --model and, unless the model takes
    any size, no --image-size."""
    from keras_vit.weights.keras_files import load_keras_model

    if variant is not None:
        raise ValueError(f"{path} is a whole model (a .keras file); --model is not used with it (got --model {variant})")
    model = load_keras_model(path)
    if is_naflex(model):  # takes patches: predict says what it does with --image-size
        return model
    h, w = model.input_shape[1:3]
    if size is not None and None not in (h, w):
        raise ValueError(f"--image-size {size}: the model in {path} takes {h}x{w} images only (a model takes "
                         "--image-size when it was saved for any size, input shape (None, None, 3))")
    return model


def _image_size(model, size):
    """(h, w) of the images the command feeds `model`: its input's, else --image-size `size`, else the
    size its position embeddings are laid out for (a model that takes any size)."""
    from keras_vit.structure import find_vit

    h, w = model.input_shape[1:3]
    if None not in (h, w):
        return h, w
    if size is not None:
        return size, size
    return find_vit(model).image_size


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
        size = _image_size(model, args.image_size)
        return (lambda path: load_image(path, size)), (lambda pixels: model_input(model, np.stack(pixels), mode))
    from keras_vit.image_folder import read_image
    from keras_vit.naflex_feed import patchify
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


def _predict(args):
    from keras_vit.export import CLASS_OUTPUTS, output_name
    from keras_vit.preprocessing import decode_predictions

    for flag, value in (("--top", args.top), ("--batch-size", args.batch_size), ("--naflex-tokens", args.naflex_tokens)):
        if value is not None and value < 1:
            raise ValueError(f"{flag} must be a positive number, got {value}")
    files = _image_files(args.images)
    model, mode = _build(args)
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


def _list(args):
    from keras_vit.weights.registry import format_table

    print("Variants (factory, official name, patch, hidden, MLP, heads, layers, ResNet stem):")
    for c in VARIANTS.values():
        stem = "-" if c.resnet is None else str(c.resnet)
        print(f"  {c.name:12s} {c.checkpoint:14s} {c.patch_size:>3d} {c.hidden_size:>5d} {c.mlp_dim:>5d} "
              f"{c.num_heads:>3d} {c.num_layers:>3d}  {stem}")
    print("\nReleased weights (weights=TAG):")
    print(format_table(args.variant))


def _inspect(args):
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
    model, mode = _build(args)
    if is_naflex(model):
        raise ValueError(f"--weights {args.weights}: model {model.name!r} is a NaFlex model (it takes patches, not "
                         "images); inspect draws the maps of a model that takes images: inspect the model the run "
                         "started from (finetune's --weights), or classify with keras-vit predict")
    parts = find_vit(model)
    pixels = np.stack([load_image(p, _image_size(model, args.image_size)) for p in args.image])
    images = np.asarray(preprocess_input(pixels, mode=mode), dtype=np.float32)
    with warnings.catch_warnings():  # the hybrid note is printed below instead
        warnings.filterwarnings("ignore", message=".*no RGB embedding filters.*")
        paths = inspect_model(model, images, args.out, num_components=args.num_components, input_mode=mode)
    for key, path in paths.items():
        if path is None:
            print(f"{key}: not written ({model.name} is a hybrid: no RGB embedding filters)")
        else:
            print(f"{key}: {path}")


def _convert(args):
    from keras_vit.convert import convert

    size = args.image_size and (args.image_size[0] if len(args.image_size) == 1 else tuple(args.image_size))
    out = convert(args.source, args.out, args.model, args.num_heads, size)
    print(f"wrote {out}")


def _size(path):
    """Bytes of a file, or of the files under a folder."""
    if os.path.isfile(path):
        return os.path.getsize(path)
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(path) for f in files)


def _export(args):
    import keras
    import numpy as np

    from keras_vit.export import (CLASS_OUTPUTS, calibration_images, check_format, compare, export, output_name,
                                  takes_any_size)
    from keras_vit.structure import find_vit

    any_size = args.any_size or args.resize_to is not None
    check_format(keras.backend.backend(), args.format, args.quantize, args.batch_size, any_size)  # before building
    if args.calibration is not None and args.quantize is None:
        raise ValueError("--calibration is for --quantize int8 (static quantization)")
    if os.path.exists(args.out):
        raise FileExistsError(f"{args.out} already exists; export writes a new folder (remove it or pick another)")
    model, mode = _build(args)
    if is_naflex(model):
        return _export_naflex(args, model)
    mode = args.input_mode or mode
    size = _image_size(model, args.image_size)
    sizes = [size]
    if args.resize_to is not None:  # checked on images of other sizes, resized inside
        sizes = [(size[0] * 3 // 2 + 1, size[1] * 2 // 3 + 1), (size[0] * 2, size[1] * 2)]
    elif takes_any_size(model):  # checked at its own size and at one as wide again
        stride = find_vit(model).stride
        if size[0] % stride or size[1] % stride:
            raise ValueError(f"--image-size {args.image_size}: the model cuts images into {stride}-pixel tokens; "
                             f"expected a multiple of {stride}, e.g. {max(1, round(size[0] / stride)) * stride}")
        sizes.append((size[0], 2 * size[1]))
    calibration = None if args.calibration is None else calibration_images(args.calibration, size)
    path = export(model, args.out, args.format, args.top_k, args.batch_size, args.quantize, calibration, mode,
                  args.resize_to)
    print(f"wrote {path} ({_size(path) / 2**20:.1f} MiB)")
    batch = args.batch_size or 2
    runtime = {"tf_saved_model": "TensorFlow", "onnx": "onnxruntime", "litert": "the LiteRT interpreter"}
    name = output_name(model)
    for h, w in sizes:
        images = np.random.default_rng(0).integers(0, 256, (batch, h, w, 3), dtype=np.uint8)
        error, agreement = compare(model, path, args.format, images, mode, args.resize_to)
        same = f"top-1 agreement {agreement:.0%}" if name in CLASS_OUTPUTS else f"cosine similarity >= {agreement:.6f}"
        print(f"checked in {runtime[args.format]} against Keras on {batch} random {h}x{w} images: output {name!r}, "
              f"max |difference| {error:.1e}, {same}")


def _export_naflex(args, model):
    """`keras-vit export` of a NaFlex model (`finetune --naflex`'s model.keras): the artefact takes the NaFlex
    dict; checked on a batch of two random images of two shapes, cut into the model's patches and padded."""
    import numpy as np

    from keras_vit.export import compare, export
    from keras_vit.naflex import patchify_images
    from keras_vit.structure import find_vit

    path = export(model, args.out, args.format, args.top_k, args.batch_size, args.quantize)
    print(f"wrote {path} ({_size(path) / 2**20:.1f} MiB)")
    p, dtype = find_vit(model).embedding.patch_size, next(t.dtype for t in model.inputs if t.name == "patches")
    rng = np.random.default_rng(0)
    sequences = []
    for h, w in (((3, 5), (4, 4))[i % 2] for i in range(args.batch_size or 2)):
        image = rng.integers(0, 256, (1, h * p, w * p, 3)) if dtype == "uint8" else rng.uniform(-1, 1, (1, h * p, w * p, 3))
        sequences.append({k: v[0] for k, v in patchify_images(image.astype(dtype), p).items()})
    n = max(len(s["patches"]) for s in sequences)
    batch = {k: np.stack([np.concatenate([s[k], np.zeros((n - len(s[k]), *s[k].shape[1:]), s[k].dtype)])
                          for s in sequences]) for k in sequences[0]}
    error, agreement = compare(model, path, args.format, batch)
    print(f"checked against Keras on {len(sequences)} random NaFlex sequences (grids 3x5 and 4x4, padded to {n}): "
          f"max |difference| {error:.1e}, agreement {agreement:.6g}")


def parser():
    """The argument parser of `keras-vit` (every sub-command)."""
    top = argparse.ArgumentParser(prog="keras-vit", description="Vision Transformer model zoo for Keras 3.")
    top.add_argument("--verbose", action="store_true",
                     help="show the backend's log messages (TensorFlow, XLA, CUDA), hidden by default")
    sub = top.add_subparsers(dest="command", required=True)

    from keras_vit.preprocessing import NORMALIZATIONS

    modes = tuple(NORMALIZATIONS)
    _add_predict_parser(sub, modes)
    _add_list_parser(sub)
    _add_inspect_parser(sub)
    _add_convert_parser(sub)
    _add_export_parser(sub, modes)
    from keras_vit.recipes import own_images

    own_images.add_parser(sub)
    return top


def _add_predict_parser(sub, modes):
    """`keras-vit predict`'s arguments; modes: the --input-mode choices."""
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
    p.set_defaults(func=_predict)


def _add_list_parser(sub):
    """`keras-vit list`'s arguments."""
    p = sub.add_parser("list", help="list the variants and the registered released weights")
    p.add_argument("--variant", default=None, help="only this variant's weights")
    p.set_defaults(func=_list)


def _add_inspect_parser(sub):
    """`keras-vit inspect`'s arguments."""
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
    p.set_defaults(func=_inspect)


def _add_convert_parser(sub):
    """`keras-vit convert`'s arguments."""
    p = sub.add_parser("convert", help="a timm .safetensors/.pth/.bin file, a Hugging Face folder or a keras-hub "
                       "preset folder of a ViT, DeiT, DINOv2, CLIP or SigLIP image tower -> .keras")
    p.add_argument("source", help="timm state dict file, a Hugging Face folder (config.json + model.safetensors), "
                   "a keras-hub preset folder (config.json + model.weights.h5, as save_to_preset writes it), "
                   "or a timm model name in the Hugging Face hub cache (e.g. vit_small_patch14_dinov2.lvd142m)")
    p.add_argument("out", help="output .keras file")
    p.add_argument("--model", default=None, help="variant factory name (timm files do not record the head count)")
    p.add_argument("--num-heads", type=int, default=None, help="head count of a timm file whose width is no "
                   "timm ViT's (default: the variant's, else timm's for the width)")
    p.add_argument("--image-size", type=int, nargs="+", default=None, help="input size (h [w]); default: the file's")
    p.set_defaults(func=_convert)


def _add_export_parser(sub, modes):
    """`keras-vit export`'s arguments; modes: the --input-mode choices."""
    from keras_vit.export import FORMATS, QUANTIZATIONS, THROUGH_TENSORFLOW

    through = "; ".join(f"{f} from {b}" for b, f in THROUGH_TENSORFLOW)
    p = sub.add_parser("export", help="export a model for serving (uint8 images in, probabilities or embeddings out)",
                       description="Export a model for serving: uint8 images of any batch size in, what the model "
                       "outputs out, named in the signature (probabilities of a classifier, embeddings of a "
                       f"projection, features of a backbone). Every KERAS_BACKEND writes every format: {', '.join(FORMATS)}. These are written from "
                       f"the TensorFlow backend in a separate process (tensorflow must be installed): {through} "
                       "(litert from torch at a --batch-size through litert-torch where it is installed).")
    p.add_argument("--model", default=None, help=MODEL_HELP)
    p.add_argument("--weights", default=None, help=f"{WEIGHTS_HELP}; {DEFAULT_WEIGHTS_HELP}")
    p.add_argument("--image-size", type=int, default=None,
                   help="input size; default: the weights' resolution (with a .keras file: only for a model "
                   "saved for any size, the size it is checked at)")
    p.add_argument("--any-size", action="store_true",
                   help="an artefact that takes images of any height and width divisible by the patch (times a "
                   "hybrid's stride), the position embeddings resized inside it by the weights' own rule "
                   "(--image-size: the size it is checked at)")
    p.add_argument("--resize-to", type=int, default=None, metavar="N",
                   help="an artefact that takes images of any size and resizes them to NxN inside (bicubic, "
                   "antialiased), N the model's size (or, with --any-size, any multiple of its token size)")
    p.add_argument("--format", required=True, help=f"{', '.join(FORMATS)} (which ones: see above)")
    p.add_argument("--out", required=True, help="output folder (must not exist)")
    p.add_argument("--top-k", type=int, default=None, help="also output the k best classes and their scores")
    p.add_argument("--batch-size", type=int, default=None,
                   help="fix the batch size (default: any)")
    p.add_argument("--quantize", default=None, choices=QUANTIZATIONS,
                   help="onnx only: quantize with onnxruntime (dynamic int8, or static with --calibration)")
    p.add_argument("--input-mode", default=None, choices=modes,
                   help="the input scaling done inside the artefact (keras_vit.preprocess_input's modes); default: "
                   "the timm file's / Hugging Face folder's (DeiT, DINOv2: imagenet; CLIP: clip), else vit")
    p.add_argument("--calibration", default=None, metavar="DIR",
                   help="folder of a few hundred images whose activation ranges fix a static int8 quantization")
    p.set_defaults(func=_export)


def main(argv=None):
    """`keras-vit ARGV` (default sys.argv[1:]); returns the exit status: 0, 1 when an optional package the
    command needs is not installed (one line naming it and its extra, before anything is built), 2 for
    another error (one line)."""
    args = parser().parse_args(argv)
    quiet = args.command in MODEL_COMMANDS and not args.verbose
    try:
        runtime = f"running {getattr(args, 'format', None)} artefacts"
        if args.command == "export" and runtime in FEATURES:  # export runs the artefact it writes
            require(runtime)
        with quiet_backend() if quiet else contextlib.nullcontext():
            args.func(args)
    except MissingPackageError as err:
        print(f"keras-vit {args.command}: error: {err}", file=sys.stderr)
        return 1
    except (ValueError, FileNotFoundError, OSError) as err:
        print(f"keras-vit {args.command}: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as err:  # Ctrl-C: one line, what was kept, a shell's exit status
        print(f"keras-vit {args.command}: interrupted: {err or INTERRUPTED}", file=sys.stderr)
        return INTERRUPTED_STATUS
    return 0


if __name__ == "__main__":
    sys.exit(main())
