"""The 14-class folder of real photographs the training-recipes ablation (recipes_ablation.py) trains on from
scratch: one class per scikit-image photograph, small square crops, the training crops from the left part of
each photograph and the test crops from a disjoint right part (`write_split`), and the test crops as the
model takes them (`test_arrays`)."""

import os

import numpy as np

# scikit-image's real photographs (not its synthetic images), one class each
PHOTOS = ("astronaut", "brick", "camera", "chelsea", "clock", "coffee", "coins", "grass", "gravel",
          "hubble_deep_field", "immunohistochemistry", "moon", "retina", "rocket")
TRAIN_COLUMNS = (0.0, 0.6)  # the fractions of each photograph's width the training crops come from
TEST_COLUMNS = (0.65, 1.0)  # the test crops' columns: a gap of 5% of the width between the two
CROP_FRACTION = (0.08, 0.22)  # a crop's side, as a fraction of the photograph's shorter side
STORED_SIZE = 48  # the crops' side on disk (pixels), resized to the training size by the feed


def _photograph(name):
    from skimage import data

    photo = getattr(data, name)()
    return np.repeat(photo[..., None], 3, axis=-1) if photo.ndim == 2 else photo[..., :3]


def _crops(photo, columns, n, rng):
    """`n` square crops of `photo` whose every pixel lies within the fractions `columns` of its width,
    resized to STORED_SIZE."""
    from PIL import Image

    height, width = photo.shape[:2]
    first, last = int(columns[0] * width), int(columns[1] * width)
    out = []
    for _ in range(n):
        side = int(rng.uniform(*CROP_FRACTION) * min(height, width))
        side = min(side, last - first, height)
        top, left = rng.integers(0, height - side + 1), rng.integers(first, last - side + 1)
        crop = Image.fromarray(photo[top:top + side, left:left + side])
        out.append(np.asarray(crop.resize((STORED_SIZE, STORED_SIZE), Image.BILINEAR)))
    return out


def write_split(root, train_per_class, test_per_class, seed=0):
    """Writes `root/train/<photograph>/*.png` (`train_per_class` crops each, from TRAIN_COLUMNS) and
    `root/test/<photograph>/*.png` (`test_per_class`, from TEST_COLUMNS): no test pixel is in a training
    crop. Returns (the training folder, the test folder).

    Args:
        root: the folder to write into (made if missing).
        train_per_class: training crops per photograph.
        test_per_class: test crops per photograph.
        seed: the crops' positions and sizes.
    """
    from PIL import Image

    rng = np.random.default_rng(seed)
    folders = {part: os.path.join(root, part) for part in ("train", "test")}
    for name in PHOTOS:
        photo = _photograph(name)
        for part, columns, n in (("train", TRAIN_COLUMNS, train_per_class), ("test", TEST_COLUMNS, test_per_class)):
            os.makedirs(os.path.join(folders[part], name), exist_ok=True)
            for i, crop in enumerate(_crops(photo, columns, n, rng)):
                Image.fromarray(crop).save(os.path.join(folders[part], name, f"{name}_{i:04d}.png"))
    return folders["train"], folders["test"]


def test_arrays(folder, image_size):
    """(uint8 images (N, size, size, 3), labels (N,)) of the class folders of `folder` (the sorted names are
    the classes), each resized as the finetune run's validation images are (bilinear, no crop).

    Args:
        folder: a folder of class subfolders of images.
        image_size: the models' input side.
    """
    from keras_vit.data.folder import read_image
    from keras_vit.data.preprocess import finish, resize_bilinear

    images, labels = [], []
    for label, name in enumerate(sorted(os.listdir(folder))):
        for file in sorted(os.listdir(os.path.join(folder, name))):
            image = read_image(os.path.join(folder, name, file))
            images.append(finish(resize_bilinear(image, (image_size, image_size)), "uint8"))
            labels.append(label)
    return np.stack(images), np.asarray(labels)


__all__ = ["CROP_FRACTION", "PHOTOS", "STORED_SIZE", "TEST_COLUMNS", "TRAIN_COLUMNS", "test_arrays", "write_split"]
