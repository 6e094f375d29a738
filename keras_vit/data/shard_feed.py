"""Tar shards as batches for `model.fit`: `from_shards` (the entry point), through tf.data (`from_generator`
reads, TensorFlow's threads decode) or a `keras.utils.PyDataset` without TensorFlow (its threads decode).

Both follow the shards' plan (`keras_vit.data.shards`) and give the same batches, as the folder feed's two
pipelines do: the same order, crops and flips, JPEGs decoded as Pillow decodes them, resized as
`tf.image.resize` does. Each process reads its samples in one sequential pass over its shards (the
samples' bytes in a shuffle buffer of at most `shuffle_buffer`); the workers share that stream and split the
decoding, so the batches do not depend on their number.

A training stream runs timm's augmentations as the folder feed does (`keras_vit.data.augment.Augment`:
RandAugment, random erasing), each sample's draws from ``position_rng(seed, pass, sample, stream)``: keyed on
the sample's number in the set (as its crop and flip are), not on its place in a process's stream, so the
processes that read their own shards draw apart. Repeated augmentation is refused: a streamed pass reads each
sample once.
"""

import dataclasses
import itertools
import os
import threading

import numpy as np

from keras_vit.configs import pair
from keras_vit.data.augment import PLAN_DTYPES, PYTHON_NAMES, Augment
from keras_vit.data.folder import TF_JPEG, TF_PNG
from keras_vit.data.folder_feed import PIPELINES, tensorflow_available, tf_jpeg_box
from keras_vit.data.preprocess import check_image_dtype, resize_bilinear
from keras_vit.data.shards import (
    ShardSet,
    crop_and_flip,
    decode,
    image_size_of,
    open_shards,
    pass_order,
    pass_shards,
    samples,
)
from keras_vit.data.stream import check_stream, positive_int
from keras_vit.extras import require

# examples the tf.data pipeline's generator yields at a time
TF_CHUNK = 64
# how several processes share a stream (`from_shards`' per_process)
PER_PROCESS = ("shards", "rows")


@dataclasses.dataclass(frozen=True)
class ShardPlan:
    """What one process streams: its shards each pass (all of them when `by_shard` is False), their order
    through the buffer, and which rows of each global batch are its own (`per_process`: see `from_shards`)."""

    shard_set: object
    seed: int
    shuffle_buffer: int
    training: bool
    batch_size: int
    process_index: int = 0
    process_count: int = 1
    per_process: str = "shards"

    @property
    def by_shard(self):
        """Each process its own shards (asked for, and enough of them), else every process reads all and takes
        its rows."""
        return (self.per_process == "shards" and self.process_count > 1
                and len(self.shard_set.paths) >= self.process_count)

    @property
    def rows(self):
        return self.batch_size // self.process_count

    def shards(self, pass_index, process_index=None):
        index = self.process_index if process_index is None else process_index
        if self.by_shard:
            return pass_shards(self.shard_set, self.seed, pass_index, index, self.process_count, self.training)
        return pass_shards(self.shard_set, self.seed, pass_index, shuffle=self.training)

    def pass_length(self, pass_index, process_index=None):
        return int(sum(self.shard_set.counts[s] for s in self.shards(pass_index, process_index)))

    def order(self, pass_index):
        return pass_order(self.shard_set, self.shards(pass_index), self.seed, pass_index,
                          self.shuffle_buffer if self.training else 1)


def _read(plan, shards, wanted):
    """(sample number, bytes, kind, label) of the samples of `shards` in order, of the shards holding a
    sample in `wanted` (a boolean array over the set's samples) only."""
    shard_set, offsets = plan.shard_set, plan.shard_set.offsets
    truncated = {path for path, _, _ in shard_set.skipped}
    for s in shards:
        first, count, path = int(offsets[s]), shard_set.counts[s], shard_set.paths[s]
        if not wanted[first:first + count].any():
            continue
        got = 0
        for got, (_, data, kind, label) in enumerate(itertools.islice(
                samples(path, shard_set.class_names, truncated_ok=path in truncated), count), 1):
            yield first + got - 1, data, kind, label
        if got < count:
            raise ValueError(f"shard {path} holds {got} samples, its info file says {count}: rewrite the shard "
                             "or its info file")


def _one_pass(plan, pass_index, start):
    """(bytes, kind, label, pass, sample) of the pass's samples from position `start` on, in the plan's
    order; the bytes of the samples read but not yet due wait in a buffer of at most `shuffle_buffer`."""
    order = plan.order(pass_index)
    position = np.full(len(plan.shard_set), -1, np.int64)
    position[order] = np.arange(len(order))
    wanted = position >= start
    reader, pending = _read(plan, plan.shards(pass_index), wanted), {}
    for sample in order[start:].tolist():
        while sample not in pending:
            number, data, kind, label = next(reader)
            if wanted[number]:
                pending[number] = (data, kind, label)
        yield (*pending.pop(sample), pass_index, sample)


def raw_examples(plan, skip_batches=0, repeat=True):
    """This process's examples from batch `skip_batches` on: (bytes, kind, label, crop box, flip, pass,
    sample), each batch's `plan.rows` in a row; one pass without `repeat`."""
    start = skip_batches * (plan.rows if plan.by_shard else plan.batch_size)
    pass_index = 0
    while repeat and start >= plan.pass_length(pass_index):
        start -= plan.pass_length(pass_index)
        pass_index += 1
    position = skip_batches * plan.batch_size  # in the whole stream, across passes (rows of global batches)
    while True:
        for data, kind, label, p, sample in _one_pass(plan, pass_index, start):
            mine = plan.by_shard or (position % plan.batch_size) // plan.rows == plan.process_index
            position += 1
            if not mine:
                continue
            height, width = image_size_of(data, kind)
            if plan.training:
                box, flip = crop_and_flip(plan.seed, p, sample, height, width)
            else:
                box, flip = np.asarray([0, 0, height, width], np.int64), False
            yield data, kind, label, box, flip, p, sample
        if not repeat:
            return
        pass_index, start = pass_index + 1, 0


def num_batches(plan, skip_batches, repeat, drop_remainder):
    """Batches of one pass from `skip_batches` on (None when repeating): with each process its own shards,
    the fewest of any process, so that every process gives as many."""
    if repeat:
        return None
    if plan.by_shard:
        return min(plan.pass_length(0, i) // plan.rows for i in range(plan.process_count)) - skip_batches
    left = plan.pass_length(0) - skip_batches * plan.batch_size
    return left // plan.batch_size if drop_remainder else -(-left // plan.batch_size)


def finish_example(example, plan, size, image_dtype, augment):
    """One raw example (`raw_examples`' tuple) of `plan` as the pipelines give it, in numpy: decoded, cropped
    to its box, resized, flipped, augmented by `augment` (its draws from the plan's seed, the pass and the
    sample)."""
    data, kind, _, box, flip, pass_index, sample = example
    top, left, h, w = (int(v) for v in box)
    image = resize_bilinear(decode(data, kind)[top:top + h, left:left + w], size)
    return augment.finish_image(image[:, ::-1] if flip else image, image_dtype, plan.seed, pass_index, sample)


class _Shared:
    """One sequential stream shared by threads: `get(i)` is its item `i`, in any order (items read ahead wait
    here); an item asked again after it was given (Keras asks for batch 0 twice) restarts the stream."""

    def __init__(self, start):
        self.start, self.lock = start, threading.Lock()
        self._restart()

    def _restart(self):
        self.items, self.waiting, self.next = self.start(), {}, 0

    def get(self, i):
        with self.lock:
            if i < self.next and i not in self.waiting:
                self._restart()
            while i not in self.waiting:
                self.waiting[self.next] = next(self.items)
                self.next += 1
            return self.waiting.pop(i)


def pydataset(plan, size, image_dtype, skip_batches, repeat, drop_remainder, workers, augment):
    """The `keras.utils.PyDataset` of `plan`: batches of (images, int32 labels) numpy arrays, the images
    augmented by `augment` (an `Augment`)."""
    import keras

    count = num_batches(plan, skip_batches, repeat, drop_remainder)
    shared = _Shared(lambda: raw_examples(plan, skip_batches, repeat))
    rows = plan.rows

    class ShardBatches(keras.utils.PyDataset):
        def __init__(self):
            workers_ = workers or os.cpu_count() or 1
            super().__init__(workers=workers_, use_multiprocessing=False, max_queue_size=max(4, 2 * workers_))

        @property
        def num_batches(self):  # None: endless (fit needs steps_per_epoch)
            return count

        def __len__(self):
            if count is None:
                raise TypeError("an endless (repeat=True) shard stream has no length; give fit steps_per_epoch")
            return count

        def __getitem__(self, index):
            if count is not None and not 0 <= index < count:
                raise IndexError(f"batch {index} of {count}")
            images, labels = [], []
            for i in range(index * rows, (index + 1) * rows):
                try:
                    example = shared.get(i)
                except StopIteration:  # the last, short batch of a single pass
                    break
                images.append(finish_example(example, plan, size, image_dtype, augment))
                labels.append(example[2])
            return np.stack(images), np.asarray(labels, np.int32)

    return ShardBatches()


def _tf_decode_box(tf, data, kind, box):
    """The `box` (top, left, height, width) of an image member as `decode` and a crop give it (a JPEG
    through the folder feed's `tf_jpeg_box`)."""
    def jpeg():
        return tf_jpeg_box(tf, data, box, tf.cast(tf.image.extract_jpeg_shape(data)[:2], tf.int64))

    def pillow():
        image = tf.numpy_function(lambda d, k: decode(d, int(k)), [data, kind], tf.uint8, stateful=False)
        return tf.ensure_shape(image, [None, None, 3])

    def other():
        image = tf.cond(tf.equal(kind, TF_PNG), lambda: tf.io.decode_png(data, channels=3), pillow)
        return tf.slice(image, tf.concat([box[:2], [0]], 0), tf.concat([box[2:], [3]], 0))

    return tf.cond(tf.equal(kind, TF_JPEG), jpeg, other)


def _draws(plan, size, augment, passes, numbers, kept):
    """`augment`'s draws (`Augment.plan`'s arrays, those numbered `kept`) of the examples of a chunk, each from
    its (pass, sample)."""
    if not kept:  # no augmentation: nothing to draw
        return ()
    rows = [augment.plan(plan.seed, int(p), [int(j)], *size) for p, j in zip(passes, numbers)]
    return tuple(np.concatenate(column).astype(PLAN_DTYPES[i]) for i, column in enumerate(zip(*rows)) if i in kept)


def tf_dataset(plan, size, image_dtype, skip_batches, repeat, drop_remainder, augment):
    """The `tf.data.Dataset` of `plan`: read by a Python generator, decoded in TensorFlow's threads, the
    images augmented by `augment` (an `Augment`; its draws made in the generator, its ops in the map)."""
    import tensorflow as tf

    # the draws' arrays without a zero-sized dimension (an augmentation left out): from_generator crashes on those
    shapes = augment.plan_shapes
    kept = [i for i, shape in enumerate(shapes) if 0 not in shape[1:]]
    signature = (tf.TensorSpec((None,), tf.string), tf.TensorSpec((None,), tf.int32),
                 tf.TensorSpec((None,), tf.int32), tf.TensorSpec((None, 4), tf.int64), tf.TensorSpec((None,), tf.bool),
                 *(tf.TensorSpec(shapes[i], PLAN_DTYPES[i]) for i in kept))

    def chunks():  # TF_CHUNK examples a call of the generator: its per-element cost would bound the feed
        examples = raw_examples(plan, skip_batches, repeat)
        while chunk := list(itertools.islice(examples, TF_CHUNK)):
            data, kinds, labels, boxes, flips, passes, numbers = zip(*chunk)
            yield (np.asarray(data, object), np.asarray(kinds, np.int32), np.asarray(labels, np.int32),
                   np.stack(boxes).astype(np.int64), np.asarray(flips, bool),
                   *_draws(plan, size, augment, passes, numbers, kept))

    ds = tf.data.Dataset.from_generator(chunks, output_signature=signature).unbatch()

    def finish_map(data, kind, label, box, flip, *given):
        given = dict(zip(kept, given))
        draws = [given[i] if i in given else tf.zeros(shape[1:], PLAN_DTYPES[i]) for i, shape in enumerate(shapes)]
        image = tf.image.resize(_tf_decode_box(tf, data, kind, box), size, "bilinear")
        image = tf.cond(flip, lambda: tf.reverse(image, [1]), lambda: image)
        image.set_shape([*size, 3])
        return augment.finish_tensor(tf, image, image_dtype, *draws), label

    ds = ds.map(finish_map, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    ds = ds.batch(plan.rows, drop_remainder=drop_remainder)
    count = num_batches(plan, skip_batches, repeat, drop_remainder)
    if count is not None:
        ds = ds.take(count)
    return ds.apply(tf.data.experimental.assert_cardinality(
        tf.data.INFINITE_CARDINALITY if count is None else count)).prefetch(tf.data.AUTOTUNE)


def check_augment(augment, training, names=PYTHON_NAMES):
    """`augment` (an `Augment`) if a shard stream can run it: refuses repeated augmentation, and any
    augmentation of an evaluation stream (`training` False), the options named as `names` spells them."""
    if augment.aug_repeats != 1:
        raise ValueError(f"{names['aug_repeats']} {augment.aug_repeats}: a stream of tar shards reads each sample "
                         "once a pass and cannot show it again in a row; expected 1 (no repeats), or train on the "
                         "folder the shards were written from")
    given = [names[k] for k, v in dataclasses.asdict(augment).items() if v != getattr(Augment, k)]
    if given and not training:
        raise ValueError(f"{', '.join(given)} augment a training stream; an evaluation stream (training=False) "
                         "takes none")
    return augment


def from_shards(pattern, image_size, batch_size, seed=0, *, shuffle_buffer=2048, skip_batches=0, repeat=True,
                drop_remainder=True, training=True, process_index=0, process_count=1, per_process="shards",
                image_dtype="float32", pipeline="auto", workers=None, auto_augment=None, re_prob=0.0,
                re_mode="pixel", re_count=1, aug_repeats=1, color_jitter=None):
    """Batches of WebDataset-style tar shards (``keras_vit.data.shards``; `write_shards` writes them from a
    folder), streamed: the shards are read in order, never the whole set in memory.

    Training batches are shuffled as a pure function of ``seed`` and the pass over the data: every pass
    reads the shards in a seeded order through a shuffle buffer whose draws are seeded too, and crops each
    image (the official Inception crop) and flips it from (seed, pass, sample). ``skip_batches`` therefore
    resumes a run exactly, and tf.data and the ``PyDataset`` give the same batches.

    A training stream takes timm's augmentations as ``from_directory``'s does (``keras_vit.data.augment``):
    RandAugment on the resized crop (uint8) before normalisation, random erasing after it, drawn per sample
    from (seed, pass, sample), the same on both pipelines (to one level of 255 but for a few pixels, as
    there). Repeated augmentation (``aug_repeats``) is refused: the stream reads each sample once a pass.

    With several processes and at least as many shards as processes, each process reads its own shards
    (every ``process_count``-th of the pass's order; its rows of each global batch come from them), so the
    processes read disjoint shards that cover the set every pass. With fewer shards than processes each
    process reads them all and keeps its rows of each global batch, as ``from_directory`` does;
    ``per_process="rows"`` asks for that whatever the shards: every process then reads every shard (the
    bytes; it decodes its rows only), and the global batches are those of one process.

    A shard shorter than the size its info file records (a copy cut short) loses the samples after its last
    complete one, named in a warning; a sample without a label naming a class stops the stream with its
    shard and key.

    Args:
        pattern: the shards: a path, a glob, a brace range (``shards/train-{000000..000127}.tar``) or a list;
            or a ``ShardSet`` already opened (``keras_vit.data.shards.open_shards``).
        image_size: the images' (height, width), or one int for square images.
        batch_size: the global batch (divisible by ``process_count``).
        seed: the seed of the shards' order, the buffer's draws, the crops and the flips.
        shuffle_buffer: samples held (encoded) to shuffle within; 1 keeps the shards' order.
        skip_batches: start at this batch of the stream (a resumed run).
        repeat: stream pass after pass (give ``model.fit`` a ``steps_per_epoch``); False: one pass.
        drop_remainder: leave out a single pass's last, short batch.
        training: False: the shards in their order, no buffer, each image resized whole, no flip (evaluation).
        process_index, process_count: this process, and how many read the shards.
        per_process: how several processes share the stream: "shards" (each its own shards when there are at
            least as many as processes, else "rows") or "rows" (each its rows of every global batch).
        image_dtype: "float32" (scaled to [-1, 1]) or "uint8".
        pipeline: "tf.data", "pydataset" (a ``keras.utils.PyDataset``, no TensorFlow needed) or "auto"
            (tf.data when TensorFlow is installed).
        workers: the PyDataset's decoding threads (default: the machine's cores).
        auto_augment: timm's RandAugment string (``--aa``), e.g. "rand-m9-mstd0.5-inc1"; None: none.
        re_prob: the probability of random erasing an image, in [0, 1] (timm's ``--reprob``; 0: none).
        re_mode: the erased boxes' fill, "pixel", "rand" or "const" (timm's ``--remode``).
        re_count: up to this many boxes an image (timm's ``--recount``).
        aug_repeats: 1 (the stream reads each sample once a pass; more is refused).
        color_jitter: with ``auto_augment="3a"`` (DeiT III's 3-Augment), the colour jitter's strength; None:
            ``Augment``'s default.

    Returns:
        A dataset of ``(images, labels)`` batches with ``class_names`` and ``shard_set`` (the shards, their
        samples, the truncated ones) attributes.

    Raises:
        ValueError: one message naming what was expected and what came: bad arguments, no shard matching,
            a missing info file, shards of different class sets, augmentations of an evaluation stream or
            repeated augmentation.
    """
    size = pair(image_size, "image_size")
    check_image_dtype(image_dtype)
    jitter = {} if color_jitter is None else {"color_jitter": color_jitter}
    augment = check_augment(Augment(auto_augment, re_prob, re_mode, re_count, aug_repeats, **jitter), training)
    check_stream(batch_size, None, skip_batches, seed, repeat, drop_remainder, process_index, process_count)
    positive_int("shuffle_buffer", shuffle_buffer)
    if per_process not in PER_PROCESS:
        raise ValueError(f"`per_process` must be one of {PER_PROCESS}; got {per_process!r}.")
    if pipeline not in PIPELINES:
        raise ValueError(f"`pipeline` must be one of {PIPELINES}; got {pipeline!r}.")
    shard_set = pattern if isinstance(pattern, ShardSet) else open_shards(pattern)
    plan = ShardPlan(shard_set, seed, shuffle_buffer, bool(training), batch_size, process_index, process_count,
                     per_process)
    count = num_batches(plan, skip_batches, repeat, drop_remainder)
    if count is not None and count <= 0:
        raise ValueError(f"`skip_batches` ({skip_batches}) leaves no batch of {plan.rows} in the single pass over "
                         f"the {len(shard_set)} samples of its {len(shard_set.paths)} shard(s); use repeat=True or "
                         "fewer skipped batches.")
    if pipeline == "auto":
        pipeline = "tf.data" if tensorflow_available() else "pydataset"
    if pipeline == "tf.data":
        require("the tf.data pipeline of an image folder", "the tf.data pipeline of tar shards")
        ds = tf_dataset(plan, size, image_dtype, skip_batches, repeat, drop_remainder, augment)
    else:
        ds = pydataset(plan, size, image_dtype, skip_batches, repeat, drop_remainder, workers, augment)
    ds.class_names, ds.shard_set = shard_set.class_names, shard_set
    return ds
