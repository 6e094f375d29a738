"""WebDataset-style tar shards of labelled images, and the seeded plan that streams them.

    shards/train-000000.tar ... train-000012.tar    members 000000017.jpg, 000000017.cls, 000000042.png, ...
    shards/train-info.json                          {"class_names": [...], "shards": {name: {samples, bytes, ...}}}

A sample is the run of adjacent members sharing a key (the name up to its first dot): one image (`.jpg`,
`.jpeg`, `.png`, or another format Pillow reads) and its label, `key.cls` (the class index as text) or
`key.json` (``{"label": index or class name}``). The info file beside the shards (the shard name with its
digits replaced by ``info`` and ``.tar`` by ``.json``) names the classes and each shard's samples and bytes
(and, optional, its ``class_counts``: samples per class): the reader finds a truncated shard from its size
before reading it, and knows every pass's length (and the classes' sizes) without reading a shard.

JPEGs and PNGs are decoded plainly (no EXIF rotation), as TensorFlow's decoders do, so that tf.data and the
`PyDataset` give the same pixels; `keras_vit.data.shard_writer` stores any other image as a PNG of its
upright RGB pixels.

The plan of a pass (`pass_shards`, `pass_order`, `crop_and_flip`) is a pure function of (seed, pass): the
shards' order, then a shuffle buffer whose draws are simulated in numpy on the samples' numbers, so a reader
that holds at most `shuffle_buffer` samples yields them in that order, and `skip_batches` resumes exactly.
"""

import dataclasses
import glob
import io
import itertools
import json
import os
import re
import tarfile
import warnings

import numpy as np

from keras_vit.data.folder import IMAGE_EXTENSIONS, PILLOW, TF_JPEG, TF_PNG, read_image
from keras_vit.data.stream import crop_boxes

LABEL_EXTENSIONS = (".cls", ".json")

# the generators of a pass's draws: [seed, pass, SHARD_STREAM] the shards' order, [seed, pass, BUFFER_STREAM]
# the buffer's, [seed, pass, sample, CROP_STREAM] one sample's crop and flip (never 0: numpy pads a seed with
# zeros, so [seed, pass, 0] would be [seed, pass])
SHARD_STREAM, BUFFER_STREAM, CROP_STREAM = 3, 4, 5

# a shard's name: anything, its number, ".tar"; its info file replaces the number by this
SHARD_NAME = re.compile(r"^(?P<stem>.*?)(?P<number>\d+)\.tar$")
INFO_NAME = "info"


def info_path(shard):
    """The info file of `shard` (``train-000003.tar`` -> ``train-info.json``, beside it)."""
    folder, name = os.path.split(shard)
    found = SHARD_NAME.match(name)
    if not found:
        raise ValueError(f"shard {shard!r} is not named NAME<number>.tar (expected e.g. train-000003.tar)")
    return os.path.join(folder, f"{found['stem']}{INFO_NAME}.json")


def _expand_braces(pattern):
    """`pattern` with its first ``{a..b}`` (a zero-padded numeric range) or ``{x,y}`` expanded, recursively."""
    found = re.search(r"\{([^{}]*)\}", pattern)
    if not found:
        return [pattern]
    inside, head, tail = found[1], pattern[:found.start()], pattern[found.end():]
    numbers = re.fullmatch(r"(\d+)\.\.(\d+)", inside)
    if numbers:
        low, high, width = int(numbers[1]), int(numbers[2]), len(numbers[1])
        parts = [f"{i:0{width}d}" for i in range(low, high + 1)]
    else:
        parts = inside.split(",")
    return [p for part in parts for p in _expand_braces(head + part + tail)]


def shard_paths(pattern):
    """The shard files of `pattern`: a path, a glob (``shards/train-*.tar``), a brace range
    (``shards/train-{000000..000127}.tar``, each of which must exist) or a list of these; sorted, no repeats."""
    if not isinstance(pattern, (str, os.PathLike, list, tuple)):
        raise ValueError(f"the shards' pattern must be a path, a glob, a brace range or a list of them; got {pattern!r}")
    patterns = [pattern] if isinstance(pattern, (str, os.PathLike)) else list(pattern)
    found, missing = [], []
    for each in patterns:
        for path in _expand_braces(os.fspath(each)):
            if glob.has_magic(path):
                found += sorted(glob.glob(path))
            elif os.path.isfile(path):
                found.append(path)
            else:
                missing.append(path)
    if missing:
        raise ValueError(f"{len(missing)} shard(s) of {pattern!r} do not exist: {', '.join(missing[:5])}"
                         + (" ..." if len(missing) > 5 else ""))
    found = sorted(set(found))
    if not found:
        raise ValueError(f"no shard matches {pattern!r} (expected tar files such as shards/train-000000.tar, "
                         "a glob or a brace range of them)")
    return found


@dataclasses.dataclass(frozen=True)
class ShardSet:
    """The shards a pattern names, as the plan sees them.

    Attributes:
        paths: the shard files, sorted.
        class_names: the classes, label `i` is `class_names[i]`.
        counts: each shard's usable samples (a truncated shard's complete ones).
        skipped: `(shard, number of samples left out, reason)` of each truncated shard.
        class_counts: each class's samples in the set from the info files (`write_shards` records them), None
            when a shard's entry holds none or a shard is truncated.
    """

    paths: tuple
    class_names: tuple
    counts: tuple
    skipped: tuple
    class_counts: tuple = None

    @property
    def offsets(self):
        """The number of each shard's first sample in the set (samples are numbered shard by shard)."""
        return np.concatenate([[0], np.cumsum(self.counts)[:-1]]).astype(np.int64)

    def __len__(self):
        return int(sum(self.counts))


def _read_info(path, cache):
    if path not in cache:
        try:
            with open(path) as f:
                info = json.load(f)
            if not isinstance(info.get("class_names"), list) or not isinstance(info.get("shards"), dict):
                raise TypeError("no class_names list and shards table")
        except (OSError, ValueError, TypeError) as err:
            raise ValueError(f"cannot read the shards' info file {path!r} ({err}): expected the JSON that "
                             "write_shards writes beside the shards ({\"class_names\": [...], \"shards\": "
                             "{name: {\"samples\": n, \"bytes\": size}}})") from None
        cache[path] = info
    return cache[path]


def open_shards(pattern):
    """The `ShardSet` of `pattern` (see `shard_paths`), checked against the shards' info files: every shard
    listed with the same classes; a shard shorter than its recorded size is read once to count its complete
    samples (the rest are left out, named in a warning).

    Raises:
        ValueError: nothing matches, a shard or info file missing, a shard not listed in its info file, shards
            of different class sets (named).
    """
    paths = shard_paths(pattern)
    infos, classes, counts, skipped, per_class = {}, None, [], [], []
    for path in paths:
        info = _read_info(info_path(path), infos)
        names = tuple(info["class_names"])
        if classes is None:
            classes, first = names, path
        elif names != classes:
            raise ValueError(f"shards of different class sets: {first!r} has {len(classes)} classes "
                             f"({', '.join(classes[:8])}{' ...' * (len(classes) > 8)}), {path!r} has "
                             f"{len(names)} ({', '.join(names[:8])}{' ...' * (len(names) > 8)}); read them apart")
        entry = info["shards"].get(os.path.basename(path))
        if entry is None:
            raise ValueError(f"shard {path!r} is not listed in {info_path(path)!r}: write it with write_shards "
                             "or add it there")
        try:
            count, recorded = int(entry["samples"]), int(entry["bytes"])
        except (KeyError, TypeError, ValueError):
            raise ValueError(f"{info_path(path)!r} lists {os.path.basename(path)} as {entry!r}; expected "
                             "{\"samples\": n, \"bytes\": size}") from None
        if os.path.getsize(path) < recorded:
            whole = sum(1 for _ in samples(path, classes, truncated_ok=True))
            skipped.append((path, count - whole, f"truncated to {os.path.getsize(path)} of {recorded} bytes"))
            warnings.warn(f"shard {path} is truncated ({os.path.getsize(path)} of {recorded} bytes): its "
                          f"last {count - whole} of {count} samples are skipped", stacklevel=3)
            count = whole
        counts.append(count)
        per_class.append(entry.get("class_counts") if count == int(entry["samples"]) else None)
    keep = [i for i, c in enumerate(counts) if c > 0]
    if not keep:
        raise ValueError(f"the shards of {pattern!r} hold no usable sample")
    class_counts = None
    if all(isinstance(c, list) and len(c) == len(classes) for c in per_class):
        class_counts = tuple(int(n) for n in np.sum(per_class, axis=0))
    return ShardSet(tuple(paths[i] for i in keep), classes, tuple(counts[i] for i in keep), tuple(skipped),
                    class_counts)


def _label(shard, key, parts, class_names):
    """The class index of a sample from its `.cls` or `.json` member."""
    try:
        if ".cls" in parts:
            value = int(parts[".cls"].decode().strip())
        elif ".json" in parts:
            value = json.loads(parts[".json"])["label"]
        else:
            raise KeyError("no .cls or .json member")
    except (KeyError, ValueError, TypeError, UnicodeDecodeError) as err:
        raise ValueError(f"shard {shard}, sample {key!r}: no label ({err}); expected {key}.cls holding a class "
                         f"index or {key}.json holding {{\"label\": index or class name}}") from None
    if isinstance(value, str) and value in class_names:
        return class_names.index(value)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < len(class_names):
        raise ValueError(f"shard {shard}, sample {key!r}: label {value!r} is not a class (expected an index in "
                         f"[0, {len(class_names)}) or one of {', '.join(class_names[:8])}"
                         f"{' ...' * (len(class_names) > 8)})")
    return value


def _image(shard, key, parts):
    images = [e for e in parts if e in IMAGE_EXTENSIONS]
    if len(images) != 1:
        raise ValueError(f"shard {shard}, sample {key!r}: {len(images)} image members ({', '.join(parts)}); "
                         f"expected one of {', '.join(IMAGE_EXTENSIONS)}")
    return parts[images[0]], kind_of(images[0])


def kind_of(extension):
    """How an image member is decoded: TF_JPEG or TF_PNG (plainly, the same by TensorFlow and Pillow), or
    PILLOW (EXIF orientation and colour conversions, by Pillow on both pipelines)."""
    return {".jpg": TF_JPEG, ".jpeg": TF_JPEG, ".png": TF_PNG}.get(extension, PILLOW)


def _members(tar, size, read=None):
    """(name, bytes) of the files of an open tar, stopping quietly where the file is cut short; with `read`
    (a test of a member's name) the bytes of the members it refuses are None, skipped unread."""
    while True:
        try:
            member = tar.next()
        except (tarfile.ReadError, EOFError):
            return
        if member is None or member.offset_data + member.size > size:
            return
        if member.isfile() and read is not None and not read(member.name):
            yield member.name, None
        elif member.isfile():
            data = tar.extractfile(member).read()
            if len(data) < member.size:
                return
            yield member.name, data


def _grouped(shard, read=None):
    """(key, {extension: bytes}, last) of the samples of `shard` in order: the runs of adjacent members sharing
    a key, `last` True for the one the tar ends with; with `read` (see `_members`) the other members' bytes None."""
    size = os.path.getsize(shard)
    key, parts = None, {}
    with open(shard, "rb") as f, tarfile.open(fileobj=f, mode="r:") as tar:
        for name, data in _members(tar, size, read):
            new_key, dot, extension = os.path.basename(name).partition(".")
            if new_key != key and parts:
                yield key, parts, False
                parts = {}
            key = new_key
            parts["." + extension.lower() if dot else ""] = data
    if parts:
        yield key, parts, True


def samples(shard, class_names, truncated_ok=False):
    """The samples of `shard`, in order: (key, image bytes, kind, label). With `truncated_ok` a sample cut
    short at the end is left out (its shard was found truncated); otherwise it is an error.

    Raises:
        ValueError: a sample without one image or without a label that names a class (shard and key named).
    """
    for key, parts, last in _grouped(shard):
        if last and truncated_ok and not (set(parts) & set(LABEL_EXTENSIONS) and set(parts) & set(IMAGE_EXTENSIONS)):
            return
        yield key, *_image(shard, key, parts), _label(shard, key, parts, class_names)


def _is_label(name):
    return "." + os.path.basename(name).partition(".")[2].lower() in LABEL_EXTENSIONS


def sample_labels(shard_set):
    """(name, label) of every usable sample of `shard_set` in the set's order (shard by shard, the order an
    evaluation pass reads), the name ``<shard file>:<key>``. Only the tar headers and the label members are
    read: the images are skipped unread (a seek past each).

    Raises:
        ValueError: a sample without a label that names a class (shard and key named).
    """
    return [(f"{os.path.basename(path)}:{key}", _label(path, key, parts, shard_set.class_names))
            for path, count in zip(shard_set.paths, shard_set.counts)
            for key, parts, _ in itertools.islice(_grouped(path, read=_is_label), count)]


def read_samples(shard_set, numbers):
    """{number: (key, image bytes, kind, label)} of the samples `numbers` (their places in the set's order),
    reading only the shards that hold them."""
    wanted, found = set(int(n) for n in numbers), {}
    for path, first, count in zip(shard_set.paths, shard_set.offsets.tolist(), shard_set.counts):
        if wanted & set(range(first, first + count)):
            for number, sample in enumerate(itertools.islice(samples(
                    path, shard_set.class_names, truncated_ok=True), count), first):
                if number in wanted:
                    found[number] = sample
    return found


def is_shard_pattern(text):
    """Whether `text` (a command line's DIR) names tar shards rather than a folder: it ends in ``.tar`` (a
    shard, a glob or a brace range of them) and is not a folder."""
    return os.fspath(text).endswith(".tar") and not os.path.isdir(text)


def pass_shards(shard_set, seed, pass_index, process_index=0, process_count=1, shuffle=True):
    """The shards (indices into `shard_set.paths`) that process `process_index` reads in pass `pass_index`:
    a seeded permutation of them every pass (the listed order without `shuffle`), every `process_count`-th
    one from `process_index` on. With fewer shards than processes pass process_count=1: each process then
    reads them all and takes its rows of each batch."""
    order = np.arange(len(shard_set.paths))
    if shuffle:
        order = np.random.default_rng([seed, pass_index, SHARD_STREAM]).permutation(order)
    return order[process_index::process_count]


def pass_order(shard_set, shards, seed, pass_index, shuffle_buffer):
    """The samples (numbers in the set) of a pass over `shards`, in the order a shuffle buffer of
    `shuffle_buffer` samples yields them: filled with the first samples read, then each step yields a
    uniformly drawn one and puts the next sample read in its place (the draws seeded by (seed, pass)).
    `shuffle_buffer=1` keeps the reading order. The i-th sample yielded is among the first
    i + shuffle_buffer read."""
    offsets, counts = shard_set.offsets, shard_set.counts
    incoming = np.concatenate([np.arange(offsets[s], offsets[s] + counts[s]) for s in shards]).tolist()
    n = len(incoming)
    buffer, taken = incoming[:shuffle_buffer], min(shuffle_buffer, n)
    draws = np.random.default_rng([seed, pass_index, BUFFER_STREAM]).random(n).tolist()
    out = []
    for u in draws:
        slot = int(u * len(buffer))
        out.append(buffer[slot])
        if taken < n:
            buffer[slot] = incoming[taken]
            taken += 1
        else:
            buffer[slot] = buffer[-1]
            buffer.pop()
    return np.asarray(out, np.int64)


def crop_and_flip(seed, pass_index, sample, height, width):
    """The Inception crop box (top, left, height, width) of a sample of `height` x `width` pixels in pass
    `pass_index`, and whether it is flipped: drawn from (seed, pass, sample), as `crop_boxes` draws them."""
    rng = np.random.default_rng([seed, pass_index, sample, CROP_STREAM])
    box = crop_boxes([height], [width], rng)[0]
    return box, bool(rng.uniform() < 0.5)


def image_size_of(data, kind):
    """(height, width) of an image member as `decode` gives it: from its header for JPEG and PNG, else decoded."""
    from PIL import Image

    if kind == PILLOW:
        return decode(data, kind).shape[:2]
    with Image.open(io.BytesIO(data)) as img:
        return img.size[1], img.size[0]


def decode(data, kind):
    """An image member's bytes as uint8 RGB (H, W, 3), as the tf.data pipeline decodes it."""
    return read_image(io.BytesIO(data), plain=kind != PILLOW)
