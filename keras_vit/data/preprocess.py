"""The images' preprocessing, as the official fine-tuning input pipeline (vit_jax `input_pipeline.py`)
does it: in TensorFlow for tf.data (`train_preprocess`, `eval_preprocess`) and in numpy for the
TensorFlow-free folder feed (`resize_bilinear`, `finish`), the two giving the same images.

- train: a random crop from ``sample_distorted_bounding_box`` with area range (0.05, 1) and no object
  constraint, resized to the square training size, then a random horizontal flip;
- eval: a plain resize to the size, no centre crop;
- the pixels then scaled to [-1, 1] (float32), or kept as uint8 for a model that scales them itself.
"""

import numpy as np

from keras_vit.configs import pair
from keras_vit.startup import import_quietly

# (0.05, 1) area and the default 3/4 - 4/3 aspect ratios: the official crop.
AREA_RANGE = (0.05, 1.0)


ASPECT_RATIO_RANGE = (3.0 / 4.0, 4.0 / 3.0)


def decode_image(tf, encoded):
    image = tf.io.decode_image(encoded, channels=3, expand_animations=False)
    image.set_shape([None, None, 3])
    return image


IMAGE_DTYPES = ("float32", "uint8")


def finish_tensor(tf, image, dtype):
    """A resized float image as `dtype`: scaled to [-1, 1], or rounded to uint8 [0, 255]."""
    if dtype == "uint8":
        return tf.cast(tf.round(tf.clip_by_value(image, 0.0, 255.0)), tf.uint8)
    return (tf.cast(image, tf.float32) - 127.5) / 127.5


def check_image_dtype(dtype):
    if dtype not in IMAGE_DTYPES:
        raise ValueError(f"`image_dtype` must be one of {IMAGE_DTYPES}; got {dtype!r}.")
    return dtype


def train_preprocess(image, image_size, seed, image_dtype="float32"):
    """The paper's training augmentation of one decoded uint8 HWC image.

    Random crop with ``stateless_sample_distorted_bounding_box`` (area 5-100%
    of the image, aspect ratio 3/4-4/3, no object constraint), bilinear resize
    to ``image_size``, random left-right flip, scaling to [-1, 1] (with
    ``image_dtype="uint8"``: rounding to uint8 instead). ``seed`` is
    a shape-[2] integer tensor: the same seed gives the same crop and flip.
    """
    tf = import_quietly("tensorflow")  # its start-up notes held back on the JAX and torch backends
    check_image_dtype(image_dtype)
    size = pair(image_size, "image_size")
    image = tf.convert_to_tensor(image)
    seed = tf.convert_to_tensor(seed)
    crop_seed = tf.random.experimental.stateless_fold_in(seed, 0)
    flip_seed = tf.random.experimental.stateless_fold_in(seed, 1)
    begin, crop, _ = tf.image.stateless_sample_distorted_bounding_box(
        tf.shape(image),
        bounding_boxes=tf.constant([[[0.0, 0.0, 1.0, 1.0]]]),
        seed=crop_seed,
        min_object_covered=0.0,
        aspect_ratio_range=ASPECT_RATIO_RANGE,
        area_range=AREA_RANGE,
        max_attempts=100,
        use_image_if_no_bounding_boxes=True,
    )
    image = tf.slice(image, begin, crop)
    image = tf.image.resize(image, size, method="bilinear")
    image = tf.image.stateless_random_flip_left_right(image, flip_seed)
    image.set_shape([size[0], size[1], 3])
    return finish_tensor(tf, image, image_dtype)


def eval_preprocess(image, image_size, image_dtype="float32"):
    """The paper's evaluation preprocessing of one decoded ``image`` (uint8 HWC): bilinear resize to
    ``image_size``, scale to [-1, 1] (with ``image_dtype="uint8"``: round to uint8 instead)."""
    tf = import_quietly("tensorflow")  # its start-up notes held back on the JAX and torch backends
    check_image_dtype(image_dtype)
    size = pair(image_size, "image_size")
    image = tf.image.resize(tf.convert_to_tensor(image), size, method="bilinear")
    image.set_shape([size[0], size[1], 3])
    return finish_tensor(tf, image, image_dtype)


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
