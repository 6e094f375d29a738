"""The contexts to build and compile a model in for `fit` over several devices: `model_parallel` (JAX,
Keras' `ModelParallel` with `vit_layout_map`) and `data_parallel` (JAX `DataParallel`, TensorFlow
`MirroredStrategy`), and how many parts a global batch is split into under them. torch has no
distribution in Keras: these refuse it with the ways that remain."""

import contextlib

import keras

from keras_vit.distribute.layout import BATCH_AXIS, MODEL_AXIS, CheckedModelParallel, vit_layout_map


def refuse_torch(what):
    """Raise the NotImplementedError that says `what` has no torch distribution, and what to do instead."""
    raise NotImplementedError(
        f"{what} covers the jax and tensorflow backends: Keras {keras.__version__} has no distribution for "
        "'torch', so model.fit and the keras_vit recipes train on one device there. To train on several "
        "devices or processes, set KERAS_BACKEND=jax or tensorflow (the same code and weights); or write "
        "your own torch training loop around the Keras model with torch.nn.parallel.DistributedDataParallel "
        "under torchrun (keras.io's guide 'Multi-GPU distributed training with PyTorch'; it bypasses fit "
        "and the recipes)"
    )


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
    backend = keras.backend.backend()
    if backend != "jax":
        if backend == "torch":
            refuse_torch("model_parallel()")
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
    keras.distribution.set_distribution(CheckedModelParallel(
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
    backend = keras.backend.backend()
    if backend == "jax":
        keras.distribution.set_distribution(keras.distribution.DataParallel(
            devices=_devices(devices), auto_shard_dataset=auto_shard_dataset))
        return contextlib.nullcontext()
    if backend == "tensorflow":
        import tensorflow as tf

        return tf.distribute.MirroredStrategy(devices=devices).scope()
    refuse_torch("data_parallel()")


def num_replicas():
    """How many parts a global batch is split into under the current distribution."""
    backend = keras.backend.backend()
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
