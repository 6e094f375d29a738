"""Where the TFDS fine-tuning recipe (`keras_vit.recipes.finetune`) runs: joining a run of several processes,
their barrier and the saving one process does alone, the distribution context of --distribute, and the
images per train step over the replicas (with the gradient accumulation that makes up --batch-size)."""

import contextlib
import json
import os

from keras_vit.recipes.finetune_args import several_processes


def join_processes():
    """Join a run of several processes (`python -m keras_vit.launch`, a cluster's launcher) before anything
    touches the devices; returns this process's index (0 for a run of one)."""
    if not several_processes():
        return 0
    import keras

    if keras.backend.backend() == "jax":
        from keras_vit import distribute

        return distribute.initialize_multihost()[0]
    return int(json.loads(os.environ["TF_CONFIG"]).get("task", {}).get("index", 0))


@contextlib.contextmanager
def saving_alone():
    """Lets one process of several save: Keras' saving builds a throwaway optimizer, whose variables a JAX
    distribution over several processes would create with a check that takes every process; without the
    distribution they are this process's own. The model's own variables, replicated, are read as they are."""
    import keras

    if not (several_processes() and keras.backend.backend() == "jax"):
        yield
        return
    distribution = keras.distribution.distribution()
    keras.distribution.set_distribution(None)
    try:
        yield
    finally:
        keras.distribution.set_distribution(distribution)


def wait_for_every_process(what):
    """A barrier of the JAX processes of a several-process run (nothing otherwise); `what` names it."""
    import keras

    if several_processes() and keras.backend.backend() == "jax":
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices(what)


def distribution(args):
    """The context to build and compile in for --distribute of the parsed flags `args` (refusing a mesh
    that does not fit)."""
    from keras_vit import distribute

    if args.distribute == "none":
        return contextlib.nullcontext()
    try:
        if args.distribute == "model":
            mesh = distribute.parse_mesh(args.mesh) if args.mesh else None
            return distribute.model_parallel(mesh, auto_shard_dataset=False)
        import keras

        if keras.backend.backend() == "tensorflow":
            return distribute.tf_strategy().scope()
        return distribute.data_parallel()
    except ValueError as e:
        raise SystemExit(f"error: --distribute {args.distribute}: {e}") from None


def step_batch(args):
    """Images per train step over all replicas of the parsed flags `args`; sets args.replicas and
    args.accumulation (refuses what does not divide)."""
    from keras_vit import distribute, recipes

    replicas = distribute.num_replicas()
    per_device = args.device_batch_size
    args.replicas = replicas
    if per_device is None:
        try:
            distribute.check_batch_size(args.batch_size, "--batch-size")
        except ValueError as e:
            raise SystemExit(f"error: {e}") from None
        images = args.batch_size
    else:
        images = per_device * replicas
    try:
        args.accumulation = recipes.gradient_accumulation_steps(args.batch_size, images)
    except ValueError as e:
        raise SystemExit(
            f"error: --batch-size {args.batch_size} is not a multiple of --device-batch-size {per_device} x "
            f"{replicas} replicas = {images} images per step: {e}") from None
    return images
