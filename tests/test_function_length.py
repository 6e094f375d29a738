"""No function in keras_vit/ over 80 lines (issue 37): a longer one is split into named steps, each short
enough to read at once. A body is counted from its first statement after the docstring to its last line."""

import ast
import pathlib

import pytest

pytestmark = pytest.mark.backend_independent

PACKAGE = pathlib.Path(__file__).parents[1] / "keras_vit"
MOST_LINES = 80


def body_lines(function):
    """Lines of a function's body, its docstring left out (a decorator or the signature are not body)."""
    body = function.body
    if (len(body) > 1 and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
            and isinstance(body[0].value.value, str)):
        body = body[1:]
    return body[-1].end_lineno - body[0].lineno + 1


def long_functions(package=PACKAGE, most=MOST_LINES):
    """'path:line name (n lines)' of each function or method in package longer than most lines."""
    found = []
    for path in sorted(package.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and body_lines(node) > most:
                found.append(f"{path.relative_to(package.parent)}:{node.lineno} {node.name} "
                             f"({body_lines(node)} lines)")
    return found


def test_no_function_over_80_lines():
    found = long_functions()
    assert not found, f"over {MOST_LINES} lines; split each into named helpers:\n" + "\n".join(found)
