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


@pytest.mark.backend_independent
def test_the_parts_of_a_backend_are_balanced_by_the_recorded_file_times(tmp_path):
    """`make test`'s "jax-KofN" parts: every file in exactly one part, the parts' recorded seconds dealt longest
    first to the lighter part, a file not recorded counted as the median; the lane report writes the times
    of its run (every test file there, 0 where none of its tests ran) for the next runs to be dealt by."""
    from conftest import lane_starts, shard_files

    sys.path.insert(0, str(ROOT / "tests"))
    import _lane_report

    seconds = {"test_a": 100.0, "test_b": 60.0, "test_c": 50.0, "test_d": 30.0, "test_e": 20.0, "test_f": 0.0}
    files = [tmp_path / f"{stem}.py" for stem in [*seconds, "test_new"]]
    parts = [shard_files(set(files), k, 2, seconds) for k in (1, 2)]
    assert sorted(parts[0] + parts[1]) == sorted(files)
    totals = [sum(seconds.get(p.stem, 50.0) for p in part) for part in parts]  # test_new: the median, 50 s
    assert sorted(totals) == [150.0, 160.0]  # of 310 s; every other file in name order: 220 | 90
    recorded = {"jax": seconds, "tensorflow": {"test_a": 40.0, "test_b": 20.0}, "torch": {"test_a": 120.0}}
    starts = lane_starts("tensorflow+jax-2of2 jax-1of2+torch", "jax", 2, recorded)
    assert starts == [120.0, 60.0] and lane_starts("", "jax", 2, recorded) == [0.0, 0.0]
    parts = [shard_files(set(files), k, 2, seconds, starts) for k in (1, 2)]
    totals = [sum(seconds.get(p.stem, 50.0) for p in part) + start for part, start in zip(parts, starts)]
    assert sorted(parts[0] + parts[1]) == sorted(files) and max(totals) - min(totals) <= 10.0, totals  # lanes even
    logs, tests = tmp_path / "logs", tmp_path / "tests"
    logs.mkdir()
    tests.mkdir()
    for stem in ("test_x", "test_y"):
        (tests / f"{stem}.py").write_text("")
    (logs / "jax-1of2.xml").write_text('<testsuites><testsuite><testcase classname="tests.test_x" name="t1" '
                                       'time="2.5"/><testcase classname="tests.test_x" name="t2" time="1.0"/>'
                                       '</testsuite></testsuites>')
    assert _lane_report.durations(logs, tests) == {"jax": {"test_x": 3.5, "test_y": 0.0}}
