"""A NaFlex feed (NaViT, SigLIP 2, timm's `naflexvit_*`): each image keeps its aspect ratio and as much
of its resolution as a token budget allows, and becomes a sequence of patches with their (row, col)
coordinates, padded to the batch's length, with a validity mask:

    {"patches": (B, N, P * P * 3) float32, "patch_coord": (B, N, 2) int32 (row, col), "patch_valid": (B, N) bool}

    from keras_vit import naflex_feed
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

import dataclasses
import functools
import math
import os
import typing

import keras
import numpy as np

from keras_vit.preprocessing import NORMALIZATIONS, preprocess_input

__all__ = ["SEQ_LENS", "MAX_TOKENS_PER_BATCH", "EVAL_SEQ_LEN", "naflex_grid", "patchify", "NaFlexPlan",
           "EpochPlan", "tf_dataset", "NaFlexBatches", "folder_batches"]

# timm's defaults: the training sequence lengths of create_naflex_loader, the tokens per batch of
# NaFlexMapDatasetWrapper (4096 * 4) and the evaluation sequence length of create_naflex_loader.
SEQ_LENS = (128, 256, 576, 784, 1024)
MAX_TOKENS_PER_BATCH = 4096 * 4
EVAL_SEQ_LEN = 576
IMAGE_DTYPES = ("float32", "uint8")
# the size rule's bisection over the scale: its tolerance and its bounds (timm's and Hugging Face's)
_TOLERANCE = 1e-5
_SCALES = (_TOLERANCE / 10, 100.0)
# draws of the bucket schedule are made this many at a time (so the schedule of n images is a prefix
# of the schedule of more)
_DRAWS = 1024


# --------------------------------------------------------------------------
# checks
# --------------------------------------------------------------------------
def _whole(value, what, least=1):
    """`value` as an int when it is an integer >= `least`, else one ValueError naming `what`."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < least:
        raise ValueError(f"{what} must be an integer >= {least}; got {value!r}")
    return int(value)


def _check_image(image):
    """`image` as a numpy array (H, W, 3) of numbers, else a ValueError saying what came."""
    array = np.asarray(image)
    if array.ndim != 3 or array.shape[-1] != 3:
        raise ValueError(f"a NaFlex image must be (height, width, 3) RGB, channels last; got shape {array.shape}")
    if array.dtype.kind not in "uif" or array.dtype == np.bool_:
        raise ValueError(f"a NaFlex image must hold uint8 or float values in [0, 255]; got dtype {array.dtype}")
    if array.shape[0] < 1 or array.shape[1] < 1:
        raise ValueError(f"a NaFlex image must have at least one pixel; got shape {array.shape}")
    return array


def _check_scaling(mode, image_dtype):
    if image_dtype not in IMAGE_DTYPES:
        raise ValueError(f"image_dtype must be one of {IMAGE_DTYPES}; got {image_dtype!r}")
    if mode not in NORMALIZATIONS:
        raise ValueError(f"mode must be one of {tuple(NORMALIZATIONS)}; got {mode!r}")


# --------------------------------------------------------------------------
# one image
# --------------------------------------------------------------------------
@functools.lru_cache(maxsize=4096)
def _grid(height, width, patch, budget):
    def tiles(scale):
        return max(math.ceil(height * scale / patch), 1), max(math.ceil(width * scale / patch), 1)

    fits, too_big = _SCALES
    while too_big - fits >= _TOLERANCE:
        scale = (fits + too_big) / 2
        rows, cols = tiles(scale)
        if rows * cols <= budget:
            fits = scale
        else:
            too_big = scale
    if fits <= _TOLERANCE:
        raise ValueError(f"a {height}x{width} image fits {budget} token(s) of {patch}x{patch} pixels only when "
                         f"shrunk below {_TOLERANCE} of its size, which the size rule (timm's) refuses; expected "
                         "an image at most ~100000 patches on a side")
    return tiles(fits)


def naflex_grid(height, width, patch_size, max_tokens):
    """(rows, cols) of patches an image of `height` x `width` pixels is resized to within a budget of
    `max_tokens` patches, keeping its aspect ratio: timm's `get_image_size_for_seq` (divisible by the
    patch, no `max_ratio`) divided by the patch size.

    The rule: the grid at a scale s is `max(ceil(height * s / patch_size), 1)` by the same of `width`;
    s is the largest scale whose grid has at most `max_tokens` patches, found by bisecting
    (1e-6, 100) to a tolerance of 1e-5, so a large image is shrunk and a small one enlarged, at most
    ~100 times (a 1 x 1 image in a million 1-pixel tokens: 100 x 100). The grid may hold fewer than
    `max_tokens` patches where both sides round up (a 1 x 1 image in 1000 1-pixel tokens: 31 x 31 = 961).

    Hugging Face's SigLIP 2 processor (`get_image_size_for_max_num_patches`) runs the same bisection
    and gives the same sizes; it differs only for images that would have to shrink below 1e-5 of
    their size (about 100000 patches on a side): timm raises there, and so does this function,
    while Hugging Face returns the size at scale 1e-6.

    Args:
        height, width: the image's size in pixels (positive integers).
        patch_size: the side of a square patch in pixels (a positive integer).
        max_tokens: the budget: most patches the grid may hold (a positive integer).

    Returns:
        (rows, cols), ints >= 1 with rows * cols <= max_tokens.

    Raises:
        ValueError: an argument is not a positive integer, or the image is too large for the rule.
    """
    return _grid(_whole(height, "height"), _whole(width, "width"), _whole(patch_size, "patch_size"),
                 _whole(max_tokens, "max_tokens"))


def _resize(image, size):
    """float32 (h, w, 3) of `image` resized to `size` (h, w): bilinear with antialiasing (the triangle
    filter widened by the reduction; Pillow's BILINEAR on each channel in float32), the rule of
    `keras_vit.interpolation.resize_matrix(..., "bilinear_antialias")` and of `tf.image.resize(...,
    antialias=True)`."""
    from PIL import Image

    if image.shape[:2] == tuple(size):
        return image.astype(np.float32)
    return np.stack([np.asarray(Image.fromarray(np.ascontiguousarray(image[..., c], dtype=np.float32))
                                .resize((size[1], size[0]), Image.BILINEAR)) for c in range(3)], axis=-1)


def _sequence(image, patch, grid, seq_len, flip=False, mode="vit", image_dtype="float32"):
    """The NaFlex dict of one checked image resized to `grid` patches, flipped left-right with `flip`,
    padded to `seq_len` (None: the grid's own length)."""
    rows, cols = grid
    count = rows * cols
    seq_len = count if seq_len is None else _whole(seq_len, "seq_len")
    if seq_len < count:
        raise ValueError(f"the image's {rows}x{cols} grid is {count} patches, longer than seq_len={seq_len}; "
                         f"expected seq_len >= {count} (or a token budget of at most seq_len)")
    resized = _resize(image, (rows * patch, cols * patch))
    if flip:
        resized = resized[:, ::-1]
    if image_dtype == "uint8":
        pixels = np.round(np.clip(resized, 0.0, 255.0)).astype(np.uint8)
    else:
        pixels = preprocess_input(resized, mode)
    patches = np.zeros((seq_len, patch * patch * 3), pixels.dtype)
    coord = np.zeros((seq_len, 2), np.int32)
    patches[:count], coord[:count] = cut(pixels, patch)
    return {"patches": patches, "patch_coord": coord, "patch_valid": np.arange(seq_len) < count}


def cut(pixels, patch_size):
    """(patches (..., gh * gw, P * P * C), their (row, col) (gh * gw, 2) int32) of an (H, W, C) image, or a
    (..., H, W, C) stack of images of one size, cut into `patch_size` P patches (the pixels past the last
    whole patch dropped): row-major over the grid, each patch flattened with the channels fastest."""
    *lead, height, width, channels = pixels.shape
    rows, cols = height // patch_size, width // patch_size
    patches = pixels[..., :rows * patch_size, :cols * patch_size, :].reshape(
        *lead, rows, patch_size, cols, patch_size, channels)
    coord = np.stack(np.divmod(np.arange(rows * cols, dtype=np.int32), cols), axis=-1)
    return np.swapaxes(patches, -4, -3).reshape(*lead, rows * cols, patch_size * patch_size * channels), coord


def patchify(image, patch_size, max_tokens, seq_len=None, *, mode="vit", image_dtype="float32"):
    """One image as a NaFlex sequence: resized to the grid `naflex_grid` gives it within `max_tokens`
    patches, cut into patches and padded to `seq_len`.

    The resize is bilinear with antialiasing (the filter widened by the reduction when shrinking):
    the rule of `tf.image.resize(..., "bilinear", antialias=True)`, of torch's
    `F.interpolate(mode="bilinear", antialias=True)` and of Pillow's BILINEAR, computed in float32
    (timm resizes uint8 images with Pillow, which rounds to uint8: within one level of 255 of this).
    Patches are row-major over the grid, each flattened as (P, P, 3) with the channels fastest (timm's
    `batch_patchify` with `channels_last=True`, Hugging Face's SigLIP 2 layout).

    Args:
        image: (H, W, 3) RGB, uint8 or float in [0, 255] (numpy array or nested lists).
        patch_size: the side P of a square patch in pixels.
        max_tokens: the token budget the image is resized to fit.
        seq_len: the length to pad to; default: the image's own number of patches.
        mode: the input scaling of `keras_vit.preprocessing.preprocess_input`: "vit" ([-1, 1], the
            default), "imagenet" or "clip".
        image_dtype: "float32" (scaled by `mode`) or "uint8" (the resized pixels rounded to [0, 255],
            for a model that scales them itself).

    Returns:
        {"patches": (seq_len, P * P * 3) float32 (or uint8), "patch_coord": (seq_len, 2) int32 (row,
        col), "patch_valid": (seq_len,) bool}: padding patches zero, at (0, 0), not valid.

    Raises:
        ValueError: the image is not (H, W, 3) numbers; `patch_size` or `max_tokens` is not a positive
            integer; `seq_len` is shorter than the image's patches (the message names both); an
            unknown `mode` or `image_dtype`.
    """
    _check_scaling(mode, image_dtype)
    image = _check_image(image)
    grid = naflex_grid(image.shape[0], image.shape[1], patch_size, max_tokens)
    return _sequence(image, int(patch_size), grid, seq_len, False, mode, image_dtype)


def _stack(sequences, labels):
    """A batch: the sequences' dicts stacked, the labels as an array (integers as int32)."""
    inputs = {key: np.stack([s[key] for s in sequences]) for key in sequences[0]}
    labels = np.asarray(labels)
    return inputs, labels.astype(np.int32) if labels.dtype.kind in "iu" else labels


# --------------------------------------------------------------------------
# the plan
# --------------------------------------------------------------------------
class EpochPlan(typing.NamedTuple):
    """One training pass of `NaFlexPlan.epoch`.

    Attributes:
        seq_lens: (batches,) the sequence length of each batch, in order.
        starts: (batches + 1,) where each batch starts in `order` (batch k is `order[starts[k]:starts[k + 1]]`).
        order: (positions,) the image index at each position of the pass: a seeded permutation of all
            images, then from its start again to fill the last batch.
        flips: (positions,) bool, whether the image at each position is flipped left-right.
    """

    seq_lens: np.ndarray
    starts: np.ndarray
    order: np.ndarray
    flips: np.ndarray


@dataclasses.dataclass(frozen=True)
class NaFlexPlan:
    """How NaFlex batches are made: the buckets, the images per batch and every random choice.

    A batch of sequence length L holds `batch_size(L)` = `max_tokens_per_batch // L` images (rounded
    down to a multiple of `batch_divisor`), each resized to fit L tokens (`naflex_grid`) and padded to
    L. Training passes follow a schedule drawn once from `seed` (as timm's `NaFlexMapDatasetWrapper`):
    each batch's L uniform over `seq_lens`, batches until every image has a place; each pass
    (`epoch`) shuffles the images and the order of the schedule's batches and draws the flips (p=0.5),
    all from (`seed`, pass). The last batch is filled from the start of the pass again, so every batch
    of one L has the same shape and each image is seen at least once a pass. Evaluation batches hold
    `eval_batch_size` images of `eval_seq_len` tokens, in order (the last one may be smaller).

    Attributes:
        patch_size: the side of a square patch in pixels.
        seq_lens: the training buckets (kept sorted, without repeats); timm's (128, 256, 576, 784, 1024).
        max_tokens_per_batch: tokens of a batch (padding included); timm's 4096 * 4.
        eval_seq_len: the evaluation sequence length; timm's 576.
        seed: the seed of the schedule, the shuffles and the flips (an integer >= 0).
        batch_divisor: batch sizes are multiples of it (timm's wrapper uses 8; 1: plain floor division).

    Raises:
        ValueError: a value that is not a positive integer, empty `seq_lens`, or a budget that gives
            some sequence length a batch of 0 images (the message names the smallest budget that works).
    """

    patch_size: int = 16
    seq_lens: tuple = SEQ_LENS
    max_tokens_per_batch: int = MAX_TOKENS_PER_BATCH
    eval_seq_len: int = EVAL_SEQ_LEN
    seed: int = 0
    batch_divisor: int = 1

    def __post_init__(self):
        _whole(self.patch_size, "patch_size")
        _whole(self.max_tokens_per_batch, "max_tokens_per_batch")
        _whole(self.eval_seq_len, "eval_seq_len")
        _whole(self.batch_divisor, "batch_divisor")
        _whole(self.seed, "seed", 0)
        if isinstance(self.seq_lens, (str, bytes)) or not hasattr(self.seq_lens, "__iter__") or not len(self.seq_lens):
            raise ValueError(f"seq_lens must be a non-empty sequence of positive integers; got {self.seq_lens!r}")
        lengths = tuple(sorted({_whole(v, "each of seq_lens") for v in self.seq_lens}))
        object.__setattr__(self, "seq_lens", lengths)
        for seq_len in (*lengths, self.eval_seq_len):
            if self.batch_size(seq_len) < 1:
                raise ValueError(
                    f"max_tokens_per_batch={self.max_tokens_per_batch} gives sequences of {seq_len} tokens a "
                    f"batch of 0 images (batch_divisor={self.batch_divisor}); expected max_tokens_per_batch >= "
                    f"{seq_len * self.batch_divisor}")

    def batch_size(self, seq_len):
        """Images in a batch of sequence length `seq_len`: `max_tokens_per_batch // seq_len`, rounded down
        to a multiple of `batch_divisor` (0 when the budget is smaller than that)."""
        return self.max_tokens_per_batch // _whole(seq_len, "seq_len") // self.batch_divisor * self.batch_divisor

    @property
    def batch_sizes(self):
        """(images per batch,) of each of `seq_lens`, in their order."""
        return tuple(self.batch_size(v) for v in self.seq_lens)

    @property
    def eval_batch_size(self):
        """Images in an evaluation batch: `batch_size(eval_seq_len)`."""
        return self.batch_size(self.eval_seq_len)

    def schedule(self, num_images):
        """(batches,) int: the sequence length of each batch of the canonical schedule for `num_images`
        training images (before a pass shuffles it): drawn uniformly from `seq_lens` with `seed`, as many
        batches as hold every image (a prefix of the schedule of more images)."""
        return _schedule(self, _whole(num_images, "num_images"))

    def steps_per_epoch(self, num_images):
        """Batches of one training pass over `num_images` images (`model.fit`'s `steps_per_epoch`)."""
        return len(self.schedule(num_images))

    def epoch(self, num_images, epoch):
        """The `EpochPlan` of training pass `epoch` (an integer >= 0) over `num_images` images: a pure
        function of (`seed`, `epoch`)."""
        return _epoch(self, _whole(num_images, "num_images"), _whole(epoch, "epoch", 0))


@functools.lru_cache(maxsize=16)
def _schedule(plan, num_images):
    rng = np.random.default_rng([plan.seed, 0x5CED])
    sizes = np.asarray(plan.batch_sizes)
    drawn = np.zeros(0, np.int64)
    while not len(drawn) or sizes[drawn].sum() < num_images:
        drawn = np.concatenate([drawn, rng.integers(0, len(sizes), _DRAWS)])
    count = int(np.searchsorted(np.cumsum(sizes[drawn]), num_images)) + 1
    lengths = np.asarray(plan.seq_lens)[drawn[:count]]
    lengths.flags.writeable = False
    return lengths


@functools.lru_cache(maxsize=8)
def _epoch(plan, num_images, epoch):
    rng = np.random.default_rng([plan.seed, epoch])
    images = rng.permutation(num_images)
    lengths = plan.schedule(num_images)[rng.permutation(len(plan.schedule(num_images)))]
    starts = np.concatenate([[0], np.cumsum([plan.batch_size(v) for v in lengths])])
    flips = rng.random(int(starts[-1])) < 0.5
    out = EpochPlan(lengths, starts, np.resize(images, int(starts[-1])), flips)
    for array in out:
        array.flags.writeable = False
    return out


# --------------------------------------------------------------------------
# tf.data
# --------------------------------------------------------------------------
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
        return _whole(num_images, "num_images")
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

    _check_scaling(mode, image_dtype)
    if not isinstance(plan, NaFlexPlan):
        raise ValueError(f"plan must be a NaFlexPlan; got {type(plan).__name__}")
    _check_source(tf, dataset)
    sequence = _tf_sequence(tf, plan.patch_size, mode, image_dtype)
    if not training:
        ds = dataset.map(lambda image, label: (sequence(image, plan.eval_seq_len, None), _label(tf, label)),
                         num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
        return ds.batch(plan.eval_batch_size).prefetch(tf.data.AUTOTUNE)
    shuffle_buffer = _whole(shuffle_buffer, "shuffle_buffer")
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


# --------------------------------------------------------------------------
# keras.utils.PyDataset
# --------------------------------------------------------------------------
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
        _check_scaling(mode, image_dtype)
        if not isinstance(plan, NaFlexPlan):
            raise ValueError(f"plan must be a NaFlexPlan; got {type(plan).__name__}")
        if not len(images):
            raise ValueError("NaFlexBatches needs at least one image; got none")
        if len(labels) != len(images):
            raise ValueError(f"expected one label per image: {len(images)} images, {len(labels)} labels")
        self.images, self.labels, self.plan, self.training = images, labels, plan, bool(training)
        self.epoch = _whole(epoch, "epoch", 0)
        self.repeat, self.skip_batches = bool(repeat), _whole(skip_batches, "skip_batches", 0)
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

    def batch_plan(self, index):
        """(seq_len, image indices, flips) of batch `index` of the current pass (of the endless stream
        with `repeat`)."""
        passes = 0
        if self.repeat:
            if index < 0:
                raise IndexError(f"batch {index} of an endless stream")
            passes, index = divmod(self.skip_batches + index, self.plan.steps_per_epoch(len(self.images)))
        elif not 0 <= index < len(self):
            raise IndexError(f"batch {index} of {len(self)}")
        if not self.training:
            size = self.plan.eval_batch_size
            rows = np.arange(index * size, min(len(self.images), (index + 1) * size))
            return self.plan.eval_seq_len, rows, np.zeros(len(rows), bool)
        epoch = self.plan.epoch(len(self.images), self.epoch + passes)
        positions = slice(epoch.starts[index], epoch.starts[index + 1])
        return int(epoch.seq_lens[index]), epoch.order[positions], epoch.flips[positions]

    def __getitem__(self, index):
        seq_len, rows, flips = self.batch_plan(index)
        sequences = []
        for row, flip in zip(rows, flips):
            image = _check_image(self.images[row])
            grid = naflex_grid(image.shape[0], image.shape[1], self.plan.patch_size, seq_len)
            sequences.append(_sequence(image, self.plan.patch_size, grid, seq_len, flip, self.mode, self.image_dtype))
        return _stack(sequences, [self.labels[row] for row in rows])

    def on_epoch_end(self):
        """Moves a training stream of one pass to its next pass (`model.fit` calls it after each epoch;
        an endless stream counts its batches instead)."""
        if self.training and not self.repeat:
            self.epoch += 1


class _FolderImages:
    """The images of `ImageFolder` records, read from disk as they are indexed."""

    def __init__(self, folder, records):
        self.folder, self.records = folder, records

    def __len__(self):
        return len(self.records)

    def __getitem__(self, index):
        from keras_vit import image_folder

        path, _, _, _, decoder = self.records[index]
        return image_folder.read_image(os.path.join(self.folder.root, path), plain=decoder != image_folder.PILLOW)


def folder_batches(directory, plan, validation_split=0.1, *, mode="vit", image_dtype="float32", workers=None,
                   repeat=False, skip_batches=0, **scan_options):
    """(train, validation) `NaFlexBatches` of a folder of your own images (`photos/<class>/*.jpg`, or
    a `labels.csv`; see `keras_vit.data.from_directory`), read from disk as batches are made.

    Args:
        directory: the folder, or an `ImageFolder` already scanned (`keras_vit.image_folder.scan`).
        plan: a `NaFlexPlan`; its seed also splits the folder.
        validation_split: fraction of each class held out for validation (0: no validation).
        mode, image_dtype: the scaling of the patches, as in `patchify`.
        workers: threads reading and resizing images (default: the machine's cores).
        repeat, skip_batches: the training stream endless, from this batch on (see `NaFlexBatches`).
        **scan_options: `keras_vit.image_folder.scan`'s keyword options (labels_csv, strict,
            max_pixels, threads, verbose).

    Returns:
        (train, validation): `NaFlexBatches` with `class_names` and `image_folder` attributes;
        validation is None without validation images.

    Raises:
        ValueError: what `keras_vit.image_folder.scan` raises, or bad arguments.
    """
    from keras_vit import image_folder

    if not isinstance(plan, NaFlexPlan):
        raise ValueError(f"plan must be a NaFlexPlan; got {type(plan).__name__}")
    folder = directory if isinstance(directory, image_folder.ImageFolder) else image_folder.scan(
        directory, validation_split, int(plan.seed), **scan_options)
    workers = workers or os.cpu_count() or 1
    out = []
    for records, training in ((folder.train, True), (folder.validation, False)):
        if not records:
            out.append(None)
            continue
        stream = {"repeat": repeat, "skip_batches": skip_batches} if training else {}
        batches = NaFlexBatches(_FolderImages(folder, records), [r[1] for r in records], plan, training, mode=mode,
                                image_dtype=image_dtype, workers=workers, **stream)
        batches.class_names, batches.image_folder = folder.class_names, folder
        out.append(batches)
    return tuple(out)
