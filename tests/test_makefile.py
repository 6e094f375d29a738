"""The README's commands pick a Python >= 3.10 that exists, say which first, and refuse an older one."""

import os
import pathlib
import platform
import shutil
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).parents[1]
OLD_PYTHON = "#!/bin/sh\nif [ \"$1\" = --version ]; then echo 'Python 3.9.2'; exit 0; fi\nexit 1\n"


def _make_python(tmp_path, **interpreters):
    """`make python` with only `interpreters` (name -> a real Python, or None for a Python 3.9) on PATH."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, target in interpreters.items():
        if target is None:
            (bin_dir / name).write_text(OLD_PYTHON)
            (bin_dir / name).chmod(0o755)
        else:
            (bin_dir / name).symlink_to(target)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHON", "MAKEFLAGS")}
    env["PATH"] = str(bin_dir)
    return subprocess.run([shutil.which("make"), "-s", "-C", str(ROOT), "python", f"VENV={tmp_path / 'venv'}"],
                          env=env, capture_output=True, text=True, timeout=60)


@pytest.mark.backend_independent
@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_an_old_python3_is_passed_over_for_a_versioned_one(tmp_path):
    done = _make_python(tmp_path, python3=None, **{"python3.12": sys.executable})
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.splitlines()[0] == f"keras-vit: Python {platform.python_version()} ({tmp_path}/bin/python3.12)"


@pytest.mark.backend_independent
@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_python3_is_taken_when_its_version_fits(tmp_path):
    done = _make_python(tmp_path, python3=sys.executable, **{"python3.10": None})
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.splitlines()[0].endswith(f"({tmp_path}/bin/python3)")


@pytest.mark.backend_independent
@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_only_an_old_python_is_refused_by_name(tmp_path):
    done = _make_python(tmp_path, python3=None)
    assert done.returncode != 0
    assert "keras-vit needs Python >= 3.10; found Python 3.9.2" in done.stdout


SHARED_TEST = """import os, pathlib, time


def test_one():
    with open(os.environ["LOG"], "a") as log:
        log.write(f"{pathlib.Path(__file__).stem} {os.getpid()}\\n")
    if pathlib.Path(__file__).stem == "test_a":  # the first file: held until the other process has taken one
        deadline = time.monotonic() + 60
        while len(os.listdir(os.environ["KERAS_VIT_TEST_CLAIMS"])) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)


def test_two():
    with open(os.environ["LOG"], "a") as log:
        log.write(f"{pathlib.Path(__file__).stem} {os.getpid()}\\n")
"""


@pytest.mark.backend_independent
def test_the_processes_sharing_a_backend_take_each_file_once_whole_longest_first(tmp_path):
    """`make test`'s "jax-KofN" processes (tests/_claims.py): two pytest processes on six test files, the first
    file held until the other process has taken one: every test ran once, each file's tests in one process, both
    processes took files, and each reported only its own; the order is the recorded seconds', longest first, a
    file not recorded counted as the median; the lane report writes the times of its run (every test file there,
    0 where none of its tests ran) for the next runs to be ordered by."""
    from _claims import longest_first

    sys.path.insert(0, str(ROOT / "tests"))
    import _lane_report

    seconds = {"test_a": 100.0, "test_b": 60.0, "test_c": 50.0, "test_d": 30.0, "test_e": 20.0, "test_f": 0.0}
    files = [tmp_path / f"{stem}.py" for stem in ["test_new", *seconds]]
    order = [p.stem for p in longest_first(set(files), seconds)]
    assert order == ["test_a", "test_b", "test_c", "test_new", "test_d", "test_e", "test_f"]  # test_new: 50 s

    tree, log = tmp_path / "tree", tmp_path / "log.txt"
    tree.mkdir()
    for stem in "abcdef":
        (tree / f"test_{stem}.py").write_text(SHARED_TEST)
    env = {**os.environ, "PYTHONPATH": str(ROOT / "tests"), "LOG": str(log), "KERAS_BACKEND": "not-recorded",
           "KERAS_VIT_TEST_CLAIMS": str(tmp_path / "claims")}
    runs = [subprocess.Popen([sys.executable, "-m", "pytest", "-q", "-p", "_claims", "-p", "no:cacheprovider",
                              "--rootdir", str(tree), str(tree)], cwd=tree, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True, env={**env, "KERAS_VIT_TEST_SHARD": f"{k}/2"})
            for k in (1, 2)]
    outs = [run.communicate(timeout=120)[0] for run in runs]
    assert [run.returncode for run in runs] == [0, 0], outs
    ran = [line.split() for line in log.read_text().splitlines()]
    assert sorted(stem for stem, _ in ran) == sorted(f"test_{s}" for s in "abcdef" for _ in range(2))
    by_file = {stem: {pid for s, pid in ran if s == stem} for stem, _ in ran}
    assert all(len(pids) == 1 for pids in by_file.values()), by_file
    assert len({pid for _, pid in ran}) == 2, by_file
    counts = sorted(int(out.split(" passed")[0].split()[-1]) for out in outs)
    assert sum(counts) == 12 and counts[0] >= 2, outs
    bad = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "_claims", str(tree)], cwd=tree, text=True,
                         capture_output=True, env={**env, "KERAS_VIT_TEST_SHARD": "3/2"}, timeout=120)
    assert "KERAS_VIT_TEST_SHARD=3/2: expected K/N with 1 <= K <= N" in bad.stdout + bad.stderr

    logs, tests = tmp_path / "logs", tmp_path / "tests"
    logs.mkdir()
    tests.mkdir()
    for stem in ("test_x", "test_y"):
        (tests / f"{stem}.py").write_text("")
    (logs / "jax-1of2.xml").write_text('<testsuites><testsuite><testcase classname="tests.test_x" name="t1" '
                                       'time="2.5"/><testcase classname="tests.test_x" name="t2" time="1.0"/>'
                                       '</testsuite></testsuites>')
    assert _lane_report.durations(logs, tests) == {"jax": {"test_x": 3.5, "test_y": 0.0}}
