"""The official ViT (token or gap, with or without the hybrid's ResNet) as plain float64 numpy, from
an official-layout parameter dict and the numerics written down in NOTES.md; independent of keras_vit."""

import numpy as np


def layer_norm(x, gamma, beta, eps=1e-6):
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * gamma + beta


def gelu_tanh(x):
    return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3)))


def block_reference(x, p, heads=None):
    """One encoder block (pre-LN attention, then pre-LN MLP); returns (tokens, attention weights)."""
    a = "MultiHeadDotProductAttention_1/"
    y = layer_norm(x, p["LayerNorm_0/scale"], p["LayerNorm_0/bias"])
    q, k, v = (np.einsum("btd,dnh->btnh", y, p[a + f"{n}/kernel"]) + p[a + f"{n}/bias"] for n in ("query", "key", "value"))
    logits = np.einsum("bqnh,bknh->bnqk", q / np.sqrt(q.shape[-1]), k)
    w = np.exp(logits - logits.max(-1, keepdims=True))
    w /= w.sum(-1, keepdims=True)
    y = np.einsum("bnqk,bknh->bqnh", w, v)
    x = x + np.einsum("btnh,nhd->btd", y, p[a + "out/kernel"]) + p[a + "out/bias"]
    y = layer_norm(x, p["LayerNorm_2/scale"], p["LayerNorm_2/bias"])
    y = gelu_tanh(y @ p["MlpBlock_3/Dense_0/kernel"] + p["MlpBlock_3/Dense_0/bias"])
    return x + y @ p["MlpBlock_3/Dense_1/kernel"] + p["MlpBlock_3/Dense_1/bias"], w


def _same_pad(x, k, s, value=0.0):
    """TF/XLA SAME padding of the two spatial axes of NHWC `x` (the odd pixel goes at the end)."""
    pads = [(0, 0)]
    for n in x.shape[1:3]:
        total = max((-(-n // s) - 1) * s + k - n, 0)
        pads.append((total // 2, total - total // 2))
    return np.pad(x, pads + [(0, 0)], constant_values=value)


def _windows(x, k, s):
    """(B, H', W', C, k, k) views of the k x k windows at stride s of NHWC `x` (already padded)."""
    return np.lib.stride_tricks.sliding_window_view(x, (k, k), axis=(1, 2))[:, ::s, ::s]


def std_conv(x, kernel, stride=1):
    """Weight-standardised convolution, SAME padding, no bias."""
    kernel = np.asarray(kernel, np.float64)
    w = (kernel - kernel.mean((0, 1, 2))) / (kernel.std((0, 1, 2)) + 1e-5)
    k = kernel.shape[0]
    return np.einsum("bhwcij,ijcd->bhwd", _windows(_same_pad(x, k, stride), k, stride), w)


def group_norm(x, scale, bias, groups=32, eps=1e-6):
    b, h, w, c = x.shape
    g = x.reshape(b, h, w, groups, c // groups)
    mean = g.mean((1, 2, 4), keepdims=True)
    var = ((g - mean) ** 2).mean((1, 2, 4), keepdims=True)
    g = (g - mean) / np.sqrt(var + eps)
    return g.reshape(x.shape) * np.reshape(scale, -1) + np.reshape(bias, -1)


def max_pool_same(x, k=3, s=2):
    return _windows(_same_pad(x, k, s, -np.inf), k, s).max((-2, -1))


def bottleneck_unit(x, p, prefix, stride):
    def conv_gn(y, name, gn, s=1):
        return group_norm(std_conv(y, p[f"{prefix}/{name}/kernel"], s), p[f"{prefix}/{gn}/scale"], p[f"{prefix}/{gn}/bias"])

    residual = x
    if f"{prefix}/conv_proj/kernel" in p:
        residual = conv_gn(x, "conv_proj", "gn_proj", stride)
    y = np.maximum(conv_gn(x, "conv1", "gn1"), 0)
    y = np.maximum(conv_gn(y, "conv2", "gn2", stride), 0)
    return np.maximum(residual + conv_gn(y, "conv3", "gn3"), 0)


def resnet_stem(x, p, num_layers):
    """Root (StdConv 7x7/2, GroupNorm, ReLU, max-pool 3x3/2) then stages of bottleneck units."""
    x = std_conv(x, p["conv_root/kernel"], 2)
    x = max_pool_same(np.maximum(group_norm(x, p["gn_root/scale"], p["gn_root/bias"]), 0))
    for i, count in enumerate(num_layers):
        for j in range(count):
            x = bottleneck_unit(x, p, f"block{i + 1}/unit{j + 1}", 2 if (i > 0 and j == 0) else 1)
    return x


def vit_forward(p, images, classifier="token", resnet=None):
    """Logits (or the pooled representation when `p` has no head) of the official ViT."""
    p = {k: np.asarray(v, np.float64) for k, v in p.items()}
    x = np.asarray(images, np.float64)
    if resnet is not None:
        x = resnet_stem(x, p, resnet["num_layers"])
    kernel = p["embedding/kernel"]
    ps = kernel.shape[0]
    x = np.einsum("bhwcij,ijcd->bhwd", _windows(x, ps, ps), kernel) + p["embedding/bias"]
    x = x.reshape(x.shape[0], -1, x.shape[-1])
    if classifier == "token":
        x = np.concatenate([np.broadcast_to(p["cls"], (x.shape[0], 1, x.shape[-1])), x], axis=1)
    x = x + p["Transformer/posembed_input/pos_embedding"]
    i = 0
    while f"Transformer/encoderblock_{i}/LayerNorm_0/scale" in p:
        prefix = f"Transformer/encoderblock_{i}/"
        x, _ = block_reference(x, {k[len(prefix):]: v for k, v in p.items() if k.startswith(prefix)})
        i += 1
    x = layer_norm(x, p["Transformer/encoder_norm/scale"], p["Transformer/encoder_norm/bias"])
    x = x[:, 0] if classifier == "token" else x.mean(1)
    if "pre_logits/kernel" in p:
        x = np.tanh(x @ p["pre_logits/kernel"] + p["pre_logits/bias"])
    if "head/kernel" in p:
        x = x @ p["head/kernel"] + p["head/bias"]
    return x
