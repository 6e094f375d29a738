"""The activations of the encoder's MLP: GELU (the paper's), QuickGELU (OpenAI CLIP) and SwiGLU
(DINOv2-giant)."""

from keras import ops

# "gelu": tanh-approximate or exact by `approximate_gelu`; "quick_gelu": x * sigmoid(1.702 x);
# "swiglu": the first dense layer is twice as wide, silu(first half) * second half
MLP_ACTIVATIONS = ("gelu", "quick_gelu", "swiglu")


def check_mlp_activation(value):
    """`value` if it names an MLP activation, else a ValueError listing them."""
    if value not in MLP_ACTIVATIONS:
        raise ValueError(f"unknown mlp_activation {value!r}; expected one of {MLP_ACTIVATIONS}")
    return value


def hidden_width(mlp_dim, activation):
    """Output width of the MLP's first dense layer (SwiGLU packs its gate beside the value)."""
    return 2 * mlp_dim if activation == "swiglu" else mlp_dim


def activate(y, activation, approximate_gelu=True):
    """The MLP's activation of the first dense layer's output `y`."""
    if activation == "gelu":
        return ops.gelu(y, approximate=approximate_gelu)
    if activation == "quick_gelu":
        return y * ops.sigmoid(ops.cast(1.702, y.dtype) * y)
    half = y.shape[-1] // 2
    return swiglu(y[..., :half], y[..., half:])


def swiglu(gate, value):
    """SwiGLU of the first dense layer's two halves: silu(gate) * value."""
    return ops.silu(gate) * value
