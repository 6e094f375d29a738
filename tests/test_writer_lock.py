"""One writer per output folder (keras_vit.writer_lock): a second writer refused by the holder's name, stale
locks taken over, the lock gone when the writer ends; finetune DIR and the examples' recipe hold it."""

import json
import os
import subprocess
import sys
import threading
import time

import pytest

from keras_vit import cli, writer_lock
from keras_vit.fileio import host_name

pytestmark = pytest.mark.backend_independent


def test_of_two_writers_started_together_exactly_one_gets_the_lock(tmp_path):
    barrier, results = threading.Barrier(8), []

    def writer():
        barrier.wait()
        try:
            with writer_lock.hold(tmp_path / "out"):
                results.append("held")
                time.sleep(0.2)
        except writer_lock.FolderLockedError as err:
            results.append(str(err))

    threads = [threading.Thread(target=writer) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results.count("held") == 1
    refusals = [r for r in results if r != "held"]
    assert all(f"is being written by process {os.getpid()} on {host_name()}" in r for r in refusals)
    assert not os.path.exists(writer_lock.lock_path(tmp_path / "out"))  # gone when the writer ended


def _lock(tmp_path, **holder):
    path = writer_lock.lock_path(tmp_path / "out")
    with open(path, "w") as f:
        json.dump({"pid": 1, "host": host_name(), "started": time.time(), "command": "keras-vit finetune x", **holder}, f)
    return path


def test_stale_locks_are_taken_over_and_live_ones_refused(tmp_path, capsys):
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    for holder, stale in (({"pid": gone.pid}, "its process"), ({"host": "elsewhere", "started": 0}, "another host's")):
        _lock(tmp_path, **holder)
        with writer_lock.hold(tmp_path / "out") as path:
            assert json.loads(open(path).read())["pid"] == os.getpid()
        assert f"taking over the stale lock {path} ({stale}" in capsys.readouterr().err
    path = _lock(tmp_path, host="elsewhere")  # another host's, fresh: its process may be alive
    with pytest.raises(writer_lock.FolderLockedError, match=r"process 1 on elsewhere, started .* \(keras-vit finetune x\)"):
        with writer_lock.hold(tmp_path / "out"):
            pass
    with open(path, "w") as f:  # a writer killed while writing its lock: refused while fresh, taken over once old
        f.write("{")
    with pytest.raises(writer_lock.FolderLockedError, match="a process that has not said which"):
        with writer_lock.hold(tmp_path / "out"):
            pass
    os.utime(path, (time.time() - 120,) * 2)
    with writer_lock.hold(tmp_path / "out"):
        pass
    assert "unreadable and 120 s old" in capsys.readouterr().err
    assert os.path.exists(path) is False


def test_finetune_and_the_examples_refuse_a_folder_another_run_writes(tmp_path, capsys):
    from keras_vit.recipes import finetune

    out = tmp_path / "out"
    with writer_lock.hold(out):
        assert cli.main(["finetune", str(tmp_path), "--out", str(out), "--quiet"]) == 2
        assert f"is being written by process {os.getpid()}" in capsys.readouterr().err
        with pytest.raises(SystemExit, match=f"--output-dir '{out}' is being written by process {os.getpid()}"):
            finetune.main("cifar10", ["--output-dir", str(out), "--steps", "1"])
    assert not out.exists()  # refused before anything was written


def test_two_fetches_of_one_checkpoint_download_it_once(tmp_path, capsys):
    """The weights cache: of two threads fetching one file from a loopback server, one downloads and the
    other waits for it (said once), then reads the finished file."""
    import zipfile

    from conftest import LoopbackServer

    from keras_vit.weights import download

    served = tmp_path / "served"
    served.mkdir()
    with zipfile.ZipFile(served / "w.npz", "w") as archive:
        archive.writestr("a.npy", b"\0" * (4 << 20))
    server = LoopbackServer(served)
    results, barrier = [], threading.Barrier(2)

    def fetch():
        barrier.wait()
        results.append(download.fetch(f"{server.url}/w.npz", "w.npz", str(tmp_path / "cache")))

    try:
        threads = [threading.Thread(target=fetch) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        server.close()
    assert results == [str(tmp_path / "cache" / "w.npz")] * 2
    assert server.requests.count("/w.npz") == 1  # downloaded once
    assert os.listdir(tmp_path / "cache") == ["w.npz"]  # no lock or temporary left
    err = capsys.readouterr().err
    assert err.count("waiting for process") <= 1


def test_a_second_export_to_one_folder_is_refused_by_the_first_ones_name(tmp_path):
    from conftest import TINY

    import keras_vit
    from keras_vit.export import export

    model = keras_vit.VisionTransformer(**TINY)
    with writer_lock.hold(tmp_path / "served"):
        with pytest.raises(writer_lock.FolderLockedError, match=f"is being written by process {os.getpid()}"):
            export(model, tmp_path / "served", "onnx")
    assert not (tmp_path / "served").exists()
