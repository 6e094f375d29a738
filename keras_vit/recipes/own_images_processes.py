"""`keras-vit finetune DIR` on several processes (`python -m keras_vit.launch -n 2 -- keras-vit finetune ...`, or a
cluster's launcher setting KERAS_DISTRIBUTION_* or TF_CONFIG), data parallel as the TFDS recipe runs
(`finetune_devices`):

- JAX's `DataParallel` over every process's devices, each process passing its rows of every global batch of the
  one-process run's schedule (the same batch, device batch and updates), so the run equals the one-process run
  up to float rounding; on TensorFlow the `MultiWorkerMirroredStrategy` of TF_CONFIG, set as the global
  strategy when the process joins, each worker passing whole batches that the strategy splits;
- process 0 the one writer of --out (its lock, the backups, the best epoch, the figures and the report); the
  others write nothing and, on --resume, restore the backup process 0 wrote (--out on a filesystem they share);
- the folder scanned once, by process 0, which sends the scan and the run's flags to the others
  (`shared_start`). Sent rather than read from the scan cache or from split.json: the cache trusts no file
  modified in the two seconds before the scan and may not be writable, so the others could read the whole
  folder again or, should a file change in between, split it differently; split.json holds no image sizes and
  is written into --out only once every refusal has passed. A collective gives every process process 0's very
  split, with no file to wait for. Tar shards (`own_shards`) the same way: process 0 reads their info files and
  the validation labels and sends them (`ShardSource.shared`), and each process streams every training shard
  keeping its rows of each global batch (`from_shards(per_process="rows")`), as the folder's feed does;
- the validation split passed whole by every process (JAX) or read whole by every worker (TensorFlow: its
  auto-sharding off): the global batches hold each row once per process, which leaves the means, loss and
  accuracy, unchanged, and every process gets batches of the same shape, so the per-epoch validation that
  picks the best epoch is exact whatever the split's size; process 0 then evaluates the best epoch alone.

torch runs of several processes, --naflex on several and --pipeline pydataset on several TensorFlow workers are
refused in one line.
"""

import dataclasses
import json
import os

from keras_vit import writer_lock
from keras_vit.recipes import finetune_devices, own_shards
from keras_vit.recipes.finetune_args import several_processes


def join(args):
    """This process's index in a run of several processes, once joined (0 for a run of one; on TensorFlow the
    workers' strategy set as the global one); refuses a run of several on torch, with --naflex, or on TensorFlow
    with --pipeline pydataset, before anything touches the devices (a TPU slice, whose size is known once
    joined, right after). `args`: the parsed flags."""
    import keras

    backend = keras.backend.backend()
    _refuse(several_processes(), backend, args)
    index = finetune_devices.join_processes()
    count = several_processes()
    _refuse(count, backend, args)
    if count and backend == "tensorflow":  # the workers of TF_CONFIG, set before anything else runs in TensorFlow
        import tensorflow as tf

        from keras_vit import distribute

        tf.distribute.experimental_set_strategy(distribute.tf_strategy())
    return index


def _refuse(count, backend, args):
    """Refuses `count` processes (None: one) where the run of several does not go: on torch, with --naflex,
    with --pipeline pydataset on TensorFlow."""
    if count and backend not in ("jax", "tensorflow"):
        raise ValueError(f"keras-vit finetune on {count} processes runs on the jax and tensorflow backends, got "
                         f"{backend}: set KERAS_BACKEND=jax, or run one process")
    if count and getattr(args, "naflex", None):
        raise ValueError(f"--naflex runs on one process, not on {count}: leave out --naflex or run one process")
    if count and backend == "tensorflow" and getattr(args, "pipeline", None) == "pydataset":
        raise ValueError(f"--pipeline pydataset on {count} TensorFlow workers: their strategy splits tf.data "
                         "batches; leave out --pipeline (tf.data) or run one process")


def shared_start(args, flags, prepare_out, read_folder):
    """(resuming, the scanned folder or the `own_shards.ShardSource`): `prepare_out(args, flags)` and
    `read_folder(args)` of process 0 on every process (the others never read --out, scan the folder or open the
    shards); the flags it decided (a resumed run's) are filled into `flags` and `args` on each, and process 0's
    refusal is raised on every process."""
    from keras_vit.data.folder import ImageFolder

    if not several_processes():
        return prepare_out(args, flags), read_folder(args)

    def start():
        resuming, read = prepare_out(args, flags), read_folder(args)
        if isinstance(read, own_shards.ShardSource):
            return {"resuming": resuming, "flags": flags, "shards": read.shared()}
        return {"resuming": resuming, "flags": flags, "folder": dataclasses.asdict(read)}

    given = json.loads(json.dumps(flags))  # this process's command, as process 0 sends its own
    sent = finetune_devices.first_process_value(lambda: {"given": given, "lock": _lock_text(args.out), **start()})
    _same_command_and_out(args, given, sent["given"], sent["lock"])
    flags.update(sent["flags"])
    for key, value in sent["flags"].items():
        setattr(args, key, value)
    if "shards" in sent:
        return sent["resuming"], own_shards.ShardSource.from_shared(sent["shards"])
    folder = sent["folder"]
    folder.update({key: tuple(tuple(row) if isinstance(row, list) else row for row in folder[key])
                   for key in ("class_names", "train", "validation", "skipped")})
    return sent["resuming"], ImageFolder(**folder)


def _lock_text(out):
    """The text of --out's lock file (`writer_lock`, which process 0 holds from before the run on), or None."""
    try:
        with open(writer_lock.lock_path(out)) as f:
            return f.read()
    except OSError:
        return None


def _same_command_and_out(args, given, first, first_lock):
    """Refuses, on every process, a run whose processes were started with other flags than process 0's
    (`given` this one's, `first` process 0's: two commands under one launcher), or where --out's place cannot be
    seen as process 0 sees it (`first_lock`: the text of the lock process 0 holds beside --out): every process
    reads the backups and the best epoch's weights from --out."""
    differ = sorted(key for key in set(given) | set(first) if given.get(key) != first.get(key))
    others = finetune_devices.processes_where(bool(differ))
    if others:
        mine = f" (here {', '.join(f'{key} {given.get(key)!r} against {first.get(key)!r}' for key in differ)})"
        raise ValueError(f"process {', '.join(map(str, others))} of {several_processes()} was started with other "
                         f"flags than process 0{mine if differ else ''}; expected the same command on every process")
    blind = finetune_devices.processes_where(_lock_text(args.out) != first_lock)
    if blind:
        raise ValueError(f"--out {args.out}, written by process 0, cannot be seen by process "
                         f"{', '.join(map(str, blind))} of {several_processes()} (which does not find there the lock process 0 "
                         f"holds, {writer_lock.lock_path(args.out)}); expected a folder every process can "
                         "read (a filesystem they share): each reads the backups and the best epoch's weights from it")


def distribute(sched, folder):
    """On several processes, sets Keras' data-parallel distribution over every process's devices after checking
    that the `Plan` `sched`'s device batch splits over them and each validation batch of the scanned `folder`
    (or `own_shards.ShardSource`) over this process's devices; returns the number of processes (1: nothing
    done)."""
    import keras

    count = several_processes()
    if not count:
        return 1
    from keras_vit import distribute as distribution

    device_batch = sched.device_batch_size
    if keras.backend.backend() == "tensorflow":  # the strategy `join` set splits every batch itself
        distribution.check_batch_size(device_batch, f"device batch of {count} workers")
        return count
    import jax

    devices, local = jax.device_count(), jax.local_device_count()
    if device_batch % devices:
        raise ValueError(f"the device batch ({device_batch} images a step) splits over the {devices} devices of "
                         f"{count} processes: expected a multiple of {devices} (--device-batch-size, --batch-size)")
    rows, last = device_batch // count, len(folder.validation) % (device_batch // count)
    if rows % local or last % local:
        raise ValueError(f"each process validates on batches of {rows} images (the last of {last}), which must "
                         f"split over its {local} devices; expected multiples of {local} (--device-batch-size, "
                         "--validation-split)")
    distribution.data_parallel()
    return count


def rows():
    """`from_directory`'s (and `own_shards.feeds`') process_index and process_count for this process's rows of
    every training batch."""
    import keras

    if not several_processes() or keras.backend.backend() != "jax":  # TensorFlow's strategy splits whole batches
        return {}
    import jax

    return {"process_index": jax.process_index(), "process_count": jax.process_count()}


def whole_validation(validation, folder, args, sched):
    """The validation feed every process passes on several processes: the whole split of the scanned `folder`
    (or the validation shards of an `own_shards.ShardSource`) in batches of the device batch of the `Plan`
    `sched` over the processes (see the module's docstring); one process: `validation` as it is. `args`: the
    parsed flags (--image-size, --pipeline)."""
    import keras

    count = several_processes()
    if not count:
        return validation
    if keras.backend.backend() == "tensorflow":  # each worker reads every batch, which the strategy splits
        import tensorflow as tf

        options = tf.data.Options()
        options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
        # batched last: tf.distribute finds the batch size only there, to give each worker its part of every
        # batch; behind a map (the folder feed's, which leaves out a skipped file) it cuts each batch into a
        # piece a replica that every worker reads in turn, while Keras steps once a batch: half the images scored
        return validation.unbatch().batch(sched.device_batch_size).with_options(options)
    if isinstance(folder, own_shards.ShardSource):
        return own_shards.held_out_feed(args, folder, sched.device_batch_size // count)
    from keras_vit import data

    return data.from_directory(folder, args.image_size, sched.device_batch_size // count, image_dtype="uint8",
                               pipeline=args.pipeline)[1]


def best_epoch_written():
    """Waits, on several processes, until process 0 has written the best epoch's weights that all load."""
    finetune_devices.wait_for_every_process("the best epoch's weights are written")


__all__ = ["best_epoch_written", "distribute", "join", "rows", "shared_start", "whole_validation"]
