"""timm's ResNetV2 hybrids (`vit_*_r26_*`, `vit_*_r50_*`: the paper's hybrid, whose official weights timm runs with its
own weight standardisation and GroupNorm epsilons): their files read by `from_timm`, equal to timm's own random-weight
models, the stem built with timm's numerics (`resnet={"numerics": "timm"}`), which the official ones would not match;
reloaded in safe mode. The hybrids of another backbone are refused by name (tests/test_foreign.py)."""

import os
import sys

import keras
import numpy as np
import pytest
from conftest import outputs_of

import keras_vit

torch = pytest.importorskip("torch")
pytest.importorskip("safetensors.torch")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
from timm_files import close, images, nchw, timm_file, to_numpy  # noqa: E402
from timm_peer import import_timm  # noqa: E402

timm = import_timm()
# (architecture, the size its test model is made at: a 2 x 2 grid at its stride)
CASES = {"vit_small_r26_s32_224": 64, "vit_base_r50_s16_224": 32, "vit_tiny_r_s16_p8_224": 64}


def _timm(arch, size, seed=0):
    """timm's `arch` at depth 2 made at `size`, 5 classes, every parameter moved off its initial value (GroupNorm's
    unit scales and zero biases, and the zero-initialised last norm of each unit, would hide a mistake)."""
    model = timm.create_model(arch, pretrained=False, depth=2, img_size=size, num_classes=5)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=gen))
    return model.eval()


@pytest.mark.parametrize("arch", [pytest.param(a, marks=pytest.mark.backend_independent) if a != "vit_small_r26_s32_224"
                                  else a for a in CASES])
def test_timm_hybrid_files_equal_timm(arch, tmp_path):
    """The logits of the file, read with no argument: the stem's units per stage and width, the patch projection
    and timm's numerics; the head count by width. R26 on every backend; R50's three stages and the root alone of
    `vit_tiny_r_s16_p8_*` (the layout, the same computation) on torch's lane."""
    size = CASES[arch]
    ref = _timm(arch, size)
    x = images(size, size)
    with torch.no_grad():
        expected = ref(nchw(x)).numpy()
    model = keras_vit.from_timm(timm_file(ref, tmp_path, arch), classifier_activation=None)
    stem = model.get_layer("resnet")
    assert (stem.num_layers, stem.numerics) == ({"vit_small_r26_s32_224": (2, 2, 2, 2), "vit_base_r50_s16_224": (3, 4, 9),
                                                 "vit_tiny_r_s16_p8_224": ()}[arch], "timm")
    close(outputs_of(model, x), expected, arch)


@pytest.mark.backend_independent
def test_a_timm_hybrid_reloads_and_needs_timms_numerics(tmp_path):
    """The model reloads from `.keras` in safe mode with the same outputs (the stem's numerics in its config); the
    official stem's numerics on the same weights are off timm's outputs past the project's standard (1e-5 of the
    output's scale: here about three times it)."""
    arch, size = "vit_small_r26_s32_224", CASES["vit_small_r26_s32_224"]
    ref = _timm(arch, size)
    path = timm_file(ref, tmp_path, arch)
    model = keras_vit.from_timm(path, classifier_activation=None)
    x = images(size, size)
    model.save(tmp_path / "m.keras")
    close(to_numpy(keras.saving.load_model(tmp_path / "m.keras", safe_mode=True)(x)), to_numpy(model(x)), "reloaded")
    official = keras_vit.from_timm(path, classifier_activation=None,
                                   resnet={"num_layers": (2, 2, 2, 2), "width_factor": 1, "numerics": "official"})
    with torch.no_grad():
        expected = ref(nchw(x)).numpy()
    assert np.abs(to_numpy(official(x)) - expected).max() > 1e-5 * np.abs(expected).max()
    with pytest.raises(ValueError, match=r"the ResNet stem's numerics must be one of \('official', 'timm'\), got 'tf'"):
        keras_vit.VisionTransformer(image_size=64, patch_size=1, hidden_size=32, mlp_dim=64, num_heads=2, num_layers=1,
                                    resnet={"num_layers": (1,), "numerics": "tf"})
