"""`keras-vit finetune 'shards/train-{000000..000007}.tar' --validation-shards 'shards/val-*.tar'`: the command's
run on WebDataset-style tar shards (`keras_vit.data.shards`; `write_shards` writes them from a folder) where it
takes a folder, the rest of the run unchanged (`own_images`).

- DIR names shards when it ends in ``.tar`` (a shard, a glob or a brace range of them) and is not a folder
  (`is_shard_pattern`); anything else is a folder, as before.
- The classes are the shards' info file's, the schedule (`folder_plan.plan`) is made from the training
  samples the info files count (no shard is read for it), and the training stream (`from_shards`) is a pure
  function of --seed and the pass, so `--resume` continues exactly.
- Validation is the shards of ``--validation-shards`` (timm's ``--val-split`` of a WebDataset), which must hold
  the training shards' classes; without it the run is refused, since finetune keeps the best epoch on held-out
  images. Their labels are read from the label members alone (the images skipped unread) for the report.
- On several processes (`own_images_processes`) process 0 reads the info files and the validation labels and
  sends them (`ShardSource.shared`); each process streams every training shard and keeps its rows of each
  global batch (`from_shards(per_process="rows")`: the one-process run's batches, so the run equals it up to
  float rounding; each process reads every shard's bytes but decodes only its rows).
- Refused by name, before --out is written: what only a folder has (--validation-split, --labels-csv,
  --strict, --verify header), --naflex (the shard feed gives square images) and --aug-repeats (a streamed pass
  reads each sample once).
"""

import dataclasses
import functools
import os
import re

from keras_vit.data.shards import (
    ShardSet,
    decode,
    is_shard_pattern,
    open_shards,
    read_samples,
    sample_labels,
)
from keras_vit.fileio import write_json

# what only a folder has or only the folder feeds run: (flag, attribute, why), refused when not at its default
FOLDER_ONLY = (
    ("--validation-split", "validation_split", "shards hold no split: name the held-out shards with "
     "--validation-shards PATTERN"),
    ("--labels-csv", "labels_csv", "shards carry their labels (key.cls or key.json)"),
    ("--strict", "strict", "shards are not scanned before training (a truncated shard is skipped with a warning, a "
     "sample without a class stops the run with its shard and key)"),
    ("--verify", "verify", "shards are not scanned before training"),
    ("--naflex", "naflex", "the shard feed gives square images"),
)


def check_args(args):
    """Refuses, by flag name, what a run on the shards DIR (`args.directory`) cannot take, and
    --validation-shards without shards; makes --validation-shards absolute. Returns whether DIR names shards."""
    from keras_vit.data.augment import FLAG_NAMES, Augment
    from keras_vit.data.shard_feed import check_augment

    shards = is_shard_pattern(args.directory)
    validation = getattr(args, "validation_shards", None)
    if not shards:
        if validation is not None:
            raise ValueError(f"--validation-shards {validation} goes with a shard pattern DIR (ending in .tar); "
                             f"{args.directory} is a folder, whose held-out images --validation-split sets")
        return False
    defaults = getattr(args, "flag_defaults", {})
    for flag, key, why in FOLDER_ONLY:
        value = getattr(args, key, None)
        if value != defaults.get(key):
            given = flag if isinstance(value, bool) else f"{flag} {value}"
            raise ValueError(f"{given}: DIR {args.directory} names tar shards and {why}")
    check_augment(Augment.from_flags(args), True, FLAG_NAMES)  # --aug-repeats
    if validation is not None:
        args.validation_shards = os.path.abspath(validation)
    return True


def run_name(directory):
    """The name of the default --out of a run on `directory`: a folder's name, or the shards' stem
    (``shards/train-{000000..000007}.tar`` -> ``train``)."""
    base = os.path.basename(os.path.normpath(directory))
    if is_shard_pattern(directory):
        base = re.sub(r"[-_.]*(\{[^}]*\}|[*?\d\[\]])*\.tar$", "", base)
    return base or "images"


@dataclasses.dataclass
class ShardSource:
    """The shards of a run, as `own_images` and `report` use a scanned folder: `class_names`, `train` (its
    length is the training samples), `validation` ((name, label) records), `counts`, `skipped`, `save`, and
    `photograph` (a validation sample's image, for mistakes.png).

    Args:
        pattern: the training shards' pattern (DIR).
        validation_pattern: the validation shards' pattern (--validation-shards).
        train: the training shards' `ShardSet`.
        held_out: the validation shards' `ShardSet`.
    """

    pattern: str
    validation_pattern: str
    train: object
    held_out: object

    @property
    def class_names(self):
        return self.train.class_names

    @functools.cached_property
    def validation(self):
        """(``<shard>:<key>``, label) of the validation samples in the order the evaluation stream reads them."""
        return tuple(sample_labels(self.held_out))

    @property
    def skipped(self):
        """(truncated shard, what was left out of it) of both sets."""
        return tuple((path, f"{reason}: its last {count} samples skipped")
                     for path, count, reason in self.train.skipped + self.held_out.skipped)

    def counts(self):
        """{class name: (training samples or None, validation samples)}: the training samples of each class from
        the info files (None when they do not hold them), the validation ones from its labels."""
        held_out = [0] * len(self.class_names)
        for _, label in self.validation:
            held_out[label] += 1
        train = self.train.class_counts or (None,) * len(self.class_names)
        return {name: (train[i], held_out[i]) for i, name in enumerate(self.class_names)}

    def save(self, path):
        """Writes which shards train and which validate, with their samples, to `path` (JSON, atomically)."""
        write_json(path, {"class_names": list(self.class_names),
                          "train": {"pattern": self.pattern, "shards": list(self.train.paths),
                                    "samples": len(self.train)},
                          "validation": {"pattern": self.validation_pattern, "shards": list(self.held_out.paths),
                                         "samples": [[n, self.class_names[c]] for n, c in self.validation]},
                          "skipped": [list(s) for s in self.skipped]})

    def shared(self):
        """What process 0 sends the others of a run of several (JSON-able; `from_shared` reads it): the patterns,
        both `ShardSet`s and the validation labels, so that no other process reads an info file or a shard's
        labels, and all see the very same sets."""
        return {"pattern": self.pattern, "validation_pattern": self.validation_pattern,
                "train": dataclasses.asdict(self.train), "held_out": dataclasses.asdict(self.held_out),
                "validation": [list(record) for record in self.validation]}

    @classmethod
    def from_shared(cls, sent):
        """The `ShardSource` that `shared` gave as `sent` (its lists back to tuples)."""
        def shard_set(fields):
            per_class = fields["class_counts"]
            return ShardSet(tuple(fields["paths"]), tuple(fields["class_names"]), tuple(fields["counts"]),
                            tuple(tuple(s) for s in fields["skipped"]), per_class and tuple(per_class))

        source = cls(sent["pattern"], sent["validation_pattern"], shard_set(sent["train"]),
                     shard_set(sent["held_out"]))
        source.validation = tuple(tuple(record) for record in sent["validation"])  # set where it would be read
        return source

    def photograph(self, index):
        """The validation sample `index` as uint8 RGB (H, W, 3), as it is stored."""
        _, data, kind, _ = read_samples(self.held_out, [index])[index]
        return decode(data, kind)


def read_shards(args):
    """The `ShardSource` of DIR and --validation-shards (`args`), their sizes said; refuses a run without
    --validation-shards and validation shards of other classes."""
    if args.validation_shards is None:
        raise ValueError(f"DIR {args.directory} names tar shards: give the held-out ones with --validation-shards "
                         "PATTERN (finetune keeps the best epoch on them; write_shards(folder, ..., part="
                         "'validation') writes a scanned folder's split)")
    print(f"reading {args.directory} ...", flush=True)
    train, held_out = open_shards(args.directory), open_shards(args.validation_shards)
    if held_out.class_names != train.class_names:
        raise ValueError(f"--validation-shards {args.validation_shards} hold {len(held_out.class_names)} classes "
                         f"({', '.join(held_out.class_names[:8])}), the training shards {len(train.class_names)} "
                         f"({', '.join(train.class_names[:8])}): expected the same classes in the same order")
    source = ShardSource(args.directory, args.validation_shards, train, held_out)
    print(f"{len(train.class_names)} classes, {len(train)} training samples in {len(train.paths)} shard(s) and "
          f"{len(held_out)} validation samples in {len(held_out.paths)} shard(s)"
          + (f"; {len(source.skipped)} truncated shard(s) cut short" if source.skipped else ""))
    return source


def feeds(args, source, sched, done, process_index=0, process_count=1):
    """(train, validation) of `source` (a `ShardSource`) for the run of `args`: the endless training stream
    from device step `done` on with --aa / --reprob / --remode / --recount, this process's rows of each global
    batch (`process_index` of `process_count`; see the module's docstring), and one pass of the validation
    shards, `sched.device_batch_size` uint8 images a batch (the model scales them itself)."""
    from keras_vit.data.augment import Augment
    from keras_vit.data.shard_feed import from_shards

    augment = dataclasses.asdict(Augment.from_flags(args))
    train = from_shards(source.train, args.image_size, sched.device_batch_size, args.seed, skip_batches=done,
                        image_dtype="uint8", pipeline=args.pipeline, process_index=process_index,
                        process_count=process_count, per_process="rows", **augment)
    return train, held_out_feed(args, source, sched.device_batch_size)


def held_out_feed(args, source, batch_size):
    """One pass of the validation shards of `source` (a `ShardSource`) in their order, `batch_size` uint8
    images of --image-size a batch (the last one short), read whole by this process (`args`: the parsed
    flags)."""
    from keras_vit.data.shard_feed import from_shards

    return from_shards(source.held_out, args.image_size, batch_size, args.seed, training=False, repeat=False,
                       drop_remainder=False, image_dtype="uint8", pipeline=args.pipeline)


def photograph_of(source):
    """How mistakes.png reads a validation image of `source`: a `ShardSource`'s `photograph`, else None (the
    folder's file)."""
    return source.photograph if isinstance(source, ShardSource) else None


__all__ = ["FOLDER_ONLY", "ShardSource", "check_args", "feeds", "held_out_feed", "photograph_of", "read_shards",
           "run_name"]
