"""Where the TFDS fine-tuning recipe (`keras_vit.recipes.finetune`) and `keras-vit finetune DIR`
(`keras_vit.recipes.own_images_processes`) run: joining a run of several processes, their barrier, what process
0 alone computes and sends to the others, the saving it does alone (its backups), the distribution context of
--distribute, and the images per train step over the replicas (with the gradient accumulation that makes up
--batch-size)."""

import contextlib
import json
import os

from keras_vit.recipes.finetune_args import several_processes


def join_processes():
    """Join a run of several processes (the launcher's: `keras_vit.distribute.launchers`) before anything
    touches the devices; returns this process's index (0 for a run of one). TensorFlow: a step of `srun`
    becomes TF_CONFIG (`strategies.slurm_tf_config`), which the workers' strategy reads, and every worker but
    the first waits until the first can be reached (`launchers.wait_for_coordinator`); `mpiexec` is refused."""
    from keras_vit.distribute import launchers

    launch = launchers.detect()
    if launch is None:
        return 0
    import keras

    from keras_vit import distribute

    if keras.backend.backend() == "jax":
        distribute.initialize_multihost()
    elif keras.backend.backend() == "tensorflow" and launch.launcher == "mpi":
        raise ValueError(f"mpiexec started {launch.count} processes on the tensorflow backend, whose workers are "
                         "named by TF_CONFIG (or by srun): set KERAS_BACKEND=jax, or TF_CONFIG for each process")
    elif keras.backend.backend() == "tensorflow":
        if launch.launcher == "slurm":
            from keras_vit.distribute.strategies import slurm_tf_config

            os.environ["TF_CONFIG"] = json.dumps(slurm_tf_config())
        workers = json.loads(os.environ.get("TF_CONFIG") or "{}").get("cluster", {}).get("worker", [None])
        launchers.wait_for_coordinator(launch, workers[0])  # the workers' leader, before their strategy waits on it
    return process_index()


@contextlib.contextmanager
def saving_alone():
    """Lets one process of several save: Keras' saving builds a throwaway optimizer, whose variables a JAX
    distribution over several processes would create with a check that takes every process; without the
    distribution they are this process's own. The model's own variables, replicated, are read as they are."""
    import keras

    if several_processes() and keras.backend.backend() == "tensorflow":
        with _tf_alone():
            yield
        return
    if not (several_processes() and keras.backend.backend() == "jax"):
        yield
        return
    distribution = keras.distribution.distribution()
    keras.distribution.set_distribution(None)
    try:
        yield
    finally:
        keras.distribution.set_distribution(distribution)


@contextlib.contextmanager
def _tf_alone():
    """Without the global TensorFlow strategy that `keras-vit finetune DIR` sets on several workers (none set,
    as in the recipe, which builds in a strategy's scope: nothing changes)."""
    import tensorflow as tf

    if not tf.distribute.has_strategy():
        yield
        return
    strategy = tf.distribute.get_strategy()
    tf.distribute.experimental_set_strategy(None)
    try:
        yield
    finally:
        tf.distribute.experimental_set_strategy(strategy)


def backup(folder):
    """A `keras_vit.recipes.TrainingBackup` into `folder`, kept at the end; on several processes the one writer
    (process 0, the only one given it as a callback) writes it alone (`saving_alone`), and all restore from it."""
    from keras_vit import recipes

    class Backup(recipes.TrainingBackup):
        def on_epoch_end(self, epoch, logs=None):
            with saving_alone():
                super().on_epoch_end(epoch, logs)

    return Backup(folder, delete_on_end=False)


def first_process_value(make):
    """`make()`, a JSON-able value, computed by process 0 alone and sent to every process of a run of several
    (JAX processes, or TensorFlow workers under a global strategy; the others never call `make`); a ValueError
    or OSError that `make` raises on process 0 is raised on every process, so that none waits for the others.
    One process: `make()`."""
    if not several_processes():
        return make()
    import numpy as np

    error, blob, first = None, b"", process_index() == 0
    if first:
        try:
            sent = {"value": make()}
        except (ValueError, OSError) as err:
            error, sent = err, {"error": str(err)}
        blob = json.dumps(sent).encode()
    size = int(_from_first(np.array([len(blob)], np.int32), first)[0])
    data = np.zeros(size, np.uint8)
    data[:len(blob)] = np.frombuffer(blob, np.uint8)
    sent = json.loads(_from_first(data, first).tobytes())
    if error is not None:
        raise error
    if "error" in sent:
        raise ValueError(f"(process 0) {sent['error']}")
    return sent["value"]


def processes_where(flag):
    """The indices of the processes whose `flag` is true, each passing its own: a collective every process of
    a run of several reaches (JAX's all-gather, or a sum over the workers of the global TensorFlow strategy);
    on one process [0] or []."""
    count = several_processes()
    if not count:
        return [0] if flag else []
    import keras
    import numpy as np

    mine = np.zeros(count, np.int32)
    mine[process_index()] = int(bool(flag))
    if keras.backend.backend() == "jax":
        from jax.experimental import multihost_utils

        every = np.asarray(multihost_utils.process_allgather(mine)).sum(axis=0)
    else:
        import tensorflow as tf

        strategy, local = tf.distribute.get_strategy(), tf.constant(mine)
        every = np.asarray(strategy.reduce("SUM", strategy.run(lambda: tf.identity(local)), axis=None))
    return [i for i in range(count) if every[i]]


def process_index():
    """This process's index in a run of several (0 for a run of one): JAX's, or TF_CONFIG's task index."""
    import keras

    if not several_processes():
        return 0
    if keras.backend.backend() == "jax":
        import jax

        return jax.process_index()
    return int(json.loads(os.environ["TF_CONFIG"]).get("task", {}).get("index", 0))


def _from_first(array, first):
    """Process 0's numpy `array` (uint8 or int32) on every process (each passes one of the same shape and dtype;
    `first`: this is process 0): JAX's broadcast, or a sum over the workers of the global TensorFlow strategy,
    the others passing zeros (as int32: its collectives take no uint8)."""
    import keras
    import numpy as np

    if keras.backend.backend() == "jax":
        from jax.experimental import multihost_utils

        return np.asarray(multihost_utils.broadcast_one_to_all(array, is_source=first))
    import tensorflow as tf

    strategy = tf.distribute.get_strategy()
    mine = tf.constant((array if first else np.zeros_like(array)).astype(np.int32))
    return np.asarray(strategy.reduce("SUM", strategy.run(lambda: tf.identity(mine)), axis=None)).astype(array.dtype)


def wait_for_every_process(what):
    """A barrier of the processes of a several-process run (nothing otherwise): JAX's, or on TensorFlow a sum over
    the workers of the global strategy (`own_images_processes.join` sets one; none set: nothing); `what` names
    it."""
    import keras

    if several_processes() and keras.backend.backend() == "jax":
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices(what)
    elif several_processes() and keras.backend.backend() == "tensorflow":
        import numpy as np
        import tensorflow as tf

        if tf.distribute.has_strategy():
            _from_first(np.zeros(1, np.int32), process_index() == 0)  # every worker has come here


def run_written():
    """Waits, on several processes, until process 0 has written the run: none leaves before. On TensorFlow a
    worker that has left stops its heartbeats, and once `strategies.HEARTBEAT_TIMEOUT_S` has passed (process 0
    still evaluating, saving or exporting) the coordination service declares it crashed: process 0 then logs
    "The tasks have crashed" and any collective of its fails. Then, on TensorFlow, process 0 is set to leave last
    (`keras_vit.distribute.leave_last_at_exit`)."""
    import keras

    wait_for_every_process("the run is written")
    if several_processes() and keras.backend.backend() == "tensorflow":
        from keras_vit.distribute import strategies

        strategies.leave_last_at_exit()


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
