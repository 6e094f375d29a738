"""Scaling out through the backends' own machinery, nothing home-made.

JAX: Keras's distribution API. `data_parallel()` (`keras.distribution.DataParallel`: batches split
over the devices, variables replicated) and `model_parallel()` (`keras.distribution.ModelParallel`
with `vit_layout_map`: Megatron-style tensor parallelism of every encoder block, batches split
over the mesh's "batch" axis). Several processes (hosts): `initialize_multihost()` first; then each
process passes its own rows of every global batch (`process_rows()` cuts them from arrays,
`process_shard()` says which part to give `keras_vit.data.load`).
TensorFlow: `tf.distribute`; `tf_strategy()` picks TPUStrategy, MultiWorkerMirroredStrategy,
MirroredStrategy or the default strategy for the machine (`leave_last_at_exit()` ends a several-worker
run cleanly), and `data_parallel()` is a MirroredStrategy scope. torch: Keras 3 has no distribution for this
backend, and these helpers refuse it.

Its parts: `layout` (the model axis's split of the parameters), `parallel` (the contexts to build in and the
replicas they split a batch over), `hosts` (several processes, each with its rows) and `strategies`
(TensorFlow's strategy for the machine). Their public names are this package's.
"""

from keras_vit.distribute.hosts import initialize_multihost, process_rows, process_shard
from keras_vit.distribute.layout import BATCH_AXIS, MODEL_AXIS, vit_layout_map
from keras_vit.distribute.parallel import check_batch_size, data_parallel, model_parallel, num_replicas, parse_mesh
from keras_vit.distribute.strategies import Machine  # noqa: F401  what tf_strategy takes; outside __all__, as before
from keras_vit.distribute.strategies import leave_last_at_exit, probe_machine, strategy_kind, tf_strategy

__all__ = ["BATCH_AXIS", "MODEL_AXIS", "check_batch_size", "data_parallel", "initialize_multihost",
           "leave_last_at_exit", "model_parallel", "num_replicas", "parse_mesh", "probe_machine", "process_rows",
           "process_shard", "strategy_kind", "tf_strategy", "vit_layout_map"]
