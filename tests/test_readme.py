"""The README and the documentation as a contract: every python block of README.md and of docs/
(the site's pages) runs as written, in a fresh namespace that holds only the inputs its prose names
(`images`, `x_224`, ...), from a user's empty home, and what its comments promise is asserted.

Each block is keyed by its file and a string only it holds (RUN_*). A block that cannot run here is
named in NOT_RUN with the reason, and a short snippet that repeats what a run block does is named in
CHECKED: both are compiled and their imports and the names they take from keras_vit are checked.

Every file a block names is a small stand-in of the same class and layout: timm files written by
timm, Hugging Face folders by transformers (save_pretrained), official `.npz` files by
`keras_vit.weights.save_npz` (the official layout, checked key by key in test_weights.py), all of
random weights; registry tags are downloaded from a loopback mirror, timm names from a Hugging Face
hub cache, CIFAR-10 through tensorflow-datasets from a loopback archive. The variant table is scaled
to 16 channels (2 heads, MLP 32) with the released depth, patch and stem, so that every factory and
its files stay consistent and small; the widths a comment states are checked against the real
table. `model.fit` runs one optimizer update (the README's epoch is 500) of micro-batches cut to 2 images;
the arguments it was given are checked against the comments.
"""

import ast
import dataclasses
import glob
import logging
import os
import re
import shutil
import types

import keras
import numpy as np
import pytest
from conftest import LoopbackServer, photo_folder, photos

import keras_vit
from keras_vit import configs
from keras_vit.weights import download, registry, save_npz

pytestmark = pytest.mark.backend_independent

ROOT = os.path.normpath(os.path.join(os.path.dirname(__file__), os.pardir))
README = os.path.join(ROOT, "README.md")
# the README and every page of the site, as paths relative to the repository
PAGES = ["README.md", *sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "docs", "**", "*.md"),
                                                                           recursive=True))]
REAL = dict(configs.VARIANTS)  # the released sizes, for the widths the comments state


def tiny(config):
    """A variant at stand-in size: 2 heads of width heads_released (so the variants stay told apart),
    MLP twice the width; depth, patch and stem as released."""
    return dataclasses.replace(config, hidden_size=2 * config.num_heads, mlp_dim=4 * config.num_heads, num_heads=2)


class Block(str):
    """A python block of a page, preceded by blank lines so that its lines keep their line numbers
    in a traceback; `.path` is its page."""

    path = "README.md"


def blocks(path=None):
    """The python blocks of one page, or of every page (README.md and docs/)."""
    if path is None:
        return [b for page in PAGES for b in blocks(page)]
    with open(os.path.join(ROOT, path), encoding="utf-8") as f:
        text = f.read()
    found = []
    for m in re.finditer(r"```python\n(.*?)```", text, re.S):
        code = Block("\n" * text[:m.start(1)].count("\n") + m.group(1))
        code.path = path
        found.append(code)
    return found


def block(key):
    """The one block of page `key[0]` holding the string `key[1]`."""
    path, text = key
    (found,) = [b for b in blocks(path) if text in b]
    return found


def promise(code, text):
    """The comment of the line of `code` holding `text`."""
    (line,) = [ln for ln in code.splitlines() if text in ln]
    return line.split("#", 1)[1].strip()


def shape_in(comment):
    """The shape a comment states, e.g. "(B, 14, 14, 768)" -> ("B", 14, 14, 768)."""
    inner = re.search(r"\((B(?:, *[\w]+)+)\)", comment).group(1)
    return tuple(int(v) if v.isdigit() else v for v in re.split(r", *", inner))


def np_(x):
    return keras.ops.convert_to_numpy(x)


def random_weights(model, seed=0, scale=0.2):
    rng = np.random.default_rng(seed)
    for var in model.weights:
        var.assign(rng.normal(0, scale, var.shape).astype("float32"))
    return model


def _timm():
    """timm, imported as the benchmarks do (without torchvision, which the install leaves out)."""
    import sys

    sys.path.insert(0, os.path.join(os.path.dirname(README), "benchmarks"))
    from timm_peer import import_timm

    return import_timm()


def run(code, **inputs):
    namespace = {"__name__": "__readme__", **inputs}
    exec(compile(code, getattr(code, "path", "README.md"), "exec"), namespace)  # noqa: S102  the project's own pages
    return types.SimpleNamespace(**namespace)


@pytest.fixture
def user(tmp_path, monkeypatch, user_home):
    """A user's working folder and empty home, the variant table at stand-in size, and a loopback
    mirror of the official bucket; `user.serve(variant, tag, image_size)` writes a tag's stand-in."""
    for name, config in REAL.items():
        monkeypatch.setitem(configs.VARIANTS, name, tiny(config))
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    served = tmp_path / "bucket"
    server = LoopbackServer(served)
    monkeypatch.setenv(download.BASE_URL_ENV, server.url)

    def serve(variant, tag, image_size=None, seed=0):
        record = registry.get_weights(variant, tag, image_size)
        path = served / record.url[len(registry.BUCKET_URL) + 1:]
        save_npz(official_standin(variant, record.image_size, record.classes, record.pre_logits, seed), str(path))
        return record

    yield types.SimpleNamespace(work=work, serve=serve, server=server)
    server.close()


def official_standin(variant, image_size, classes, pre_logits, seed=0):
    config = configs.get_variant(variant)
    model = keras_vit.VisionTransformer(**config.build_args(), image_size=image_size, classes=classes,
                                        representation_size=config.hidden_size if pre_logits else None,
                                        classifier_activation=None)
    return random_weights(model, seed)


def layer_norm(x, gamma, beta, epsilon):
    mean, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + epsilon) * gamma + beta


def test_every_block_is_run_or_named():
    """A new block of the README or of a page of docs/ needs a test here (a RUN_* key and a test, or a
    reason in NOT_RUN or CHECKED); a key that matches no block is stale."""
    keys = [*RUN, *NOT_RUN, *CHECKED]
    assert len(set(keys)) == len(keys)
    for code in blocks():
        matching = [k for k in keys if k[0] == code.path and k[1] in code]
        assert len(matching) == 1, (f"{code.path}: a python block without exactly one test in tests/test_readme.py "
                                    f"(add a (page, key) to RUN with a test, or to CHECKED / NOT_RUN):\n{code}")
    for path, text in keys:
        assert sum(text in code for code in blocks(path)) == 1, f"{text!r} names no single block of {path}"


def _keras_vit_imports(code):
    """The `import keras_vit...` / `from keras_vit... import ...` statements of a block."""
    tree = ast.parse(code)
    return [node for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom))
            and any(name.split(".")[0] == "keras_vit" for name in
                    ([node.module or ""] if isinstance(node, ast.ImportFrom) else [a.name for a in node.names]))]


def test_twenty_lines(user, capsys):
    """The README's example: a pretrained ViT predicts ImageNet names; the one fine-tuned on a folder of
    photographs takes its classes, runs the stated updates, validates, and saves a file that reloads
    with the class names."""
    code = block(RUN_TWENTY_LINES)
    user.serve("ViT_B16", "imagenet21k+imagenet2012", 224)
    user.serve("ViT_B16", "imagenet21k")
    photo_folder(user.work / "photos", per_class=12)
    base = photos(224)
    ns = run(code, images=base)

    stated = re.search(r"\(B, (\d+)\)", promise(code, "probs = ")).group(1)
    assert np_(ns.probs).shape == (3, int(stated))
    printed = capsys.readouterr().out
    assert all(name in printed for _, name, _ in keras_vit.decode_predictions(np_(ns.probs), top=3)[0])
    assert ns.model.output_shape == (None, 3) and ns.train.class_names == ("astronaut", "cat", "coffee")
    assert ns.steps == 1 and int(np_(ns.model.optimizer.iterations)) == 5  # 30 photos: one update a pass
    assert len(ns.model.history.history["val_accuracy"]) == 5  # validated after every pass
    again = keras.saving.load_model("vit_b16_mine.keras")
    assert again.class_names == ns.train.class_names
    np.testing.assert_allclose(np_(again(base)), np_(ns.model(base)), atol=1e-5)


def test_quick_start(user, capsys):
    code = block(RUN_QUICK_START)
    user.serve("ViT_L16", "imagenet21k+imagenet2012", 384)
    user.serve("ViT_B16", "imagenet21k")
    os.makedirs("path/to")
    save_npz(official_standin("ViT_B16", 224, configs.IMAGENET21K_CLASSES, True, seed=3), "path/to/ViT-B_16.npz")
    ns = run(code, images=photos(384))

    # official file, downloaded once, cached (in Keras' default folder of the user's home)
    cache = os.path.join(os.environ["HOME"], ".keras", "models", "keras_vit")
    assert sorted(os.listdir(cache)) == sorted(r.filename for r in (
        registry.get_weights("ViT_L16", "imagenet21k+imagenet2012", 384), registry.get_weights("ViT_B16", "imagenet21k")))
    assert ns.model.input_shape == (None, 384, 384, 3)
    probs = np_(ns.probs)
    assert probs.shape == (3, 1000)
    np.testing.assert_allclose(probs.sum(-1), 1, atol=1e-5)
    printed = capsys.readouterr().out
    top5 = keras_vit.decode_predictions(probs, top=5)
    assert all(len(p) == 5 for p in top5) and all(name in printed for _, name, _ in top5[0])

    # the backbone: y = LN(z_L^0), the class token of the last block after the final LayerNorm
    x = keras_vit.preprocess_input(photos(384))
    stream = keras_vit.feature_extractor(ns.backbone, blocks=[-1])(x)
    stream = stream[0] if isinstance(stream, (list, tuple)) else stream
    norm = ns.backbone.get_layer("encoder_norm")
    expected = layer_norm(np_(stream)[:, 0], np_(norm.gamma), np_(norm.beta), norm.epsilon)
    np.testing.assert_allclose(np_(ns.backbone(x)), expected, atol=1e-5)

    # a local file, a non-square input and a new head of 37 classes
    assert ns.clf.input_shape == (None, 224, 320, 3) and ns.clf.output_shape == (None, 37)
    assert not np.any(np_(ns.clf.get_layer("head").kernel))


def test_ways_to_finetune(user):
    """LoRA trains the adapters and the head, its file holds only those and reloads into a fresh model
    as the merged model; layer decay gives block i of 12 the rate 0.75 ** (12 - i)."""
    code = block(RUN_WAYS)
    user.serve("ViT_B16", "imagenet21k")
    base = photos(224)
    ns = run(code, train_images=np.concatenate([base] * 11)[:32], train_labels=np.arange(32) % 10)
    x = keras_vit.preprocess_input(base)
    assert all("lora_kernel" in v.path or v.path.startswith("head/") for v in ns.again.trainable_weights)
    # three updates of one batch: the warm-up's first rate is 0, the zero head then moves, then the adapters
    assert int(np_(ns.model.optimizer.iterations)) == 3 and int(np_(ns.full.optimizer.iterations)) == 1
    with np.load("cifar10-lora.npz", allow_pickle=False) as f:
        assert {n for n in f.files if not n.startswith("__")} == {v.path for v in ns.model.trainable_weights}
    assert np.abs(np_(ns.model.get_layer("head").kernel)).max() > 0  # it trained, the adapters too
    assert all(np.abs(np_(layer.lora_kernel_b)).max() > 0 for layer in keras_vit.lora.lora_layers(ns.model))
    np.testing.assert_allclose(np_(ns.again(x)), np_(ns.model(x)), atol=1e-6)
    np.testing.assert_allclose(np_(ns.serving(x)), np_(ns.model(x)), atol=1e-5)
    scales = ns.full.optimizer.scales
    for i in range(12):
        assert scales[f"encoderblock_{i}/LayerNorm_0/gamma"] == pytest.approx(0.75 ** (12 - i))
    assert scales["head/kernel"] == 1 and scales["embedding/kernel"] == pytest.approx(0.75 ** 13)


def test_configuration_block_is_vit_b16():
    """`VisionTransformer(...)` with the arguments shown is ViT-Base: 86M parameters (Table 1)."""
    ns = run(block(RUN_CONFIGURATION))
    assert ns.model.count_params() // 10**6 == 86
    assert ns.model.output_shape == (None, 1000)


def test_any_resolution_pooling_features_and_patch_size(user):
    code = block(RUN_RESOLUTION)
    user.serve("ViT_B16", "imagenet21k+imagenet2012")
    user.serve("ViT_B16", "imagenet21k")
    user.serve("ViT_B16", "imagenet21k+imagenet2012", 224)
    x_224, x_384x512 = (keras_vit.preprocess_input(photos(s)) for s in (224, (384, 512)))
    ns = run(code, x_224=x_224, x_384x512=x_384x512)
    width, real = tiny(REAL["ViT_B16"]).hidden_size, REAL["ViT_B16"].hidden_size

    for x in (x_224, x_384x512):  # any resolution: probabilities at both sizes
        np.testing.assert_allclose(np_(ns.model.predict(x, verbose=0)).sum(-1), 1, atol=1e-5)
    for name in ("maps", "cls", "avg"):
        stated = shape_in(promise(code, f"{name} = "))
        assert stated[-1] == real
        assert np_(getattr(ns, name)(x_224)).shape == (3, *stated[1:-1], width)
    maps = np_(ns.maps(x_224))
    np.testing.assert_allclose(np_(ns.avg(x_224)), maps.mean((1, 2)), atol=1e-5)  # avg: the mean of the patch tokens
    assert ns.rep.output_shape == ns.cls.output_shape  # the representation the head reads (no pre-logits here)

    probe = ns.probe(x_224)
    stated = promise(code, "probe = ")
    assert stated.startswith("3 x") and stated.endswith(f"{real})")
    assert [tuple(np_(p).shape) for p in probe] == [(3, 14, 14, width)] * 3

    tokens = re.search(r"(\d+)x(\d+) tokens at (\d+) px", promise(code, "b8 = ")).groups()
    side, size = int(tokens[0]), int(tokens[2])
    assert ns.b8.input_shape == (None, size, size, 3)
    stream = keras_vit.feature_extractor(ns.b8, blocks=[0])(keras_vit.preprocess_input(photos(size)))
    stream = np_(stream[0] if isinstance(stream, (list, tuple)) else stream)
    assert stream.shape[1] == 1 + side * side


def test_timm_and_hugging_face_files(user, caplog):
    torch = pytest.importorskip("torch")
    timm = _timm()
    transformers = pytest.importorskip("transformers")
    from safetensors.torch import save_file

    code = block(RUN_TIMM_HF)
    torch.manual_seed(0)
    b16 = tiny(REAL["ViT_B16"])
    source = timm.create_model("vit_base_patch16_224", pretrained=False, embed_dim=b16.hidden_size,
                               num_heads=b16.num_heads, mlp_ratio=b16.mlp_dim / b16.hidden_size)
    for p in source.parameters():
        torch.nn.init.normal_(p, 0, 0.2)
    state = {k: v.contiguous() for k, v in source.state_dict().items()}
    save_file(state, "model.safetensors")
    torch.save(state, "pytorch_model.bin")
    config = transformers.ViTConfig(hidden_size=b16.hidden_size, num_hidden_layers=12, num_attention_heads=b16.num_heads,
                                    intermediate_size=b16.mlp_dim,
                                    image_size=224, patch_size=16, num_labels=1000)
    hf = transformers.ViTForImageClassification(config).eval()
    hf.save_pretrained("vit-base-patch16-224")

    with caplog.at_level(logging.INFO, logger="keras_vit"):
        ns = run(code)
    x = keras_vit.preprocess_input(photos(224))
    pixels = torch.from_numpy(np.transpose(np_(x), (0, 3, 1, 2)).copy())

    # timm: 224 px, 1000 classes, exact GELU: the probabilities of timm's own logits
    assert ns.timm_model.input_shape == (None, 224, 224, 3) and ns.timm_model.output_shape == (None, 1000)
    blocks_ = [layer for layer in ns.timm_model.layers if type(layer).__name__ == "TransformerBlock"]
    assert len(blocks_) == 12 and not any(b.get_config()["approximate_gelu"] for b in blocks_)
    with torch.no_grad():
        expected = torch.softmax(source.eval()(pixels), -1).numpy()
    np.testing.assert_allclose(np_(ns.timm_model(x)), expected, atol=1e-5)

    # the file's head is 1000 wide: a new zero head, logged; the encoder is the file's
    assert not np.any(np_(ns.pets.get_layer("head").kernel))
    np.testing.assert_allclose(np_(ns.pets(x)), 1 / 37, atol=1e-6)
    assert any("zero" in r.getMessage() and "head" in r.getMessage() for r in caplog.records)

    # Hugging Face: LayerNorm epsilon 1e-12 from config.json, and transformers' probabilities
    epsilons = {b.get_config()["layer_norm_epsilon"] for b in ns.hf_model.layers if type(b).__name__ == "TransformerBlock"}
    epsilons.add(ns.hf_model.get_layer("encoder_norm").epsilon)
    assert epsilons == {float(promise(code, "hf_model = ").split("epsilon ")[1].split()[0])}
    with torch.no_grad():
        expected = torch.softmax(hf(pixel_values=pixels).logits, -1).numpy()
    np.testing.assert_allclose(np_(ns.hf_model(x)), expected, atol=1e-5)


def _hub_cache(monkeypatch, root, repo, files):
    """A Hugging Face hub cache holding `files` ({name: source path}) of `repo` at one revision."""
    import huggingface_hub.constants

    revision = "0" * 40
    folder = root / f"models--{repo.replace('/', '--')}"
    (folder / "refs").mkdir(parents=True)
    (folder / "refs" / "main").write_text(revision)
    snapshot = folder / "snapshots" / revision
    snapshot.mkdir(parents=True)
    for name, path in files.items():
        shutil.copy(path, snapshot / name)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(root))
    monkeypatch.setenv("HF_HUB_CACHE", str(root))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def test_foreign_families(user, monkeypatch, tmp_path):
    torch = pytest.importorskip("torch")
    timm = _timm()
    transformers = pytest.importorskip("transformers")
    from safetensors.torch import save_file
    from timm.models.vision_transformer import checkpoint_filter_fn

    code = block(RUN_FAMILIES)
    torch.manual_seed(0)
    # DINOv2 ViT-S/14 at 518 px: the released width (timm's state dict names no head count, timm's
    # table gives it from the width), two blocks instead of twelve
    dino = timm.create_model("vit_small_patch14_dinov2", pretrained=False, depth=2, num_classes=0).eval()
    for p in dino.parameters():
        torch.nn.init.normal_(p, 0, 0.2)
    save_file({k: v.contiguous() for k, v in dino.state_dict().items()}, "dinov2.safetensors")
    _hub_cache(monkeypatch, tmp_path / "hub", "timm/vit_small_patch14_dinov2.lvd142m",
               {"model.safetensors": "dinov2.safetensors"})
    clip = transformers.CLIPModel(transformers.CLIPConfig(
        projection_dim=512,
        vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                           image_size=224, patch_size=32),
        text_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2))).eval()
    clip.save_pretrained("clip-vit-base-patch32")
    siglip = transformers.SiglipModel(transformers.SiglipConfig(
        vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                           image_size=224, patch_size=16),
        text_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2))).eval()
    siglip.save_pretrained("siglip-base-patch16-224")

    images = photos(224)
    ns = run(code, images=images)

    def nchw(x):
        return torch.from_numpy(np.transpose(np_(x), (0, 3, 1, 2)).copy())

    # the class token after the norm, (B, 384), at 224 px: timm's own, its position embeddings
    # resized by timm's rule
    at_224 = timm.create_model("vit_small_patch14_dinov2", pretrained=False, depth=2, num_classes=0, img_size=224)
    at_224.eval()
    at_224.load_state_dict(checkpoint_filter_fn(dino.state_dict(), at_224))
    x = keras_vit.preprocess_input(images, mode="imagenet")
    with torch.no_grad():
        expected = at_224.forward_features(nchw(x))[:, 0].numpy()
    assert shape_in(promise(code, "cls = ")) == ("B", expected.shape[1])
    np.testing.assert_allclose(np_(ns.cls), expected, atol=2e-5 * np.abs(expected).max())

    # the file's own resolution, 518 px: its (B, 37, 37, 384) patch tokens after the norm
    stated = shape_in(promise(code, "patches = "))
    x518 = keras_vit.preprocess_input(photos(518, n=1), mode="imagenet")
    got = np_(ns.patches(x518))
    assert got.shape == (1, *stated[1:])
    with torch.no_grad():
        expected = dino.forward_features(nchw(x518))[:, 1:].numpy().reshape(got.shape)
    np.testing.assert_allclose(got, expected, atol=2e-5 * np.abs(expected).max())

    # a whole CLIPModel: the embedding after the projection, transformers' image features
    with torch.no_grad():
        expected = clip.get_image_features(pixel_values=nchw(keras_vit.preprocess_input(images, mode="clip")))
        expected = getattr(expected, "pooler_output", expected).numpy()
    assert shape_in(promise(code, "embeds = ")) == ("B", expected.shape[1])
    np.testing.assert_allclose(np_(ns.embeds), expected, atol=1e-5)

    # SigLIP: MAP-pooled, [-1, 1] input
    x = keras_vit.preprocess_input(images)
    assert float(np_(x).min()) >= -1 and float(np_(x).max()) <= 1
    with torch.no_grad():
        expected = siglip.vision_model(pixel_values=nchw(x)).pooler_output.numpy()
    np.testing.assert_allclose(np_(ns.siglip(x)), expected, atol=1e-5)


def test_finetuning_recipe(user, cifar10_mirror, monkeypatch):
    pytest.importorskip("tensorflow_datasets")
    code = block(RUN_FINETUNE)
    user.serve("ViT_B16", "imagenet21k")
    calls = []
    fit = keras.Model.fit

    def one_update(model, x=None, y=None, *, epochs=1, steps_per_epoch=None, **kwargs):
        calls.append(dict(x=x, epochs=epochs, steps_per_epoch=steps_per_epoch, **kwargs))
        # one update of the recipe's 8 micro-batches, each cut to its first 2 images (of 64 at 384: what
        # makes the recipe's accumulation is the number of micro-batches, not their size)
        few = x.map(lambda images, labels: (images[:2], labels[:2]))
        return fit(model, few, y, epochs=1, steps_per_epoch=keras_vit.recipes.fit_steps(model, 1), **kwargs)

    monkeypatch.setattr(keras.Model, "fit", one_update)
    ns = run(code)

    (call,) = calls
    accumulation = ns.model.optimizer.gradient_accumulation_steps
    assert f"{accumulation}-step gradient accumulation" in promise(code, "device_batch_size=")
    images, labels = next(iter(ns.train))
    assert tuple(images.shape) == (64, 384, 384, 3) and images.shape[0] * accumulation == 512
    updates = int(re.search(r"(\d+) updates per epoch", promise(code, "steps_per_epoch=")).group(1))
    assert call["steps_per_epoch"] == updates * accumulation and call["epochs"] == 20
    assert int(np_(ns.model.optimizer.iterations)) == 1  # the shortened run: one update of 8 micro-batches
    assert ns.model.output_shape == (None, 10)


def test_ablation_options(user):
    """learned_2d: a row and a column table of D/2 each (and one for the class token); every_layer_shared:
    one set of tables for all blocks, which every block's input depends on."""
    ns = run(block(RUN_ABLATIONS))
    tables = {w.path: tuple(w.shape) for w in ns.model.weights if w.path.startswith("posembed")}
    assert tables == {"posembed_input/row_embedding": (14, 384), "posembed_input/col_embedding": (14, 384),
                      "posembed_input/prefix_embedding": (1, 768)}
    x = keras_vit.preprocess_input(photos(224, n=1))
    np.testing.assert_allclose(np_(ns.model(x)).sum(-1), 1, atol=1e-5)
    first = keras_vit.feature_extractor(ns.model, blocks=[0])  # the head starts at zero: read the stream
    before = np_(first(x))
    row = ns.model.get_layer("posembed_input").weights[0]
    row.assign(np_(row) + 1.0)
    assert np.abs(np_(first(x)) - before).max(-1).min() > 0.5  # every token after the first block moved


def test_masked_patch_prediction(user):
    code = block(RUN_MASKED_PATCH)
    images = photos(224, n=3)
    ns = run(code, images=images)
    loss = ns.model.history.history["loss"]
    assert len(loss) == 1 and np.isfinite(loss[0])
    again = run("from keras_vit import ViT_B16\n" + "model = " + promise(code, "save_npz(").split("then ")[1])
    assert again.model.output_shape == (None, 10)
    trained = {w.path: np_(w) for w in ns.model.encoder.weights}
    loaded = {w.path: np_(w) for w in again.model.weights if not w.path.startswith(("head", "pre_logits"))}
    assert set(loaded) == set(trained) - {p for p in trained if p.startswith(("head", "pre_logits"))}
    for path, value in loaded.items():
        np.testing.assert_array_equal(value, trained[path], err_msg=path)


RUN_TWENTY_LINES = ("README.md", "epochs, steps = 5, max(1, ")
RUN_QUICK_START = ("docs/using.md", 'ViT_L16(image_size=384, weights="imagenet21k+imagenet2012")')
RUN_CONFIGURATION = ("docs/using.md", "model = VisionTransformer(\n")
RUN_RESOLUTION = ("docs/using.md", "# 1. any resolution")
RUN_TIMM_HF = ("docs/families.md", "# timm: vit_base_patch16_224")
RUN_FAMILIES = ("docs/families.md", "dino = keras_vit.from_timm(")
RUN_DINOV3 = ("docs/families.md", "dinov3 = keras_vit.from_timm(")
RUN_FINETUNE = ("docs/finetuning.md", 'data.load("cifar10"')
RUN_ABLATIONS = ("docs/experiments.md", 'position_embedding="learned_2d"')
RUN_MASKED_PATCH = ("docs/experiments.md", "MaskedPatchPredictor(")
RUN_WAYS = ("docs/ways-to-finetune.md", "keras_vit.enable_lora(model, rank=8)")
RUN_OWN_IMAGES = ("docs/own-images.md", 'keras_vit.from_huggingface("dinov2-vits14"')
RUN_ANY_SIZE = ("docs/serving.md", 'export(backbone, "dinov2_any_size", "onnx"')
RUN_NAFLEX = ("docs/naflex.md", "flex = naflex(model)")
RUN = (RUN_TWENTY_LINES, RUN_QUICK_START, RUN_CONFIGURATION, RUN_RESOLUTION, RUN_TIMM_HF, RUN_FAMILIES, RUN_DINOV3,
       RUN_FINETUNE, RUN_ABLATIONS, RUN_MASKED_PATCH, RUN_WAYS, RUN_OWN_IMAGES, RUN_ANY_SIZE, RUN_NAFLEX)
NOT_RUN = {
    ("docs/scaling.md", "model_parallel((2, 4))"):
        "2 replicas x 4-way tensor parallel needs 8 devices; the same calls run on 8 virtual CPU devices in "
        "tests/test_distribute.py (jax8)",
    ("docs/scaling.md", "x_mine, y_mine = distribute.process_rows((x, y), 16)"):
        "needs several processes (initialize_multihost); tests/_multiprocess_worker.py makes the same calls on 2 "
        "processes started by tests/test_multiprocess.py",
}
CHECKED = {
    ("docs/finetuning.md", "distiller = Distiller(student, teacher"):
        "Distiller fits a student from a frozen teacher in tests/test_distill.py",
    ("docs/own-images.md", 'write_shards("photos"'):
        "write_shards and from_shards run on a folder of photographs in tests/test_shards.py",
    ("docs/own-images.md", 'part="validation")'):
        "write_shards of a scanned folder's two parts, and finetune on them, run in tests/test_finetune_shards.py",
    ("docs/naflex.md", 'folder_batches("photos", plan)'):
        "the feed's folder_batches and a NaFlex model's fit run in tests/test_naflex_feed.py and "
        "tests/test_naflex_recipes.py",
    ("docs/keras-hub.md", "model = keras_vit.from_keras_hub(preset_dir)"):
        "run with a keras-hub preset written by save_to_preset in tests/test_keras_hub.py::test_the_docs_example_runs",
    ("docs/index.md", 'ViT_B16(weights="imagenet21k+imagenet2012", image_size=224)'):
        "the home page's three lines: the README's twenty lines (RUN_TWENTY_LINES) run the same calls",
}


@pytest.mark.parametrize("key", [*NOT_RUN, *CHECKED], ids=lambda k: f"{k[0]}:{k[1][:30]}")
def test_blocks_not_run_compile_and_their_names_exist(key):
    """A block named in NOT_RUN or CHECKED is not executed, but it compiles, its keras_vit imports
    run, and every `name.attribute` it takes from keras_vit exists."""
    code = block(key)
    compile(code, code.path, "exec")
    namespace = {"keras_vit": keras_vit}
    imports = _keras_vit_imports(code)
    assert imports, f"{key}: a block that imports nothing of keras_vit checks nothing here"
    exec(compile(ast.Module(body=imports, type_ignores=[]), code.path, "exec"), namespace)  # noqa: S102
    for base, attrs in re.findall(r"\b([A-Za-z_]\w*)((?:\.[A-Za-z_]\w*)+)", code):
        obj = namespace.get(base)
        if obj is None or not getattr(obj, "__name__", "").startswith("keras_vit"):
            continue
        for attr in attrs.strip(".").split("."):
            assert hasattr(obj, attr), f"{code.path}: {base}{attrs} does not exist"
            obj = getattr(obj, attr)
            if not getattr(obj, "__name__", "").startswith("keras_vit") and not isinstance(obj, type):
                break



def test_dinov3_in_python(user, monkeypatch, tmp_path):
    """docs/families.md's DINOv3 block: timm's DINOv3 ViT-S/16 (its released width, two blocks) by name from the
    hub cache and as a named file, a transformers DINOv3ViTModel folder: the class token equal to timm's, the patch
    grid at 448 px, the pooler output equal to transformers'."""
    torch = pytest.importorskip("torch")
    timm = _timm()
    transformers = pytest.importorskip("transformers")
    from safetensors.torch import save_file

    code = block(RUN_DINOV3)
    torch.manual_seed(0)
    ref = timm.create_model("vit_small_patch16_dinov3", pretrained=False, depth=2, global_pool="token").eval()
    for p in ref.parameters():
        torch.nn.init.normal_(p, 0, 0.2)
    save_file({k: v.contiguous() for k, v in ref.state_dict().items()}, "vit_small_patch16_dinov3.lvd1689m.safetensors")
    _hub_cache(monkeypatch, tmp_path / "hub", "timm/vit_small_patch16_dinov3.lvd1689m",
               {"model.safetensors": "vit_small_patch16_dinov3.lvd1689m.safetensors"})
    config = transformers.DINOv3ViTConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                          num_attention_heads=2, num_register_tokens=4)
    hf = transformers.DINOv3ViTModel(config).eval()
    hf.save_pretrained("dinov3-vits16-pretrain-lvd1689m")
    images, large = photos(256), photos(448, n=1)
    ns = run(code, images=images, large=large)

    def nchw(x):
        return torch.from_numpy(np.transpose(np_(keras_vit.preprocess_input(x, mode="imagenet")), (0, 3, 1, 2)).copy())

    with torch.no_grad():
        expected = ref.forward_features(nchw(images))[:, 0].numpy()
    assert shape_in(promise(code, "cls = ")) == ("B", expected.shape[1])
    np.testing.assert_allclose(np_(ns.cls), expected, atol=1e-5 * np.abs(expected).max())
    assert np_(ns.grid).shape == (1, *shape_in(promise(code, "grid = "))[1:])
    at_224 = photos(224)
    with torch.no_grad():
        expected = hf(pixel_values=nchw(at_224)).pooler_output.numpy()
    np.testing.assert_allclose(np_(ns.hf(keras_vit.preprocess_input(at_224, mode="imagenet"))), expected,
                               atol=1e-5 * np.abs(expected).max())


def test_own_images_in_python(user):
    """docs/own-images.md's Python equivalent of `keras-vit finetune`: a DINOv2 folder (a transformers
    stand-in) with a new head of the photo folder's classes, DINOv2's normalisation inside, the stated
    updates, the best epoch kept and the class names saved."""
    transformers = pytest.importorskip("transformers")
    code = block(RUN_OWN_IMAGES)
    config = transformers.Dinov2Config(hidden_size=8, num_hidden_layers=2, num_attention_heads=2, mlp_ratio=2,
                                       patch_size=14, image_size=224)
    transformers.Dinov2Model(config).save_pretrained("dinov2-vits14")
    photo_folder(user.work / "photos", per_class=12)
    ns = run(code)
    assert ns.model.output_shape == (None, 3) and ns.train.class_names == ("astronaut", "cat", "coffee")
    assert ns.steps == 2 and len(ns.model.history.history["val_accuracy"]) == 10  # 30 photos at 16 a batch
    again = keras.saving.load_model("mine.keras")
    assert again.class_names == ns.train.class_names and again.inputs[0].dtype == "uint8"
    scale, offset = keras_vit.preprocessing.input_scaling("imagenet")  # DINOv2's statistics, not [-1, 1]
    rescale = again.get_layer("rescale").get_config()
    np.testing.assert_allclose([rescale["scale"], rescale["offset"]], [scale, offset], rtol=1e-6)
    x = np.random.default_rng(0).integers(0, 256, (2, 224, 224, 3), dtype=np.uint8)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(again(x)), keras.ops.convert_to_numpy(ns.model(x)), atol=1e-5)


def test_any_size_serving_in_python(user):
    """docs/serving.md's any-size block: one ONNX file of a DINOv2 folder's patch features (a transformers
    stand-in) at three sizes, each of its own grid."""
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("onnxruntime")
    code = block(RUN_ANY_SIZE)
    config = transformers.Dinov2Config(hidden_size=8, num_hidden_layers=2, num_attention_heads=2, mlp_ratio=2,
                                       patch_size=14, image_size=224)
    transformers.Dinov2Model(config).save_pretrained("dinov2-vits14")
    ns = run(code)
    assert ns.features.shape == (1, 518 // 14, 518 // 14, 8)
    assert os.listdir("dinov2_any_size") == ["model.onnx"]


def test_naflex_in_python(user):
    """docs/naflex.md's first block: three photographs of three shapes through one NaFlex copy of a model."""
    pytest.importorskip("skimage")
    ns = run(block(RUN_NAFLEX))
    assert ns.probabilities.shape == (3, 10)
    np.testing.assert_allclose(ns.probabilities.sum(-1), 1, atol=1e-5)
    grids = {tuple(c[v].max(0) + 1) for c, v in zip(ns.batch["patch_coord"], ns.batch["patch_valid"])}
    assert len(grids) == 3 and all(h * w <= 196 for h, w in grids)
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(ns.flex.get_layer("embedding").kernel),
                                  keras.ops.convert_to_numpy(ns.model.get_layer("embedding").kernel))
