"""Several processes (hosts) training one model: `initialize_multihost` joins this process to the run, and
each process then passes its own rows of every global batch: `process_shard` says which part (to give
`keras_vit.data.load`), `process_rows` cuts it from arrays. JAX; on TensorFlow the workers of TF_CONFIG
and `tf_strategy` do it, and torch is refused."""

import os

import keras

from keras_vit.distribute import launchers
from keras_vit.distribute.parallel import refuse_torch


def initialize_multihost(coordinator=None, num_processes=None, process_id=None):
    """Join this process to a multi-host run, before anything else touches the devices.

    JAX. With no argument, the run is the one the launcher that started this process describes
    (`keras_vit.distribute.launchers`): the variables KERAS_DISTRIBUTION_JOB_ADDRESSES / _NUM_PROCESSES /
    _PROCESS_ID (`python -m keras_vit.launch`, or set by hand), a step of SLURM's `srun`, `mpiexec` (Open MPI,
    MPICH, Intel MPI; mpi4py sends process 0's address), a Cloud TPU VM slice (JAX reads its metadata); a
    process started alone, or by a launcher of one process, joins nothing. On GPU hosts without a launcher
    pass the coordinator "host:port" of process 0, the number of processes and this process's id. Every
    process but 0 first waits until the coordinator takes a connection (`launchers.wait_for_coordinator`:
    refused, naming it, after KERAS_VIT_JOIN_TIMEOUT_S seconds, 300 by default). CPU devices talk through
    gloo (JAX's default CPU collectives). TensorFlow: nothing to do here: `tf_strategy()` reads TF_CONFIG.

    Args:
        coordinator: "host:port" of process 0 (None: the launcher's).
        num_processes: the number of processes (hosts) (None: the launcher's).
        process_id: this process's index (None: the launcher's).

    Returns:
        (process_index, process_count). Under `data_parallel()` that is the part of each global batch
        this process passes (`keras_vit.data.load(..., process_index=..., process_count=...)`); under
        `model_parallel()` ask `process_shard()` once the distribution is set.
    """
    backend = keras.backend.backend()
    if backend == "tensorflow":
        return 0, 1
    if backend != "jax":
        refuse_torch("initialize_multihost()")
    import jax

    if num_processes is not None and int(num_processes) == 1:
        return 0, 1
    if coordinator is None and num_processes is None and process_id is None:
        launch = launchers.detect(backend="jax")
        if launch is None:
            return 0, 1
        coordinator = launchers.coordinator(launch)
        if launch.launcher == "mpi" and coordinator is None and not os.environ.get("OMPI_MCA_orte_hnp_uri"):
            coordinator = launchers.mpi_coordinator(launch)  # Open MPI 4 names its host itself (JAX reads it)
        num_processes, process_id = launch.count, launch.index
    else:
        launch = launchers.Launch("arguments", num_processes, process_id)
    launchers.wait_for_coordinator(launch, coordinator)
    keras.distribution.initialize(coordinator, num_processes, process_id)
    return jax.process_index(), jax.process_count()


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
    if keras.backend.backend() != "jax":
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
