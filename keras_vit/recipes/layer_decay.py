"""Layer-wise learning-rate decay (BEiT, MAE, DINOv2; timm's `layer_decay`): block i of a depth-L encoder
learns at `decay ** (L - i)` times the base rate, the embeddings at `decay ** (L + 1)`, the head at the
base rate; applied per variable inside Keras' SGD and AdamW."""

import re

import keras

from keras_vit.recipes.checks import _check_positive_float

# top-level layers of a keras-vit model below the first block: the patch embedding and what joins it
_EMBEDDING_LAYERS = ("rescale", "resnet", "embedding", "posembed_input", "cls", "dist", "registers", "pre_norm")
_BLOCK = re.compile(r"(?:encoderblock|posembed)_(\d+)$")


def check_layer_decay(value):
    """`value` as a float in (0, 1], or None (no decay); a ValueError otherwise."""
    if value is None:
        return None
    value = _check_positive_float("layer_decay", value)
    if value > 1:
        raise ValueError(f"`layer_decay` must be in (0, 1] (1 is no decay); got {value}.")
    return value


def layer_ids(model):
    """{variable path: layer id} for the trainable variables of a keras-vit `model`, timm's numbering:
    0 for the embeddings, i + 1 for encoder block i, depth + 1 for everything after the encoder
    (final norm, pooling head, classifier); and the depth."""
    blocks = [int(m.group(1)) for layer in model.layers if (m := _BLOCK.match(layer.name))]
    if not blocks:
        raise ValueError(f"layer-wise learning-rate decay needs a keras-vit encoder; model {model.name!r} has no "
                         "layer named encoderblock_<i>")
    depth = max(blocks) + 1
    ids = {}
    for layer in model.layers:
        match = _BLOCK.match(layer.name)
        layer_id = int(match.group(1)) + 1 if match else 0 if layer.name in _EMBEDDING_LAYERS else depth + 1
        for variable in layer.trainable_variables:
            ids.setdefault(variable.path, layer_id)
    return ids, depth


def layer_decay_scales(model, decay):
    """{variable path: learning-rate multiplier} `decay ** (depth + 1 - layer id)` for `model`'s
    trainable variables (see `layer_ids`): 1 for the head, `decay` for the last block,
    `decay ** (depth + 1)` for the embeddings."""
    decay = check_layer_decay(decay)
    ids, depth = layer_ids(model)
    return {path: decay ** (depth + 1 - layer_id) for path, layer_id in ids.items()}


class _LayerDecay:
    """Per-variable learning-rate multipliers (`scales`: variable path -> multiplier, 1 where absent)
    on a Keras optimizer: each variable's update step, decoupled weight decay included, runs at its
    multiple of the scheduled rate. On torch this takes Keras' per-variable update path instead of its
    fused `_foreach` one."""

    def __init__(self, *args, scales=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.scales = {str(k): float(v) for k, v in (scales or {}).items()}
        # decoupled weight decay moves into update_step, where the variable's multiplier is known
        self.decoupled_weight_decay, self.weight_decay = self.weight_decay, None

    def build(self, variables):
        super().build(variables)
        self._variable_scales = [self.scales.get(v.path, 1.0) for v in variables]

    def update_step(self, gradient, variable, learning_rate):
        scale = self._variable_scales[self._get_variable_index(variable)]
        learning_rate = keras.ops.cast(learning_rate, variable.dtype) * scale
        if self.decoupled_weight_decay and self._use_weight_decay(variable):
            decay = keras.ops.cast(self.decoupled_weight_decay, variable.dtype)
            variable.assign(variable - variable * decay * learning_rate)
        return super().update_step(gradient, variable, learning_rate)

    def get_config(self):
        config = super().get_config()
        config["weight_decay"] = self.decoupled_weight_decay
        return {**config, "scales": self.scales}


@keras.saving.register_keras_serializable(package="keras_vit")
class LayerDecaySGD(_LayerDecay, keras.optimizers.SGD):
    """`keras.optimizers.SGD` with per-variable learning-rate multipliers.

    Args:
        *args: as `keras.optimizers.SGD`.
        scales: {variable path: multiplier} (`layer_decay_scales`); variables not named get 1.
        **kwargs: as `keras.optimizers.SGD`.
    """


@keras.saving.register_keras_serializable(package="keras_vit")
class LayerDecayAdamW(_LayerDecay, keras.optimizers.AdamW):
    """`keras.optimizers.AdamW` with per-variable learning-rate multipliers, decoupled weight decay
    scaled with them (as a per-group learning rate scales it in torch's AdamW).

    Args:
        *args: as `keras.optimizers.AdamW`.
        scales: {variable path: multiplier} (`layer_decay_scales`); variables not named get 1.
        **kwargs: as `keras.optimizers.AdamW`.
    """
