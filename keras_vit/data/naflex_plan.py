"""How NaFlex batches are made (`NaFlexPlan`): the sequence-length buckets, the images per batch and every
random choice of a training pass (`EpochPlan`), drawn from (seed, pass) as timm's `NaFlexMapDatasetWrapper`
draws them.
"""

import dataclasses
import functools
import typing

import numpy as np

from keras_vit.data.naflex_sequence import whole

# timm's defaults: the training sequence lengths of create_naflex_loader, the tokens per batch of
# NaFlexMapDatasetWrapper (4096 * 4) and the evaluation sequence length of create_naflex_loader.
SEQ_LENS = (128, 256, 576, 784, 1024)


MAX_TOKENS_PER_BATCH = 4096 * 4


EVAL_SEQ_LEN = 576


# draws of the bucket schedule are made this many at a time (so the schedule of n images is a prefix
# of the schedule of more)
_DRAWS = 1024


class EpochPlan(typing.NamedTuple):
    """One training pass of `NaFlexPlan.epoch`.

    Attributes:
        seq_lens: (batches,) the sequence length of each batch, in order.
        starts: (batches + 1,) where each batch starts in `order` (batch k is `order[starts[k]:starts[k + 1]]`).
        order: (positions,) the image index at each position of the pass: a seeded permutation of all
            images, then from its start again to fill the last batch.
        flips: (positions,) bool, whether the image at each position is flipped left-right.
    """

    seq_lens: np.ndarray
    starts: np.ndarray
    order: np.ndarray
    flips: np.ndarray


@dataclasses.dataclass(frozen=True)
class NaFlexPlan:
    """How NaFlex batches are made: the buckets, the images per batch and every random choice.

    A batch of sequence length L holds `batch_size(L)` = `max_tokens_per_batch // L` images (rounded
    down to a multiple of `batch_divisor`), each resized to fit L tokens (`naflex_grid`) and padded to
    L. Training passes follow a schedule drawn once from `seed` (as timm's `NaFlexMapDatasetWrapper`):
    each batch's L uniform over `seq_lens`, batches until every image has a place; each pass
    (`epoch`) shuffles the images and the order of the schedule's batches and draws the flips (p=0.5),
    all from (`seed`, pass). The last batch is filled from the start of the pass again, so every batch
    of one L has the same shape and each image is seen at least once a pass. Evaluation batches hold
    `eval_batch_size` images of `eval_seq_len` tokens, in order (the last one may be smaller).

    Attributes:
        patch_size: the side of a square patch in pixels.
        seq_lens: the training buckets (kept sorted, without repeats); timm's (128, 256, 576, 784, 1024).
        max_tokens_per_batch: tokens of a batch (padding included); timm's 4096 * 4.
        eval_seq_len: the evaluation sequence length; timm's 576.
        seed: the seed of the schedule, the shuffles and the flips (an integer >= 0).
        batch_divisor: batch sizes are multiples of it (timm's wrapper uses 8; 1: plain floor division).

    Raises:
        ValueError: a value that is not a positive integer, empty `seq_lens`, or a budget that gives
            some sequence length a batch of 0 images (the message names the smallest budget that works).
    """

    patch_size: int = 16
    seq_lens: tuple = SEQ_LENS
    max_tokens_per_batch: int = MAX_TOKENS_PER_BATCH
    eval_seq_len: int = EVAL_SEQ_LEN
    seed: int = 0
    batch_divisor: int = 1

    def __post_init__(self):
        whole(self.patch_size, "patch_size")
        whole(self.max_tokens_per_batch, "max_tokens_per_batch")
        whole(self.eval_seq_len, "eval_seq_len")
        whole(self.batch_divisor, "batch_divisor")
        whole(self.seed, "seed", 0)
        if isinstance(self.seq_lens, (str, bytes)) or not hasattr(self.seq_lens, "__iter__") or not len(self.seq_lens):
            raise ValueError(f"seq_lens must be a non-empty sequence of positive integers; got {self.seq_lens!r}")
        lengths = tuple(sorted({whole(v, "each of seq_lens") for v in self.seq_lens}))
        object.__setattr__(self, "seq_lens", lengths)
        for seq_len in (*lengths, self.eval_seq_len):
            if self.batch_size(seq_len) < 1:
                raise ValueError(
                    f"max_tokens_per_batch={self.max_tokens_per_batch} gives sequences of {seq_len} tokens a "
                    f"batch of 0 images (batch_divisor={self.batch_divisor}); expected max_tokens_per_batch >= "
                    f"{seq_len * self.batch_divisor}")

    def batch_size(self, seq_len):
        """Images in a batch of sequence length `seq_len`: `max_tokens_per_batch // seq_len`, rounded down
        to a multiple of `batch_divisor` (0 when the budget is smaller than that)."""
        return self.max_tokens_per_batch // whole(seq_len, "seq_len") // self.batch_divisor * self.batch_divisor

    @property
    def batch_sizes(self):
        """(images per batch,) of each of `seq_lens`, in their order."""
        return tuple(self.batch_size(v) for v in self.seq_lens)

    @property
    def eval_batch_size(self):
        """Images in an evaluation batch: `batch_size(eval_seq_len)`."""
        return self.batch_size(self.eval_seq_len)

    def schedule(self, num_images):
        """(batches,) int: the sequence length of each batch of the canonical schedule for `num_images`
        training images (before a pass shuffles it): drawn uniformly from `seq_lens` with `seed`, as many
        batches as hold every image (a prefix of the schedule of more images)."""
        return _schedule(self, whole(num_images, "num_images"))

    def steps_per_epoch(self, num_images):
        """Batches of one training pass over `num_images` images (`model.fit`'s `steps_per_epoch`)."""
        return len(self.schedule(num_images))

    def epoch(self, num_images, epoch):
        """The `EpochPlan` of training pass `epoch` (an integer >= 0) over `num_images` images: a pure
        function of (`seed`, `epoch`)."""
        return _epoch(self, whole(num_images, "num_images"), whole(epoch, "epoch", 0))


@functools.lru_cache(maxsize=16)
def _schedule(plan, num_images):
    rng = np.random.default_rng([plan.seed, 0x5CED])
    sizes = np.asarray(plan.batch_sizes)
    drawn = np.zeros(0, np.int64)
    while not len(drawn) or sizes[drawn].sum() < num_images:
        drawn = np.concatenate([drawn, rng.integers(0, len(sizes), _DRAWS)])
    count = int(np.searchsorted(np.cumsum(sizes[drawn]), num_images)) + 1
    lengths = np.asarray(plan.seq_lens)[drawn[:count]]
    lengths.flags.writeable = False
    return lengths


@functools.lru_cache(maxsize=8)
def _epoch(plan, num_images, epoch):
    rng = np.random.default_rng([plan.seed, epoch])
    images = rng.permutation(num_images)
    lengths = plan.schedule(num_images)[rng.permutation(len(plan.schedule(num_images)))]
    starts = np.concatenate([[0], np.cumsum([plan.batch_size(v) for v in lengths])])
    flips = rng.random(int(starts[-1])) < 0.5
    out = EpochPlan(lengths, starts, np.resize(images, int(starts[-1])), flips)
    for array in out:
        array.flags.writeable = False
    return out
