"""Reading a scanned folder's files while the feed runs, each checked against its scan: a file that
cannot be read now (truncated or corrupt, which a header scan does not find; removed since the scan) or
whose image is not the size the scan found (replaced since) is skipped, named once in the log (the
"keras_vit" logger, a warning) and kept in the feed's `SkippedFiles`.

The rule that keeps the batches full and the stream a pure function of (seed, pass, position), so that
tf.data and the `PyDataset` give the same batches and `skip_batches` resumes exactly:

- a training example whose file is skipped takes, in its place, the next file of the same pass (the
  positions after it, wrapping round) that can be read, cropped by a fresh Inception crop drawn from
  ``position_rng(seed, pass, position, SUBSTITUTE_STREAM)``; its flip and augmentations stay those of its
  position, its label is the substitute's;
- a validation image whose file is skipped is left out of its batch (that batch is one image shorter:
  every image is scored once, none twice).

Pillow decides: the tf.data feed decodes with TensorFlow first and, where TensorFlow refuses a file or
finds it changed, asks Pillow here as the `PyDataset` does. A file is read again each time its turn
comes (a file restored is read again); a file replaced by another image of the same size is read as it
is now (its scanned crop still fits it).
"""

import functools
import logging
import os
import threading

from keras_vit.data.folder import PILLOW, read_image
from keras_vit.data.stream import SUBSTITUTE_STREAM, crop_boxes, plan_pass, position_rng

logger = logging.getLogger("keras_vit")


class SkippedFiles:
    """The files of a folder that a feed skipped while reading (see the module's docstring): each named
    once in the log as it is first met, and listed here as ``(relative path, reason)`` pairs, sorted by
    path (``list(skipped)``, ``len(skipped)``). One record is shared by the training and validation
    feeds of a `from_directory` call (their ``skipped_files`` attribute); it is safe across threads.

    Args:
        root: the folder the relative paths are under (named in the log).
    """

    def __init__(self, root):
        self.root = root
        self._reasons = {}
        self._lock = threading.Lock()

    def add(self, path, reason):
        """Records that the file `path` (relative to the folder) was skipped for `reason`, said in the log
        the first time; returns whether it was new."""
        with self._lock:
            if path in self._reasons:
                return False
            self._reasons[path] = reason
        logger.warning("skipped %s of %s: %s; a training example of it takes the next readable file of its "
                       "pass, a validation image is left out", path, self.root, reason)
        return True

    def __iter__(self):
        with self._lock:
            return iter(sorted(self._reasons.items()))

    def __len__(self):
        with self._lock:
            return len(self._reasons)

    def __repr__(self):
        return f"SkippedFiles({self.root!r}, {list(self)!r})"


def read_as_scanned(root, record):
    """The image of a scan record (relative path, label, height, width, decoder) of folder `root`, as uint8
    RGB, read as the feeds read it (`read_image`).

    Raises:
        ValueError: why it cannot be used now: it cannot be read, or is gone, or is not the size it was
            scanned at.
    """
    path, _, height, width, decoder = record
    full = os.path.join(root, path)
    try:
        image = read_image(full, plain=decoder != PILLOW)
    except ValueError as err:
        if not os.path.isfile(full):
            raise ValueError("the file is gone (removed or moved since the folder was scanned)") from None
        raise ValueError(f"it cannot be decoded now ({str(err).split(': ', 1)[-1]})") from None
    if image.shape[:2] != (height, width):
        raise ValueError(f"it is {image.shape[1]}x{image.shape[0]} pixels now, {width}x{height} when the folder "
                         "was scanned (changed since)")
    return image


def read_or_skip(root, record, skipped):
    """`read_as_scanned`'s image of `record` (of folder `root`), or None when it cannot be used now, the
    reason recorded in `skipped` (a `SkippedFiles`)."""
    try:
        return read_as_scanned(root, record)
    except ValueError as err:
        skipped.add(record[0], str(err))
        return None


def pass_plans(folder, aug_repeats=1, keep=4):
    """`plan_pass` of the folder's training records as a function of the pass index, the last `keep`
    passes remembered (a pass is planned once, not once an image)."""
    return functools.lru_cache(maxsize=keep)(
        lambda pass_index: plan_pass(folder.train, folder.seed, pass_index, aug_repeats))


def train_crop(folder, skipped, plan, pass_index, position):
    """(uint8 crop, label) of the training example at `position` of pass `pass_index`, `plan` that pass's
    (order, boxes, flips): the planned crop of its file or, when the file is skipped (recorded in
    `skipped`, a `SkippedFiles`), the substitute of the module's docstring.

    Raises:
        ValueError: no file of the pass can be read (the folder named).
    """
    order, boxes = plan[0], plan[1]
    record = folder.train[order[position]]
    image = read_or_skip(folder.root, record, skipped)
    if image is not None:
        top, left, height, width = boxes[position]
        return image[top:top + height, left:left + width], record[1]
    index, image = substitute(order, position, lambda i: read_or_skip(folder.root, folder.train[i], skipped),
                              folder, skipped)
    record = folder.train[index]
    rng = position_rng(folder.seed, pass_index, position, SUBSTITUTE_STREAM)
    top, left, height, width = crop_boxes([record[2]], [record[3]], rng)[0]
    return image[top:top + height, left:left + width], record[1]


def substitute(order, position, read, folder, skipped):
    """(index, image) of the training example that takes the place of the one at `position` of a pass in
    `order` (indices of the folder's training records), whose file is skipped: the first index after it
    (wrapping round) whose `read(index)` is not None.

    Raises:
        ValueError: no file of the pass can be read (the folder named).
    """
    n, failed = len(order), {int(order[position])}
    for step in range(1, n):
        index = int(order[(position + step) % n])
        if index in failed:
            continue
        image = read(index)
        if image is not None:
            return index, image
        failed.add(index)
    raise ValueError(f"none of the {len(folder.train)} training images of {folder.root!r} can be read now "
                     f"(expected the images the folder was scanned with); skipped: {list(skipped)[:5]}")


def validation_image(folder, skipped, index):
    """The uint8 image of validation record `index`, or None when its file is skipped (recorded in
    `skipped`, a `SkippedFiles`)."""
    return read_or_skip(folder.root, folder.validation[index], skipped)
