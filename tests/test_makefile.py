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
