"""The encoder's normalisations, LayerNorm (the paper's) and RMSNorm (AIMv2's: x / sqrt(mean(x^2) + eps) * scale,
no centring, no bias): made, read in the official layout and applied in one place."""

import keras

NORMALIZATIONS = ("layer_norm", "rms_norm")


def check_normalization(value):
    """`value` if it names a normalisation, else a ValueError listing them."""
    if value not in NORMALIZATIONS:
        raise ValueError(f"unknown normalization {value!r}; expected one of {NORMALIZATIONS}")
    return value


def make_norm(kind, epsilon, name, dtype=None):
    """A `kind` normalisation ("layer_norm" or "rms_norm") over the last axis of epsilon `epsilon`: a Keras layer
    named `name` of the dtype policy `dtype` (None: the global one)."""
    if kind == "rms_norm":
        return keras.layers.RMSNormalization(epsilon=epsilon, name=name, dtype=dtype)
    return keras.layers.LayerNormalization(epsilon=epsilon, name=name, dtype=dtype)


def norm_weights(layer):
    """{"scale", "bias"} of a LayerNorm, {"scale"} of an RMSNorm: the official layout's names."""
    if isinstance(layer, keras.layers.RMSNormalization):
        return {"scale": layer.scale}
    return {"scale": layer.gamma, "bias": layer.beta}


def direct(layer, x):
    """Whether `layer` may run on x through its `call`, without Keras' layer call around it: on torch, with
    the layer built and its policy and x float32 (nothing for the layer call to cast). Keras' host cost per
    layer call is several times the kernels' own time on a small batch there; the outputs are the same."""
    return (keras.backend.backend() == "torch" and layer.built
            and layer.compute_dtype == layer.variable_dtype == keras.backend.standardize_dtype(x.dtype) == "float32")


def normalize(layer, x):
    """The normalisation `layer` (of `make_norm`) on x over its last axis: where `direct`, the one torch call the
    layer's own call makes (Keras' also converts each argument's dtype and device); otherwise the layer's call."""
    if not direct(layer, x) or layer.axis not in (-1, [-1], [x.ndim - 1]):
        return layer(x)
    import torch

    if isinstance(layer, keras.layers.RMSNormalization):
        return torch.nn.functional.rms_norm(x, (x.shape[-1],), layer.scale.value, layer.epsilon)
    if layer.center and layer.scale and not layer.rms_scaling:
        return torch.nn.functional.layer_norm(x, (x.shape[-1],), layer.gamma.value, layer.beta.value, layer.epsilon)
    return layer(x)
