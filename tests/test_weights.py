"""Checkpoint loading: the key map, adaptation rules, all-or-nothing errors, and the download path."""

import logging
import os

import numpy as np
import pytest
from conftest import OFFICIAL, TINY, LoopbackServer, case_config, shapes_only, tiny_variant

import keras_vit
from keras_vit.weights import download, official_variables, read_npz, save_npz

TOKEN = OFFICIAL / "vit_tiny_token.npz"
PRELOGITS = OFFICIAL / "vit_tiny_prelogits.npz"
HYBRID = OFFICIAL / "hybrid_tiny.npz"


def _weights(model):
    return [w.copy() for w in model.get_weights()]


def _assert_unchanged(model, before):
    for a, b in zip(before, model.get_weights()):
        np.testing.assert_array_equal(a, b)


def test_every_key_of_each_official_file_is_used():
    for path, name in ((TOKEN, "vit_tiny_token"), (PRELOGITS, "vit_tiny_prelogits"), (HYBRID, "hybrid_tiny")):
        model = keras_vit.VisionTransformer(**case_config(name))
        assert set(official_variables(model)) == set(read_npz(path)), name


@pytest.mark.backend_independent
def test_official_key_layout_of_full_size_variants_matches_released_files():
    for variant, keys_file in (("ViT_B16", "keys_ViT-B_16.txt"), ("R50_ViT_B16", "keys_R50+ViT-B_16.txt")):
        lines = [l.split("\t") for l in (OFFICIAL / keys_file).read_text().splitlines() if "\t" in l]
        released = {k: tuple(int(d) for d in s.strip("()").split(",") if d.strip()) for k, s in lines}
        with shapes_only():
            model = getattr(keras_vit, variant)(image_size=384)
        ours = {k: tuple(v.shape) for k, v in official_variables(model).items()}
        assert ours == released, variant  # shapes exactly: a transposed kernel has the right size too


def test_another_variant_raises_naming_keys_and_leaves_weights_unchanged():
    model = keras_vit.VisionTransformer(**{**case_config("vit_tiny_token"), "hidden_size": 24, "mlp_dim": 48})
    before = _weights(model)
    with pytest.raises(ValueError, match=r"shape mismatch[\s\S]*embedding/kernel: file \(4, 4, 3, 48\), model \(4, 4, 3, 24\)"):
        keras_vit.load_weights(model, str(TOKEN))
    _assert_unchanged(model, before)


def test_deeper_model_reports_missing_and_shallower_reports_unexpected_keys():
    deeper = keras_vit.VisionTransformer(**{**case_config("vit_tiny_token"), "num_layers": 4})
    before = _weights(deeper)
    with pytest.raises(ValueError, match="missing from the file:[\\s\\S]*encoderblock_3"):
        keras_vit.load_weights(deeper, str(TOKEN))
    _assert_unchanged(deeper, before)
    shallower = keras_vit.VisionTransformer(**{**case_config("vit_tiny_token"), "num_layers": 2})
    before = _weights(shallower)
    with pytest.raises(ValueError, match="in the file but not in the model:[\\s\\S]*encoderblock_2"):
        keras_vit.load_weights(shallower, str(TOKEN))
    _assert_unchanged(shallower, before)


def _edited_token_file(tmp_path, **changes):
    """The token checkpoint with some arrays replaced (a value) or removed (None)."""
    arrays = read_npz(TOKEN)
    for key, value in changes.items():
        key = key.replace("__", "/")
        if value is None:
            del arrays[key]
        else:
            arrays[key] = value(arrays[key])
    path = tmp_path / "edited.npz"
    np.savez(path, **arrays)
    return path


def test_token_and_gap_checkpoints_do_not_cross(tmp_path):
    gap = keras_vit.VisionTransformer(**{**case_config("vit_tiny_token"), "classifier": "gap"})
    before = _weights(gap)
    with pytest.raises(ValueError, match=r"in the file but not in the model:\s*cls|pos_embedding: cannot resize"):
        keras_vit.load_weights(gap, str(TOKEN))
    _assert_unchanged(gap, before)
    gap_file = _edited_token_file(tmp_path, cls=None, Transformer__posembed_input__pos_embedding=lambda a: a[:, 1:])
    token = keras_vit.VisionTransformer(**case_config("vit_tiny_token"))
    before = _weights(token)
    with pytest.raises(ValueError, match=r"missing from the file:\s*cls"):
        keras_vit.load_weights(token, str(gap_file))
    _assert_unchanged(token, before)


@pytest.mark.parametrize("edit,match", [
    ({"Transformer__posembed_input__pos_embedding": lambda a: a[:, :16]},
     r"pos_embedding: cannot resize \(1, 16, 48\) to \(1, 17, 48\)"),
    ({"Transformer__encoderblock_1__LayerNorm_0__bias": lambda a: a.astype("int32")},
     r"encoderblock_1/LayerNorm_0/bias: dtype int32, expected floating point"),
    ({"Transformer__encoderblock_0__MlpBlock_3__Dense_0__kernel": lambda a: a.T.copy()},
     r"encoderblock_0/MlpBlock_3/Dense_0/kernel: file \(96, 48\), model \(48, 96\)"),
    ({"extra__kernel": lambda a: a}, None),
])
def test_every_loader_error_names_the_key_and_leaves_weights_unchanged(tmp_path, edit, match):
    if match is None:  # an extra key, not a replaced one
        arrays = read_npz(TOKEN)
        np.savez(tmp_path / "edited.npz", **arrays, **{"extra/kernel": np.zeros((2, 2), "float32")})
        path, match = tmp_path / "edited.npz", r"1 in the file but not in the model:\s*extra/kernel"
    else:
        path = _edited_token_file(tmp_path, **edit)
    model = keras_vit.VisionTransformer(**case_config("vit_tiny_token"))
    before = _weights(model)
    with pytest.raises(ValueError, match=match):
        keras_vit.load_weights(model, str(path))
    _assert_unchanged(model, before)


def test_a_lone_npy_array_is_not_a_checkpoint(tmp_path):
    path = tmp_path / "lone.npz"
    with open(path, "wb") as f:
        np.save(f, np.zeros((3, 3), "float32"))
    model = keras_vit.VisionTransformer(**case_config("vit_tiny_token"))
    before = _weights(model)
    with pytest.raises(ValueError, match="holds a single .npy array, not an .npz archive"):
        keras_vit.load_weights(model, str(path))
    _assert_unchanged(model, before)


def test_new_classes_give_zero_head_and_one_log_line(caplog):
    model = keras_vit.VisionTransformer(**{**case_config("vit_tiny_token"), "classes": 3})
    with caplog.at_level(logging.INFO, logger="keras_vit"):
        keras_vit.load_weights(model, str(TOKEN))
    assert len(caplog.records) == 1 and "new zero-initialised head (7 classes in the file, 3 in the model" in caplog.text
    assert not model.get_layer("head").kernel.numpy().any()
    ref = read_npz(TOKEN)
    np.testing.assert_array_equal(model.get_layer("embedding").kernel.numpy(), ref["embedding/kernel"])


def test_prelogits_kept_when_asked_and_dropped_with_a_note_otherwise():
    expected = np.load(OFFICIAL / "vit_tiny_prelogits.expected.npz")
    config = case_config("vit_tiny_prelogits")
    with_pre = keras_vit.VisionTransformer(**config, weights=PRELOGITS, classifier_activation=None)
    assert np.abs(with_pre.predict(expected["x"], verbose=0) - expected["logits"]).max() <= 1e-5
    without = keras_vit.VisionTransformer(**{**config, "representation_size": None})
    notes = keras_vit.load_weights(without, str(PRELOGITS))
    assert any("pre-logits" in n for n in notes) and any("not used: pre_logits" in n for n in notes)
    backbone = keras_vit.VisionTransformer(**{**config, "representation_size": None, "include_top": False})
    notes = keras_vit.load_weights(backbone, str(PRELOGITS))
    assert any("head" in n and "pre_logits" in n for n in notes)


def test_include_top_false_returns_the_pooled_representation():
    name = "vit_tiny_token"
    x = np.load(OFFICIAL / f"{name}.expected.npz")["x"]
    full = keras_vit.VisionTransformer(**case_config(name), weights=TOKEN, classifier_activation=None)
    backbone = keras_vit.VisionTransformer(**case_config(name), weights=TOKEN, include_top=False)
    features = backbone.predict(x, verbose=0)
    assert features.shape == (2, 48)
    head = full.get_layer("head")
    np.testing.assert_allclose(features @ head.kernel.numpy() + head.bias.numpy(), full.predict(x, verbose=0), atol=1e-5)


@pytest.mark.parametrize("content,match", [
    (b"not a zip at all", "not a readable official ViT .npz"),
    (None, "not a readable official ViT .npz"),  # truncated
])
def test_corrupt_files_raise_clearly(tmp_path, content, match):
    path = tmp_path / "bad.npz"
    path.write_bytes(content if content is not None else TOKEN.read_bytes()[:5000])
    model = keras_vit.VisionTransformer(**case_config("vit_tiny_token"))
    before = _weights(model)
    with pytest.raises(ValueError, match=match):
        keras_vit.load_weights(model, str(path))
    _assert_unchanged(model, before)


@pytest.mark.backend_independent
def test_pickled_arrays_are_refused(tmp_path):
    path = tmp_path / "pickled.npz"
    np.savez(path, **{"embedding/kernel": np.array([{"evil": 1}], dtype=object)})
    with pytest.raises(ValueError, match="pickle"):
        read_npz(path)


def test_missing_file_and_non_string_weights():
    with pytest.raises(FileNotFoundError, match="nowhere.npz"):
        keras_vit.VisionTransformer(**case_config("vit_tiny_token"), weights="/nowhere.npz")
    with pytest.raises(TypeError):
        keras_vit.load_weights(keras_vit.VisionTransformer(**TINY), 3)


@pytest.mark.backend_independent
def test_unknown_registry_tag_names_the_valid_ones():
    with pytest.raises(ValueError, match="imagenet21k"):
        keras_vit.ViT_B32(weights="imagenet42k")


def test_save_npz_round_trip_through_a_variant_factory_at_another_resolution(tmp_path, monkeypatch):
    """A factory's npz, read back by the factory: classes and 224 px off the file, then resized to another grid of
    16 px patches. The variant's widths and depth are TINY's (the full-size variants' official key layout is
    test_official_key_layout_of_full_size_variants_matches_released_files's fact)."""
    tiny_variant(monkeypatch)
    source = keras_vit.ViT_Ti16(classes=10, classifier_activation=None)
    path = save_npz(source, tmp_path / "ti16.npz")
    same = keras_vit.ViT_Ti16(weights=path, classifier_activation=None)  # classes and 224 px read off the file
    assert same.output_shape == (None, 10) and same.input_shape == (None, 224, 224, 3)
    x = np.random.default_rng(0).uniform(-1, 1, (1, 224, 224, 3)).astype("float32")
    np.testing.assert_allclose(same.predict(x, verbose=0), source.predict(x, verbose=0), atol=1e-5)
    bigger = keras_vit.ViT_Ti16(weights=path, image_size=(256, 320), classes=37)
    assert bigger.get_layer("posembed_input").pos_embedding.shape == (1, 1 + 16 * 20, TINY["hidden_size"])
    assert sorted(os.listdir(tmp_path)) == ["ti16.npz"]


@pytest.mark.parametrize("suffix", [".weights.h5", ".keras"])
def test_keras_weights_file_round_trip_and_mismatch_names_keys_and_keeps_weights(tmp_path, suffix):
    model = keras_vit.VisionTransformer(**TINY)
    path = str(tmp_path / f"m{suffix}")
    model.save_weights(path) if suffix == ".weights.h5" else model.save(path)
    clone = keras_vit.VisionTransformer(**TINY, weights=path)
    for a, b in zip(model.get_weights(), clone.get_weights()):
        np.testing.assert_array_equal(a, b)
    for change, match in (
        ({"hidden_size": 16}, r"weights left unchanged\):\s*37 shape mismatch:\s*"
                              r"layers/add_position_embs/vars/0: file \(1, 17, 32\), model \(1, 17, 16\)"),
        ({"classes": 5}, r"2 shape mismatch:\s*layers/dense/vars/0: file \(32, 10\), model \(32, 5\)"),
        ({"num_layers": 3}, r"16 missing from the file:\s*layers/transformer_block_2/attention/key/vars/0 \(32, 2, 16\)"),
        # Keras itself only warns here and loads the first block: a half-loaded model
        ({"num_layers": 1}, r"16 in the file but not in the model:\s*layers/transformer_block_1/attention/key/vars/0"),
    ):
        other = keras_vit.VisionTransformer(**{**TINY, **change})
        before = _weights(other)
        with pytest.raises(ValueError, match=match):
            keras_vit.load_weights(other, path)
        _assert_unchanged(other, before)


@pytest.fixture
def server(tmp_path):
    root = tmp_path / "served"
    root.mkdir()
    (root / "good.npz").write_bytes(TOKEN.read_bytes())
    (root / "truncated.npz").write_bytes(TOKEN.read_bytes()[: TOKEN.stat().st_size // 2])
    srv = LoopbackServer(root)
    yield srv
    srv.close()


def test_download_is_cached_once_and_loads(server, tmp_path):
    cache = tmp_path / "cache"
    path = download.fetch(f"{server.url}/good.npz", "good.npz", directory=str(cache))
    assert os.listdir(cache) == ["good.npz"]
    n = len(server.requests)
    assert download.fetch(f"{server.url}/good.npz", "good.npz", directory=str(cache)) == path
    assert len(server.requests) == n  # served from the cache
    model = keras_vit.VisionTransformer(**case_config("vit_tiny_token"), weights=path)
    assert model.get_layer("cls").cls.numpy().any()


@pytest.mark.backend_independent
def test_truncated_download_leaves_nothing_in_the_cache(server, tmp_path):
    cache = tmp_path / "cache"
    with pytest.raises(ValueError, match="not a complete .npz archive"):
        download.fetch(f"{server.url}/truncated.npz", "truncated.npz", directory=str(cache))
    assert os.listdir(cache) == []
    with pytest.raises(OSError, match="could not download"):
        download.fetch(f"{server.url}/absent.npz", "absent.npz", directory=str(cache))
    assert os.listdir(cache) == []


@pytest.mark.backend_independent
def test_corrupt_cached_file_is_never_trusted(server, tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "good.npz").write_bytes(b"half a file")
    path = download.fetch(f"{server.url}/good.npz", "good.npz", directory=str(cache))
    assert read_npz(path).keys() == read_npz(TOKEN).keys()
    assert any("good.npz" in r for r in server.requests)


@pytest.mark.backend_independent
def test_registry_tag_downloads_from_a_mirror(server, tmp_path, monkeypatch, user_home):
    """A registry name resolves to its record's URL; KERAS_VIT_BASE_URL points it at a mirror."""
    from keras_vit.weights import registry

    record = registry.get_weights("ViT_B16", "imagenet21k+imagenet2012", 384)
    rel = record.url[len(download.DEFAULT_BASE_URL):]
    target = tmp_path / "served" / rel.lstrip("/")
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(b"PK\x03\x04 truncated")
    monkeypatch.setenv(download.BASE_URL_ENV, server.url)
    with pytest.raises(ValueError, match="not a complete .npz archive"):
        keras_vit.ViT_B16(weights="imagenet21k+imagenet2012")
    assert any(rel in r for r in server.requests)
    assert not any(f.endswith(".npz") for f in os.listdir(download.cache_dir()))


def test_channel_count_the_weights_cannot_take():
    import keras

    model = keras_vit.VisionTransformer(**case_config("vit_tiny_token"), input_tensor=keras.Input((16, 16, 1)))
    before = _weights(model)
    with pytest.raises(ValueError, match=r"embedding/kernel: file \(4, 4, 3, 48\), model \(4, 4, 1, 48\)"):
        keras_vit.load_weights(model, str(TOKEN))
    _assert_unchanged(model, before)


# each builder option whose layers draw random initial values of their own, at TINY
DRAWING_OPTIONS = {
    "plain": {},
    "map_registers_2d": dict(classifier="map", num_register_tokens=2, position_embedding="learned_2d"),
    "factorized": dict(position_embedding="factorized", prefix_position_embedding=False),
    "relative_attention": dict(position_embedding="relative"),
    "beit": dict(relative_position_bias=True, layer_scale=0.1),
    "relative_mlp": dict(relative_position_mlp=16),
    "differential": dict(differential_attention=True, num_heads=1),
    "rope_mixed": dict(position_embedding="none", rope={"kind": "mixed"}),
}


@pytest.mark.backend_independent
@pytest.mark.parametrize("options", [*DRAWING_OPTIONS.values(), "hybrid_tiny"], ids=[*DRAWING_OPTIONS, "hybrid"])
def test_a_model_built_to_be_loaded_draws_nothing_a_load_does_not_write(options):
    """Inside `overwritten()` (a factory with weights, `from_timm`, `from_huggingface`) each weight that a layer
    would draw at random starts at zero instead, and every one of them is a variable a load writes (or refuses):
    no model comes out with a zero where it would have had a random value."""
    from keras_vit.layers.initial import overwritten

    config = case_config(options) if isinstance(options, str) else {**TINY, **options}
    drawn = keras_vit.VisionTransformer(**config)
    with overwritten():
        skipped = keras_vit.VisionTransformer(**config)
    written = {id(v) for v in official_variables(skipped).values()}
    zeroed = [v for a, v in zip(drawn.weights, skipped.weights) if not np.array_equal(a.numpy(), v.numpy())]
    assert len(zeroed) >= 2 * config["num_layers"]  # the blocks' kernels at least
    assert all(not np.any(v.numpy()) for v in zeroed), [v.path for v in zeroed if np.any(v.numpy())]
    assert [v.path for v in zeroed if id(v) not in written] == []
    assert [(a.path, a.shape) for a in drawn.weights] == [(v.path, v.shape) for v in skipped.weights]
