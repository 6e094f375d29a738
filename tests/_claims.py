"""The processes of `make test` that share one backend's test files: "jax-1of2" and "jax-2of2" are two pytest
processes given KERAS_VIT_TEST_SHARD=K/N and the same KERAS_VIT_TEST_CLAIMS folder. Both walk the backend's test
files longest first (the backend's seconds per file in tests/durations.json; a file not there counts as their
median), and each file goes, whole, to the first process that reaches it: that process makes the file's entry in
the folder (one `mkdir`, which only one process can make) and runs its tests; the other skips them without a
report. A lane whose other backend ends early takes more of the shared files, so that the lanes end together
whatever the machine's speed that day; a static split by recorded times did not (the machine's speed drifts
by a fifth from one run to the next, and not alike for every backend).

conftest.py imports the two hooks; `python -m pytest -p _claims` (tests/ on the path) loads them alone.
"""

import functools
import json
import os
import pathlib

import pytest

DURATIONS = pathlib.Path(__file__).with_name("durations.json")  # backend -> test file stem -> seconds, of a CI run


def longest_first(files, seconds):
    """The test `files` (paths) ordered by `seconds` (file stem -> seconds; a file not there counts as their
    median), the longest first, ties by name."""
    known = sorted(seconds.values())
    default = known[len(known) // 2] if known else 1.0
    return sorted(files, key=lambda path: (-seconds.get(path.stem, default), path.name))


@functools.cache
def _shared():
    """(K, N, the claims folder) of this process, or None outside the processes that share a backend (read once:
    the environment of a test run does not change)."""
    shard = os.environ.get("KERAS_VIT_TEST_SHARD")
    if not shard:
        return None
    k, _, n = shard.partition("/")
    if not (k.isdigit() and n.isdigit() and 1 <= int(k) <= int(n)):
        raise pytest.UsageError(f"KERAS_VIT_TEST_SHARD={shard}: expected K/N with 1 <= K <= N")
    claims = os.environ.get("KERAS_VIT_TEST_CLAIMS")
    if not claims:
        raise pytest.UsageError(f"KERAS_VIT_TEST_SHARD={shard} needs KERAS_VIT_TEST_CLAIMS, the folder that the "
                                f"{n} processes sharing the test files claim them in")
    return int(k), int(n), pathlib.Path(claims)


def pytest_collection_modifyitems(config, items):
    """In a process that shares its backend's test files: the files' tests in `longest_first` order (each file's
    own order kept)."""
    if _shared() is None:
        return
    recorded = json.loads(DURATIONS.read_text()) if DURATIONS.exists() else {}
    seconds = recorded.get(os.environ.get("KERAS_BACKEND", ""), {})
    rank = {path: i for i, path in enumerate(longest_first({item.path for item in items}, seconds))}
    items.sort(key=lambda item: rank[item.path])


_CLAIMED = {}  # test file path -> whether this process claimed it


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_protocol(item, nextitem):
    """Runs the test if its file is this process's (claimed now if no process has it yet); skips it, without a
    report, if another process claimed the file."""
    shared = _shared()
    if shared is None:
        return None
    if item.path not in _CLAIMED:
        claims = shared[2]
        claims.mkdir(parents=True, exist_ok=True)
        try:
            (claims / item.path.name).mkdir()
            _CLAIMED[item.path] = True
        except FileExistsError:
            _CLAIMED[item.path] = False
    return None if _CLAIMED[item.path] else True
