"""MixUp and CutMix with timm's semantics (`timm.data.Mixup`), every draw a pure function of (seed, step).

    from keras_vit.data.mixup import MixUp
    mix = MixUp(num_classes=10, mixup_alpha=0.8, cutmix_alpha=1.0, label_smoothing=0.1, seed=0)
    images, targets = mix(images, labels, step)          # numpy (B, H, W, C) and int labels -> soft targets
    train = MixedBatches(train, mix)                      # a PyDataset of (images, labels) batches, mixed

A batch of B images is mixed with itself reversed (image i with image B - 1 - i, timm's pairing): MixUp
blends the two, `lam * x_i + (1 - lam) * x_(B-1-i)`; CutMix pastes a box of the partner into the image,
the box from timm's `rand_bbox` (a square-ratio box of side sqrt(1 - lam) of the image's, centred
uniformly, clipped at the borders) and `lam` then corrected to the area kept. The targets are the same
blend of the two one-hot labels, smoothed first (timm's `mixup_target`). `mode` "batch" draws one lam
(and one box) for the batch, "pair" one per pair (i, B-1-i), "elem" one per image; with both alphas
above 0 each draw picks CutMix with `switch_prob`, and it mixes at all with `prob`.

The draws are timm's, in timm's order, from `numpy.random.RandomState([seed, step])`: with
`np.random.seed([seed, step])` timm's `Mixup` draws the same lam, pairing and box, so the two give the
same batch. Because they depend on (seed, step) only, a resumed run (`skip_batches`) mixes its batches as
the uninterrupted one did. uint8 images are mixed in float32 and rounded back to uint8 (timm's
`FastCollateMixup` does the same), so a model that scales uint8 images itself is fed as before.
"""

import dataclasses

import keras
import numpy as np

MODES = ("batch", "pair", "elem")


@dataclasses.dataclass(frozen=True)
class MixParams:
    """The draws for one batch: `lam` (B,) the weight of each image's own pixels and label, `cutmix` (B,)
    bool, `boxes` (B, 4) int (top, bottom, left, right; an empty box where not CutMix)."""

    lam: np.ndarray
    cutmix: np.ndarray
    boxes: np.ndarray


def _check_fraction(name, value, low=0.0, high=1.0):
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
        raise ValueError(f"{name} must be a number in [{low}, {high}]; got {value!r}")
    return float(value)


def rand_box(rng, height, width, lam):
    """timm's `rand_bbox` (no margin): (top, bottom, left, right) of a box of (1 - `lam`) of the area of a
    `height` x `width` image at its ratio, centred uniformly (two `rng.randint` draws, `rng` a
    `numpy.random.RandomState`) and clipped at its borders."""
    ratio = np.sqrt(1 - lam)
    cut_h, cut_w = int(height * ratio), int(width * ratio)
    cy, cx = rng.randint(0, height), rng.randint(0, width)
    return (int(np.clip(cy - cut_h // 2, 0, height)), int(np.clip(cy + (cut_h + 1) // 2, 0, height)),
            int(np.clip(cx - cut_w // 2, 0, width)), int(np.clip(cx + (cut_w + 1) // 2, 0, width)))


@dataclasses.dataclass(frozen=True)
class MixUp:
    """MixUp and CutMix of a batch (see the module's docstring), timm's `Mixup` arguments by the same names.

    Args:
        num_classes: the classes of the one-hot targets.
        mixup_alpha: Beta(alpha, alpha) of MixUp's lam; 0: no MixUp (timm's `--mixup`, DeiT's 0.8).
        cutmix_alpha: Beta(alpha, alpha) of CutMix's lam; 0: no CutMix (timm's `--cutmix`, DeiT's 1.0).
        prob: the probability that a batch (pair, image) is mixed at all (timm's `--mixup-prob`).
        switch_prob: with both alphas above 0, the probability of CutMix rather than MixUp.
        mode: "batch", "pair" or "elem" (see above).
        correct_lam: CutMix's lam corrected to the area of the box after clipping (timm's default).
        label_smoothing: smoothing of the one-hot targets before they are mixed (timm's `--smoothing`).
        seed: the seed of every draw (an integer >= 0).

    Raises:
        ValueError: a negative alpha, both alphas 0, a probability outside [0, 1], an unknown mode, a
            bad `num_classes` or `seed`.
    """

    num_classes: int
    mixup_alpha: float = 0.8
    cutmix_alpha: float = 1.0
    prob: float = 1.0
    switch_prob: float = 0.5
    mode: str = "batch"
    correct_lam: bool = True
    label_smoothing: float = 0.1
    seed: int = 0

    def __post_init__(self):
        for name in ("mixup_alpha", "cutmix_alpha"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
                raise ValueError(f"{name} must be a number >= 0 (0: off); got {value!r}")
        if not (self.mixup_alpha > 0 or self.cutmix_alpha > 0):
            raise ValueError("MixUp needs mixup_alpha > 0 or cutmix_alpha > 0 (both are 0: nothing to mix)")
        for name in ("prob", "switch_prob", "label_smoothing"):
            _check_fraction(name, getattr(self, name))
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}; got {self.mode!r}")
        for name, least in (("num_classes", 1), ("seed", 0)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < least:
                raise ValueError(f"{name} must be an integer >= {least}; got {value!r}")

    def _lams(self, rng, n):
        """timm's `_params_per_elem`: (lam (n,), cutmix (n,)), drawn in its order."""
        cutmix = np.zeros(n, bool)
        if self.mixup_alpha > 0 and self.cutmix_alpha > 0:
            cutmix = rng.rand(n) < self.switch_prob
            lam = np.where(cutmix, rng.beta(self.cutmix_alpha, self.cutmix_alpha, size=n),
                           rng.beta(self.mixup_alpha, self.mixup_alpha, size=n))
        elif self.mixup_alpha > 0:
            lam = rng.beta(self.mixup_alpha, self.mixup_alpha, size=n)
        else:
            cutmix = np.ones(n, bool)
            lam = rng.beta(self.cutmix_alpha, self.cutmix_alpha, size=n)
        return np.where(rng.rand(n) < self.prob, lam.astype(np.float32), np.float32(1)), cutmix

    def _lam(self, rng):
        """timm's `_params_per_batch`: (lam, cutmix), drawn in its order."""
        if not rng.rand() < self.prob:
            return 1.0, False
        if self.mixup_alpha > 0 and self.cutmix_alpha > 0:
            cutmix = bool(rng.rand() < self.switch_prob)
            alpha = self.cutmix_alpha if cutmix else self.mixup_alpha
            return float(rng.beta(alpha, alpha)), cutmix
        if self.mixup_alpha > 0:
            return float(rng.beta(self.mixup_alpha, self.mixup_alpha)), False
        return float(rng.beta(self.cutmix_alpha, self.cutmix_alpha)), True

    def _box(self, rng, height, width, lam):
        box = rand_box(rng, height, width, lam)
        if self.correct_lam:
            lam = 1.0 - (box[1] - box[0]) * (box[3] - box[2]) / float(height * width)
        return box, lam

    def params(self, step, batch_size, height, width):
        """The `MixParams` of training step `step` (an integer >= 0) for a batch of `batch_size` images of
        `height` x `width`: a pure function of (seed, step)."""
        rng = np.random.RandomState([self.seed, int(step)])
        if batch_size % 2:
            raise ValueError(f"MixUp pairs image i with image B - 1 - i: the batch size must be even; got {batch_size}")
        lam, cutmix = np.ones(batch_size, np.float32), np.zeros(batch_size, bool)
        boxes = np.zeros((batch_size, 4), np.int64)
        if self.mode == "batch":
            value, cut = self._lam(rng)
            if value != 1.0 and cut:
                box, value = self._box(rng, height, width, value)
                boxes[:], cutmix[:] = box, True
            lam[:] = value
            return MixParams(lam, cutmix, boxes)
        n = batch_size // 2 if self.mode == "pair" else batch_size
        drawn, cut = self._lams(rng, n)
        for i in range(n):
            if drawn[i] != 1.0 and cut[i]:
                boxes[i], drawn[i] = self._box(rng, height, width, drawn[i])
                cutmix[i] = True
        if self.mode == "pair":  # the partner of pair i is image B - 1 - i, with the same draw
            drawn, cutmix[n:], boxes[n:] = np.concatenate([drawn, drawn[::-1]]), cutmix[:n][::-1], boxes[:n][::-1]
        lam[:] = drawn
        return MixParams(lam, cutmix, boxes)

    def targets(self, labels, lam):
        """The soft targets (B, num_classes) float32 of integer `labels` (B,) mixed with weights `lam` (B,):
        timm's `mixup_target` (smoothed one-hot, blended with the reversed batch's)."""
        labels = np.asarray(labels)
        if labels.ndim != 1 or labels.dtype.kind not in "iu":
            raise ValueError(f"MixUp takes integer class labels (B,); got {labels.dtype} labels of shape "
                             f"{labels.shape} (mix before one-hot encoding: MixUp makes the soft targets)")
        if labels.size and not 0 <= labels.min() <= labels.max() < self.num_classes:
            raise ValueError(f"labels must be in [0, {self.num_classes}); got {labels.min()}..{labels.max()}")
        off = self.label_smoothing / self.num_classes
        one_hot = np.full((len(labels), self.num_classes), off, np.float32)
        one_hot[np.arange(len(labels)), labels] = 1.0 - self.label_smoothing + off
        lam = np.asarray(lam, np.float32)[:, None]
        return one_hot * lam + one_hot[::-1] * (1.0 - lam)

    def __call__(self, images, labels, step):
        """(mixed images, soft targets) of a batch: numpy `images` (B, H, W, C), uint8 or float, and integer
        `labels` (B,), mixed by the draws of training step `step`."""
        images = np.asarray(images)
        if images.ndim != 4:
            raise ValueError(f"MixUp takes a batch of images (B, H, W, C); got shape {images.shape}")
        p = self.params(step, len(images), images.shape[1], images.shape[2])
        mixed = apply(images, p)
        return mixed, self.targets(labels, p.lam)


def apply(images, params):
    """`images` (B, H, W, C) mixed by `params` (a `MixParams`) with the reversed batch; uint8 stays uint8
    (rounded), float stays its dtype."""
    partner = images[::-1]
    out = images.astype(np.float32, copy=True)
    for i, (lam, cut, (top, bottom, left, right)) in enumerate(zip(params.lam, params.cutmix, params.boxes)):
        if cut:
            out[i, top:bottom, left:right] = partner[i, top:bottom, left:right]
        elif lam != 1.0:
            out[i] = out[i] * lam + partner[i].astype(np.float32) * (1.0 - lam)
    if images.dtype == np.uint8:
        return np.clip(np.rint(out), 0, 255).astype(np.uint8)
    return out.astype(images.dtype)


class MixedBatches(keras.utils.PyDataset):
    """A `keras.utils.PyDataset` of (images, labels) batches (`keras_vit.data.from_directory(...,
    pipeline="pydataset")`'s, or any indexable of numpy batches), each mixed by `mixup`: batch k is step
    `skip_batches + k` (a resumed run passes the steps it has done, as to the feed it wraps)."""

    def __init__(self, batches, mixup, skip_batches=0, **kwargs):
        super().__init__(**kwargs)
        if not isinstance(mixup, MixUp):
            raise ValueError(f"mixup must be a keras_vit.data.mixup.MixUp; got {type(mixup).__name__}")
        if isinstance(skip_batches, bool) or not isinstance(skip_batches, int) or skip_batches < 0:
            raise ValueError(f"skip_batches must be an integer >= 0; got {skip_batches!r}")
        self.batches, self.mixup, self.skip_batches = batches, mixup, skip_batches

    @property
    def num_batches(self):
        return getattr(self.batches, "num_batches", None)

    def __getitem__(self, index):
        batch = self.batches[index]
        if isinstance(batch[0], dict):
            raise ValueError("MixUp mixes images; a NaFlex batch of patch sequences is not mixed (leave MixUp off "
                             "with --naflex)")
        return self.mixup(batch[0], batch[1], self.skip_batches + index)

    def on_epoch_end(self):
        if hasattr(self.batches, "on_epoch_end"):
            self.batches.on_epoch_end()


class OneHotBatches(keras.utils.PyDataset):
    """A `keras.utils.PyDataset` of the (images, integer labels) `batches` with the labels one-hot over
    `num_classes` (float32): the validation feed of a model trained on MixUp's soft targets, whose loss and
    accuracy take one-hot targets."""

    def __init__(self, batches, num_classes, **kwargs):
        super().__init__(**kwargs)
        self.batches, self.num_classes = batches, num_classes

    @property
    def num_batches(self):
        return getattr(self.batches, "num_batches", None)

    def __getitem__(self, index):
        images, labels = self.batches[index][:2]
        return images, np.eye(self.num_classes, dtype=np.float32)[np.asarray(labels)]


def _threads(feed):
    """A PyDataset's workers, use_multiprocessing and max_queue_size, for a PyDataset that wraps it: Keras runs
    a wrapper of the default workers=1 with no thread pool, in the training loop's own thread, no prefetch."""
    return {"workers": feed.workers, "use_multiprocessing": feed.use_multiprocessing,
            "max_queue_size": feed.max_queue_size}


def mixed_feeds(train, validation, mixup, skip_batches=0):
    """(train, validation) of a feed (`keras_vit.data.from_directory`'s tf.data datasets or PyDatasets) for
    training on MixUp's soft targets: the `train` batches mixed by `mixup` (a `MixUp`), batch k at step
    `skip_batches + k`, and the `validation` labels one-hot (None stays None)."""
    if isinstance(train, keras.utils.PyDataset):
        train = MixedBatches(train, mixup, skip_batches, **_threads(train))  # the wrapped feed's prefetch
        return train, validation if validation is None else OneHotBatches(validation, mixup.num_classes,
                                                                          **_threads(validation))
    import tensorflow as tf

    def mix(step, images, labels):
        x, y = tf.numpy_function(lambda a, b, s: mixup(a, b, int(s)), [images, labels, step],
                                 [images.dtype, tf.float32])
        x.set_shape(images.shape)
        y.set_shape([images.shape[0], mixup.num_classes])
        return x, y

    train = train.enumerate(start=skip_batches).map(lambda step, batch: mix(step, batch[0], batch[1]),
                                                    num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    if validation is not None:
        validation = validation.map(lambda x, y: (x, tf.one_hot(y, mixup.num_classes)))
    return train, validation


__all__ = ["MODES", "MixParams", "MixUp", "MixedBatches", "OneHotBatches", "apply", "mixed_feeds", "rand_box"]
