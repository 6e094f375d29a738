"""DINOv3's training-time augmentation of its rotary coordinates (Simeoni et al. 2025, its
`RopePositionEmbedding`; transformers' `augment_patches_center_coordinates`, timm's `_apply_coord_augs`): in
training, one draw per forward moves every block's patch coordinates c (in [-1, 1]) to (c + shift) * jitter *
rescale, with the shift uniform in [-s, s] per axis, the jitter log-uniform in [1/J, J] per axis and the rescale
log-uniform in [1/R, R], one for both axes. Evaluation leaves the coordinates as they are."""

import math

import keras
from keras import ops

from keras_vit.layers.rotary import AUGMENTATION_KEYS, check_rope, rope_augmented


@keras.saving.register_keras_serializable(package="keras_vit")
class RotaryAugment(keras.layers.Layer):
    """The draw of one forward, (3, 2) float32: the rows' and the columns' shift, jitter and rescale (the
    identity, zeros and ones, outside training or for an augmentation that is None), which the model's rotary
    blocks read (`TransformerBlock`'s `rope_augment`), so that every block sees the same coordinates.

    Args:
        shift: None, or s >= 0: each axis's coordinates are shifted by a uniform draw in [-s, s].
        jitter: None, or J >= 1: each axis's are scaled by its own draw of exp(uniform(-log J, log J)).
        rescale: None, or R >= 1: both are scaled by one draw of exp(uniform(-log R, log R)).
        seed: the seed of the layer's generator (`keras.random.SeedGenerator`), or None for a random one.
    Call args:
        x: any tensor of the model (the draw does not read it: it places the layer in the model).
        training: whether to draw; otherwise the identity.
    """

    def __init__(self, shift=None, jitter=None, rescale=None, seed=None, **kwargs):
        super().__init__(**kwargs)
        checked = check_rope({"kind": "dinov3", "shift": shift, "jitter": jitter, "rescale": rescale},
                             type(self).__name__)
        self.shift, self.jitter, self.rescale = checked["shift"], checked["jitter"], checked["rescale"]
        self.seed = seed
        self.seed_generator = keras.random.SeedGenerator(seed, name="rope_augment_seed")

    def call(self, x, training=None):
        zeros, ones = ops.zeros((2,), "float32"), ops.ones((2,), "float32")
        if not training:
            return ops.stack([zeros, ones, ones])

        def log_uniform(factor, n):  # in the sources' order of draws: shift, jitter, rescale
            if factor is None:
                return ones
            draw = keras.random.uniform((n,), -math.log(factor), math.log(factor), seed=self.seed_generator)
            return ops.broadcast_to(ops.exp(draw), (2,))

        shift = zeros if self.shift is None else keras.random.uniform((2,), -self.shift, self.shift,
                                                                      seed=self.seed_generator)
        jitter = log_uniform(self.jitter, 2)
        return ops.stack([shift, jitter, log_uniform(self.rescale, 1)])

    def compute_output_spec(self, x, training=None):
        return keras.KerasTensor((3, 2), "float32")  # whatever the policy: the coordinates are float32

    def get_config(self):
        return {**super().get_config(), "shift": self.shift, "jitter": self.jitter, "rescale": self.rescale,
                "seed": self.seed}


def rotary_augment_inputs(rope, x):
    """The rotary blocks' `rope_augment` call argument of a model of `rope` (`check_rope`'s dict, or None) whose
    tokens are `x`: {} without an augmentation, else {"rope_augment": a `RotaryAugment` layer's draw}."""
    if not rope_augmented(rope):
        return {}
    return {"rope_augment": RotaryAugment(*(rope[k] for k in AUGMENTATION_KEYS), name="rope_augment")(x)}
