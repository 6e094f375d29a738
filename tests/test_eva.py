"""EVA-01, EVA-02, Perception Encoder and timm's own rotary ViTs (timm's eva.py: q/v biases apart, SwiGLU with a norm inside, a norm
inside the attention, EVA-02's rotary embedding on a rescaled grid index, a class token beside an average of the
patch tokens): timm files read by `from_timm`, equal to timm's own random-weight models at two image sizes, at any
size, reloaded in safe mode; the table of what their names tell, checked against timm's definitions; and what is
refused, in one line."""

import os
import sys

import keras
import numpy as np
import pytest

import keras_vit

torch = pytest.importorskip("torch")
pytest.importorskip("safetensors.torch")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
from timm_files import close, equal_to_timm_at, images, redraw, timm_file, to_numpy  # noqa: E402
from timm_peer import import_timm  # noqa: E402

timm = import_timm()
# the size timm's model is made at, and another (not square), by patch size
SIZES = {14: ((56, 56), (42, 70)), 16: ((64, 64), (48, 80))}
ONCE = pytest.mark.backend_independent  # the key maps of the other layouts: torch's lane


def _timm(arch, size, seed=0):
    """timm's `arch` at depth 2 made at `size`, 5 classes, its weights all drawn anew."""
    return redraw(timm.create_model(arch, pretrained=False, depth=2, img_size=size, num_classes=5), seed)


@pytest.mark.parametrize("arch", [
    "eva02_tiny_patch14_224",  # q/v biases, packed SwiGLU, EVA-02's rotary grid, class token + average + fc_norm
    pytest.param("eva02_base_patch16_clip_224", marks=ONCE),  # q, k, v apart, norms in the MLP and the attention
    pytest.param("vit_base_patch16_rope_ape_224", marks=ONCE),  # columns first, temperature 100, a key bias
    pytest.param("vit_medium_patch16_rope_reg1_gap_256", marks=ONCE),  # a register and no class token, rotary only
    # Perception Encoder: a class token beside an 8-head attention pool over every token, norm before the blocks,
    # rotary from index 1; its spatial tower without a final norm, the patch tokens averaged beside the class token
    pytest.param("vit_pe_core_tiny_patch16_384", marks=ONCE),
    pytest.param("vit_pe_spatial_tiny_patch16_512", marks=ONCE),
    "vit_small_patch16_rope_mixed_224",  # RoPE-Mixed: each block's learned frequencies, a table a head
])
def test_timm_eva_files_equal_timm_at_two_sizes(arch, tmp_path):
    """The logits at the size timm's model is made at and another, its position embeddings resized by timm's own
    rule and its rotary grid rescaled (`set_input_size`), the head count and the rotary embedding read off the
    name."""
    patch = int(arch.split("patch")[1].split("_")[0])
    ref = _timm(arch, SIZES[patch][0])
    equal_to_timm_at(ref, SIZES[patch], arch, path=timm_file(ref, tmp_path, arch))


def test_an_eva02_model_of_any_size_reloads(tmp_path):
    """`any_size` of an EVA-02 model resizes its position embeddings and rescales its rotary grid at each call
    (timm's model at two sizes), and reloads from `.keras` in safe mode with the same outputs."""
    arch = "eva02_tiny_patch14_224"
    ref = _timm(arch, SIZES[14][0])
    model = keras_vit.any_size(keras_vit.from_timm(timm_file(ref, tmp_path, arch), image_size=SIZES[14][0],
                                                   classifier_activation=None))
    x, expected = equal_to_timm_at(ref, SIZES[14], "any size", model=model)
    model.save(tmp_path / "m.keras")
    again = keras.saving.load_model(tmp_path / "m.keras", safe_mode=True)
    close(to_numpy(again(x)), expected, "reloaded")


def _readable(ref):
    """Whether timm's Eva model `ref` is of what keras-vit builds: pre-norm or post-norm blocks, EVA-02's rotary
    embedding or none."""
    from timm.models.eva import EvaBlock, EvaBlockPostNorm

    rope = getattr(ref, "rope", None)
    return isinstance(ref.blocks[0], (EvaBlock, EvaBlockPostNorm)) and (
        rope is None or type(rope).__name__ in ("RotaryEmbeddingCat", "RotaryEmbeddingMixed"))


@pytest.mark.backend_independent
def test_every_timm_eva_architecture_keras_vit_builds_is_read_as_timm_defines_it():
    """For every architecture of timm's eva.py of what keras-vit builds (`_readable`; DINOv3's have their own test),
    made at depth 1 on the meta device: the state dict read with the architecture's name gives timm's head count,
    rotary embedding, LayerNorm epsilon, norms, pooling and pretrained size; and each is in the table."""
    from keras_vit.weights import timm as timm_keys

    found = set()
    for arch in timm.list_models(module="eva"):
        if arch in timm_keys.TIMM_DINOV3_LAYOUT:
            continue
        try:
            with torch.device("meta"):
                ref = timm.create_model(arch, pretrained=False, depth=1)
        except AssertionError:  # timm's own: its per-block tables need the full depth (sapiens2)
            continue
        if not _readable(ref):
            continue
        found.add(arch)
        tensors = {k: np.broadcast_to(np.float32(0), tuple(v.shape)) for k, v in ref.state_dict().items()}
        read = timm_keys.architecture(timm_keys.readable(tensors, arch), arch)
        attn, rope = ref.blocks[0].attn, ref.rope
        mixed = type(rope).__name__ == "RotaryEmbeddingMixed"
        expected_rope = None if rope is None else {
            "kind": "mixed", "temperature": float(rope.temperature), "axes": rope.grid_indexing} if mixed else {
            "kind": "eva", "temperature": float(rope.temperature), "offset": float(rope.grid_offset),
            "axes": rope.grid_indexing, "reference_grid": rope.ref_feat_shape and tuple(rope.ref_feat_shape)}
        assert rope is None or mixed or (rope.in_pixels, rope.rotate_half, rope.grid_type) == (False, False, "index")
        assert (read["timm_heads"], read["rope"], read["layer_norm_epsilon"]) == (
            attn.num_heads, expected_rope, ref.blocks[0].norm1.eps), arch
        assert (read["mlp_norm"], read["attention_norm"]) == (
            not isinstance(ref.blocks[0].mlp.norm, torch.nn.Identity), not isinstance(attn.norm, torch.nn.Identity))
        assert read["pooling"] == ("avg" if ref.global_pool == "avg" and ref.cls_token is not None else None) or (
            read["pooling"] == "avg" and ref.global_pool == "avg"), arch
        pool = ref.attn_pool
        assert (read.get("map_num_heads"), bool(read.get("map_include_prefix"))) == (
            (pool.num_heads, True) if pool is not None else (None, False)), arch  # timm's Eva pools every token
        assert (read.get("encoder_norm") is not False) == (not isinstance(ref.norm, torch.nn.Identity)  # None: as
                                                           or not isinstance(ref.fc_norm, torch.nn.Identity)), arch  # is
        assert read["pre_norm"] == (not isinstance(ref.norm_pre, torch.nn.Identity)), arch
        assert read["post_norm"] == (type(ref.blocks[0]).__name__ == "EvaBlockPostNorm"), arch
        assert read["image_size"] == tuple(timm.models.get_pretrained_cfg(arch).input_size[1:]), arch
    others = set(timm_keys.TIMM_DINOV3_LAYOUT) | set(timm.list_models(module="beit"))  # tested on their own
    assert found == set(timm_keys.TIMM_EVA_LAYOUT) - others


@pytest.mark.backend_independent
def test_what_eva_files_and_options_refuse(tmp_path):
    """An EVA-02 file whose name does not say its architecture, one into a model without its rotary embedding
    (its weights kept), and an "eva" rope with keys it does not take: each one line naming what was expected."""
    arch = "eva02_tiny_patch14_224"
    ref = _timm(arch, SIZES[14][0])
    unnamed = timm_file(ref, tmp_path, "model")
    with pytest.raises(ValueError, match=r"timm's Eva layout .* name the file after its timm architecture"):
        keras_vit.from_timm(unnamed)
    plain = keras_vit.VisionTransformer(image_size=56, patch_size=14, hidden_size=192, mlp_dim=512, num_heads=3,
                                        num_layers=2, classes=5, mlp_activation="swiglu", approximate_gelu=False,
                                        classifier_activation=None, pooling="avg", fc_norm=True)
    before = [w.copy() for w in plain.get_weights()]
    with pytest.raises(ValueError, match=r"rope=\{'kind': 'eva', 'temperature': 10000.0, 'reference_grid': \(16, "
                                         r"16\).* in the file, None in the model"):
        keras_vit.load_weights(plain, timm_file(ref, tmp_path, arch))
    assert all(np.array_equal(a, b) for a, b in zip(before, plain.get_weights()))
    for rope, message in (({"kind": "eva", "period": 3}, r"the 'eva' rotary embedding takes the keys \('kind', "
                                                         r"'temperature', 'reference_grid', 'offset', 'axes'\)"),
                          ({"kind": "eva", "axes": "yx"}, "axes must be 'ij' .* or 'xy'"),
                          ({"kind": "eva", "reference_grid": 16}, r"reference_grid must be None or an \(h, w\) pair"),
                          ({"kind": "dinov3", "reference_grid": (4, 4)}, "the 'dinov3' rotary embedding takes")):
        with pytest.raises(ValueError, match=message):
            keras_vit.VisionTransformer(image_size=32, patch_size=8, hidden_size=32, mlp_dim=64, num_heads=2,
                                        num_layers=1, rope=rope)


def test_rope_mixed_frequencies_train_the_same_with_remat():
    """RoPE-Mixed's frequencies are weights: two SGD steps move them, and with remat (the recomputed blocks take
    the tables made from them) to the same values."""
    x, y = images(32, 32), np.array([0, 2])
    after = []
    for remat in (False, True):
        keras.utils.set_random_seed(1)
        model = keras_vit.VisionTransformer(image_size=32, patch_size=8, hidden_size=32, mlp_dim=64, num_heads=2,
                                            num_layers=2, classes=3, position_embedding="none", remat=remat,
                                            rope={"kind": "mixed"}, classifier_activation=None)
        freqs = model.get_layer("encoderblock_1").rope_freqs
        before = keras.ops.convert_to_numpy(freqs).copy()
        model.compile(optimizer=keras.optimizers.SGD(0.5),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        model.fit(x, y, batch_size=1, epochs=1, shuffle=False, verbose=0)
        moved = keras.ops.convert_to_numpy(freqs)
        assert np.abs(moved - before).max() > 1e-6, f"remat={remat}: the frequencies should train"
        after.append(moved)
    np.testing.assert_allclose(after[0], after[1], atol=1e-6, rtol=1e-5)
