"""AIMv2 (RMSNorm for every norm, one on the patch embeddings, SwiGLU, no biases): timm's `aimv2_*` files read by
`from_timm`, equal to timm's own random-weight models at two image sizes and at any size, reloaded in safe mode; the
head counts their names tell, checked against timm's definitions; an unnamed file refused in one line."""

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
from timm_files import close, equal_to_timm_at, redraw, timm_file, to_numpy  # noqa: E402
from timm_peer import import_timm  # noqa: E402

timm = import_timm()
ARCH = "aimv2_large_patch14_224"
SIZES = ((56, 56), (42, 70))  # the size timm's model is made at, and another (not square)


def _timm(seed=0):
    """timm's AIMv2-L/14 at depth 2 made at 56 px, 5 classes, its weights all drawn anew."""
    return redraw(timm.create_model(ARCH, pretrained=False, depth=2, img_size=SIZES[0], num_classes=5), seed)


def test_timm_aimv2_files_equal_timm_at_two_sizes(tmp_path):
    """The logits at the size timm's model is made at and another (position embeddings resized by timm's rule),
    the head count (8 at width 1024), RMSNorm and its epsilon read off the name."""
    ref = _timm()
    equal_to_timm_at(ref, SIZES, ARCH, path=timm_file(ref, tmp_path, ARCH))


@pytest.mark.backend_independent
def test_an_aimv2_model_of_any_size_reloads_and_an_unnamed_file_is_refused(tmp_path):
    """`any_size` of an AIMv2 model gives timm's outputs at two sizes and reloads from `.keras` in safe mode; a file
    whose name does not say its architecture is refused in one line asking for it."""
    ref = _timm()
    model = keras_vit.any_size(keras_vit.from_timm(timm_file(ref, tmp_path, ARCH), image_size=SIZES[0],
                                                   classifier_activation=None))
    assert model.get_layer("embed_norm").__class__ is keras.layers.RMSNormalization
    x, expected = equal_to_timm_at(ref, SIZES, "any size", model=model)
    model.save(tmp_path / "m.keras")
    close(to_numpy(keras.saving.load_model(tmp_path / "m.keras", safe_mode=True)(x)), expected, "reloaded")
    with pytest.raises(ValueError, match=r"projections without bias whose name names no timm architecture.* name the "
                                         r"file after its timm architecture"):
        keras_vit.from_timm(timm_file(ref, tmp_path, "model"))


@pytest.mark.backend_independent
def test_every_timm_aimv2_architecture_is_read_as_timm_defines_it():
    """For every AIMv2 architecture timm has, made at depth 1 on the meta device: the state dict read with its name
    gives timm's head count, RMSNorm and its epsilon, the norm on the patch embeddings, SwiGLU, CLIP's input
    statistics and the pretrained size; and each is in the table."""
    from keras_vit.preprocessing import NORMALIZATIONS
    from keras_vit.weights import timm as timm_keys

    archs = timm.list_models("aimv2_*")
    assert set(archs) == set(timm_keys.TIMM_AIMV2_HEADS)
    for arch in archs:
        with torch.device("meta"):
            ref = timm.create_model(arch, pretrained=False, depth=1)
        tensors = {k: np.broadcast_to(np.float32(0), tuple(v.shape)) for k, v in ref.state_dict().items()}
        read = timm_keys.architecture(timm_keys.readable(tensors, arch), arch)
        norm, cfg = ref.blocks[0].norm1, timm.models.get_pretrained_cfg(arch)
        assert type(norm).__name__ == "RmsNorm" and type(ref.patch_embed.norm).__name__ == "RmsNorm", arch
        assert (read["timm_heads"], read["normalization"], read["layer_norm_epsilon"], read["embed_norm"]) == (
            ref.blocks[0].attn.num_heads, "rms_norm", norm.eps, True), arch
        assert read["mlp_activation"] == "swiglu" and read["mlp_dim"] == ref.blocks[0].mlp.fc2.in_features, arch
        assert tuple(NORMALIZATIONS[read["input_mode"]][0]) == pytest.approx(cfg.mean), arch
        assert read["classifier"] == "gap" and not read["fc_norm"], arch
