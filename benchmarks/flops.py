"""FLOPs of a ViT configuration, from the configuration alone (pure functions; 1 multiply-add =
2 FLOPs; matmuls and convolutions only: norms, softmax, GELU and adds are O(T * D) and left out, as
is customary), and the architectures the benchmarks measure."""

from keras_vit.configs import VARIANTS

# the variant table plus the tests' tiny configuration, as builder arguments
ARCHS = {"tiny": dict(patch_size=8, hidden_size=32, mlp_dim=64, num_heads=2, num_layers=2, resnet=None),
         **{name: config.build_args() for name, config in VARIANTS.items()}}


def arch_config(variant, image_size, classes=1000):
    """Builder arguments of `variant` at `image_size` (a dict for `keras_vit.VisionTransformer`)."""
    if variant not in ARCHS:
        raise ValueError(f"unknown variant {variant!r}; expected one of {', '.join(ARCHS)}")
    arch = ARCHS[variant]
    return dict(arch, image_size=int(image_size), classes=classes,
                resnet=None if arch["resnet"] is None else dict(arch["resnet"]))


def _resnet_macs(h, w, num_layers, width_factor=1):
    """MACs of the BiT-style stem (StdConv 7x7/2, max-pool 3x3/2, bottleneck stages) and its output."""
    width = 64 * width_factor
    h, w = -(-h // 2), -(-w // 2)
    macs = h * w * 7 * 7 * 3 * width
    h, w = -(-h // 2), -(-w // 2)
    cin = width
    for i, count in enumerate(num_layers):
        f = width * 2**i
        for j in range(count):
            s = 2 if (i > 0 and j == 0) else 1
            ho, wo = -(-h // s), -(-w // s)
            macs += h * w * cin * f  # conv1 1x1 at the input resolution
            macs += ho * wo * 9 * f * f  # conv2 3x3, stride s
            macs += ho * wo * f * 4 * f  # conv3 1x1
            if s != 1 or cin != 4 * f:
                macs += ho * wo * cin * 4 * f  # projection
            h, w, cin = ho, wo, 4 * f
    return macs, (h, w, cin)


def model_flops(image_size=224, patch_size=16, hidden_size=768, mlp_dim=3072, num_heads=12, num_layers=12,
                classes=1000, classifier="token", representation_size=None, resnet=None, **_):
    """Forward FLOPs per image of a ViT configuration, by component (dict; "total" is the sum).

    Per encoder block with T tokens of width D and MLP width M: q/k/v projections 3 T D^2, attention
    logits T^2 D, attention-weighted values T^2 D, output projection T D^2, MLP 2 T D M (MACs).
    """
    h, w = (image_size, image_size) if isinstance(image_size, int) else tuple(image_size)
    c, flops = 3, {}
    if resnet:
        macs, (h, w, c) = _resnet_macs(h, w, tuple(resnet["num_layers"]), resnet.get("width_factor", 1))
        flops["resnet"] = 2 * macs
    n = (h // patch_size) * (w // patch_size)
    t = n + (1 if classifier == "token" else 0)
    d, m = hidden_size, mlp_dim
    flops["patch_embedding"] = 2 * n * patch_size * patch_size * c * d
    flops["qkv_projection"] = 2 * num_layers * 3 * t * d * d
    flops["attention"] = 2 * num_layers * 2 * t * t * d
    flops["out_projection"] = 2 * num_layers * t * d * d
    flops["mlp"] = 2 * num_layers * 2 * t * d * m
    width = d
    if representation_size:
        flops["pre_logits"] = 2 * d * representation_size
        width = representation_size
    flops["head"] = 2 * width * classes
    flops["total"] = sum(flops.values())
    return flops


def train_flops(forward_flops):
    """Training-step FLOPs: forward + backward (2x forward: gradients of inputs and of weights)."""
    return 3 * forward_flops
