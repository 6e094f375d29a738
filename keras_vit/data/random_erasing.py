"""Random erasing (Zhong et al. 2017) with timm's semantics (`timm.data.RandomErasing`), every draw from a seeded
numpy generator and the same erased image on the tf.data and the numpy (`PyDataset`) paths.

    from keras_vit.data.random_erasing import RandomErasing
    eraser = RandomErasing(0.25)                               # DeiT's --reprob 0.25, timm's --remode pixel
    draws = eraser.draw(np.random.default_rng(...), 224, 224)  # (max_count, 5): top, left, height, width, noise
    draws = eraser.plan(seed, pass_index, positions, 224, 224)  # the same for positions of a pass, stacked
    image = eraser.apply(image, draws)                         # numpy, float32 (H, W, C) after normalisation
    image = eraser.apply_tensor(tf, image, draws)              # the same image in TensorFlow graph ops

The draws are timm's, in timm's order: with `probability` an image is erased at all; then `count` boxes
(`min_count`, or uniform in [min_count, max_count]), each of an area uniform in [min_area, max_area] of the
image divided by `count` and an aspect ratio (height / width) log-uniform in [min_aspect, max_aspect], redrawn
up to 10 times until it fits (height < H and width < W, timm's strict rule; a box that never fits is left
out), at a uniform position. A generator whose `random`, `uniform` and `integers(a, b + 1)` stand in for
Python's `random.random`, `uniform` and `randint(a, b)` makes timm draw the same boxes (tests/
test_random_erasing.py does so). One difference: timm erases when `random() <= probability` (so probability
0 still erases when random() returns exactly 0.0); here `random() < probability`, and probability 0 never
erases. After the boxes, one 32-bit noise key a box is drawn (kept where the box is not empty).

Erasing runs after normalisation (float32 images, as timm's): "pixel" fills a box with standard normal
noise per pixel and channel, "rand" with one normal value per channel, "const" with zeros. The noise is
counter-based, so both paths compute it exactly: the value at (row y, column x, channel c) of an H x W x C
image is a Box-Muller normal of two uniforms, each the top 24 bits of an integer hash (uint32 arithmetic,
`hash32`) of the box's key and a counter 2i or 2i + 1, i = (y W + x) C + c ("rand": i = c). Box-Muller runs
in float64 and is rounded to float32, so the two paths agree to float32 rounding (1e-6).
"""

import dataclasses
import math

import numpy as np

from keras_vit.data.stream import ERASE_STREAM, position_rng

MODES = ("pixel", "rand", "const")
ATTEMPTS = 10  # timm's attempts at a box that fits
DRAW_FIELDS = ("top", "left", "height", "width", "noise")
_MUL1, _MUL2 = 0x7FEB352D, 0x846CA68B  # the "lowbias32" integer hash (C. Wellons, hash-prospector)


def hash32(x, xp=np):
    """The lowbias32 hash of uint32 `x` (numpy array or, with `xp` TensorFlow, a tensor), wrapping mod 2^32."""
    for shift, mul in ((16, _MUL1), (15, _MUL2)):
        x = _xor_shift(x, shift, xp) * _uint32(mul, xp)
    return _xor_shift(x, 16, xp)


def _uint32(value, xp):
    return np.uint32(value) if xp is np else xp.constant(value, xp.uint32)


def _xor_shift(x, shift, xp):
    if xp is np:
        return x ^ (x >> np.uint32(shift))
    return xp.bitwise.bitwise_xor(x, xp.bitwise.right_shift(x, xp.constant(shift, xp.uint32)))


def counter_normal(key, counter, xp=np):
    """float32 standard normal values, one for each uint32 `counter` (any shape), keyed by uint32 `key`: Box-Muller
    in float64 of the uniforms ``(hash32(hash32(2i) ^ key) >> 8 + 1/2) / 2^24`` and ``(... 2i + 1 ...) / 2^24``.
    `xp` is numpy, or TensorFlow for graph ops giving the same values (to float32 rounding)."""
    two = _uint32(2, xp)
    first, second = (hash32(_xor(hash32(counter * two + _uint32(k, xp), xp), key, xp), xp) for k in (0, 1))
    if xp is np:
        u1 = ((first >> np.uint32(8)).astype(np.float64) + 0.5) * 2.0**-24
        u2 = (second >> np.uint32(8)).astype(np.float64) * 2.0**-24
        return (np.sqrt(-2.0 * np.log(u1)) * np.cos(2.0 * np.pi * u2)).astype(np.float32)
    eight = xp.constant(8, xp.uint32)
    u1 = (xp.cast(xp.bitwise.right_shift(first, eight), xp.float64) + 0.5) * 2.0**-24
    u2 = xp.cast(xp.bitwise.right_shift(second, eight), xp.float64) * 2.0**-24
    return xp.cast(xp.sqrt(-2.0 * xp.math.log(u1)) * xp.cos(2.0 * np.pi * u2), xp.float32)


def _xor(a, b, xp):
    return a ^ b if xp is np else xp.bitwise.bitwise_xor(a, b)


def _check(name, value, ok, expected):
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not ok(value):
        raise ValueError(f"RandomErasing's `{name}` must be {expected}; got {value!r}.")


@dataclasses.dataclass(frozen=True)
class RandomErasing:
    """Random erasing of float32 images after normalisation, timm's `RandomErasing` arguments by the same names
    (see the module's docstring for the draws and the fill).

    Args:
        probability: the probability that an image is erased at all, in [0, 1] (timm's `--reprob`; DeiT 0.25).
        mode: "pixel" (per-pixel normal noise, timm's `--remode` default), "rand" (one normal colour a box)
            or "const" (zeros).
        min_area: the least area of the boxes together, a fraction of the image in (0, 1].
        max_area: the largest, in [min_area, 1].
        min_aspect: the least aspect ratio (height / width) of a box, > 0.
        max_aspect: the largest, >= min_aspect; None: 1 / min_aspect.
        min_count: the least number of boxes, an integer >= 1.
        max_count: the largest, an integer >= min_count (timm's `--recount`); None: min_count.

    Raises:
        ValueError: an argument outside its range, named with the range.
    """

    probability: float
    mode: str = "pixel"
    min_area: float = 0.02
    max_area: float = 1 / 3
    min_aspect: float = 0.3
    max_aspect: float = None
    min_count: int = 1
    max_count: int = None

    def __post_init__(self):
        _check("probability", self.probability, lambda v: 0 <= v <= 1, "a number in [0, 1]")
        if self.mode not in MODES:
            raise ValueError(f"RandomErasing's `mode` must be one of {MODES}; got {self.mode!r}.")
        _check("min_area", self.min_area, lambda v: 0 < v <= 1, "a number in (0, 1]")
        _check("max_area", self.max_area, lambda v: self.min_area <= v <= 1, f"a number in [{self.min_area}, 1]")
        _check("min_aspect", self.min_aspect, lambda v: v > 0, "a number > 0")
        if self.max_aspect is not None:
            _check("max_aspect", self.max_aspect, lambda v: v >= self.min_aspect, f"a number >= {self.min_aspect}")
        for name, least in (("min_count", 1), ("max_count", self.min_count)):
            value = getattr(self, name)
            if value is None and name == "max_count":
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise ValueError(f"RandomErasing's `{name}` must be an integer >= {least}; got {value!r}.")

    @property
    def boxes(self):
        """The most boxes an image gets: the rows of `draw`'s array."""
        return self.max_count or self.min_count

    def draw(self, rng, height, width):
        """The boxes of one `height` x `width` image drawn from `rng` (a `numpy.random.Generator`, the caller's
        seeded one) in timm's order: an int64 array (`boxes`, 5) of rows (top, left, height, width, noise key),
        all zeros for no box."""
        out = np.zeros((self.boxes, len(DRAW_FIELDS)), np.int64)
        if not rng.random() < self.probability:
            return out
        count = self.min_count if self.boxes == self.min_count else int(rng.integers(self.min_count, self.boxes + 1))
        log_aspect = (math.log(self.min_aspect), math.log(self.max_aspect or 1 / self.min_aspect))
        for k in range(count):
            for _ in range(ATTEMPTS):
                area = rng.uniform(self.min_area, self.max_area) * (height * width) / count  # timm's float order
                aspect = math.exp(rng.uniform(*log_aspect))
                h, w = round(math.sqrt(area * aspect)), round(math.sqrt(area / aspect))  # Python's round, as timm's
                if w < width and h < height:
                    out[k, :4] = rng.integers(0, height - h + 1), rng.integers(0, width - w + 1), h, w
                    break
        out[:, 4] = np.where((out[:, 2] > 0) & (out[:, 3] > 0), rng.integers(0, 2**32, size=self.boxes), 0)
        return out

    def plan(self, seed, pass_index, positions, height, width):
        """The draws (len(`positions`), `boxes`, 5) of the examples at `positions` of training pass `pass_index`
        of the run seeded `seed`, for `height` x `width` images: each from its position's generator
        (`keras_vit.data.stream.position_rng`), so the repeats of an image are erased apart and a resumed run
        erases as the uninterrupted one did."""
        draws = [self.draw(position_rng(seed, pass_index, int(j), ERASE_STREAM), height, width) for j in positions]
        return np.stack(draws) if draws else np.zeros((0, self.boxes, len(DRAW_FIELDS)), np.int64)

    def apply(self, image, draws):
        """`image` (float32 (H, W, C), normalised) erased in the boxes of `draws` (`draw`'s array), in numpy: a new
        array, or `image` itself when `draws` hold no box."""
        out = image = _float_image(image)
        _, width, channels = image.shape
        for top, left, h, w, key in np.asarray(draws, np.int64).reshape(-1, len(DRAW_FIELDS)):
            if h and w:
                out = image.copy() if out is image else out
                out[top:top + h, left:left + w] = self._fill(np, np.uint32(key), top, left, h, w, width, channels)
        return out

    def apply_tensor(self, tf, image, draws):
        """`apply` in TensorFlow graph ops (tf.data's map): `image` a float32 (H, W, C) tensor, `draws` an int64
        (`boxes`, 5) tensor; `tf` the TensorFlow module."""
        if image.dtype != tf.float32:
            raise ValueError(f"random erasing runs after normalisation, on float32 images (image_dtype='float32'); "
                             f"got {image.dtype.name} images")
        shape = tf.shape(image, out_type=tf.int64)
        height, width, channels = shape[0], shape[1], shape[2]
        for k in range(self.boxes):
            top, left, h, w, key = (draws[k, i] for i in range(len(DRAW_FIELDS)))

            def erase(image=image, top=top, left=left, h=h, w=w, key=key):
                fill = self._fill(tf, tf.cast(key, tf.uint32), top, left, h, w, width, channels)
                rows, cols = tf.range(height), tf.range(width)
                inside = (((rows >= top) & (rows < top + h))[:, None, None]
                          & ((cols >= left) & (cols < left + w))[None, :, None])
                fill = tf.pad(fill, [[top, height - top - h], [left, width - left - w], [0, 0]])
                return tf.where(inside, fill, image)

            image = tf.cond((h > 0) & (w > 0), erase, lambda image=image: image)
        return image

    def _fill(self, xp, key, top, left, h, w, width, channels):
        """The (h, w, C) float32 values of a box at (top, left): noise per the mode, from `key`."""
        if xp is np:
            rows, cols, chan = np.arange(top, top + h), np.arange(left, left + w), np.arange(channels)
            shape = (h, w, channels)
        else:
            rows, cols, chan = xp.range(top, top + h), xp.range(left, left + w), xp.range(channels)
            shape = xp.stack([h, w, channels])
        if self.mode == "const":
            return np.zeros(shape, np.float32) if xp is np else xp.zeros(shape, xp.float32)
        if self.mode == "rand":
            index = chan[None, None, :] + 0 * rows[:, None, None] + 0 * cols[None, :, None]
        else:
            index = (rows[:, None, None] * width + cols[None, :, None]) * channels + chan[None, None, :]
        index = index.astype(np.uint32) if xp is np else xp.cast(index, xp.uint32)
        return counter_normal(key, index, xp)


def _float_image(image):
    image = np.asarray(image)
    if image.dtype != np.float32 or image.ndim != 3:
        raise ValueError(f"random erasing runs after normalisation, on a float32 image (H, W, C) "
                         f"(image_dtype='float32'); got a {image.dtype} array of shape {image.shape}")
    return image


__all__ = ["ATTEMPTS", "DRAW_FIELDS", "MODES", "RandomErasing", "counter_normal", "hash32"]
