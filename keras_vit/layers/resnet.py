"""The hybrid stem (paper 3.1, "Hybrid Architecture"): a ResNet with weight-standardised
convolutions and GroupNorm (BiT), whose feature map feeds the patch embedding."""

import keras
from keras import ops

from keras_vit.configs import resnet_stride
from keras_vit.layers.group_norm import GroupNorm
from keras_vit.layers.initial import initial
from keras_vit.layers.patch_encoder import check_channels

GROUP_NORM_EPSILON = 1e-6
WEIGHT_STD_EPSILON = 1e-5
# the stem's numerics -> (weight standardisation's epsilon, whether it is added to the variance inside the root
# rather than to the deviation, GroupNorm's epsilon): the official code's, and timm's ResNetV2 of its hybrids
# (vision_transformer_hybrid.py: StdConv2dSame(eps=1e-8), GroupNormAct's 1e-5), which it runs the official weights with
NUMERICS = {"official": (WEIGHT_STD_EPSILON, False, GROUP_NORM_EPSILON), "timm": (1e-8, True, 1e-5)}


def check_numerics(numerics):
    if numerics not in NUMERICS:
        raise ValueError(f"the ResNet stem's numerics must be one of {tuple(NUMERICS)}, got {numerics!r}")
    return numerics


def standardize_kernel(kernel, epsilon=WEIGHT_STD_EPSILON, inside=False):
    """Weight standardisation over each output channel's (kh, kw, cin): `(w - mean) / (std + eps)`, or with
    `inside` `(w - mean) / sqrt(var + eps)` (timm's).

    Args:
        kernel: a convolution kernel (kh, kw, cin, cout).
        epsilon: added to the standard deviation (1e-5, the official stem's), or to the variance.
        inside: whether `epsilon` is added to the variance.
    """
    kernel = ops.convert_to_tensor(kernel)
    mean = ops.mean(kernel, axis=(0, 1, 2), keepdims=True)
    var = ops.mean(ops.square(kernel - mean), axis=(0, 1, 2), keepdims=True)
    return (kernel - mean) / (ops.sqrt(var + epsilon) if inside else ops.sqrt(var) + epsilon)


@keras.saving.register_keras_serializable(package="keras_vit")
class StdConv2D(keras.layers.Conv2D):
    """A bias-free Conv2D whose kernel is weight-standardised on every call (official `StdConv`).

    Args:
        filters: output channels.
        kernel_size: int or (kh, kw).
        strides: int or (sh, sw).
        numerics: "official" or "timm" (`NUMERICS`): how the kernel is standardised.
        **kwargs: other `keras.layers.Conv2D` arguments (padding defaults to
            "same", use_bias to False).
    """

    def __init__(self, filters, kernel_size, strides=1, numerics="official", **kwargs):
        kwargs.setdefault("padding", "same")
        kwargs.setdefault("use_bias", False)
        super().__init__(filters, kernel_size, strides=strides, **kwargs)
        self.numerics = check_numerics(numerics)

    def convolution_op(self, inputs, kernel):
        epsilon, inside, _ = NUMERICS[self.numerics]
        kernel = ops.cast(standardize_kernel(ops.cast(kernel, "float32"), epsilon, inside), inputs.dtype)
        return super().convolution_op(inputs, kernel)

    def get_config(self):
        return {**super().get_config(), "numerics": self.numerics}


def _group_norm(name, policy, zero_scale=False, numerics="official"):
    return GroupNorm(
        groups=32,
        epsilon=NUMERICS[numerics][2],
        gamma_initializer="zeros" if zero_scale else "ones",
        name=name,
        dtype=policy,
    )


def _gn_params(layer):
    return {"scale": layer.gamma, "bias": layer.beta}


@keras.saving.register_keras_serializable(package="keras_vit")
class BottleneckUnit(keras.layers.Layer):
    """Pre-activation-free bottleneck unit: 1x1 -> 3x3 (stride) -> 1x1 (4F), GroupNorm after each,
    ReLU(residual + y); a projection when the stride or the width changes.

    Args:
        filters: F, the bottleneck width (the unit outputs 4F channels).
        strides: stride of the 3x3 convolution and of the projection.
        numerics: "official" or "timm" (`NUMERICS`).
    """

    def __init__(self, filters, strides=1, numerics="official", **kwargs):
        super().__init__(**kwargs)
        self.filters = int(filters)
        self.strides = int(strides)
        self.numerics = check_numerics(numerics)

    def build(self, input_shape):
        f, s, p, n = self.filters, self.strides, self.dtype_policy, self.numerics
        init = dict(dtype=p, kernel_initializer=initial("glorot_uniform"))
        self.needs_projection = s != 1 or input_shape[-1] != 4 * f
        if self.needs_projection:
            self.conv_proj = StdConv2D(4 * f, 1, s, numerics=n, name="conv_proj", **init)
            self.gn_proj = _group_norm("gn_proj", p, numerics=n)
        self.conv1 = StdConv2D(f, 1, numerics=n, name="conv1", **init)
        self.gn1 = _group_norm("gn1", p, numerics=n)
        self.conv2 = StdConv2D(f, 3, s, numerics=n, name="conv2", **init)
        self.gn2 = _group_norm("gn2", p, numerics=n)
        self.conv3 = StdConv2D(4 * f, 1, numerics=n, name="conv3", **init)
        self.gn3 = _group_norm("gn3", p, zero_scale=True, numerics=n)
        shape = tuple(input_shape)
        down = (shape[0], None, None, f)
        for conv, gn, in_shape in (
            (self.conv1, self.gn1, shape),
            (self.conv2, self.gn2, (*shape[:3], f)),
            (self.conv3, self.gn3, down),
        ):
            conv.build(in_shape)
            gn.build((*in_shape[:3], conv.filters))
        if self.needs_projection:
            self.conv_proj.build(shape)
            self.gn_proj.build((*shape[:3], 4 * f))

    def call(self, x):
        residual = self.gn_proj(self.conv_proj(x)) if self.needs_projection else x
        y = ops.relu(self.gn1(self.conv1(x)))
        y = ops.relu(self.gn2(self.conv2(y)))
        y = self.gn3(self.conv3(y))
        return ops.relu(residual + y)

    def compute_output_shape(self, input_shape):
        b, h, w, _ = input_shape
        s = self.strides
        return (b, None if h is None else -(-h // s), None if w is None else -(-w // s), 4 * self.filters)

    def official_weights(self):
        pairs = [("conv1", "gn1"), ("conv2", "gn2"), ("conv3", "gn3")]
        if self.needs_projection:
            pairs.insert(0, ("conv_proj", "gn_proj"))
        params = {}
        for conv, gn in pairs:
            params[f"{conv}/kernel"] = getattr(self, conv).kernel
            params |= {f"{gn}/{k}": v for k, v in _gn_params(getattr(self, gn)).items()}
        return params

    def get_config(self):
        return {**super().get_config(), "filters": self.filters, "strides": self.strides, "numerics": self.numerics}


@keras.saving.register_keras_serializable(package="keras_vit")
class ResNetStem(keras.layers.Layer):
    """The hybrid's ResNet: root (StdConv 7x7/2, GroupNorm, ReLU, max-pool 3x3/2, SAME padding)
    then stages of bottleneck units; stride 1 in the first stage and 2 in the later ones.

    Args:
        num_layers: units per stage, e.g. (3, 4, 9) for R50 in R50+ViT-B/16, (2, 2, 2, 2) for R26; () the root
            alone (timm's `vit_tiny_r_s16_p8_*`).
        width_factor: multiplies every width (64 * width_factor at the root).
        numerics: "official" (the default) or "timm": weight standardisation's and GroupNorm's epsilons (`NUMERICS`).
    """

    def __init__(self, num_layers, width_factor=1, numerics="official", **kwargs):
        super().__init__(**kwargs)
        self.num_layers = tuple(int(n) for n in num_layers)
        self.width_factor = int(width_factor)
        self.numerics = check_numerics(numerics)
        if any(n < 1 for n in self.num_layers):
            raise ValueError(f"ResNetStem: num_layers must be a tuple of positive ints, got {num_layers}")
        self.input_spec = keras.InputSpec(ndim=4)

    @property
    def stride(self):
        """Total downsampling of the stem."""
        return resnet_stride(self.num_layers)

    @property
    def output_channels(self):
        if not self.num_layers:  # the root's
            return 64 * self.width_factor
        return 64 * self.width_factor * 2 ** (len(self.num_layers) - 1) * 4

    def build(self, input_shape):
        p, width = self.dtype_policy, 64 * self.width_factor
        self.conv_root = StdConv2D(width, 7, 2, numerics=self.numerics, name="conv_root", dtype=p,
                                   kernel_initializer=initial("glorot_uniform"))
        self.gn_root = _group_norm("gn_root", p, numerics=self.numerics)
        self.conv_root.build(input_shape)
        self.gn_root.build((input_shape[0], None, None, width))
        self.units = []
        channels = width
        for i, count in enumerate(self.num_layers):
            for j in range(count):
                unit = BottleneckUnit(
                    width * 2**i, strides=2 if (i > 0 and j == 0) else 1, numerics=self.numerics,
                    name=f"block{i + 1}_unit{j + 1}", dtype=p)
                unit.build((input_shape[0], None, None, channels))
                channels = 4 * width * 2**i
                self.units.append(unit)

    def call(self, images):
        check_channels(self, images.shape, self.conv_root.kernel.shape[2])
        x = ops.relu(self.gn_root(self.conv_root(images)))
        x = ops.max_pool(x, pool_size=3, strides=2, padding="same")
        for unit in self.units:
            x = unit(x)
        return x

    def compute_output_shape(self, input_shape):
        b, h, w, _ = input_shape
        s = self.stride
        return (b, None if h is None else -(-h // s), None if w is None else -(-w // s), self.output_channels)

    def official_weights(self):
        params = {"conv_root/kernel": self.conv_root.kernel}
        params |= {f"gn_root/{k}": v for k, v in _gn_params(self.gn_root).items()}
        for unit in self.units:
            block, name = unit.name.split("_")
            params |= {f"{block}/{name}/{k}": v for k, v in unit.official_weights().items()}
        return params

    def get_config(self):
        return {**super().get_config(), "num_layers": self.num_layers, "width_factor": self.width_factor,
                "numerics": self.numerics}
