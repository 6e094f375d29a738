"""A scanned folder as batches for `model.fit`: `from_directory` (the entry point), through tf.data where
TensorFlow is installed (`tf_datasets`: parallel decoding in TensorFlow's threads) or a `keras.utils.PyDataset`
without it (`pydatasets`: Python threads; Pillow and numpy release the GIL).

Both run the folder's plan (`keras_vit.data.stream`) and give the same batches: they decode JPEGs exactly
as Pillow does (TensorFlow's "INTEGER_ACCURATE" DCT) and resize as `tf.image.resize` does (bilinear,
half-pixel centres, no antialiasing), so their images agree to one level of 255 (the float rounding of two
resizers) and the labels, crops and flips exactly.
"""

import os

import numpy as np

from keras_vit.configs import pair
from keras_vit.data.augment import PLAN_DTYPES, Augment
from keras_vit.data.folder import (
    MAX_PIXELS,
    PILLOW,
    TF_JPEG,
    ImageFolder,
    read_image,
    scan,
)
from keras_vit.data.preprocess import (
    check_image_dtype,
    finish,
    finish_tensor,
    resize_bilinear,
)
from keras_vit.data.stream import Stream, check_stream, plan_pass, this_process
from keras_vit.extras import require

# pixels beyond a JPEG crop that are decoded too (see tf_datasets' decode_box)
JPEG_CROP_MARGIN = 32


PIPELINES = ("auto", "tf.data", "pydataset")


def from_directory(directory, image_size, batch_size, validation_split=0.1, seed=0, *, labels_csv=None,
                   strict=False, repeat=True, skip_batches=0, eval_batch_size=None, drop_remainder=True,
                   process_index=0, process_count=1, image_dtype="float32", pipeline="auto", workers=None,
                   max_pixels=MAX_PIXELS, verbose=False, verify="full", auto_augment=None, re_prob=0.0,
                   re_mode="pixel", re_count=1, aug_repeats=1, color_jitter=None):
    """Training and validation pipelines of a folder of your own images.

    The folder holds one subfolder of images per class (``photos/cat/*.jpg``; nested folders are read, the
    sorted subfolder names are the classes), or a ``labels.csv`` of (relative path, class name) rows.
    JPEG, PNG, BMP, GIF (first frame) and WebP files are read, their EXIF orientation applied, grayscale,
    palette, RGBA, CMYK and 16-bit images converted to RGB. Files that cannot be used (not images, empty,
    truncated, larger than ``max_pixels``) are skipped and listed (``strict=True`` refuses them instead).
    ``ceil(n * validation_split)`` of each class's ``n`` images (a shuffle seeded by ``seed``) validate.

    Training images get the paper's preprocessing as ``load`` does (Inception crop of 5-100% of the area,
    bilinear resize, random flip) from a plan that is a pure function of ``seed`` and the pass over the
    data, so ``skip_batches`` resumes a run exactly; validation images are resized. Images are decoded
    from disk in parallel as the batches are drawn (the folder is never held in memory).

    The training stream takes timm's augmentations too (``keras_vit.data.augment``), drawn per image from
    (seed, pass, position) on both pipelines, which give the same batches with them: RandAugment on the
    resized crop (uint8) before normalisation, random erasing after it (with ``image_dtype="uint8"``, the
    erased image mapped back to pixels), and repeated augmentation. (RandAugment's bicubic ops agree with
    Pillow's to one level, which an op after them may scale: a few pixels in a thousand can differ by more.)

    Args:
        directory: the folder, or an ``ImageFolder`` already scanned (``keras_vit.scan``).
        image_size, batch_size, seed, repeat, skip_batches: as in :func:`load`.
        eval_batch_size, drop_remainder, process_index, process_count, image_dtype: as in :func:`load`.
        validation_split: fraction of each class held out, in [0, 1) (0: no validation set).
        labels_csv: a CSV of (path relative to the folder, class name); default ``labels.csv`` in the
            folder when it exists.
        strict: refuse a folder with unusable files instead of skipping them.
        pipeline: "tf.data" (TensorFlow's threads decode), "pydataset" (a ``keras.utils.PyDataset``, no
            TensorFlow needed; ``workers`` threads) or "auto": tf.data when TensorFlow is installed.
        max_pixels: larger images are skipped (refused with ``strict``).
        verbose: a progress bar while the folder is checked.
        verify: "full" (decode each file once before training; its result cached, so the next start reads
            only new or changed files) or "header" (read headers only: much faster the first time); see
            ``keras_vit.scan``.
        auto_augment: timm's RandAugment string (``--aa``), e.g. "rand-m9-mstd0.5-inc1", or "3a" (DeiT III's
            3-Augment); None: none.
        re_prob: the probability of random erasing an image, in [0, 1] (timm's ``--reprob``; 0: none).
        re_mode: the erased boxes' fill, "pixel", "rand" or "const" (timm's ``--remode``).
        re_count: up to this many boxes an image (timm's ``--recount``).
        aug_repeats: each image this many times a pass, augmented apart (timm's ``--aug-repeats``; 1: off).
        color_jitter: with ``auto_augment="3a"`` (DeiT III's 3-Augment), the colour jitter's strength (timm's
            ``--color-jitter``; None: 0.4).

    Returns:
        ``(train, validation)``: datasets of ``(images, labels)`` batches (``validation`` is None with
        ``validation_split=0``), each with ``class_names`` and ``image_folder`` (the ``ImageFolder``:
        which file went where, what was skipped; ``image_folder.save(path)`` writes it) attributes.
        ``repeat=True`` streams forever: give ``model.fit`` a ``steps_per_epoch``.

    Raises:
        ValueError: one message naming the folder or file (see ``keras_vit.scan``), or bad
            arguments.
    """
    size = pair(image_size, "image_size")
    check_image_dtype(image_dtype)
    augment = Augment(auto_augment, re_prob, re_mode, re_count, aug_repeats, color_jitter)
    batch_size, eval_batch_size = check_stream(batch_size, eval_batch_size, skip_batches, seed, repeat,
                                                drop_remainder, process_index, process_count)
    if pipeline not in PIPELINES:
        raise ValueError(f"`pipeline` must be one of {PIPELINES}; got {pipeline!r}.")
    folder = directory if isinstance(directory, ImageFolder) else scan(
        directory, validation_split, seed, labels_csv=labels_csv, strict=strict, max_pixels=max_pixels,
        verbose=verbose, verify=verify)
    n = len(folder.train)
    start = skip_batches * batch_size
    if not repeat and start >= n:
        raise ValueError(f"`skip_batches` ({skip_batches}) goes past the single pass of {n} training images; "
                         "use repeat=True.")
    if drop_remainder and not repeat and n - start < batch_size:
        raise ValueError(f"{folder.root!r} has {n - start} training images, fewer than one batch of {batch_size}; "
                         "lower batch_size or pass drop_remainder=False.")
    stream = Stream(batch_size, start, repeat, drop_remainder, process_index, process_count)
    if pipeline == "auto":
        pipeline = "tf.data" if tensorflow_available() else "pydataset"
    if pipeline == "tf.data":
        require("the tf.data pipeline of an image folder")
        train, validation = tf_datasets(folder, size, stream, eval_batch_size, image_dtype, augment)
    else:
        train, validation = pydatasets(folder, size, stream, eval_batch_size, image_dtype, workers, augment)
    for ds in (train, validation):
        if ds is not None:
            ds.class_names, ds.image_folder = folder.class_names, folder
    return train, validation


def _train_item(folder, size, image_dtype, augment, plans, g):
    """(image, label) of example `g` of the training stream, in numpy."""
    n = len(folder.train)
    order, boxes, flips = plans(g // n)
    path, label, _, _, decoder = folder.train[order[g % n]]
    top, left, h, w = boxes[g % n]
    image = read_image(os.path.join(folder.root, path), plain=decoder != PILLOW)
    image = resize_bilinear(image[top:top + h, left:left + w], size)
    image = image[:, ::-1] if flips[g % n] else image
    return augment.finish_image(image, image_dtype, folder.seed, g // n, g % n), label


def _eval_item(folder, size, image_dtype, i):
    path, label, _, _, decoder = folder.validation[i]
    image = read_image(os.path.join(folder.root, path), plain=decoder != PILLOW)
    return finish(resize_bilinear(image, size), image_dtype), label


def pydatasets(folder, image_size, stream, eval_batch_size, image_dtype="float32", workers=None, augment=None):
    """(train, validation) `keras.utils.PyDataset`s of the folder's plan (no TensorFlow needed), the training
    images augmented by `augment` (a `keras_vit.data.augment.Augment`; None: crop and flip only); validation
    is None without validation images. Batches are (images, int32 labels) numpy arrays."""
    import functools

    import keras

    size = pair(image_size, "image_size")
    workers = workers or os.cpu_count() or 1
    augment = augment or Augment()
    plans = functools.lru_cache(maxsize=4)(lambda p: plan_pass(folder.train, folder.seed, p, augment.aug_repeats))

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
                    functools.partial(_train_item, folder, size, image_dtype, augment, plans))
    if not folder.validation:
        return train, None
    m, rows = len(folder.validation), eval_batch_size // stream.process_count
    mine = max(0, -(-(m - stream.process_index * rows) // eval_batch_size))  # batches holding rows of this process
    validation = Batches(mine, lambda index: range(
        min(m, index * eval_batch_size + stream.process_index * rows),
        min(m, index * eval_batch_size + (stream.process_index + 1) * rows)),
        functools.partial(_eval_item, folder, size, image_dtype))
    return train, validation


def tf_datasets(folder, image_size, stream, eval_batch_size, image_dtype="float32", augment=None):
    """(train, validation) `tf.data.Dataset`s of the folder's plan, decoding in TensorFlow's threads (Pillow
    for what TensorFlow does not decode as Pillow does), the training images augmented by `augment` (a
    `keras_vit.data.augment.Augment`; None: crop and flip only); validation is None without validation images."""
    import tensorflow as tf

    size = pair(image_size, "image_size")
    train = _tf_train(tf, folder, size, stream, image_dtype, augment or Augment())
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


def tf_jpeg_box(tf, data, box, shape):
    """The `box` (top, left, height, width) of the JPEG `data` (encoded bytes, a (height, width) `shape`), as a
    full decode would give it. Only a window a margin wider than the box is decoded: libjpeg's cropped decode
    differs from the full one near the window's edges (chroma upsampling), never farther in than one iMCU
    (<= 32 px)."""
    start = tf.maximum(box[:2] - JPEG_CROP_MARGIN, 0)
    end = tf.minimum(box[:2] + box[2:] + JPEG_CROP_MARGIN, shape)
    window = tf.image.decode_and_crop_jpeg(data, tf.cast(tf.concat([start, end - start], 0), tf.int32), channels=3,
                                           dct_method="INTEGER_ACCURATE")
    return tf.slice(window, tf.concat([box[:2] - start, [0]], 0), tf.concat([box[2:], [3]], 0))


def _tf_decode_box(tf, path, decoder, box, shape):
    """The `box` (top, left, height, width) of the image, as a full decode would give it (a JPEG's through
    `tf_jpeg_box`)."""
    def jpeg():
        return tf_jpeg_box(tf, tf.io.read_file(path), box, shape)

    def whole():
        return tf.slice(_tf_decode(tf, path, decoder), tf.concat([box[:2], [0]], 0), tf.concat([box[2:], [3]], 0))

    return tf.cond(tf.equal(decoder, TF_JPEG), jpeg, whole)


def _tf_pass_plan(folder, size, augment, pass_index):
    """plan_pass's (order, boxes, flips) of a pass and `augment`'s draws for its positions (numpy)."""
    n = len(folder.train)
    return (*plan_pass(folder.train, folder.seed, pass_index, augment.aug_repeats),
            *augment.plan(folder.seed, pass_index, range(n), *size))


def _tf_train(tf, folder, size, stream, image_dtype, augment):
    """The training batches: passes over the folder's training images in plan_pass's order, crops and
    flips (and `augment`'s augmentations), from image `stream.start` on, this process's rows of each batch."""
    autotune = tf.data.AUTOTUNE
    n = len(folder.train)
    paths, labels, decoders, shapes = _tf_tables(tf, folder.root, folder.train)
    first_pass, offset = divmod(stream.start, n)

    def one_pass(pass_index):
        plan = tf.numpy_function(lambda p: _tf_pass_plan(folder, size, augment, int(p)), [pass_index],
                                 (tf.int64, tf.int64, tf.bool, *(tf.as_dtype(d) for d in PLAN_DTYPES)),
                                 stateful=False)
        shapes = ((None,), (None, 4), (None,), *augment.plan_shapes)
        ds = tf.data.Dataset.from_tensor_slices(tuple(tf.ensure_shape(a, s) for a, s in zip(plan, shapes)))
        return ds.skip(tf.where(pass_index == first_pass, tf.constant(offset, tf.int64), 0))

    def train_map(index, box, flip, *draws):
        image = tf.image.resize(_tf_decode_box(tf, paths[index], decoders[index], box, shapes[index]), size,
                                "bilinear")
        image = tf.cond(flip, lambda: tf.reverse(image, [1]), lambda: image)
        image.set_shape([*size, 3])
        return augment.finish_tensor(tf, image, image_dtype, *draws), labels[index]

    last = 2**62 if stream.repeat else first_pass + 1
    train = tf.data.Dataset.range(first_pass, last).flat_map(one_pass)
    train = this_process(train, stream.batch_size, stream.process_index, stream.process_count)
    train = train.map(train_map, num_parallel_calls=autotune, deterministic=True)
    train = train.batch(stream.rows, drop_remainder=stream.drop_remainder)
    count = stream.num_batches(n)
    return train.apply(tf.data.experimental.assert_cardinality(
        tf.data.INFINITE_CARDINALITY if count is None else count)).prefetch(autotune)


def _tf_validation(tf, folder, size, stream, eval_batch_size, image_dtype):
    """The validation batches: the folder's validation images resized whole, this process's rows of each."""
    autotune = tf.data.AUTOTUNE
    paths_v, labels_v, decoders_v, _ = _tf_tables(tf, folder.root, folder.validation)

    def eval_map(index):
        image = tf.image.resize(_tf_decode(tf, paths_v[index], decoders_v[index]), size, "bilinear")
        image.set_shape([*size, 3])
        return finish_tensor(tf, image, image_dtype), labels_v[index]

    validation = this_process(tf.data.Dataset.range(len(folder.validation)), eval_batch_size,
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
