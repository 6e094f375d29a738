"""The seeded plan that every feed of a folder or a TFDS dataset follows, so that tf.data and the
TensorFlow-free `PyDataset` give the same batches: which examples a stream yields from where, and which
rows of each global batch a process takes (`Stream`, `this_process`), and every random choice of a
training pass drawn in numpy from (seed, pass): the order of the files (each image `aug_repeats` times
with repeated augmentation, `keras_vit.data.repeat_aug`), each position's crop box (the official Inception
crop) and flip (`plan_pass`, `crop_boxes`), and the generator of each position's other augmentation draws
(`position_rng`).
"""

import dataclasses

import numpy as np

from keras_vit.data.repeat_aug import repeat_order


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


def positive_int(name, value):
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"`{name}` must be a positive integer; got {value!r}.")
    return value


def check_stream(batch_size, eval_batch_size, skip_batches, seed, repeat, drop_remainder, process_index,
                  process_count):
    """The checks of the arguments `load` and `from_directory` share; returns (batch_size, eval_batch_size)."""
    batch_size = positive_int("batch_size", batch_size)
    eval_batch_size = positive_int("eval_batch_size", eval_batch_size or batch_size)
    if isinstance(skip_batches, bool) or not isinstance(skip_batches, int) or skip_batches < 0:
        raise ValueError(f"`skip_batches` must be an integer >= 0; got {skip_batches!r}.")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ValueError(f"`seed` must be an integer; got {seed!r}.")
    process_count = positive_int("process_count", process_count)
    if isinstance(process_index, bool) or not isinstance(process_index, int) or not 0 <= process_index < process_count:
        raise ValueError(f"`process_index` must be an integer in [0, {process_count}); got {process_index!r}.")
    for what, count in (("batch_size", batch_size), ("eval_batch_size", eval_batch_size)):
        if count % process_count:
            raise ValueError(
                f"`{what}` ({count}) must be divisible by `process_count` ({process_count}): each host "
                f"reads an equal part of every batch; expected a multiple of {process_count}.")
    if process_count > 1 and not (repeat or drop_remainder):
        raise ValueError("Several processes need equal batches on every host: pass repeat=True or "
                         "drop_remainder=True.")
    return batch_size, eval_batch_size


def this_process(ds, batch_size, process_index, process_count):
    """The examples of `ds` (a stream starting at a batch boundary) in this process's rows of each batch."""
    if process_count == 1:
        return ds
    rows = batch_size // process_count
    ds = ds.enumerate().filter(lambda n, _: (n % batch_size) // rows == process_index)
    return ds.map(lambda n, example: example)


def this_process_example(k, batch_size, process_index, process_count):
    """Where the `k`-th example that `this_process` keeps is in the stream (counted from its start)."""
    rows = batch_size // process_count
    return (k // rows) * batch_size + process_index * rows + k % rows


# the official Inception crop (keras_vit.data's AREA_RANGE, ASPECT_RATIO_RANGE) and its attempts
CROP_ATTEMPTS = 100


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


def plan_pass(records, seed, pass_index, aug_repeats=1):
    """(order, boxes, flips) of training pass `pass_index`: the file order (with `aug_repeats` > 1 each image
    that many times in a row, the pass still ``len(records)`` long: `keras_vit.data.repeat_aug`), and for the
    image at each position its crop box (top, left, height, width) and whether it is flipped. A pure function
    of `seed` and `pass_index`; `aug_repeats=1` is the plan without repeats.

    Raises:
        ValueError: `aug_repeats` not a positive integer.
    """
    aug_repeats = positive_int("aug_repeats", aug_repeats)
    rng = np.random.default_rng([seed, pass_index])
    order = repeat_order(rng.permutation(len(records)), aug_repeats)
    sizes = np.asarray([(records[i][2], records[i][3]) for i in order], np.int64).reshape(-1, 2)
    boxes = crop_boxes(sizes[:, 0], sizes[:, 1], rng)
    flips = rng.uniform(size=len(records)) < 0.5
    return order, boxes, flips


# the generators of position_rng: one stream a per-image augmentation, never 0 (numpy pads a seed with zeros,
# so [seed, pass, position, 0] would be plan_pass's own [seed, pass] generator at position 0)
ERASE_STREAM = 1
RAND_AUGMENT_STREAM = 2
SUBSTITUTE_STREAM = 3  # the crop of a file read in place of one that cannot be read (folder_read)


def position_rng(seed, pass_index, position, stream):
    """The `numpy.random.Generator` of one augmentation's draws (`stream`, an integer >= 1 such as
    `ERASE_STREAM` or `RAND_AUGMENT_STREAM`) for the example at `position` of training pass `pass_index` of
    the run seeded `seed`: keyed on the position, so the repeats of an image (`aug_repeats`) draw apart, and
    a pure function of its arguments, so a resumed run draws as the uninterrupted one did."""
    if isinstance(stream, bool) or not isinstance(stream, int) or stream < 1:
        raise ValueError(f"`stream` must be an integer >= 1; got {stream!r}.")
    return np.random.default_rng([seed, pass_index, position, stream])
