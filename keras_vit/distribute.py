"""Scaling out through the backends' own machinery, nothing home-made.

JAX: Keras's distribution API. `data_parallel()` (`keras.distribution.DataParallel`: batches split
over the devices, variables replicated) and `model_parallel()` (`keras.distribution.ModelParallel`
with `vit_layout_map`: Megatron-style tensor parallelism of every encoder block, batches split
over the mesh's "batch" axis). Several hosts: `initialize_multihost()` first.
TensorFlow: `tf.distribute`; `tf_strategy()` picks TPUStrategy, MultiWorkerMirroredStrategy,
MirroredStrategy or the default strategy for the machine, and `data_parallel()` is a
MirroredStrategy scope. PyTorch users run one process per device (torchrun) instead.
"""

import collections
import contextlib
import glob
import json
import os

import keras

BATCH_AXIS, MODEL_AXIS = "batch", "model"

__all__ = ["BATCH_AXIS", "MODEL_AXIS", "check_batch_size", "data_parallel", "initialize_multihost",
           "model_parallel", "num_replicas", "parse_mesh", "probe_machine", "process_shard", "strategy_kind",
           "tf_strategy", "vit_layout_map"]

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


def _backend():
    return keras.backend.backend()


def _refuse_torch(what):
    raise NotImplementedError(
        f"{what} covers the jax and tensorflow backends; on 'torch' run one process per device "
        "(torchrun) with torch.nn.parallel.DistributedDataParallel"
    )


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


class _CheckedModelParallel(keras.distribution.ModelParallel):
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


def _devices(devices):
    found = keras.distribution.list_devices()
    if devices is None:
        return found
    devices = list(devices)
    missing = [d for d in devices if d not in found]
    if missing:
        raise ValueError(f"devices {missing} are not among this machine's devices {found}")
    return devices


def parse_mesh(text):
    """"BxM" (e.g. "2x4") -> (2, 4); raises a ValueError naming the expected form.

    Args:
        text: the mesh as "BxM": batch and model devices.
    """
    try:
        batch, model = (int(v) for v in str(text).lower().split("x"))
    except ValueError:
        raise ValueError(f"mesh must be 'BxM' (batch x model devices, e.g. '2x4'), got {text!r}") from None
    if batch < 1 or model < 1:
        raise ValueError(f"mesh must be 'BxM' with positive sizes, got {text!r}")
    return batch, model


def model_parallel(mesh_shape=None, devices=None, auto_shard_dataset=True):
    """A context to build and compile a model in for model-parallel `fit` (JAX backend).

    Sets the global Keras distribution to `keras.distribution.ModelParallel` over a
    ("batch", "model") device mesh with `vit_layout_map`: each batch is split over the "batch"
    axis, every encoder block's parameters (and so their gradients and optimizer state) over
    the "model" axis. Variables are created sharded: no device ever holds the whole model.

    Args:
        mesh_shape: (batch, model), e.g. (2, 4) for 8 devices; its product must equal the number
            of devices. None: (1, number of devices).
        devices: device names (e.g. ["tpu:0", ...]); None takes every device (on several hosts,
            every host's: call `initialize_multihost()` first).
        auto_shard_dataset: on several hosts, let Keras split each `tf.data` batch between the
            hosts; False when each host already reads its own part (`keras_vit.data.load` with
            `process_index`/`process_count`).
    Returns:
        A context manager (the distribution stays set after it, as `data_parallel()`'s does).
    Raises:
        ValueError, before anything is built, for a mesh that does not fit the devices; while the
        model is built (before compile), for a model axis that does not divide the heads or the
        MLP width. NotImplementedError on the tensorflow and torch backends.

    Example:
        with keras_vit.distribute.model_parallel((2, 4)):
            model = keras_vit.ViT_H14(weights="imagenet21k", classes=10)
            keras_vit.recipes.compile_for_finetuning(model, total_steps=10_000)
        model.fit(train_ds, ...)
    """
    backend = _backend()
    if backend != "jax":
        if backend == "torch":
            _refuse_torch("model_parallel()")
        raise NotImplementedError(
            "model_parallel() runs on the jax backend (Keras ModelParallel); on tensorflow use "
            "data_parallel() or tf_strategy()"
        )
    devices = _devices(devices)
    if mesh_shape is None:
        mesh_shape = (1, len(devices))
    mesh_shape = tuple(int(v) for v in mesh_shape)
    if len(mesh_shape) != 2 or min(mesh_shape) < 1 or mesh_shape[0] * mesh_shape[1] != len(devices):
        raise ValueError(
            f"model_parallel: mesh_shape {mesh_shape} (batch x model) does not fit the {len(devices)} "
            f"devices; expected two positive sizes whose product is {len(devices)}, e.g. (1, {len(devices)})"
        )
    mesh = keras.distribution.DeviceMesh(mesh_shape, (BATCH_AXIS, MODEL_AXIS), devices)
    keras.distribution.set_distribution(_CheckedModelParallel(
        layout_map=vit_layout_map(mesh), batch_dim_name=BATCH_AXIS, auto_shard_dataset=auto_shard_dataset))
    return contextlib.nullcontext()


def data_parallel(devices=None):
    """A context to build and compile a model in for data-parallel `fit` over `devices`.

    Args:
        devices: device names (e.g. ["gpu:0", "gpu:1"]); None takes every local device.
    Returns:
        A context manager. On JAX it sets the global Keras distribution (batches are split over the
        devices, variables replicated); on TensorFlow it is a `MirroredStrategy` scope, and the
        model must be built and compiled inside it; on torch it raises.

    Example:
        with keras_vit.distribute.data_parallel():
            model = keras_vit.ViT_B16(weights="imagenet21k", classes=10)
            keras_vit.recipes.compile_for_finetuning(model, total_steps=10_000)
        model.fit(train_ds, ...)
    """
    backend = _backend()
    if backend == "jax":
        keras.distribution.set_distribution(keras.distribution.DataParallel(devices=_devices(devices)))
        return contextlib.nullcontext()
    if backend == "tensorflow":
        import tensorflow as tf

        return tf.distribute.MirroredStrategy(devices=devices).scope()
    _refuse_torch("data_parallel()")


def num_replicas():
    """How many parts a global batch is split into under the current distribution."""
    backend = _backend()
    if backend == "jax":
        dist = keras.distribution.distribution()
        return 1 if dist is None else int(dist.num_model_replicas)
    if backend == "tensorflow":
        import tensorflow as tf

        return tf.distribute.get_strategy().num_replicas_in_sync
    return 1


def check_batch_size(batch_size, what="batch size"):
    """Raise a ValueError unless the current distribution's replicas divide `batch_size`.

    Args:
        batch_size: the global batch.
        what: how the error names it.

    Returns:
        The batch per replica.
    """
    replicas = num_replicas()
    if batch_size % replicas:
        raise ValueError(
            f"the {what} ({batch_size}) must be divisible by the {replicas} replicas the batch is split "
            f"over (the mesh's batch axis); expected a multiple of {replicas}, e.g. "
            f"{max(replicas, batch_size // replicas * replicas)}"
        )
    return batch_size // replicas


# --------------------------------------------------------------------------
# several hosts
# --------------------------------------------------------------------------
def initialize_multihost(coordinator=None, num_processes=None, process_id=None):
    """Join this process to a multi-host run, before anything else touches the devices.

    JAX: `keras.distribution.initialize()` (on a Cloud TPU VM slice every argument may stay None;
    on GPU hosts pass the coordinator "host:port" of process 0, the number of processes and this
    process's id, or set KERAS_DISTRIBUTION_JOB_ADDRESSES / _NUM_PROCESSES / _PROCESS_ID).
    TensorFlow: nothing to do here: set TF_CONFIG on every worker and use `tf_strategy()`.

    Args:
        coordinator: "host:port" of process 0 (None on a Cloud TPU slice or from the variables).
        num_processes: the number of processes (hosts).
        process_id: this process's index.

    Returns:
        (process_index, process_count): which part of each global batch this host reads
        (`keras_vit.data.load(..., process_index=..., process_count=...)`).
    """
    backend = _backend()
    if backend == "jax":
        import jax

        keras.distribution.initialize(coordinator, num_processes, process_id)
        return jax.process_index(), jax.process_count()
    if backend == "tensorflow":
        return 0, 1
    _refuse_torch("initialize_multihost()")


def process_shard():
    """(process_index, process_count) of this host in the current JAX run ((0, 1) elsewhere)."""
    if _backend() == "jax":
        import jax

        return jax.process_index(), jax.process_count()
    return 0, 1


# --------------------------------------------------------------------------
# TensorFlow
# --------------------------------------------------------------------------
Machine = collections.namedtuple("Machine", ["tpu", "gpus", "tf_config"])
Machine.__doc__ = """What `tf_strategy` looks at: `tpu` a TPUClusterResolver address ("local" on a TPU VM,
the TPU name on a TPU node) or None; `gpus` the local GPU count; `tf_config` the parsed TF_CONFIG or None."""


def probe_machine():
    """The `Machine` this process runs on (no device is initialised)."""
    tpu = os.environ.get("TPU_NAME") or ("local" if glob.glob("/dev/accel*") or glob.glob("/dev/vfio/[0-9]*") else None)
    import tensorflow as tf

    text = os.environ.get("TF_CONFIG")
    return Machine(tpu, len(tf.config.list_physical_devices("GPU")), json.loads(text) if text else None)


def strategy_kind(machine):
    """"tpu", "multi_worker", "mirrored" or "default": the tf.distribute strategy for `machine`."""
    if machine.tpu:
        return "tpu"
    if machine.tf_config and machine.tf_config.get("cluster", {}).get("worker"):
        return "multi_worker"
    if machine.gpus > 1:
        return "mirrored"
    return "default"


def tf_strategy(machine=None):
    """The `tf.distribute` strategy for this machine, to build and compile a model in its scope.

    - a TPU (a TPU VM, or TPU_NAME set): `TPUStrategy` over a connected `TPUClusterResolver`;
    - TF_CONFIG naming a worker cluster: `MultiWorkerMirroredStrategy`;
    - several GPUs: `MirroredStrategy`;
    - otherwise the default strategy (one device).

    Args:
        machine: a `Machine` to decide for (tests pass a fake); None probes this one.
    Example:
        strategy = keras_vit.distribute.tf_strategy()
        with strategy.scope():
            model = keras_vit.ViT_B16(weights="imagenet21k", classes=10)
            keras_vit.recipes.compile_for_finetuning(model, total_steps=10_000, steps_per_execution=32)
    """
    if _backend() != "tensorflow":
        raise NotImplementedError(
            f"tf_strategy() is for the tensorflow backend, got {_backend()!r}; use data_parallel() "
            "or model_parallel()"
        )
    import tensorflow as tf

    machine = probe_machine() if machine is None else machine
    kind = strategy_kind(machine)
    if kind == "tpu":
        resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu=machine.tpu)
        tf.config.experimental_connect_to_cluster(resolver)
        tf.tpu.experimental.initialize_tpu_system(resolver)
        return tf.distribute.TPUStrategy(resolver)
    if kind == "multi_worker":
        return tf.distribute.MultiWorkerMirroredStrategy()
    if kind == "mirrored":
        return tf.distribute.MirroredStrategy()
    return tf.distribute.get_strategy()
