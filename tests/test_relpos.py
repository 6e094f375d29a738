"""timm's relative-position-MLP ViTs (`vit_relpos_*`, `vit_srelpos_*`: a two-layer MLP gives each block's attention a
bias per head from each patch offset, log-spaced; no position embeddings): their files read by `from_timm`, equal to
timm's own random-weight models at two grids (the MLP's weights fit any grid: the model is built at the size asked),
one MLP shared by the blocks read as each block's; reloaded in safe mode; what is refused, in one line."""

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
from timm_files import close, equal_to_timm_at, images, redraw, timm_file, to_numpy  # noqa: E402
from timm_peer import import_timm  # noqa: E402

timm = import_timm()
SIZES = ((48, 48), (64, 80))  # the size timm's model is made at, and another grid (not square)


def _timm(arch, seed=0):
    """timm's `arch` at depth 2 made at 48 px, 5 classes, every parameter drawn anew (`redraw`)."""
    return redraw(timm.create_model(arch, pretrained=False, depth=2, img_size=SIZES[0], num_classes=5), seed)


@pytest.mark.parametrize("arch", ["vit_relpos_medium_patch16_cls_224",
                                  pytest.param("vit_srelpos_small_patch16_224", marks=pytest.mark.backend_independent)])
def test_timm_relpos_files_equal_timm_at_two_grids(arch, tmp_path):
    """The logits at the grid timm's model is made at and another (timm's set_input_size recomputes the offsets, as
    the model built at that size does), and those of the `any_size` copy of the model built at the first, at both
    (its bias computed for each call's grid): a class token, which gets no bias, on every backend; the MLP shared
    by the blocks (srelpos), without a class token, on torch's lane. The MLP's width and the head count come from
    the file and the name."""
    ref = _timm(arch)
    path = timm_file(ref, tmp_path, arch)
    equal_to_timm_at(ref, SIZES, arch, path=path)
    model = keras_vit.from_timm(path, image_size=SIZES[0], classifier_activation=None)
    equal_to_timm_at(ref, SIZES[::-1], f"{arch}, any size", model=keras_vit.any_size(model))
    mlp = (ref.shared_rel_pos or ref.blocks[0].attn.rel_pos).mlp.fc1
    assert keras_vit.structure.find_vit(model).family()["relative_position_mlp"] == mlp.out_features


@pytest.mark.backend_independent
def test_a_relpos_model_reloads_and_what_it_refuses(tmp_path):
    """A relative-position-MLP model, and its `any_size` copy, reload from `.keras` in safe mode with the same
    outputs; the copy's attention maps at another size are those of the model built there; `naflex` is refused (its bias is for one grid a call, a NaFlex batch holds several), and so is a
    width that is no positive int. A post-norm model
    (`*_rpn_*`, which stores the keys of a pre-norm one) is read as one by its name and equals timm's."""
    arch = "vit_relpos_medium_patch16_cls_224"
    ref = _timm(arch)
    path = timm_file(ref, tmp_path, arch)
    model = keras_vit.from_timm(path, image_size=SIZES[1], classifier_activation=None)
    x = images(*SIZES[1])
    model.save(tmp_path / "m.keras")
    close(to_numpy(keras.saving.load_model(tmp_path / "m.keras", safe_mode=True)(x)), to_numpy(model(x)), "reloaded")
    assert model.get_layer("encoderblock_0").relative_mlp["grid_size"] == (4, 5)
    copy = keras_vit.any_size(model)
    copy.save(tmp_path / "any.keras")
    x = images(*SIZES[0])
    close(to_numpy(keras.saving.load_model(tmp_path / "any.keras", safe_mode=True)(x)), to_numpy(copy(x)), "any size")
    built = keras_vit.from_timm(path, image_size=SIZES[0], classifier_activation=None)  # the attention there
    for ours, theirs in zip(attention_maps(copy, x), attention_maps(built, x)):
        np.testing.assert_allclose(ours, theirs, atol=1e-6, rtol=0, err_msg="attention maps at another size")
    with pytest.raises(ValueError, match="relative position MLP gives its bias for one grid a call"):
        naflex(model)
    block = keras_vit.layers.TransformerBlock
    with pytest.raises(ValueError, match="relative_stride reads the grid of a relative position bias off the images; "
                                         "the block has none"):
        block(2, 64, relative_stride=8)
    with pytest.raises(ValueError, match="relative_stride must be None or the pixels per token .* got 0"):
        block(2, 64, relative_bias_grid=(4, 4), relative_stride=0)
    with pytest.raises(ValueError, match=r"relative_stride 16\) needs them: call it with images="):
        copy.get_layer("encoderblock_0")(np.zeros((1, 21, 512), "float32"))
    with pytest.raises(ValueError, match=r"relative_position_mlp must be None or the MLP's hidden width .* got 0"):
        keras_vit.VisionTransformer(image_size=32, patch_size=8, hidden_size=32, mlp_dim=64, num_heads=2, num_layers=1,
                                    relative_position_mlp=0)
    post = _timm("vit_relpos_small_patch16_rpn_224")  # post-norm blocks: read by the name
    x = images(*SIZES[0])
    with torch.no_grad():
        expected = post(torch.from_numpy(x).permute(0, 3, 1, 2)).numpy()
    model = keras_vit.from_timm(timm_file(post, tmp_path, "vit_relpos_small_patch16_rpn_224"), image_size=SIZES[0],
                                classifier_activation=None)
    close(to_numpy(model(x)), expected, "post-norm")
