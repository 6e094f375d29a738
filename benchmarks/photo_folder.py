"""The folder of photographs the feed benchmarks read, and the facts of the machine they report beside
their figures: `write_folder` (JPEG crops of scikit-image's photographs, one class subfolder per
photograph) for folder_feed.py; `cpu_name` and `load_average` for folder_feed.py and naflex.py."""

import os
import platform

import numpy as np

PHOTOS = ("astronaut", "coffee", "chelsea", "rocket")
JPEG_SIZE = (500, 375)  # width, height


def write_folder(root, n, seed=0, size=JPEG_SIZE):
    """`n` JPEGs of `size` (width, height; 500x375 by default), quality 90, random crops of scikit-image's
    photographs, `n / 4` in each of the class folders `root/<photograph>/`. Returns `root`."""
    from PIL import Image
    from skimage import data

    rng = np.random.default_rng(seed)
    photos = {name: getattr(data, name)() for name in PHOTOS}
    for i in range(n):
        name = PHOTOS[i % len(PHOTOS)]
        photo = photos[name]
        height, width = photo.shape[:2]
        h = int(rng.uniform(0.6, 1.0) * height)
        w = min(width, round(h * size[0] / size[1]))
        top, left = rng.integers(0, height - h + 1), rng.integers(0, width - w + 1)
        crop = Image.fromarray(photo[top:top + h, left:left + w]).resize(size, Image.BILINEAR)
        if rng.uniform() < 0.5:
            crop = crop.transpose(Image.FLIP_LEFT_RIGHT)
        os.makedirs(os.path.join(root, name), exist_ok=True)
        crop.save(os.path.join(root, name, f"{i:05d}.jpg"), quality=90)
    return root


def cpu_name():
    """The CPU as /proc/cpuinfo names it (with its family and model when the name is generic), and cores."""
    facts = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                facts.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    name = facts.get("model name") or platform.processor() or platform.machine()
    if "cpu family" in facts:
        name += f" (family {facts['cpu family']}, model {facts.get('model', '?')})"
    return f"{name}, {os.cpu_count()} cores"


def load_average():
    return round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None
