"""A full disk at the writes the finetune tests do not reach: `save_lora`, the keras-hub preset and the weights
cache's download. Each on a real 8 MiB tmpfs (`small_disk`): one OSError with errno ENOSPC naming the file and the
filesystem, nothing half-written, and what was there before intact."""

import errno
import os

import numpy as np
import pytest
from conftest import TINY, LoopbackServer, fill

import keras_vit
from keras_vit.weights import download


def _listing(folder):
    """{name: bytes} of the files in `folder` (no sub-folders are expected), the filler left out."""
    return {name: (folder / name).read_bytes() if (folder / name).is_file() else sorted(os.listdir(folder / name))
            for name in os.listdir(folder) if name != "filler"}


def _assert_full(failed, what, disk):
    assert failed.value.errno == errno.ENOSPC
    message = str(failed.value)
    assert f"no space left for {what}" in message and f"free on the filesystem at {disk}" in message, message


@pytest.mark.backend_independent
def test_save_lora_on_a_full_disk_is_refused_and_the_file_there_is_kept(small_disk):
    model = keras_vit.VisionTransformer(**TINY)
    keras_vit.enable_lora(model, 2)
    path = small_disk / "adapters.lora"
    keras_vit.save_lora(model, path)
    before = _listing(small_disk)
    for v in model.trainable_weights:  # new adapters, which must not replace the file's
        v.assign(np.full(v.shape, 0.5, "float32"))
    fill(small_disk, leave=16 * 1024)
    with pytest.raises(OSError) as failed:
        keras_vit.save_lora(model, path)
    _assert_full(failed, f"the LoRA adapters {path}: it needs about", small_disk)
    assert _listing(small_disk) == before  # the earlier file whole, no temporary beside it
    keras_vit.load_lora(keras_vit.VisionTransformer(**TINY), path)  # and it still reads


@pytest.mark.backend_independent
def test_a_keras_hub_preset_on_a_full_disk_is_refused_and_the_preset_there_is_kept(small_disk):
    pytest.importorskip("h5py")
    from keras_vit.weights.keras_hub_save import save_keras_hub_preset

    model = keras_vit.VisionTransformer(**TINY, approximate_gelu=False)
    preset = small_disk / "preset"
    save_keras_hub_preset(model, preset)
    before = {name: (preset / name).read_bytes() for name in os.listdir(preset)}
    fill(small_disk, leave=16 * 1024)
    with pytest.raises(OSError) as failed:
        save_keras_hub_preset(model, preset)
    _assert_full(failed, f"the keras-hub preset {preset}: it needs about", small_disk)
    assert {name: (preset / name).read_bytes() for name in os.listdir(preset)} == before
    assert sorted(os.listdir(small_disk)) == ["filler", "preset"]  # no temporary folder beside it


@pytest.fixture
def big_file_server(tmp_path):
    """A loopback server of a 9 MiB file (more than `small_disk` holds), with its Content-Length."""
    served = tmp_path / "served"
    served.mkdir()
    (served / "big.npz").write_bytes(os.urandom(9 * 2**20))
    server = LoopbackServer(served)
    yield server
    server.close()


@pytest.mark.backend_independent
def test_a_download_larger_than_the_free_space_is_refused_before_its_first_byte(small_disk, big_file_server):
    cache = small_disk / "cache"
    url = f"{big_file_server.url}/big.npz"
    with pytest.raises(OSError) as failed:
        download.fetch(url, "big.npz", str(cache))
    _assert_full(failed, f"the download of {url} to {cache / 'big.npz'}: it needs about 9.0 MiB", small_disk)
    assert os.listdir(cache) == []  # no half file, no temporary, no lock
    assert os.statvfs(small_disk).f_bfree == os.statvfs(small_disk).f_blocks  # nothing written at all


@pytest.mark.backend_independent
def test_a_disk_that_fills_during_a_download_is_named_and_leaves_no_half_file(small_disk, big_file_server,
                                                                             monkeypatch):
    """The server's length checked out (or it sent none) but the disk filled meanwhile: the write fails midway."""
    monkeypatch.setattr(download, "check_free_space", lambda *args: None)
    cache = small_disk / "cache"
    url = f"{big_file_server.url}/big.npz"
    with pytest.raises(OSError) as failed:
        download.fetch(url, "big.npz", str(cache))
    _assert_full(failed, f"the download of {url} to {cache / 'big.npz'}: the disk filled while it was written",
                 small_disk)
    assert os.listdir(cache) == []  # the temporary removed, nothing cached
    assert big_file_server.requests.count("/big.npz") == 1
