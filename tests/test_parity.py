"""The official implementation's outputs, reproduced from official-format checkpoints (max abs error <= 1e-5),
and the classifier="gap" model against the float64 numpy reference (tests/reference.py), itself checked
against the official outputs."""

import numpy as np
import pytest
import scipy.ndimage
from conftest import CASES, OFFICIAL, backend, case_config
from reference import vit_forward

import keras_vit
from keras_vit.weights import official_variables, read_npz

TOLERANCE = 1e-5


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


@pytest.mark.backend_independent
@pytest.mark.parametrize("name", sorted(CASES))
def test_numpy_reference_reproduces_the_official_outputs(name):
    """The reference below is trusted for "gap" because it gives the official logits for "token"."""
    expected = np.load(OFFICIAL / f"{name}.expected.npz", allow_pickle=False)
    config = CASES[name]
    logits = vit_forward(read_npz(OFFICIAL / f"{name}.npz"), expected["x"], config["classifier"], config.get("resnet"))
    assert np.abs(logits - expected["logits"]).max() <= TOLERANCE


def _gap_file(tmp_path):
    """The token case's official parameters as a "gap" checkpoint: no `cls`, no class-token position."""
    arrays = read_npz(OFFICIAL / "vit_tiny_token.npz")
    del arrays["cls"]
    key = "Transformer/posembed_input/pos_embedding"
    arrays[key] = arrays[key][:, 1:]
    path = tmp_path / "vit_tiny_gap.npz"
    np.savez(path, **arrays)
    return path, arrays


def test_gap_classifier_equals_the_numpy_reference(tmp_path):
    path, arrays = _gap_file(tmp_path)
    x = np.load(OFFICIAL / "vit_tiny_token.expected.npz", allow_pickle=False)["x"]
    config = {**case_config("vit_tiny_token"), "classifier": "gap"}
    model = keras_vit.VisionTransformer(**config, weights=path, classifier_activation=None)
    assert "cls" not in [layer.name for layer in model.layers]
    err = np.abs(model.predict(x, verbose=0) - vit_forward(arrays, x, "gap")).max()
    print(f"gap: max abs error {err:.2e}")
    assert err <= TOLERANCE
    # at another resolution: all grid entries are zoomed (no class-token entry kept)
    bigger = keras_vit.VisionTransformer(**{**config, "image_size": 24}, classifier_activation=None)
    keras_vit.load_weights(bigger, str(path))
    key = "Transformer/posembed_input/pos_embedding"
    zoomed = scipy.ndimage.zoom(arrays[key][0].reshape(4, 4, -1).astype("float64"), (1.5, 1.5, 1), order=1)
    resized = {**arrays, key: zoomed.reshape(1, 36, -1)}
    np.testing.assert_allclose(official_variables(bigger)[key].numpy(), resized[key], atol=1e-6)
    x24 = np.random.default_rng(0).uniform(-1, 1, (2, 24, 24, 3)).astype("float32")
    assert np.abs(bigger.predict(x24, verbose=0) - vit_forward(resized, x24, "gap")).max() <= TOLERANCE


@pytest.mark.skipif(backend() != "jax", reason="the jax lane's XLA flags (Makefile)")
def test_official_logits_under_xla_default_flags():
    """`make test` compiles with LLVM's optimisations and XLA's newer fusion emitters off (the Makefile's
    TEST_XLA_FLAGS, for time): the official logits of every case also hold under XLA's default flags, as users
    compile them, in a fresh interpreter."""
    import os
    import subprocess
    import sys

    script = ("import sys, numpy as np, keras_vit; sys.path.insert(0, 'tests'); from conftest import CASES, OFFICIAL, "
              "case_config\n"
              "for name in sorted(CASES):\n"
              "    expected = np.load(OFFICIAL / f'{name}.expected.npz', allow_pickle=False)\n"
              "    model = keras_vit.VisionTransformer(**case_config(name), weights=OFFICIAL / f'{name}.npz', "
              "classifier_activation=None)\n"
              "    print(name, float(np.abs(model.predict(expected['x'], verbose=0) - expected['logits']).max()))\n")
    env = {**{k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}, "KERAS_BACKEND": "jax"}
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    done = subprocess.run([sys.executable, "-c", script], env=env, cwd=root, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    errors = dict(line.split() for line in done.stdout.splitlines() if line.split()[0] in CASES)
    assert sorted(errors) == sorted(CASES)
    assert all(float(e) <= TOLERANCE for e in errors.values()), errors
