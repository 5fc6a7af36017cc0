"""Size limits that keep the code readable (DESIGN section 5): no module of the library, the envs or
the callbacks over 500 lines of code, no function body over 60 lines. Split by concept when one grows
past them.

The lines are counted as ``ruff format`` writes them (line length 100, one parameter per line once a
signature does not fit). The limits were 400 code lines per module and 60 lines per ``def`` while the
code was wrapped by hand to 120 columns; formatting made the same modules 29 % longer (18163 -> 23473
code lines), so 500 formatted lines is the old 400 at equal density (387), and a function's body is
counted without its signature and docstring, which the formatter lays out one item per line."""

from __future__ import annotations

import ast
from pathlib import Path

import ragen_lightning

ROOT = Path(ragen_lightning.__file__).parent.parent
FOLDERS = ("ragen_lightning", "envs", "callbacks")
MAX_MODULE_CODE_LINES = 500
MAX_FUNCTION_LINES = 60


def code_lines(source: str) -> int:
    """Non-blank lines outside docstrings."""
    docstrings: set[int] = set()
    for node in ast.walk(ast.parse(source)):
        if (
            isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
            and node.body
        ):
            first = node.body[0]
            if (
                isinstance(first, ast.Expr)
                and isinstance(first.value, ast.Constant)
                and isinstance(first.value.value, str)
            ):
                docstrings.update(range(first.lineno, first.end_lineno + 1))
    return sum(
        1 for i, line in enumerate(source.splitlines(), 1) if i not in docstrings and line.strip()
    )


def body_lines(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """Lines from the first statement after the docstring to the end of the function: the signature
    and the docstring do not count, comments and blank lines inside the body do."""
    body = node.body
    first = body[0]
    if (
        len(body) > 1
        and isinstance(first, ast.Expr)
        and isinstance(first.value, ast.Constant)
        and isinstance(first.value.value, str)
    ):
        first = body[1]
    start = min([first.lineno] + [d.lineno for d in getattr(first, "decorator_list", [])])
    return node.end_lineno - start + 1


def long_functions(source: str, limit: int = MAX_FUNCTION_LINES) -> dict[str, int]:
    """``{name: body lines}`` of every function (or method) whose body spans more than ``limit``
    lines (:func:`body_lines`)."""
    return {
        node.name: n
        for node in ast.walk(ast.parse(source))
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        and (n := body_lines(node)) > limit
    }


def _sources():
    for folder in FOLDERS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            yield path.relative_to(ROOT).as_posix(), path.read_text()


def test_the_counters_count_what_they_say():
    source = (
        "def f(\n    a,\n    b,\n):\n"  # a signature over four lines: not counted
        '    """Doc\n    string."""\n\n'  # the docstring: not counted
        "    x = a  # one\n\n    return x + b\n"  # three body lines, the blank one included
    )
    assert code_lines(source) == 6  # def f(, a, b, ), x = a, return: blanks and docstring out
    assert long_functions(source, limit=2) == {"f": 3}
    assert long_functions(source, limit=3) == {}
    only_doc = 'def g():\n    """Only a docstring."""\n'
    assert long_functions(only_doc, limit=0) == {"g": 1}  # the docstring is its body


def test_no_module_over_500_code_lines():
    assert {
        rel: n for rel, source in _sources() if (n := code_lines(source)) > MAX_MODULE_CODE_LINES
    } == {}


def test_no_function_body_over_60_lines():
    assert {rel: f for rel, source in _sources() if (f := long_functions(source))} == {}
