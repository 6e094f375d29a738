"""The fast-path options of issue #18: uint8 images scaled on the device, and the choice of attention
kernel (the GPU's fused one where it runs, a clear error where asked for and it cannot); under each
KERAS_BACKEND, with a tiny ViT."""

import logging

import keras
import numpy as np
import pytest

import keras_vit
from keras_vit import layers as L
from keras_vit.layers.attention import flash_unavailable

TINY = dict(image_size=32, patch_size=8, hidden_size=32, mlp_dim=64, num_heads=2, num_layers=1, classes=5)


def _predict(model, x):
    return keras.ops.convert_to_numpy(model(x, training=False))


def test_uint8_input_equals_preprocessed_float_input_and_reloads_in_safe_mode(tmp_path, rng):
    images = rng.integers(0, 256, size=(2, 32, 32, 3)).astype("uint8")
    model = keras_vit.VisionTransformer(**TINY, input_dtype="uint8", classifier_activation=None)
    plain = keras_vit.VisionTransformer(**TINY, classifier_activation=None)
    assert model.inputs[0].dtype == "uint8" and model.get_layer("rescale").dtype_policy.compute_dtype == "float32"
    assert len(model.weights) == len(plain.weights)  # the same weights: files load into either
    for w in plain.weights:
        w.assign(rng.normal(size=w.shape, scale=0.2).astype("float32"))
    model.set_weights(plain.get_weights())
    expected = _predict(plain, keras_vit.preprocess_input(images))
    np.testing.assert_allclose(_predict(model, images), expected, atol=1e-5)
    from keras_vit.export import serving_model  # a uint8 model is served as it is, not scaled twice

    served = keras.ops.convert_to_numpy(serving_model(model, top_k=None)(images)["logits"])
    np.testing.assert_allclose(served, keras.ops.convert_to_numpy(serving_model(plain)(images)["logits"]),
                               atol=1e-6)
    path = str(tmp_path / "m.keras")
    model.save(path)
    reloaded = keras.saving.load_model(path, safe_mode=True)
    assert reloaded.inputs[0].dtype == "uint8"
    np.testing.assert_allclose(_predict(reloaded, images), expected, atol=1e-5)


def test_unknown_options_are_refused():
    with pytest.raises(ValueError, match="input_dtype"):
        keras_vit.VisionTransformer(**TINY, input_dtype="float16")
    with pytest.raises(ValueError, match="attention_implementation"):
        keras_vit.VisionTransformer(**TINY, attention_implementation="cudnn")
    with pytest.raises(ValueError, match="attention_implementation"):
        L.TransformerBlock(2, 16, attention_implementation="xla")


def _why():
    return flash_unavailable(16, "float32")  # float32 never runs the fused kernel


def test_asking_for_flash_where_it_cannot_run_is_an_error_before_compiling():
    with pytest.raises(ValueError, match="attention_implementation='flash' cannot run here"):
        keras_vit.VisionTransformer(**TINY, attention_implementation="flash")
    with pytest.raises(ValueError, match="relative attention adds a bias"):
        keras_vit.VisionTransformer(**TINY, position_embedding="relative", attention_implementation="flash")


def test_auto_falls_back_with_one_log_line_and_equals_standard(caplog, rng):
    from keras_vit.layers import attention

    attention._LOGGED.clear()
    x = rng.normal(size=(2, 5, 32)).astype("float32")
    with caplog.at_level(logging.INFO, logger="keras_vit"):
        auto = [L.TransformerBlock(2, 64) for _ in range(2)]
        for block in auto:
            block.build(x.shape)
    lines = [r.getMessage() for r in caplog.records if r.name == "keras_vit"]
    assert len(lines) == 1 and "standard path runs" in lines[0] and _why() in lines[0], lines
    assert not auto[0].attention.flash
    standard = L.TransformerBlock(2, 64, attention_implementation="standard")
    standard.build(x.shape)
    standard.set_weights(auto[0].get_weights())
    for training in (False, True):
        np.testing.assert_array_equal(keras.ops.convert_to_numpy(standard(x, training=training)),
                                      keras.ops.convert_to_numpy(auto[0](x, training=training)))
    config = standard.get_config()
    assert config["attention_implementation"] == "standard"
    assert L.TransformerBlock.from_config(config).attention_implementation == "standard"


def test_auto_trains_through_the_fused_kernel_where_it_runs(monkeypatch, rng):
    """Where `flash_unavailable` finds nothing against it, "auto" takes the fused kernel in training
    too (on JAX the padded path, measured 1.26x on a GPU); "standard" never does. The kernel is
    replaced by a recorder: this machine has none."""
    from keras_vit.layers import attention

    monkeypatch.setattr(attention, "flash_unavailable", lambda head_dim, dtype: None)
    calls = []

    def recorder(q, k, v, scale, training=False, valid=None):
        calls.append(training)
        return attention._matmul_attention(q, k, v, scale, valid)

    monkeypatch.setattr(attention, "_flash_attention", recorder)
    x = rng.normal(size=(2, 5, 32)).astype("float32")
    for impl, expected in (("auto", [False, True]), ("standard", [])):
        calls.clear()
        layer = L.MultiHeadDotProductAttention(2, attention_implementation=impl)
        layer.build(x.shape)
        for training in (False, True):
            layer(x, training=training)
        assert calls == expected, (impl, calls)


def test_flash_equals_standard_within_bfloat16_tolerance(rng):
    """On a GPU: the fused kernel against the standard path, both in bfloat16, head size 64.

    Tolerance: 2e-2 absolute on unit-scale outputs, a few bfloat16 roundings (eps 2^-8) of the
    softmax-weighted sums; the two paths round in different orders."""
    if flash_unavailable(64, "bfloat16"):
        pytest.skip(f"needs the fused attention kernel: {flash_unavailable(64, 'bfloat16')}")
    x = rng.normal(size=(4, 197, 128)).astype("float32")
    layers = {}
    for impl in ("flash", "standard"):
        layers[impl] = L.MultiHeadDotProductAttention(2, attention_implementation=impl, dtype="mixed_bfloat16")
        layers[impl].build(x.shape)
    assert layers["flash"].flash and not layers["standard"].flash
    layers["standard"].set_weights(layers["flash"].get_weights())
    y = {k: keras.ops.convert_to_numpy(keras.ops.cast(v(x), "float32")) for k, v in layers.items()}
    np.testing.assert_allclose(y["flash"], y["standard"], atol=2e-2)


def test_uint8_pipeline_is_the_float_pipeline_rounded():
    tf = pytest.importorskip("tensorflow")
    from keras_vit import data

    image = tf.constant(np.random.default_rng(1).integers(0, 256, size=(20, 28, 3)).astype("uint8"))
    seed = tf.constant([3, 4])
    for as_float, as_uint8 in (
        (data.eval_preprocess(image, 16), data.eval_preprocess(image, 16, "uint8")),
        (data.train_preprocess(image, 16, seed), data.train_preprocess(image, 16, seed, "uint8")),
    ):
        assert as_uint8.dtype == tf.uint8 and as_float.dtype == tf.float32
        rounded = np.clip(np.round(as_float.numpy() * 127.5 + 127.5), 0, 255)
        np.testing.assert_allclose(as_uint8.numpy(), rounded, atol=1)  # 1: a rounding tie
        assert np.mean(as_uint8.numpy() == rounded) > 0.99
    with pytest.raises(ValueError, match="image_dtype"):
        data.eval_preprocess(image, 16, "float16")


@pytest.mark.skipif(keras.backend.backend() != "jax", reason="JAX's padded path to cuDNN's fused attention")
@pytest.mark.parametrize("tokens", [197, 64, 5])
def test_padded_masked_attention_equals_plain_attention_with_gradients(tokens, rng):
    """JAX training with attention_implementation="flash" pads the sequence to a multiple of 64 and
    masks the padding: through XLA's implementation (the same padding and masks the cuDNN kernel
    gets on a GPU) the values and the gradients of q, k and v equal unpadded attention in float32."""
    import jax
    import jax.numpy as jnp

    from keras_vit.layers.attention import CUDNN_TRAINING_MULTIPLE, _matmul_attention, padded_attention

    q, k, v = (jnp.asarray(rng.normal(size=(2, tokens, 3, 8)).astype("float32")) for _ in range(3))
    w = jnp.asarray(rng.normal(size=(2, tokens, 3, 8)).astype("float32"))  # a loss that weighs every output
    scale = 8 ** -0.5

    def loss(attend):
        return lambda q, k, v: jnp.sum(attend(q, k, v, scale) * w)

    padded = loss(lambda *a: padded_attention(*a, implementation="xla"))
    plain = loss(lambda *a: _matmul_attention(*a))
    np.testing.assert_allclose(padded_attention(q, k, v, scale, implementation="xla"),
                               _matmul_attention(q, k, v, scale), atol=2e-6)
    for got, expected in zip(jax.grad(padded, (0, 1, 2))(q, k, v), jax.grad(plain, (0, 1, 2))(q, k, v)):
        np.testing.assert_allclose(got, expected, atol=1e-5)
    text = jax.jit(lambda q, k, v: padded_attention(q, k, v, scale, implementation="xla")).lower(q, k, v).as_text()
    padded_length = -(-tokens // CUDNN_TRAINING_MULTIPLE) * CUDNN_TRAINING_MULTIPLE
    assert f"2x{padded_length}x3x8" in text  # the kernel sees the padded length
