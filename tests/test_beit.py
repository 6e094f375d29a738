"""BEiT and BEiT v2 (a 2-D relative position bias in every block, layer scale, q/v biases, a class token beside the
patch average): timm's `beit*` files read by `from_timm`, equal to timm's own random-weight models at two sizes (each
file at its own, and at another grid: the tables resized as timm does), reloaded in safe mode; the table of what their names tell
checked against timm's definitions; and what is refused, in one line."""

import os
import sys

import keras
import numpy as np
import pytest

import keras_vit
from keras_vit.inspection import attention_maps
from keras_vit.naflex import naflex

torch = pytest.importorskip("torch")
pytest.importorskip("safetensors.torch")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
from timm_files import close, images, nchw, redraw, timm_file, to_numpy  # noqa: E402
from timm_peer import import_timm  # noqa: E402

timm = import_timm()
ARCH = "beitv2_base_patch16_224"


def _timm(size, seed=0):
    return redraw(timm.create_model(ARCH, pretrained=False, depth=2, img_size=size, num_classes=5), seed)


@pytest.mark.parametrize("size", [(64, 64), (48, 80)])
def test_timm_beit_files_equal_timm(size, tmp_path):
    """The logits of a file made at `size` (square, and not: the bias index's rows and columns), built at it; the
    square file built at another grid (96 x 80 px), its relative tables resized as timm's loader resizes them
    (`checkpoint_filter_fn`: BEiT's geometric rule), equal to timm's model of that size loading the file."""
    from timm.models.beit import checkpoint_filter_fn

    ref = _timm(size)
    path = timm_file(ref, tmp_path, ARCH)
    for built in (size, (96, 80)) if size == (64, 64) else (size,):
        other = timm.create_model(ARCH, pretrained=False, depth=2, img_size=built, num_classes=5).eval()
        other.load_state_dict(checkpoint_filter_fn(ref.state_dict(), other))
        x = images(*built)
        with torch.no_grad():
            expected = other(nchw(x)).numpy()
        model = keras_vit.from_timm(path, image_size=built, classifier_activation=None)
        close(to_numpy(model(x)), expected, f"a file of {size} at {built}")


@pytest.mark.backend_independent
def test_a_beit_model_reloads_and_what_it_refuses(tmp_path):
    """A BEiT model, and its `any_size` copy, reload from `.keras` in safe mode with the same outputs (the copy's
    attention maps at the model's own grid its own); a file of a
    non-square grid that its name does not give (timm's rule needs the file's grid) built at another, or a model
    made to take a NaFlex batch (a table for one grid a call), is refused in one line naming the grids."""
    ref = _timm((48, 80))
    path = timm_file(ref, tmp_path, ARCH)
    model = keras_vit.from_timm(path, image_size=(48, 80), classifier_activation=None)
    x = images(48, 80)
    model.save(tmp_path / "m.keras")
    close(to_numpy(keras.saving.load_model(tmp_path / "m.keras", safe_mode=True)(x)), to_numpy(model(x)), "reloaded")
    with pytest.raises(ValueError, match=r"relative position tables \(BEiT's\) hold 48 offsets, of no square grid "
                                         r"nor of the grid its config names; model 'vit' has a 4x4 grid. Build at "
                                         r"the file's image size"):
        keras_vit.from_timm(path, image_size=(64, 64))
    copy = keras_vit.any_size(model)
    copy.save(tmp_path / "any.keras")
    x = images(32, 48)
    close(to_numpy(keras.saving.load_model(tmp_path / "any.keras", safe_mode=True)(x)), to_numpy(copy(x)), "any size")
    maps = attention_maps(copy, x)  # at another grid (2 x 3): rows of probabilities; at its own, the table itself
    np.testing.assert_allclose(attention_maps(copy, images(48, 80))[0], attention_maps(model, images(48, 80))[0],
                               atol=1e-6, rtol=0, err_msg="attention maps at the model's own grid")
    assert maps[0].shape == (2, 12, 7, 7) and np.allclose(maps[-1].sum(-1), 1.0, atol=1e-5)
    with pytest.raises(ValueError, match="BEiT's relative position bias, a table made for one grid a call"):
        naflex(model)
    with pytest.raises(ValueError, match="relative_position_bias=True is BEiT's: laid out for a class token"):
        keras_vit.VisionTransformer(image_size=32, patch_size=8, hidden_size=32, mlp_dim=64, num_heads=2, num_layers=1,
                                    classifier="gap", relative_position_bias=True)


@pytest.mark.backend_independent
def test_relative_tables_resize_as_timm_and_transformers_resize_them():
    """`resize_relative_position_bias` against timm's `resize_rel_pos_bias_table` (geometric) from square grids to
    larger, smaller and non-square ones (BEiT's 14 x 14 to 24 x 24 among them), and against transformers' bilinear
    resize of the table (its `BeitRelativePositionBias` at another window); a table of another grid and an unknown
    rule are refused in one line."""
    import transformers
    from timm.layers.pos_embed_rel import resize_rel_pos_bias_table

    from keras_vit.layers import resize_relative_position_bias

    rng = np.random.default_rng(0)
    for old, new in (((4, 4), (6, 6)), ((7, 7), (4, 4)), ((5, 5), (2, 9)), ((14, 14), (24, 24))):
        table = rng.normal(size=((2 * old[0] - 1) * (2 * old[1] - 1) + 3, 3)).astype("float32")
        rows = (2 * new[0] - 1) * (2 * new[1] - 1) + 3
        expected = resize_rel_pos_bias_table(torch.from_numpy(table), new, (rows, 3)).numpy()
        close(resize_relative_position_bias(table, old, new), expected, f"geometric {old} to {new}")
    config = transformers.BeitConfig(hidden_size=32, num_attention_heads=2, image_size=32, patch_size=8)
    bias = transformers.models.beit.modeling_beit.BeitRelativePositionBias(config)
    with torch.no_grad():
        bias.relative_position_bias_table.normal_()
        table = bias.relative_position_bias_table.numpy()
        for new in ((6, 6), (3, 5)):
            expected = bias(new)[0].numpy()  # (heads, T, T): its table resized to the window, read through its index
            resized = resize_relative_position_bias(table, (4, 4), new, "bilinear")
            index = keras_vit.layers.relative_position_index(*new)
            close(np.transpose(resized[index], (2, 0, 1)), expected, f"bilinear to {new}")
    with pytest.raises(ValueError, match=r"a relative position table of a 4x4 grid has 52 rows .* got shape \(48, 3\)"):
        resize_relative_position_bias(np.zeros((48, 3)), (4, 4), (5, 5))
    with pytest.raises(ValueError, match=r"method must be one of \('geometric', 'bilinear'\), got 'bicubic'"):
        resize_relative_position_bias(table, (4, 4), (5, 5), "bicubic")


@pytest.mark.backend_independent
def test_every_timm_beit_architecture_is_read_as_timm_defines_it():
    """For every architecture of timm's beit.py, made at depth 1 on the meta device and read with its name: the head
    count, the relative position bias, layer scale, the average beside the class token and the pretrained size."""
    from keras_vit.weights import timm as timm_keys

    archs = timm.list_models(module="beit")
    assert {a for a in archs} == {a for a in timm_keys.TIMM_EVA_LAYOUT if a.startswith("beit")}
    for arch in archs:
        with torch.device("meta"):
            ref = timm.create_model(arch, pretrained=False, depth=1)
        tensors = {k: np.broadcast_to(np.float32(0), tuple(v.shape)) for k, v in ref.state_dict().items()}
        read = timm_keys.architecture(timm_keys.readable(tensors, arch), arch)
        assert (read["timm_heads"], read["relative_position_bias"], read["layer_scale"] is not None) == (
            ref.blocks[0].attn.num_heads, True, True), arch
        assert (read["pooling"], read["fc_norm"], read["position_embedding"]) == ("avg", True, "none"), arch
        assert read["image_size"] == tuple(timm.models.get_pretrained_cfg(arch).input_size[1:]), arch


# transformers' BEiT and data2vec models: (class, config options); BEiT in transformers 5's names, data2vec in 4's
HF_CASES = {
    "beit_relative_mean": ("BeitModel", dict(use_relative_position_bias=True)),
    "beit_shared_class_token": ("BeitModel", dict(use_shared_relative_position_bias=True, use_mean_pooling=False)),
    "beit_classifier_absolute": ("BeitForImageClassification",
                                 dict(use_absolute_position_embeddings=True, use_mean_pooling=False, num_labels=3)),
    "data2vec_classifier": ("Data2VecVisionForImageClassification", dict(use_relative_position_bias=True, num_labels=3)),
}


@pytest.mark.parametrize("case", [c if c == "beit_relative_mean" else pytest.param(c, marks=pytest.mark.backend_independent)
                                  for c in HF_CASES])  # the others' key layouts and pooling: torch's lane
def test_transformers_beit_and_data2vec_folders_equal_transformers(case, tmp_path):
    """A folder saved by transformers' `save_pretrained`, read by `from_huggingface` with no argument: the classifier's
    logits, else the model's pooler output (the patch tokens' mean through the pooler's layernorm, or the class token
    after the final norm); each block's own relative position bias, one shared by the blocks (copied into each),
    an absolute table. Built at another size (48 x 64 px), and the `any_size` copy of the model called at it (its
    tables resized in the call), equal to transformers' model of the folder at that size with
    `interpolate_pos_encoding=True` (the relative tables resized bilinearly, as it does)."""
    import transformers

    name, options = HF_CASES[case]
    config = getattr(transformers, "Data2VecVisionConfig" if name.startswith("Data2Vec") else "BeitConfig")(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, image_size=32, patch_size=8,
        **options)
    torch.manual_seed(0)
    ref = redraw(getattr(transformers, name)(config))
    ref.save_pretrained(tmp_path / "hf")
    x = images(32, 32)
    with torch.no_grad():
        out = ref(pixel_values=nchw(x))
    expected = out.logits if name.endswith("Classification") else out.pooler_output
    model = keras_vit.from_huggingface(tmp_path / "hf", classifier_activation=None)
    close(to_numpy(model(x)), expected.numpy(), case)
    if case in ("beit_relative_mean", "beit_classifier_absolute"):
        x = images(48, 64)
        with torch.no_grad():
            out = ref(pixel_values=nchw(x), interpolate_pos_encoding=True)
        expected = out.logits if name.endswith("Classification") else out.pooler_output
        copy = keras_vit.any_size(model)
        model = keras_vit.from_huggingface(tmp_path / "hf", image_size=(48, 64), classifier_activation=None)
        close(to_numpy(model(x)), expected.numpy(), f"{case} at 48x64")
        close(to_numpy(copy(x)), expected.numpy(), f"{case}, any size, at 48x64")
