"""Size limits that keep the code readable (DESIGN section 5): no module of the library, the envs or the callbacks
over 400 lines of code, no function over 60 lines. Split by concept when one grows past them."""

from __future__ import annotations

import ast
from pathlib import Path

import ragen_lightning

ROOT = Path(ragen_lightning.__file__).parent.parent
FOLDERS = ("ragen_lightning", "envs", "callbacks")
MAX_MODULE_CODE_LINES = 400
MAX_FUNCTION_LINES = 60


def code_lines(source: str) -> int:
    """Non-blank lines outside docstrings."""
    docstrings: set[int] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value,
                                                                                                   str):
                docstrings.update(range(first.lineno, first.end_lineno + 1))
    return sum(1 for i, line in enumerate(source.splitlines(), 1) if i not in docstrings and line.strip())


def long_functions(source: str, limit: int = MAX_FUNCTION_LINES) -> dict[str, int]:
    """``{name: lines}`` of every function (or method) whose ``def`` spans more than ``limit`` lines, docstring and
    comments included."""
    return {node.name: node.end_lineno - node.lineno + 1 for node in ast.walk(ast.parse(source))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno >= limit}


def _sources():
    for folder in FOLDERS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            yield path.relative_to(ROOT).as_posix(), path.read_text()


def test_the_counters_count_what_they_say():
    source = 'def f():\n    """Doc\n    string."""\n\n    x = 1  # one\n    return x\n'
    assert code_lines(source) == 3 and long_functions(source, limit=5) == {"f": 6}  # def, x = 1, return
    assert long_functions(source, limit=6) == {}


def test_no_module_over_400_code_lines():
    assert {rel: n for rel, source in _sources() if (n := code_lines(source)) > MAX_MODULE_CODE_LINES} == {}


def test_no_function_over_60_lines():
    assert {rel: f for rel, source in _sources() if (f := long_functions(source))} == {}
