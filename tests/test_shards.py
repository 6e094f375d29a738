"""Tar shards (issue 46, item 3): `write_shards` writes a folder as WebDataset-style shards, `from_shards`
streams them through tf.data or the PyDataset with the same batches, resumes exactly, splits them between
processes, and refuses or skips bad shards by name."""

import io
import json
import os
import shutil
import tarfile

import numpy as np
import pytest
from conftest import photo_folder

from keras_vit.data import shard_writer
from keras_vit.data import shards as S
from keras_vit.data.folder import read_image, scan
from keras_vit.data.shard_feed import ShardPlan, from_shards, raw_examples
from keras_vit.data.shard_writer import write_shards

# the shards are numpy, Pillow and tf.data, the same on every Keras backend: their tests run once (the torch runs)
pytestmark = pytest.mark.backend_independent

ARGS = {"image_size": 16, "batch_size": 4, "image_dtype": "uint8", "shuffle_buffer": 6}


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """24 photographs (jpg, png and webp) of 3 classes as 5 shards of 5, 5, 5, 5 and 4 samples."""
    tmp = tmp_path_factory.mktemp("shards")
    root = photo_folder(tmp / "photos", per_class=8, size=(40, 48), formats=("jpg", "png", "webp"))
    return root, write_shards(root, str(tmp / "shards" / "train-%06d.tar"), shard_size=5)


def _keys(path):
    with tarfile.open(path) as tar:
        return [m.name for m in tar.getmembers()]


def _jpeg(value):
    from PIL import Image

    out = io.BytesIO()
    Image.fromarray(np.full((20, 24, 3), value, np.uint8)).save(out, format="JPEG")
    return out.getvalue()


def _hand_shards(folder, class_names, shards):
    """Shards written by hand ({name: [(member name, bytes)]}) and their info file: another writer's."""
    os.makedirs(folder, exist_ok=True)
    table = {}
    for name, members in shards.items():
        with tarfile.open(os.path.join(folder, name), "w") as tar:
            for member, data in members:
                info = tarfile.TarInfo(member)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
        table[name] = {"samples": len({m.split(".")[0] for m, _ in members}),
                       "bytes": os.path.getsize(os.path.join(folder, name))}
    with open(os.path.join(folder, "hand-info.json"), "w") as f:
        json.dump({"class_names": class_names, "shards": table}, f)
    return os.path.join(folder, "hand-*.tar")


def test_shards_hold_every_image_once_in_a_seeded_shuffle(written, tmp_path):
    root, pattern = written
    paths = S.shard_paths(pattern)
    assert pattern.endswith("train-{000000..000004}.tar") and len(paths) == 5
    folder = scan(root, validation_split=0)
    shard_set = S.open_shards(pattern)
    assert shard_set.class_names == folder.class_names and shard_set.counts == (5, 5, 5, 5, 4)
    seen, in_order = {}, []
    for path in paths:
        for key, data, kind, label in S.samples(path, shard_set.class_names):
            source = folder.train[int(key)]
            assert label == source[1] and key not in seen
            np.testing.assert_array_equal(S.decode(data, kind), read_image(os.path.join(root, source[0])))
            seen[key] = path
            in_order.append(key)
    assert len(seen) == 24 and in_order != sorted(in_order)  # shuffled across the shards
    again = write_shards(folder, str(tmp_path / "again-%06d.tar"), shard_size=5)
    other = write_shards(folder, str(tmp_path / "other-%06d.tar"), shard_size=5, seed=1)
    assert [_keys(p) for p in S.shard_paths(again)] == [_keys(p) for p in paths]
    assert [_keys(p) for p in S.shard_paths(other)] != [_keys(p) for p in paths]


def test_a_failed_writer_leaves_no_half_shard(written, tmp_path, monkeypatch):
    root, _ = written
    encoded, calls = shard_writer._encoded, []

    def failing(*args):
        calls.append(1)
        if len(calls) == 8:  # in the middle of the second shard
            raise OSError("disk gone")
        return encoded(*args)

    monkeypatch.setattr(shard_writer, "_encoded", failing)
    with pytest.raises(OSError, match="disk gone"):
        write_shards(root, str(tmp_path / "train-%06d.tar"), shard_size=5)
    assert sorted(os.listdir(tmp_path)) == ["train-000000.tar"]  # whole; no half shard, temporary or info
    assert len(_keys(tmp_path / "train-000000.tar")) == 10


def test_tf_data_and_the_pydataset_give_the_same_batches(written):
    pytest.importorskip("tensorflow")
    _, pattern = written
    on_tf = from_shards(pattern, **ARGS, pipeline="tf.data")
    on_py = from_shards(pattern, **ARGS, pipeline="pydataset", workers=2)
    later = from_shards(pattern, **ARGS, pipeline="tf.data", skip_batches=5)
    assert on_tf.class_names == on_py.class_names == ("astronaut", "cat", "coffee")
    stream, resumed = iter(on_tf), iter(later)
    for i in range(9):  # a pass is 6 batches: into the second
        images, labels = next(stream)
        theirs, their_labels = on_py[i]
        assert theirs.dtype == np.uint8 and theirs.shape == (4, 16, 16, 3)
        np.testing.assert_array_equal(labels.numpy(), their_labels)
        assert np.abs(images.numpy().astype(int) - theirs).max() <= 1  # two resizers' float rounding
        if i >= 5:
            np.testing.assert_array_equal(next(resumed)[0].numpy(), images.numpy())


def test_skip_batches_resumes_exactly_and_each_pass_holds_every_sample_once(written):
    _, pattern = written
    whole = from_shards(pattern, **ARGS, pipeline="pydataset")
    later = from_shards(pattern, **ARGS, pipeline="pydataset", skip_batches=4)
    batches = [whole[i] for i in range(16)]
    for i in range(12):  # across the ends of the first and second passes
        images, labels = later[i]
        np.testing.assert_array_equal(images, batches[4 + i][0])
        np.testing.assert_array_equal(labels, batches[4 + i][1])
    for p in range(2):
        labels = np.concatenate([b[1] for b in batches[6 * p:6 * p + 6]])
        assert np.bincount(labels).tolist() == [8, 8, 8]
    assert not np.array_equal(batches[0][0], batches[6][0])  # a new order and new crops each pass
    once = from_shards(pattern, **ARGS, pipeline="pydataset", repeat=False, training=False)
    assert len(once) == 6 and np.bincount(np.concatenate([once[i][1] for i in range(6)])).tolist() == [8, 8, 8]


def test_the_buffer_plan_is_a_pure_function_of_seed_and_pass(written):
    shard_set = S.open_shards(written[1])
    shards = S.pass_shards(shard_set, 0, 0)
    read = np.concatenate([np.arange(shard_set.offsets[s], shard_set.offsets[s] + shard_set.counts[s])
                           for s in shards])
    order = S.pass_order(shard_set, shards, 0, 0, 6)
    np.testing.assert_array_equal(order, S.pass_order(shard_set, shards, 0, 0, 6))
    assert sorted(order.tolist()) == list(range(24)) and not np.array_equal(order, read)
    when_read = {sample: i for i, sample in enumerate(read.tolist())}
    assert all(when_read[s] < i + 6 for i, s in enumerate(order.tolist()))  # never more than 6 held
    np.testing.assert_array_equal(S.pass_order(shard_set, shards, 0, 0, 1), read)
    assert not np.array_equal(S.pass_order(shard_set, S.pass_shards(shard_set, 0, 1), 0, 1, 6), order)


def _pass_bytes(plan):
    return [example[0] for example in raw_examples(plan, repeat=False)]


def test_processes_read_disjoint_shards_or_their_rows_of_each_batch(written, tmp_path):
    shard_set = S.open_shards(written[1])
    plans = [ShardPlan(shard_set, 0, 6, True, 4, i, 2) for i in range(2)]
    assert all(p.by_shard for p in plans)
    mine = [_pass_bytes(p) for p in plans]
    everything = _pass_bytes(ShardPlan(shard_set, 0, 6, True, 4))
    assert not set(mine[0]) & set(mine[1]) and sorted(mine[0] + mine[1]) == sorted(everything)
    two = S.open_shards(write_shards(scan(written[0], validation_split=0), str(tmp_path / "two-%06d.tar"),
                                     shard_size=12))
    rows = [ShardPlan(two, 0, 6, True, 4, i, 4) for i in range(4)]  # fewer shards than processes: rows
    assert not any(p.by_shard for p in rows)
    parts = [_pass_bytes(p) for p in rows]
    whole = _pass_bytes(ShardPlan(two, 0, 6, True, 4))
    assert [parts[i % 4][i // 4] for i in range(24)] == whole
    batches = [from_shards(str(tmp_path / "two-*.tar"), **ARGS, pipeline="pydataset", process_index=i,
                           process_count=4) for i in range(4)]
    one = from_shards(str(tmp_path / "two-*.tar"), **ARGS, pipeline="pydataset")
    np.testing.assert_array_equal(np.concatenate([b[3][0] for b in batches]), one[3][0])


@pytest.mark.timeout(120)
def test_a_truncated_shard_loses_its_remaining_samples_with_a_warning(written, tmp_path):
    for path in S.shard_paths(written[1]):
        shutil.copy(path, tmp_path)
    shutil.copy(os.path.join(os.path.dirname(path), "train-info.json"), tmp_path)
    cut = tmp_path / "train-000002.tar"
    with tarfile.open(cut) as tar:
        third = tar.getmembers()[4]  # the image of its third sample
    os.truncate(cut, third.offset_data + third.size // 2)
    with pytest.warns(UserWarning, match=r"train-000002.tar is truncated .*last 3 of 5 samples are skipped"):
        once = from_shards(str(tmp_path / "train-*.tar"), **ARGS, pipeline="pydataset", repeat=False,
                           drop_remainder=False)
    assert once.shard_set.counts == (5, 5, 2, 5, 4) and len(once) == 6
    assert sum(len(once[i][1]) for i in range(len(once))) == 21


def test_a_sample_without_a_label_naming_a_class_is_refused_by_name(tmp_path):
    image = _jpeg(90)
    for label, match in ((None, r"sample 'b'.*no label"), (b"7", r"sample 'b'.*label 7 is not a class"),
                         (b'{"label": "dog"}', r"sample 'b'.*label 'dog' is not a class")):
        members = [("a.jpg", image), ("a.json", b'{"label": "cat"}'), ("b.jpg", image)]
        members += [] if label is None else [("b.json" if label.startswith(b"{") else "b.cls", label)]
        pattern = _hand_shards(tmp_path / str(len(match)), ["bird", "cat"], {"hand-0.tar": members})
        batches = from_shards(pattern, 8, 2, pipeline="pydataset", repeat=False)
        with pytest.raises(ValueError, match=match):
            batches[0]


def test_shards_of_different_class_sets_and_empty_patterns_are_refused(tmp_path):
    image = _jpeg(10)
    _hand_shards(tmp_path / "a", ["bird", "cat"], {"hand-0.tar": [("x.jpg", image), ("x.cls", b"1")]})
    _hand_shards(tmp_path / "b", ["bird", "cat", "dog"], {"hand-1.tar": [("y.jpg", image), ("y.cls", b"2")]})
    with pytest.raises(ValueError, match=r"different class sets: .*hand-0.tar.* 2 classes .*hand-1.tar.* 3"):
        from_shards(str(tmp_path / "*" / "hand-*.tar"), 8, 2)
    with pytest.raises(ValueError, match="no shard matches"):
        from_shards(str(tmp_path / "nothing-*.tar"), 8, 2)
    with pytest.raises(ValueError, match=r"2 shard\(s\) .* do not exist: .*hand-1.tar"):
        from_shards(str(tmp_path / "a" / "hand-{0..2}.tar"), 8, 2)


def test_the_pydatasets_threads_feed_fit(written):
    """Keras' PyDataset asks for its batches from several threads, in any order: the one stream they share
    gives each batch its own rows."""
    import keras_vit

    train = from_shards(written[1], 32, 4, image_dtype="uint8", pipeline="pydataset", workers=2)
    model = keras_vit.VisionTransformer(image_size=32, patch_size=8, hidden_size=16, mlp_dim=32, num_heads=2,
                                        num_layers=1, classes=3, input_dtype="uint8")
    keras_vit.recipes.compile_for_finetuning(model, total_steps=4, warmup_steps=0, batch_size=4)
    history = model.fit(train, steps_per_epoch=2, epochs=2, verbose=0)
    assert np.isfinite(history.history["loss"]).all() and len(history.history["loss"]) == 2


def test_labels_and_class_sizes_come_without_reading_the_images(written):
    """An evaluation's labels are read from the label members alone (the images skipped unread), and the
    classes' sizes from the info file that write_shards writes."""
    root, pattern = written
    shard_set = S.open_shards(pattern)
    read = [(f"{os.path.basename(p)}:{key}", label) for p in shard_set.paths
            for key, _, _, label in S.samples(p, shard_set.class_names)]
    assert S.sample_labels(shard_set) == read
    parts = [parts for p in shard_set.paths for _, parts, _ in S._grouped(p, read=S._is_label)]
    assert all(data is None for each in parts for ext, data in each.items() if ext not in S.LABEL_EXTENSIONS)
    assert shard_set.class_counts == tuple(np.bincount([label for _, label in read]).tolist()) == (8, 8, 8)
    numbers = [3, 17]
    found = S.read_samples(shard_set, numbers)
    everything = [s for p in shard_set.paths for s in S.samples(p, shard_set.class_names)]
    assert sorted(found) == numbers and all(found[n][0] == everything[n][0] for n in numbers)
