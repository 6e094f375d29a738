"""A keras_vit ViT as a keras-hub `ViTBackbone` (or, for a DINOv3 model, `DINOV3Backbone`) preset folder
(config.json + model.weights.h5), written with json and h5py alone, so that keras-hub's `from_preset(folder)` builds
the same encoder.

Only what a `ViTBackbone` computes can be written: the paper's layout (no distillation or register
tokens, layer scale, pre-norm, fc_norm, ResNet stem), learned 1-D position embeddings added once, the
exact GELU (keras-hub's ViT has no tanh approximation: the official checkpoints' models, built with
`approximate_gelu=True`, are refused rather than written to a preset that computes something else).
The head and pre-logits are not part of a backbone and are left out.
"""

import json
import os

import keras
import numpy as np

from keras_vit.configs import FAMILY_DEFAULTS
from keras_vit.fileio import atomic_folder, check_free_space, check_writable, full_disk_named, h5_file_bytes
from keras_vit.structure import find_vit
from keras_vit.weights.keras_hub import POSEMB
from keras_vit.weights.npz import official_variables

_EMBED = "layers/vi_t_patching_and_embedding"
_BACKBONE_ONLY = ("head/", "head_dist/", "pre_logits/")
# what save_to_preset writes in a preset folder: what a new preset may replace (anything else is a user's)
PRESET_FILES = ("config.json", "metadata.json", "model.weights.h5", "model.weights.json", "task.json",
                "task.weights.h5", "preprocessor.json", "tokenizer.json", "assets")


def _pairs(num_layers, class_token):
    """(h5 dataset path, official key) of every array of a ViTBackbone, in Keras' layout."""
    pairs = [(f"{_EMBED}/vars/0", "cls")] if class_token else []
    pairs += [(f"{_EMBED}/patch_embedding/vars/0", "embedding/kernel"),
              (f"{_EMBED}/patch_embedding/vars/1", "embedding/bias"),
              (f"{_EMBED}/position_embedding/vars/0", POSEMB)]
    for i in range(num_layers):
        src = "layers/vi_t_encoder/encoder_layers/vi_t_encoder_block" + (f"_{i}" if i else "")
        dst = f"Transformer/encoderblock_{i}/"
        layers = [("layer_norm_1", "LayerNorm_0", "scale"), ("layer_norm_2", "LayerNorm_2", "scale"),
                  *[(f"mha/{name}_dense", f"MultiHeadDotProductAttention_1/{official}", "kernel")
                    for name, official in (("query", "query"), ("key", "key"), ("value", "value"), ("output", "out"))],
                  ("mlp/dense_1", "MlpBlock_3/Dense_0", "kernel"), ("mlp/dense_2", "MlpBlock_3/Dense_1", "kernel")]
        for layer, official, first in layers:
            pairs += [(f"{src}/{layer}/vars/0", f"{dst}{official}/{first}"), (f"{src}/{layer}/vars/1",
                                                                                f"{dst}{official}/bias")]
    return pairs + [("layers/vi_t_encoder/layer_norm/vars/0", "Transformer/encoder_norm/scale"),
                    ("layers/vi_t_encoder/layer_norm/vars/1", "Transformer/encoder_norm/bias")]


_DINO3 = "layers/dinov3_encoder/layers/dinov3_layer"
# a DINOv3 model's family options, as DINOV3Backbone computes them (the others at their defaults)
_DINOV3_FAMILY = ("num_register_tokens", "layer_scale", "prefix_position_embedding", "rope", "mlp_activation")


def _dinov3_pairs(num_layers, gated):
    """(h5 dataset path, official key, how) of every array of a DINOV3Backbone (use_mask_token False): "in" (D, heads,
    head_dim) -> (D, D), "out" (heads, head_dim, D) -> (D, D), "bias" (heads, head_dim) -> (D,), "gate" and "up" the
    two halves of the builder's packed SwiGLU, "same" as it is."""
    embed = "layers/dinov3_embedding"
    pairs = [(f"{embed}/vars/0", "cls", "same"), (f"{embed}/vars/1", "registers", "same"),
             (f"{embed}/patch_embeddings/projection/vars/0", "embedding/kernel", "same"),
             (f"{embed}/patch_embeddings/projection/vars/1", "embedding/bias", "same")]
    for i in range(num_layers):
        src, dst = _DINO3 + (f"_{i}" if i else ""), f"Transformer/encoderblock_{i}/"
        attention = dst + "MultiHeadDotProductAttention_1/"
        pairs += [(f"{src}/{norm}/vars/{j}", f"{dst}{official}/{w}", "same") for norm, official in (
            ("norm1", "LayerNorm_0"), ("norm2", "LayerNorm_2")) for j, w in enumerate(("scale", "bias"))]
        pairs += [(f"{src}/attention/{name}_dense/vars/{j}", f"{attention}{official}/{w}",
                   ("out" if official == "out" else "in") if w == "kernel" else "same" if official == "out" else "bias")
                  for name, official in (("query", "query"), ("key", "key"), ("value", "value"), ("output", "out"))
                  for j, w in enumerate(("kernel", "bias"))]
        mlp = [("gate_proj", "gate"), ("up_proj", "up")] if gated else [("up_proj", "same")]
        pairs += [(f"{src}/mlp/{name}/vars/{j}", f"{dst}MlpBlock_3/Dense_0/{w}", how)
                  for name, how in mlp for j, w in enumerate(("kernel", "bias"))]
        pairs += [(f"{src}/mlp/down_proj/vars/{j}", f"{dst}MlpBlock_3/Dense_1/{w}", "same")
                  for j, w in enumerate(("kernel", "bias"))]
        pairs += [(f"{src}/layer_scale{j + 1}/vars/0", f"{dst}LayerScale_{j}/scale", "same") for j in range(2)]
    return pairs + [(f"layers/layer_normalization/vars/{j}", f"Transformer/encoder_norm/{w}", "same")
                    for j, w in enumerate(("scale", "bias"))]


def _dinov3_array(value, how):
    """One official array in a DINOV3Backbone's layout (`_dinov3_pairs`' `how`)."""
    if how == "in":
        return value.reshape(value.shape[0], -1)
    if how == "out":
        return value.reshape(-1, value.shape[-1])
    if how == "bias":
        return value.reshape(-1)
    if how in ("gate", "up"):
        half = value.shape[-1] // 2
        return value[..., :half] if how == "gate" else value[..., half:]
    return value


def _is_dinov3(family):
    """Whether a ViT of `family` (its builder options) is what a DINOV3Backbone computes."""
    rope = family["rope"] or {}
    same = all(family[k] in (None, v) for k, v in FAMILY_DEFAULTS.items() if k not in _DINOV3_FAMILY)
    return (same and rope.get("kind") == "dinov3" and family["layer_scale"] is not None
            and family["mlp_activation"] in ("gelu", "swiglu") and family["classifier"] in ("token", None))


def _dinov3_config(parts, block):
    h, w = parts.image_size
    gated = block.mlp_activation == "swiglu"
    return {
        "module": "keras_hub.src.models.dinov3.dinov3_backbone", "class_name": "DINOV3Backbone",
        "config": {"name": "dinov3_backbone", "trainable": True,
                   "dtype": {"module": "keras", "class_name": "DTypePolicy", "config": {"name": "float32"},
                             "registered_name": None},
                   "patch_size": parts.embedding.patch_size, "num_layers": parts.num_layers,
                   "hidden_dim": parts.embedding.hidden_size, "num_heads": block.num_heads,
                   "intermediate_dim": block.mlp_dim, "num_register_tokens": int(parts.registers.num_tokens),
                   "use_mask_token": False, "layer_scale_init_value": float(block.layer_scale),
                   "hidden_activation": "silu" if gated else "gelu", "use_gated_mlp": gated, "use_query_bias": True,
                   "use_key_bias": True, "use_value_bias": True, "use_proj_bias": True, "use_mlp_bias": True,
                   "attention_dropout": 0.0, "drop_path_rate": 0.0, "layer_norm_eps": float(block.layer_norm_epsilon),
                   "image_shape": [h, w, 3], "rope_theta": float(block.rope_options["temperature"]),
                   "apply_layernorm": False},
        "registered_name": "keras_hub>DINOV3Backbone",
    }


def _refusal(model, parts):
    """Why the ViT in `model` is no ViTBackbone (None when it is one)."""
    family = parts.family()
    differ = [f"{k}={family[k]!r}" for k, v in FAMILY_DEFAULTS.items() if family[k] not in (None, v)]  # None: untold
    if family["encoder_norm"] is None:  # a feature-map model without the final norm keras-hub's encoder ends in
        differ.append("no encoder_norm (fc_norm, or none)")
    block = parts.blocks[0]
    if parts.resnet is not None:
        differ.append("a ResNet stem")
    if family["classifier"] == "map":
        differ.append("classifier='map'")
    if block.approximate_gelu:
        differ.append("approximate_gelu=True (keras-hub's ViT computes the exact GELU; build with "
                      "approximate_gelu=False)")
    if differ:
        return f"model {model.name!r} is no keras-hub ViTBackbone: " + ", ".join(differ)
    return None


def save_keras_hub_preset(model, preset_dir):
    """Writes the encoder of the ViT in `model` as a keras-hub `ViTBackbone` preset folder.

    The folder holds config.json, metadata.json and model.weights.h5, as `save_to_preset` writes
    them; keras-hub loads it with `keras_hub.models.ViTBackbone.from_preset(preset_dir)` (keras-vit
    with `from_keras_hub`). The backbone returns the token sequence after the final LayerNorm; the
    model's head and pre-logits are not written. Raises ValueError, before writing anything, for a
    model a ViTBackbone cannot compute (see the module docstring), and before anything is written a place that cannot
    be written (`check_writable`) or a disk without room for it (OSError ENOSPC). The folder is written whole beside its
    place, then renamed: a preset already there is replaced in one step, and a folder holding other files
    than a preset's is refused (FileExistsError). Returns `preset_dir`.
    """
    import h5py

    preset_dir = os.fspath(preset_dir)
    check_writable(preset_dir, "the keras-hub preset folder", folder=True)
    parts = find_vit(model)
    dinov3 = _is_dinov3(parts.family()) and parts.registers is not None and not parts.blocks[0].approximate_gelu
    why = None if dinov3 else _refusal(model, parts)
    if why:
        raise ValueError(why + "; nothing was written")
    variables = {k: v for k, v in official_variables(model).items() if not k.startswith(_BACKBONE_ONLY)}
    class_token = parts.cls is not None
    pairs = _dinov3_pairs(parts.num_layers, parts.blocks[0].mlp_activation == "swiglu") if dinov3 else [
        (path, key, "table" if key == POSEMB else "same") for path, key in _pairs(parts.num_layers, class_token)]
    extra = sorted(set(variables) - {key for _, key, _ in pairs})
    missing = sorted({key for _, key, _ in pairs} - set(variables))
    if extra or missing:
        raise ValueError(f"model {model.name!r} is no keras-hub ViTBackbone (another position embedding?): "
                         f"parameters without a place in one: {extra[:6]}, parameters of one it lacks: {missing[:6]}; "
                         "nothing was written")
    block = parts.blocks[0]
    h, w = parts.image_size
    config = _dinov3_config(parts, block) if dinov3 else {
        "module": "keras_hub.src.models.vit.vit_backbone", "class_name": "ViTBackbone",
        "config": {"name": "vi_t_backbone", "trainable": True,
                   "dtype": {"module": "keras", "class_name": "DTypePolicy", "config": {"name": "float32"},
                             "registered_name": None},
                   "image_shape": [h, w, 3], "patch_size": [parts.embedding.patch_size] * 2,
                   "num_layers": parts.num_layers, "num_heads": block.num_heads,
                   "hidden_dim": parts.embedding.hidden_size, "mlp_dim": block.mlp_dim, "dropout_rate": 0.0,
                   "attention_dropout": 0.0, "layer_norm_epsilon": float(block.layer_norm_epsilon),
                   "use_mha_bias": True, "use_mlp_bias": True, "use_class_token": class_token,
                   "use_patch_bias": True},
        "registered_name": "keras_hub>ViTBackbone",
    }
    count = int(sum(np.prod(v.shape) for v in variables.values()))
    metadata = {"keras_version": keras.__version__, "parameter_count": count, "written_by": "keras_vit"}
    # the whole folder at once: a preset it replaces stays whole until the new one is, and a task's files
    # of an earlier preset there (task.json, task.weights.h5) do not outlive it beside the new backbone
    what = f"the keras-hub preset {os.path.abspath(preset_dir)}"
    check_free_space(preset_dir, h5_file_bytes(variables.values()), what)  # before h5py writes (see fileio)
    with full_disk_named(preset_dir, what), atomic_folder(preset_dir, replaceable=PRESET_FILES) as folder:
        with h5py.File(os.path.join(folder, "model.weights.h5"), "w") as f:
            for path, key, how in pairs:
                value = np.asarray(keras.ops.convert_to_numpy(variables[key]), np.float32)
                # the table is (N, D) in keras-hub
                f.create_dataset(path, data=value[0] if how == "table" else _dinov3_array(value, how))
        for name, value in (("config.json", config), ("metadata.json", metadata)):
            with open(os.path.join(folder, name), "w") as f:
                json.dump(value, f, indent=4)
    return preset_dir
