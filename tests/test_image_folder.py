"""A folder of one's own images as a dataset (keras_vit.data.from_directory, keras_vit.data.folder)."""

import json
import os
import struct
import subprocess
import zlib

import numpy as np
import pytest
from conftest import photo_folder, python_without

from keras_vit import data
from keras_vit.data import folder as F
from keras_vit.data.preprocess import resize_bilinear
from keras_vit.data.stream import crop_boxes

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# the data is numpy, Pillow and tf.data, the same on every Keras backend: its tests run once (the torch runs),
# all but the TensorFlow-free one, which trains on the jax and torch lanes
independent = pytest.mark.backend_independent


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    return photo_folder(tmp_path_factory.mktemp("photos"))


def _pixels(folder, part="train"):
    return {r[0]: F.read_image(os.path.join(folder.root, r[0])) for r in getattr(folder, part)}


@independent
def test_classes_nested_files_stratified_split_and_its_record(photos, tmp_path):
    folder = F.scan(photos, validation_split=0.25, seed=3)
    assert folder.class_names == ("astronaut", "cat", "coffee")
    assert folder.counts() == {"astronaut": (3, 1), "cat": (3, 1), "coffee": (3, 1)}  # ceil(4 x 0.25) = 1
    assert "cat/more/cat_3.png" in {r[0] for r in folder.train + folder.validation}  # nested folders are read
    for path, label, height, width, decoder in folder.train + folder.validation:
        assert path.split("/")[0] == folder.class_names[label] and (height, width) == (120, 160)
        assert decoder == (F.TF_JPEG if path.endswith(".jpg") else F.TF_PNG)
    assert F.scan(photos, 0.25, seed=3) == folder  # the split is a function of the seed
    assert {r[0] for r in F.scan(photos, 0.5, seed=4).validation} != {r[0] for r in F.scan(photos, 0.5).validation}
    folder.save(tmp_path / "split.json")
    record = json.loads((tmp_path / "split.json").read_text())
    assert record["validation"] == [[r[0], folder.class_names[r[1]]] for r in folder.validation]
    assert record["class_names"] == list(folder.class_names) and record["seed"] == 3


def _png_claiming(path, width, height):
    """A small PNG whose header says `width` x `height` (the CRC fixed), as a huge image's header does."""
    from PIL import Image

    Image.new("RGB", (8, 8)).save(path)
    raw = bytearray(path.read_bytes())
    raw[16:24] = struct.pack(">II", width, height)
    raw[29:33] = struct.pack(">I", zlib.crc32(bytes(raw[12:29])))
    path.write_bytes(bytes(raw))


@independent
def test_unusable_files_are_skipped_and_listed_or_refused_with_strict(tmp_path):
    root = photo_folder(tmp_path / "photos", per_class=3)
    (root / "cat" / "notes.txt").write_text("not an image")
    (root / "cat" / ".DS_Store").write_bytes(b"\0\0\0\1Bud1")
    (root / "cat" / "empty.jpg").write_bytes(b"")
    whole = (root / "cat" / "cat_0.jpg").read_bytes()
    (root / "coffee" / "cut.jpg").write_bytes(whole[: len(whole) // 2])
    (root / "coffee" / "text.png").write_text("a text file named like an image")
    _png_claiming(root / "astronaut" / "huge.png", 10000, 10000)
    folder = F.scan(root, 0.34, verify="full")
    reasons = dict(folder.skipped)
    assert set(reasons) == {"cat/empty.jpg", "coffee/cut.jpg", "coffee/text.png", "astronaut/huge.png"}
    assert "0 bytes" in reasons["cat/empty.jpg"] and "truncated" in reasons["coffee/cut.jpg"]
    assert "10000x10000 pixels" in reasons["astronaut/huge.png"]
    assert sum(folder.counts()["cat"]) == 3  # .txt and .DS_Store are not image files at all
    with pytest.raises(ValueError, match=r"4 file\(s\) under .* cannot be used \(strict\).*empty.jpg"):
        F.scan(root, 0.34, strict=True, verify="full")
    header = F.scan(root, 0.34)  # the default reads headers: the truncated file is the feed's to skip
    assert set(dict(header.skipped)) == set(reasons) - {"coffee/cut.jpg"}
    assert "coffee/cut.jpg" in {r[0] for r in header.train + header.validation}


@independent
def test_formats_orientation_and_colour_modes_read_as_rgb(tmp_path):
    from PIL import Image

    rng = np.random.default_rng(0)
    rgb = rng.integers(0, 256, (20, 30, 3), dtype=np.uint8)
    image = Image.fromarray(rgb)
    for kind in ("png", "bmp", "webp"):
        image.save(tmp_path / f"a.{kind}", **({"lossless": True} if kind == "webp" else {}))
        np.testing.assert_array_equal(F.read_image(tmp_path / f"a.{kind}"), rgb)
    frames = [Image.fromarray(np.full((10, 12, 3), v, np.uint8)) for v in (0, 255)]
    frames[0].save(tmp_path / "anim.gif", save_all=True, append_images=frames[1:])
    assert F.read_image(tmp_path / "anim.gif").max() == 0  # the first frame
    Image.fromarray(rgb[..., 0]).save(tmp_path / "grey.png")
    np.testing.assert_array_equal(F.read_image(tmp_path / "grey.png"), np.repeat(rgb[..., :1], 3, -1))
    Image.fromarray(np.dstack([rgb, rgb[..., :1]])).save(tmp_path / "rgba.png")
    np.testing.assert_array_equal(F.read_image(tmp_path / "rgba.png"), rgb)
    deep = rng.integers(0, 65536, (20, 30), dtype=np.uint16)
    Image.fromarray(deep).save(tmp_path / "deep.png")
    np.testing.assert_array_equal(F.read_image(tmp_path / "deep.png")[..., 0], deep >> 8)
    Image.fromarray(rgb).convert("CMYK").save(tmp_path / "cmyk.jpg", quality=100)
    assert F.read_image(tmp_path / "cmyk.jpg").shape == (20, 30, 3)
    exif = Image.Exif()
    exif[0x0112] = 6  # stored rotated: shown turned 90 degrees clockwise
    image.save(tmp_path / "turned.png", exif=exif)
    np.testing.assert_array_equal(F.read_image(tmp_path / "turned.png"), np.rot90(rgb, -1))
    assert F.probe(tmp_path / "turned.png")[0] == (30, 20, F.PILLOW)  # the size as shown
    assert F.probe(tmp_path / "deep.png")[0][2] == F.PILLOW and F.probe(tmp_path / "grey.png")[0][2] == F.TF_PNG


@independent
def test_numpy_resize_is_tensorflows_bilinear_resize():
    tf = pytest.importorskip("tensorflow")
    rng = np.random.default_rng(1)
    for shape, size in (((37, 53, 3), (24, 24)), ((10, 7, 3), (31, 40)), ((224, 224, 3), (224, 224))):
        image = rng.integers(0, 256, shape, dtype=np.uint8)
        ours = resize_bilinear(image, size)
        np.testing.assert_allclose(ours, tf.image.resize(image, size, "bilinear").numpy(), atol=2e-4, rtol=0)


@independent
def test_inception_crops_keep_to_the_area_and_aspect_ranges():
    rng = np.random.default_rng(0)
    heights, widths = rng.integers(300, 400, 2000), rng.integers(300, 400, 2000)
    boxes = crop_boxes(heights, widths, rng)
    top, left, h, w = boxes.T
    assert (top >= 0).all() and (left >= 0).all() and (top + h <= heights).all() and (left + w <= widths).all()
    area = h * w / (heights * widths)
    assert area.min() > 0.04 and area.max() <= 1 and 0.4 < np.median(area) < 0.6
    whole = (h == heights) & (w == widths)
    ratio = w[~whole] / h[~whole]
    assert ratio.min() > 0.7 and ratio.max() < 1.4  # 3/4 to 4/3, up to rounding
    np.testing.assert_array_equal(crop_boxes([1], [1], rng), [[0, 0, 1, 1]])  # nothing smaller fits


@independent
def test_tf_data_and_the_pydataset_give_the_same_batches(tmp_path):
    pytest.importorskip("tensorflow")
    root = photo_folder(tmp_path / "ça va", per_class=4, formats=("jpg", "png", "webp", "bmp"))
    os.rename(root / "cat", root / "chat noir")  # spaces and accents in names
    from PIL import Image

    exif = Image.Exif()
    exif[0x0112] = 8
    Image.fromarray(F.read_image(root / "coffee" / "coffee_0.jpg")).save(root / "coffee" / "turned.jpg", exif=exif)
    args = dict(image_size=(24, 32), batch_size=4, validation_split=0.25, image_dtype="uint8", eval_batch_size=3)
    tf_train, tf_val = data.from_directory(root, **args, pipeline="tf.data")
    assert tf_train.class_names == ("astronaut", "chat noir", "coffee")
    py_train, py_val = data.from_directory(tf_train.image_folder, **args, pipeline="pydataset")
    assert py_train.num_batches is None and len(py_val) == 2
    stream = iter(tf_train)
    for i in range(6):  # 24 images: two passes over the 10 training images and a bit of a third
        images, labels = next(stream)
        theirs, their_labels = py_train[i]
        assert images.dtype == theirs.dtype == np.uint8 and theirs.shape == (4, 24, 32, 3)
        np.testing.assert_array_equal(labels.numpy(), their_labels)
        assert np.abs(images.numpy().astype(int) - theirs).max() <= 1  # two resizers' float rounding
    for i, (images, labels) in enumerate(tf_val):
        np.testing.assert_array_equal(labels.numpy(), py_val[i][1])
        assert np.abs(images.numpy().astype(int) - py_val[i][0]).max() <= 1


@independent
def test_skip_batches_resumes_the_stream_and_processes_split_each_batch(photos):
    args = dict(image_size=16, batch_size=4, validation_split=0.25, pipeline="pydataset")
    whole, _ = data.from_directory(photos, **args)
    later, _ = data.from_directory(photos, **args, skip_batches=3)
    halves = [data.from_directory(photos, **args, process_index=i, process_count=2)[0] for i in range(2)]
    for i in range(3):
        np.testing.assert_array_equal(later[i][0], whole[3 + i][0])
        np.testing.assert_array_equal(np.concatenate([h[i][0] for h in halves]), whole[i][0])
    once, _ = data.from_directory(photos, **args, repeat=False, drop_remainder=False)
    labels = np.concatenate([once[i][1] for i in range(len(once))])
    assert len(once) == 3 and sorted(labels) == sorted(r[1] for r in once.image_folder.train)  # one pass, each once


def test_tensorflow_free_path_trains(tmp_path):
    """A machine with keras-vit[jax] or [torch] only: no TensorFlow to import; the folder streams through
    the PyDataset into fit on the backend of this test run."""
    import keras

    if keras.backend.backend() == "tensorflow":
        pytest.skip("the TensorFlow-free path is for the jax and torch backends")
    root = photo_folder(tmp_path / "photos", per_class=3)
    python = python_without(tmp_path, r"^(tensorflow|tf_keras)([-_.].*)?$")
    code = (
        "import sys, keras_vit\n"
        "from keras_vit import data\n"
        f"train, val = data.from_directory({str(root)!r}, 32, 4, validation_split=0.34, image_dtype='uint8')\n"
        "model = keras_vit.VisionTransformer(image_size=32, patch_size=8, hidden_size=16, mlp_dim=32, num_heads=2, "
        "num_layers=1, classes=3, input_dtype='uint8')\n"
        "keras_vit.recipes.compile_for_finetuning(model, total_steps=2, warmup_steps=0, batch_size=4)\n"
        "history = model.fit(train, steps_per_epoch=2, epochs=1, validation_data=val, verbose=0, shuffle=False)\n"
        "print(type(train).__name__, 'tensorflow' in sys.modules, sorted(history.history))\n")
    done = subprocess.run([python, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "KERAS_BACKEND": keras.backend.backend(), "PYTHONPATH": ROOT})
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split()[-6:] == ["Batches", "False", "['accuracy',", "'loss',", "'val_accuracy',",
                                         "'val_loss']"]


# ---------------------------------------------------------------- bad folders: one message naming it
@independent
def test_bad_folders_are_refused_by_name(tmp_path):
    with pytest.raises(ValueError, match="is not a folder"):
        F.scan(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="empty.* holds no class folders"):
        F.scan(tmp_path / "empty")
    one = photo_folder(tmp_path / "one", per_class=2)
    for name in ("cat", "coffee"):
        os.rename(one / name, tmp_path / f"moved-{name}")
    with pytest.raises(ValueError, match="one class only \\('astronaut'\\)"):
        F.scan(one)
    bare = photo_folder(tmp_path / "bare", per_class=2)
    (bare / "dog").mkdir()
    (bare / "dog" / "readme.txt").write_text("no photos yet")
    with pytest.raises(ValueError, match="class folder .*dog' holds no image files"):
        F.scan(bare)
    cased = photo_folder(tmp_path / "cased", per_class=2)
    os.symlink(cased / "cat", cased / "Cat")
    with pytest.raises(ValueError, match="differ only in case: 'Cat' and 'cat'"):
        F.scan(cased)
    small = photo_folder(tmp_path / "small", per_class=2)
    os.remove(small / "cat" / "more" / "cat_1.png")
    with pytest.raises(ValueError, match=r"class 'cat' .* has 1 usable image.*no training images \(0 train, 1 valid"):
        F.scan(small, 0.1)
    with pytest.raises(ValueError, match="validation_split must be a number in \\[0, 1\\)"):
        F.scan(small, 1.0)


@independent
def test_symlinked_class_folders_and_a_labels_csv(tmp_path):
    root = photo_folder(tmp_path / "photos", per_class=2)
    elsewhere = photo_folder(tmp_path / "elsewhere", per_class=2)
    os.symlink(elsewhere / "coffee", root / "espresso")
    assert F.scan(root, 0.5).counts()["espresso"] == (1, 1)
    flat = tmp_path / "flat"
    flat.mkdir()
    rows = ["path,label"]
    for i, (path, label, *_) in enumerate(F.scan(root, 0).train):
        os.link(root / path, flat / f"{i}.img.{path.rsplit('.', 1)[1]}")
        rows.append(f"{i}.img.{path.rsplit('.', 1)[1]},{'yes' if label == 1 else 'no'}")
    (flat / "labels.csv").write_text("\n".join(rows) + "\n")
    folder = F.scan(flat, 0.5)
    assert folder.class_names == ("no", "yes") and folder.counts() == {"no": (3, 3), "yes": (1, 1)}
    (flat / "labels.csv").write_text("\n".join([*rows, "gone.jpg,no"]) + "\n")
    with pytest.raises(ValueError, match="labels.csv, row 9: no file .*gone.jpg"):
        F.scan(flat)
