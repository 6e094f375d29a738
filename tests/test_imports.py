"""Imports as users write them: every module of the package as the first import of a fresh
interpreter, and every import and public name the code of the README and of the docs/ pages shows."""

import ast
import importlib
import json
import os
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).parents[1]
# the README and the pages of the documentation site: their code is what users copy
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def package_modules():
    """Every module of keras_vit, from its files (a new module is covered without editing this test)."""
    names = []
    for path in sorted((ROOT / "keras_vit").rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


# Each module is imported with every keras_vit module removed from sys.modules first, so it runs as
# the first keras_vit import of the process: an import circle or a name asked of a half-imported
# module fails here (Keras stays loaded between modules: importing it again would take minutes).
FIRST_IMPORTS = """
import importlib, json, sys, traceback
failed = {}
for name in sys.argv[1:]:
    for loaded in [m for m in sys.modules if m == "keras_vit" or m.startswith("keras_vit.")]:
        del sys.modules[loaded]
    try:
        importlib.import_module(name)
    except Exception:
        failed[name] = traceback.format_exc(limit=-3)
hooks = [repr(f) for f in sys.meta_path if "keras_vit" in getattr(type(f), "__module__", "")]
print(json.dumps({"failed": failed, "hooks": hooks}))
"""


@pytest.mark.backend_independent  # no module branches on the backend as it is imported (keras_vit.startup imports it)
def test_every_module_imports_first_in_a_fresh_interpreter():
    modules = package_modules()
    assert "keras_vit.variants" in modules and "keras_vit.distribute" in modules and len(modules) > 40
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    done = subprocess.run([sys.executable, "-c", FIRST_IMPORTS, *modules], env=env, capture_output=True, text=True,
                          timeout=280, cwd=ROOT.parent)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["failed"] == {}, "\n".join(f"{name}:\n{tb}" for name, tb in result["failed"].items())
    assert result["hooks"] == [], "the package installs import machinery (a sys.meta_path finder)"


def _python_blocks():
    return [block for page in PAGES for block in re.findall(r"```python\n(.*?)```", page.read_text(), flags=re.S)]


def _import_statements(block):
    """The `import keras_vit...` / `from keras_vit... import ...` statements of a README code block
    (parenthesised ones over several lines joined)."""
    statements, lines = [], iter(block.splitlines())
    for line in lines:
        line = line.split("#")[0].rstrip()
        if re.match(r"\s*(from keras_vit\b|import keras_vit\b)", line):
            while line.count("(") > line.count(")"):
                line += " " + next(lines).split("#")[0].strip()
            statements.append(line.strip())
    return statements


def test_the_readme_shows_imports_of_the_public_names():
    statements = [s for block in _python_blocks() for s in _import_statements(block)]
    assert "from keras_vit.distribute import model_parallel" in "".join(_python_blocks())  # the form a user writes
    assert len(statements) >= 8, statements


@pytest.mark.parametrize("block", range(len(_python_blocks())))
def test_every_import_and_name_in_the_readme_resolves(block):
    """Each import statement of the block runs, and each `name.attribute` the block uses on a
    keras_vit module or name bound by those imports (or on `keras_vit` itself) exists."""
    code = _python_blocks()[block]
    namespace = {"keras_vit": importlib.import_module("keras_vit")}
    for statement in _import_statements(code):
        exec(compile(ast.parse(statement), "README.md", "exec"), namespace)
    missing = []
    for base, attrs in re.findall(r"\b([A-Za-z_]\w*)((?:\.[A-Za-z_]\w*)+)", code):
        obj = namespace.get(base)
        if obj is None or not getattr(obj, "__name__", "").startswith("keras_vit"):
            continue
        for attr in attrs.strip(".").split("."):
            if not hasattr(obj, attr):
                missing.append(f"{base}{attrs}")
                break
            obj = getattr(obj, attr)
            if not getattr(obj, "__name__", "").startswith("keras_vit") and not isinstance(obj, type):
                break  # past the package (a method of a returned object, etc.)
    assert missing == [], f"code block {block} (README, then docs/) uses names that do not exist: {missing}"


def test_the_layers_table_names_exported_layers():
    import keras_vit.layers

    section = (ROOT / "docs" / "api" / "layers.md").read_text().split("# Layers", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    names = [name for row in rows for name in re.findall(r"`([A-Za-z_]\w*)\(", row.split("|")[1])]
    assert "MaskedPatchCorruption" in names and "PatchEncoder" in names
    assert [n for n in names if n not in keras_vit.layers.__all__] == []
    assert all(hasattr(keras_vit.layers, n) for n in names)
