"""DeiT III's 3-Augment as timm runs it (``--aa 3a``): per image, one of solarization (threshold 128),
grayscale and a Gaussian blur of radius uniform in [0.1, 2.0], chosen uniformly (timm's AutoAugment policy
"3a"), then colour jitter (brightness, contrast and saturation factors each uniform in
[max(0, 1 - j), 1 + j], applied in a random order, as torchvision's `ColorJitter` on a Pillow image).

It is written in RandAugment's terms (`keras_vit.data.rand_augment`): `draw` returns `Step`s that
`apply_pillow` applies and `plan_arrays` carries through tf.data, so both feeds run it as they run RandAugment.
timm and torchvision draw from Python's `random` and torch's generator; the draws here come from the image's
numpy generator and follow the same distributions.

    config = ThreeAugment(color_jitter=0.3)             # DeiT III's jitter
    steps = config.draw(np.random.default_rng([seed, pass_index, image_index]))
    image = apply_pillow(image, steps)
"""

import dataclasses

from keras_vit.data.rand_augment import TIMM_FILL, Step, _solarize

NAME = "3a"  # timm's --aa value
SOLARIZE_MAGNITUDE = 5  # timm's policy "3a": Solarize at magnitude 5, a threshold of 128
BLUR_RADIUS = (0.1, 2.0)  # timm's GaussianBlurRand at magnitude 10
JITTER_OPS = ("Brightness", "Contrast", "Color")  # torchvision's ColorJitter on Pillow (Color: saturation)
DEFAULT_JITTER = 0.4  # timm's --color-jitter default


@dataclasses.dataclass(frozen=True)
class ThreeAugment:
    """3-Augment's options (see the module's docstring).

    Args:
        color_jitter: the jitter's strength j in [0, 1]: each factor uniform in [max(0, 1 - j), 1 + j]; 0 turns
            the jitter off (timm's --color-jitter; DeiT III 0.3, timm's default 0.4).
        fill: unused (no geometric op); kept so that a feed treats it as a `RandAugmentConfig`.
    """

    color_jitter: float = DEFAULT_JITTER
    fill: tuple = TIMM_FILL

    def __post_init__(self):
        if isinstance(self.color_jitter, bool) or not isinstance(self.color_jitter, (int, float)) \
                or not 0 <= self.color_jitter <= 1:
            raise ValueError(f"`color_jitter` must be a number in [0, 1]; got {self.color_jitter!r}")

    @property
    def num_ops(self):
        """The most steps an image gets: the chosen op and the three jitter factors."""
        return 1 + (len(JITTER_OPS) if self.color_jitter else 0)

    def draw(self, rng):
        """The steps of one image from `rng` (a numpy generator): the chosen op, then the jitter in its order.

        Args:
            rng: the image's generator, e.g. ``np.random.default_rng([seed, pass_index, image_index])``.
        """
        pick = int(rng.integers(3))
        if pick == 0:
            steps = [Step("Solarize", float(_solarize(SOLARIZE_MAGNITUDE, 1.0)))]
        elif pick == 1:
            steps = [Step("Color", 0.0)]  # timm's Desaturate at magnitude 10: Color enhanced by 0
        else:
            steps = [Step("GaussianBlur", float(rng.uniform(*BLUR_RADIUS)))]
        if self.color_jitter:
            j = float(self.color_jitter)
            factors = rng.uniform(max(0.0, 1.0 - j), 1.0 + j, len(JITTER_OPS))
            steps += [Step(JITTER_OPS[i], float(factors[i])) for i in rng.permutation(len(JITTER_OPS))]
        return tuple(steps)


def parse(spec, color_jitter=DEFAULT_JITTER):
    """A `ThreeAugment` for the --aa value `spec` ("3a"), else a ValueError naming what came.

    Args:
        spec: the string, "3a".
        color_jitter: the jitter's strength (see `ThreeAugment`).
    """
    if spec != NAME:
        raise ValueError(f"3-Augment is spelled {NAME!r} (timm's --aa 3a); got {spec!r}")
    return ThreeAugment(color_jitter=color_jitter)


__all__ = ["ThreeAugment", "parse"]
