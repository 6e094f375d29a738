"""GroupNorm with its statistics in two passes: the hybrid stem's norm, as exact as torch's and flax's."""

import keras
from keras import ops


@keras.saving.register_keras_serializable(package="keras_vit")
class GroupNorm(keras.layers.GroupNormalization):
    """`keras.layers.GroupNormalization` (the same weights, `gamma` and `beta`, and config) over the last axis, its
    variance the mean of the squared deviations rather than E[x^2] - E[x]^2, and the output (x - mean) *
    rsqrt(var + eps) * gamma + beta: Keras' one-pass variance loses digits where the mean is large beside the
    deviation, as in a ResNet's activations (a 384 px R50 stem drifted 1e-5 of the output's scale from timm's).

    Args:
        groups: channel groups (32, the hybrid stem's); the channels must divide into them.
        axis: -1 only (channels last).
        **kwargs: other `keras.layers.GroupNormalization` arguments (epsilon, center, scale, initializers).
    """

    def __init__(self, groups=32, axis=-1, **kwargs):
        if axis != -1:
            raise ValueError(f"GroupNorm normalises the last axis (channels last), got axis={axis}")
        super().__init__(groups=groups, axis=axis, **kwargs)

    def call(self, inputs):
        x = ops.cast(inputs, keras.backend.result_type(inputs.dtype, "float32"))
        shape = ops.shape(x)
        channels = x.shape[-1]
        grouped = ops.reshape(x, (-1, *shape[1:-1], self.groups, channels // self.groups))
        axes = (*range(1, len(x.shape) - 1), len(x.shape))  # every position, and the channels of a group
        centered = grouped - ops.mean(grouped, axis=axes, keepdims=True)
        variance = ops.mean(ops.square(centered), axis=axes, keepdims=True)
        y = ops.reshape(centered * ops.rsqrt(variance + self.epsilon), shape)
        if self.scale:
            y = y * ops.cast(self.gamma, y.dtype)
        if self.center:
            y = y + ops.cast(self.beta, y.dtype)
        return ops.cast(y, self.compute_dtype)
