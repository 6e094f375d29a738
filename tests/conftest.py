import json
import os
import pathlib

import numpy as np
import pytest

DATA = pathlib.Path(__file__).parent / "data"
OFFICIAL = DATA / "official"
CASES = json.loads((OFFICIAL / "cases.json").read_text())["cases"]

TINY = dict(image_size=32, patch_size=8, hidden_size=32, mlp_dim=64, num_heads=2, num_layers=2, classes=10)


def case_config(name, resized=False):
    """Builder kwargs of an official test case (the keys of cases.json)."""
    config = {k: v for k, v in CASES[name].items() if k not in ("resized_image_size", "note")}
    if resized:
        config["image_size"] = CASES[name]["resized_image_size"]
    return config


@pytest.fixture(autouse=True, scope="session")
def _exact_float32():
    """The official outputs are full float32: no TF32 on GPUs (a no-op on CPUs)."""
    import keras_vit

    keras_vit.exact_float32()


@pytest.fixture(autouse=True)
def _clean_keras_session():
    import keras

    keras.utils.clear_session()
    yield


@pytest.fixture
def keras_home(tmp_path, monkeypatch):
    """A private Keras cache for tests that download."""
    monkeypatch.setenv("KERAS_HOME", str(tmp_path / "keras_home"))
    return tmp_path / "keras_home"


@pytest.fixture
def rng():
    return np.random.default_rng(0)


def backend():
    return os.environ.get("KERAS_BACKEND", "tensorflow")
