"""NaFlex parity with the Hugging Face anchor: transformers' own `Siglip2VisionModel` (tiny, random weights,
saved by save_pretrained, loaded with `keras_vit.from_huggingface` as a NaFlex model) on a batch that mixes
image sizes and aspect ratios, its pooled output and the valid tokens; the vision tower of a whole
`Siglip2Model`; and what the reader refuses, by name."""

import logging

import keras
import numpy as np
import pytest

import keras_vit
from keras_vit.naflex import is_naflex, patchify_images
from keras_vit.data.naflex_feed import patchify
from keras_vit.weights import hf

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("safetensors")

# a 4 x 4 position table: every image of the batch resizes it (up on one axis, down on another: antialiased)
TOWER = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128, patch_size=16,
             num_patches=16)
TEXT = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64, vocab_size=64,
            bos_token_id=0, eos_token_id=1, pad_token_id=1)
# (h, w) of one batch's photographs: landscape, portrait, square, a strip; and the token budget
SIZES = [(120, 200), (200, 90), (128, 128), (40, 300)]
BUDGET = 24


def _save(folder, cls, config, seed=0):
    """(the transformers model, every parameter moved off its initial value, the folder it was saved to)."""
    torch.manual_seed(seed)
    model = cls(config)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=gen))
    model.eval().save_pretrained(str(folder))
    return model, str(folder)


@pytest.fixture(scope="module")
def tower(tmp_path_factory):
    return _save(tmp_path_factory.mktemp("hf") / "siglip2", transformers.Siglip2VisionModel,
                 transformers.Siglip2VisionConfig(**TOWER))


@pytest.fixture(scope="module")
def batch():
    """The NaFlex batch of four photographs cut to the budget, padded, and its images' grids."""
    from skimage import data

    photos = [data.astronaut(), data.chelsea(), data.coffee(), data.rocket()]
    sequences = [patchify(p[:h, :w], 16, BUDGET, seq_len=BUDGET) for p, (h, w) in zip(photos, SIZES)]
    inputs = {k: np.stack([s[k] for s in sequences]) for k in sequences[0]}
    grids = np.stack([c[v].max(0) + 1 for c, v in zip(inputs["patch_coord"], inputs["patch_valid"])])
    assert len({tuple(g) for g in grids}) == 4 and not inputs["patch_valid"].all()  # four shapes, padding
    return inputs, grids


def _theirs(fn, inputs, grids):
    """transformers' output on the same patches: its layout is keras-vit's (channels fastest), as they are."""
    with torch.no_grad():
        return fn(pixel_values=torch.from_numpy(inputs["patches"]),
                  pixel_attention_mask=torch.from_numpy(inputs["patch_valid"]).long(),
                  spatial_shapes=torch.from_numpy(grids).long())


def _close(ours, theirs, what):
    theirs = theirs.detach().numpy() if hasattr(theirs, "detach") else np.asarray(theirs)
    scale = float(np.abs(theirs).max())
    err = float(np.abs(ours - theirs).max())
    print(f"{what}: max abs error {err:.2e}, scale {scale:.2f} ({keras.backend.backend()})")
    assert scale > 0.1, what  # a real signal
    assert err <= 1e-5 * max(1.0, scale), (what, err, scale)


def test_pooled_output_and_valid_tokens_equal_transformers(tower, batch):
    ref, folder = tower
    inputs, grids = batch
    out = _theirs(ref, inputs, grids)
    model = keras_vit.from_huggingface(folder)
    assert is_naflex(model)
    _close(keras.ops.convert_to_numpy(model(inputs)), out.pooler_output, "Siglip2VisionModel pooler_output")
    features = keras_vit.from_huggingface(folder, include_top=False, pooling=None)
    tokens = keras.ops.convert_to_numpy(features(inputs))
    valid = inputs["patch_valid"]
    _close(tokens[valid], out.last_hidden_state.numpy()[valid], "Siglip2VisionModel last_hidden_state (valid)")


def test_a_whole_siglip2_model_folder_loads_its_vision_tower(tmp_path, batch, caplog):
    config = transformers.Siglip2Config(vision_config=TOWER, text_config=TEXT)
    ref, folder = _save(tmp_path / "siglip2_model", transformers.Siglip2Model, config, seed=1)
    with caplog.at_level(logging.INFO, logger="keras_vit"):
        model = keras_vit.from_huggingface(folder)
    assert "dropped the text tower" in caplog.text and "text_model" in caplog.text
    inputs, grids = batch
    _close(keras.ops.convert_to_numpy(model(inputs)), _theirs(ref.get_image_features, inputs, grids).pooler_output,
           "Siglip2Model image features")


def test_the_classifier_reads_the_mean_of_the_valid_tokens(tmp_path, batch, caplog):
    """Siglip2ForImageClassification: the valid tokens' mean after the final norm into the classifier (its tower's
    attention-pooling head, unused, left out and logged): classifier="gap" on a NaFlex model."""
    config = transformers.Siglip2Config(vision_config=TOWER, text_config=TEXT, num_labels=3)
    ref, folder = _save(tmp_path / "siglip2_classifier", transformers.Siglip2ForImageClassification, config, seed=2)
    with caplog.at_level(logging.INFO, logger="keras_vit"):
        model = keras_vit.from_huggingface(folder, classifier_activation=None)
    assert is_naflex(model) and "attention-pooling head" in caplog.text
    inputs, grids = batch
    _close(keras.ops.convert_to_numpy(model(inputs)), _theirs(ref, inputs, grids).logits,
           "Siglip2ForImageClassification logits")


# --- facts that do not depend on the backend --------------------------------------------------------

@pytest.mark.backend_independent
def test_patches_are_flattened_as_siglip2s_image_processor_cuts_them():
    """Siglip2ImageProcessor's (C, H, W) -> (gh * gw, P * P * C) is row-major over the grid, each patch
    (P, P, C) with the channels fastest: keras-vit's NaFlex layout, so the Linear kernel is reshaped as
    it is, not permuted."""
    from transformers.models.siglip2.image_processing_pil_siglip2 import convert_image_to_patches

    image = np.random.default_rng(0).uniform(-1, 1, (48, 80, 3)).astype("float32")
    theirs = convert_image_to_patches(image.transpose(2, 0, 1), 16)
    np.testing.assert_array_equal(patchify_images(image[None], 16)["patches"][0], theirs)
    weight = np.random.default_rng(1).normal(size=(8, 16 * 16 * 3)).astype("float32")
    arrays, unmapped = hf.to_official({"embeddings.patch_embedding.weight": weight}, 2)
    assert unmapped == [] and arrays["embedding/kernel"].shape == (16, 16, 3, 8)
    np.testing.assert_array_equal(theirs @ arrays["embedding/kernel"].reshape(-1, 8), theirs @ weight.T)


@pytest.mark.backend_independent
def test_the_architecture_of_a_siglip2_folder(tower):
    _, folder = tower
    arch = hf.architecture(*hf.read_folder(folder))
    assert arch["naflex"] is True and arch["image_size"] == (64, 64) and arch["classifier"] == "map"
    assert arch["position_interpolation"] == "bilinear_antialias" and arch["approximate_gelu"] is True
    assert arch["layer_norm_epsilon"] == 1e-6 and arch["mlp_dim"] == 128 and arch["classes"] is None
    _, tensors = hf.read_folder(folder)
    _, unmapped = hf.to_official(tensors, 4)
    assert unmapped == []


@pytest.mark.backend_independent
def test_an_image_size_for_a_naflex_folder_is_refused(tower):
    """A NaFlex model resizes its position table to each image's grid: a fixed image size means nothing."""
    _, folder = tower
    with pytest.raises(ValueError, match="NaFlex model.*image_size=224 has no meaning"):
        keras_vit.from_huggingface(folder, image_size=224)


@pytest.mark.backend_independent
def test_what_the_siglip2_reader_refuses_by_name(tmp_path):
    cfg = hf.vision_config({"model_type": "siglip2_vision_model", **TOWER})[1]
    kernel = np.zeros((64, 768), "float32")
    with pytest.raises(ValueError, match="24 position embeddings .* no square grid"):
        hf.architecture({**cfg, "num_patches": 24}, {"embeddings.patch_embedding.weight": kernel})
    with pytest.raises(ValueError, match="a SigLIP 2 text tower"):
        hf.vision_config({"model_type": "siglip2_text_model"})
    with pytest.raises(ValueError, match="a SigLIP 2 model config without a vision_config"):
        hf.vision_config({"model_type": "siglip2"})
