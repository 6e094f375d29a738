"""Scaling out through the backends' own machinery, nothing home-made.

JAX: Keras's distribution API. `data_parallel()` (`keras.distribution.DataParallel`: batches split
over the devices, variables replicated) and `model_parallel()` (`keras.distribution.ModelParallel`
with `vit_layout_map`: Megatron-style tensor parallelism of every encoder block, batches split
over the mesh's "batch" axis). Several processes (hosts): `initialize_multihost()` first; then each
process passes its own rows of every global batch (`process_rows()` cuts them from arrays,
`process_shard()` says which part to give `keras_vit.data.load`).
TensorFlow: `tf.distribute`; `tf_strategy()` picks TPUStrategy, MultiWorkerMirroredStrategy,
MirroredStrategy or the default strategy for the machine, and `data_parallel()` is a
MirroredStrategy scope. torch: Keras 3 has no distribution for this backend, and these helpers refuse it.
"""

import collections
import contextlib
import glob
import json
import os

import keras

BATCH_AXIS, MODEL_AXIS = "batch", "model"

__all__ = ["BATCH_AXIS", "MODEL_AXIS", "check_batch_size", "data_parallel", "initialize_multihost",
           "model_parallel", "num_replicas", "parse_mesh", "probe_machine", "process_rows", "process_shard",
           "strategy_kind", "tf_strategy", "vit_layout_map"]

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
        f"{what} covers the jax and tensorflow backends: Keras {keras.__version__} has no distribution for "
        "'torch', so model.fit and the keras_vit recipes train on one device there. To train on several "
        "devices or processes, set KERAS_BACKEND=jax or tensorflow (the same code and weights); or write "
        "your own torch training loop around the Keras model with torch.nn.parallel.DistributedDataParallel "
        "under torchrun (keras.io's guide 'Multi-GPU distributed training with PyTorch'; it bypasses fit "
        "and the recipes)"
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


def model_parallel(mesh_shape=None, devices=None, auto_shard_dataset=False):
    """A context to build and compile a model in for model-parallel `fit` (JAX backend).

    Sets the global Keras distribution to `keras.distribution.ModelParallel` over a
    ("batch", "model") device mesh with `vit_layout_map`: each batch is split over the "batch"
    axis, every encoder block's parameters (and so their gradients and optimizer state) over
    the "model" axis. Variables are created sharded: no device ever holds the whole model.

    On several processes (after `initialize_multihost()`), each process gives `fit`, `evaluate` and
    `predict` its own rows of every global batch: those its devices hold along the "batch" axis
    (`process_rows()` cuts them from arrays; `keras_vit.data.load(..., *process_shard())` reads them),
    with a batch size of the global batch over the number of parts (`process_shard()[1]`). Keras puts
    the processes' rows together into the global batch. When a mesh row spans several processes (a
    "batch" axis smaller than the process count), the processes of a row pass the same rows.

    Args:
        mesh_shape: (batch, model), e.g. (2, 4) for 8 devices; its product must equal the number
            of devices. None: (1, number of devices).
        devices: device names (e.g. ["tpu:0", ...]); None takes every device (on several hosts,
            every host's: call `initialize_multihost()` first).
        auto_shard_dataset: False (default): each process passes its own rows, as above. True: Keras
            cuts each process's rows from a `tf.data.Dataset` of whole global batches that every
            process reads (other inputs are then refused on several processes).
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


def data_parallel(devices=None, auto_shard_dataset=False):
    """A context to build and compile a model in for data-parallel `fit` over `devices`.

    On several processes (JAX, after `initialize_multihost()`), each process gives `fit`, `evaluate`
    and `predict` its own rows of every global batch, with a batch size of the global batch over the
    process count: `process_rows()` cuts them from arrays, `keras_vit.data.load(...,
    process_index=i, process_count=n)` reads them (`i, n = process_shard()`), a `PyDataset` yields
    them. Keras puts the processes' rows together into the global batch, so the run equals one
    process holding every device.

    Args:
        devices: device names (e.g. ["gpu:0", "gpu:1"]); None takes every device (on JAX over several
            processes, every process's).
        auto_shard_dataset: JAX on several processes: False (default) each process passes its own
            rows, as above; True: Keras cuts each process's rows from a `tf.data.Dataset` of whole
            global batches that every process reads (other inputs are then refused).
    Returns:
        A context manager. On JAX it sets the global Keras distribution (batches are split over the
        devices, variables replicated); on TensorFlow it is a `MirroredStrategy` scope (one machine;
        several use `tf_strategy()` with TF_CONFIG), and the model must be built and compiled inside
        it; on torch it raises.

    Example:
        with keras_vit.distribute.data_parallel():
            model = keras_vit.ViT_B16(weights="imagenet21k", classes=10)
            keras_vit.recipes.compile_for_finetuning(model, total_steps=10_000)
        model.fit(train_ds, ...)
    """
    backend = _backend()
    if backend == "jax":
        keras.distribution.set_distribution(keras.distribution.DataParallel(
            devices=_devices(devices), auto_shard_dataset=auto_shard_dataset))
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
    process's id, or set KERAS_DISTRIBUTION_JOB_ADDRESSES / _NUM_PROCESSES / _PROCESS_ID, as
    `python -m keras_vit.launch` does). One process (`num_processes` or KERAS_DISTRIBUTION_NUM_PROCESSES
    1) joins nothing. CPU devices talk through gloo (JAX's default CPU collectives).
    TensorFlow: nothing to do here: set TF_CONFIG on every worker and use `tf_strategy()`.

    Args:
        coordinator: "host:port" of process 0 (None on a Cloud TPU slice or from the variables).
        num_processes: the number of processes (hosts).
        process_id: this process's index.

    Returns:
        (process_index, process_count). Under `data_parallel()` that is the part of each global batch
        this process passes (`keras_vit.data.load(..., process_index=..., process_count=...)`); under
        `model_parallel()` ask `process_shard()` once the distribution is set.
    """
    backend = _backend()
    if backend == "jax":
        import jax

        count = num_processes if num_processes is not None else os.environ.get("KERAS_DISTRIBUTION_NUM_PROCESSES")
        if count is not None and int(count) == 1:
            return 0, 1
        keras.distribution.initialize(coordinator, num_processes, process_id)
        return jax.process_index(), jax.process_count()
    if backend == "tensorflow":
        return 0, 1
    _refuse_torch("initialize_multihost()")


def _local_rows(batch_size):
    """[start, stop) of the rows of a global batch of `batch_size` that this process's devices hold
    under the current JAX distribution (the whole batch without one)."""
    import jax

    dist = keras.distribution.distribution()
    if dist is None or jax.process_count() == 1:
        return 0, batch_size
    layout = dist.get_data_layout((batch_size,)).backend_layout
    mine = {index[0].indices(batch_size)[:2] for device, index in layout.devices_indices_map((batch_size,)).items()
            if device.process_index == jax.process_index()}
    starts, stops = sorted(a for a, _ in mine), sorted(b for _, b in mine)
    if any(b != a for a, b in zip(stops, starts[1:])):
        raise ValueError(f"process {jax.process_index()}'s devices hold rows {sorted(mine)} of each global batch, "
                         "not one contiguous part; expected a device mesh whose batch axis lists the devices "
                         "process by process (as keras.distribution.list_devices() orders them)")
    return starts[0], stops[-1]


def process_shard():
    """(index, count): which part of every global batch this process passes (JAX; (0, 1) elsewhere).

    Under `data_parallel()`, (process index, process count). Under `model_parallel()`, the part of the
    mesh's "batch" axis that this process's devices hold: (process index, process count) when every
    process holds whole rows of the mesh, fewer parts when a row spans several processes (with a
    (1, N) mesh every process passes the whole batch: (0, 1)). Without a distribution, the process
    index and count. Give it to `keras_vit.data.load(..., process_index=index, process_count=count)`;
    each process's batch size is then the global batch over `count`.
    """
    if _backend() != "jax":
        return 0, 1
    import jax

    if keras.distribution.distribution() is None or jax.process_count() == 1:
        return jax.process_index(), jax.process_count()
    parts = len(keras.distribution.list_devices())
    start, stop = _local_rows(parts)
    return start // (stop - start), parts // (stop - start)


def process_rows(data, batch_size):
    """This process's rows of every global batch of `batch_size` in `data`, to give `fit`/`evaluate`.

    Every process holds the same `data` (a numpy array or a tuple, list or dict of them, the same
    length along the first axis); each keeps rows `[i * b, (i + 1) * b)` of every global batch, `b =
    batch_size // count` with `(i, count) = process_shard()`, and of a last, smaller batch its part
    the same way. Pass the result with `batch_size=b`: Keras puts the processes' rows back together
    into the global batches. With one process, `data` unchanged.

    Args:
        data: arrays whose first axis runs over the examples.
        batch_size: the global batch.
    Raises:
        ValueError: `batch_size` (or a last partial batch) not divisible by the part count.
    """
    import numpy as np

    index, count = process_shard()
    if count == 1:
        return data
    if batch_size % count:
        raise ValueError(f"process_rows: the global batch ({batch_size}) must be divisible by the {count} parts it "
                         f"is split into over the processes; expected a multiple of {count}")
    rows = batch_size // count

    def cut(array):
        array = np.asarray(array)
        whole = len(array) // batch_size * batch_size
        tail = len(array) - whole
        if tail % count:
            raise ValueError(f"process_rows: the last batch has {tail} rows ({len(array)} rows in batches of "
                             f"{batch_size}), not divisible by the {count} parts; expected a row count whose "
                             f"remainder by {batch_size} is a multiple of {count}")
        body = array[:whole].reshape(-1, batch_size, *array.shape[1:])[:, index * rows:(index + 1) * rows]
        part = tail // count
        rest = array[whole + index * part:whole + (index + 1) * part]
        return np.concatenate([body.reshape(-1, *array.shape[1:]), rest])

    return keras.tree.map_structure(cut, data)


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
        return _multi_worker_strategy()
    if kind == "mirrored":
        return tf.distribute.MirroredStrategy()
    return tf.distribute.get_strategy()


def _multi_worker_strategy():
    """`MultiWorkerMirroredStrategy` whose `reduce` takes what Keras' TensorFlow `fit` gives it.

    Keras reduces its first (x, y) batch with `strategy.reduce` to build the model symbolically, and
    each step's logs (scalars) with `strategy.reduce("MEAN", value, axis=0)`; the multi-worker
    strategy's collective reduce takes one value only ("Attempt to convert a value (PerReplica ...) to a
    Tensor") and no axis of a scalar ("Invalid reduction dimension 0 for input with 0 dimensions").
    Here each value of a nest is reduced on its own, in the same order on every worker, a scalar over the
    replicas (its mean or sum, as `MirroredStrategy` gives it), and a type the collectives do not take
    (uint8 images) as float32."""
    import tensorflow as tf

    collective = (tf.bfloat16, tf.float16, tf.float32, tf.float64, tf.int32, tf.int64)

    class MultiWorkerMirroredStrategy(tf.distribute.MultiWorkerMirroredStrategy):
        def reduce(self, reduce_op, value, axis):
            def one(v):
                local = self.experimental_local_results(v)[0]
                rank = getattr(getattr(local, "shape", None), "rank", None)
                axis_ = None if rank == 0 else axis
                reduce = super(MultiWorkerMirroredStrategy, self).reduce
                dtype = getattr(local, "dtype", None)
                if dtype is None or dtype in collective:
                    return reduce(reduce_op, v, axis_)
                # uint8 images (the recipes' default input): the collectives take no such type
                return tf.cast(reduce(reduce_op, self.run(lambda t: tf.cast(t, tf.float32), args=(v,)), axis_), dtype)

            return tf.nest.map_structure(one, value)

    return MultiWorkerMirroredStrategy()
