"""keras-hub preset folders (what `save_to_preset` writes: config.json, model.weights.h5, and for a task
task.json + task.weights.h5) of the ViT family -> official ViT keys, the architecture read from the JSON.

The folder is read with h5py and json alone (keras-hub is not imported). Keras writes a model's weights
under the path of the attribute that holds each layer, named after its class (`layers/vi_t_encoder/
encoder_layers/vi_t_encoder_block_1/mha/query_dense/vars/0`), and the arrays are already in Keras'
layout, which is the official one (per-head q/k/v kernels), so the key map is mostly renaming.

config.json `class_name` -> what keras-vit builds of it:

    ViTBackbone          the paper's ViT (exact GELU, LayerNorm epsilon from the config); the backbone's
                         output is the token sequence, keras-vit's model returns the pooled class token
                         (`pooling=None`: the patch tokens)
    ViTImageClassifier   (task.json) the backbone plus its head: pre-logits (intermediate_dim) and
                         the classifier, pooled by "token" or, without a class token, "gap"
    CLIPVisionEncoder    the CLIP image tower: a LayerNorm before block 0, QuickGELU, epsilon 1e-5,
                         no patch bias (a zero one)
    SigLIPVisionEncoder  the SigLIP image tower: no class token, the tanh GELU, an attention-pooling (MAP)
                         head, whose output is the encoder's
    DINOV2Backbone       layer scale on both branches, register tokens (no position embedding), the SwiGLU
                         MLP with use_swiglu_ffn; built at its image_shape with the position embeddings the
                         model adds there (`interpolated_position_embeddings`)
    DINOV3Backbone       DINOv3's rotary position embedding (rope_theta), layer scale, registers, the key
                         projection's missing bias as zero, the gated SiLU MLP (use_gated_mlp) as SwiGLU
"""

import json
import os
import re

import numpy as np

from keras_vit.weights.heads import BACKBONE, CLASSIFIER
from keras_vit.weights.keras_hub_keys import COMPILED, POSEMB, by_head, rename_embedding  # noqa: F401 (POSEMB: the
# writer's)

MODEL_WEIGHTS, TASK_WEIGHTS = "model.weights.h5", "task.weights.h5"
SHARDED = "model.weights.json"

# config.json class_name -> (what it is, the image processor's scaling as `keras_vit.preprocess_input`'s mode)
BACKBONES = {
    "ViTBackbone": ("a ViT", "vit"),
    "CLIPVisionEncoder": ("a CLIP vision tower", "clip"),
    "SigLIPVisionEncoder": ("a SigLIP vision tower", "vit"),
    "DINOV2Backbone": ("a DINOv2 ViT", "imagenet"),
    "DINOV3Backbone": ("a DINOv3 ViT", "imagenet"),
}
# what a backbone's config.json must hold (the rest has keras-hub's defaults)
REQUIRED = {"ViTBackbone": ("image_shape", "patch_size", "num_layers", "num_heads", "hidden_dim", "mlp_dim"),
            "CLIPVisionEncoder": ("patch_size", "hidden_dim", "num_layers", "num_heads", "intermediate_dim"),
            "SigLIPVisionEncoder": ("patch_size", "hidden_dim", "num_layers", "num_heads", "intermediate_dim"),
            "DINOV2Backbone": ("patch_size", "hidden_dim", "num_layers", "num_heads", "intermediate_dim"),
            "DINOV3Backbone": ("patch_size", "hidden_dim", "num_layers", "num_heads", "intermediate_dim")}
# SigLIPVisionEncoder's intermediate_activation -> approximate_gelu
SIGLIP_GELUS = {"gelu_approximate": True, "gelu": False}
# task.json class_name -> its backbone's class
TASKS = {"ViTImageClassifier": "ViTBackbone"}
# keras-hub classes of the same neighbourhood that keras-vit does not build -> why
OTHERS = {
    "CLIPBackbone": "a whole CLIP model (image and text towers); save its vision_encoder as a preset",
    "CLIPTextEncoder": "a CLIP text tower",
    "SigLIPBackbone": "a whole SigLIP model (image and text towers); save its vision_encoder as a preset",
    "SigLIP2Backbone": "a whole SigLIP 2 model",
    "DeiTBackbone": "a DeiT ViT (not read yet)",
}


def _accepted():
    return ", ".join([*BACKBONES, *TASKS])


def _read_json(path):
    try:
        with open(path) as f:
            value = json.load(f)
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"{path} is not a readable JSON keras-hub config: {err}") from None
    if not isinstance(value, dict) or not isinstance(value.get("config"), dict):
        raise ValueError(f"{path} is not a keras-hub config (a JSON object with class_name and config)")
    return value


def is_preset(path):
    """True for a folder whose config.json is a serialised keras-hub object (`registered_name` "keras_hub>...")."""
    config = os.path.join(os.fspath(path), "config.json")
    if not (os.path.isdir(path) and os.path.exists(config)):
        return False
    try:
        with open(config) as f:
            value = json.load(f)
    except (OSError, json.JSONDecodeError, UnicodeDecodeError):
        return False
    return isinstance(value, dict) and (str(value.get("registered_name", "")).startswith("keras_hub>")
                                        or str(value.get("module", "")).startswith("keras_hub."))


def _array(name, dataset):
    """A float32 (or the file's dtype) numpy array of one h5 dataset; Keras' bfloat16 arrays are widened."""
    value = np.asarray(dataset[()])
    if dataset.attrs.get("dtype") == "bfloat16" or value.dtype.kind == "V" and value.dtype.itemsize == 2:
        return (value.view("<u2").astype(np.uint32) << 16).view(np.float32)
    return value


def read_h5(path):
    """{path inside the file: array} of every variable of a Keras `.weights.h5`, read with h5py."""
    import h5py

    if not os.path.exists(path):
        raise FileNotFoundError(f"weights file not found: {path}")
    if not h5py.is_hdf5(path):
        raise ValueError(f"{path} is not a readable Keras weights file (expected HDF5 as model.save_weights "
                         f"writes it; truncated or corrupt?): {os.path.getsize(path)} bytes of something else")
    arrays = {}
    try:
        with h5py.File(path, "r") as f:
            f.visititems(lambda name, obj: arrays.__setitem__(name, _array(name, obj))
                         if isinstance(obj, h5py.Dataset) else None)
    except (OSError, ValueError, KeyError, RuntimeError, TypeError) as err:
        raise ValueError(f"{path} is not a readable Keras weights file (truncated or corrupt?): {err}") from None
    return arrays


def read_preset(folder):
    """(backbone config, task config or None, {"model/<h5 path>" | "task/<h5 path>": array}) of a preset folder.

    Refuses, before any array is read, a class keras-vit does not build (naming it and the accepted
    ones) and a sharded preset."""
    folder = os.fspath(folder)
    backbone = _read_json(os.path.join(folder, "config.json"))
    kind = backbone.get("class_name")
    if kind not in BACKBONES:
        what = OTHERS.get(kind, f"class {kind!r}")
        raise ValueError(f"{folder} is a keras-hub preset of {what} ({kind}); keras_vit reads {_accepted()}")
    task = None
    if os.path.exists(os.path.join(folder, "task.json")):
        task = _read_json(os.path.join(folder, "task.json"))
        if task.get("class_name") not in TASKS:
            raise ValueError(f"{folder}: task.json holds a {task.get('class_name')!r} task; keras_vit reads the "
                             f"tasks {', '.join(TASKS)} (or a backbone alone: save `task.backbone.save_to_preset`)")
        if TASKS[task["class_name"]] != kind:
            raise ValueError(f"{folder}: a {task['class_name']} task over a {kind}; expected a "
                             f"{TASKS[task['class_name']]}")
    weights = os.path.join(folder, MODEL_WEIGHTS)
    if not os.path.exists(weights):
        if os.path.exists(os.path.join(folder, SHARDED)):
            raise ValueError(f"{folder} holds sharded weights ({SHARDED}); keras_vit reads a single {MODEL_WEIGHTS}")
        raise FileNotFoundError(f"{folder} has a keras-hub config.json but no {MODEL_WEIGHTS}")
    tensors = {f"model/{k}": v for k, v in read_h5(weights).items()}
    if task is not None:
        head = os.path.join(folder, TASK_WEIGHTS)
        if not os.path.exists(head):
            raise FileNotFoundError(f"{folder} has a task.json but no {TASK_WEIGHTS} (the head's weights)")
        tensors |= {f"task/{k}": v for k, v in read_h5(head).items()}
    return backbone, task, tensors


def _task_denses(tensors):
    """The task's Dense layers in the order Keras named them (`dense`, `dense_1`, ...): [(name, kernel, bias)]."""
    found = {}
    for key, value in tensors.items():
        match = re.fullmatch(r"task/layers/(dense(?:_(\d+))?)/vars/([01])", key)
        if match:
            found.setdefault((int(match.group(2) or 0), match.group(1)), {})[match.group(3)] = value
    return [(name, parts.get("0"), parts.get("1")) for (_, name), parts in sorted(found.items())]


def _pair(value):
    return tuple(int(v) for v in value) if isinstance(value, (list, tuple)) else (int(value), int(value))


def _image_size(cfg):
    shape = cfg.get("image_shape") or (224, 224, 3)
    if cfg.get("data_format") == "channels_first":
        channels, h, w = shape
    else:
        h, w, channels = shape
    if channels != 3:
        raise ValueError(f"image_shape {list(shape)}: keras_vit builds models of 3-channel images, got {channels}")
    return int(h), int(w)


def architecture(backbone, task, tensors):
    """Builder arguments of the model a preset holds, plus `pre_logits` (a task's pre-logits layer, of width
    `representation_size`), `classifier_activation` (the task's own: None is logits), `source_head`,
    `position_interpolation` and `input_mode` (as `keras_vit.weights.hf.architecture`)."""
    kind, cfg = backbone["class_name"], backbone["config"]
    missing = [k for k in REQUIRED[kind] if k not in cfg]
    if missing:
        raise ValueError(f"config.json of a {kind} without {', '.join(missing)}: not a config save_to_preset wrote")
    patch = _pair(cfg["patch_size"])
    if patch[0] != patch[1]:
        raise ValueError(f"a {kind} of patch_size {list(patch)}; the builder's patches are square")
    arch = dict(
        patch_size=patch[0], hidden_size=int(cfg["hidden_dim"]), num_heads=int(cfg["num_heads"]),
        num_layers=int(cfg["num_layers"]), resnet=None, classifier="token", classes=None,
        image_size=_image_size(cfg), pre_logits=False, distillation_token=False, num_register_tokens=0,
        prefix_position_embedding=True, layer_scale=None, fc_norm=False, input_mode=BACKBONES[kind][1],
        position_interpolation="bilinear",  # keras-hub does not resize them: the paper's rule
    )
    arch.update(_family_arguments(kind, cfg))
    arch["source_head"] = BACKBONE  # a backbone returns its tokens: keras-vit's model, the pooled representation
    if task is not None:
        arch.update(_task_arguments(task, arch["classifier"], tensors))
    return arch


def _family_arguments(kind, cfg):
    """The builder arguments that the backbone class `kind` (of config `cfg`) sets its own way: the MLP, the
    LayerNorms, the pooling, DINOv2's layer scale, registers, position interpolation and drop_path_rate."""
    if kind == "ViTBackbone":
        return dict(mlp_dim=int(cfg["mlp_dim"]), approximate_gelu=False,
                    layer_norm_epsilon=float(cfg.get("layer_norm_epsilon", 1e-6)), pre_norm=False,
                    mlp_activation="gelu", classifier="token" if cfg.get("use_class_token", True) else "gap")
    if kind == "SigLIPVisionEncoder":
        act = cfg.get("intermediate_activation", "gelu_approximate")
        epsilon = float(cfg.get("layer_norm_epsilon", 1e-6))
        if act not in SIGLIP_GELUS:
            raise ValueError(f"a SigLIPVisionEncoder with intermediate_activation {act!r}; keras_vit builds "
                             f"{', '.join(map(repr, SIGLIP_GELUS))}")
        if epsilon != 1e-6:  # its final LayerNorm keeps 1e-6 whatever the config says; keras-vit's share one
            raise ValueError(f"a SigLIPVisionEncoder of layer_norm_epsilon {epsilon:g}: its final LayerNorm's is "
                             "1e-6 and keras-vit's LayerNorms share one epsilon; keras_vit reads 1e-6")
        return dict(mlp_dim=int(cfg["intermediate_dim"]), approximate_gelu=SIGLIP_GELUS[act],
                    layer_norm_epsilon=epsilon, pre_norm=False, mlp_activation="gelu", classifier="map")
    if kind == "DINOV3Backbone":
        gated, act = bool(cfg.get("use_gated_mlp", False)), cfg.get("hidden_activation", "gelu")
        if act != ("silu" if gated else "gelu"):
            raise ValueError(f"a DINOV3Backbone of hidden_activation {act!r}{' (gated)' if gated else ''}; keras_vit "
                             "builds 'gelu' and, with use_gated_mlp, 'silu' (SwiGLU)")
        return dict(mlp_dim=int(cfg["intermediate_dim"]), approximate_gelu=False, pre_norm=False,
                    layer_norm_epsilon=float(cfg.get("layer_norm_eps", 1e-5)), mlp_activation="swiglu" if gated else "gelu",
                    layer_scale=float(cfg.get("layer_scale_init_value", 1.0)),
                    num_register_tokens=int(cfg.get("num_register_tokens", 4)),
                    drop_path_rate=float(cfg.get("drop_path_rate", 0.0)), position_embedding="none",
                    rope={"kind": "dinov3", "temperature": float(cfg.get("rope_theta", 100.0))})
    if kind == "DINOV2Backbone":
        swiglu = bool(cfg.get("use_swiglu_ffn", False))
        width = int(cfg["intermediate_dim"])
        return dict(mlp_dim=(int(width * 2 / 3) + 7) // 8 * 8 if swiglu else width, approximate_gelu=False,
                    layer_norm_epsilon=1e-6, pre_norm=False, mlp_activation="swiglu" if swiglu else "gelu",
                    layer_scale=float(cfg.get("layer_scale_init_value", 1.0)),
                    num_register_tokens=int(cfg.get("num_register_tokens", 0)),
                    drop_path_rate=float(cfg.get("drop_path_rate", 0.0)),  # keras-hub's every block's
                    position_interpolation="bicubic")  # keras-vit's (torch's); keras-hub resizes with Keras' bicubic
    # CLIPVisionEncoder
    act = cfg.get("intermediate_activation", "quick_gelu")
    if act not in ("quick_gelu", "gelu"):
        raise ValueError(f"a CLIPVisionEncoder with intermediate_activation {act!r}; keras_vit builds "
                         "'quick_gelu' and 'gelu'")
    if cfg.get("intermediate_output_index") is not None:
        raise ValueError("a CLIPVisionEncoder with intermediate_output_index (two outputs); save one without it")
    return dict(mlp_dim=int(cfg["intermediate_dim"]), approximate_gelu=False, layer_norm_epsilon=1e-5,
                pre_norm=True, mlp_activation=act)


def _task_arguments(task, classifier, tensors):
    """The builder arguments of an image classifier task (task.json's `task`, its Dense layers in `tensors`)
    over a backbone pooling by `classifier`: its classes, pre-logits and activation."""
    tcfg = task["config"]
    if "num_classes" not in tcfg:
        raise ValueError(f"task.json of a {task['class_name']} without num_classes")
    pooling = tcfg.get("pooling", "token")
    if pooling != classifier:
        has = "a class token" if classifier == "token" else "no class token"
        raise ValueError(f"a {task['class_name']} of pooling {pooling!r} over a backbone with {has}; keras_vit "
                         "pools the class token ('token') of a backbone with one and the mean of the tokens "
                         "('gap') of one without")
    activation = tcfg.get("activation")
    if activation is not None and not isinstance(activation, str):
        raise ValueError(f"a {task['class_name']} whose activation is {activation!r}; expected None or a name")
    denses = _task_denses(tensors)
    pre = tcfg.get("intermediate_dim")
    if len(denses) != 1 + (pre is not None):
        raise ValueError(f"{TASK_WEIGHTS} holds {len(denses)} Dense layers ({', '.join(d[0] for d in denses)}); "
                         f"a {task['class_name']} with intermediate_dim={pre} has {1 + (pre is not None)}")
    return dict(classes=int(tcfg["num_classes"]), pre_logits=pre is not None, classifier_activation=activation,
                representation_size=None if pre is None else int(pre), source_head=CLASSIFIER)


def _zero_bias(key, kernel):
    """The zero bias of a layer built without one (use_mha_bias / use_mlp_bias / use_patch_bias False)."""
    per_head = re.search(r"/(query|key|value)/kernel$", key)
    return np.zeros(kernel.shape[1:] if per_head else kernel.shape[-1:], kernel.dtype)


def _gather(table, ids):
    """The (1, N, D) position embeddings that a table (1, T, D) indexed by `position_ids` (1, N) gives."""
    ids = np.asarray(ids).reshape(-1)
    if not np.issubdtype(ids.dtype, np.integer) or ids.size and not 0 <= ids.min() <= ids.max() < table.shape[1]:
        raise ValueError(f"position_ids must be integers in [0, {table.shape[1]}), got {ids.dtype} "
                         f"{ids.min() if ids.size else ''}..{ids.max() if ids.size else ''}")
    return table[:, ids]


def to_official(backbone):
    """The mapping function of a preset whose config.json is `backbone`: (tensors, num_heads) -> (official
    arrays, unmapped keys)."""
    kind = backbone["class_name"]

    def mapping(tensors, num_heads):
        arrays, unmapped, ids, gates = {}, [], None, {}
        tensors = rename_embedding(kind, tensors, backbone["config"])
        for key, value in tensors.items():
            if key.startswith("task/"):
                continue
            for pattern, template, how in COMPILED[kind]:
                match = pattern.match(key)
                if match:
                    if how == "ids":
                        ids = value
                    if how in ("ids", "ignore"):
                        break
                    block = str(int(match.group(1) or 0)) if pattern.groups else ""
                    official = template.format(block)
                    if how == "gate":  # packed before the up projection below (the builder's SwiGLU)
                        gates[official] = value
                        break
                    arrays[official] = value[None] if how == "table" else value.reshape(1, 1, -1) \
                        if how == "token" else by_head(official, value, num_heads) if how == "heads" else value
                    break
            else:
                unmapped.append(key)
        for official, gate in gates.items():
            arrays[official] = np.concatenate([gate, arrays[official]], axis=-1)
        if ids is not None and POSEMB in arrays:
            arrays[POSEMB] = _gather(arrays[POSEMB], ids)
        denses = _task_denses(tensors)
        if denses:
            names = ["pre_logits", "head"][-len(denses):]
            for name, (_, kernel, bias) in zip(names, denses):
                arrays[f"{name}/kernel"] = kernel
                if bias is not None:
                    arrays[f"{name}/bias"] = bias
            unmapped += [k for k in tensors if k.startswith("task/") and not re.match(
                r"task/(layers/dense(_\d+)?/vars/[01]|optimizer/)", k)]
        for key in [k for k in arrays if k.endswith("/kernel")]:
            bias = key[: -len("kernel")] + "bias"
            if bias not in arrays and arrays[key] is not None:
                arrays[bias] = _zero_bias(key, arrays[key])
        return arrays, unmapped

    return mapping
