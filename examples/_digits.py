"""scikit-learn's digits as small RGB images and shuffled batches: the offline data of the examples
(demo.py, ablations.py). 1797 handwritten digits (8x8 grey levels) ship inside scikit-learn."""

import numpy as np


def to_rgb(images, size):
    """(N, 8, 8) grey levels 0..16 -> (N, size, size, 3) float32 in [-1, 1] (bilinear, channels repeated)."""
    from keras_vit.interpolation import resize_2d

    images = np.asarray(images, np.float64) / 16.0 * 2.0 - 1.0
    resized = np.moveaxis(resize_2d(np.moveaxis(images, 0, -1), (size, size), align_corners=False), -1, 0)
    resized = np.clip(resized, -1.0, 1.0).astype(np.float32)
    return np.repeat(resized[..., None], 3, axis=-1)


def split_digits(classes, seed, test_fraction=0.25):
    """The digits of `classes`, split into stratified train/test parts; labels renumbered 0..len-1.

    Returns dict x_train, y_train, x_test, y_test (images (N, 8, 8) grey levels 0..16).
    """
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()  # ships with scikit-learn: no download
    classes = tuple(classes)
    keep = np.isin(digits.target, classes)
    labels = np.searchsorted(classes, digits.target[keep]).astype("int32")
    x_train, x_test, y_train, y_test = train_test_split(
        digits.images[keep], labels, test_size=test_fraction, stratify=labels, random_state=seed)
    return dict(x_train=x_train, y_train=y_train, x_test=x_test, y_test=y_test)


def make_batches(images, labels, batch_size, seed):
    """A reshuffled-every-epoch ``keras.utils.PyDataset`` of full batches only.

    Dropping the ragged last batch keeps one input shape, so the train step is
    compiled once (JAX and XLA recompile for every new batch shape).
    """
    import keras

    class ShuffledBatches(keras.utils.PyDataset):
        def __init__(self):
            super().__init__()
            self.rng = np.random.default_rng(seed)
            self.order = self.rng.permutation(len(images))

        def __len__(self):
            return len(images) // batch_size

        def __getitem__(self, index):
            idx = self.order[index * batch_size:(index + 1) * batch_size]
            return images[idx], labels[idx]

        def on_epoch_end(self):
            self.order = self.rng.permutation(len(images))

    if len(images) < batch_size:
        raise ValueError(f"need at least one batch of {batch_size} images, got {len(images)}")
    return ShuffledBatches()
