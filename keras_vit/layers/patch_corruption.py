"""The corruption of masked patch prediction (paper section 4.6, appendix B.1.2), as in BERT."""

import keras
from keras import ops


@keras.saving.register_keras_serializable(package="keras_vit")
class MaskedPatchCorruption(keras.layers.Layer):
    """Corrupts `rate` of each image's patch embeddings: of those, `mask_fraction` are replaced by a
    learnable [mask] embedding, `random_fraction` by the embedding of another patch of the same
    image (drawn uniformly), and the rest are kept as they are.

    Exactly `round(rate * N)` of the N patches of every image are corrupted (drawn uniformly
    without replacement); each corrupted patch then draws its treatment independently. It
    corrupts in training and inference alike (the objective is defined on corrupted inputs).
    Random draws use `keras.random` with this layer's `SeedGenerator`.

    Args:
        rate: fraction of the patches corrupted (the paper: 0.5).
        mask_fraction: fraction of the corrupted ones replaced by the [mask] embedding (0.8).
        random_fraction: fraction replaced by another patch's embedding (0.1).
        seed: seed of the layer's `SeedGenerator` (None: drawn from Keras' global seed).
    Call returns:
        (tokens (B, N, D) with the corruption applied, corrupted (B, N) float 0/1).
    """

    def __init__(self, rate=0.5, mask_fraction=0.8, random_fraction=0.1, seed=None, **kwargs):
        super().__init__(**kwargs)
        self.rate, self.mask_fraction, self.random_fraction = float(rate), float(mask_fraction), float(random_fraction)
        if not 0.0 < self.rate <= 1.0:
            raise ValueError(f"rate must be in (0, 1], got {rate}")
        if min(self.mask_fraction, self.random_fraction) < 0 or self.mask_fraction + self.random_fraction > 1:
            raise ValueError(
                f"mask_fraction and random_fraction must be >= 0 and sum to <= 1, got {mask_fraction}, {random_fraction}"
            )
        self.seed = seed
        self.seed_generator = keras.random.SeedGenerator(seed)
        self.input_spec = keras.InputSpec(ndim=3)

    def build(self, input_shape):
        if input_shape[1] is not None and input_shape[1] < 2:
            raise ValueError(f"MaskedPatchCorruption needs at least 2 patches, got input shape {tuple(input_shape)}")
        self.mask_token = self.add_weight(
            name="mask_token", shape=(1, 1, input_shape[-1]), initializer=keras.initializers.RandomNormal(stddev=0.02)
        )

    def call(self, tokens):
        n = tokens.shape[1]
        shape = (ops.shape(tokens)[0], n)
        count = max(1, round(self.rate * n))
        noise = keras.random.uniform(shape, seed=self.seed_generator)
        corrupted = ops.argsort(ops.argsort(noise, axis=-1), axis=-1) < count
        draw = keras.random.uniform(shape, seed=self.seed_generator)
        masked = corrupted & (draw < self.mask_fraction)
        replaced = corrupted & (draw >= self.mask_fraction) & (draw < self.mask_fraction + self.random_fraction)
        # another patch of the same image: an offset in [1, N) from this one, modulo N
        offset = keras.random.randint(shape, 1, n, seed=self.seed_generator, dtype="int32")
        source = (ops.arange(n, dtype="int32")[None] + offset) % n
        other = ops.take_along_axis(tokens, ops.broadcast_to(source[:, :, None], ops.shape(tokens)), axis=1)
        mask_token = ops.cast(self.mask_token, tokens.dtype)
        out = ops.where(masked[:, :, None], mask_token, ops.where(replaced[:, :, None], other, tokens))
        return out, ops.cast(corrupted, tokens.dtype)

    def compute_output_shape(self, input_shape):
        return input_shape, input_shape[:2]

    def get_config(self):
        return {
            **super().get_config(),
            "rate": self.rate,
            "mask_fraction": self.mask_fraction,
            "random_fraction": self.random_fraction,
            "seed": self.seed,
        }
