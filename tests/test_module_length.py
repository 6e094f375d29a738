"""No module in keras_vit/ or benchmarks/ over 450 lines (issue 44): a longer one is split along its
concepts, one file each (a package whose `__init__` gives the public names where a public module grows),
as tests/test_function_length.py splits a long function into named steps. A module's lines are its
lines of text, as `wc -l` counts them."""

import pathlib

import pytest

pytestmark = pytest.mark.backend_independent

ROOT = pathlib.Path(__file__).parents[1]
FOLDERS = ("keras_vit", "benchmarks")
MOST_LINES = 450
# Modules over the mark that their owners are splitting now (issue 44). The list only shrinks, to empty:
# an entry whose module is under the mark or gone fails test_not_yet_split_is_not_stale, so it leaves the
# list in the change that splits it; a module not listed here never passes the mark.
NOT_YET_SPLIT = ()


def line_count(path):
    return len(path.read_text().splitlines())


def long_modules(root=ROOT, folders=FOLDERS, most=MOST_LINES):
    """{'folder/module.py': lines} of each module under `folders` longer than `most` lines."""
    found = {}
    for folder in folders:
        for path in sorted((root / folder).rglob("*.py")):
            lines = line_count(path)
            if lines > most:
                found[path.relative_to(root).as_posix()] = lines
    return found


def test_no_module_over_450_lines():
    found = {path: lines for path, lines in long_modules().items() if path not in NOT_YET_SPLIT}
    assert not found, (f"over {MOST_LINES} lines; split each along its concepts (issue 44):\n"
                       + "\n".join(f"{path} ({lines} lines)" for path, lines in found.items()))


def test_not_yet_split_is_not_stale():
    gone = [path for path in NOT_YET_SPLIT if not (ROOT / path).is_file()]
    short = [f"{path} ({line_count(ROOT / path)} lines)" for path in NOT_YET_SPLIT
             if path not in gone and line_count(ROOT / path) <= MOST_LINES]
    assert not gone and not short, ("NOT_YET_SPLIT names modules that are split now: remove them from it\n"
                                    + "\n".join([*(f"{path} (no such file)" for path in gone), *short]))
