"""DINOv3 (2-D rotary position embedding, 4 registers, layer scale): timm's `vit_*_dinov3*` files and
transformers' DINOv3ViTModel folders read by `from_timm` / `from_huggingface`, equal to the source
library's own random-weight models at two image sizes (fixed-size builds, and one model of any size),
reloaded in safe mode, trained with and without remat; and what is refused, in one line."""

import os
import sys

import keras
import numpy as np
import pytest

import keras_vit

torch = pytest.importorskip("torch")
safetensors_torch = pytest.importorskip("safetensors.torch")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
from timm_peer import import_timm  # noqa: E402
from timm_files import close as _close, images as _images, nchw as _nchw, redraw as _redraw  # noqa: E402
from timm_files import timm_file as _timm_file, to_numpy as _np  # noqa: E402

timm = import_timm()
SIZES = ((64, 64), (48, 80))  # the size timm's model is made at, and another (not square)
PREFIX = 5  # the class token and 4 registers: left unrotated


def _timm_dinov3(arch, seed=0):
    """timm's `arch` at depth 2, its weights all drawn anew (layer scale 1e-5, zero or absent biases would hide
    a mistake): kernels of about unit gain, vectors (biases, scales) of deviation 0.5."""
    module = timm.create_model(arch, pretrained=False, depth=2, img_size=SIZES[0], global_pool="token")
    _redraw(module, seed)
    return module.eval()


# the rotary numerics on every backend; the key maps of the biased and the SwiGLU layouts, once (torch's lane)
ONCE = pytest.mark.backend_independent


@pytest.mark.parametrize("arch", ["vit_small_patch16_dinov3", pytest.param("vit_tiny_patch16_dinov3_qkvb", marks=ONCE),
                                  pytest.param("vit_small_plus_patch16_dinov3", marks=ONCE)],
                         ids=["no_bias", "qv_bias", "swiglu"])
def test_timm_dinov3_files_equal_timm_at_two_sizes(arch, tmp_path):
    """The patch tokens on their grid at the size timm's model is made at and another, the head count read off
    the name; at the first, the class token (upstream DINOv3's representation); with the biased and SwiGLU
    layouts (torch's lane), timm's default average of the patch tokens and the default size, timm's 256 px."""
    ref = _timm_dinov3(arch)
    path = _timm_file(ref, tmp_path, arch)
    once = arch != "vit_small_patch16_dinov3"  # the torch lane's parameters: the loader's facts, not the numerics
    if once:
        assert keras_vit.from_timm(path).input_shape == (None, 256, 256, 3)  # timm's pretrained configs' size
    for h, w in SIZES:
        x = _images(h, w)
        with torch.no_grad():
            tokens = ref.forward_features(_nchw(x))
        grid = keras_vit.from_timm(path, image_size=(h, w), pooling=None)
        assert grid.get_layer("encoderblock_0").rope_options == {  # timm's DINOv3: no training-time augmentation
            "kind": "dinov3", "temperature": 100.0, "shift": None, "jitter": None, "rescale": None}
        _close(_np(grid(x)), tokens[:, PREFIX:].numpy().reshape(2, h // 16, w // 16, -1), f"patch tokens at {h}x{w}")
    x = _images(*SIZES[0])
    with torch.no_grad():
        tokens = ref.forward_features(_nchw(x))
    _close(_np(keras_vit.from_timm(path, image_size=SIZES[0])(x)), tokens[:, 0].numpy(), "class token")
    if once:
        _close(_np(keras_vit.from_timm(path, image_size=SIZES[0], pooling="avg")(x)),
               tokens[:, PREFIX:].mean(1).numpy(), "patch average")


def test_a_dinov3_model_of_any_size_reloads_extracts_and_inspects(tmp_path):
    """`any_size` of a DINOv3 model reads its rotary tables off each call's images (three sizes, predict
    too), reloads from `.keras` in safe mode, and gives the feature maps and attention maps of the zoo."""
    arch = "vit_small_patch16_dinov3"
    ref = _timm_dinov3(arch)
    model = keras_vit.any_size(keras_vit.from_timm(_timm_file(ref, tmp_path, arch), image_size=SIZES[0]))
    assert model.input_shape == (None, None, None, 3)
    for h, w in (*SIZES, (32, 96)):
        x = _images(h, w, seed=h)
        with torch.no_grad():
            expected = ref.forward_features(_nchw(x))[:, 0].numpy()
        _close(_np(model(x)), expected, f"{h}x{w}")
        _close(model.predict(x, verbose=0), expected, f"predict at {h}x{w}")
    model.save(tmp_path / "m.keras")
    again = keras.saving.load_model(tmp_path / "m.keras", safe_mode=True)
    _close(_np(again(x)), expected, "reloaded")
    fixed = keras_vit.from_timm(_timm_file(ref, tmp_path, arch), image_size=SIZES[0])
    x = _images(*SIZES[0])
    maps = keras_vit.feature_extractor(fixed, blocks=[0, -1], output="maps")(x)
    assert [tuple(m.shape) for m in maps] == [(2, 4, 4, 384)] * 2
    from keras_vit.inspection import attention_maps

    attentions = attention_maps(fixed, x)
    assert attentions[0].shape == (2, 6, PREFIX + 16, PREFIX + 16)
    np.testing.assert_allclose(np.asarray(attentions[0]).sum(-1), 1.0, atol=1e-5)
    for ours, theirs in zip(attention_maps(model, x), attentions):  # the any-size model: its tables of these images
        np.testing.assert_allclose(ours, theirs, atol=1e-6, rtol=0)


@pytest.mark.parametrize("gated", [False, pytest.param(True, marks=ONCE)], ids=["mlp", "gated_mlp"])
def test_transformers_dinov3_folders_equal_transformers_at_two_sizes(gated, tmp_path):
    """DINOv3ViTModel saved with save_pretrained (registers, layer scale, no key bias; the gated SiLU MLP
    of the large models, with all biases): its pooler output (the class token) and patch tokens."""
    from transformers import DINOv3ViTConfig, DINOv3ViTModel

    torch.manual_seed(0)
    config = DINOv3ViTConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=96,
                             image_size=SIZES[0][0], num_register_tokens=4, layerscale_value=0.5,
                             use_gated_mlp=gated, hidden_act="silu" if gated else "gelu", key_bias=gated)
    ref = DINOv3ViTModel(config).eval()
    _redraw(ref)
    ref.save_pretrained(tmp_path / "hf")
    for h, w in SIZES:
        x = _images(h, w)
        with torch.no_grad():
            out = ref(pixel_values=_nchw(x))
        model = keras_vit.from_huggingface(tmp_path / "hf", image_size=(h, w))
        _close(_np(model(x)), out.pooler_output.numpy(), f"pooler output at {h}x{w}")
        grid = keras_vit.from_huggingface(tmp_path / "hf", image_size=(h, w), pooling=None)
        patches = out.last_hidden_state[:, PREFIX:].numpy().reshape(2, h // 16, w // 16, -1)
        _close(_np(grid(x)), patches, f"patch tokens at {h}x{w}")


def _rotary_vit(**kw):
    return keras_vit.VisionTransformer(**{**dict(
        image_size=32, patch_size=8, hidden_size=32, mlp_dim=64, num_heads=2, num_layers=2, classes=3,
        num_register_tokens=2, layer_scale=0.5, position_embedding="none",
        rope={"kind": "dinov3", "temperature": 100.0}), **kw})


def test_a_rotary_model_trains_the_same_with_remat():
    """Two SGD steps of a rotary model (the first trains its zero head) change its weights, and with remat
    (the recomputed blocks take the tables with the dropout masks) to the same weights."""
    x = _images(32, 32)
    y = np.array([0, 2])
    after = []
    for remat in (False, True):
        keras.utils.set_random_seed(1)
        model = _rotary_vit(remat=remat, classifier_activation=None)
        before = [w.copy() for w in model.get_weights()]
        model.compile(optimizer=keras.optimizers.SGD(0.1),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        model.fit(x, y, batch_size=1, epochs=1, shuffle=False, verbose=0)
        after.append(model.get_weights())
        moved = [np.abs(a - b).max() for a, b in zip(after[-1], before)]
        assert sum(m > 0 for m in moved) > len(moved) // 2, f"remat={remat}: most weights should move"
    for a, b in zip(*after):
        np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-5)


@pytest.mark.backend_independent
def test_what_rotary_position_embedding_refuses(tmp_path):
    """An unknown kind, heads it cannot rotate, a NaFlex model, a timm Eva-layout file whose name does not say
    its architecture, a DINOv3 file into a model without rotary embedding (its weights kept), a keras-hub
    ViTBackbone preset of a rotary model: each one line naming what was expected; nothing built or written."""
    with pytest.raises(ValueError, match=r"rope: unknown kind 'xpos'; expected one of \('dinov3', 'eva', 'mixed'\)"):
        _rotary_vit(rope={"kind": "xpos"})
    with pytest.raises(ValueError, match="rope must be None or a dict with the keys"):
        _rotary_vit(rope="dinov3")
    with pytest.raises(ValueError, match="head size 6 is not a multiple of 4"):
        keras_vit.VisionTransformer(image_size=32, patch_size=8, hidden_size=12, mlp_dim=24, num_heads=2,
                                    num_layers=1, position_embedding="none", rope={"kind": "dinov3"})
    with pytest.raises(ValueError, match="a NaFlex batch holds each image at its own grid"):
        _rotary_vit(naflex=True)
    from keras_vit.naflex import naflex

    with pytest.raises(ValueError, match="cannot take a NaFlex batch: its blocks rotate queries and keys by the "
                                         "tables of one grid"):
        naflex(_rotary_vit())
    arch = "vit_small_patch16_dinov3"
    unnamed = str(tmp_path / "model.safetensors")
    safetensors_torch.save_file({k: v.contiguous() for k, v in _timm_dinov3(arch).state_dict().items()}, unnamed)
    with pytest.raises(ValueError, match=r"timm's Eva layout .* does not record: name the file after its timm "
                                         r"architecture \(one of vit_tiny_patch16_dinov3, vit_small_patch16_dinov3"):
        keras_vit.from_timm(unnamed)
    plain = keras_vit.VisionTransformer(image_size=64, patch_size=16, hidden_size=384, mlp_dim=1536, num_heads=6,
                                        num_layers=2, include_top=False, num_register_tokens=4, layer_scale=1e-5,
                                        position_embedding="none", approximate_gelu=False, layer_norm_epsilon=1e-5)
    named = _timm_file(_timm_dinov3(arch), tmp_path, arch)
    before = [w.copy() for w in plain.get_weights()]
    with pytest.raises(ValueError, match=r"rope=\{'kind': 'dinov3', 'temperature': 100.0\} in the file, None in the "
                                         r"model\. Build the model with the file's options"):
        keras_vit.load_weights(plain, named)
    assert all(np.array_equal(a, b) for a, b in zip(before, plain.get_weights()))
    from keras_vit.weights.keras_hub_save import save_keras_hub_preset

    with pytest.raises(ValueError, match=r"is no keras-hub ViTBackbone: .*rope=\{'kind': 'dinov3'"):
        # DINOv3's rotary embedding without its layer scale: neither a ViTBackbone nor a DINOV3Backbone
        save_keras_hub_preset(_rotary_vit(include_top=False, approximate_gelu=False, layer_scale=None),
                              tmp_path / "preset")
    assert not (tmp_path / "preset").exists()


@pytest.mark.backend_independent
def test_every_timm_architecture_of_dinov3s_layout_is_read_as_timm_defines_it():
    """For every timm architecture with DINOv3's rotary embedding (rope_type='dinov3'), built at depth 1 on the
    meta device (its tensors' shapes only): the state dict read with the architecture's name gives timm's head
    count, rotary temperature, LayerNorm epsilon, registers, MLP and pretrained size; and every such
    architecture is in the table."""
    from keras_vit.weights import timm as timm_keys

    archs = [a for a in timm.list_models(["*dinov3*", "*lingbot*"])]
    assert len(archs) >= 15
    named = set()
    for arch in archs:
        with torch.device("meta"):
            ref = timm.create_model(arch, pretrained=False, depth=1)
        assert type(ref.rope).__name__ == "RotaryEmbeddingDinoV3", arch
        tensors = {k: np.broadcast_to(np.float32(0), tuple(v.shape)) for k, v in ref.state_dict().items()}
        read = timm_keys.architecture(timm_keys.readable(tensors, arch), arch)
        block = ref.blocks[0]
        swiglu = type(block.mlp).__name__ != "Mlp"
        assert (read["timm_heads"], read["rope"], read["layer_norm_epsilon"], read["num_register_tokens"]) == (
            block.attn.num_heads, {"kind": "dinov3", "temperature": ref.rope.temperature}, ref.norm.eps,
            ref.reg_token.shape[1]), arch
        assert read["mlp_activation"] == ("swiglu" if swiglu else None), arch
        assert read["mlp_dim"] == (block.mlp.fc2.in_features), arch
        assert read["image_size"] == tuple(timm.models.get_pretrained_cfg(arch).input_size[1:]), arch
        named.add(timm_keys.named_architecture(arch, timm_keys.TIMM_DINOV3_LAYOUT))
    assert named == set(timm_keys.TIMM_DINOV3_LAYOUT)


AUGMENT = {"shift": 0.2, "jitter": 1.5, "rescale": 2.0}  # all three of DINOv3's, at values its configs use or near


def _torch_draw(seed):
    """transformers' draw of `augment_patches_center_coordinates` under torch.manual_seed(seed), in its order
    (shift (1, 2), jitter (1, 2), rescale (1,)), as the (3, 2) draw `RotaryAugment` gives."""
    torch.manual_seed(seed)
    shift = torch.empty((1, 2)).uniform_(-AUGMENT["shift"], AUGMENT["shift"])[0]
    jitter = torch.empty((1, 2)).uniform_(-np.log(AUGMENT["jitter"]), np.log(AUGMENT["jitter"])).exp()[0]
    rescale = torch.empty(1).uniform_(-np.log(AUGMENT["rescale"]), np.log(AUGMENT["rescale"])).exp()
    return np.stack([shift.numpy(), jitter.numpy(), np.repeat(rescale.numpy(), 2)]).astype("float32")


def test_dinov3_coordinate_augmentation_trains_as_transformers(tmp_path, monkeypatch):
    """DINOv3ViTModel in training mode with shift, jitter and rescale (its config's pos_embed_*) moves every
    block's rotary coordinates by one draw a forward: read by from_huggingface, the keras-vit model in training,
    given transformers' draw (`RotaryAugment`'s output, set to it here), gives transformers' tokens at two sizes,
    every block reading the one draw; in evaluation both leave the coordinates as they are."""
    from transformers import DINOv3ViTConfig, DINOv3ViTModel

    from keras_vit.layers import RotaryAugment

    torch.manual_seed(0)
    config = DINOv3ViTConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=96,
                             image_size=SIZES[0][0], num_register_tokens=4, layerscale_value=0.5,
                             pos_embed_shift=AUGMENT["shift"], pos_embed_jitter=AUGMENT["jitter"],
                             pos_embed_rescale=AUGMENT["rescale"])
    ref = DINOv3ViTModel(config)
    _redraw(ref)
    ref.save_pretrained(tmp_path / "hf")
    ref.train()
    draw = {}
    monkeypatch.setattr(RotaryAugment, "call", lambda self, x, training=None: keras.ops.convert_to_tensor(
        draw["value"] if training else np.array([[0.0, 0.0], [1.0, 1.0], [1.0, 1.0]], "float32")))
    for seed, (h, w) in enumerate(SIZES):
        model = keras_vit.from_huggingface(tmp_path / "hf", image_size=(h, w), pooling=None)
        assert model.get_layer("encoderblock_0").rope_options == {"kind": "dinov3", "temperature": 100.0, **AUGMENT}
        x = _images(h, w, seed=seed)
        draw["value"] = _torch_draw(seed)
        torch.manual_seed(seed)
        with torch.no_grad():
            moved = ref(pixel_values=_nchw(x)).last_hidden_state[:, PREFIX:].numpy().reshape(2, h // 16, w // 16, -1)
            still = ref.eval()(pixel_values=_nchw(x)).last_hidden_state[:, PREFIX:].numpy()
        ref.train()
        _close(_np(model(x, training=True)), moved, f"training at {h}x{w}")
        _close(_np(model(x, training=False)), still.reshape(moved.shape), f"evaluation at {h}x{w}")
        assert np.abs(moved.reshape(still.shape) - still).max() > 1e-2  # the draw moved the tokens


def test_rotary_augment_draws_dinov3s_distribution_once_a_forward(tmp_path):
    """`RotaryAugment` in training: shifts in [-s, s] and jitters in [1/J, J], each axis its own; one rescale in
    [1/R, R] for both axes; a new draw each call, the same for a seed; the identity in evaluation and for what is
    None. A DINOv3 model with it trains (its rotary blocks read the layer's draw), differs between two training
    calls and not between two evaluations, and reloads from `.keras` in safe mode with it."""
    from keras_vit.layers import RotaryAugment

    layer = RotaryAugment(**AUGMENT, seed=3)
    x = np.zeros((1, 4), "float32")
    draws = np.stack([_np(layer(x, training=True)) for _ in range(100)])
    shift, jitter, rescale = draws[:, 0], np.log(draws[:, 1]), np.log(draws[:, 2])
    assert np.abs(shift).max() <= AUGMENT["shift"] and np.abs(shift).max() > 0.9 * AUGMENT["shift"]
    assert np.abs(jitter).max() <= np.log(AUGMENT["jitter"]) + 1e-6
    assert np.abs(rescale).max() <= np.log(AUGMENT["rescale"]) + 1e-6 and np.abs(rescale).max() > 0.6
    assert np.all(rescale[:, 0] == rescale[:, 1]) and np.all(shift[:, 0] != shift[:, 1])
    assert np.all(jitter[:, 0] != jitter[:, 1]) and len(np.unique(draws[:, 2, 0])) == len(draws)
    again = RotaryAugment(**AUGMENT, seed=3)
    np.testing.assert_array_equal(_np(again(x, training=True)), draws[0])
    identity = np.array([[0, 0], [1, 1], [1, 1]], "float32")
    np.testing.assert_array_equal(_np(layer(x, training=False)), identity)
    only = _np(RotaryAugment(rescale=2.0)(x, training=True))
    assert np.all(only[:2] == identity[:2]) and only[2, 0] == only[2, 1] != 1.0
    model = _rotary_vit(include_top=False, rope={"kind": "dinov3", "rescale": 2.0})
    x = _images(32, 32)
    assert np.array_equal(_np(model(x)), _np(model(x)))
    assert not np.allclose(_np(model(x, training=True)), _np(model(x, training=True)))
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    model.fit(x, np.ones((2, 32), "float32"), epochs=1, verbose=0)
    model.save(tmp_path / "m.keras")
    again = keras.saving.load_model(tmp_path / "m.keras", safe_mode=True)
    assert again.get_layer("rope_augment").get_config()["rescale"] == 2.0
    np.testing.assert_allclose(_np(again(x)), _np(model(x)), atol=1e-6)


@pytest.mark.backend_independent
def test_what_the_coordinate_augmentation_refuses_and_what_it_leaves(tmp_path):
    """A rescale or jitter below 1, a negative shift, a string: one line each naming the range. The augmentation
    is training's alone: a file of transformers' DINOv3 (rescale 2, its config's default) loads into a model
    without the augmentation or with another, the weights the same; another temperature is still refused."""
    for key, value, least in (("rescale", 0.5, "1"), ("jitter", 0.9, "1"), ("shift", -0.1, "0"), ("rescale", "2", "1")):
        with pytest.raises(ValueError, match=rf"rope: {key} must be None or a finite number >= {least}, "
                                             rf"got {value!r}"):
            _rotary_vit(rope={"kind": "dinov3", key: value})
    from transformers import DINOv3ViTConfig, DINOv3ViTModel

    config = DINOv3ViTConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=96,
                             image_size=SIZES[0][0], num_register_tokens=4, layerscale_value=0.5)
    DINOv3ViTModel(config).save_pretrained(tmp_path / "hf")
    hf_model = keras_vit.from_huggingface(tmp_path / "hf")
    assert hf_model.get_layer("encoderblock_0").rope_options["rescale"] == 2.0  # transformers' default
    shape = dict(image_size=SIZES[0], patch_size=16, hidden_size=64, mlp_dim=96, num_heads=4, num_register_tokens=4,
                 include_top=False, approximate_gelu=False, layer_norm_epsilon=1e-5)
    plain = _rotary_vit(**shape)
    assert "rope_augment" not in [layer.name for layer in plain.layers]
    keras_vit.load_weights(plain, tmp_path / "hf")
    assert len(plain.get_weights()) == len(hf_model.get_weights())
    for a, b in zip(plain.get_weights(), hf_model.get_weights()):
        np.testing.assert_array_equal(a, b)
    keras_vit.load_weights(_rotary_vit(**shape, rope={"kind": "dinov3", "shift": 0.1}), tmp_path / "hf")
    with pytest.raises(ValueError, match=r"rope=\{'kind': 'dinov3', 'temperature': 100.0, 'shift': None, 'jitter': "
                                         r"None, 'rescale': 2.0\} in the file, .*'temperature': 10.0.* in the model"):
        keras_vit.load_weights(_rotary_vit(**shape, rope={"kind": "dinov3", "temperature": 10.0}), tmp_path / "hf")
