"""A NaFlex feed (NaViT, SigLIP 2, timm's `naflexvit_*`): each image keeps its aspect ratio and as much
of its resolution as a token budget allows, and becomes a sequence of patches with their (row, col)
coordinates, padded to the batch's length, with a validity mask:

    {"patches": (B, N, P * P * 3) float32, "patch_coord": (B, N, 2) int32 (row, col), "patch_valid": (B, N) bool}

    from keras_vit.data import naflex_feed
    plan = naflex_feed.NaFlexPlan(patch_size=16)                       # timm's buckets and budget
    train = naflex_feed.tf_dataset(tfds.load("cifar10", split="train", as_supervised=True), plan)
    test = naflex_feed.tf_dataset(tfds.load("cifar10", split="test", as_supervised=True), plan,
                                  training=False)
    model.fit(train, steps_per_epoch=plan.steps_per_epoch(50_000), epochs=..., validation_data=test)

    train, validation = naflex_feed.folder_batches("photos", plan)      # photos/<class>/*.jpg, any backend

The size rule (`naflex_grid`) is timm's `get_image_size_for_seq`: the largest scale, found by bisection,
at which the image's patch grid `ceil(h * s / P) x ceil(w * s / P)` fits the budget. Each image is
resized to that grid (`patchify`: bilinear with antialiasing) and cut into patches, row-major over the
grid, each flattened (P, P, 3) with the channels fastest (timm's and Hugging Face's layout); padding
patches are zero, at coordinate (0, 0), and not valid.

Batches are bucketed by sequence length (`NaFlexPlan`): a batch of sequence length L holds
`max_tokens_per_batch // L` images, each resized to fit L tokens. In training each batch's L is drawn
from `seq_lens` with a seeded generator (as timm's `NaFlexMapDatasetWrapper` does), in evaluation it is
`eval_seq_len`. Every batch of one L has the same shapes, so a jitted step (JAX, TensorFlow with XLA)
compiles once per bucket. Two feeds follow the plan: `tf_dataset` (a `tf.data.Dataset` of
(image, label), as TFDS gives) and `NaFlexBatches` (a `keras.utils.PyDataset` of numpy images, or of an
image folder through `folder_batches`; no TensorFlow needed).
"""

import os

import keras
import numpy as np

from keras_vit.data.augment import PYTHON_NAMES
from keras_vit.data.folder import ImageFolder, scan
from keras_vit.data.folder_read import SkippedFiles, read_or_skip, substitute
from keras_vit.data.naflex_plan import (
    EVAL_SEQ_LEN,
    MAX_TOKENS_PER_BATCH,
    SEQ_LENS,
    EpochPlan,
    NaFlexPlan,
)
from keras_vit.data.naflex_sequence import (
    check_image,
    check_scaling,
    cut,
    image_sequence,
    naflex_grid,
    patchify,
    stack_batch,
    whole,
)
from keras_vit.preprocessing import NORMALIZATIONS

# the feed's names with the plan's and the sequence's: `naflex_feed.NaFlexPlan`, `naflex_feed.patchify`
__all__ = ["SEQ_LENS", "MAX_TOKENS_PER_BATCH", "EVAL_SEQ_LEN", "naflex_grid", "patchify", "cut", "NaFlexPlan",
           "EpochPlan", "tf_dataset", "NaFlexBatches", "folder_batches"]


def _tf_sequence(tf, patch, mode, image_dtype):
    """(image, seq_len, flip or None) -> the NaFlex dict of one image, in TensorFlow ops (the grid by
    `naflex_grid` in numpy, the resize by `tf.image.resize(antialias=True)`)."""
    mean, std = (np.asarray(v, np.float32) * np.float32(255) for v in NORMALIZATIONS[mode])

    def grid(height, width, seq_len):
        return np.asarray(naflex_grid(int(height), int(width), patch, int(seq_len)), np.int32)

    def sequence(image, seq_len, flip):
        if image.dtype == tf.string:
            image = tf.io.decode_image(image, channels=3, expand_animations=False)
        image = tf.ensure_shape(image, [None, None, 3])
        shape = tf.shape(image)
        rows_cols = tf.numpy_function(grid, [shape[0], shape[1], seq_len], tf.int32, stateful=False)
        rows, cols = rows_cols[0], rows_cols[1]
        resized = tf.image.resize(image, tf.stack([rows * patch, cols * patch]), "bilinear", antialias=True)
        if flip is not None:  # None: never flipped (evaluation)
            resized = tf.cond(flip, lambda: tf.reverse(resized, [1]), lambda: resized)
        if image_dtype == "uint8":
            pixels = tf.cast(tf.round(tf.clip_by_value(resized, 0.0, 255.0)), tf.uint8)
        else:
            pixels = (tf.cast(resized, tf.float32) - mean) / std
        count = rows * cols
        patches = tf.reshape(tf.transpose(tf.reshape(pixels, [rows, patch, cols, patch, 3]), [0, 2, 1, 3, 4]),
                             [count, patch * patch * 3])
        position = tf.range(seq_len, dtype=tf.int32)
        valid = position < count
        coord = tf.where(valid[:, None], tf.stack([position // cols, position % cols], axis=-1), 0)
        patches = tf.pad(patches, [[0, seq_len - count], [0, 0]])
        length = seq_len if isinstance(seq_len, int) else None  # evaluation's one length: static
        patches.set_shape([length, patch * patch * 3])
        coord.set_shape([length, 2])
        valid.set_shape([length])
        return {"patches": patches, "patch_coord": coord, "patch_valid": valid}

    return sequence


def _check_source(tf, dataset):
    spec = dataset.element_spec
    if not (isinstance(spec, tuple) and len(spec) == 2 and isinstance(spec[0], tf.TensorSpec)):
        raise ValueError(f"expected a tf.data.Dataset of (image, label) pairs; got elements {spec}")
    image = spec[0]
    if image.dtype == tf.string and image.shape.rank in (0, None):
        return
    if image.shape.rank not in (3, None) or (image.shape.rank == 3 and image.shape[-1] not in (3, None)):
        raise ValueError(f"expected (height, width, 3) images (or encoded image strings) in the dataset; "
                         f"got images of {image}")


def _count(tf, dataset, num_images):
    if num_images is not None:
        return whole(num_images, "num_images")
    count = int(dataset.cardinality())
    if count < 0:  # unknown: count once
        count = int(dataset.reduce(np.int64(0), lambda n, _: n + 1))
    if count == 0:
        raise ValueError("the dataset holds no images")
    return count


def _label(tf, label):
    return tf.cast(label, tf.int32) if label.dtype.is_integer else label


def tf_dataset(dataset, plan, training=True, *, num_images=None, shuffle_buffer=10_000, repeat=True,
               mode="vit", image_dtype="float32"):
    """A `tf.data.Dataset` of NaFlex batches `({"patches", "patch_coord", "patch_valid"}, labels)` from
    a dataset of (image, label) pairs, following `plan` (see `NaFlexPlan`).

    Images are (H, W, 3) uint8 of any size (`tfds.load(..., as_supervised=True)`) or encoded image
    strings (decoded here). Training passes shuffle the images with a buffer seeded by (plan.seed,
    pass), take each batch's sequence length and each position's flip from `plan.epoch`, and repeat
    the pass's first images to fill its last batch. Batches of one sequence length L all have the
    shapes (batch_size(L), L, ...): as many distinct shapes as buckets (the element spec leaves the
    batch and sequence axes unknown, the patch axis is P * P * 3). Evaluation batches hold
    `plan.eval_batch_size` images of `plan.eval_seq_len` tokens, in the dataset's order. Integer labels
    become int32.

    Args:
        dataset: a `tf.data.Dataset` of (image, label).
        plan: a `NaFlexPlan`.
        training: the training stream (buckets, shuffle, flips) or the evaluation one.
        num_images: images in the dataset; default its cardinality (counted once when unknown).
        shuffle_buffer: the shuffle buffer of a training pass (1: the dataset's order).
        repeat: training passes one after another forever (give `model.fit` `steps_per_epoch=
            plan.steps_per_epoch(num_images)`); False: one pass.
        mode, image_dtype: the scaling of the patches, as in `patchify`.

    Returns:
        The `tf.data.Dataset`.

    Raises:
        ValueError: elements that are not (image, label) pairs of (H, W, 3) or encoded images, an
            empty dataset, bad arguments.
    """
    import tensorflow as tf

    check_scaling(mode, image_dtype)
    if not isinstance(plan, NaFlexPlan):
        raise ValueError(f"plan must be a NaFlexPlan; got {type(plan).__name__}")
    _check_source(tf, dataset)
    sequence = _tf_sequence(tf, plan.patch_size, mode, image_dtype)
    if not training:
        ds = dataset.map(lambda image, label: (sequence(image, plan.eval_seq_len, None), _label(tf, label)),
                         num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
        return ds.batch(plan.eval_batch_size).prefetch(tf.data.AUTOTUNE)
    shuffle_buffer = whole(shuffle_buffer, "shuffle_buffer")
    count = _count(tf, dataset, num_images)
    stream = _tf_training_stream(tf, dataset, plan, count, shuffle_buffer, repeat)
    stream = stream.map(lambda example, key, seq_len, flip: (key, sequence(example[0], seq_len, flip),
                                                             _label(tf, example[1])),
                        num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    stream = _tf_group(tf, stream, plan)
    cardinality = tf.data.INFINITE_CARDINALITY if repeat else plan.steps_per_epoch(count)
    return stream.apply(tf.data.experimental.assert_cardinality(cardinality)).prefetch(tf.data.AUTOTUNE)


def _tf_training_stream(tf, dataset, plan, count, shuffle_buffer, repeat):
    """(example, batch key, seq_len, flip) of every position of the training passes; the key is unique
    per batch and ends in the index of its bucket (key % len(plan.seq_lens))."""
    buckets = len(plan.seq_lens)
    seed = tf.constant(plan.seed, tf.int64)

    def tags(epoch):
        epoch = int(epoch)
        pass_plan = plan.epoch(count, epoch)
        batch = np.repeat(np.arange(len(pass_plan.seq_lens)), np.diff(pass_plan.starts))
        lengths = pass_plan.seq_lens[batch]
        keys = (epoch * (len(pass_plan.seq_lens) + 1) + batch) * buckets + np.searchsorted(plan.seq_lens, lengths)
        return keys.astype(np.int64), lengths.astype(np.int32), pass_plan.flips

    def one_pass(epoch):
        examples = dataset
        if shuffle_buffer > 1:
            # traced into its own graph: its seed (a copy of a global one) cleared, so the order depends
            # on plan.seed and the pass only (as keras_vit.data.load does)
            tf.compat.v1.get_default_graph().seed = None
            examples = examples.shuffle(shuffle_buffer, seed=seed * 1_000_003 + epoch, reshuffle_each_iteration=False)
        keys, lengths, flips = tf.numpy_function(tags, [epoch], (tf.int64, tf.int32, tf.bool), stateful=False)
        positions = tf.data.Dataset.from_tensor_slices((keys, lengths, flips))
        examples = examples.repeat().take(tf.shape(keys, out_type=tf.int64)[0])
        return tf.data.Dataset.zip((examples, positions)).map(lambda example, tag: (example, *tag))

    return tf.data.Dataset.range(0, 2**62 if repeat else 1).flat_map(one_pass)


def _tf_group(tf, stream, plan):
    """The (key, sequence, label) stream batched: consecutive positions of one key are one batch."""
    sizes = tf.constant(plan.batch_sizes, tf.int64)
    buckets = len(plan.seq_lens)

    def window_size(key):
        return tf.gather(sizes, key % buckets)

    def batch(key, window):
        return window.batch(window_size(key)).map(lambda _, inputs, labels: (inputs, labels))

    return stream.group_by_window(lambda key, inputs, labels: key, batch, window_size_func=window_size)


class NaFlexBatches(keras.utils.PyDataset):
    """NaFlex batches `({"patches", "patch_coord", "patch_valid"}, labels)` of numpy images, following
    `plan` (see `NaFlexPlan`), as a `keras.utils.PyDataset`: every backend, no TensorFlow needed.

    In training, batch k of the current pass is `plan.epoch(len(images), self.epoch)`'s k-th: its
    sequence length, its images and their flips; `on_epoch_end` (called by `model.fit`) moves to the
    next pass. With `repeat=True` the training stream is endless instead, passes one after another
    from `epoch` on, its batch k being batch `skip_batches + k` of that stream, whatever `model.fit`'s
    `steps_per_epoch` (an epoch of fit need not be a pass, and a resumed run skips the batches it
    trained on). Give `model.fit` `shuffle=False` for batches in the plan's order (Keras otherwise
    shuffles the order of the batches of a PyDataset; their content stays the plan's). In evaluation
    the batches hold `plan.eval_batch_size` images in order, `plan.eval_seq_len` tokens each. Integer
    labels become int32.

    Args:
        images: a sequence of (H, W, 3) uint8 or float [0, 255] images of any sizes (a list of arrays,
            or any object with `len()` and indexing, e.g. one reading files as it is indexed).
        labels: one label per image.
        plan: a `NaFlexPlan`.
        training: the training stream or the evaluation one.
        epoch: the training pass to start with.
        repeat: an endless training stream (`model.fit` then needs `steps_per_epoch`); False: one
            pass, `len()` batches.
        skip_batches: with `repeat`, the batches of the stream to skip (a resumed run's done steps).
        mode, image_dtype: the scaling of the patches, as in `patchify`.
        workers, use_multiprocessing, max_queue_size: as `keras.utils.PyDataset`'s (threads by default).

    Raises:
        ValueError: no images, a different number of labels, bad arguments; an image that is not
            (H, W, 3) numbers when its batch is made.
    """

    def __init__(self, images, labels, plan, training=True, *, epoch=0, repeat=False, skip_batches=0, mode="vit",
                 image_dtype="float32", workers=1, use_multiprocessing=False, max_queue_size=10):
        super().__init__(workers=workers, use_multiprocessing=use_multiprocessing, max_queue_size=max_queue_size)
        check_scaling(mode, image_dtype)
        if not isinstance(plan, NaFlexPlan):
            raise ValueError(f"plan must be a NaFlexPlan; got {type(plan).__name__}")
        if not len(images):
            raise ValueError("NaFlexBatches needs at least one image; got none")
        if len(labels) != len(images):
            raise ValueError(f"expected one label per image: {len(images)} images, {len(labels)} labels")
        self.images, self.labels, self.plan, self.training = images, labels, plan, bool(training)
        self.epoch = whole(epoch, "epoch", 0)
        self.repeat, self.skip_batches = bool(repeat), whole(skip_batches, "skip_batches", 0)
        if (self.repeat or self.skip_batches) and not (self.training and self.repeat):
            raise ValueError(f"repeat and skip_batches are for an endless training stream (training=True, "
                             f"repeat=True); got training={training}, repeat={repeat}, skip_batches={skip_batches}")
        self.mode, self.image_dtype = mode, image_dtype

    @property
    def num_batches(self):  # None: endless (Keras' PyDataset protocol)
        return None if self.repeat else len(self)

    def __len__(self):
        if self.repeat:
            raise TypeError("an endless (repeat=True) NaFlex stream has no length; give fit steps_per_epoch")
        if self.training:
            return self.plan.steps_per_epoch(len(self.images))
        return -(-len(self.images) // self.plan.eval_batch_size)

    def _locate(self, index):
        """(the training pass, the batch in it) of batch `index` (of the endless stream with `repeat`)."""
        if self.repeat:
            if index < 0:
                raise IndexError(f"batch {index} of an endless stream")
            return divmod(self.skip_batches + index, self.plan.steps_per_epoch(len(self.images)))
        if not 0 <= index < len(self):
            raise IndexError(f"batch {index} of {len(self)}")
        return 0, index

    def batch_plan(self, index):
        """(seq_len, image indices, flips) of batch `index` of the current pass (of the endless stream
        with `repeat`)."""
        passes, index = self._locate(index)
        if not self.training:
            size = self.plan.eval_batch_size
            rows = np.arange(index * size, min(len(self.images), (index + 1) * size))
            return self.plan.eval_seq_len, rows, np.zeros(len(rows), bool)
        epoch = self.plan.epoch(len(self.images), self.epoch + passes)
        positions = slice(epoch.starts[index], epoch.starts[index + 1])
        return int(epoch.seq_lens[index]), epoch.order[positions], epoch.flips[positions]

    def __getitem__(self, index):
        seq_len, rows, flips = self.batch_plan(index)
        sequences, labels = [], []
        for j, (row, flip) in enumerate(zip(rows, flips)):
            image = self.images[row]
            if image is None and not self.training:  # a folder's file that cannot be read now: left out
                continue
            if image is None:  # ... or, in training, the next readable file of the pass takes its place
                passes, batch = self._locate(index)
                epoch = self.plan.epoch(len(self.images), self.epoch + passes)
                row, image = substitute(epoch.order, epoch.starts[batch] + j, self.images.__getitem__,
                                        self.images.folder, self.images.skipped)
            image = check_image(image)
            grid = naflex_grid(image.shape[0], image.shape[1], self.plan.patch_size, seq_len)
            sequences.append(image_sequence(image, self.plan.patch_size, grid, seq_len, flip, self.mode, self.image_dtype))
            labels.append(self.labels[row])
        if not sequences:  # every image of a validation batch left out
            patch = self.plan.patch_size
            blank = image_sequence(np.zeros((patch, patch, 3), np.uint8), patch, naflex_grid(patch, patch, patch, 1),
                                   seq_len, False, self.mode, self.image_dtype)
            return {key: value[None][:0] for key, value in blank.items()}, np.zeros(0, np.int32)
        return stack_batch(sequences, labels)

    def on_epoch_end(self):
        """Moves a training stream of one pass to its next pass (`model.fit` calls it after each epoch;
        an endless stream counts its batches instead)."""
        if self.training and not self.repeat:
            self.epoch += 1


class _FolderImages:
    """The images of `ImageFolder` records, read from disk as they are indexed; None for a file that cannot
    be read as it was scanned, recorded in `skipped` (a `SkippedFiles`; `keras_vit.data.folder_read`)."""

    def __init__(self, folder, records, skipped):
        self.folder, self.records, self.skipped = folder, records, skipped

    def __len__(self):
        return len(self.records)

    def __getitem__(self, index):
        return read_or_skip(self.folder.root, self.records[index], self.skipped)


def folder_batches(directory, plan, validation_split=0.1, *, mode="vit", image_dtype="float32", workers=None,
                   repeat=False, skip_batches=0, **scan_options):
    """(train, validation) `NaFlexBatches` of a folder of your own images (`photos/<class>/*.jpg`, or
    a `labels.csv`; see `keras_vit.data.from_directory`), read from disk as batches are made.

    A file that cannot be read when its batch is made (truncated or corrupt, which a header scan does not
    find, removed or resized since the scan) is skipped as `from_directory` skips it: named once in the log
    and listed in ``skipped_files``; a training image takes the next readable file of its pass in its place
    (with the flip of its position and its own label), a validation image is left out of its batch.

    Args:
        directory: the folder, or an `ImageFolder` already scanned (`keras_vit.scan`).
        plan: a `NaFlexPlan`; its seed also splits the folder.
        validation_split: fraction of each class held out for validation (0: no validation).
        mode, image_dtype: the scaling of the patches, as in `patchify`.
        workers: threads reading and resizing images (default: the machine's cores).
        repeat, skip_batches: the training stream endless, from this batch on (see `NaFlexBatches`).
        **scan_options: `keras_vit.scan`'s keyword options (labels_csv, strict,
            max_pixels, threads, verbose, verify, cache). `from_directory`'s augmentations (auto_augment,
            re_prob, re_mode, re_count, aug_repeats) are refused by name: NaFlex images are flipped only.

    Returns:
        (train, validation): `NaFlexBatches` with `class_names`, `image_folder` and `skipped_files` (a
        `keras_vit.data.folder_read.SkippedFiles` both share) attributes; validation is None without
        validation images.

    Raises:
        ValueError: what `keras_vit.scan` raises, or bad arguments.
    """
    if not isinstance(plan, NaFlexPlan):
        raise ValueError(f"plan must be a NaFlexPlan; got {type(plan).__name__}")
    refused = [k for k in PYTHON_NAMES if k in scan_options]
    if refused:
        raise ValueError(f"the NaFlex feed does not run {', '.join(PYTHON_NAMES[k] for k in refused)}: these are "
                         "augmentations of keras_vit.data.from_directory's square images; NaFlex training images are "
                         "flipped only (leave them out, or train on square images)")
    folder = directory if isinstance(directory, ImageFolder) else scan(
        directory, validation_split, int(plan.seed), **scan_options)
    workers = workers or os.cpu_count() or 1
    out, skipped = [], SkippedFiles(folder.root)
    for records, training in ((folder.train, True), (folder.validation, False)):
        if not records:
            out.append(None)
            continue
        stream = {"repeat": repeat, "skip_batches": skip_batches} if training else {}
        batches = NaFlexBatches(_FolderImages(folder, records, skipped), [r[1] for r in records], plan, training,
                                mode=mode, image_dtype=image_dtype, workers=workers, **stream)
        batches.class_names, batches.image_folder, batches.skipped_files = folder.class_names, folder, skipped
        out.append(batches)
    return tuple(out)
