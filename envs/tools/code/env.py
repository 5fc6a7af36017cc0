"""Competitive-programming style coding (RAGEN's ``deepcoder`` env), offline, candidate code run in
a sandbox.

RAGEN reads ``agentica-org/DeepCoder-Preview-Dataset`` and runs all tests of a problem in one
subprocess; nothing can be downloaded here, so problems are generated procedurally from the seed
(small function specifications with a reference solution and seeded tests), and ``data_path`` reads
real DeepCoder-style problems from a local file (both in :mod:`envs.tools.code.problems`, with the
file's schema).

Every candidate runs in :class:`envs.tools.code.sandbox.Sandbox` (bubblewrap namespaces + resource
limits, a fresh interpreter and directory per run). The env refuses to run code when bubblewrap is
missing, unless ``allow_unsandboxed=True``.

Reward (RAGEN's): the fraction of tests passed (partial credit); ``success`` when all pass.
Departures: code that does not compile, or (function problems) defines no function of the problem's
name, is scored 0 without starting a sandbox; a candidate inside a Markdown code fence is taken from
the fence; outputs are compared as JSON values (RAGEN compares ``str(result) == str(expected)``),
stdin tests by their stripped lines; each test of a function problem is reported separately, so
tests passed before a crash or a hang still count.
"""

from __future__ import annotations

import ast
import json
import os
import re
from dataclasses import dataclass
from typing import Any

import numpy as np
from gymnasium import spaces

from envs.base import PromptSpec, TextEnv, bounded_int, text_space
from envs.tools.code.problems import Problem, generate_problem, load_problems
from envs.tools.code.sandbox import Limits, Sandbox

INSTRUCTION = (
    "You are solving a programming problem. Write a complete Python solution: the function the problem asks for "
    "(or a program reading standard input when it asks for one), with no example calls. Example answer format: "
    "<think>I sum the numbers that are even.</think><answer>def solve(nums):\n    return sum(x for x in nums if "
    "x % 2 == 0)</answer>"
)
MAX_CODE_LENGTH = 8192
RESULT_FILE = "results.jsonl"
NOT_COMPILED = "the code does not compile"
_FENCE = re.compile(r"```[ \t]*(?:python3?|py)?[ \t]*\n(.*?)```", re.DOTALL | re.IGNORECASE)

# The harness of function problems: reads the arguments, imports the candidate, calls it once per
# test and writes one JSON line per test (the expected outputs never enter the sandbox; the host
# compares).
HARNESS = """\
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
"""


# --------------------------------------------------------------------------------------------------
# Judging
# --------------------------------------------------------------------------------------------------


def extract_code(answer: str) -> str:
    """The code of an answer: the first Markdown fenced block when there is one, else the whole
    text, stripped."""
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
    """True when compiling ``code`` defines ``fn_name`` at top level (a ``def``, an assignment, an
    import) or as a method of a top-level class ``Solution`` (read from the syntax tree; nothing is
    executed)."""
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError, RecursionError, MemoryError, OverflowError):
        return False
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == fn_name:
            return True
        if (
            isinstance(node, ast.ClassDef)
            and node.name == "Solution"
            and any(
                isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef)) and m.name == fn_name
                for m in node.body
            )
        ):
            return True
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id == fn_name for t in targets):
                return True
        if isinstance(node, (ast.Import, ast.ImportFrom)) and any(
            (alias.asname or alias.name) == fn_name for alias in node.names
        ):
            return True
    return False


def _same_lines(actual: str, expected: str) -> bool:
    return [line.rstrip() for line in actual.strip().splitlines()] == [
        line.rstrip() for line in expected.strip().splitlines()
    ]


@dataclass(frozen=True)
class Verdict:
    """The judgement of one candidate: tests passed, total, and a short note on the first
    failure."""

    passed: int
    total: int
    note: str


def judge(problem: Problem, code: str, sandbox: Sandbox) -> Verdict:
    """Run ``code`` against every test of ``problem`` in ``sandbox`` and count the tests it
    passes."""
    total = len(problem.outputs)
    if not code.strip() or len(code) > MAX_CODE_LENGTH or not compiles(code):
        return Verdict(0, total, NOT_COMPILED)
    if problem.kind == "function" and not defines(code, problem.fn_name):
        # nothing to call: scored without a sandbox run (random text never reaches one)
        return Verdict(0, total, f"the code does not define {problem.fn_name}")
    if problem.kind == "stdin":
        return _judge_stdin(problem, code, sandbox)
    return _judge_function(problem, code, sandbox)


def _judge_stdin(problem: Problem, code: str, sandbox: Sandbox) -> Verdict:
    """A stdin problem: one sandbox run per test, its stdout compared line by line with the
    expected output; the note says how the first failing test failed."""
    passed, note = 0, ""
    for stdin, expected in zip(problem.inputs, problem.outputs):
        result = sandbox.run(code, stdin=stdin)
        if result.returncode == 0 and _same_lines(result.stdout, expected):
            passed += 1
        elif not note:
            note = (
                "timed out"
                if result.timed_out
                else "wrong output"
                if result.returncode == 0
                else "crashed"
            )
    return Verdict(passed, len(problem.outputs), note)


def _judge_function(problem: Problem, code: str, sandbox: Sandbox) -> Verdict:
    """A function problem: one sandbox run of :data:`HARNESS`, which calls the function on every
    test's arguments and writes one JSON line per call; each value is compared as JSON with the
    expected one, and the note says how the first failing test failed."""
    files = {
        "solution.py": code,
        "fn.json": json.dumps(problem.fn_name),
        "cases.json": json.dumps(problem.inputs),
    }
    result = sandbox.run(HARNESS, files=files, outputs=(RESULT_FILE,))
    values, errors, load_error = _harness_records(result.files.get(RESULT_FILE, ""))
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
                note = f"test {i + 1} did not finish" + (
                    " (time limit)" if result.timed_out else ""
                )
    return Verdict(passed, len(problem.outputs), note)


def _harness_records(text: str) -> tuple[dict[int, str], dict[int, str], str]:
    """The harness's result file read back: ``(values, errors, load_error)``, the returned value
    (JSON text) or the error (cut to 80 characters) of each test index, first record per index
    wins, and the error raised while loading the code (empty if none). Lines that are not JSON
    objects are skipped."""
    values: dict[int, str] = {}
    errors: dict[int, str] = {}
    load_error = ""
    for line in text.splitlines():
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
    return values, errors, load_error


def _json_equal(actual: str, expected: str) -> bool:
    try:
        return json.loads(actual) == json.loads(expected)
    except (json.JSONDecodeError, RecursionError):
        return False


# --------------------------------------------------------------------------------------------------
# The env
# --------------------------------------------------------------------------------------------------


class _CodeActions(spaces.Text):
    """The action space: code text up to 8192 characters. ``sample()`` draws at most 64 random
    characters: random text never defines the problem's function (it is judged without a sandbox
    run), and thousands of random characters per sample would only slow random-agent tests and text
    collection down."""

    def sample(self, mask: Any = None, probability: Any = None) -> str:
        if mask is None and probability is None:
            mask = (int(self.np_random.integers(0, 65)), None)
        return super().sample(mask=mask, probability=probability)


class DeepCoderEnv(TextEnv):
    """Write code that passes a problem's tests; the code runs in a sandbox. One answer per episode
    by default.

    ## Description At reset the seed draws a problem: a generated function specification (default)
    or a row of ``data_path``. The observation is the statement (with examples and starter code).
    The action is the candidate code (a Markdown ``python`` fence around it is accepted). The code
    runs in
    :class:`envs.tools.code.sandbox.Sandbox` against all tests of the problem.

    ## Action Space
    ``Text`` (printable ASCII, up to 8192 characters): the code. ``action_names`` is empty.

    ## Observation Space ``Text`` over printable ASCII plus the characters of the file's statements.
    Reset: the statement; after an answer: ``"Passed {p} of {n} tests."`` and, when some failed, the
    first failure (``"First failure: test 3 returned a wrong value."``).

    ## Rewards ``p / n``, the fraction of tests passed (RAGEN's partial credit). Code that is empty,
    longer than 8192 characters, does not compile, or (function problems) does not define the
    function scores 0.0 without running (``action_is_valid=False``).

    ## Episode End Terminated when every test passes or after ``max_attempts`` answers (1, as in
    RAGEN); never truncated. Stepping after the end returns the last observation, reward 0.0,
    ``terminated=True`` and ``action_is_valid=False``.

    ## Info
    ``success`` (all tests pass), ``action_is_valid`` (the code compiles and defines the function),
    ``action_is_effective`` (some test
    passes), ``passed``, ``total``.

    ## Arguments
    - ``data_path``: a ``.jsonl``/``.parquet`` problem file (schema in
      :mod:`envs.tools.code.problems`); None generates problems.
    - ``num_tests`` (8), ``num_examples`` (2): tests per generated problem, and how many the
      statement shows.
    - ``max_attempts`` (1): answers per episode.
    - ``cpu_seconds`` (2), ``wall_seconds`` (4.0), ``memory_mb`` (512), ``max_processes`` (16): the
      sandbox's limits per run (:class:`envs.tools.code.sandbox.Limits`).
    - ``allow_unsandboxed`` (False): run candidates without bubblewrap when it is missing (no
      isolation).
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
        num_tests = bounded_int("DeepCoderEnv", "num_tests", num_tests, 1)
        num_examples = bounded_int("DeepCoderEnv", "num_examples", num_examples, 0)
        max_attempts = bounded_int("DeepCoderEnv", "max_attempts", max_attempts, 1)
        if num_examples > num_tests:
            raise ValueError(
                f"num_examples ({num_examples}) must not exceed num_tests ({num_tests})"
            )
        self.problems = load_problems(data_path) if data_path is not None else None
        self.data_path = data_path
        self.num_tests, self.num_examples, self.max_attempts = num_tests, num_examples, max_attempts
        self.sandbox = Sandbox(
            Limits(
                cpu_seconds=cpu_seconds,
                wall_seconds=wall_seconds,
                memory_bytes=int(memory_mb) * 2**20,
                max_processes=max_processes,
            ),
            allow_unsandboxed=allow_unsandboxed,
        )
        extra = "".join(sorted({c for p in self.problems or () for c in p.statement}))
        longest = max((len(p.statement) for p in self.problems or ()), default=0)
        self.observation_space = text_space(extra, max_length=max(8192, longest + 200))
        self.action_space = _CodeActions(
            min_length=0, max_length=MAX_CODE_LENGTH, charset=text_space().character_set
        )
        self.problem: Problem | None = None
        self.attempts = 0
        self._obs = ""
        self._terminated = False

    def prompt_spec(self) -> PromptSpec:
        return PromptSpec(instruction=INSTRUCTION)

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str, dict]:
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
            else:
                index = bounded_int(
                    "DeepCoderEnv", "options['index']", index, 0, len(self.problems) - 1
                )
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
        valid = verdict.note != NOT_COMPILED and not verdict.note.startswith(
            "the code does not define"
        )
        reward = verdict.passed / verdict.total
        success = verdict.passed == verdict.total
        # the last allowed answer ends the task itself (like Countdown's single answer), not a time
        # limit
        self._terminated = success or self.attempts >= self.max_attempts
        self._obs = f"Passed {verdict.passed} of {verdict.total} tests."
        if not success:
            self._obs += f" First failure: {verdict.note}."
        return (
            self._obs,
            reward,
            self._terminated,
            False,
            self._info(success, valid, verdict.passed > 0, verdict.passed),
        )

    def _info(self, success: bool, valid: bool, effective: bool, passed: int) -> dict[str, Any]:
        return {
            "success": success,
            "action_is_valid": valid,
            "action_is_effective": effective,
            "passed": passed,
            "total": len(self.problem.outputs) if self.problem else 0,
        }

    def expert_turn(self, max_actions: int) -> tuple[str, tuple[str, ...]]:
        """The warm start's expert: the problem's reference solution."""
        if self.problem is None or self.problem.solution is None:
            raise ValueError(
                "DeepCoderEnv: this problem has no reference solution (a data_path row without "
                "'solution'), so there is no expert answer"
            )
        what = (
            f"the function {self.problem.fn_name}"
            if self.problem.kind == "function"
            else "a program"
        )
        return f"I write {what}", (self.problem.solution,)

    def _render_text(self) -> str:
        return self._obs


__all__ = ["DeepCoderEnv", "Verdict", "extract_code", "judge"]


if __name__ == "__main__":  # print a few generated problems: python -m envs.tools.code.env
    for s in range(3):
        p = generate_problem(np.random.default_rng(s))
        print(p.statement, "\n---\n", p.solution, sep="")
