"""TensorFlow Datasets with the ViT paper's preprocessing: `load` (the official fine-tuning input
pipeline, per-host shards), `dataset_info`, `dev_splits`.

Both splits yield ``(images, labels)``: float32 NHWC images in [-1, 1] (``(x - 127.5) / 127.5``), or with
``image_dtype="uint8"`` uint8 images in [0, 255] for a model built with ``input_dtype="uint8"`` (a quarter
of the bytes to the device, scaled there), and int32 labels, for ``model.fit`` on every Keras backend
(Keras converts tf.data batches for JAX and PyTorch). The images go through `keras_vit.data.preprocess`.

Determinism: every random choice (the shuffle order of each pass over the data and the crop and flip of
each image) is a pure function of ``seed``, the pass index and the position in that pass. The same call
therefore yields the same batches in every process, and ``skip_batches`` starts the stream at any batch
without decoding the images skipped, which is what an exact resume of an interrupted run needs.

`load` requires TensorFlow and tensorflow-datasets (the ``tensorflow`` extra), whatever the Keras backend.
"""

import contextlib
import dataclasses
import difflib

from keras_vit.configs import pair
from keras_vit.data.augment import PLAN_DTYPES, Augment
from keras_vit.data.preprocess import (
    check_image_dtype,
    decode_image,
    eval_preprocess,
    train_preprocess,
)
from keras_vit.data.stream import check_stream, positive_int, this_process
from keras_vit.extras import require
from keras_vit.startup import import_quietly

_AUTOTUNE = -1  # tf.data.AUTOTUNE


def _tf():
    """(tensorflow, tensorflow_datasets), which the TFDS datasets need on every backend (MissingPackageError,
    one line, when either is not installed)."""
    require("reading a TFDS dataset (keras_vit.data)")
    tf = import_quietly("tensorflow")  # its start-up notes held back on the JAX and torch backends
    import tensorflow_datasets as tfds

    return tf, tfds


@dataclasses.dataclass(frozen=True)
class ImageDatasetInfo:
    """What the pipelines need to know about a TFDS image-classification dataset.

    Attributes:
        name: TFDS name.
        num_classes: number of classes of the label feature.
        class_names: the label feature's names (may be generic, e.g. "0", "1").
        image_key / label_key: the feature names of the images and labels.
        image_shape: shape of the stored images (None for variable sizes).
        splits: split name -> number of examples, when known (empty before
            the data is downloaded and prepared).
    """

    name: str
    num_classes: int
    class_names: tuple
    image_key: str
    label_key: str
    image_shape: tuple
    splits: dict


def _builder(name, data_dir):
    tf, tfds = _tf()
    if not isinstance(name, str) or not name:
        raise TypeError(f"`name` must be a TFDS dataset name (a string); got {name!r}.")
    try:
        return tfds.builder(name, data_dir=data_dir)
    except tfds.core.registered.DatasetNotFoundError:
        base = name.split(":")[0].split("/")[0]
        close = difflib.get_close_matches(base, tfds.list_builders(), n=5, cutoff=0.6)
        hint = f" Did you mean {', '.join(repr(c) for c in close)}?" if close else ""
        raise ValueError(
            f"Unknown TFDS dataset {name!r}.{hint} Expected the name of an image-"
            "classification dataset of tensorflow-datasets, e.g. 'cifar10', 'cifar100', "
            "'oxford_iiit_pet', 'oxford_flowers102'."
        ) from None


def _failed_url(err):
    """The URL a failed download was fetching: from the exception chain (requests keeps its request)
    or the first URL in a message."""
    import re

    seen = err
    while seen is not None:
        request = getattr(seen, "request", None)
        if getattr(request, "url", None):
            return request.url
        found = re.search(r"https?://[^\s'\"]+", str(seen))
        if found:
            return found.group(0).rstrip(".,")
        seen = seen.__cause__ or seen.__context__
    return None


# Attempts per URL while keras-vit prepares a dataset. tfds' own default (10 retries, backoff 0.2 s
# doubling) keeps an offline user waiting about 3.5 minutes for the error; 2 retries take 0.6 s.
DOWNLOAD_RETRIES = 2


@contextlib.contextmanager
def _download_retries(retries):
    """tfds' per-URL retry count (`downloader.MAX_RETRIES`, read at each request) set for the block."""
    from tensorflow_datasets.core.download import downloader

    before, downloader.MAX_RETRIES = downloader.MAX_RETRIES, retries
    try:
        yield
    finally:
        downloader.MAX_RETRIES = before


def _download_and_prepare(builder, name):
    """`builder.download_and_prepare()`, with one message naming the dataset, the URL and `data_dir`
    when the download fails (instead of a raw `requests` traceback), within seconds when offline."""
    try:
        with _download_retries(DOWNLOAD_RETRIES):
            builder.download_and_prepare()
    except ImportError:
        raise
    except Exception as err:
        url = _failed_url(err) or "its source URL"
        detail = str(err).splitlines()[0][:300] if str(err) else ""
        raise OSError(
            f"Could not download TFDS dataset {name!r} from {url} ({type(err).__name__}: {detail}). "
            f"Prepare it where the URL can be reached (tfds.builder({name!r}, data_dir=DIR)."
            "download_and_prepare()) and pass that folder as `data_dir` (--data-dir DIR in "
            "examples/finetune_*.py)."
        ) from None


def _features(builder):
    _, tfds = _tf()
    features = builder.info.features
    keys = builder.info.supervised_keys
    if isinstance(keys, (tuple, list)) and len(keys) == 2 and all(isinstance(k, str) for k in keys):
        image_key, label_key = keys
    else:
        image_key, label_key = "image", "label"
    problems = []
    if image_key not in features or not isinstance(features[image_key], tfds.features.Image):
        problems.append(f"no image feature {image_key!r}")
    if label_key not in features or not isinstance(features[label_key], tfds.features.ClassLabel):
        problems.append(f"no class-label feature {label_key!r}")
    if problems:
        raise ValueError(
            f"TFDS dataset {builder.name!r} is not an image-classification dataset: "
            f"{' and '.join(problems)}. Expected an Image feature and a ClassLabel "
            f"feature (as supervised keys); its features are {sorted(features.keys())}."
        )
    return image_key, label_key


def dataset_info(name, data_dir=None):
    """Describe the TFDS image-classification dataset ``name`` (no download needed); ``data_dir`` is the
    TFDS data folder to look in (default: tensorflow-datasets' own).

    Raises:
        ValueError: for an unknown dataset or one without image and class-label features.
    """
    builder = _builder(name, data_dir)
    image_key, label_key = _features(builder)
    label = builder.info.features[label_key]
    splits = {}
    try:
        splits = {k: int(v.num_examples) for k, v in builder.info.splits.items()}
    except Exception:  # metadata of a dataset that is not prepared
        splits = {}
    return ImageDatasetInfo(
        name=builder.name,
        num_classes=int(label.num_classes),
        class_names=tuple(label.names),
        image_key=image_key,
        label_key=label_key,
        image_shape=tuple(builder.info.features[image_key].shape),
        splits=splits,
    )


def dev_splits(split, dev_fraction):
    """TFDS split names that hold out the last ``dev_fraction`` of ``split``.

    ``dev_splits("train", 0.02) == ("train[:98%]", "train[98%:]")``: the paper's
    learning-rate sweep trains on the first and selects on the second (B.1.1).
    """
    if not isinstance(split, str) or "[" in split or "+" in split:
        raise ValueError(f"Expected a plain split name such as 'train' to take a dev part from; got {split!r}.")
    if isinstance(dev_fraction, bool) or not isinstance(dev_fraction, (int, float)) or not 0 < dev_fraction < 1:
        raise ValueError(f"`dev_fraction` must be a number in (0, 1); got {dev_fraction!r}.")
    cut = f"{round(100.0 * (1.0 - dev_fraction), 6):g}"
    return f"{split}[:{cut}%]", f"{split}[{cut}%:]"


def load(name, image_size, batch_size, split=("train", "test"), data_dir=None, *,
         dev_fraction=None, shuffle_buffer=10_000, seed=0, repeat=True, skip_batches=0,
         eval_batch_size=None, download=True, drop_remainder=True, process_index=0, process_count=1,
         image_dtype="float32", auto_augment=None, re_prob=0.0, re_mode="pixel", re_count=1, aug_repeats=1,
         color_jitter=None):
    """Training and evaluation pipelines of a TFDS image-classification dataset.

    Args:
        name: any TFDS image-classification dataset, e.g. "cifar10", "cifar100",
            "oxford_iiit_pet", "oxford_flowers102" (the number of classes is in
            ``dataset_info(name).num_classes``).
        image_size: int or (height, width) of the output images.
        batch_size: training batch size (per ``train_step``; with gradient
            accumulation, the recipe's ``device_batch_size``).
        split: (train split, eval split); TFDS slicing such as "train[:90%]" works.
        data_dir: TFDS data folder, for data that is already downloaded.
        dev_fraction: hold out this fraction of the train split for the paper's
            learning-rate sweep: train on the rest, evaluate on the held-out
            part (the eval split is then ignored), see :func:`dev_splits`.
        shuffle_buffer: shuffle buffer of encoded examples (1 switches shuffling off).
        seed: seed of the shuffle, crops and flips.
        repeat: repeat the training data forever (each pass shuffled and
            augmented differently); give ``model.fit`` a ``steps_per_epoch``.
            With False one pass is yielded.
        skip_batches: start the training stream after this many batches (to
            resume a run; the skipped images are not decoded).
        eval_batch_size: defaults to ``batch_size``; the last eval batch may be smaller.
        download: download and prepare the data when it is not in ``data_dir``.
        drop_remainder: drop a last partial training batch (keeps shapes static,
            as TPUs and XLA want).
        process_index, process_count: on several hosts (``keras_vit.distribute.
            initialize_multihost()`` returns them), this host's part of every
            batch: rows ``[i * b, (i + 1) * b)`` of each global batch of
            ``batch_size`` (and of each eval batch), ``b = batch_size //
            process_count``. Every host reads the same encoded records (so the
            shuffle is the same everywhere) but decodes and augments only its
            own rows; the hosts' parts put together are the single-host
            batches. Give the distribution ``auto_shard_dataset=False``.
        image_dtype: "float32" (images in [-1, 1]) or "uint8" (in [0, 255], rounded after the
            resize, for a model built with ``input_dtype="uint8"``).
        auto_augment: timm's RandAugment string (``--aa``, e.g. "rand-m9-mstd0.5-inc1") or "3a" (DeiT III's
            3-Augment) run on each training image's crop after the resize and flip, before normalisation; None: none.
        re_prob: the probability of random erasing a training image after normalisation, in [0, 1]
            (timm's ``--reprob``; 0: none; with uint8 images the erased image is mapped back to pixels).
        re_mode: the erased boxes' fill, "pixel", "rand" or "const" (timm's ``--remode``).
        re_count: up to this many boxes an image (timm's ``--recount``).
        aug_repeats: each training example this many times in a row of a pass, augmented apart, the
            pass as long as without (timm's ``--aug-repeats``; 1: off). See ``keras_vit.data.augment``:
            every draw is a pure function of (seed, pass, position), so ``skip_batches`` stays exact.
        color_jitter: with ``auto_augment="3a"`` (DeiT III's 3-Augment), the colour jitter's strength (timm's
            ``--color-jitter``; None: 0.4).

    Returns:
        ``(train_ds, eval_ds)``: ``tf.data.Dataset`` of ``(images, labels)``,
        images (batch, height, width, 3) float32 in [-1, 1] or uint8, labels int32 (batch,).

    Raises:
        ValueError: unknown dataset, a dataset without image and class-label
            features, bad sizes, or data missing with ``download=False``.
        OSError: the data is not prepared and could not be downloaded.
    """
    tf, tfds = _tf()
    size = pair(image_size, "image_size")
    check_image_dtype(image_dtype)
    augment = Augment(auto_augment, re_prob, re_mode, re_count, aug_repeats, color_jitter)
    shuffle_buffer = positive_int("shuffle_buffer", shuffle_buffer)
    batch_size, eval_batch_size = check_stream(batch_size, eval_batch_size, skip_batches, seed, repeat,
                                                drop_remainder, process_index, process_count)
    if isinstance(split, str) or len(split) != 2:
        raise ValueError(f"`split` must be a pair (train split, eval split); got {split!r}.")
    train_split, eval_split = split
    if dev_fraction is not None:
        train_split, eval_split = dev_splits(train_split, dev_fraction)

    read = split_reader(tf, tfds, name, data_dir, download)
    train_raw = read(train_split)
    num_train = _count_train(train_raw, name, train_split, batch_size, repeat, drop_remainder)
    train = _train_stream(tf, train_raw, num_train, size, batch_size, shuffle_buffer, seed, repeat, skip_batches,
                          drop_remainder, process_index, process_count, image_dtype, augment)

    evaluation = this_process(read(eval_split), eval_batch_size, process_index, process_count).map(
        lambda encoded, label: (eval_preprocess(decode_image(tf, encoded), size, image_dtype), label),
        num_parallel_calls=_AUTOTUNE, deterministic=True)
    evaluation = evaluation.batch(eval_batch_size // process_count).prefetch(_AUTOTUNE)
    return train, evaluation


def split_reader(tf, tfds, name, data_dir, download):
    """read(split_name): the (encoded image, int32 label) examples of a split of TFDS dataset `name`,
    prepared first (downloaded, if `download`) when it is not."""
    builder = _builder(name, data_dir)
    image_key, label_key = _features(builder)
    if not builder.is_prepared():
        if not download:
            raise ValueError(
                f"TFDS dataset {name!r} is not prepared in {builder.data_dir!r}; pass the "
                "`data_dir` that holds it, or download=True."
            )
        _download_and_prepare(builder, name)

    decoders = tfds.decode.PartialDecoding(
        {image_key: True, label_key: True}, decoders={image_key: tfds.decode.SkipDecoding()})

    def read(split_name):
        try:
            ds = builder.as_dataset(split=split_name, shuffle_files=False, decoders=decoders)
        except (ValueError, KeyError) as e:
            raise ValueError(f"Cannot read split {split_name!r} of {name!r}: {e}") from None
        return ds.map(lambda ex: (ex[image_key], tf.cast(ex[label_key], tf.int32)))

    return read


def _count_train(train_raw, name, train_split, batch_size, repeat, drop_remainder):
    """The number of examples of the train split, checked to be enough for the stream asked for."""
    num_train = int(train_raw.cardinality())
    if num_train < 0:  # unknown: count once
        num_train = int(train_raw.reduce(0, lambda n, _: n + 1))
    if num_train == 0:
        raise ValueError(f"The train split {train_split!r} of {name!r} is empty.")
    if drop_remainder and not repeat and num_train < batch_size:
        raise ValueError(
            f"The train split {train_split!r} has {num_train} examples, fewer than one "
            f"batch of {batch_size}; lower batch_size or pass drop_remainder=False."
        )
    return num_train


def _train_stream(tf, train_raw, num_train, size, batch_size, shuffle_buffer, seed, repeat, skip_batches,
                  drop_remainder, process_index, process_count, image_dtype, augment):
    """The training batches of load(): passes over `train_raw` (each shuffled by seed and pass, each example
    `augment.aug_repeats` times in a row), from batch `skip_batches` on, this process's rows augmented by
    train_preprocess and `augment` and batched."""
    start_example = skip_batches * batch_size
    first_pass, offset = divmod(start_example, num_train)
    if not repeat and first_pass > 0:
        raise ValueError(
            f"`skip_batches` ({skip_batches}) goes past the single pass of {num_train} "
            "examples; use repeat=True."
        )
    seed_base = tf.constant(seed, tf.int64)

    def one_pass(pass_index):
        ds = train_raw
        if shuffle_buffer > 1:
            # This function is traced into its own graph. Clearing that graph's
            # seed (a copy of the global one, e.g. from keras.utils.
            # set_random_seed) makes the shuffle depend on `seed` and the pass
            # only, and lets TF accept the per-pass seed tensor.
            tf.compat.v1.get_default_graph().seed = None
            ds = ds.shuffle(shuffle_buffer, seed=seed_base * 1_000_003 + pass_index,
                            reshuffle_each_iteration=False)
        if augment.aug_repeats > 1:  # keras_vit.data.repeat_aug: each example k times in place, the pass n long
            ds = ds.flat_map(lambda *example: tf.data.Dataset.from_tensors(example).repeat(augment.aug_repeats))
            ds = ds.take(num_train)
        ds = ds.enumerate().map(lambda index, example: (pass_index, index, example[0], example[1]))
        if augment.per_image:
            ds = tf.data.Dataset.zip(ds, _pass_draws(tf, num_train, size, seed, augment, pass_index))
            ds = ds.map(lambda example, draws: (*example, *draws))
        return ds.skip(tf.where(pass_index == first_pass, tf.constant(offset, tf.int64), 0))

    last = 2**62 if repeat else first_pass + 1
    train = tf.data.Dataset.range(first_pass, last).flat_map(one_pass)
    if not repeat and process_count > 1:  # whole global batches only, so every host has as many
        train = train.take((num_train - offset) // batch_size * batch_size)
    train = this_process(train, batch_size, process_index, process_count)
    train = train.map(_train_map(tf, num_train, size, seed, image_dtype, augment), num_parallel_calls=_AUTOTUNE,
                      deterministic=True)
    train = train.batch(batch_size // process_count, drop_remainder=drop_remainder)
    if repeat:
        cardinality = tf.data.INFINITE_CARDINALITY
    elif drop_remainder:
        cardinality = (num_train - offset) // batch_size
    else:
        cardinality = -(-(num_train - offset) // batch_size)
    train = train.apply(tf.data.experimental.assert_cardinality(cardinality))
    train = train.prefetch(_AUTOTUNE)
    return train


def _pass_draws(tf, num_train, size, seed, augment, pass_index):
    """A dataset of `augment`'s draws for each position of a pass (`Augment.plan`, made in numpy at once)."""
    plan = tf.numpy_function(lambda p: augment.plan(seed, int(p), range(num_train), *size), [pass_index],
                             tuple(tf.as_dtype(d) for d in PLAN_DTYPES), stateful=False)
    return tf.data.Dataset.from_tensor_slices(tuple(tf.ensure_shape(a, s) for a, s in zip(plan, augment.plan_shapes)))


def _train_map(tf, num_train, size, seed, image_dtype, augment):
    """The map of load()'s training examples (pass, position, encoded image, label, then `augment`'s draws
    for the position) to (image, label): the official crop and flip (`train_preprocess`), then `augment`."""
    seed_base = tf.constant(seed, tf.int64)

    def train_map(pass_index, index, encoded, label, *draws):
        image_seed = tf.stack([seed_base, pass_index * (num_train + 1) + index])
        if not draws:
            return train_preprocess(decode_image(tf, encoded), size, image_seed, image_dtype), label
        image = tf.cast(train_preprocess(decode_image(tf, encoded), size, image_seed, "uint8"), tf.float32)
        return augment.finish_tensor(tf, image, image_dtype, *draws), label

    return train_map
