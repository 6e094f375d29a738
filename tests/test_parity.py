"""The official implementation's outputs, reproduced from official-format checkpoints (max abs error <= 1e-4)."""

import numpy as np
import pytest
from conftest import CASES, OFFICIAL, case_config

import keras_vit

TOLERANCE = 1e-4


@pytest.mark.parametrize("name", sorted(CASES))
def test_logits_at_file_resolution(name):
    expected = np.load(OFFICIAL / f"{name}.expected.npz", allow_pickle=False)
    model = keras_vit.VisionTransformer(**case_config(name), weights=OFFICIAL / f"{name}.npz", classifier_activation=None)
    logits = model.predict(expected["x"], verbose=0)
    err = np.abs(logits - expected["logits"]).max()
    print(f"{name}: max abs error {err:.2e}")
    assert err <= TOLERANCE


@pytest.mark.parametrize("name", sorted(CASES))
def test_logits_after_position_embedding_resize(name):
    expected = np.load(OFFICIAL / f"{name}.expected.npz", allow_pickle=False)
    model = keras_vit.VisionTransformer(**case_config(name, resized=True), classifier_activation=None)
    notes = keras_vit.load_weights(model, str(OFFICIAL / f"{name}.npz"))
    assert any("resized" in note for note in notes)
    posemb = model.get_layer("posembed_input").pos_embedding.numpy()
    np.testing.assert_allclose(posemb, expected["pos_embedding_resized"], atol=1e-6)
    logits = model.predict(expected["x_resized"], verbose=0)
    err = np.abs(logits - expected["logits_resized"]).max()
    print(f"{name} resized: max abs error {err:.2e}")
    assert err <= TOLERANCE


def test_softmax_head_gives_probabilities_of_the_official_logits():
    name = "vit_tiny_token"
    expected = np.load(OFFICIAL / f"{name}.expected.npz", allow_pickle=False)
    model = keras_vit.VisionTransformer(**case_config(name), weights=OFFICIAL / f"{name}.npz")
    probs = model.predict(expected["x"], verbose=0)
    logits = expected["logits"]
    ref = np.exp(logits - logits.max(-1, keepdims=True))
    np.testing.assert_allclose(probs, ref / ref.sum(-1, keepdims=True), atol=1e-5)
