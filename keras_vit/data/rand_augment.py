"""RandAugment with timm's semantics (`timm.data.auto_augment.rand_augment_transform`), drawn per image from a
seeded numpy generator and applied by either feed.

    from keras_vit.data.rand_augment import parse, draw, apply_pillow
    config = parse("rand-m9-mstd0.5-inc1", fill=fill_color("imagenet"))
    steps = draw(config, np.random.default_rng([seed, pass_index, image_index]))
    image = apply_pillow(image, steps, config.fill)          # uint8 (H, W, 3) -> uint8 (H, W, 3)

The language is timm's: sections joined by "-", the first "rand", then in any order `n` (ops per image,
default 2), `m` (magnitude on a 0-10 scale, default 10), `p` (the probability that each chosen op is
applied, default 0.5), `mstd` (std of gaussian noise added to the magnitude per op; above 100: uniform in
[0, m]), `mmax` (the magnitude's upper clip, default 10) and `inc` (1: the op set whose severity rises with
the magnitude, `INCREASING_OPS`; 0: timm's default set, `DEFAULT_OPS`). timm's weighted op sets (`t...`)
are not offered.

`draw` makes timm's draws for one image in timm's order: the ops (with replacement, as `np.random.choice`
draws them: the same ops as timm for a `numpy.random.RandomState` seeded as timm's global generator),
then per op whether it is applied, its noisy magnitude clipped to [0, mmax], the sign of a signed op and
the interpolation (bilinear or bicubic) of a geometric one. timm draws the last four from Python's
`random`, which a numpy generator cannot reproduce draw for draw: they follow the same distributions.
The result is a tuple of `Step`s, plain values that `apply_pillow` applies with Pillow; tf.data carries them
as arrays (`plan_arrays`) to `apply_planned`, the same Pillow code in its threads (Pillow lets go of Python's
lock while it works, so tf.data's parallel map scales with the cores, and both feeds give the same images).
"""

import dataclasses
import math
import re

import numpy as np

from keras_vit.preprocessing import NORMALIZATIONS

# timm's `_RAND_TRANSFORMS` and `_RAND_INCREASING_TRANSFORMS`, in timm's order (the order of the draws)
DEFAULT_OPS = ("AutoContrast", "Equalize", "Invert", "Rotate", "Posterize", "Solarize", "SolarizeAdd", "Color",
               "Contrast", "Brightness", "Sharpness", "ShearX", "ShearY", "TranslateXRel", "TranslateYRel")
INCREASING_OPS = ("AutoContrast", "Equalize", "Invert", "Rotate", "PosterizeIncreasing", "SolarizeIncreasing",
                  "SolarizeAdd", "ColorIncreasing", "ContrastIncreasing", "BrightnessIncreasing",
                  "SharpnessIncreasing", "ShearX", "ShearY", "TranslateXRel", "TranslateYRel")
# the image functions the ops run (an op is a kernel and a rule from magnitude to argument); the index of a
# kernel is its number in `plan_arrays`
KERNELS = DEFAULT_OPS + ("GaussianBlur",)  # the kernels a plan row indexes (3-Augment adds the blur)
GEOMETRIC = ("Rotate", "ShearX", "ShearY", "TranslateXRel", "TranslateYRel")
LEVEL_DENOM = 10.0  # timm's `_LEVEL_DENOM`: magnitude m is the fraction m / 10 of each op's range
TIMM_FILL = (128, 128, 128)  # timm's `_FILL`, the fill of geometric ops without an image mean
TRANSLATE_PCT = 0.45  # timm's default `translate_pct`: a translation of up to 45% of the side
INTERPOLATIONS = ("random", "bilinear", "bicubic")
_INTEGER_SECTIONS = {"n": "num_ops", "m": "magnitude", "mmax": "magnitude_max", "inc": "increasing"}
_FLOAT_SECTIONS = {"p": "prob", "mstd": "magnitude_std"}


def _enhance(m, sign):
    return m / LEVEL_DENOM * 1.8 + 0.1


def _enhance_increasing(m, sign):
    return max(0.1, 1.0 + sign * m / LEVEL_DENOM * 0.9)


def _posterize(m, sign):
    return int(m / LEVEL_DENOM * 4)


def _solarize(m, sign):
    return min(256, int(m / LEVEL_DENOM * 256))


# each op: (kernel, argument from (magnitude, sign), whether it draws a sign): timm's `LEVEL_TO_ARG`
OPS = {
    "AutoContrast": ("AutoContrast", None, False),
    "Equalize": ("Equalize", None, False),
    "Invert": ("Invert", None, False),
    "Rotate": ("Rotate", lambda m, s: s * m / LEVEL_DENOM * 30.0, True),
    "Posterize": ("Posterize", _posterize, False),
    "PosterizeIncreasing": ("Posterize", lambda m, s: 4 - _posterize(m, s), False),
    "Solarize": ("Solarize", _solarize, False),
    "SolarizeIncreasing": ("Solarize", lambda m, s: 256 - _solarize(m, s), False),
    "SolarizeAdd": ("SolarizeAdd", lambda m, s: min(128, int(m / LEVEL_DENOM * 110)), False),
    "Color": ("Color", _enhance, False),
    "ColorIncreasing": ("Color", _enhance_increasing, True),
    "Contrast": ("Contrast", _enhance, False),
    "ContrastIncreasing": ("Contrast", _enhance_increasing, True),
    "Brightness": ("Brightness", _enhance, False),
    "BrightnessIncreasing": ("Brightness", _enhance_increasing, True),
    "Sharpness": ("Sharpness", _enhance, False),
    "SharpnessIncreasing": ("Sharpness", _enhance_increasing, True),
    "ShearX": ("ShearX", lambda m, s: s * m / LEVEL_DENOM * 0.3, True),
    "ShearY": ("ShearY", lambda m, s: s * m / LEVEL_DENOM * 0.3, True),
    "TranslateXRel": ("TranslateXRel", lambda m, s: s * m / LEVEL_DENOM * TRANSLATE_PCT, True),
    "TranslateYRel": ("TranslateYRel", lambda m, s: s * m / LEVEL_DENOM * TRANSLATE_PCT, True),
    "GaussianBlur": ("GaussianBlur", None, False),  # 3-Augment's (keras_vit.data.three_augment): arg the radius
}


@dataclasses.dataclass(frozen=True)
class Step:
    """One op applied to an image: `op` (a name of `OPS`), `arg` its argument (degrees, bits, threshold,
    enhancement factor, shear, or translation as a fraction of the side; 0 for ops without one) and
    `bicubic` (geometric ops: bicubic rather than bilinear interpolation)."""

    op: str
    arg: float = 0.0
    bicubic: bool = False

    @property
    def kernel(self):
        return OPS[self.op][0]


@dataclasses.dataclass(frozen=True)
class RandAugmentConfig:
    """A parsed RandAugment string (see the module's docstring) and the options timm takes beside it.

    Args:
        num_ops: ops drawn per image (timm's `n`).
        magnitude: the magnitude, 0-10 (timm's `m`; above 10 with `magnitude_max`).
        prob: the probability that each drawn op is applied (timm's `p`).
        magnitude_std: std of the gaussian noise on the magnitude (timm's `mstd`); `math.inf`: uniform in
            [0, magnitude].
        magnitude_max: the upper clip of the noisy magnitude (timm's `mmax`; None or 0: 10).
        increasing: whether `ops` defaults to `INCREASING_OPS` (timm's `inc`); informative once parsed.
        ops: the op names drawn from (names of `OPS`).
        fill: the RGB colour geometric ops fill with (timm's `img_mean`; see `fill_color`).
        interpolation: "random" (bilinear or bicubic per op, timm's default), "bilinear" or "bicubic".
    """

    num_ops: int = 2
    magnitude: float = 10
    prob: float = 0.5
    magnitude_std: float = 0.0
    magnitude_max: int | None = None
    increasing: bool = False
    ops: tuple = DEFAULT_OPS
    fill: tuple = TIMM_FILL
    interpolation: str = "random"

    def __post_init__(self):
        unknown = [name for name in self.ops if name not in OPS]
        if unknown:
            raise ValueError(f"unknown RandAugment op {unknown[0]!r}; expected one of {sorted(OPS)}")
        if not self.ops:
            raise ValueError("RandAugment needs at least one op to draw from; got an empty `ops`")
        if len(self.fill) != 3 or not all(isinstance(v, (int, np.integer)) and 0 <= v <= 255 for v in self.fill):
            raise ValueError(f"`fill` must be 3 integers in [0, 255] (an RGB colour); got {self.fill!r}")
        if self.interpolation not in INTERPOLATIONS:
            raise ValueError(f"`interpolation` must be one of {INTERPOLATIONS}; got {self.interpolation!r}")

    def draw(self, rng):
        """`draw(self, rng)`: the steps of one image from `rng` (as `ThreeAugment.draw`, so a feed calls either)."""
        return draw(self, rng)

    @property
    def upper(self):
        """The magnitude's upper clip (timm: `magnitude_max or 10`)."""
        return self.magnitude_max or LEVEL_DENOM


def fill_color(normalization="vit"):
    """The fill of geometric ops as timm's `create_transform` passes it: the mean colour of `normalization`
    (a key of `keras_vit.preprocessing.NORMALIZATIONS`: "vit" gives (128, 128, 128), "imagenet"
    (124, 116, 104)), each channel `min(255, round(255 * mean))`."""
    if normalization not in NORMALIZATIONS:
        raise ValueError(f"`normalization` must be one of {sorted(NORMALIZATIONS)}; got {normalization!r}")
    return tuple(min(255, round(255 * v)) for v in NORMALIZATIONS[normalization][0])


def _section_value(section, key, text):
    """The value of one section (`key` followed by `text`), or a ValueError naming the section."""
    convert, what = (int, "an integer") if key in _INTEGER_SECTIONS else (float, "a number")
    try:
        value = convert(text)
    except ValueError:
        raise ValueError(f"RandAugment section {section!r}: {key!r} takes {what}; got {text!r}") from None
    low = {"p": 0.0, "inc": 0, "mmax": 0}.get(key, 0)
    high = {"p": 1.0, "inc": 1}.get(key, math.inf)
    if not low <= value <= high or math.isnan(value):
        raise ValueError(f"RandAugment section {section!r}: {key!r} must be in [{low}, {high}]; got {value}")
    return value


def parse(spec, *, fill=TIMM_FILL, interpolation="random", ops=None):
    """A `RandAugmentConfig` from timm's RandAugment string, e.g. ``"rand-m9-mstd0.5-inc1"``.

    Args:
        spec: the string: "rand" then "-"-separated sections `n`, `m`, `p`, `mstd`, `mmax`, `inc` (see the
            module's docstring), each at most once.
        fill: the fill colour of geometric ops (see `fill_color`).
        interpolation: "random", "bilinear" or "bicubic" (timm's `interpolation`; "random" is timm's
            default for training).
        ops: op names to draw from instead of the set `inc` picks (timm's `transforms`).

    Raises:
        ValueError: naming the part that does not parse (not "rand" first, an unknown or repeated
            section, a value that is not a number or is out of range) or an unknown op name.
    """
    if not isinstance(spec, str):
        raise ValueError(f"a RandAugment string such as 'rand-m9-mstd0.5-inc1' was expected; got {spec!r}")
    head, *sections = spec.split("-")
    if head != "rand":
        raise ValueError(f"a RandAugment string starts with 'rand' (as 'rand-m9-mstd0.5-inc1'); got {head!r} "
                         f"in {spec!r}")
    values = {}
    for section in sections:
        match = re.fullmatch(r"([a-z]+)(.+)", section)
        if not match or match[1] not in {**_INTEGER_SECTIONS, **_FLOAT_SECTIONS}:
            raise ValueError(f"unknown RandAugment section {section!r} in {spec!r}; expected n<int>, m<int>, "
                             "p<float>, mstd<float>, mmax<int> or inc<0|1>")
        key = match[1]
        name = _INTEGER_SECTIONS.get(key) or _FLOAT_SECTIONS[key]
        if name in values:
            raise ValueError(f"RandAugment section {key!r} given twice in {spec!r}")
        values[name] = _section_value(section, key, match[2])
    if values.get("magnitude_std", 0) > 100:  # timm: uniform magnitudes in [0, m]
        values["magnitude_std"] = math.inf
    increasing = bool(values.pop("increasing", 0))
    chosen = tuple(ops) if ops is not None else INCREASING_OPS if increasing else DEFAULT_OPS
    return RandAugmentConfig(increasing=increasing, ops=chosen, fill=tuple(fill), interpolation=interpolation,
                             **values)


def _magnitude(config, rng):
    """timm's `AugmentOp` magnitude: noisy (gaussian, or uniform for an infinite std), clipped to [0, upper]."""
    magnitude = config.magnitude
    if config.magnitude_std == math.inf:
        magnitude = rng.uniform(0, magnitude)
    elif config.magnitude_std > 0:
        magnitude = rng.normal(magnitude, config.magnitude_std)
    return max(0.0, min(float(magnitude), config.upper))


def draw(config, rng):
    """The ops of one image, a tuple of `Step`s in the order they apply, drawn from `rng` (a
    `numpy.random.Generator` or `RandomState`) in timm's order (see the module's docstring).

    Args:
        config: a `RandAugmentConfig` (`parse`).
        rng: the image's generator, e.g. ``np.random.default_rng([seed, pass_index, image_index])``.
    """
    steps = []
    for pick in rng.choice(len(config.ops), config.num_ops, replace=True):
        name = config.ops[int(pick)]
        if config.prob < 1.0 and rng.random() > config.prob:  # timm: skipped when random() > p
            continue
        magnitude = _magnitude(config, rng)
        _, level, signed = OPS[name]
        sign = -1.0 if signed and rng.random() > 0.5 else 1.0  # timm's `_randomly_negate`
        arg = float(level(magnitude, sign)) if level else 0.0
        bicubic = False
        if name in GEOMETRIC:
            bicubic = rng.random() < 0.5 if config.interpolation == "random" else config.interpolation == "bicubic"
        steps.append(Step(name, arg, bool(bicubic)))
    return tuple(steps)


def plan_arrays(steps, num_ops):
    """`steps` as arrays for TensorFlow, padded to `num_ops` rows: (kernels int32 (num_ops,), the index of
    each step's kernel in `KERNELS`, -1 for none; args float64 (num_ops,); bicubic bool (num_ops,))."""
    if len(steps) > num_ops:
        raise ValueError(f"{len(steps)} RandAugment steps do not fit in {num_ops} rows")
    kernels = np.full(num_ops, -1, np.int32)
    args, bicubic = np.zeros(num_ops, np.float64), np.zeros(num_ops, bool)
    for i, step in enumerate(steps):
        kernels[i], args[i], bicubic[i] = KERNELS.index(step.kernel), step.arg, step.bicubic
    return kernels, args, bicubic


def _affine(image, matrix, step, fill):
    from PIL import Image

    resample = Image.Resampling.BICUBIC if step.bicubic else Image.Resampling.BILINEAR
    return image.transform(image.size, Image.Transform.AFFINE, matrix, resample, fillcolor=fill)


def _pillow_step(image, step, fill):
    """One step on a Pillow RGB image, as timm's op functions do it."""
    from PIL import Image, ImageEnhance, ImageFilter, ImageOps

    kernel, arg = step.kernel, step.arg
    if kernel == "GaussianBlur":
        return image.filter(ImageFilter.GaussianBlur(radius=arg))
    if kernel in ("Color", "Contrast", "Brightness", "Sharpness"):
        return getattr(ImageEnhance, kernel)(image).enhance(arg)
    if kernel == "Rotate":
        resample = Image.Resampling.BICUBIC if step.bicubic else Image.Resampling.BILINEAR
        return image.rotate(arg, resample=resample, fillcolor=fill)
    matrices = {"ShearX": (1, arg, 0, 0, 1, 0), "ShearY": (1, 0, 0, arg, 1, 0),
                "TranslateXRel": (1, 0, arg * image.size[0], 0, 1, 0),
                "TranslateYRel": (1, 0, 0, 0, 1, arg * image.size[1])}
    if kernel in matrices:
        return _affine(image, matrices[kernel], step, fill)
    if kernel == "Posterize":  # Pillow >= 11 refuses 0 bits, which older Pillow (and timm with it) made black
        bits = int(arg)
        return image if bits >= 8 else ImageOps.posterize(image, bits) if bits > 0 else image.point([0] * 768)
    if kernel == "Solarize":
        return ImageOps.solarize(image, int(arg))
    if kernel == "SolarizeAdd":
        return image.point([min(255, i + int(arg)) if i < 128 else i for i in range(256)] * 3)
    return {"AutoContrast": ImageOps.autocontrast, "Equalize": ImageOps.equalize,
            "Invert": ImageOps.invert}[kernel](image)


def apply_pillow(image, steps, fill=TIMM_FILL):
    """`steps` (from `draw`) applied to `image`, a uint8 (H, W, 3) array, with Pillow and numpy (no
    TensorFlow); geometric ops fill with `fill` (an RGB colour). Returns a new uint8 (H, W, 3) array."""
    from PIL import Image

    image = np.asarray(image)
    if image.dtype != np.uint8 or image.ndim != 3 or image.shape[-1] != 3:
        raise ValueError(f"RandAugment takes a uint8 (height, width, 3) image; got {image.dtype} {image.shape}")
    picture = Image.fromarray(image)
    for step in steps:
        picture = _pillow_step(picture, step, tuple(int(v) for v in fill))
    return np.asarray(picture)


def apply_planned(image, kernels, args, bicubic, fill=TIMM_FILL):
    """`apply_pillow` of the steps that `plan_arrays` wrote as (`kernels`, `args`, `bicubic`) rows, on `image`
    (uint8 (H, W, 3)) with `fill`: what tf.data runs through `tf.numpy_function`."""
    steps = [Step(KERNELS[int(k)], float(a), bool(b)) for k, a, b in zip(kernels, args, bicubic) if k >= 0]
    return apply_pillow(image, steps, fill)


__all__ = ["DEFAULT_OPS", "INCREASING_OPS", "RandAugmentConfig", "Step", "apply_pillow", "apply_planned", "draw",
           "fill_color", "parse", "plan_arrays"]
