"""The problems of :mod:`envs.tools.code.env`: generated function specifications (a reference
solution and seeded tests, drawn from the env's seed) and DeepCoder-style problems read from a local
file.

They are their own module because the env's judging and sandboxing never depend on where a problem
came from: a :class:`Problem` is all they see.

Data file schema (``.jsonl`` or ``.parquet``, one problem per row):

* ``problem`` (str): the statement shown to the agent.
* ``tests`` (list, or a JSON string of a list) of ``{"input": ..., "output": ..., "testtype":
  "functional" | "stdin"}`` (``testtype`` defaults to ``"stdin"``, or to ``"functional"`` when the
  row names a function). Functional: ``input`` is the list of arguments, or a string of one JSON
  value per line (LiveCodeBench's form); ``output`` is the expected return value (JSON, or a JSON
  string). Stdin: ``input`` is the text on standard input, ``output`` the expected standard output
  (compared line by line, trailing whitespace ignored).
* ``fn_name`` (str, optional; or ``metadata.func_name``, ``metadata`` a dict or a JSON string): the
  function the functional tests call, as ``Solution().fn_name(*args)`` when the code defines a class
  ``Solution``, else ``fn_name(*args)``.
* ``starter_code`` (str, optional): appended to the statement after ``Starter code:``.
* ``solution`` (str, optional): a reference solution; the expert answers with it (rows without one
  have no expert).
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from envs.base import check_file, read_rows

MAX_TESTS = 32


@dataclass(frozen=True)
class Problem:
    """One problem: the statement, how it is tested, and (optionally) a reference solution.

    Attributes:
        statement: the text the agent sees.
        kind: ``"function"`` (call ``fn_name`` with each test's arguments) or ``"stdin"`` (run the
        program on each
            test's input).
        fn_name: the function name of a function problem. inputs: per test, the argument list
        (function) or the stdin text. outputs: per test, the expected return value as JSON text
        (function) or the expected stdout (stdin). solution: a reference solution, or None.
    """

    statement: str
    kind: str
    fn_name: str
    inputs: tuple
    outputs: tuple[str, ...]
    solution: str | None = None


# --------------------------------------------------------------------------------------------------
# Generated problems: families of small function specifications
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Family:
    fn_name: str
    params: str
    description: str  # may use {k}
    solution: str  # body of the reference solution; may use {k}
    make_args: Callable[[np.random.Generator], list]
    k_range: tuple[int, int] = (2, 2)


def _ints(
    rng: np.random.Generator, lo: int, hi: int, max_len: int = 8, min_len: int = 0
) -> list[int]:
    return [int(x) for x in rng.integers(lo, hi + 1, size=int(rng.integers(min_len, max_len + 1)))]


def _word(rng: np.random.Generator) -> str:
    letters = "abcdeilmnorstu"
    return "".join(
        letters[int(i)] for i in rng.integers(0, len(letters), size=int(rng.integers(1, 7)))
    )


def _maybe_palindrome(rng: np.random.Generator) -> str:
    """A word, mirrored into a palindrome (odd or even length) half of the time."""
    word = _word(rng)
    if rng.integers(0, 2):
        return word + word[::-1][int(rng.integers(0, 2)) :]
    return word


def _sentence(rng: np.random.Generator) -> str:
    return " ".join(_word(rng) for _ in range(int(rng.integers(1, 6))))


FAMILIES: tuple[_Family, ...] = (
    _Family(
        "sum_multiples",
        "nums",
        "returns the sum of the numbers in the list `nums` that are divisible by {k}",
        "return sum(x for x in nums if x % {k} == 0)",
        lambda r: [_ints(r, -20, 40)],
        (2, 5),
    ),
    _Family(
        "count_above",
        "nums",
        "returns how many numbers in the list `nums` are greater than {k}",
        "return sum(1 for x in nums if x > {k})",
        lambda r: [_ints(r, -10, 20)],
        (0, 9),
    ),
    _Family(
        "largest_gap",
        "nums",
        "returns the largest difference between two neighbouring numbers of the list "
        "`nums` (later minus earlier), or 0 when it has fewer than two numbers",
        "return max((b - a for a, b in zip(nums, nums[1:])), default=0)",
        lambda r: [_ints(r, 0, 30)],
    ),
    _Family(
        "running_max",
        "nums",
        "returns the list whose i-th entry is the largest of the first i + 1 numbers of "
        "the list `nums`",
        "out = []\n    for x in nums:\n        out.append(x if not out else max(out[-1], x))\n    return out",
        lambda r: [_ints(r, -9, 9)],
    ),
    _Family(
        "digit_sum",
        "n",
        "returns the sum of the decimal digits of the non-negative integer `n`, times {k}",
        "return {k} * sum(int(d) for d in str(n))",
        lambda r: [int(r.integers(0, 100000))],
        (1, 3),
    ),
    _Family(
        "count_vowels",
        "text",
        "returns how many letters of the string `text` are vowels (a, e, i, o, u)",
        "return sum(1 for c in text if c in 'aeiou')",
        lambda r: [_sentence(r)],
    ),
    _Family(
        "reverse_words",
        "text",
        "returns the string `text` with the order of its space-separated words "
        "reversed, joined by single spaces",
        "return ' '.join(text.split()[::-1])",
        lambda r: [_sentence(r)],
    ),
    _Family(
        "rotate_left",
        "nums",
        "returns the list `nums` rotated left by {k} places (the first {k} numbers move "
        "to the end; an empty list stays empty)",
        "if not nums:\n        return []\n    s = {k} % len(nums)\n    return nums[s:] + nums[:s]",
        lambda r: [_ints(r, 0, 9)],
        (1, 4),
    ),
    _Family(
        "dedupe",
        "nums",
        "returns the numbers of the list `nums` without repeats, each kept at its first position",
        "seen = set()\n    out = []\n    for x in nums:\n        if x not in seen:\n"
        "            seen.add(x)\n            out.append(x)\n    return out",
        lambda r: [_ints(r, 0, 6, 10)],
    ),
    _Family(
        "is_palindrome",
        "text",
        "returns True when the string `text` reads the same backwards, else False",
        "return text == text[::-1]",
        lambda r: [_maybe_palindrome(r)],
    ),
    _Family(
        "max_window",
        "nums",
        "returns the largest sum of {k} consecutive numbers of the list `nums`, or 0 "
        "when it has fewer than {k} numbers",
        "if len(nums) < {k}:\n        return 0\n    return max(sum(nums[i:i + {k}]) for i in "
        "range(len(nums) - {k} + 1))",
        lambda r: [_ints(r, -9, 9, 9)],
        (2, 3),
    ),
    _Family(
        "collatz_steps",
        "n",
        "returns how many steps the Collatz rule (halve an even number, turn an odd one "
        "into 3 * n + 1) takes to bring the positive integer `n` down to 1",
        "steps = 0\n    while n != 1:\n        n = n // 2 if n % 2 == 0 else 3 * n + 1\n        steps += 1\n"
        "    return steps",
        lambda r: [int(r.integers(1, 60))],
    ),
)


@functools.lru_cache(maxsize=256)
def _reference(source: str, fn_name: str) -> Callable:
    """The reference solution as a function (trusted code written by this module, run on the
    host)."""
    namespace: dict[str, Any] = {}
    exec(compile(source, f"<reference {fn_name}>", "exec"), namespace)  # noqa: S102 - our own reference source
    return namespace[fn_name]


def generate_problem(
    rng: np.random.Generator, num_tests: int = 8, num_examples: int = 2
) -> Problem:
    """A function problem drawn from :data:`FAMILIES` with ``num_tests`` seeded tests (distinct when
    possible), the first ``num_examples`` of them shown in the statement."""
    family = FAMILIES[int(rng.integers(len(FAMILIES)))]
    k = int(rng.integers(family.k_range[0], family.k_range[1] + 1))
    body = family.solution.format(k=k)
    solution = f"def {family.fn_name}({family.params}):\n    {body}\n"
    fn = _reference(solution, family.fn_name)
    cases: list[list] = []
    seen: set[str] = set()
    for _ in range(num_tests * 20):
        args = family.make_args(rng)
        key = json.dumps(args)
        if key not in seen:
            seen.add(key)
            cases.append(args)
        if len(cases) == num_tests:
            break
    while len(cases) < num_tests:  # tiny input domains: repeat
        cases.append(cases[len(cases) % max(1, len(seen))])
    outputs = tuple(json.dumps(fn(*[json.loads(json.dumps(a)) for a in args])) for args in cases)
    examples = "\n".join(
        f"{family.fn_name}({', '.join(repr(a) for a in args)}) == {json.loads(out)!r}"
        for args, out in zip(cases[:num_examples], outputs)
    )
    statement = (
        f"Write a Python function `{family.fn_name}({family.params})` that "
        f"{family.description.format(k=k)}.\n\nExamples:\n{examples}\n\n"
        f"Starter code:\ndef {family.fn_name}({family.params}):"
    )
    return Problem(statement, "function", family.fn_name, tuple(cases), outputs, solution)


# --------------------------------------------------------------------------------------------------
# Problems from a file
# --------------------------------------------------------------------------------------------------


def _json_field(value: Any, where: str, name: str) -> Any:
    if isinstance(value, str):
        try:
            return json.loads(value)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{where}: '{name}' is a string but not JSON ({exc.msg})") from None
    return value


def _functional_args(raw: Any, where: str) -> list:
    """The argument list of a functional test: a JSON array as is, or a string of one JSON value per
    line."""
    if isinstance(raw, list):
        return raw
    if isinstance(raw, str):
        try:
            return [json.loads(line) for line in raw.strip().split("\n") if line.strip()]
        except json.JSONDecodeError as exc:
            raise ValueError(
                f"{where}: functional input string must hold one JSON value per line ({exc.msg})"
            ) from None
    raise ValueError(
        f"{where}: functional input must be a list or a string, got {type(raw).__name__}"
    )


def _row_to_problem(row: Any, where: str) -> Problem:
    if not isinstance(row, dict):
        raise ValueError(f"{where}: expected an object, got {type(row).__name__}")  # noqa: TRY004 - names the row
    statement = row.get("problem")
    if not isinstance(statement, str) or not statement.strip():
        raise ValueError(f"{where}: needs a non-empty string field 'problem'")
    tests = _json_field(row.get("tests"), where, "tests")
    if not isinstance(tests, list) or not tests:
        raise ValueError(f"{where}: 'tests' must be a non-empty list (or a JSON string of one)")
    metadata = _json_field(row.get("metadata") or {}, where, "metadata")
    fn_name = (
        row.get("fn_name")
        or (metadata.get("func_name") if isinstance(metadata, dict) else None)
        or ""
    )
    if not isinstance(fn_name, str) or (fn_name and not fn_name.isidentifier()):
        raise ValueError(f"{where}: 'fn_name' must be a Python identifier, got {fn_name!r}")
    kinds = set()
    inputs, outputs = [], []
    for j, test in enumerate(tests[:MAX_TESTS]):
        if not isinstance(test, dict) or "input" not in test or "output" not in test:
            raise ValueError(f"{where}: test {j} needs 'input' and 'output'")
        kind = test.get("testtype") or ("functional" if fn_name else "stdin")
        if kind not in ("functional", "stdin"):
            raise ValueError(
                f"{where}: test {j}: testtype must be 'functional' or 'stdin', got {kind!r}"
            )
        kinds.add(kind)
        if kind == "functional":
            if not fn_name:
                raise ValueError(
                    f"{where}: functional tests need 'fn_name' (or metadata.func_name)"
                )
            inputs.append(_functional_args(test["input"], f"{where}: test {j}"))
            expected = test["output"]
            if isinstance(expected, str):
                try:
                    expected = json.loads(expected)
                except json.JSONDecodeError:
                    pass  # a plain string return value
            outputs.append(json.dumps(expected))
        else:
            if not isinstance(test["input"], str) or not isinstance(test["output"], str):
                raise ValueError(f"{where}: test {j}: stdin tests need string 'input' and 'output'")
            inputs.append(test["input"])
            outputs.append(test["output"])
    if len(kinds) > 1:
        raise ValueError(f"{where}: mixes functional and stdin tests")
    starter = row.get("starter_code") or ""
    if starter and isinstance(starter, str):
        statement = f"{statement}\n\nStarter code:\n{starter}"
    solution = row.get("solution")
    if solution is not None and not isinstance(solution, str):
        raise ValueError(f"{where}: 'solution' must be a string")
    kind = "function" if kinds == {"functional"} else "stdin"
    return Problem(statement, kind, fn_name, tuple(inputs), tuple(outputs), solution or None)


@functools.lru_cache(maxsize=8)
def _load_cached(path: str, mtime_ns: int, size: int) -> tuple[Problem, ...]:
    problems = tuple(_row_to_problem(row, where) for row, where in read_rows(path))
    if not problems:
        raise ValueError(f"{path}: no problems found")
    return problems


def load_problems(path: str | os.PathLike) -> tuple[Problem, ...]:
    """Problems from a ``.jsonl`` or ``.parquet`` file in the schema of the module docstring (cached
    per path and modification time). Raises ``FileNotFoundError`` or ``ValueError`` naming the file
    and line (row)."""
    path = check_file(path, "data_path")
    stat = os.stat(path)
    return _load_cached(os.path.abspath(path), stat.st_mtime_ns, stat.st_size)


__all__ = ["FAMILIES", "Problem", "generate_problem", "load_problems"]
