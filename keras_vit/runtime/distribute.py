"""Data-parallel training across the local accelerators, through the backends' own machinery:
Keras's distribution API on JAX (`keras.distribution.DataParallel`) and `tf.distribute` on
TensorFlow (`MirroredStrategy`). PyTorch users run one process per device (torchrun) instead.
"""

import contextlib

import keras


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
    backend = keras.backend.backend()
    if backend == "jax":
        keras.distribution.set_distribution(keras.distribution.DataParallel(devices=devices))
        return contextlib.nullcontext()
    if backend == "tensorflow":
        import tensorflow as tf

        return tf.distribute.MirroredStrategy(devices=devices).scope()
    raise NotImplementedError(
        f"data_parallel() covers the jax and tensorflow backends; on {backend!r} run one process "
        "per device (torchrun) with torch.nn.parallel.DistributedDataParallel"
    )


def num_replicas():
    """How many devices a global batch is split over under the current distribution."""
    backend = keras.backend.backend()
    if backend == "jax":
        dist = keras.distribution.distribution()
        return 1 if dist is None else int(dist.device_mesh.devices.size)
    if backend == "tensorflow":
        import tensorflow as tf

        return tf.distribute.get_strategy().num_replicas_in_sync
    return 1
