"""q/k norms and parallel blocks (ViT-22B's: the attention and the MLP side by side on one norm), as timm builds them:
its `*_xp_*` ViTs (RMSNorm, q/k norms, parallel blocks, a norm before the blocks) and `vit_pwee_*` (parallel blocks of
LayerNorm with layer scale, a register, the tokens averaged), and a ViT of its classic blocks with q/k norms. Their
files read by `from_timm`, equal to timm's own random-weight models; reloaded in safe mode, trained, refused where
the options do not combine."""

import keras
import numpy as np
import pytest

import keras_vit

torch = pytest.importorskip("torch")
pytest.importorskip("safetensors.torch")
from timm_files import close, equal_to_timm_at, images, nchw, redraw, timm_file, timm_module, to_numpy  # noqa: E402

timm = timm_module()
SIZES = ((48, 48), (64, 80))  # the size timm's model is made at, and another grid (not square)


def _timm(arch, seed=0, **kw):
    """timm's `arch` at depth 2 made at 48 px, 5 classes, every parameter drawn anew (`redraw`)."""
    return redraw(timm.create_model(arch, pretrained=False, depth=2, img_size=SIZES[0], num_classes=5, **kw), seed)


def _reloaded_model(tmp_path, **options):
    """(model, images, its small-config arguments): a 2-block ViT of `options` with dropout and stochastic depth, its
    head drawn (the paper's zero head gives every output the same), checked to reload from `.keras` in safe mode with
    the same outputs."""
    args = dict(image_size=32, patch_size=8, hidden_size=32, mlp_dim=64, num_heads=2, num_layers=2, classes=3,
                layer_scale=0.5, **options)
    model = keras_vit.VisionTransformer(**args, dropout_rate=0.1, drop_path_rate=0.1)
    head = model.get_layer("head")
    head.kernel.assign(np.random.default_rng(0).normal(size=head.kernel.shape).astype("float32"))
    x = images(32, 32)
    model.save(tmp_path / "m.keras")
    reloaded = keras.saving.load_model(tmp_path / "m.keras", safe_mode=True)
    np.testing.assert_array_equal(to_numpy(reloaded(x)), to_numpy(model(x)))
    return model, x, args


def _trains(model):
    """One training step on 8 images moves every trainable weight (a branch that stochastic depth drops for every
    image of the batch gets no gradient: with 8, about once in 1e8 steps)."""
    before = [to_numpy(w).copy() for w in model.trainable_weights]
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="sparse_categorical_crossentropy")
    model.fit(np.concatenate([images(32, 32, seed) for seed in range(4)]), np.arange(8) % 3, batch_size=8, epochs=1,
              verbose=0)
    assert all(not np.array_equal(b, to_numpy(w)) for b, w in zip(before, model.trainable_weights))


@pytest.mark.parametrize("arch", ["vit_base_patch16_xp_224", "vit_small_patch16_18x2_224",
                                  pytest.param("vit_pwee_patch16_reg1_gap_256", marks=pytest.mark.backend_independent)])
def test_timm_parallel_block_files_equal_timm_at_two_sizes(arch, tmp_path):
    """The logits at the size timm's model is made at and at another (its position embeddings resized by timm's
    rule). ParallelScalingBlock (`*_xp_*`, `vit_pwee_*`): its fused projection read as the MLP's first layer and q,
    k, v; RMSNorm's epsilon, the q/k norms and the parallel blocks read off the file and its name. ParallelThingsBlock
    (`*_18x2_*`): two attentions then two MLPs a block, each with its norm and layer scale. `*_xp_*` and `*_18x2_*`
    on every backend; `vit_pwee_*` (the same block of LayerNorm, layer scale, biases in the fused projection) on
    torch's lane."""
    ref = _timm(arch)
    path = timm_file(ref, tmp_path, arch)
    equal_to_timm_at(ref, SIZES, arch, path=path)
    family = keras_vit.structure.find_vit(keras_vit.from_timm(path, image_size=SIZES[0])).family()
    xp, branches = arch.endswith("_xp_224"), "18x2" in arch
    assert (family["parallel_blocks"], family["qk_norm"], family["normalization"], family["parallel_branches"]) == (
        not branches, xp, "rms_norm" if xp else "layer_norm", 2 if branches else 1)


def test_qk_norms_in_classic_blocks_equal_timm(tmp_path):
    """timm's classic blocks with q/k norms (LayerNorm over each head's queries and keys, shared by the heads),
    written unnamed: the norms are read off the file's keys, the head count passed as a user passes it."""
    from timm.models.vision_transformer import VisionTransformer

    ref = redraw(VisionTransformer(img_size=32, patch_size=8, embed_dim=64, depth=2, num_heads=4, qk_norm=True,
                                   num_classes=3))
    path = timm_file(ref, tmp_path, "model")
    x = images(32, 32)
    with torch.no_grad():
        expected = ref(nchw(x)).numpy()
    model = keras_vit.from_timm(path, num_heads=4, classifier_activation=None)
    close(to_numpy(model(x)), expected, "q/k norms")
    assert keras_vit.structure.find_vit(model).family()["qk_norm"] is True


@pytest.mark.backend_independent
def test_a_parallel_model_reloads_trains_and_what_is_refused(tmp_path):
    """A model of parallel blocks with q/k norms, layer scale, dropout and stochastic depth: one scale a block and no
    second norm, the q/k norms' weights in the official layout; reloaded from `.keras` in safe mode with the same
    outputs; a training call differs from inference (its dropouts) and inference is repeatable; a training step moves
    every weight; `post_norm` with `parallel_blocks` is refused in one line."""
    model, x, args = _reloaded_model(tmp_path, qk_norm=True, parallel_blocks=True, normalization="rms_norm")
    block = model.get_layer("encoderblock_0")
    assert block.norm_2 is None and len(block.scales) == 1
    assert {k.split("/")[0] for k in block.attention.official_weights()} >= {"q_norm", "k_norm"}
    assert not np.allclose(to_numpy(model(x, training=True)), to_numpy(model(x)))
    np.testing.assert_array_equal(to_numpy(model(x)), to_numpy(model(x)))
    _trains(model)
    with pytest.raises(ValueError, match="post_norm and parallel do not combine"):
        keras_vit.VisionTransformer(**args, post_norm=True)
    relative = keras_vit.VisionTransformer(**args, position_embedding="relative")  # its own attention: the norms too
    assert len(relative.get_layer("encoderblock_0").attention.qk_norms) == 2


@pytest.mark.backend_independent
def test_a_model_of_branches_reloads_trains_inspects_and_takes_lora(tmp_path):
    """A model of two attentions and two MLPs a block: reloaded from `.keras` in safe mode with the same outputs; its
    attention maps hold both branches' heads, branch 0's first; LoRA wraps every branch's projections; a training
    step with dropout and stochastic depth moves every weight; what it does not take is refused in one line."""
    model, x, args = _reloaded_model(tmp_path, parallel_branches=2)
    block = model.get_layer("encoderblock_0")
    inner = keras.Model(model.inputs, block.input)
    y = inner(x)
    _, maps = block(y, return_attention=True)
    _, first = block.branch_blocks[0].attention(block.branch_blocks[0].norm_0(y), return_attention=True)
    assert tuple(maps.shape) == (2, 4, 17, 17)
    np.testing.assert_allclose(to_numpy(maps)[:, :2], to_numpy(first), atol=1e-6)
    assert len(keras_vit.lora.target_layers(model)) == 2 * 2 * 2  # query and value of 2 branches, 2 blocks
    _trains(model)
    with pytest.raises(ValueError, match="post_norm is not taken by a block of branches"):
        keras_vit.VisionTransformer(**args, post_norm=True)
    with pytest.raises(ValueError, match="parallel_branches must be a positive int, got 0"):
        keras_vit.VisionTransformer(**{**args, "parallel_branches": 0})
