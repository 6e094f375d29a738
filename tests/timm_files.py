"""What the tests of timm's families share: a timm model's weights drawn anew, written as a file named after its
architecture, images, and the comparison at the project's float32 standard."""

import os
import sys

import keras
import numpy as np
import torch
from conftest import outputs_of
from safetensors.torch import save_file


def timm_module():
    """timm, imported as benchmarks/timm_peer.py does (without torchvision installed)."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
    from timm_peer import import_timm

    return import_timm()


def redraw(module, seed=0):
    """Every parameter of `module` drawn anew (layer scale 1e-5, zero or absent biases would hide a mistake): kernels
    of about unit gain, vectors (biases, scales) of deviation 0.5; `module` in eval mode."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            std = 0.5 if p.ndim == 1 else 1 / np.sqrt(p[0].numel())
            p.copy_(std * torch.randn(p.shape, generator=gen))
    return module.eval()


def timm_file(module, folder, name):
    """`module`'s state dict as `<name>.test.safetensors` in `folder`: named after its architecture, as timm's hub
    files are."""
    path = str(folder / f"{name}.test.safetensors")
    save_file({k: v.contiguous() for k, v in module.state_dict().items()}, path)
    return path


def images(h, w, seed=0):
    return np.random.default_rng(seed).uniform(-1, 1, (2, h, w, 3)).astype("float32")


def nchw(x):
    return torch.from_numpy(x).permute(0, 3, 1, 2)


def to_numpy(y):
    return keras.ops.convert_to_numpy(y)


def close(got, expected, what):
    """Equal up to float32 rounding: 1e-5 of the output's scale."""
    scale = float(np.abs(expected).max())
    assert scale > 0.5, what  # a real signal
    np.testing.assert_allclose(got, expected, atol=1e-5 * scale, rtol=0, err_msg=what)


def equal_to_timm_at(ref, sizes, what, path=None, model=None):
    """For each (h, w) of `sizes`: timm's `ref` made to take that size (`set_input_size`: its position embeddings
    resized and its rotary grid rescaled by timm's rules), and keras-vit's `model` (or the model `from_timm` builds
    of `path` at that size) on the same images, equal; returns the last (images, timm's logits)."""
    import keras_vit

    for h, w in sizes:
        ref.set_input_size(img_size=(h, w))
        x = images(h, w, seed=h)
        with torch.no_grad():
            expected = ref(nchw(x)).numpy()
        ours = model if model is not None else keras_vit.from_timm(path, image_size=(h, w), classifier_activation=None)
        close(outputs_of(ours, x), expected, f"{what} at {h}x{w}")
    return x, expected
