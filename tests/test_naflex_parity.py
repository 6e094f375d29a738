"""NaFlex parity with the anchor: timm's own `naflexvit_*` models (random weights, saved by timm, loaded with
`keras_vit.from_timm`) on batches that mix image sizes and aspect ratios, outputs and valid tokens."""

import os
import sys

import keras
import numpy as np
import pytest

import keras_vit
from keras_vit.naflex import naflex
from keras_vit.data.naflex_feed import patchify

torch = pytest.importorskip("torch")
pytest.importorskip("safetensors")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# timm's three NaFlex ViT-B/16 layouts, made small (the architecture kept: registers, layer scale, fc_norm,
# MAP, factorized and aspect-preserving position embeddings)
SMALL = dict(depth=2, embed_dim=64, num_heads=4, num_classes=7, pos_embed_grid_size=(4, 6))
# and RADIO's (C-RADIOv3 base: its table resized with corners aligned, to a square then cropped; v4 at pixel
# centres, on torch's lane), read by name (`TIMM_RADIO_CORNERS`)
MODELS = ("naflexvit_base_patch16_gap", "naflexvit_base_patch16_map", "naflexvit_base_patch16_parfac_gap",
          "naflexvit_base_patch16_radio_v3",
          pytest.param("naflexvit_so400m_patch16_radio_v4", marks=pytest.mark.backend_independent))
# (h, w) of one batch's photographs: landscape, portrait, square, a strip; and the token budget
SIZES = [(120, 200), (200, 90), (128, 128), (40, 300)]
BUDGET = 24


def _timm():
    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    from timm_peer import import_timm  # timm without torchvision installed

    import_timm()
    import timm

    return timm


@pytest.fixture(scope="module", params=MODELS)
def pair(request, tmp_path_factory):
    """(timm model, its file): every parameter random (timm starts layer scales at 1e-5, heads at zero)."""
    from safetensors.torch import save_file

    timm = _timm()
    torch.manual_seed(0)
    model = timm.create_model(request.param, **SMALL).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn_like(p) * 0.2)
    path = tmp_path_factory.mktemp("timm") / f"{request.param}.safetensors"
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(path))
    return model, str(path)


def _batch():
    from skimage import data

    photos = [data.astronaut(), data.chelsea(), data.coffee(), data.rocket()]
    sequences = [patchify(p[:h, :w], 16, BUDGET, seq_len=BUDGET) for p, (h, w) in zip(photos, SIZES)]
    return {k: np.stack([s[k] for s in sequences]) for k in sequences[0]}


def test_logits_and_valid_tokens_equal_timms(pair):
    timm_model, path = pair
    batch = _batch()
    assert len({tuple(c.max(0) + 1) for c, v in zip(batch["patch_coord"], batch["patch_valid"])}) > 2
    with torch.no_grad():
        inputs = {k: torch.from_numpy(v) for k, v in batch.items()}
        want = timm_model(inputs).numpy()
        tokens = timm_model.forward_features(**inputs)
        tokens = (tokens["patches"] if isinstance(tokens, dict) else tokens).numpy()
    model = naflex(keras_vit.from_timm(path, num_heads=4, classifier_activation=None))
    got = model.predict(batch, verbose=0)
    scale = np.abs(want).max()
    assert np.abs(got - want).max() <= 1e-5 * max(1.0, scale), (np.abs(got - want).max(), scale)
    features = naflex(keras_vit.from_timm(path, num_heads=4, include_top=False, pooling=None))
    got_tokens = features.predict(batch, verbose=0)
    prefix = tokens.shape[1] - BUDGET
    valid = batch["patch_valid"]
    diff = np.abs(got_tokens[valid] - tokens[:, prefix:][valid]).max()
    assert diff <= 1e-5 * max(1.0, np.abs(tokens).max()), diff
