"""NaFlex models (keras_vit.naflex): a batch of images of different sizes as padded patch sequences gives,
image by image, what the plain model built at each image's size gives, whatever fills the padding."""

import keras
import numpy as np
import pytest

from keras_vit import layers as L
from keras_vit.model import build_vit
from keras_vit.naflex import naflex, patchify_images

TINY = dict(image_size=32, patch_size=8, hidden_size=32, mlp_dim=64, num_heads=4, num_layers=2, classes=5)
# (h, w) of the images of one batch: wide, square, tall, one patch
SIZES = [(24, 40), (32, 32), (56, 8), (8, 8)]
SEQ = 16
CONFIGS = {
    "token": dict(classifier="token"),
    "gap_registers": dict(classifier="gap", num_register_tokens=2, layer_scale=1e-5, fc_norm=True,
                          position_interpolation="bicubic_antialias"),
    "map": dict(classifier="map", num_register_tokens=1, position_interpolation="bicubic"),
    "deit": dict(distillation_token=True, prefix_position_embedding=False, classifier_activation=None),
    "features": dict(classifier="gap", include_top=False, pooling=None),
    "uint8": dict(classifier="gap", input_dtype="uint8", input_mode="imagenet"),
    "aspect_preserving": dict(classifier="gap", num_register_tokens=4, position_aspect_preserving=True,
                              position_interpolation="bicubic_antialias"),
    "factorized": dict(classifier="token", position_embedding="factorized", prefix_position_embedding=False,
                       position_aspect_preserving=True, position_interpolation="bilinear_half_pixel"),
    "no_positions": dict(classifier="gap", position_embedding="none"),
}


def _model(rng, **options):
    """A tiny model of any size with every weight random (heads included: not zero-initialised)."""
    model = build_vit(**{**TINY, **options}, input_shape=(None, None, 3))
    for w in model.weights:
        w.assign(rng.normal(size=w.shape).astype("float32") * 0.2)
    return model


def _batch(images, patch_size, seq_len, rng=None):
    """The NaFlex batch of `images` (each (h, w, 3)), padded to `seq_len`; the padding random when `rng`."""
    batch = {k: [] for k in ("patches", "patch_coord", "patch_valid")}
    for image in images:
        one = patchify_images(image[None], patch_size)
        n = one["patches"].shape[1]
        pad = seq_len - n
        fill = {"patches": np.zeros((pad, one["patches"].shape[-1]), one["patches"].dtype),
                "patch_coord": np.zeros((pad, 2), "int32"), "patch_valid": np.zeros((pad,), bool)}
        if rng is not None:
            fill["patches"] = rng.uniform(0, 255, fill["patches"].shape).astype(one["patches"].dtype)
            fill["patch_coord"] = rng.integers(0, 9, (pad, 2)).astype("int32")
        for k in batch:
            batch[k].append(np.concatenate([one[k][0], fill[k]]))
    return {k: np.stack(v) for k, v in batch.items()}


def _images(rng, dtype):
    return [(rng.integers(0, 256, (h, w, 3)) if dtype == "uint8" else rng.uniform(-1, 1, (h, w, 3))).astype(dtype)
            for h, w in SIZES]


@pytest.mark.parametrize("name", list(CONFIGS))
def test_each_image_of_a_padded_batch_equals_the_plain_model_at_its_size(name):
    rng = np.random.default_rng(0)
    model = _model(rng, **CONFIGS[name])
    flex = naflex(model)
    images = _images(rng, model.inputs[0].dtype)
    got = flex.predict(_batch(images, 8, SEQ), verbose=0)
    noisy = flex.predict(_batch(images, 8, SEQ, rng=rng), verbose=0)  # other patches and coordinates in the padding
    for i, image in enumerate(images):
        # TensorFlow would trace `predict` again for the sizes and runs the plain model's call eagerly as fast;
        # JAX compiles each eager op at each size, and its `predict` the whole model once a size
        on_tf = keras.backend.backend() == "tensorflow"
        want = (keras.ops.convert_to_numpy(model(image[None], training=False)) if on_tf
                else model.predict(image[None], verbose=0))[0]
        n = (image.shape[0] // 8) * (image.shape[1] // 8)
        if want.ndim == 3:  # the feature map: the patch tokens row-major, then the padding
            want, got_i, noisy_i = want.reshape(-1, want.shape[-1]), got[i, :n], noisy[i, :n]
        else:
            got_i, noisy_i = got[i], noisy[i]
        np.testing.assert_allclose(got_i, want, atol=1e-5, rtol=0, err_msg=f"{name} image {i} {image.shape}")
        np.testing.assert_allclose(noisy_i, want, atol=1e-5, rtol=0, err_msg=f"{name} image {i}, random padding")


def test_saved_naflex_model_reloads_in_safe_mode_with_its_class_names(tmp_path):
    rng = np.random.default_rng(1)
    model = _model(rng, **CONFIGS["gap_registers"])
    model.class_names = [f"c{i}" for i in range(5)]
    flex = naflex(model)
    assert flex.class_names == model.class_names and naflex(flex) is flex
    batch = _batch(_images(rng, "float32"), 8, SEQ)
    flex.save(tmp_path / "flex.keras")
    again = keras.saving.load_model(tmp_path / "flex.keras", safe_mode=True)
    np.testing.assert_array_equal(again.predict(batch, verbose=0), flex.predict(batch, verbose=0))
    assert again.class_names == model.class_names


def test_a_training_step_sees_no_padding():
    """One SGD step on a padded batch moves every weight as the step on the image alone, unpadded."""
    rng = np.random.default_rng(2)
    model = _model(rng, **CONFIGS["map"])
    image = _images(rng, "float32")[0]
    labels = np.array([3])
    weights = []
    for seq_len in (15, 24):  # 15: the image's own 3 x 5 patches; 24: nine padded
        flex = naflex(model)
        flex.compile(optimizer=keras.optimizers.SGD(0.5), loss="sparse_categorical_crossentropy")
        flex.train_on_batch(_batch([image], 8, seq_len, rng=rng), labels)
        weights.append([w.numpy() if hasattr(w, "numpy") else keras.ops.convert_to_numpy(w) for w in flex.weights])
    moved = max(np.abs(a - b).max() for a, b in zip(weights[0], model.get_weights()))
    assert moved > 1e-3
    for a, b in zip(*weights):
        np.testing.assert_allclose(a, b, atol=1e-5, rtol=0)


@pytest.mark.parametrize("bad, match", [
    (lambda b: b["patch_coord"].__setitem__((0, 0, 0), -1), "negative patch coordinate"),
    (lambda b: b["patch_coord"].__setitem__((1, 3, 1), 7), r"do not tile the 4x8 grid"),
    (lambda b: b["patch_valid"].__setitem__(2, False), "image 2 of the batch has no valid patch"),
    (lambda b: b.__setitem__("patches", b["patches"][..., :100]), r"patches of shape \(batch, tokens, 192\)"),
    (lambda b: b.__setitem__("patch_valid", b["patch_valid"].astype("int32")), "bool patch_valid"),
    (lambda b: b.pop("patch_coord"), "takes a dict with keys"),
])
def test_bad_batches_are_refused_before_anything_runs(bad, match):
    rng = np.random.default_rng(3)
    flex = naflex(_model(rng))
    flex.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")
    batch = _batch(_images(rng, "float32"), 8, SEQ)
    before = [w.copy() for w in flex.get_weights()]
    bad(batch)
    for call in (lambda: flex.predict(batch, verbose=0), lambda: flex.fit(batch, np.zeros(4), verbose=0)):
        with pytest.raises(ValueError, match=match):
            call()
    for a, b in zip(before, flex.get_weights()):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("options, match", [
    (dict(position_embedding="learned_2d"), "AddPositionEmbs2D is laid out for one grid"),
    (dict(position_embedding="relative"), "relative position attention"),
    (dict(position_placement="every_layer"), "added before every block"),
    (dict(position_placement="every_layer_shared"), "added before every block"),
    (dict(resnet={"num_layers": (1,), "width_factor": 1}, patch_size=1), "ResNet stem needs whole images"),
])
def test_models_that_cannot_read_coordinates_are_refused_by_name(options, match):
    model = build_vit(**{**TINY, **options})
    with pytest.raises(ValueError, match=f"naflex: model 'vit' cannot take a NaFlex batch: .*{match}"):
        naflex(model)


def test_patch_encoder_names_a_patch_width_of_another_patch_size():
    layer = L.PatchEncoder(8, 16)
    layer.build((None, None, 192))
    with pytest.raises(ValueError, match=r"patches are 192 values \(8x8 pixels x 3 channels\), got patches of shape "
                                         r"\(2, 5, 768\)"):
        layer(np.zeros((2, 5, 768), "float32"))


@pytest.mark.skipif(keras.backend.backend() != "jax", reason="JAX's fused-attention path")
def test_the_cudnn_path_masks_by_sequence_lengths_as_the_standard_path_masks():
    """`padded_attention` (the GPU kernel's call, run with JAX's XLA implementation here) with a NaFlex
    validity mask equals the standard path's masked softmax on the valid queries."""
    from keras_vit.layers.attention import _matmul_attention, padded_attention

    rng = np.random.default_rng(4)
    q, k, v = (rng.normal(size=(3, 20, 2, 8)).astype("float32") for _ in range(3))
    valid = np.arange(20)[None] < np.array([[20], [13], [1]])
    got = np.asarray(padded_attention(q, k, v, 0.35, implementation="xla", valid=valid))
    want = keras.ops.convert_to_numpy(_matmul_attention(q, k, v, 0.35, valid))
    for i, n in enumerate((20, 13, 1)):
        np.testing.assert_allclose(got[i, :n], want[i, :n], atol=1e-5, rtol=0)


def test_the_builder_makes_a_naflex_model_as_a_stage():
    model = build_vit(**TINY, classifier="map", position_embedding="factorized", naflex=True)
    assert {t.name for t in model.inputs} == {"patches", "patch_coord", "patch_valid"}
    rng = np.random.default_rng(5)
    out = model.predict(_batch(_images(rng, "float32"), 8, SEQ), verbose=0)
    assert out.shape == (4, 5) and np.allclose(out.sum(-1), 1, atol=1e-5)


@pytest.mark.parametrize("options, match", [
    (dict(naflex=True, position_embedding="learned_2d"), "a NaFlex model \\(naflex=True\\) takes position_embedding "
                                                          "'learned_1d', 'factorized' or 'none' added once"),
    (dict(naflex=True, resnet={"num_layers": (1,), "width_factor": 1}, patch_size=1), "ResNet stem needs whole"),
    (dict(position_embedding="factorized"), "factorized' adds to the patch tokens only"),
    (dict(position_embedding="learned_2d", position_aspect_preserving=True), "position_aspect_preserving=True resizes"),
])
def test_naflex_options_that_do_not_go_together_are_refused(options, match):
    with pytest.raises(ValueError, match=match):
        build_vit(**{**TINY, **options})
