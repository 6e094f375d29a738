"""Which augmentations a training feed runs beyond the paper's crop and flip, in one frozen record (`Augment`),
and how each feed runs them, in timm's order (`timm.data.create_transform` for training):

1. the Inception crop, the resize and the flip (the plan of `keras_vit.data.stream`);
2. RandAugment (`auto_augment`, timm's ``--aa``, e.g. "rand-m9-mstd0.5-inc1"; `keras_vit.data.rand_augment`)
   on the resized crop rounded to uint8, geometric ops filling with the ViT normalisation's mean (128, 128, 128),
   or DeiT III's 3-Augment (``--aa 3a`` with ``color_jitter``; `keras_vit.data.three_augment`) in its place;
3. the normalisation to [-1, 1];
4. random erasing (`re_prob`, `re_mode`, `re_count`: timm's ``--reprob``, ``--remode``, ``--recount``;
   `keras_vit.data.random_erasing`) of the normalised float32 image.

Repeated augmentation (`aug_repeats`, timm's ``--aug-repeats``; `keras_vit.data.repeat_aug`) changes the order
of a pass, not an image. Every draw of an image is made in numpy from its position in the stream:
``position_rng(seed, pass, position, RAND_AUGMENT_STREAM)`` and ``(..., ERASE_STREAM)``, so the tf.data path
(`plan`, then `finish_tensor` in the map) and the numpy path (`finish_image`, the `PyDataset`) give the same
images, and ``skip_batches`` starts the stream exactly where an uninterrupted one would be.

uint8 output (``image_dtype="uint8"``, for a model that scales its images itself, as `keras-vit finetune`
feeds) with random erasing: the image is normalised, erased, and mapped back to pixels
(``round(clip(127.5 x + 127.5, 0, 255))``). Pixels outside the boxes come back unchanged; inside, the noise
is the float feed's noise as pixel values, clipped at |z| > 1 (timm's unclipped N(0, 1) in normalised space
cannot be held by uint8). For a model whose own normalisation is not the ViT one ([-1, 1]), the fill's
spread in its input space differs accordingly.
"""

import dataclasses
import functools

import numpy as np

from keras_vit.data import preprocess, rand_augment, three_augment
from keras_vit.data.random_erasing import DRAW_FIELDS, MODES, RandomErasing
from keras_vit.data.stream import ERASE_STREAM, RAND_AUGMENT_STREAM, position_rng

# each option's name in Python (`from_directory`, `load`) and on the command line (timm's train.py spelling)
PYTHON_NAMES = {"auto_augment": "`auto_augment`", "re_prob": "`re_prob`", "re_mode": "`re_mode`",
                "re_count": "`re_count`", "aug_repeats": "`aug_repeats`", "color_jitter": "`color_jitter`"}
FLAG_NAMES = {"auto_augment": "--aa", "re_prob": "--reprob", "re_mode": "--remode", "re_count": "--recount",
              "aug_repeats": "--aug-repeats", "color_jitter": "--color-jitter"}
# the dtypes of `Augment.plan`'s arrays (RandAugment's kernels, arguments and interpolations; erasing's boxes)
PLAN_DTYPES = ("int32", "float64", "bool", "int64")
_PIXEL = np.float32(127.5)  # the ViT normalisation: x = (pixel - 127.5) / 127.5


def _is_int(value):
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def check_options(values, names=PYTHON_NAMES):
    """Refuses an augmentation option outside its range, the option named as `names` spells it.

    Args:
        values: {option: value} for the options of `Augment` (those left out are not checked).
        names: how each option is named in the message (`PYTHON_NAMES` or `FLAG_NAMES`).

    Raises:
        ValueError: one message naming the option, its range and the value given.
    """
    def refuse(option, expected):
        raise ValueError(f"{names[option]} must be {expected}; got {values[option]!r}")

    aa = values.get("auto_augment")
    if aa is not None and aa != three_augment.NAME:
        if not isinstance(aa, str):
            refuse("auto_augment", "a RandAugment string such as 'rand-m9-mstd0.5-inc1', '3a' or None")
        try:
            rand_augment.parse(aa)
        except ValueError as err:
            raise ValueError(f"{names['auto_augment']} {aa!r} does not parse: {err}") from None
    prob = values.get("re_prob", 0.0)
    if isinstance(prob, bool) or not isinstance(prob, (int, float, np.floating)) or not 0 <= prob <= 1:
        refuse("re_prob", "a probability in [0, 1] (0: no random erasing)")
    if values.get("re_mode", "pixel") not in MODES:
        refuse("re_mode", f"one of {', '.join(MODES)}")
    jitter = values.get("color_jitter")
    if jitter is not None and (isinstance(jitter, bool) or not isinstance(jitter, (int, float, np.floating))
                               or not 0 <= jitter <= 1):
        refuse("color_jitter", "a number in [0, 1] (3-Augment's colour jitter; 0: none), or None (0.4)")
    for option in ("re_count", "aug_repeats"):
        value = values.get(option, 1)
        if not _is_int(value) or value < 1:
            refuse(option, "an integer >= 1" + (" (1: each image once a pass)" if option == "aug_repeats" else ""))


def flag_values(args):
    """{option: the value of its flag in `args` (argparse's namespace, `FLAG_NAMES`' flags), None when absent}."""
    return {option: getattr(args, flag[2:].replace("-", "_"), None) for option, flag in FLAG_NAMES.items()}


@dataclasses.dataclass(frozen=True)
class Augment:
    """The augmentations of a training stream beyond the crop and flip (see the module's docstring), named as
    timm's `create_transform` names them.

    Args:
        auto_augment: a RandAugment string in timm's language (e.g. "rand-m9-mstd0.5-inc1", DeiT's), "3a"
            (DeiT III's 3-Augment), or None.
        re_prob: the probability that random erasing erases an image, in [0, 1] (DeiT 0.25; 0: off).
        re_mode: the erased boxes' fill: "pixel" (normal noise per pixel), "rand" (per channel) or "const".
        re_count: the most boxes an image gets (each image 1 to `re_count`), an integer >= 1.
        aug_repeats: each image this many times in a row of a pass, differently augmented, an integer >= 1.
        color_jitter: with "3a", the colour jitter's strength in [0, 1] (timm's ``--color-jitter``; None: timm's
            default 0.4; DeiT III 0.3); unused otherwise, as timm turns the jitter off beside RandAugment.

    Raises:
        ValueError: an option outside its range, named (`check_options`).
    """

    auto_augment: str = None
    re_prob: float = 0.0
    re_mode: str = "pixel"
    re_count: int = 1
    aug_repeats: int = 1
    color_jitter: float = None

    def __post_init__(self):
        self.check()

    def check(self, names=PYTHON_NAMES):
        """Refuses an option outside its range, named as `names` spells it (`check_options`); returns self."""
        check_options(dataclasses.asdict(self), names)
        return self

    @classmethod
    def from_flags(cls, args):
        """The `Augment` of `keras-vit finetune`'s flags (`args`, argparse's namespace: ``aa``, ``reprob``,
        ``remode``, ``recount``, ``aug_repeats``, each None or absent for its default), refused by flag name."""
        values = flag_values(args)
        defaults = {f.name: f.default for f in dataclasses.fields(cls)}
        values = {k: defaults[k] if v is None else v for k, v in values.items()}
        check_options(values, FLAG_NAMES)
        return cls(**values)

    @property
    def per_image(self):
        """Whether an image's pixels change beyond the crop and flip (RandAugment or erasing): draws to plan."""
        return self.rand_augment is not None or self.eraser is not None

    @functools.cached_property
    def rand_augment(self):
        """The parsed `RandAugmentConfig` (geometric ops filling with the ViT mean), a `ThreeAugment`, or None."""
        if self.auto_augment is None:
            return None
        if self.auto_augment == three_augment.NAME:
            jitter = three_augment.DEFAULT_JITTER if self.color_jitter is None else self.color_jitter
            return three_augment.parse(self.auto_augment, color_jitter=jitter)
        return rand_augment.parse(self.auto_augment, fill=rand_augment.fill_color("vit"))

    @functools.cached_property
    def eraser(self):
        """The `RandomErasing` of `re_prob`, `re_mode` and `re_count` (timm's arguments), or None when off."""
        return RandomErasing(self.re_prob, self.re_mode, max_count=self.re_count) if self.re_prob > 0 else None

    @property
    def plan_shapes(self):
        """The shapes of `plan`'s arrays, n left None (for tf.data's static shapes)."""
        ops = self.rand_augment.num_ops if self.rand_augment is not None else 0
        boxes = self.eraser.boxes if self.eraser is not None else 0
        return ((None, ops),) * 3 + ((None, boxes, len(DRAW_FIELDS)),)

    def finish_image(self, image, image_dtype, seed, pass_index, position):
        """The numpy path: `image` (float (H, W, 3) after resize and flip, in pixels) augmented and finished as
        `image_dtype` ("float32" in [-1, 1] or "uint8"), its draws from (`seed`, `pass_index`, `position`)."""
        config = self.rand_augment
        if config is not None:
            steps = config.draw(position_rng(seed, pass_index, position, RAND_AUGMENT_STREAM))
            image = rand_augment.apply_pillow(preprocess.finish(image, "uint8"), steps, config.fill)
            image = image.astype(np.float32)
        if self.eraser is None:
            return preprocess.finish(image, image_dtype)
        draws = self.eraser.draw(position_rng(seed, pass_index, position, ERASE_STREAM), *image.shape[:2])
        erased = self.eraser.apply(preprocess.finish(image, "float32"), draws)
        if image_dtype == "uint8":
            return np.round(np.clip(erased * _PIXEL + _PIXEL, 0, 255)).astype(np.uint8)
        return erased

    def plan(self, seed, pass_index, positions, height, width):
        """The tf.data path's draws of the examples at `positions` of pass `pass_index` of the run seeded `seed`
        (a `height` x `width` output), the same as `finish_image`'s: (kernels int32 (n, ops), args float64 (n, ops), bicubic bool
        (n, ops), erasing's boxes int64 (n, boxes, 5)), ops 0 without RandAugment, boxes 0 without erasing."""
        config, n = self.rand_augment, len(positions)
        ops = self.plan_shapes[0][1]
        kernels, args, bicubic = np.full((n, ops), -1, np.int32), np.zeros((n, ops)), np.zeros((n, ops), bool)
        for i, j in enumerate(positions if config is not None else ()):
            steps = config.draw(position_rng(seed, pass_index, int(j), RAND_AUGMENT_STREAM))
            kernels[i], args[i], bicubic[i] = rand_augment.plan_arrays(steps, ops)
        if self.eraser is None:
            return kernels, args, bicubic, np.zeros((n, 0, len(DRAW_FIELDS)), np.int64)
        return kernels, args, bicubic, self.eraser.plan(seed, pass_index, positions, height, width)

    def finish_tensor(self, tf, image, image_dtype, kernels, args, bicubic, boxes):
        """The tf.data path: `finish_image` in TensorFlow ops, `image` a float (H, W, 3) tensor after resize and
        flip, finished as `image_dtype`; `kernels`, `args`, `bicubic` and `boxes` one row of each of `plan`'s
        arrays; `tf` the TensorFlow module."""
        config = self.rand_augment
        if config is not None:
            shape = image.shape
            image = tf.numpy_function(functools.partial(rand_augment.apply_planned, fill=config.fill),
                                      [preprocess.finish_tensor(tf, image, "uint8"), kernels, args, bicubic], tf.uint8,
                                      stateful=False)  # Pillow, as the PyDataset: the same images, in parallel
            image = tf.cast(tf.ensure_shape(image, shape), tf.float32)
        if self.eraser is None:
            return preprocess.finish_tensor(tf, image, image_dtype)
        erased = self.eraser.apply_tensor(tf, preprocess.finish_tensor(tf, image, "float32"), boxes)
        if image_dtype == "uint8":
            return tf.cast(tf.round(tf.clip_by_value(erased * 127.5 + 127.5, 0.0, 255.0)), tf.uint8)
        return erased


__all__ = ["FLAG_NAMES", "PLAN_DTYPES", "PYTHON_NAMES", "Augment", "check_options", "flag_values"]
