"""No import circle in keras_vit/ (issue 44): the modules form floors, each importing only from those
below it (docs/contributing.md), as tests/test_function_length.py keeps functions short.

The graph is read from the source (the AST of every file of keras_vit/, `P/__init__.py` being the module
`P`), nothing is imported:
- every `import` and `from ... import` counts, at module level and inside functions, methods and
  `try`/`if` blocks alike: a function-local import runs when its function does, and a circle through
  it breaks a program that imported the other side first just the same;
- a relative import is resolved against the importing module's package;
- `from P import x` is an edge to the module `P.x` when `P.x` is a module of the package, and to `P`
  otherwise (a name that `P` defines);
- an edge goes to a package (its `__init__`) only where the import names the package itself:
  `import keras_vit`, `from keras_vit import ViT_B16`, `from keras_vit.layers import ClassToken`.
  `import P.Q` or `from P.Q import x` is an edge to `P.Q` alone, although Python runs `P/__init__.py`
  before `P/Q.py`: counting that implied import would put every module that imports a sibling into one
  circle with `keras_vit/__init__.py` (which imports the public API, so most of the package), and the
  test would name nothing useful. The order that implied import runs in is covered where it bites: by
  tests/test_imports.py, which imports every module first in a fresh interpreter.
Imports by a string (`importlib.import_module`) are not seen. On main at ffa2530 these rules find
exactly the two circles issue 44 names (data <-> image_folder, model <-> naflex), and nothing else.
"""

import ast
import pathlib

import pytest

pytestmark = pytest.mark.backend_independent

ROOT = pathlib.Path(__file__).parents[1]
PACKAGE = "keras_vit"
# Circles that their owners are breaking now (issue 44), each as its sorted modules. The list only
# shrinks, to empty: a circle that is gone (or has grown another module) fails test_known_cycles_are_not_stale
# until it leaves the list, and any circle not listed fails test_no_import_circle.
# (keras_vit.model <-> keras_vit.naflex, the other circle the issue names, is broken already.)
KNOWN_CYCLES = [
]


def module_files(root=ROOT, package=PACKAGE):
    """{module name: path} of every file of `package` under `root`."""
    files = {}
    for path in sorted((root / package).rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        files[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return files


def _known(name, modules):
    """`name`, or its longest prefix that is a module (None outside the package)."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def _targets(node, module, is_package, modules):
    """The modules of the package that the import statement `node` of `module` imports."""
    if isinstance(node, ast.Import):
        return [_known(alias.name, modules) for alias in node.names]
    package = module if is_package else module.rpartition(".")[0]
    if node.level:  # relative: from the package, one level up per dot after the first
        base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
        source = f"{base}.{node.module}" if node.module else base
    else:
        source = node.module
    return [f"{source}.{alias.name}" if f"{source}.{alias.name}" in modules else _known(source, modules)
            for alias in node.names]


def import_graph(root=ROOT, package=PACKAGE):
    """{module: {imported module: 'path:line' of the first import of it}} over the package's modules."""
    files = module_files(root, package)
    graph = {}
    for module, path in files.items():
        edges = graph[module] = {}
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                for target in _targets(node, module, path.name == "__init__.py", files):
                    if target and target != module:
                        edges.setdefault(target, f"{path.relative_to(root).as_posix()}:{node.lineno}")
    return graph


def cycles(graph):
    """The strongly connected components of more than one module (Tarjan), each as its sorted modules."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(node):
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in graph.get(node, ()):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while not component or component[-1] != node:
                component.append(stack.pop())
                on_stack.discard(component[-1])
            if len(component) > 1:
                found.append(tuple(sorted(component)))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(found)


def describe(cycle, graph):
    """The modules of `cycle` and each import between them, where it is."""
    edges = [f"  {a} -> {b} ({graph[a][b]})" for a in cycle for b in cycle if b in graph[a]]
    return " <-> ".join(cycle) + ":\n" + "\n".join(edges)


@pytest.fixture(scope="module")
def graph():
    return import_graph()


def test_no_import_circle(graph):
    new = [cycle for cycle in cycles(graph) if cycle not in KNOWN_CYCLES]
    assert not new, ("import circles; break each by moving what both sides need below them (issue 44):\n"
                     + "\n".join(describe(cycle, graph) for cycle in new))


def test_known_cycles_are_not_stale(graph):
    gone = [cycle for cycle in KNOWN_CYCLES if cycle not in cycles(graph)]
    assert not gone, f"KNOWN_CYCLES lists circles that are no longer there as listed: remove them from it: {gone}"


def test_the_graph_follows_its_rules(tmp_path):
    files = {
        "pkg/__init__.py": "from pkg.a import f\n",
        "pkg/a.py": "def f():\n    from . import b  # function-local, relative: pkg.b\n",
        "pkg/b.py": "import os\nfrom pkg.sub import thing\nimport pkg.c\n",
        "pkg/c.py": "from .sub.d import thing\n",
        "pkg/sub/__init__.py": "from .d import thing\n",
        "pkg/sub/d.py": "from .. import c as _c  # a submodule: pkg.c\nthing = 1\n",
        "pkg/e.py": "def g():\n    import pkg  # the package itself: its __init__\n",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    graph = {module: set(edges) for module, edges in import_graph(tmp_path, "pkg").items()}
    assert graph == {"pkg": {"pkg.a"}, "pkg.a": {"pkg.b"}, "pkg.b": {"pkg.sub", "pkg.c"}, "pkg.c": {"pkg.sub.d"},
                     "pkg.sub": {"pkg.sub.d"}, "pkg.sub.d": {"pkg.c"}, "pkg.e": {"pkg"}}
    assert cycles(graph) == [("pkg.c", "pkg.sub.d")]
