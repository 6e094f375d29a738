"""How a keras_vit model's parameters are split over a device mesh's "model" axis (Megatron-style tensor
parallelism of every encoder block): the mesh's axis names, `vit_layout_map`, and the `ModelParallel`
that refuses, as each variable is created, a split the mesh cannot make."""

import keras

BATCH_AXIS, MODEL_AXIS = "batch", "model"

# (regex over a variable's path, the dimension sharded over the model axis, what that dimension is).
# Encoder block i: q/k/v kernels (D, heads, head_dim) and biases (heads, head_dim) over heads, so
# each device attends with its own heads; the output kernel (heads, head_dim, D) over heads on its
# input side, so the attention output is one all-reduce. MLP: Dense_0 (D, mlp) by columns with its
# bias, Dense_1 (mlp, D) by rows: one all-reduce per MLP. The pre-logits Dense (D, R) by columns
# and the head (R or D, classes) by rows: one all-reduce of (B, classes), and a 21k-class head is
# not held whole on every device. Everything else is replicated: LayerNorms, the class token,
# position embeddings and output biases are small; the patch embedding (P*P*3 x D, a few percent of
# a /32 model, less of the others) would cost an all-gather of every token before the first
# LayerNorm split by columns, and by rows needs a model axis dividing P*P*3 (588 for ViT-H/14);
# a hybrid's ResNet convolutions keep the batch split only. Of the ViT family's parameters, DeiT's
# head_dist is split as the head; a SigLIP attention-pool head's q/k/v/out are not (one probe token:
# little to gain), its MLP is split as the blocks'; distillation and register tokens, layer scales and
# the extra LayerNorms are replicated.
_PREFIX = r"(?:.*/)?"
_SPLITS = (
    (_PREFIX + r"MultiHeadDotProductAttention_1/(?:query|key|value)/kernel", 1, "heads"),
    (_PREFIX + r"MultiHeadDotProductAttention_1/(?:query|key|value)/bias", 0, "heads"),
    (_PREFIX + r"MultiHeadDotProductAttention_1/out/kernel", 0, "heads"),
    (_PREFIX + r"Dense_0/kernel", 1, "MLP width"),
    (_PREFIX + r"Dense_0/bias", 0, "MLP width"),
    (_PREFIX + r"Dense_1/kernel", 0, "MLP width"),
    (_PREFIX + r"pre_logits/kernel", 1, "representation size"),
    (_PREFIX + r"pre_logits/bias", 0, "representation size"),
    (_PREFIX + r"head(?:_dist)?/kernel", 0, "head input width"),
)
_RANKS = (3, 2, 3, 2, 1, 2, 2, 1, 2)


def vit_layout_map(device_mesh, model_axis=MODEL_AXIS):
    """A `keras.distribution.LayoutMap` splitting any keras_vit model over `model_axis`.

    Covers every variant, hybrids, "token"/"gap" pooling and pre-logits (the variables are
    matched by their layer names, also inside an enclosing model). Split over the model axis:
    attention q/k/v kernels and biases over heads, the attention output kernel over heads on its
    input side, MLP `Dense_0` by columns and `Dense_1` by rows (one all-reduce per attention and
    one per MLP), pre-logits by columns and the head by rows. LayerNorms, class token, position
    embeddings, the patch embedding and a hybrid's ResNet are replicated.

    Args:
        device_mesh: a `keras.distribution.DeviceMesh` with an axis named `model_axis`.
        model_axis: the mesh axis the parameters are split over.
    Returns:
        A `LayoutMap` for `keras.distribution.ModelParallel(layout_map=...)`. The model axis must
        divide the heads and the MLP width: `model_parallel()` checks that for each variable as it
        is created, before anything is compiled.
    """
    if model_axis not in device_mesh.axis_names:
        raise ValueError(
            f"vit_layout_map: the device mesh has axes {list(device_mesh.axis_names)}; expected one "
            f"named {model_axis!r} to split the parameters over"
        )
    layout_map = keras.distribution.LayoutMap(device_mesh)
    for (pattern, dim, _), rank in zip(_SPLITS, _RANKS):
        axes = [None] * rank
        axes[dim] = model_axis
        layout_map[pattern] = tuple(axes)
    return layout_map


def _split_dimension(path):
    import re

    for pattern, dim, what in _SPLITS:
        if re.fullmatch(pattern, path):
            return dim, what
    return None


class CheckedModelParallel(keras.distribution.ModelParallel):
    """`ModelParallel` that refuses, as each variable is created, a split the mesh cannot make."""

    def get_variable_layout(self, variable):
        layout = super().get_variable_layout(variable)
        for dim, axis in enumerate(layout.axes):
            if axis is None:
                continue
            size = self.device_mesh.shape[list(self.device_mesh.axis_names).index(axis)]
            if variable.shape[dim] % size:
                what = (_split_dimension(variable.path) or (dim, f"dimension {dim}"))[1]
                fits = [d for d in range(1, variable.shape[dim] + 1) if variable.shape[dim] % d == 0]
                raise ValueError(
                    f"model_parallel: the mesh's {axis!r} axis has {size} devices, which does not divide "
                    f"the {what} ({variable.shape[dim]}) of {variable.path!r} (shape {tuple(variable.shape)}); "
                    f"expected a {axis!r} axis that divides {variable.shape[dim]} ({', '.join(map(str, fits))})"
                )
        return layout
