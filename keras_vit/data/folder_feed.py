"""A scanned folder as batches for `model.fit`: `from_directory` (the entry point), through tf.data where
TensorFlow is installed (`tf_datasets`: parallel decoding in TensorFlow's threads) or a `keras.utils.PyDataset`
without it (`pydatasets`: Python threads; Pillow and numpy release the GIL).

Both run the folder's plan (`keras_vit.data.stream`) and give the same batches: they decode JPEGs exactly
as Pillow does (TensorFlow's "INTEGER_ACCURATE" DCT) and resize as `tf.image.resize` does (bilinear,
half-pixel centres, no antialiasing), so their images agree to one level of 255 (the float rounding of two
resizers) and the labels, crops and flips exactly. A file that cannot be read as it was scanned is skipped
by both alike (`keras_vit.data.folder_read`): tf.data decodes `DECODE_GROUP` examples at a time, drops those
that fail (`ignore_errors`) and puts back in their places what the `PyDataset` reads there.
"""

import os

import numpy as np

from keras_vit.configs import pair
from keras_vit.data.augment import PLAN_DTYPES, Augment
from keras_vit.data.folder import MAX_PIXELS, TF_JPEG, ImageFolder, read_image, scan
from keras_vit.data.folder_read import (
    SkippedFiles,
    pass_plans,
    train_crop,
    validation_image,
)
from keras_vit.data.preprocess import (
    check_image_dtype,
    finish,
    finish_tensor,
    resize_bilinear,
)
from keras_vit.data.stream import (
    Stream,
    check_stream,
    this_process,
    this_process_example,
)
from keras_vit.extras import require

# pixels beyond a JPEG crop that are decoded too (see tf_datasets' decode_box)
JPEG_CROP_MARGIN = 32

# examples the tf.data feed decodes as a group (groups in parallel): a failed one is put back as its group ends
DECODE_GROUP = 16

# the last two bytes of a whole JPEG file (its EOI marker): a truncated one lacks them
JPEG_END = b"\xff\xd9"


PIPELINES = ("auto", "tf.data", "pydataset")


def from_directory(directory, image_size, batch_size, validation_split=0.1, seed=0, *, labels_csv=None,
                   strict=False, repeat=True, skip_batches=0, eval_batch_size=None, drop_remainder=True,
                   process_index=0, process_count=1, image_dtype="float32", pipeline="auto", workers=None,
                   max_pixels=MAX_PIXELS, verbose=False, verify="header", auto_augment=None, re_prob=0.0,
                   re_mode="pixel", re_count=1, aug_repeats=1, color_jitter=None):
    """Training and validation pipelines of a folder of your own images.

    The folder holds one subfolder of images per class (``photos/cat/*.jpg``; nested folders are read, the
    sorted subfolder names are the classes), or a ``labels.csv`` of (relative path, class name) rows.
    JPEG, PNG, BMP, GIF (first frame) and WebP files are read, their EXIF orientation applied, grayscale,
    palette, RGBA, CMYK and 16-bit images converted to RGB. Files the scan finds unusable (not images, empty,
    larger than ``max_pixels``; truncated too with ``verify="full"``) are skipped and listed in
    ``image_folder.skipped`` (``strict=True`` refuses them instead). A file that fails when it is read
    (truncated or corrupt, removed or resized since the scan) is skipped there and then, named once in the
    log (the "keras_vit" logger) and listed in ``skipped_files``: a training example takes the next readable
    file of its pass in its place (a fresh crop of it), so the batch stays full and the stream the same on
    both pipelines; a validation image is left out of its batch (see ``keras_vit.data.folder_read``).
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
        verify: "header" (read each file's header only before training: fast; a file that does not decode
            is skipped while reading, as above) or "full" (decode each file once before training, so that a
            truncated file is listed in ``image_folder.skipped`` before the first step); the scan's result
            is cached either way, so the next start reads only new or changed files (``keras_vit.scan``).
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
        ``validation_split=0``), each with ``class_names``, ``image_folder`` (the ``ImageFolder``: which
        file went where, what the scan skipped; ``image_folder.save(path)`` writes it) and
        ``skipped_files`` (a ``SkippedFiles``, shared by both: ``(relative path, reason)`` of each file
        skipped while reading, so far) attributes.
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
    skipped = SkippedFiles(folder.root)
    if pipeline == "tf.data":
        require("the tf.data pipeline of an image folder")
        train, validation = tf_datasets(folder, size, stream, eval_batch_size, image_dtype, augment, skipped)
    else:
        train, validation = pydatasets(folder, size, stream, eval_batch_size, image_dtype, workers, augment, skipped)
    for ds in (train, validation):
        if ds is not None:
            ds.class_names, ds.image_folder, ds.skipped_files = folder.class_names, folder, skipped
    return train, validation


def _train_item(folder, size, image_dtype, augment, plans, skipped, g):
    """(image, label) of example `g` of the training stream, in numpy."""
    pass_index, position = divmod(g, len(folder.train))
    plan = plans(pass_index)
    crop, label = train_crop(folder, skipped, plan, pass_index, position)
    image = resize_bilinear(crop, size)
    image = image[:, ::-1] if plan[2][position] else image
    return augment.finish_image(image, image_dtype, folder.seed, pass_index, position), label


def _eval_item(folder, size, image_dtype, skipped, i):
    """(image, label) of validation image `i`, in numpy; None when its file is skipped."""
    image = validation_image(folder, skipped, i)
    return None if image is None else (finish(resize_bilinear(image, size), image_dtype), folder.validation[i][1])


def pydatasets(folder, image_size, stream, eval_batch_size, image_dtype="float32", workers=None, augment=None,
               skipped=None):
    """(train, validation) `keras.utils.PyDataset`s of the folder's plan (no TensorFlow needed), the training
    images augmented by `augment` (a `keras_vit.data.augment.Augment`; None: crop and flip only); validation
    is None without validation images. Batches are (images, int32 labels) numpy arrays. Files that cannot
    be read as scanned are recorded in `skipped` (a `SkippedFiles`; None: a new one) and replaced or left
    out (`keras_vit.data.folder_read`)."""
    import functools

    import keras

    size = pair(image_size, "image_size")
    workers = workers or os.cpu_count() or 1
    augment = augment or Augment()
    skipped = skipped if skipped is not None else SkippedFiles(folder.root)
    plans = pass_plans(folder, augment.aug_repeats)
    empty = (np.zeros((0, *size, 3), image_dtype), np.zeros((0,), np.int32))

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
            items = [item for item in map(self.item, self.rows(index)) if item is not None]
            if not items:  # every validation image of the batch skipped
                return empty
            images, labels = zip(*items)
            return np.stack(images), np.asarray(labels, np.int32)

    n = len(folder.train)

    def train_rows(index):
        first = stream.start + index * stream.batch_size + stream.process_index * stream.rows
        return range(first, first + stream.rows if stream.repeat else min(first + stream.rows, n))

    train = Batches(stream.num_batches(n), train_rows,
                    functools.partial(_train_item, folder, size, image_dtype, augment, plans, skipped))
    if not folder.validation:
        return train, None
    m, rows = len(folder.validation), eval_batch_size // stream.process_count
    validation = Batches(_validation_batches(m, eval_batch_size, stream), lambda index: range(
        min(m, index * eval_batch_size + stream.process_index * rows),
        min(m, index * eval_batch_size + (stream.process_index + 1) * rows)),
        functools.partial(_eval_item, folder, size, image_dtype, skipped))
    return train, validation


def _validation_batches(m, eval_batch_size, stream):
    """How many validation batches (of `m` images, `eval_batch_size` a batch) hold rows of this process."""
    return max(0, -(-(m - stream.process_index * (eval_batch_size // stream.process_count)) // eval_batch_size))


def tf_datasets(folder, image_size, stream, eval_batch_size, image_dtype="float32", augment=None, skipped=None):
    """(train, validation) `tf.data.Dataset`s of the folder's plan, decoding in TensorFlow's threads (Pillow
    for what TensorFlow does not decode as Pillow does), the training images augmented by `augment` (a
    `keras_vit.data.augment.Augment`; None: crop and flip only); validation is None without validation images.
    Files that cannot be read as scanned are recorded in `skipped` (a `SkippedFiles`; None: a new one) and
    replaced or left out as the `PyDataset` does (`keras_vit.data.folder_read`)."""
    import tensorflow as tf

    size = pair(image_size, "image_size")
    skipped = skipped if skipped is not None else SkippedFiles(folder.root)
    train = _tf_train(tf, folder, size, stream, image_dtype, augment or Augment(), skipped)
    if not folder.validation:
        return train, None
    return train, _tf_validation(tf, folder, size, stream, eval_batch_size, image_dtype, skipped)


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


def _tf_checked_box(tf, path, decoder, box, shape):
    """(the `box` (top, left, height, width) of the image at `path`, whether the file is whole and of the
    scanned `shape`): a JPEG's box through `tf_jpeg_box` (a cropped decode reads no further than the box, so
    a JPEG is whole when it ends with its end marker), another file decoded whole. A file that does not
    decode raises (`_tf_read_checked` puts back what the `PyDataset` reads in its place)."""
    def jpeg():
        data = tf.io.read_file(path)
        ok = tf.logical_and(tf.equal(tf.strings.substr(data, -2, 2), JPEG_END), tf.reduce_all(
            tf.equal(tf.cast(tf.image.extract_jpeg_shape(data)[:2], tf.int64), shape)))
        return tf_jpeg_box(tf, data, box, shape), ok

    def whole():
        image = _tf_decode(tf, path, decoder)
        ok = tf.reduce_all(tf.equal(tf.shape(image, out_type=tf.int64)[:2], shape))
        return tf.slice(image, tf.concat([box[:2], [0]], 0), tf.concat([box[2:], [3]], 0)), ok

    return tf.cond(tf.equal(decoder, TF_JPEG), jpeg, whole)


def _tf_read_checked(tf, ds, read, fallback):
    """The values of `read(*example)` for the elements `(k, example)` of `ds` (k = 0, 1, 2, ...: `enumerate`'s),
    in order, where `read` gives (*values, ok): an example whose `read` fails (an error while decoding) or
    is not ok is put back in its place by `fallback(ks)` (numpy: the values of the examples `ks`, stacked,
    as the `PyDataset` makes them). The examples are read `DECODE_GROUP` at a time, one after the other, two
    groups a core in parallel (one thread pool: a parallel read inside each group was slower): a group's
    failed reads are dropped (`ignore_errors`) and what is left comes as one batch, so a group is always one
    element whose gaps are found and filled at once, with no wait for a next good file and no step per
    example beyond the read."""
    def group(ks, examples):
        good = tf.data.Dataset.from_tensor_slices((ks, examples)).map(
            lambda k, example: (k, *(read(*example) if isinstance(example, tuple) else read(example)))
        ).ignore_errors().batch(DECODE_GROUP)
        none = tuple(tf.zeros([0, *spec.shape[1:]], spec.dtype) for spec in good.element_spec)  # all failed
        return good.concatenate(tf.data.Dataset.from_tensors(none)).take(1).map(lambda *read_ks: (ks, *read_ks))

    def fill(ks, read_ks, *values_ok):
        values, kept = values_ok[:-1], tf.boolean_mask(read_ks, values_ok[-1])

        def put_back():
            missing = tf.sparse.to_dense(tf.sets.difference(ks[None], kept[None]))[0]
            back = tf.numpy_function(fallback, [missing], tuple(v.dtype for v in values))
            order = tf.argsort(tf.concat([kept, missing], 0))
            return tuple(tf.gather(tf.concat([tf.boolean_mask(v, values_ok[-1]), tf.ensure_shape(b, v.shape)], 0),
                                   order) for v, b in zip(values, back))

        return tf.cond(tf.size(kept) < tf.size(ks), put_back, lambda: values)

    ds = ds.batch(DECODE_GROUP).interleave(group, cycle_length=2 * (os.cpu_count() or 1),
                                           num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    return ds.map(fill, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True).unbatch()


def _tf_pass_plan(folder, size, augment, plans, pass_index):
    """plan_pass's (order, boxes, flips) of a pass (`plans(pass_index)`) and `augment`'s draws for its
    positions (numpy)."""
    n = len(folder.train)
    return (*plans(pass_index), *augment.plan(folder.seed, pass_index, range(n), *size))


def _tf_train(tf, folder, size, stream, image_dtype, augment, skipped):
    """The training batches: passes over the folder's training images in plan_pass's order, crops and
    flips (and `augment`'s augmentations), from image `stream.start` on, this process's rows of each batch;
    an example whose file is skipped made as the `PyDataset` makes it (`keras_vit.data.folder_read`)."""
    autotune = tf.data.AUTOTUNE
    n = len(folder.train)
    paths, labels, decoders, shapes = _tf_tables(tf, folder.root, folder.train)
    first_pass, offset = divmod(stream.start, n)
    plans = pass_plans(folder, augment.aug_repeats, keep=2)
    where = (stream.batch_size, stream.process_index, stream.process_count)

    def one_pass(pass_index):
        plan = tf.numpy_function(lambda p: _tf_pass_plan(folder, size, augment, plans, int(p)), [pass_index],
                                 (tf.int64, tf.int64, tf.bool, *(tf.as_dtype(d) for d in PLAN_DTYPES)),
                                 stateful=False)
        shapes = ((None,), (None, 4), (None,), *augment.plan_shapes)
        ds = tf.data.Dataset.from_tensor_slices(tuple(tf.ensure_shape(a, s) for a, s in zip(plan, shapes)))
        return ds.skip(tf.where(pass_index == first_pass, tf.constant(offset, tf.int64), 0))

    def train_map(index, box, flip, *draws):
        crop, ok = _tf_checked_box(tf, paths[index], decoders[index], box, shapes[index])
        image = tf.image.resize(crop, size, "bilinear")
        image = tf.cond(flip, lambda: tf.reverse(image, [1]), lambda: image)
        image.set_shape([*size, 3])
        return augment.finish_tensor(tf, image, image_dtype, *draws), labels[index], ok

    def put_back(ks):
        items = [_train_item(folder, size, image_dtype, augment, plans, skipped,
                             stream.start + this_process_example(int(k), *where)) for k in ks]
        return np.stack([i[0] for i in items]).astype(image_dtype), np.asarray([i[1] for i in items], np.int32)

    last = 2**62 if stream.repeat else first_pass + 1
    train = tf.data.Dataset.range(first_pass, last).flat_map(one_pass)
    train = this_process(train, *where).enumerate()
    train = _tf_read_checked(tf, train, train_map, put_back)
    train = train.batch(stream.rows, drop_remainder=stream.drop_remainder)
    count = stream.num_batches(n)
    return train.apply(tf.data.experimental.assert_cardinality(
        tf.data.INFINITE_CARDINALITY if count is None else count)).prefetch(autotune)


def _tf_validation(tf, folder, size, stream, eval_batch_size, image_dtype, skipped):
    """The validation batches: the folder's validation images resized whole, this process's rows of each,
    those whose files are skipped left out."""
    autotune = tf.data.AUTOTUNE
    paths_v, labels_v, decoders_v, shapes_v = _tf_tables(tf, folder.root, folder.validation)
    where = (eval_batch_size, stream.process_index, stream.process_count)

    def eval_map(index):
        image = _tf_decode(tf, paths_v[index], decoders_v[index])
        ok = tf.reduce_all(tf.equal(tf.shape(image, out_type=tf.int64)[:2], shapes_v[index]))
        image = tf.image.resize(image, size, "bilinear")
        image.set_shape([*size, 3])
        return finish_tensor(tf, image, image_dtype), labels_v[index], True, ok

    def put_back(ks):
        items = [_eval_item(folder, size, image_dtype, skipped, this_process_example(int(k), *where)) for k in ks]
        blank = (np.zeros((*size, 3), image_dtype), -1)
        images, labels = zip(*(blank if item is None else item for item in items))
        return (np.stack(images).astype(image_dtype), np.asarray(labels, np.int32),
                np.asarray([item is not None for item in items]))

    validation = this_process(tf.data.Dataset.range(len(folder.validation)), *where).enumerate()
    validation = _tf_read_checked(tf, validation, eval_map, put_back)
    validation = validation.batch(eval_batch_size // stream.process_count)
    validation = validation.map(lambda images, labels, kept: (tf.boolean_mask(images, kept),
                                                              tf.boolean_mask(labels, kept)))
    count = _validation_batches(len(folder.validation), eval_batch_size, stream)
    return validation.apply(tf.data.experimental.assert_cardinality(count)).prefetch(autotune)


def tensorflow_available():
    """True when TensorFlow imports (the tf.data pipeline); False sends `pipeline="auto"` to the PyDataset."""
    from keras_vit.startup import import_quietly

    try:
        import_quietly("tensorflow")  # its start-up notes held back on the JAX and torch backends
    except ImportError:
        return False
    return True
