"""The examples' data path on a fresh install: tensorflow-datasets' real download_and_prepare of
CIFAR-10 (download, extraction, example generation, shards), served from a loopback mirror of the
official archive in its real format (a tarball of `cifar-10-batches-bin/*.bin` records)."""

import numpy as np
import pytest
from conftest import CIFAR10_ARCHIVE as ARCHIVE, CIFAR10_NAMES as NAMES

tf = pytest.importorskip("tensorflow")
tfds = pytest.importorskip("tensorflow_datasets")

from keras_vit import data  # noqa: E402


@pytest.mark.backend_independent
def test_load_downloads_extracts_and_prepares_the_archive(tmp_path, cifar10_mirror):
    server, test_images, test_labels = cifar10_mirror
    train, test = data.load("cifar10", image_size=32, batch_size=2, data_dir=str(tmp_path / "tfds"),
                            repeat=False, shuffle_buffer=1)
    assert f"/{ARCHIVE}" in server.requests
    assert sum(int(labels.shape[0]) for _, labels in train) == 10
    images, labels = next(iter(test.unbatch().batch(3)))
    # The eval pipeline at the stored size is a scaling only, so the stored pixels come back exactly.
    got = sorted(zip(labels.numpy().tolist(), np.rint(images.numpy() * 127.5 + 127.5).astype(np.uint8)),
                 key=lambda pair: pair[0])
    assert [label for label, _ in got] == test_labels
    for (_, image), expected in zip(got, test_images):
        np.testing.assert_array_equal(image, expected)
    assert data.dataset_info("cifar10", data_dir=str(tmp_path / "tfds")).class_names == tuple(NAMES)
    requests = len(server.requests)
    data.load("cifar10", image_size=32, batch_size=2, data_dir=str(tmp_path / "tfds"))
    assert len(server.requests) == requests  # prepared once: the second load reads the shards


@pytest.mark.backend_independent
@pytest.mark.timeout(60)  # tfds' default retries kept an offline user waiting about 3.5 minutes
def test_a_failed_download_names_the_dataset_the_url_and_data_dir(tmp_path, cifar10_mirror):
    from tensorflow_datasets.core.download import downloader

    retries = downloader.MAX_RETRIES
    server, _, _ = cifar10_mirror
    server.close()  # the mirror is down
    with pytest.raises(OSError) as info:
        data.load("cifar10", image_size=32, batch_size=2, data_dir=str(tmp_path / "tfds"))
    message = str(info.value)
    assert f"Could not download TFDS dataset 'cifar10' from {server.url}/{ARCHIVE}" in message
    assert "`data_dir` (--data-dir DIR in examples/finetune_*.py)" in message
    assert "\n" not in message
    assert not tfds.builder("cifar10", data_dir=str(tmp_path / "tfds")).is_prepared()
    assert downloader.MAX_RETRIES == retries  # tfds' own setting is back for the user's other downloads
