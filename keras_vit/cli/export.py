"""`keras-vit export`: a model as a serving artefact (SavedModel, ONNX, LiteRT; the writing is
`keras_vit.export`), then the artefact run in its own runtime and checked against Keras on random images
(on random NaFlex sequences for a NaFlex model)."""

import os

from keras_vit.calls import is_naflex
from keras_vit.cli.model_args import DEFAULT_WEIGHTS_HELP, MODEL_HELP, WEIGHTS_HELP, build, image_size
from keras_vit.fileio import check_writable


def add_parser(sub, modes):
    """`keras-vit export`'s arguments, a parser of the sub-parsers `sub`; modes: the --input-mode choices."""
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
    p.set_defaults(func=run)


def run(args):
    """`keras-vit export` of the parsed arguments `args`: writes the artefact, then checks it against Keras
    at the model's size (and, for an artefact that takes other sizes, at one or two more)."""
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
    check_writable(args.out, "--out", folder=True)  # refused before the model is built
    model, mode = build(args)
    if is_naflex(model):
        return _export_naflex(args, model)
    mode = args.input_mode or mode
    size = image_size(model, args.image_size)
    sizes = [size]
    if args.resize_to is not None:  # checked on images of other sizes, resized inside
        sizes = [(size[0] * 3 // 2 + 1, size[1] * 2 // 3 + 1), (size[0] * 2, size[1] * 2)]
    elif takes_any_size(model):  # checked at its own size and at one as wide again
        parts = find_vit(model)
        stride = parts.stride
        if parts.crop is None and (size[0] % stride or size[1] % stride):  # a model that crops takes any size
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


def _size(path):
    """Bytes of a file, or of the files under a folder."""
    if os.path.isfile(path):
        return os.path.getsize(path)
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(path) for f in files)


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
