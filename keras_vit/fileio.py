"""Files in and out: every write is atomic (a temporary file beside the target, then a rename), so
an interrupted or failed write never leaves a half-written file where a good one is expected."""

import contextlib
import json
import os
import pathlib
import tempfile

import numpy as np

from keras_vit.configs import pair


@contextlib.contextmanager
def atomic_write(path, suffix=None):
    """Yields a temporary path in `path`'s folder; moves it onto `path` when the block succeeds and
    removes it when the block fails.

    The temporary name keeps `path`'s extensions (or `suffix`), for writers that check them
    (Keras' `.weights.h5`, numpy's `.npz`). The file gets the usual permissions (0666 less umask).
    """
    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    suffix = "".join(pathlib.Path(path).suffixes) if suffix is None else suffix
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{os.path.basename(path)}.", suffix=".tmp" + suffix)
    os.close(fd)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)
    try:
        yield tmp
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise


def load_image(path, image_size):
    """Reads an image file as RGB resized (bicubic) to `image_size` (int or (h, w)): float32 in [0, 255]."""
    from PIL import Image, UnidentifiedImageError

    h, w = pair(image_size, "image_size")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"image file not found: {path}")
    try:
        with Image.open(path) as img:
            return np.asarray(img.convert("RGB").resize((w, h), Image.Resampling.BICUBIC), dtype=np.float32)
    except (UnidentifiedImageError, OSError) as err:
        raise ValueError(f"cannot read {path} as an image: {err}") from None


def write_json(path, obj):
    """Writes `obj` as indented JSON, atomically (numpy scalars as numbers)."""
    with atomic_write(path) as tmp, open(tmp, "w") as f:
        json.dump(obj, f, indent=2, default=float)
        f.write("\n")
