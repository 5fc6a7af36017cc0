"""Competitive-programming style coding (RAGEN's ``deepcoder`` env), offline, candidate code run in a sandbox.

RAGEN reads ``agentica-org/DeepCoder-Preview-Dataset`` and runs all tests of a problem in one subprocess; nothing can
be downloaded here, so problems are generated procedurally from the seed (small function specifications with a
reference solution and seeded tests), and ``data_path`` reads real DeepCoder-style problems from a local file.

Every candidate runs in :class:`envs.sandbox.Sandbox` (bubblewrap namespaces + resource limits, a fresh interpreter
and directory per run). The env refuses to run code when bubblewrap is missing, unless ``allow_unsandboxed=True``.

Reward (RAGEN's): the fraction of tests passed (partial credit); ``success`` when all pass. Departures: code that does
not compile, or (function problems) defines no function of the problem's name, is scored 0 without starting a
sandbox; a candidate inside a Markdown code fence is taken from the fence; outputs are compared as JSON values (RAGEN
compares ``str(result) == str(expected)``), stdin tests by their stripped lines; each test of a function problem is
reported separately, so tests passed before a crash or a hang still count.

Data file schema (``.jsonl`` or ``.parquet``, one problem per row):

* ``problem`` (str): the statement shown to the agent.
* ``tests`` (list, or a JSON string of a list) of ``{"input": ..., "output": ..., "testtype": "functional" | "stdin"}``
  (``testtype`` defaults to ``"stdin"``, or to ``"functional"`` when the row names a function). Functional: ``input``
  is the list of arguments, or a string of one JSON value per line (LiveCodeBench's form); ``output`` is the
  expected return value (JSON, or a JSON string). Stdin: ``input`` is the text on standard input, ``output`` the
  expected standard output (compared line by line, trailing whitespace ignored).
* ``fn_name`` (str, optional; or ``metadata.func_name``, ``metadata`` a dict or a JSON string): the function the
  functional tests call, as ``Solution().fn_name(*args)`` when the code defines a class ``Solution``, else
  ``fn_name(*args)``.
* ``starter_code`` (str, optional): appended to the statement after ``Starter code:``.
* ``solution`` (str, optional): a reference solution; the expert answers with it (rows without one have no expert).
"""

from __future__ import annotations

import ast
import functools
import json
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from gymnasium import spaces

from envs.base import PromptSpec, TextEnv, text_space
from envs.retrieval import check_file, read_rows
from envs.sandbox import Limits, Sandbox

INSTRUCTION = (
    "You are solving a programming problem. Write a complete Python solution: the function the problem asks for "
    "(or a program reading standard input when it asks for one), with no example calls. Example answer format: "
    "<think>I sum the numbers that are even.</think><answer>def solve(nums):\n    return sum(x for x in nums if "
    "x % 2 == 0)</answer>"
)
MAX_CODE_LENGTH = 8192
MAX_TESTS = 32
RESULT_FILE = "results.jsonl"
NOT_COMPILED = "the code does not compile"
_FENCE = re.compile(r"```[ \t]*(?:python3?|py)?[ \t]*\n(.*?)```", re.DOTALL | re.IGNORECASE)

# The harness of function problems: reads the arguments, imports the candidate, calls it once per test and writes
# one JSON line per test (the expected outputs never enter the sandbox; the host compares).
HARNESS = '''\
import json, sys
sys.setrecursionlimit(10000)
out = open("results.jsonl", "w", buffering=1)
fn_name = json.loads(open("fn.json").read())
cases = json.loads(open("cases.json").read())
namespace = {"__name__": "solution"}
try:
    exec(compile(open("solution.py").read(), "solution.py", "exec"), namespace)
    target = namespace[fn_name] if fn_name in namespace else getattr(namespace["Solution"](), fn_name)
except BaseException as exc:
    out.write(json.dumps({"error": "load: " + type(exc).__name__}) + "\\n")
    raise SystemExit(0)
for i, args in enumerate(cases):
    try:
        value = target(*args)
        text = json.dumps(value)
    except BaseException as exc:
        out.write(json.dumps({"i": i, "error": type(exc).__name__}) + "\\n")
        continue
    out.write(json.dumps({"i": i, "value": text}) + "\\n")
'''


@dataclass(frozen=True)
class Problem:
    """One problem: the statement, how it is tested, and (optionally) a reference solution.

    Attributes:
        statement: the text the agent sees.
        kind: ``"function"`` (call ``fn_name`` with each test's arguments) or ``"stdin"`` (run the program on each
            test's input).
        fn_name: the function name of a function problem.
        inputs: per test, the argument list (function) or the stdin text.
        outputs: per test, the expected return value as JSON text (function) or the expected stdout (stdin).
        solution: a reference solution, or None.
    """

    statement: str
    kind: str
    fn_name: str
    inputs: tuple
    outputs: tuple[str, ...]
    solution: str | None = None


# ----------------------------------------------------------------------------------------------------------------
# Generated problems: families of small function specifications
# ----------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Family:
    fn_name: str
    params: str
    description: str  # may use {k}
    solution: str  # body of the reference solution; may use {k}
    make_args: Callable[[np.random.Generator], list]
    k_range: tuple[int, int] = (2, 2)


def _ints(rng: np.random.Generator, lo: int, hi: int, max_len: int = 8, min_len: int = 0) -> list[int]:
    return [int(x) for x in rng.integers(lo, hi + 1, size=int(rng.integers(min_len, max_len + 1)))]


def _word(rng: np.random.Generator) -> str:
    letters = "abcdeilmnorstu"
    return "".join(letters[int(i)] for i in rng.integers(0, len(letters), size=int(rng.integers(1, 7))))


def _maybe_palindrome(rng: np.random.Generator) -> str:
    """A word, mirrored into a palindrome (odd or even length) half of the time."""
    word = _word(rng)
    if rng.integers(0, 2):
        return word + word[::-1][int(rng.integers(0, 2)):]
    return word


def _sentence(rng: np.random.Generator) -> str:
    return " ".join(_word(rng) for _ in range(int(rng.integers(1, 6))))


FAMILIES: tuple[_Family, ...] = (
    _Family("sum_multiples", "nums", "returns the sum of the numbers in the list `nums` that are divisible by {k}",
            "return sum(x for x in nums if x % {k} == 0)", lambda r: [_ints(r, -20, 40)], (2, 5)),
    _Family("count_above", "nums", "returns how many numbers in the list `nums` are greater than {k}",
            "return sum(1 for x in nums if x > {k})", lambda r: [_ints(r, -10, 20)], (0, 9)),
    _Family("largest_gap", "nums", "returns the largest difference between two neighbouring numbers of the list "
            "`nums` (later minus earlier), or 0 when it has fewer than two numbers",
            "return max((b - a for a, b in zip(nums, nums[1:])), default=0)", lambda r: [_ints(r, 0, 30)]),
    _Family("running_max", "nums", "returns the list whose i-th entry is the largest of the first i + 1 numbers of "
            "the list `nums`",
            "out = []\n    for x in nums:\n        out.append(x if not out else max(out[-1], x))\n    return out",
            lambda r: [_ints(r, -9, 9)]),
    _Family("digit_sum", "n", "returns the sum of the decimal digits of the non-negative integer `n`, times {k}",
            "return {k} * sum(int(d) for d in str(n))", lambda r: [int(r.integers(0, 100000))], (1, 3)),
    _Family("count_vowels", "text", "returns how many letters of the string `text` are vowels (a, e, i, o, u)",
            "return sum(1 for c in text if c in 'aeiou')", lambda r: [_sentence(r)]),
    _Family("reverse_words", "text", "returns the string `text` with the order of its space-separated words "
            "reversed, joined by single spaces", "return ' '.join(text.split()[::-1])", lambda r: [_sentence(r)]),
    _Family("rotate_left", "nums", "returns the list `nums` rotated left by {k} places (the first {k} numbers move "
            "to the end; an empty list stays empty)",
            "if not nums:\n        return []\n    s = {k} % len(nums)\n    return nums[s:] + nums[:s]",
            lambda r: [_ints(r, 0, 9)], (1, 4)),
    _Family("dedupe", "nums", "returns the numbers of the list `nums` without repeats, each kept at its first "
            "position", "seen = set()\n    out = []\n    for x in nums:\n        if x not in seen:\n"
            "            seen.add(x)\n            out.append(x)\n    return out", lambda r: [_ints(r, 0, 6, 10)]),
    _Family("is_palindrome", "text", "returns True when the string `text` reads the same backwards, else False",
            "return text == text[::-1]",
            lambda r: [_maybe_palindrome(r)]),
    _Family("max_window", "nums", "returns the largest sum of {k} consecutive numbers of the list `nums`, or 0 "
            "when it has fewer than {k} numbers",
            "if len(nums) < {k}:\n        return 0\n    return max(sum(nums[i:i + {k}]) for i in "
            "range(len(nums) - {k} + 1))", lambda r: [_ints(r, -9, 9, 9)], (2, 3)),
    _Family("collatz_steps", "n", "returns how many steps the Collatz rule (halve an even number, turn an odd one "
            "into 3 * n + 1) takes to bring the positive integer `n` down to 1",
            "steps = 0\n    while n != 1:\n        n = n // 2 if n % 2 == 0 else 3 * n + 1\n        steps += 1\n"
            "    return steps", lambda r: [int(r.integers(1, 60))]),
)


@functools.lru_cache(maxsize=256)
def _reference(source: str, fn_name: str) -> Callable:
    """The reference solution as a function (trusted code written by this module, run on the host)."""
    namespace: dict[str, Any] = {}
    exec(compile(source, f"<reference {fn_name}>", "exec"), namespace)  # noqa: S102 - our own reference source
    return namespace[fn_name]


def generate_problem(rng: np.random.Generator, num_tests: int = 8, num_examples: int = 2) -> Problem:
    """A function problem drawn from :data:`FAMILIES` with ``num_tests`` seeded tests (distinct when possible), the
    first ``num_examples`` of them shown in the statement."""
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
    examples = "\n".join(f"{family.fn_name}({', '.join(repr(a) for a in args)}) == {json.loads(out)!r}"
                         for args, out in zip(cases[:num_examples], outputs))
    statement = (f"Write a Python function `{family.fn_name}({family.params})` that "
                 f"{family.description.format(k=k)}.\n\nExamples:\n{examples}\n\n"
                 f"Starter code:\ndef {family.fn_name}({family.params}):")
    return Problem(statement, "function", family.fn_name, tuple(cases), outputs, solution)


# ----------------------------------------------------------------------------------------------------------------
# Problems from a file
# ----------------------------------------------------------------------------------------------------------------


def _json_field(value: Any, where: str, name: str) -> Any:
    if isinstance(value, str):
        try:
            return json.loads(value)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{where}: '{name}' is a string but not JSON ({exc.msg})") from None
    return value


def _functional_args(raw: Any, where: str) -> list:
    """The argument list of a functional test: a JSON array as is, or a string of one JSON value per line."""
    if isinstance(raw, list):
        return raw
    if isinstance(raw, str):
        try:
            return [json.loads(line) for line in raw.strip().split("\n") if line.strip()]
        except json.JSONDecodeError as exc:
            raise ValueError(f"{where}: functional input string must hold one JSON value per line ({exc.msg})") \
                from None
    raise ValueError(f"{where}: functional input must be a list or a string, got {type(raw).__name__}")


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
    fn_name = row.get("fn_name") or (metadata.get("func_name") if isinstance(metadata, dict) else None) or ""
    if not isinstance(fn_name, str) or (fn_name and not fn_name.isidentifier()):
        raise ValueError(f"{where}: 'fn_name' must be a Python identifier, got {fn_name!r}")
    kinds = set()
    inputs, outputs = [], []
    for j, test in enumerate(tests[:MAX_TESTS]):
        if not isinstance(test, dict) or "input" not in test or "output" not in test:
            raise ValueError(f"{where}: test {j} needs 'input' and 'output'")
        kind = test.get("testtype") or ("functional" if fn_name else "stdin")
        if kind not in ("functional", "stdin"):
            raise ValueError(f"{where}: test {j}: testtype must be 'functional' or 'stdin', got {kind!r}")
        kinds.add(kind)
        if kind == "functional":
            if not fn_name:
                raise ValueError(f"{where}: functional tests need 'fn_name' (or metadata.func_name)")
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
    """Problems from a ``.jsonl`` or ``.parquet`` file in the schema of the module docstring (cached per path and
    modification time). Raises ``FileNotFoundError`` or ``ValueError`` naming the file and line (row)."""
    path = check_file(path, "data_path")
    stat = os.stat(path)
    return _load_cached(os.path.abspath(path), stat.st_mtime_ns, stat.st_size)


# ----------------------------------------------------------------------------------------------------------------
# Judging
# ----------------------------------------------------------------------------------------------------------------


def extract_code(answer: str) -> str:
    """The code of an answer: the first Markdown fenced block when there is one, else the whole text, stripped."""
    match = _FENCE.search(answer)
    return (match.group(1) if match else answer).strip("\n").rstrip()


def compiles(code: str) -> bool:
    """True when ``code`` is Python source that compiles (nothing is executed)."""
    try:
        compile(code, "solution.py", "exec")
    except (SyntaxError, ValueError, RecursionError, MemoryError, OverflowError):
        return False
    return True


def defines(code: str, fn_name: str) -> bool:
    """True when compiling ``code`` defines ``fn_name`` at top level (a ``def``, an assignment, an import) or as a
    method of a top-level class ``Solution`` (read from the syntax tree; nothing is executed)."""
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError, RecursionError, MemoryError, OverflowError):
        return False
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == fn_name:
            return True
        if isinstance(node, ast.ClassDef) and node.name == "Solution" and any(
                isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef)) and m.name == fn_name for m in node.body):
            return True
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id == fn_name for t in targets):
                return True
        if isinstance(node, (ast.Import, ast.ImportFrom)) and any(
                (alias.asname or alias.name) == fn_name for alias in node.names):
            return True
    return False


def _same_lines(actual: str, expected: str) -> bool:
    return [line.rstrip() for line in actual.strip().splitlines()] == \
        [line.rstrip() for line in expected.strip().splitlines()]


@dataclass(frozen=True)
class Verdict:
    """The judgement of one candidate: tests passed, total, and a short note on the first failure."""

    passed: int
    total: int
    note: str


def judge(problem: Problem, code: str, sandbox: Sandbox) -> Verdict:
    """Run ``code`` against every test of ``problem`` in ``sandbox`` and count the tests it passes."""
    total = len(problem.outputs)
    if not code.strip() or len(code) > MAX_CODE_LENGTH or not compiles(code):
        return Verdict(0, total, NOT_COMPILED)
    if problem.kind == "function" and not defines(code, problem.fn_name):
        # nothing to call: scored without a sandbox run (random text never reaches one)
        return Verdict(0, total, f"the code does not define {problem.fn_name}")
    if problem.kind == "stdin":
        passed, note = 0, ""
        for stdin, expected in zip(problem.inputs, problem.outputs):
            result = sandbox.run(code, stdin=stdin)
            if result.returncode == 0 and _same_lines(result.stdout, expected):
                passed += 1
            elif not note:
                note = "timed out" if result.timed_out else "wrong output" if result.returncode == 0 else "crashed"
        return Verdict(passed, total, note)
    files = {"solution.py": code, "fn.json": json.dumps(problem.fn_name), "cases.json": json.dumps(problem.inputs)}
    result = sandbox.run(HARNESS, files=files, outputs=(RESULT_FILE,))
    values: dict[int, str] = {}
    errors: dict[int, str] = {}
    load_error = ""
    for line in result.files.get(RESULT_FILE, "").splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if not isinstance(record, dict):
            continue
        i = record.get("i")
        if i is None and isinstance(record.get("error"), str):
            load_error = record["error"]
        elif isinstance(i, int) and i not in values and i not in errors:
            if isinstance(record.get("value"), str):
                values[i] = record["value"]
            else:
                errors[i] = str(record.get("error"))[:80]
    passed = 0
    note = ""
    for i, expected in enumerate(problem.outputs):
        if i in values and _json_equal(values[i], expected):
            passed += 1
        elif not note:
            if load_error:
                note = f"error while loading the code ({load_error[6:]})"
            elif i in errors:
                note = f"test {i + 1} raised {errors[i]}"
            elif i in values:
                note = f"test {i + 1} returned a wrong value"
            else:
                note = f"test {i + 1} did not finish" + (" (time limit)" if result.timed_out else "")
    return Verdict(passed, total, note)


def _json_equal(actual: str, expected: str) -> bool:
    try:
        return json.loads(actual) == json.loads(expected)
    except (json.JSONDecodeError, RecursionError):
        return False


# ----------------------------------------------------------------------------------------------------------------
# The env
# ----------------------------------------------------------------------------------------------------------------


class _CodeActions(spaces.Text):
    """The action space: code text up to 8192 characters. ``sample()`` draws at most 64 random characters: random text
    never defines the problem's function (it is judged without a sandbox run), and thousands of random characters per
    sample would only slow random-agent tests and text collection down."""

    def sample(self, mask: Any = None, probability: Any = None) -> str:
        if mask is None and probability is None:
            mask = (int(self.np_random.integers(0, 65)), None)
        return super().sample(mask=mask, probability=probability)


class DeepCoderEnv(TextEnv):
    """Write code that passes a problem's tests; the code runs in a sandbox. One answer per episode by default.

    ## Description
    At reset the seed draws a problem: a generated function specification (default) or a row of ``data_path``.
    The observation is the statement (with examples and starter code). The action is the candidate code (a
    Markdown ``python`` fence around it is accepted). The code runs in :class:`envs.sandbox.Sandbox` against all
    tests of the problem.

    ## Action Space
    ``Text`` (printable ASCII, up to 8192 characters): the code. ``action_names`` is empty.

    ## Observation Space
    ``Text`` over printable ASCII plus the characters of the file's statements. Reset: the statement; after an
    answer: ``"Passed {p} of {n} tests."`` and, when some failed, the first failure (``"First failure: test 3
    returned a wrong value."``).

    ## Rewards
    ``p / n``, the fraction of tests passed (RAGEN's partial credit). Code that is empty, longer than 8192
    characters, does not compile, or (function problems) does not define the function scores 0.0 without running
    (``action_is_valid=False``).

    ## Episode End
    Terminated when every test passes or after ``max_attempts`` answers (1, as in RAGEN); never truncated. Stepping
    after the end returns the last observation, reward 0.0, ``terminated=True`` and ``action_is_valid=False``.

    ## Info
    ``success`` (all tests pass), ``action_is_valid`` (the code compiles and defines the function),
    ``action_is_effective`` (some test
    passes), ``passed``, ``total``.

    ## Arguments
    - ``data_path``: a ``.jsonl``/``.parquet`` problem file (schema in the module docstring); None generates problems.
    - ``num_tests`` (8), ``num_examples`` (2): tests per generated problem, and how many the statement shows.
    - ``max_attempts`` (1): answers per episode.
    - ``cpu_seconds`` (2), ``wall_seconds`` (4.0), ``memory_mb`` (512), ``max_processes`` (16): the sandbox's limits
      per run (:class:`envs.sandbox.Limits`).
    - ``allow_unsandboxed`` (False): run candidates without bubblewrap when it is missing (no isolation).
    - ``render_mode``: ``None`` or ``"ansi"``.

    ## Options
    ``reset(options={"index": i})`` poses problem ``i`` of ``data_path``.
    """

    def __init__(
        self,
        data_path: str | os.PathLike | None = None,
        num_tests: int = 8,
        num_examples: int = 2,
        max_attempts: int = 1,
        cpu_seconds: int = 2,
        wall_seconds: float = 4.0,
        memory_mb: int = 512,
        max_processes: int = 16,
        allow_unsandboxed: bool = False,
        render_mode: str | None = None,
    ):
        super().__init__(render_mode=render_mode)
        for name, value, low in (("num_tests", num_tests, 1), ("num_examples", num_examples, 0),
                                 ("max_attempts", max_attempts, 1)):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"{name} must be an int >= {low}, got {value!r}")
        if num_examples > num_tests:
            raise ValueError(f"num_examples ({num_examples}) must not exceed num_tests ({num_tests})")
        self.problems = load_problems(data_path) if data_path is not None else None
        self.data_path = data_path
        self.num_tests, self.num_examples, self.max_attempts = num_tests, num_examples, max_attempts
        self.sandbox = Sandbox(Limits(cpu_seconds=cpu_seconds, wall_seconds=wall_seconds,
                                      memory_bytes=int(memory_mb) * 2**20, max_processes=max_processes),
                               allow_unsandboxed=allow_unsandboxed)
        extra = "".join(sorted({c for p in self.problems or () for c in p.statement}))
        longest = max((len(p.statement) for p in self.problems or ()), default=0)
        self.observation_space = text_space(extra, max_length=max(8192, longest + 200))
        self.action_space = _CodeActions(min_length=0, max_length=MAX_CODE_LENGTH, charset=text_space().character_set)
        self.problem: Problem | None = None
        self.attempts = 0
        self._obs = ""
        self._terminated = False

    def prompt_spec(self) -> PromptSpec:
        return PromptSpec(instruction=INSTRUCTION)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict]:
        super().reset(seed=seed)
        options = self._reset_options(options, ("index",))
        if self.problems is None:
            if options:
                raise ValueError("DeepCoderEnv.reset: options['index'] needs a data_path")
            self.problem = generate_problem(self.np_random, self.num_tests, self.num_examples)
        else:
            index = options.get("index")
            if index is None:
                index = int(self.np_random.integers(len(self.problems)))
            elif isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < len(self.problems):
                raise ValueError(f"options['index'] must be an int in [0, {len(self.problems)}), got {index!r}")
            self.problem = self.problems[index]
        self.attempts = 0
        self._obs = self.problem.statement
        self._terminated = False
        return self._obs, self._info(False, True, False, 0)

    def step(self, action: Any) -> tuple[str, float, bool, bool, dict]:
        if self.problem is None:
            raise RuntimeError("DeepCoderEnv: call reset() before step()")
        if self._terminated:
            return self._obs, 0.0, True, False, self._info(False, False, False, 0)
        self.attempts += 1
        code = extract_code(action) if isinstance(action, str) else ""
        verdict = judge(self.problem, code, self.sandbox)
        valid = verdict.note != NOT_COMPILED and not verdict.note.startswith("the code does not define")
        reward = verdict.passed / verdict.total
        success = verdict.passed == verdict.total
        # the last allowed answer ends the task itself (like Countdown's single answer), not a time limit
        self._terminated = success or self.attempts >= self.max_attempts
        self._obs = f"Passed {verdict.passed} of {verdict.total} tests."
        if not success:
            self._obs += f" First failure: {verdict.note}."
        return self._obs, reward, self._terminated, False, self._info(
            success, valid, verdict.passed > 0, verdict.passed)

    def _info(self, success: bool, valid: bool, effective: bool, passed: int) -> dict[str, Any]:
        return {"success": success, "action_is_valid": valid, "action_is_effective": effective, "passed": passed,
                "total": len(self.problem.outputs) if self.problem else 0}

    def expert_turn(self, max_actions: int) -> tuple[str, tuple[str, ...]]:
        """The warm start's expert: the problem's reference solution."""
        if self.problem is None or self.problem.solution is None:
            raise ValueError("DeepCoderEnv: this problem has no reference solution (a data_path row without "
                             "'solution'), so there is no expert answer")
        what = f"the function {self.problem.fn_name}" if self.problem.kind == "function" else "a program"
        return f"I write {what}", (self.problem.solution,)

    def _render_text(self) -> str:
        return self._obs


__all__ = ["FAMILIES", "DeepCoderEnv", "Problem", "Verdict", "extract_code", "generate_problem", "judge",
           "load_problems"]


if __name__ == "__main__":  # print a few generated problems: python -m envs.deepcoder
    for s in range(3):
        p = generate_problem(np.random.default_rng(s))
        print(p.statement, "\n---\n", p.solution, sep="")
