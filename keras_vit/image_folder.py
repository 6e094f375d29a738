"""A folder of one's own images as a dataset: `keras_vit.data.from_directory` is the entry.

    photos/cat/001.jpg, photos/cat/holiday/002.png, photos/dog/003.jpg, ...   (or photos/labels.csv)

`scan` reads the folder once: the classes (sorted names of the class subfolders, or of the classes of a
`labels.csv`), every image file under them (nested folders and symlinked class folders included), each
file's size after its EXIF orientation, and which files cannot be used and why (not an image, empty,
truncated, too large). Each file is decoded once at reduced scale to find truncated and corrupt ones
before training rather than in the middle of an epoch. A stratified split puts `ceil(n * split)` of each
class's `n` images (in a seeded shuffle) into validation: an `ImageFolder` record of which file went where,
written with `ImageFolder.save`.

Every random choice of training is planned in numpy from `(seed, pass)`: the order of each pass over the
files, and each image's crop box (the official Inception crop: 5-100% of the area, aspect ratio 3/4-4/3,
the whole image after 100 failed attempts) and flip. Two pipelines run that plan and give the same
batches: `tf.data` where TensorFlow is installed (parallel decoding in TensorFlow's threads) and a
`keras.utils.PyDataset` without it (decoding in Python threads; Pillow and numpy release the GIL).
Both decode JPEGs exactly as Pillow does (TensorFlow's "INTEGER_ACCURATE" DCT) and resize as
`tf.image.resize` does (bilinear, half-pixel centres, no antialiasing), so their images agree to one
level of 255 (the float rounding of two resizers) and the labels, crops and flips exactly.
"""

import concurrent.futures
import csv
import dataclasses
import math
import os
import warnings

import numpy as np

from keras_vit.configs import pair

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp")
LABELS_CSV = "labels.csv"
# larger images are skipped (or refused with strict=True): 50 Mpx decode to 150 MB each
MAX_PIXELS = 50_000_000
# the official Inception crop (keras_vit.data's AREA_RANGE, ASPECT_RATIO_RANGE) and its attempts
CROP_ATTEMPTS = 100
# how a file is decoded in the tf.data pipeline: by Pillow (through numpy), TensorFlow's JPEG or PNG decoder
PILLOW, TF_JPEG, TF_PNG = 0, 1, 2
# pixels beyond a JPEG crop that are decoded too (see tf_datasets' decode_box)
JPEG_CROP_MARGIN = 32
PIPELINES = ("auto", "tf.data", "pydataset")


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


# --------------------------------------------------------------------------
# reading one file
# --------------------------------------------------------------------------
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


def probe(path, max_pixels=MAX_PIXELS):
    """(height, width, decoder) of an image file, after its EXIF orientation, or (None, reason) when it
    cannot be used. The file is decoded at reduced scale (JPEG's 1/8 DCT scaling), which reads all of
    its data: truncated and corrupt files are found here rather than during training."""
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


# --------------------------------------------------------------------------
# the folder
# --------------------------------------------------------------------------
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
        found += [os.path.relpath(os.path.join(top, f), folder) for f in files if _is_image_name(f)]
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


def scan(root, validation_split=0.1, seed=0, *, labels_csv=None, strict=False, max_pixels=MAX_PIXELS,
         threads=None, verbose=False):
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
    table = labels_csv or os.path.join(root, LABELS_CSV)
    if labels_csv is not None or os.path.isfile(table):
        if not os.path.isfile(table):
            raise ValueError(f"labels_csv {table!r} is not a file")
        classes, files = _from_csv(root, table)
        _check_classes(root, classes, table)
    else:
        classes = sorted(d for d in os.listdir(root) if not d.startswith(".") and os.path.isdir(os.path.join(root, d)))
        _check_classes(root, classes, repr(root))
        files = _from_subfolders(root, classes)

    bar = None
    if verbose:
        import keras

        bar = keras.utils.Progbar(len(files), unit_name="file")
    with concurrent.futures.ThreadPoolExecutor(threads or os.cpu_count() or 1) as pool:
        probes = []
        for n, result in enumerate(pool.map(lambda f: probe(os.path.join(root, f[0]), max_pixels), files), 1):
            probes.append(result)
            if bar is not None and (n % 64 == 0 or n == len(files)):
                bar.update(n)
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


# --------------------------------------------------------------------------
# the plan: order, crops and flips, in numpy
# --------------------------------------------------------------------------
def crop_boxes(heights, widths, rng, area_range=(0.05, 1.0), aspect_ratio_range=(3 / 4, 4 / 3),
               attempts=CROP_ATTEMPTS):
    """(N, 4) int64 boxes (top, left, height, width) of the Inception crop for images of the given sizes:
    the first of `attempts` draws (area uniform in `area_range` of the image, aspect ratio w/h uniform in
    `aspect_ratio_range`) that fits, at a uniform position; the whole image when none fits. The draws
    are made ten at a time for the images still without a box (memory stays ~10 x N)."""
    heights, widths = np.asarray(heights, np.float64), np.asarray(widths, np.float64)
    h, w = heights.copy(), widths.copy()  # the fallback: the whole image
    todo = np.arange(len(heights))
    for tried in range(0, attempts, 10):
        draws = min(10, attempts - tried)
        area = rng.uniform(*area_range, size=(len(todo), draws)) * (heights * widths)[todo, None]
        ratio = rng.uniform(*aspect_ratio_range, size=(len(todo), draws))
        th, tw = np.round(np.sqrt(area / ratio)), np.round(np.sqrt(area * ratio))
        fits = (th >= 1) & (tw >= 1) & (th <= heights[todo, None]) & (tw <= widths[todo, None])
        first = np.argmax(fits, axis=1)
        rows = np.arange(len(todo))
        ok = fits[rows, first]
        h[todo[ok]], w[todo[ok]] = th[rows, first][ok], tw[rows, first][ok]
        todo = todo[~ok]
        if not len(todo):
            break
    top = np.floor(rng.uniform(size=len(h)) * (heights - h + 1))
    left = np.floor(rng.uniform(size=len(h)) * (widths - w + 1))
    return np.stack([top, left, h, w], axis=1).astype(np.int64)


def plan_pass(records, seed, pass_index):
    """(order, boxes, flips) of training pass `pass_index`: the file order, and for the image at each
    position its crop box (top, left, height, width) and whether it is flipped. A pure function of
    `seed` and `pass_index`."""
    rng = np.random.default_rng([seed, pass_index])
    order = rng.permutation(len(records))
    sizes = np.asarray([(records[i][2], records[i][3]) for i in order], np.int64).reshape(-1, 2)
    boxes = crop_boxes(sizes[:, 0], sizes[:, 1], rng)
    flips = rng.uniform(size=len(records)) < 0.5
    return order, boxes, flips


def resize_bilinear(image, size):
    """uint8 or float (H, W, C) -> float32 (h, w, C) as `tf.image.resize(image, size, "bilinear")` computes
    it (half-pixel centres, no antialiasing), in numpy."""

    def taps(n_in, n_out):
        scale = np.float32(n_in) / np.float32(n_out)
        x = (np.arange(n_out, dtype=np.float32) + np.float32(0.5)) * scale - np.float32(0.5)
        low = np.floor(x)
        return (np.clip(low, 0, n_in - 1).astype(np.intp), np.clip(np.ceil(x), 0, n_in - 1).astype(np.intp),
                (x - low).astype(np.float32))

    image = np.asarray(image)
    y0, y1, fy = taps(image.shape[0], size[0])
    x0, x1, fx = taps(image.shape[1], size[1])
    channels = image.shape[2]
    # columns gathered as channel-interleaved offsets into flattened rows (numpy's fastest gather)
    x0, x1 = ((x[:, None] * channels + np.arange(channels)).ravel() for x in (x0, x1))
    fx, fy = np.repeat(fx, channels)[None, :], fy[:, None]

    def lerp_columns(rows):
        rows = rows.reshape(len(rows), -1)
        left = rows[:, x0].astype(np.float32)
        return left + (rows[:, x1].astype(np.float32) - left) * fx

    top = lerp_columns(image[y0])
    return (top + (lerp_columns(image[y1]) - top) * fy).reshape(size[0], size[1], channels)


def finish(image, image_dtype):
    """A resized float image as `image_dtype`: uint8 rounded in [0, 255], or float32 scaled to [-1, 1]."""
    if image_dtype == "uint8":
        return np.round(np.clip(image, 0.0, 255.0)).astype(np.uint8)
    return ((image - np.float32(127.5)) / np.float32(127.5)).astype(np.float32)


# --------------------------------------------------------------------------
# the two pipelines
# --------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Stream:
    """Which examples a pipeline yields: the training stream from example `start` (= skip_batches x
    batch_size) on, `batch_size` images a global batch of which this process takes rows
    [process_index x b, (process_index + 1) x b), b = batch_size / process_count."""

    batch_size: int
    start: int = 0
    repeat: bool = True
    drop_remainder: bool = True
    process_index: int = 0
    process_count: int = 1

    @property
    def rows(self):
        return self.batch_size // self.process_count

    def num_batches(self, n):
        """Batches of a single pass over `n` files (None when repeating)."""
        if self.repeat:
            return None
        left = n - self.start
        return left // self.batch_size if self.drop_remainder else -(-left // self.batch_size)


def _train_item(folder, stream, size, image_dtype, plans, g):
    """(image, label) of example `g` of the training stream, in numpy."""
    n = len(folder.train)
    order, boxes, flips = plans(g // n)
    path, label, _, _, decoder = folder.train[order[g % n]]
    top, left, h, w = boxes[g % n]
    image = read_image(os.path.join(folder.root, path), plain=decoder != PILLOW)
    image = resize_bilinear(image[top:top + h, left:left + w], size)
    return finish(image[:, ::-1] if flips[g % n] else image, image_dtype), label


def _eval_item(folder, size, image_dtype, i):
    path, label, _, _, decoder = folder.validation[i]
    image = read_image(os.path.join(folder.root, path), plain=decoder != PILLOW)
    return finish(resize_bilinear(image, size), image_dtype), label


def pydatasets(folder, image_size, stream, eval_batch_size, image_dtype="float32", workers=None):
    """(train, validation) `keras.utils.PyDataset`s of the folder's plan (no TensorFlow needed); validation
    is None without validation images. Batches are (images, int32 labels) numpy arrays."""
    import functools

    import keras

    size = pair(image_size, "image_size")
    workers = workers or os.cpu_count() or 1
    plans = functools.lru_cache(maxsize=4)(lambda p: plan_pass(folder.train, folder.seed, p))

    class Batches(keras.utils.PyDataset):
        def __init__(self, count, rows, item):
            super().__init__(workers=workers, use_multiprocessing=False, max_queue_size=max(4, 2 * workers))
            self.count, self.rows, self.item = count, rows, item

        @property
        def num_batches(self):  # None: endless (fit needs steps_per_epoch)
            return self.count

        def __len__(self):
            if self.count is None:
                raise TypeError("an endless (repeat=True) folder stream has no length; give fit steps_per_epoch")
            return self.count

        def __getitem__(self, index):
            if self.count is not None and not 0 <= index < self.count:
                raise IndexError(f"batch {index} of {self.count}")
            images, labels = zip(*(self.item(i) for i in self.rows(index)))
            return np.stack(images), np.asarray(labels, np.int32)

    n = len(folder.train)

    def train_rows(index):
        first = stream.start + index * stream.batch_size + stream.process_index * stream.rows
        return range(first, first + stream.rows if stream.repeat else min(first + stream.rows, n))

    train = Batches(stream.num_batches(n), train_rows,
                    functools.partial(_train_item, folder, stream, size, image_dtype, plans))
    if not folder.validation:
        return train, None
    m, rows = len(folder.validation), eval_batch_size // stream.process_count
    mine = max(0, -(-(m - stream.process_index * rows) // eval_batch_size))  # batches holding rows of this process
    validation = Batches(mine, lambda index: range(
        min(m, index * eval_batch_size + stream.process_index * rows),
        min(m, index * eval_batch_size + (stream.process_index + 1) * rows)),
        functools.partial(_eval_item, folder, size, image_dtype))
    return train, validation


def tf_datasets(folder, image_size, stream, eval_batch_size, image_dtype="float32"):
    """(train, validation) `tf.data.Dataset`s of the folder's plan, decoding in TensorFlow's threads (Pillow
    for what TensorFlow does not decode as Pillow does); validation is None without validation images."""
    import tensorflow as tf

    size = pair(image_size, "image_size")
    train = _tf_train(tf, folder, size, stream, image_dtype)
    if not folder.validation:
        return train, None
    return train, _tf_validation(tf, folder, size, stream, eval_batch_size, image_dtype)


def _tf_tables(tf, root, records):
    """(paths, labels, decoders, shapes) of the images `records` under `root`, as constant tensors."""
    return (tf.constant([os.path.join(root, r[0]) for r in records]),
            tf.constant([r[1] for r in records], tf.int32), tf.constant([r[4] for r in records], tf.int32),
            tf.constant([r[2:4] for r in records], tf.int64))


def _tf_decode(tf, path, decoder):
    """The whole image at `path` (uint8 HWC) through its `decoder`: Pillow, TensorFlow's JPEG or PNG one."""
    def pillow():
        image = tf.numpy_function(lambda p: read_image(p.decode()), [path], tf.uint8, stateful=False)
        return tf.ensure_shape(image, [None, None, 3])

    return tf.switch_case(decoder, [
        pillow,
        lambda: tf.io.decode_jpeg(tf.io.read_file(path), channels=3, dct_method="INTEGER_ACCURATE"),
        lambda: tf.io.decode_png(tf.io.read_file(path), channels=3)])


def _tf_decode_box(tf, path, decoder, box, shape):
    """The `box` (top, left, height, width) of the image, as a full decode would give it. A JPEG decodes
    only a window a margin wider than the box: libjpeg's cropped decode differs from the full one
    near the window's edges (chroma upsampling), never farther in than one iMCU (<= 32 px)."""
    def jpeg():
        start = tf.maximum(box[:2] - JPEG_CROP_MARGIN, 0)
        end = tf.minimum(box[:2] + box[2:] + JPEG_CROP_MARGIN, shape)
        window = tf.image.decode_and_crop_jpeg(tf.io.read_file(path), tf.cast(tf.concat([start, end - start], 0),
                                               tf.int32), channels=3, dct_method="INTEGER_ACCURATE")
        return tf.slice(window, tf.concat([box[:2] - start, [0]], 0), tf.concat([box[2:], [3]], 0))

    def whole():
        return tf.slice(_tf_decode(tf, path, decoder), tf.concat([box[:2], [0]], 0), tf.concat([box[2:], [3]], 0))

    return tf.cond(tf.equal(decoder, TF_JPEG), jpeg, whole)


def _tf_train(tf, folder, size, stream, image_dtype):
    """The training batches: passes over the folder's training images in plan_pass's order, crops and
    flips, from image `stream.start` on, this process's rows of each batch."""
    from keras_vit.data import _finish, _this_process

    autotune = tf.data.AUTOTUNE
    n = len(folder.train)
    paths, labels, decoders, shapes = _tf_tables(tf, folder.root, folder.train)
    first_pass, offset = divmod(stream.start, n)

    def one_pass(pass_index):
        order, boxes, flips = tf.numpy_function(
            lambda p: plan_pass(folder.train, folder.seed, int(p)), [pass_index], (tf.int64, tf.int64, tf.bool),
            stateful=False)
        ds = tf.data.Dataset.from_tensor_slices((order, boxes, flips))
        return ds.skip(tf.where(pass_index == first_pass, tf.constant(offset, tf.int64), 0))

    def train_map(index, box, flip):
        image = tf.image.resize(_tf_decode_box(tf, paths[index], decoders[index], box, shapes[index]), size,
                                "bilinear")
        image = tf.cond(flip, lambda: tf.reverse(image, [1]), lambda: image)
        image.set_shape([*size, 3])
        return _finish(tf, image, image_dtype), labels[index]

    last = 2**62 if stream.repeat else first_pass + 1
    train = tf.data.Dataset.range(first_pass, last).flat_map(one_pass)
    train = _this_process(train, stream.batch_size, stream.process_index, stream.process_count)
    train = train.map(train_map, num_parallel_calls=autotune, deterministic=True)
    train = train.batch(stream.rows, drop_remainder=stream.drop_remainder)
    count = stream.num_batches(n)
    return train.apply(tf.data.experimental.assert_cardinality(
        tf.data.INFINITE_CARDINALITY if count is None else count)).prefetch(autotune)


def _tf_validation(tf, folder, size, stream, eval_batch_size, image_dtype):
    """The validation batches: the folder's validation images resized whole, this process's rows of each."""
    from keras_vit.data import _finish, _this_process

    autotune = tf.data.AUTOTUNE
    paths_v, labels_v, decoders_v, _ = _tf_tables(tf, folder.root, folder.validation)

    def eval_map(index):
        image = tf.image.resize(_tf_decode(tf, paths_v[index], decoders_v[index]), size, "bilinear")
        image.set_shape([*size, 3])
        return _finish(tf, image, image_dtype), labels_v[index]

    validation = _this_process(tf.data.Dataset.range(len(folder.validation)), eval_batch_size,
                               stream.process_index, stream.process_count)
    validation = validation.map(eval_map, num_parallel_calls=autotune, deterministic=True)
    return validation.batch(eval_batch_size // stream.process_count).prefetch(autotune)


def tensorflow_available():
    """True when TensorFlow imports (the tf.data pipeline); False sends `pipeline="auto"` to the PyDataset."""
    from keras_vit.startup import import_quietly

    try:
        import_quietly("tensorflow")  # its start-up notes held back on the JAX and torch backends
    except ImportError:
        return False
    return True
