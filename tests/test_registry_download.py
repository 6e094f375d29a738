"""The path a user takes with default settings: `weights="<tag>"` with no KERAS_HOME, the file fetched
from a loopback mirror (KERAS_VIT_BASE_URL) under the registry's real relative path, cached in
Keras' default folder, and loaded."""

import os

import numpy as np
from keras import ops
import pytest
from conftest import LoopbackServer

import keras_vit
from keras_vit.weights import download, registry, save_npz


def _random_weights(model, seed):
    rng = np.random.default_rng(seed)
    model.set_weights([rng.normal(0.0, 0.05, w.shape).astype("float32") for w in model.get_weights()])
    return model


def _serve(tmp_path, record, source):
    """Writes `source` as an official-layout .npz under the record's path in a served folder."""
    root = tmp_path / "served"
    rel = record.url[len(registry.BUCKET_URL) + 1:]
    save_npz(source, str(root / rel))
    return LoopbackServer(root), rel


def _cache(home):
    return home / ".keras" / "models" / "keras_vit"


@pytest.mark.backend_independent
def test_keras_home_follows_keras_rule(user_home, monkeypatch):
    assert download.cache_dir() == str(_cache(user_home))
    monkeypatch.setenv("KERAS_HOME", "~/elsewhere")
    assert download.cache_dir() == str(user_home / "elsewhere" / "models" / "keras_vit")
    monkeypatch.delenv("KERAS_HOME")
    monkeypatch.setenv("HOME", str(user_home / "not-there"))  # a home that cannot be written
    assert download.cache_dir() == "/tmp/.keras/models/keras_vit"


@pytest.mark.backend_independent
def test_a_tag_downloads_once_into_the_default_cache_and_gives_the_files_outputs(user_home, tmp_path, monkeypatch):
    record = registry.get_weights("ViT_Ti16", "augreg-imagenet21k")
    source = _random_weights(keras_vit.ViT_Ti16(classes=record.classes, image_size=record.image_size,
                                                classifier_activation=None), seed=1)
    server, rel = _serve(tmp_path, record, source)
    try:
        monkeypatch.setenv(download.BASE_URL_ENV, server.url)
        model = keras_vit.ViT_Ti16(weights="augreg-imagenet21k", classifier_activation=None)
        assert server.requests == [f"/{rel}"]
        assert os.listdir(_cache(user_home)) == [record.filename]  # no temporary leftovers
        x = np.random.default_rng(2).uniform(-1, 1, (1, 224, 224, 3)).astype("float32")
        np.testing.assert_allclose(ops.convert_to_numpy(model(x)), ops.convert_to_numpy(source(x)), rtol=1e-5, atol=1e-5)
        model.get_layer("head").kernel.assign(np.zeros((192, record.classes), "float32"))
        keras_vit.load_weights(model, "augreg-imagenet21k")  # a second call takes the cache
        assert server.requests == [f"/{rel}"]
        np.testing.assert_array_equal(model.get_layer("head").kernel.numpy(), source.get_layer("head").kernel.numpy())
    finally:
        server.close()


@pytest.mark.slow
@pytest.mark.backend_independent
def test_a_hybrid_tag_downloads_and_gives_the_files_outputs(user_home, tmp_path, monkeypatch):
    tag = "augreg-imagenet21k+imagenet2012"
    record = registry.get_weights("R26_ViT_S32", tag)
    # Written at 32 px (one token of the stem's stride 32) to keep the forward pass small; the same
    # parameters as at the record's 384 px but for the position embedding's grid.
    source = _random_weights(keras_vit.R26_ViT_S32(classes=record.classes, image_size=32,
                                                   classifier_activation=None), seed=3)
    server, rel = _serve(tmp_path, record, source)
    try:
        monkeypatch.setenv(download.BASE_URL_ENV, server.url)
        model = keras_vit.R26_ViT_S32(weights=tag, image_size=32, classifier_activation=None)
        assert server.requests == [f"/{rel}"]
        assert os.listdir(_cache(user_home)) == [record.filename]
        x = np.random.default_rng(4).uniform(-1, 1, (2, 32, 32, 3)).astype("float32")
        np.testing.assert_allclose(ops.convert_to_numpy(model(x)), ops.convert_to_numpy(source(x)), rtol=1e-5, atol=1e-5)
    finally:
        server.close()


@pytest.mark.backend_independent
def test_server_down_and_empty_cache_give_one_error_naming_the_url_a_mirror_and_a_local_file(
        user_home, tmp_path, monkeypatch):
    server = LoopbackServer(tmp_path)
    server.close()  # nothing listens there any more
    monkeypatch.setenv(download.BASE_URL_ENV, server.url)
    record = registry.get_weights("ViT_Ti16", "augreg-imagenet21k")
    with pytest.raises(OSError) as info:
        keras_vit.ViT_Ti16(weights="augreg-imagenet21k")
    message = str(info.value)
    assert f"could not download {server.url}/augreg/{record.released_name}" in message
    assert f"set {download.BASE_URL_ENV}=<its URL>" in message
    assert "pass its path as weights=" in message
    assert os.listdir(_cache(user_home)) == []  # nothing half-written
