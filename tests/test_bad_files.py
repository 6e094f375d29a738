"""Every file kind keras_vit reads, damaged: truncated, emptied, bit-flipped, replaced by another kind of file
and given arrays of the wrong dtype. Each is refused with one ValueError that names the file and what was
expected, and a model given the file keeps every weight it had; nothing crashes or hangs. The damage is drawn
from the seeds below, so a failure replays exactly."""

import io
import json
import os
import shutil
import struct
import zipfile

import keras
import numpy as np
import pytest
from conftest import TINY

import keras_vit
from keras_vit.fileio import load_image
from keras_vit.data.folder import read_image
from keras_vit.weights import save_npz
from keras_vit.weights.keras_files import load_keras_model
from keras_vit.weights.keras_hub_save import save_keras_hub_preset

SEEDS = (0, 1, 2)  # each draws a cut, a set of flipped bits and the wrong-kind file
D, LAYERS, MLP, PATCH, CLASSES = TINY["hidden_size"], TINY["num_layers"], TINY["mlp_dim"], TINY["patch_size"], 10
TOKENS = (TINY["image_size"] // PATCH) ** 2 + 1


def _model(seed=0, **overrides):
    model = keras_vit.VisionTransformer(**TINY, **overrides)
    for i, v in enumerate(model.weights):
        v.assign(np.random.default_rng(seed + i).normal(0, 0.1, v.shape).astype("float32"))
    return model


def _tensors(prefix_rules, seed=0):
    """{name: float32 array} of random values for (name, shape) pairs."""
    rng = np.random.default_rng(seed)
    return {name: rng.normal(0, 0.1, shape).astype("float32") for name, shape in prefix_rules}


def timm_tensors():
    """A timm VisionTransformer state dict of TINY's architecture."""
    shapes = [("patch_embed.proj.weight", (D, 3, PATCH, PATCH)), ("patch_embed.proj.bias", (D,)),
              ("cls_token", (1, 1, D)), ("pos_embed", (1, TOKENS, D))]
    for i in range(LAYERS):
        b = f"blocks.{i}."
        shapes += [(b + "norm1.weight", (D,)), (b + "norm1.bias", (D,)), (b + "attn.qkv.weight", (3 * D, D)),
                   (b + "attn.qkv.bias", (3 * D,)), (b + "attn.proj.weight", (D, D)), (b + "attn.proj.bias", (D,)),
                   (b + "norm2.weight", (D,)), (b + "norm2.bias", (D,)), (b + "mlp.fc1.weight", (MLP, D)),
                   (b + "mlp.fc1.bias", (MLP,)), (b + "mlp.fc2.weight", (D, MLP)), (b + "mlp.fc2.bias", (D,))]
    shapes += [("norm.weight", (D,)), ("norm.bias", (D,)), ("head.weight", (CLASSES, D)), ("head.bias", (CLASSES,))]
    return _tensors(shapes)


def hf_tensors():
    """A transformers ViTForImageClassification state dict of TINY's architecture."""
    e = "vit.embeddings."
    shapes = [(e + "patch_embeddings.projection.weight", (D, 3, PATCH, PATCH)),
              (e + "patch_embeddings.projection.bias", (D,)), (e + "cls_token", (1, 1, D)),
              (e + "position_embeddings", (1, TOKENS, D))]
    for i in range(LAYERS):
        b = f"vit.encoder.layer.{i}."
        for name in ("attention.attention.query", "attention.attention.key", "attention.attention.value",
                     "attention.output.dense"):
            shapes += [(b + name + ".weight", (D, D)), (b + name + ".bias", (D,))]
        shapes += [(b + "intermediate.dense.weight", (MLP, D)), (b + "intermediate.dense.bias", (MLP,)),
                   (b + "output.dense.weight", (D, MLP)), (b + "output.dense.bias", (D,))]
        for norm in ("layernorm_before", "layernorm_after"):
            shapes += [(b + norm + ".weight", (D,)), (b + norm + ".bias", (D,))]
    shapes += [("vit.layernorm.weight", (D,)), ("vit.layernorm.bias", (D,)), ("classifier.weight", (CLASSES, D)),
               ("classifier.bias", (CLASSES,))]
    return _tensors(shapes)


HF_CONFIG = {"model_type": "vit", "architectures": ["ViTForImageClassification"], "hidden_size": D,
             "num_hidden_layers": LAYERS, "num_attention_heads": TINY["num_heads"], "intermediate_size": MLP,
             "image_size": TINY["image_size"], "patch_size": PATCH,
             "id2label": {str(i): f"class_{i}" for i in range(CLASSES)}}


def write_safetensors(path, tensors, dtype="F32"):
    """A .safetensors file written by hand (the format: an 8-byte header length, a JSON header, the bytes)."""
    header, blobs, offset = {}, [], 0
    for name, array in tensors.items():
        raw = np.ascontiguousarray(array).tobytes()
        header[name] = {"dtype": dtype, "shape": list(array.shape), "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    text = json.dumps(header).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))
    return path


def write_torch(path, tensors, dtype=None):
    torch = pytest.importorskip("torch")
    torch.save({k: torch.from_numpy(v if dtype is None else v.astype(dtype)) for k, v in tensors.items()}, path)
    return path


def png_bytes(size=(40, 30), seed=0):
    from PIL import Image

    pixels = np.random.default_rng(seed).integers(0, 256, (*size, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return buffer.getvalue()


# --------------------------------------------------------------------------
# the damage
# --------------------------------------------------------------------------
def truncated(data, rng):
    return data[: int(rng.integers(1, len(data)))]


def flipped(data, rng):
    """`data` with 1 to 16 bits flipped at random places."""
    out = bytearray(data)
    for position in rng.integers(0, 8 * len(data), int(rng.integers(1, 17))):
        out[position // 8] ^= 1 << (position % 8)
    return bytes(out)


OTHER_KINDS = {  # a file of another kind under the damaged file's name
    "png": lambda: png_bytes(),
    "json": lambda: json.dumps({"hidden_size": 32}).encode(),
    "zip": lambda: _zip_bytes(),
    "text": lambda: b"not a weights file\n" * 20,
}


def _zip_bytes():
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as z:
        z.writestr("readme.txt", "a zip archive of something else")
    return buffer.getvalue()


DAMAGE = {"zero-byte": lambda data, rng: b"", "truncated": truncated, "bit-flipped": flipped,
          "wrong-kind": None}  # wrong-kind: one of OTHER_KINDS that the reader does not take


# --------------------------------------------------------------------------
# the file kinds: how to write a good one, which of its files to damage, how to read it
# --------------------------------------------------------------------------
def _h5_as(path, dtype):
    """Rewrites every dataset of the HDF5 file `path` as `dtype`."""
    import h5py

    with h5py.File(path, "r+") as f:
        names = []
        f.visititems(lambda name, obj: names.append(name) if isinstance(obj, h5py.Dataset) else None)
        for name in names:
            value = f[name][()]
            del f[name]
            f.create_dataset(name, data=np.asarray(value).astype(dtype))


def _keras_as(path, dtype):
    """Rewrites the weights inside the .keras archive `path` as `dtype`."""
    folder = os.path.dirname(path)
    with zipfile.ZipFile(path) as archive:
        members = {name: archive.read(name) for name in archive.namelist()}
    weights = os.path.join(folder, "inner.weights.h5")
    with open(weights, "wb") as f:
        f.write(members["model.weights.h5"])
    _h5_as(weights, dtype)
    with open(weights, "rb") as f:
        members["model.weights.h5"] = f.read()
    os.remove(weights)
    with zipfile.ZipFile(path, "w") as archive:
        for name, data in members.items():
            archive.writestr(name, data)


def _npz_as(path, dtype):
    with np.load(path, allow_pickle=False) as f:
        arrays = {k: f[k] for k in f.files}
    with open(path, "wb") as f:
        np.savez(f, **{k: v if v.dtype.kind == "U" else (v * 100).astype(dtype) for k, v in arrays.items()})


def _with_adapters(model):
    keras_vit.enable_lora(model, 2)
    return model


class Kind:
    """One file kind: `write(folder)` writes a good one and returns what the reader is given (a file or a
    folder), `files` the names inside a folder to damage, `read(target, model)` the reader under test,
    `wrong_dtype(target)` turns the good file's arrays into integers, `legit` the OTHER_KINDS it reads."""

    def __init__(self, name, write, read, wrong_dtype=None, files=None, legit=(), prepare=None, model=True):
        self.name, self.write, self.read, self.wrong_dtype = name, write, read, wrong_dtype
        self.files, self.legit = files, legit  # legit: the OTHER_KINDS this kind's reader takes
        self.prepare = prepare or (lambda model: model)  # what the reader needs of the model (compiled, LoRA)
        self.model = model  # False: the reader takes no model (images, ONNX), so the backend plays no part

    def __repr__(self):
        return self.name


def _save_keras(folder):
    path = os.path.join(folder, "model.keras")
    _model(1).save(path)
    return path


def _save_h5(folder):
    path = os.path.join(folder, "model.weights.h5")
    _model(1).save_weights(path)
    return path


def _hf_folder(folder):
    path = os.path.join(folder, "hf")
    os.makedirs(path)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(HF_CONFIG, f)
    write_safetensors(os.path.join(path, "model.safetensors"), hf_tensors())
    return path


def _hf_as_int(path):
    write_safetensors(os.path.join(path, "model.safetensors"),
                      {k: (v * 100).astype("int32") for k, v in hf_tensors().items()}, dtype="I32")


def _lora(folder):
    path = os.path.join(folder, "adapters.lora")
    keras_vit.save_lora(_with_adapters(_model(1)), path)
    return path


def _compiled(model):
    model.compile(optimizer="sgd", loss="mse")
    model.optimizer.build(model.trainable_variables)
    return model


def _backup(folder, lora=False):
    """A TrainingBackup's file (of a LoRA model: its .npz) after one epoch's end."""
    model = _compiled(_with_adapters(_model(1)) if lora else _model(1))
    backup = keras_vit.recipes.TrainingBackup(os.path.join(folder, "backup"))
    backup.set_model(model)
    backup.on_epoch_end(0, {"loss": 1.0})
    return backup.lora_path if lora else backup.path


def _restore(path, model):
    keras_vit.recipes.TrainingBackup(os.path.dirname(path)).restore(model)


def _png(folder):
    path = os.path.join(folder, "photo.png")
    with open(path, "wb") as f:
        f.write(png_bytes())
    return path


def _jpeg(folder):
    from PIL import Image

    path = os.path.join(folder, "photo.jpg")
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (30, 40, 3), dtype=np.uint8)).save(path)
    return path


def _onnx(folder):
    """A one-MatMul ONNX graph (what the int8 tools quantize), written by hand."""
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper, numpy_helper

    weight = numpy_helper.from_array(np.random.default_rng(0).normal(0, 1, (8, 4)).astype("float32"), "w")
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"], name="matmul")], "tiny",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])], [weight])
    path = os.path.join(folder, "model.onnx")
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def _quantize(path, model):
    pytest.importorskip("onnxruntime")
    from keras_vit.export.int8 import _quantize_int8

    _quantize_int8(path, None)


KINDS = [
    Kind("npz", lambda d: save_npz(_model(1), os.path.join(d, "vit.npz")), lambda p, m: keras_vit.load_weights(m, p),
         lambda p: _npz_as(p, "int32")),
    Kind("safetensors", lambda d: write_safetensors(os.path.join(d, "timm.safetensors"), timm_tensors()),
         lambda p, m: keras_vit.load_weights(m, p),
         lambda p: write_safetensors(p, {k: (v * 100).astype("int32") for k, v in timm_tensors().items()}, "I32")),
    Kind("pth", lambda d: write_torch(os.path.join(d, "timm.pth"), timm_tensors()),
         lambda p, m: keras_vit.load_weights(m, p), lambda p: write_torch(p, timm_tensors(), "int32")),
    Kind("bin", lambda d: write_torch(os.path.join(d, "pytorch_model.bin"), timm_tensors()),
         lambda p, m: keras_vit.load_weights(m, p), lambda p: write_torch(p, timm_tensors(), "int64")),
    Kind("keras", _save_keras, lambda p, m: keras_vit.load_weights(m, p), lambda p: _keras_as(p, "int32")),
    Kind("keras-model", _save_keras, lambda p, m: load_keras_model(p), lambda p: _keras_as(p, "int32")),
    Kind("weights.h5", _save_h5, lambda p, m: keras_vit.load_weights(m, p), lambda p: _h5_as(p, "int32")),
    Kind("hf-folder", _hf_folder, lambda p, m: keras_vit.load_weights(m, p), _hf_as_int,
         files=("config.json", "model.safetensors")),
    Kind("hf-build", _hf_folder, lambda p, m: keras_vit.from_huggingface(p), _hf_as_int,
         files=("config.json", "model.safetensors")),
    Kind("keras-hub", lambda d: save_keras_hub_preset(_model(1, approximate_gelu=False), os.path.join(d, "preset")),
         lambda p, m: keras_vit.from_keras_hub(p), lambda p: _h5_as(os.path.join(p, "model.weights.h5"), "int32"),
         files=("config.json", "model.weights.h5")),
    Kind("lora", _lora, lambda p, m: keras_vit.load_lora(m, p), lambda p: _npz_as(p, "int32")),
    Kind("backup", _backup, _restore, lambda p: _h5_as(p, "int32"), prepare=_compiled),
    Kind("lora-backup", lambda d: _backup(d, lora=True), _restore, prepare=lambda m: _compiled(_with_adapters(m))),
    Kind("png", _png, lambda p, m: read_image(p), legit=("png",), model=False),
    Kind("png-resized", _png, lambda p, m: load_image(p, 32), legit=("png",), model=False),
    Kind("jpeg", _jpeg, lambda p, m: read_image(p), legit=("png",), model=False),
]
ONNX = Kind("onnx", _onnx, _quantize, model=False)


def _cases(kinds):
    for kind in kinds:
        for file in kind.files or (None,):
            for damage in DAMAGE:
                for seed in SEEDS if damage != "zero-byte" else SEEDS[:1]:
                    # what a reader makes of the bytes is the same on every backend: the other lanes keep one
                    # seed per damage, for the model left untouched in their variables
                    marks = () if kind.model and seed == SEEDS[0] else pytest.mark.backend_independent
                    yield pytest.param(kind, file, damage, seed, id=f"{kind}-{file or 'file'}-{damage}-{seed}",
                                       marks=marks)


def _numpy(model):
    return [] if model is None else [keras.ops.convert_to_numpy(v).copy() for v in model.weights]


GOOD = {}  # kind name -> its good file or folder, written once per session


@pytest.fixture()
def good(tmp_path, tmp_path_factory):
    """`good(kind)`: a copy in `tmp_path` of the kind's good file or folder."""
    def copy(kind):
        if kind.name not in GOOD:
            GOOD[kind.name] = kind.write(str(tmp_path_factory.mktemp(f"good-{kind}")))
        source = GOOD[kind.name]
        target = str(tmp_path / os.path.basename(source))
        shutil.copytree(source, target) if os.path.isdir(source) else shutil.copyfile(source, target)
        return target
    return copy


def _target_model(kind):
    """The model a reader is given (built as it is, every weight a value a file would replace), or None."""
    return kind.prepare(keras_vit.VisionTransformer(**TINY)) if kind.model else None


def _damage(kind, target, file, damage, seed):
    """Damages the good file (or the file `file` of the good folder) `target`; returns the damaged file's path."""
    named = target if file is None else os.path.join(target, file)
    with open(named, "rb") as f:
        data = f.read()
    rng = np.random.default_rng(seed)
    if damage == "wrong-kind":
        others = sorted(set(OTHER_KINDS) - set(kind.legit))
        data = OTHER_KINDS[others[int(rng.integers(len(others)))]]()
    else:
        data = DAMAGE[damage](data, rng)
    with open(named, "wb") as f:
        f.write(data)
    return named


def _expect_refused(kind, target, named, model, allow_success=False):
    """`kind.read` raises one ValueError naming `named` (or the folder `target`) and leaves `model` as it was;
    with `allow_success`, it may instead read the file whole."""
    before = _numpy(model)
    try:
        kind.read(target, model)
    except ValueError as err:
        message = str(err)
        assert named in message or target in message, f"the error names neither {named} nor {target}: {message}"
    else:
        assert allow_success, f"{kind}: {named} was read without an error"
        return
    after = _numpy(model)
    assert all(np.array_equal(a, b) for a, b in zip(before, after)), f"{kind}: {named} was partly loaded"


def _run(kind, file, damage, seed, target):
    named = _damage(kind, target, file, damage, seed)
    model = _target_model(kind)
    # a flipped bit in a format without a checksum (float data, a JSON digit) may give a file that still reads
    _expect_refused(kind, target, named, model, allow_success=damage == "bit-flipped")


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind, file, damage, seed", list(_cases(KINDS)))
def test_a_damaged_file_is_one_value_error_naming_it_and_the_model_is_untouched(kind, file, damage, seed, good):
    _run(kind, file, damage, seed, good(kind))


@pytest.mark.backend_independent
@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind, file, damage, seed", list(_cases([ONNX])))
def test_a_damaged_onnx_file_given_to_the_int8_quantizer_is_one_value_error(kind, file, damage, seed, good, tmp_path):
    _run(kind, file, damage, seed, good(kind))
    assert os.listdir(tmp_path) == ["model.onnx"]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", [k for k in KINDS if k.wrong_dtype], ids=str)
def test_integer_arrays_where_weights_are_float_are_refused_untouched(kind, good):
    target = good(kind)
    kind.wrong_dtype(target)
    model = _target_model(kind)
    before = _numpy(model)
    with pytest.raises(ValueError, match="not floating point|expected floating point") as err:
        kind.read(target, model)
    assert target in str(err.value)
    assert all(np.array_equal(a, b) for a, b in zip(before, _numpy(model)))


@pytest.mark.backend_independent
@pytest.mark.parametrize("dtype", ["uint16", "float32", "int32"])
def test_images_of_other_sample_types_read_as_8_bit_rgb(dtype, tmp_path):
    """The image readers' 'wrong dtype': 16-bit, float and 32-bit integer samples are converted, not refused."""
    from PIL import Image

    values = np.random.default_rng(0).integers(0, 255, (30, 40)).astype(dtype)
    path = str(tmp_path / "deep.tif")
    Image.fromarray(values).save(path, format="TIFF")
    image = read_image(path)
    assert image.dtype == np.uint8 and image.shape == (30, 40, 3)
    assert load_image(path, 32).shape == (32, 32, 3)
