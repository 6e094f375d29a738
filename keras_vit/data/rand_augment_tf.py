"""RandAugment's ops in TensorFlow (graph mode, usable inside `tf.data`'s map; no `numpy_function`), each
computed as Pillow computes it, so an image augmented here equals `rand_augment.apply_pillow`'s within one
level of uint8 (the ops are in `keras_vit.data.rand_augment`; the plan is its `plan_arrays`):

- colour ops by Pillow's own arithmetic: lookup tables built from per-channel histograms (AutoContrast,
  Equalize) or thresholds (Invert, Posterize, Solarize, SolarizeAdd); the enhancements as Pillow's
  `Image.blend` of a degenerate image (grey by ITU-R 601-2 luma, the mean grey, black, or the 3x3 SMOOTH
  filter) with the image, in float32, truncated;
- geometric ops as Pillow's affine transform: each output pixel centre mapped back into the input (in
  float64), bilinear or Pillow's bicubic (a = -1) over edge-clamped neighbours, and the fill colour where
  the centre lands outside the input.

The arithmetic is Pillow's, in its order (float64 where Pillow uses doubles): a pixel rounded the other way
would be stretched by a later op of the chain. Each step is one branch of a `tf.switch_case` inside a
`tf.while_loop`, so the graph holds one copy of every op whatever the number of steps. On a CPU the ops cost
about four times Pillow's time per image (a bicubic affine transform most: ~8 ms of CPU at 224 x 224).
"""

import functools
import math

from keras_vit.data.rand_augment import GEOMETRIC, KERNELS

_SMOOTH = ((1, 1, 1), (1, 5, 1), (1, 1, 1))  # Pillow's ImageFilter.SMOOTH (its scale: the sum, 13)


def _lut(tf, image, lut):
    """`image` through per-channel tables `lut` (3, 256) int32 (values clipped to [0, 255])."""
    flat = tf.reshape(tf.clip_by_value(lut, 0, 255), [-1])
    return tf.cast(tf.gather(flat, tf.cast(image, tf.int32) + tf.constant([0, 256, 512])), tf.uint8)


def _histograms(tf, image):
    """(3, 256) int64 counts of each channel's values."""
    values = tf.reshape(tf.cast(image, tf.int32), [-1, 3]) + tf.constant([0, 256, 512])
    counts = tf.math.bincount(tf.reshape(values, [-1]), minlength=768, maxlength=768, dtype=tf.int64)
    return tf.reshape(counts, [3, 256])


# The tables of the colour ops, each (tf, image, arg) -> (3, 256) int32: the value each level becomes.

def _auto_contrast(tf, image, arg):
    """Pillow's `ImageOps.autocontrast` (no cutoff): each channel's [min, max] stretched to [0, 255]."""
    x = tf.cast(tf.reshape(image, [-1, 3]), tf.float64)
    lo, hi = tf.reduce_min(x, 0), tf.reduce_max(x, 0)
    stretch = hi > lo
    scale = tf.where(stretch, 255.0 / tf.where(stretch, hi - lo, 1.0), 1.0)
    offset = tf.where(stretch, -lo * scale, 0.0)
    return tf.cast(tf.range(256, dtype=tf.float64)[None] * scale[:, None] + offset[:, None], tf.int32)


def _equalize(tf, image, arg):
    """Pillow's `ImageOps.equalize`: per channel, the table (step // 2 + pixels below) // step, step the
    count of pixels below the top value over 255; unchanged where a channel has one value or step is 0."""
    counts = _histograms(tf, image)
    top = tf.reduce_max(tf.where(counts > 0, tf.range(256, dtype=tf.int64)[None], -1), 1)
    step = (tf.reduce_sum(counts, 1) - tf.gather(counts, top, batch_dims=1)) // 255
    plain = (tf.math.count_nonzero(counts, 1) <= 1) | (step == 0)
    safe = tf.where(plain, tf.ones_like(step), step)
    lut = (safe[:, None] // 2 + tf.cumsum(counts, 1, exclusive=True)) // safe[:, None]
    identity = tf.broadcast_to(tf.range(256, dtype=tf.int64)[None], [3, 256])
    return tf.cast(tf.where(plain[:, None], identity, lut), tf.int32)


def _levels(tf):
    return tf.broadcast_to(tf.range(256, dtype=tf.int32)[None], [3, 256])


def _invert(tf, image, arg):
    return 255 - _levels(tf)


def _posterize(tf, image, arg):
    """Keeps the `arg` high bits (8 or more: unchanged; 0: black)."""
    bits = tf.clip_by_value(tf.cast(arg, tf.int32), 0, 8)
    return tf.bitwise.bitwise_and(_levels(tf), tf.bitwise.left_shift(255, 8 - bits) % 256)


def _solarize(tf, image, arg):
    """Levels at or above the threshold `arg` inverted."""
    levels = _levels(tf)
    return tf.where(levels < tf.cast(arg, tf.int32), levels, 255 - levels)


def _solarize_add(tf, image, arg):
    """`arg` added (clipped at 255) to levels below 128."""
    levels = _levels(tf)
    return tf.where(levels < 128, tf.minimum(255, levels + tf.cast(arg, tf.int32)), levels)


def _blend(tf, degenerate, image, factor):
    """Pillow's `Image.blend(degenerate, image, factor)`: degenerate + factor (image - degenerate) in
    float32, clipped and truncated to uint8."""
    low = tf.cast(degenerate, tf.float32)
    out = low + tf.cast(factor, tf.float32) * (tf.cast(image, tf.float32) - low)
    return tf.cast(tf.clip_by_value(out, 0.0, 255.0), tf.uint8)


def _luma(tf, image):
    """Pillow's RGB to L: (19595 R + 38470 G + 7471 B + 2^15) >> 16, int32 (H, W)."""
    x = tf.cast(image, tf.int32)
    return (x[..., 0] * 19595 + x[..., 1] * 38470 + x[..., 2] * 7471 + 0x8000) // 65536


# The degenerate images of the enhancements, each (tf, image) -> int32 (H, W, 3): Pillow's ImageEnhance.

def _grey(tf, image):
    return tf.repeat(_luma(tf, image)[..., None], 3, -1)


def _mean_grey(tf, image):
    luma = _luma(tf, image)
    mean = tf.reduce_sum(tf.cast(luma, tf.float64)) / tf.cast(tf.size(luma), tf.float64)
    return tf.fill(tf.shape(image), tf.cast(tf.floor(mean + 0.5), tf.int32))


def _black(tf, image):
    return tf.zeros(tf.shape(image), tf.int32)


def _smooth(tf, image):
    """Pillow's SMOOTH filter: the 3x3 kernel over 13, rounded; the one-pixel border unfiltered."""
    x = tf.cast(image, tf.int32)
    h, w = tf.shape(x)[0], tf.shape(x)[1]
    total = tf.zeros_like(x[1:-1, 1:-1])
    for i, row in enumerate(_SMOOTH):
        for j, weight in enumerate(row):
            total += weight * x[i:h - 2 + i, j:w - 2 + j]
    inside = tf.pad(tf.ones([h - 2, w - 2, 3], tf.bool), [[1, 1], [1, 1], [0, 0]])
    return tf.where(inside, tf.pad((total + 6) // 13, [[1, 1], [1, 1], [0, 0]]), x)


def _cubic(v1, v2, v3, v4, d):
    """Pillow's cubic (a = -1) through four samples at fraction `d` between v2 and v3, in Pillow's order of
    operations (collected by sample, the rounding differs enough to flip a pixel that a later op amplifies)."""
    p2, p3 = v3 - v1, 2 * (v1 - v2) + v3 - v4
    p4 = -v1 + v2 - v3 + v4
    return v2 + d * (p2 + d * (p3 + d * p4))


def _affine(tf, image, matrix, bicubic, fill):
    """Pillow's `Image.transform(size, AFFINE, matrix, resample, fillcolor=fill)`: output pixel (x, y)
    samples the input at (a (x + .5) + b (y + .5) + c, d (x + .5) + e (y + .5) + f), bilinear or bicubic
    over edge-clamped neighbours; `fill` where that point is outside the input."""
    a, b, c, d, e, f = (matrix[i] for i in range(6))
    h, w = tf.shape(image)[0], tf.shape(image)[1]
    hf, wf = tf.cast(h, tf.float64), tf.cast(w, tf.float64)
    ys, xs = tf.meshgrid(tf.range(hf) + 0.5, tf.range(wf) + 0.5, indexing="ij")
    xin, yin = a * xs + b * ys + c, d * xs + e * ys + f
    inside = (xin >= 0) & (xin < wf) & (yin >= 0) & (yin < hf)
    xin, yin = xin - 0.5, yin - 0.5
    x0, y0 = tf.floor(xin), tf.floor(yin)
    dx, dy = (xin - x0)[..., None], (yin - y0)[..., None]
    x0, y0 = tf.cast(x0, tf.int32), tf.cast(y0, tf.int32)
    rows = {k: tf.clip_by_value(y0 + k, 0, h - 1) * w for k in (-1, 0, 1, 2)}  # flat index: row * width + column
    cols = {k: tf.clip_by_value(x0 + k, 0, w - 1) for k in (-1, 0, 1, 2)}
    pixels = tf.cast(tf.reshape(image, [-1, 3]), tf.float64)

    def at(row, col):
        return tf.gather(pixels, rows[row] + cols[col])

    def linear():
        left, right = at(0, 0), at(0, 1)
        top = left + (right - left) * dx
        left, right = at(1, 0), at(1, 1)
        bottom = left + (right - left) * dx
        return top + (bottom - top) * dy

    def cubic():
        return _cubic(*(_cubic(*(at(r, k) for k in (-1, 0, 1, 2)), dx) for r in (-1, 0, 1, 2)), dy)

    value = tf.cast(tf.clip_by_value(tf.cond(tf.cast(bicubic, tf.bool), cubic, linear), 0.0, 255.0), tf.uint8)
    return tf.where(inside[..., None], value, tf.constant(fill, tf.uint8))


def _matrices(tf, image, arg):
    """(5, 6) float64: the affine matrix of each op of `GEOMETRIC` (Rotate, ShearX, ShearY, TranslateXRel,
    TranslateYRel) by `arg` (Pillow's `Image.rotate`: degrees counter-clockwise about the centre)."""
    h, w = (tf.cast(tf.shape(image)[i], tf.float64) for i in (0, 1))
    arg = tf.cast(arg, tf.float64)
    angle = -arg * (math.pi / 180.0)
    cos, sin = tf.cos(angle), tf.sin(angle)
    cx, cy = w / 2, h / 2
    one, zero = tf.constant(1.0, tf.float64), tf.constant(0.0, tf.float64)
    return tf.stack([tf.stack(row) for row in (
        (cos, sin, cos * -cx + sin * -cy + cx, -sin, cos, -sin * -cx + cos * -cy + cy),
        (one, arg, zero, zero, one, zero),
        (one, zero, zero, arg, one, zero),
        (one, zero, arg * w, zero, one, zero),
        (one, zero, zero, zero, one, arg * h))])


# the kernels by family: a colour table, a blend with a degenerate image, an affine transform; each
# kernel's (family, index in its family), family 0 the identity (kernel -1)
TABLES = {"AutoContrast": _auto_contrast, "Equalize": _equalize, "Invert": _invert, "Posterize": _posterize,
          "Solarize": _solarize, "SolarizeAdd": _solarize_add}
DEGENERATES = {"Color": _grey, "Contrast": _mean_grey, "Brightness": _black, "Sharpness": _smooth}
FAMILY = [(0, 0)] + [next((f, list(names).index(k)) for f, names in enumerate((TABLES, DEGENERATES, GEOMETRIC), 1)
                          if k in names) for k in KERNELS]


def _step(tf, image, kernel, arg, bicubic, fill):
    """One step of the plan (`kernel` -1: none) on a uint8 (H, W, 3) tensor."""
    family, index = tf.unstack(tf.gather(tf.constant(FAMILY, tf.int32), kernel + 1))

    def table():
        return _lut(tf, image, tf.switch_case(index, [functools.partial(f, tf, image, arg) for f in TABLES.values()]))

    def blend():
        degenerate = tf.switch_case(index, [functools.partial(f, tf, image) for f in DEGENERATES.values()])
        return _blend(tf, degenerate, image, arg)

    def affine():
        return _affine(tf, image, tf.gather(_matrices(tf, image, arg), index), bicubic, fill)

    return tf.switch_case(family, [lambda: image, table, blend, affine])


def apply_tf(image, kernels, args, bicubic, fill):
    """A RandAugment plan applied to one image with TensorFlow ops (graph mode: inside `tf.data`'s map).

    Args:
        image: a uint8 (H, W, 3) tensor.
        kernels: int32 (num_ops,): each step's index in `KERNELS`, -1 for none (`plan_arrays`).
        args: float64 (num_ops,): each step's argument.
        bicubic: bool (num_ops,): bicubic rather than bilinear for geometric steps.
        fill: the RGB fill of geometric ops (three ints, `RandAugmentConfig.fill`).

    Returns:
        the augmented uint8 (H, W, 3) tensor.
    """
    import tensorflow as tf

    image = tf.convert_to_tensor(image, tf.uint8)
    kernels = tf.convert_to_tensor(kernels, tf.int32)
    fill = tuple(int(v) for v in fill)
    shape = image.shape

    def body(i, image):  # one copy of the step in the graph, whatever the number of ops
        return i + 1, tf.ensure_shape(_step(tf, image, kernels[i], args[i], bicubic[i], fill), shape)

    return tf.while_loop(lambda i, _: i < tf.shape(kernels)[0], body, (tf.constant(0), image))[1]
