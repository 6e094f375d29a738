"""`write_shards`: a folder of one's own images as WebDataset-style tar shards (`keras_vit.data.shards`),
which `keras_vit.data.shard_feed.from_shards` streams.

    from keras_vit.data.shard_writer import write_shards
    pattern = write_shards("photos", "shards/train-%06d.tar", shard_size=1000)  # -> "shards/train-{000000..000012}.tar"

Each shard is written to a temporary file and renamed when whole (`keras_vit.fileio.atomic_write`): a writer
that is killed leaves no half shard under a shard's name. The info file is written last.
"""

import io
import os
import re
import tarfile

import numpy as np

from keras_vit.data.folder import PILLOW, TF_JPEG, ImageFolder, read_image, scan
from keras_vit.data.shards import SHARD_NAME, info_path
from keras_vit.data.stream import positive_int
from keras_vit.fileio import atomic_write, write_json

PARTS = ("train", "validation", "all")

# the generator of the examples' order across shards: [seed, WRITE_STREAM]
WRITE_STREAM = 0x5A4D

# the %d of a shard pattern (webdataset's ShardWriter's form: "shards/train-%06d.tar")
NUMBER = re.compile(r"%0?(\d*)d")


def _member(tar, name, data):
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = len(data), 0o644, 0
    tar.addfile(info, io.BytesIO(data))


def _encoded(root, record):
    """(extension, bytes) of a record's image as a shard holds it: a plain JPEG or PNG as it is, any other
    image (EXIF-rotated, CMYK, 16-bit, WebP ...) as a PNG of its upright RGB pixels."""
    from PIL import Image

    path, _, _, _, decoder = record
    full = os.path.join(root, path)
    if decoder != PILLOW:
        with open(full, "rb") as f:
            return (".jpg" if decoder == TF_JPEG else ".png"), f.read()
    out = io.BytesIO()
    Image.fromarray(read_image(full)).save(out, format="PNG")
    return ".png", out.getvalue()


def _check_pattern(out_pattern):
    out_pattern = os.fspath(out_pattern)
    numbers = NUMBER.findall(out_pattern)
    if len(numbers) != 1 or not SHARD_NAME.match(os.path.basename(out_pattern % 0)):
        raise ValueError(f"out_pattern must name the shards with one %d before .tar, e.g. "
                         f"'shards/train-%06d.tar'; got {out_pattern!r}")
    return out_pattern


def _records(folder, part, seed, verify):
    if not isinstance(folder, ImageFolder):
        folder = scan(folder, validation_split=0, seed=seed, verify=verify)
    if part not in PARTS:
        raise ValueError(f"part must be one of {', '.join(PARTS)}; got {part!r}")
    records = {"train": folder.train, "validation": folder.validation,
               "all": folder.train + folder.validation}[part]
    if not records:
        raise ValueError(f"the {part} part of {folder.root!r} holds no image")
    return folder, records


def write_shards(folder, out_pattern, shard_size=1000, seed=0, *, part="train", verify="full"):
    """Writes the images of a folder as tar shards of `shard_size` samples, in a seeded shuffle across them,
    and the info file beside them (class names; each shard's samples, bytes and samples of each class: what
    a reader needs to know a pass's length and the classes' sizes without reading the shards).

    A sample is ``<key>.jpg`` or ``<key>.png`` and ``<key>.cls`` (the class index as text); keys are
    numbers. Plain JPEGs and PNGs are copied as they are; any other image (EXIF-rotated, CMYK, 16-bit,
    WebP ...) is stored as a PNG of its upright RGB pixels, which every decoder reads the same. Shards of an
    earlier write of the same pattern beyond the new count are removed.

    Args:
        folder: a folder of class subfolders (scanned with no validation split: every image goes), or an
            ``ImageFolder`` (``keras_vit.data.folder.scan``) whose `part` goes.
        out_pattern: the shards' path with one ``%d`` (``shards/train-%06d.tar``).
        shard_size: samples a shard.
        seed: the seed of the examples' order across the shards (and of the folder's scan).
        part: of an ``ImageFolder``: "train", "validation" or "all".
        verify: how a folder is scanned, "full" or "header" (see ``scan``).

    Returns:
        The shards as a brace pattern (``shards/train-{000000..000012}.tar``) for ``from_shards``.

    Raises:
        ValueError: a bad pattern, part or shard size, or what ``scan`` refuses.
    """
    out_pattern = _check_pattern(out_pattern)
    shard_size = positive_int("shard_size", shard_size)
    folder, records = _records(folder, part, seed, verify)
    order = np.random.default_rng([seed, WRITE_STREAM]).permutation(len(records))
    count = -(-len(records) // shard_size)
    info = info_path(out_pattern % 0)
    if os.path.exists(info):  # shards half rewritten must not pass for the earlier write's
        os.remove(info)
    table = {}
    for number in range(count):
        path, mine = out_pattern % number, order[number * shard_size:(number + 1) * shard_size].tolist()
        with atomic_write(path) as tmp, tarfile.open(tmp, "w") as tar:
            for i in mine:
                extension, data = _encoded(folder.root, records[i])
                _member(tar, f"{i:09d}{extension}", data)
                _member(tar, f"{i:09d}.cls", str(records[i][1]).encode())
        labels = np.bincount([records[i][1] for i in mine], minlength=len(folder.class_names))
        table[os.path.basename(path)] = {"samples": len(mine), "bytes": os.path.getsize(path),
                                         "class_counts": labels.tolist()}
    write_json(info, {"class_names": list(folder.class_names), "shards": table,
                      "seed": seed, "source": os.path.abspath(folder.root)})
    _remove_stale(out_pattern, count)
    first, last = (SHARD_NAME.match(os.path.basename(out_pattern % n)) for n in (0, count - 1))
    stem = os.path.join(os.path.dirname(out_pattern), last["stem"])
    return f"{stem}{{{first['number']}..{last['number']}}}.tar" if count > 1 else out_pattern % 0


def _remove_stale(out_pattern, count):
    """Removes the shards of an earlier write of `out_pattern` numbered `count` and up."""
    folder = os.path.dirname(out_pattern) or "."
    head, tail = (re.escape(p) for p in NUMBER.split(os.path.basename(out_pattern))[::2])
    mine = re.compile(f"^{head}(\\d+){tail}$")
    for name in os.listdir(folder):
        found = mine.match(name)
        if found and int(found[1]) >= count:
            os.remove(os.path.join(folder, name))
