"""Input scaling and ImageNet label decoding for the ViT checkpoints.

The official ViT models take RGB images scaled to [-1, 1] (``(x - 127.5) / 127.5``),
channels last. ``decode_predictions`` maps the outputs of a 1,000-class
(ImageNet-1k) or 21,843-class (Google's ImageNet-21k order) head to
``(synset, name, score)`` triples, using the class lists shipped in
``keras_vit/resources/`` (built by ``weights/tools/make_class_names.py``), and any
other head to the user's own class names (``class_names=``, or a model carrying them).
"""

import collections
import functools
import gzip
import importlib.resources

import numpy as np

from keras_vit.fileio import load_image  # noqa: F401  (public here too)
from keras_vit.configs import IMAGENET1K_CLASSES, IMAGENET21K_CLASSES

# Each source's input normalisation, (mean, std) per RGB channel of [0, 1] images: the official ViT
# and SigLIP take [-1, 1]; DeiT, DeiT III and DINOv2 ImageNet's statistics; CLIP its own (the
# pretrained configs of timm and Hugging Face).
NORMALIZATIONS = {
    "vit": ((0.5, 0.5, 0.5), (0.5, 0.5, 0.5)),
    "imagenet": ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225)),
    "clip": ((0.48145466, 0.4578275, 0.40821073), (0.26862954, 0.26130258, 0.27577711)),
}

_CLASS_FILES = {
    IMAGENET1K_CLASSES: "imagenet1k.txt",
    IMAGENET21K_CLASSES: "imagenet21k.txt.gz",
}


def _static_shape(x):
    """The shape of `x` as a tuple (None for unknown axes), or None if the rank is unknown."""
    try:
        return tuple(None if d is None else int(d) for d in x.shape)
    except (TypeError, ValueError):  # e.g. a TensorFlow tensor of unknown rank
        return None


def _check_image_shape(shape):
    if shape is None:
        return
    if len(shape) not in (3, 4):
        raise ValueError(
            "preprocess_input expects images of rank 3 (height, width, 3) or 4 "
            f"(batch, height, width, 3); got rank {len(shape)} with shape {shape}"
        )
    if shape[-1] is not None and shape[-1] != 3:
        raise ValueError(
            "preprocess_input expects 3 (RGB) channels on the last axis (channels_last); "
            f"got shape {shape}"
        )


def preprocess_input(x, mode="vit"):
    """Scales RGB images from [0, 255] as the weights' source did, in float32: by default to
    [-1, 1], ``(x - 127.5) / 127.5`` (the official ViT, SigLIP).

    Args:
        x: uint8 or float images with values in [0, 255], shape ``(H, W, 3)`` or
            ``(N, H, W, 3)``. A NumPy array (or nested list), a backend tensor, or a
            symbolic ``keras.KerasTensor``.
        mode: a key of `NORMALIZATIONS`: "vit" ([-1, 1]), "imagenet" (ImageNet's mean and std:
            DeiT, DeiT III, DINOv2) or "clip" (CLIP's mean and std):
            ``(x / 255 - mean) / std`` per channel.

    Returns:
        float32 values in [-1, 1], of the same kind as `x` (NumPy in, NumPy out;
        tensor in, tensor out). The input is not modified.

    Raises:
        ValueError: the rank is not 3 or 4, or the last axis is known and is not 3.
        TypeError: `x` is not one of those kinds, or does not hold numbers.
    """
    if mode not in NORMALIZATIONS:
        raise ValueError(f"unknown mode {mode!r}; expected one of {tuple(NORMALIZATIONS)}")
    mean, std = (np.asarray(v, np.float32) * np.float32(255) for v in NORMALIZATIONS[mode])
    if len(set(mean)) == len(set(std)) == 1:  # one scale for all channels: a symbolic input keeps its channel axis
        mean, std = mean[0], std[0]
    if isinstance(x, (np.ndarray, np.generic, list, tuple)):
        array = np.asarray(x)
        if array.dtype.kind not in "uif":
            raise TypeError(
                f"preprocess_input expects integer or float images, got dtype {array.dtype}"
            )
        _check_image_shape(array.shape)
        return (array.astype(np.float32) - mean) / std

    if not hasattr(x, "shape") or not hasattr(x, "dtype"):
        raise TypeError(
            "preprocess_input expects images as a NumPy array, a nested list of numbers, a backend tensor or "
            f"a keras.KerasTensor; got {type(x).__name__}"
        )
    import keras

    _check_image_shape(_static_shape(x))
    x = keras.ops.cast(x, "float32")
    return keras.ops.divide(keras.ops.subtract(x, mean), std)


def input_scaling(mode="vit"):
    """(scale, offset) per channel with `x * scale + offset == preprocess_input(x, mode)` for [0, 255]
    images: the arguments of a `keras.layers.Rescaling` that does the same inside a model."""
    if mode not in NORMALIZATIONS:
        raise ValueError(f"unknown mode {mode!r}; expected one of {tuple(NORMALIZATIONS)}")
    mean, std = (np.asarray(v, np.float64) for v in NORMALIZATIONS[mode])
    return [float(v) for v in 1 / (255 * std)], [float(v) for v in -mean / std]


def model_input(model, images, mode="vit"):
    """What `model` takes of [0, 255] `images` (N, h, w, 3), as NumPy: uint8 as they are for a model
    built with `input_dtype="uint8"` (it scales them itself), else `preprocess_input(images, mode)`."""
    if model.inputs[0].dtype == "uint8":
        return np.clip(np.round(images), 0, 255).astype(np.uint8)
    return preprocess_input(np.asarray(images), mode=mode)


@functools.lru_cache(maxsize=None)
def _class_list(classes):
    """((synset, name), ...) in label order for a 1000- or 21843-class head; read once."""
    resource = importlib.resources.files("keras_vit") / "resources" / _CLASS_FILES[classes]
    data = resource.read_bytes()
    if resource.name.endswith(".gz"):
        data = gzip.decompress(data)
    entries = []
    for line in data.decode("utf-8").splitlines():
        synset, _, name = line.partition("\t")
        entries.append((synset, name))
    if len(entries) != classes:
        raise RuntimeError(
            f"{resource} lists {len(entries)} classes, expected {classes}; the installed "
            "keras_vit package data is damaged (rebuild it with weights/tools/make_class_names.py)"
        )
    return tuple(entries)


def class_names(classes=IMAGENET1K_CLASSES):
    """The ``(synset, name)`` pairs of the 1000-class or 21843-class label order.

    Index ``i`` of the returned tuple describes output ``i`` of a head with that many
    classes: ImageNet-1k in the standard (sorted synset) order, or ImageNet-21k in the
    order of the official ``imagenet21k`` checkpoints.
    """
    if classes not in _CLASS_FILES:
        raise ValueError(
            f"class names are available for {IMAGENET1K_CLASSES} (ImageNet-1k) or "
            f"{IMAGENET21K_CLASSES} (ImageNet-21k) classes; got {classes!r}"
        )
    return _class_list(classes)


def check_class_names(names, classes, what):
    """`names` as a tuple of str, one per class of `what` (the head or predictions of `classes` classes,
    named in the message): a TypeError for anything but a sequence of str, a ValueError for repeated
    names or another count."""
    if isinstance(names, (str, bytes, dict)) or not hasattr(names, "__iter__"):
        raise TypeError(f"class names must be a sequence of str, one per class; got {type(names).__name__}")
    names = tuple(names)
    odd = [n for n in names if not isinstance(n, str)]
    if odd:
        raise TypeError(f"class names must be str; got {odd[0]!r} ({type(odd[0]).__name__})")
    repeated = sorted(n for n, count in collections.Counter(names).items() if count > 1)
    if repeated:
        raise ValueError(f"class names must be distinct; repeated: {', '.join(map(repr, repeated[:5]))}")
    if len(names) != classes:
        raise ValueError(f"{len(names)} class names given for {classes} classes ({what})")
    return tuple(str(n) for n in names)


def decode_predictions(preds, top=5, class_names=None):
    """The `top` classes of each prediction, as ``(synset, name, score)``, best first.

    Args:
        preds: scores of shape ``(batch, classes)`` (NumPy array or backend tensor). Without
            `class_names`, 1000 or 21843 classes pick the ImageNet-1k or the ImageNet-21k label list.
        top: how many classes to return per image (at most the number of classes).
        class_names: None, a sequence of names (one str per class, distinct), or a model carrying
            them (`model.class_names`, see `keras_vit.vit_model.ViTModel`; a model without them counts
            as None). With names, each row is ``(str(index), name, score)``.

    Returns:
        A list with one list per image of ``(synset, name, score)`` tuples sorted by
        decreasing score (ties keep the lower class index first).

    Raises:
        ValueError: `preds` is not 2-D; without class names, it has neither 1000 nor 21843 columns;
            the class names are not one per column; or `top` < 1.
    """
    if not isinstance(preds, np.ndarray):
        import keras

        preds = keras.ops.convert_to_numpy(preds)
    preds = np.asarray(preds)
    if hasattr(class_names, "output_shape"):  # a model: the names it carries
        class_names = getattr(class_names, "class_names", None)
    if preds.ndim != 2 or (class_names is None and preds.shape[-1] not in _CLASS_FILES):
        raise ValueError(
            "decode_predictions expects a batch of predictions of shape (batch, "
            f"{IMAGENET1K_CLASSES}) or (batch, {IMAGENET21K_CLASSES}), or (batch, classes) with class_names "
            f"(one name per class); got shape {preds.shape}"
        )
    if isinstance(top, bool) or not isinstance(top, (int, np.integer)) or top < 1:
        raise ValueError(f"top must be a positive integer, got {top!r}")
    if class_names is None:
        names = _class_list(preds.shape[-1])
    else:
        given = check_class_names(class_names, preds.shape[-1], f"preds of shape {preds.shape}")
        names = tuple((str(i), name) for i, name in enumerate(given))
    top = min(int(top), preds.shape[-1])
    order = np.argsort(-preds.astype(np.float64), axis=-1, kind="stable")[:, :top]
    return [
        [(*names[i], float(row[i])) for i in indices]
        for row, indices in zip(preds, order)
    ]


__all__ = ["class_names", "decode_predictions", "load_image", "model_input", "preprocess_input"]
