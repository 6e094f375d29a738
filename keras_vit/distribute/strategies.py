"""TensorFlow's `tf.distribute` strategy for the machine: what `tf_strategy` looks at (`Machine`,
`probe_machine`), the kind it picks (`strategy_kind`: TPU, several workers, several GPUs or one
device), a `MultiWorkerMirroredStrategy` whose `reduce` takes what Keras' `fit` gives it, and its workers'
leader leaving last at exit (`leave_last_at_exit`)."""

import atexit
import collections
import json
import os
import socket
import time

import keras

Machine = collections.namedtuple("Machine", ["tpu", "gpus", "tf_config"])
Machine.__doc__ = """What `tf_strategy` looks at: `tpu` a TPUClusterResolver address ("local" on a TPU VM,
the TPU name on a TPU node) or None; `gpus` the local GPU count; `tf_config` the parsed TF_CONFIG or None."""


def probe_machine():
    """The `Machine` this process runs on (no device is initialised)."""
    from keras_vit.distribute.launchers import tpu_address

    tpu = tpu_address()
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
    if keras.backend.backend() != "tensorflow":
        raise NotImplementedError(
            f"tf_strategy() is for the tensorflow backend, got {keras.backend.backend()!r}; use data_parallel() "
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

    _coordination_service()
    return MultiWorkerMirroredStrategy()


def slurm_tf_config():
    """TF_CONFIG (a dict) for this task of a step of SLURM's `srun`, laid out by TensorFlow's own
    `SlurmClusterResolver`: the step's tasks as workers, each node's on consecutive ports from
    `launchers.slurm_port`, this task the worker of its SLURM_PROCID. The GPUs are left as SLURM gives them
    (one task per node sees all of the node's; `--gpus-per-task` its own)."""
    import tensorflow as tf
    from tensorflow.python.distribute.cluster_resolver.slurm_cluster_resolver import expand_tasks_per_node

    from keras_vit.distribute import launchers

    per_node = max(expand_tasks_per_node(os.environ["SLURM_STEP_TASKS_PER_NODE"]))
    resolver = tf.distribute.cluster_resolver.SlurmClusterResolver(
        port_base=launchers.slurm_port(os.environ), gpus_per_node=per_node, gpus_per_task=1, auto_set_gpu=False)
    cluster = resolver.cluster_spec().as_dict()
    return {"cluster": cluster, "task": {"type": resolver.task_type, "index": resolver.task_id}}


HEARTBEAT_TIMEOUT_S = 240  # of TensorFlow's workers; docs/scaling.md says why


def _coordination_service():
    """TensorFlow's coordination service configured as `MultiWorkerMirroredStrategy` configures it (standalone, led
    by the chief or worker 0, over the chief and the workers of TF_CONFIG), but with a heartbeat timeout of
    HEARTBEAT_TIMEOUT_S: TensorFlow's default, 10 s, ends every worker's run ("The following tasks are unhealthy
    (stopped sending heartbeats) ... The tasks have crashed") when one of them is merely held up for 10 s, as a
    loaded host or a stopped process does; and a quarter of it bounds how long worker 0 waits at its exit for the
    others to leave first (`leave_last_at_exit`), which a worker slow to exit on a loaded host can outlast. A
    worker that did die is still seen by its peers, within that time, and at once by the launcher that started
    it. Nothing done when the service is already configured."""
    import tensorflow as tf
    from tensorflow.compiler.xla.tsl.protobuf import coordination_config_pb2  # no public way to set the timeout
    from tensorflow.python.distribute import multi_worker_util
    from tensorflow.python.eager import context

    if context.context().coordination_service is not None:
        return
    cluster = tf.distribute.cluster_resolver.TFConfigClusterResolver().cluster_spec()
    jobs = [coordination_config_pb2.CoordinatedJob(name=job, num_tasks=cluster.num_tasks(job))
            for job in ("chief", "worker") if job in cluster.jobs]
    context.context().configure_coordination_service(
        service_type="standalone", service_leader=multi_worker_util.coordination_leader(cluster),
        coordinated_jobs=jobs, heartbeat_timeout_in_ms=HEARTBEAT_TIMEOUT_S * 1000)


def leave_last_at_exit():
    """Has the leader of the several-worker TensorFlow run that `tf_strategy()` joined (the chief, or worker 0:
    it holds the coordination service) wait, as it exits, until every other worker's process has gone (its
    server no longer takes a connection), up to a quarter of HEARTBEAT_TIMEOUT_S; nothing on another process, or
    without such a run. TensorFlow's processes do not leave the service as they exit: their heartbeats simply
    stop. A worker that outlives the leader then logs "Failed to send RPC to coordination service ... Connection
    refused" at its next heartbeat, and a leader that outlives a worker's last heartbeat by the timeout logs "The
    tasks have crashed", each at the end of a good run; with the leader last and leaving at once after the
    others, neither happens. The wait is bounded by the heartbeats: a worker sends one every half timeout, so its
    last may be half a timeout old when the run is written; a leader that waited longer than the other half for
    a worker slow to exit would be told it crashed. A quarter leaves the leader's own exit the rest. Call it once
    the run is done on every worker (the recipes do, once the run is written). A second call changes nothing."""
    if not os.environ.get("TF_CONFIG"):
        return
    import tensorflow as tf
    from tensorflow.python.distribute import multi_worker_util

    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    cluster, name = resolver.cluster_spec(), "/job:{}/replica:0/task:{}".format
    if cluster.jobs and name(resolver.task_type, resolver.task_id) == multi_worker_util.coordination_leader(cluster):
        others = [cluster.task_address(job, i) for job in ("chief", "worker") if job in cluster.jobs
                  for i in cluster.task_indices(job) if (job, i) != (resolver.task_type, resolver.task_id)]
        atexit.unregister(_wait_until_gone)  # once
        atexit.register(_wait_until_gone, others, HEARTBEAT_TIMEOUT_S / 4)


def _wait_until_gone(addresses, timeout_s):
    """Returns once no server listens at any of `addresses` ("host:port"; one that cannot be reached is gone), or
    after `timeout_s` seconds."""
    deadline = time.monotonic() + timeout_s
    while addresses and time.monotonic() < deadline:
        addresses = [address for address in addresses if _listening(address)]
        if addresses:
            time.sleep(0.1)


def _listening(address):
    """Whether a server takes a connection at `address` ("host:port") within a second."""
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=1):
            return True
    except OSError:
        return False
