"""A folder of one's own images, read once: `scan` lists the classes and their files and splits them;
`ImageFolder` is its record; `read_image` and `probe` read one file.

    photos/cat/001.jpg, photos/cat/holiday/002.png, photos/dog/003.jpg, ...   (or photos/labels.csv)

`scan` finds the classes (sorted names of the class subfolders, or of the classes of a `labels.csv`), every
image file under them (nested folders and symlinked class folders included), each file's size after its
EXIF orientation, and which files cannot be used and why (not an image, empty, too large; truncated too with
`verify="full"`). By default only each file's header is read (`verify="header"`): a truncated or corrupt file
is then skipped by the feed as it is read (`keras_vit.data.folder_read`); `verify="full"` decodes each file
once at reduced scale to find those before training. A stratified split puts `ceil(n * split)` of each class's `n` images (in a seeded
shuffle) into validation: an `ImageFolder` record of which file went where, written with
`ImageFolder.save`. The feeds that read it are in `keras_vit.data.folder_feed`.
"""

import concurrent.futures
import contextlib
import csv
import dataclasses
import gc
import math
import os
import time
import warnings

import numpy as np

from keras_vit.data import scan_cache

# what a scan checks of each file: "header" reads its size, format and EXIF orientation; "full" decodes it
VERIFY_LEVELS = ("header", "full")

# files a thread probes at once (a future per file would cost more than a header read)
PROBE_CHUNK = 64

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp")


LABELS_CSV = "labels.csv"


# larger images are skipped (or refused with strict=True): 50 Mpx decode to 150 MB each
MAX_PIXELS = 50_000_000


# how a file is decoded in the tf.data pipeline: by Pillow (through numpy), TensorFlow's JPEG or PNG decoder
PILLOW, TF_JPEG, TF_PNG = 0, 1, 2


@dataclasses.dataclass(frozen=True)
class ImageFolder:
    """A scanned image folder and its train/validation split.

    Attributes:
        root: the folder.
        class_names: the classes, label `i` is `class_names[i]`.
        train, validation: tuples of `(relative path, label, height, width, decoder)` records; height and
            width after the EXIF orientation, `decoder` one of PILLOW, TF_JPEG, TF_PNG.
        skipped: `(relative path, reason)` of the files left out.
        seed, validation_split: what made the split.
    """

    root: str
    class_names: tuple
    train: tuple
    validation: tuple
    skipped: tuple
    seed: int
    validation_split: float

    def counts(self):
        """{class name: (train images, validation images)}."""
        out = {name: [0, 0] for name in self.class_names}
        for part, records in enumerate((self.train, self.validation)):
            for record in records:
                out[self.class_names[record[1]]][part] += 1
        return {k: tuple(v) for k, v in out.items()}

    def to_json(self):
        """What went where, as a JSON-able dict (what `save` writes)."""
        return {"root": os.path.abspath(self.root), "class_names": list(self.class_names), "seed": self.seed,
                "validation_split": self.validation_split,
                "train": [[r[0], self.class_names[r[1]]] for r in self.train],
                "validation": [[r[0], self.class_names[r[1]]] for r in self.validation],
                "skipped": [list(s) for s in self.skipped]}

    def save(self, path):
        """Writes `to_json()` to `path` (atomically)."""
        from keras_vit.fileio import write_json

        write_json(path, self.to_json())


def _sixteen_bit_png(path):
    """True for a PNG of 16 bits per sample (IHDR's bit depth, byte 24 of the file)."""
    with open(path, "rb") as f:
        head = f.read(25)
    return len(head) == 25 and head[:8] == b"\x89PNG\r\n\x1a\n" and head[24] == 16


def _to_rgb(img):
    """A loaded Pillow image as uint8 RGB (H, W, 3): 16-bit samples keep their high byte, alpha is dropped."""
    if img.mode in ("I;16", "I;16B", "I;16L", "I"):
        values = np.asarray(img).astype(np.int64)
        grey = np.clip(values >> 8 if values.max(initial=0) > 255 or img.mode != "I" else values, 0, 255)
        return np.repeat(grey.astype(np.uint8)[..., None], 3, axis=-1)
    if img.mode == "F":
        return np.repeat(np.clip(np.asarray(img), 0, 255).astype(np.uint8)[..., None], 3, axis=-1)
    return np.asarray(img.convert("RGB"))


def read_image(path, plain=False):
    """The image file at `path` as uint8 RGB (H, W, 3): the first frame of an animation, the EXIF
    orientation applied, grayscale, palette, RGBA, CMYK and 16-bit images converted (`plain`: the file is
    known to be 8-bit RGB or grayscale without a rotation, as `probe` finds for TensorFlow's decoders).
    Raises ValueError naming the file when it cannot be read."""
    from PIL import Image, ImageOps

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            with Image.open(path) as img:
                if plain:
                    return np.asarray(img if img.mode == "RGB" else img.convert("RGB"))
                img.seek(0)
                return _to_rgb(ImageOps.exif_transpose(img))
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as err:
        raise ValueError(f"cannot read {path} as an image: {err}") from None


def probe(path, max_pixels=MAX_PIXELS, verify="full"):
    """(height, width, decoder) of an image file, after its EXIF orientation, or (None, reason) when it
    cannot be used. `verify="full"` decodes the file at reduced scale (JPEG's 1/8 DCT scaling), which reads
    all of its data: truncated and corrupt files are found here rather than during training;
    `verify="header"` reads its header only (size, format, EXIF orientation), about 30 times faster."""
    from PIL import Image

    if os.path.getsize(path) == 0:
        return None, "empty file (0 bytes)"
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            with Image.open(path) as img:
                width, height = img.size
                if width * height > max_pixels:
                    return None, f"{width}x{height} pixels, more than max_pixels={max_pixels}"
                orientation = img.getexif().get(0x0112, 1)
                kind, mode = img.format, img.mode
                if verify == "full":
                    if kind == "JPEG":
                        img.draft("RGB", (max(1, width // 8), max(1, height // 8)))
                    img.load()
    except Image.DecompressionBombError:
        return None, f"more pixels than Pillow decodes (max_pixels={max_pixels})"
    except (OSError, SyntaxError, ValueError) as err:
        return None, f"not a readable image ({err})"
    if orientation in (5, 6, 7, 8):
        height, width = width, height
    decoder = PILLOW
    if orientation in (1, None) and mode in ("RGB", "L"):
        if kind == "JPEG":
            decoder = TF_JPEG
        elif kind == "PNG" and not _sixteen_bit_png(path):
            decoder = TF_PNG
    return (height, width, decoder), None


def _is_image_name(name):
    return not name.startswith(".") and name.lower().endswith(IMAGE_EXTENSIONS)


def image_files(folder):
    """Relative paths (to `folder`) of the image files under it, sorted, following symlinked folders once."""
    found, seen = [], set()
    for top, dirs, files in os.walk(folder, followlinks=True):
        real = os.path.realpath(top)
        if real in seen:  # a symlink loop
            dirs[:] = []
            continue
        seen.add(real)
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        inside = os.path.relpath(top, folder)
        prefix = "" if inside == os.curdir else inside + os.sep
        found += [prefix + f for f in files if _is_image_name(f)]
    return sorted(found)


def _from_subfolders(root, classes):
    """[(relative path, class index)] of the images in the class subfolders `classes` of `root`."""
    files = []
    for label, name in enumerate(classes):
        inside = image_files(os.path.join(root, name))
        if not inside:
            raise ValueError(f"class folder {os.path.join(root, name)!r} holds no image files "
                             f"(expected {', '.join(IMAGE_EXTENSIONS)} files, in it or in folders under it)")
        files += [(os.path.join(name, f), label) for f in inside]
    return files


def _from_csv(root, table):
    """(class names, [(relative path, class index)]) from a CSV of (relative path, class name) rows."""
    with open(table, newline="", encoding="utf-8-sig") as f:
        rows = [r for r in csv.reader(f) if r and any(cell.strip() for cell in r)]
    if rows and not os.path.isfile(os.path.join(root, rows[0][0])) and rows[0][0].strip().lower() in (
            "path", "file", "filename", "image"):
        rows = rows[1:]  # a header
    pairs = []
    for number, row in enumerate(rows, 1):
        if len(row) < 2 or not row[0].strip() or not row[1].strip():
            raise ValueError(f"{table}, row {number}: expected 'relative path,class name'; got {row!r}")
        path = os.path.normpath(row[0].strip())
        if not os.path.isfile(os.path.join(root, path)):
            raise ValueError(f"{table}, row {number}: no file {os.path.join(root, path)!r}")
        pairs.append((path, row[1].strip()))
    classes = sorted({c for _, c in pairs})
    index = {c: i for i, c in enumerate(classes)}
    return classes, sorted((p, index[c]) for p, c in pairs)


def _check_classes(root, classes, source):
    if not classes:
        raise ValueError(f"{root!r} holds no class folders (expected {root}/<class name>/<images>, or a "
                         f"{LABELS_CSV} of 'relative path,class name' rows)")
    if len(classes) < 2:
        raise ValueError(f"{source} names one class only ({classes[0]!r}); a classifier needs at least 2")
    folded = {}
    for name in classes:
        folded.setdefault(name.casefold(), []).append(name)
    clashes = [names for names in folded.values() if len(names) > 1]
    if clashes:
        raise ValueError(f"{source} has classes whose names differ only in case: "
                         f"{'; '.join(' and '.join(repr(n) for n in c) for c in clashes)} (one folder on a "
                         "case-insensitive file system, two classes here): merge or rename them")


def _split(records, num_classes, validation_split, seed, root, class_names):
    """(train, validation): per class, `ceil(n * validation_split)` images of a seeded shuffle validate."""
    train, validation = [], []
    rng = np.random.default_rng([seed, 0x5EED])
    by_class = [[] for _ in range(num_classes)]
    for record in records:
        by_class[record[1]].append(record)
    for label, mine in enumerate(by_class):
        order = rng.permutation(len(mine))
        take = math.ceil(len(mine) * validation_split) if validation_split else 0
        if validation_split and (take >= len(mine) or take == 0):
            raise ValueError(
                f"class {class_names[label]!r} of {root!r} has {len(mine)} usable image(s): validation_split="
                f"{validation_split} would leave it {'no training' if take else 'no validation'} images "
                f"({len(mine) - take} train, {take} validation); add images to it (2 at least) or pass "
                "validation_split=0")
        validation += [mine[i] for i in sorted(order[:take])]
        train += [mine[i] for i in sorted(order[take:])]
    return tuple(train), tuple(validation)


@contextlib.contextmanager
def _collector_paused():
    """Python's cyclic garbage collector off for the block (back on after, if it was on)."""
    was_on = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_on:
            gc.enable()


def _probe_all(root, files, max_pixels, verify, threads, verbose, cache):
    """`probe` of each (relative path, label) of `files`, in threads; with `cache`, only of the files that
    are not in the folder's scan cache with their present size and modification time (and the cache
    then written again if anything was read)."""
    scanned_ns = time.time_ns()
    cached = scan_cache.load(root, max_pixels, verify) if cache else {}
    prefix = os.path.join(root, "")
    stats = [scan_cache.file_stat(prefix + f) for f, _ in files] if cache else [None] * len(files)
    results = [None] * len(files)
    todo = []
    for i, ((path, _), stat) in enumerate(zip(files, stats)):
        hit = cached.get(path)
        if hit is not None and hit[0] == stat:
            results[i] = hit[1:]  # (facts, reason) as `probe` gives them
        else:
            todo.append(i)
    bar = None
    if verbose and todo:
        import keras

        bar = keras.utils.Progbar(len(todo), unit_name="file")
    chunks = [todo[i:i + PROBE_CHUNK] for i in range(0, len(todo), PROBE_CHUNK)]
    with concurrent.futures.ThreadPoolExecutor(threads or os.cpu_count() or 1) as pool:
        work = pool.map(lambda chunk: [probe(os.path.join(root, files[i][0]), max_pixels, verify) for i in chunk],
                        chunks)
        done = 0
        for chunk, found in zip(chunks, work):
            for i, result in zip(chunk, found):
                results[i] = result
            done += len(chunk)
            if bar is not None:
                bar.update(done)
    if cache and (todo or len(cached) != len(files)):
        entries = {path: (stat, facts, reason) for (path, _), stat, (facts, reason) in zip(files, stats, results)}
        scan_cache.save(root, max_pixels, verify, entries, scanned_ns)
    return results



def scan(root, validation_split=0.1, seed=0, *, labels_csv=None, strict=False, max_pixels=MAX_PIXELS,
         threads=None, verbose=False, verify="header", cache=True):
    """Reads the image folder `root` into an `ImageFolder` (see the module's docstring).

    Args:
        root: `root/<class name>/**/<image>`, or a folder with a `labels_csv`.
        validation_split: fraction of each class held out for validation (0 for none).
        seed: seed of the split.
        labels_csv: a CSV of (path relative to `root`, class name) rows; default `root/labels.csv` when it
            exists, else the class subfolders.
        strict: refuse a folder holding files that cannot be used (default: skip them, listed in `skipped`).
        max_pixels: larger images are skipped (refused with `strict`).
        threads: decoding threads (default: the machine's cores).
        verbose: a progress bar while the files are checked.
        verify: "header" (the default) reads each file's header only (size, format, orientation: about 30
            times faster; a file that then fails to decode is skipped by the feed as it is read, named in
            the log, `keras_vit.data.folder_read`); "full" decodes each file once (at reduced scale), so that
            a truncated or corrupt file is listed in `skipped` (refused with `strict`) before training.
        cache: keep what was learned of each file in the scan cache (`keras_vit.data.scan_cache`), so
            that the next scan of the folder reads only the files added or changed since.

    Raises:
        ValueError: one message naming the folder or file: no such folder, no classes, one class, classes
            equal but for case, a class without images, unusable files with `strict`, a class too small to
            split.
    """
    root = os.fspath(root)
    if not os.path.isdir(root):
        raise ValueError(f"{root!r} is not a folder (expected a folder of class subfolders of images)")
    if not isinstance(validation_split, (int, float)) or isinstance(validation_split, bool) \
            or not 0 <= validation_split < 1:
        raise ValueError(f"validation_split must be a number in [0, 1); got {validation_split!r}")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise ValueError(f"seed must be an integer; got {seed!r}")
    if verify not in VERIFY_LEVELS:
        raise ValueError(f"verify must be one of {', '.join(VERIFY_LEVELS)}; got {verify!r}")
    with _collector_paused():  # a million small tuples would set off many full collections of nothing
        table = labels_csv or os.path.join(root, LABELS_CSV)
        if labels_csv is not None or os.path.isfile(table):
            if not os.path.isfile(table):
                raise ValueError(f"labels_csv {table!r} is not a file")
            classes, files = _from_csv(root, table)
            _check_classes(root, classes, table)
        else:
            classes = sorted(d for d in os.listdir(root)
                             if not d.startswith(".") and os.path.isdir(os.path.join(root, d)))
            _check_classes(root, classes, repr(root))
            files = _from_subfolders(root, classes)

        probes = _probe_all(root, files, max_pixels, verify, threads, verbose, cache)
        records, skipped = [], []
        for (path, label), (facts, reason) in zip(files, probes):
            if facts is None:
                skipped.append((path, reason))
            else:
                records.append((path, label, *facts))
        if skipped and strict:
            listed = "; ".join(f"{os.path.join(root, p)}: {r}" for p, r in skipped[:10])
            raise ValueError(f"{len(skipped)} file(s) under {root!r} cannot be used (strict): {listed}"
                             + (" ..." if len(skipped) > 10 else ""))
        present = {r[1] for r in records}
        empty = [name for i, name in enumerate(classes) if i not in present]
        if empty:
            raise ValueError(f"class(es) {', '.join(repr(c) for c in empty)} of {root!r} hold no usable image "
                             f"({len(skipped)} file(s) skipped: {'; '.join(f'{p}: {r}' for p, r in skipped[:5])})")
        train, validation = _split(records, len(classes), validation_split, int(seed), root, classes)
        return ImageFolder(root, tuple(classes), train, validation, tuple(skipped), int(seed), float(validation_split))
