"""Countdown arithmetic puzzle (RAGEN's ``countdown`` env), single turn, instances generated from
the seed.

RAGEN reads the HF dataset ``Jiayi-Pan/Countdown-Tasks-3to4``; nothing can be downloaded here, so
instances are generated procedurally in the same shape (3 or 4 numbers in 1..99, target in 1..100).

Generation rule: shuffle the numbers, then repeatedly pick two of the remaining values at random and
combine them with a random operation whose result is a positive integer (``a + b``, ``a * b``,
``larger - smaller`` when they differ, ``a / b`` when it divides exactly), until one value is left:
that is the target. Drawing is repeated until the target lies in ``[1, max_target]``. So every
instance has a solution that uses each number exactly once with positive integer intermediate
results (RAGEN's own filter only accepted sign-only sums ``±n1±n2...``).

Answer checking departs from RAGEN's ``eval``: the equation is parsed with :mod:`ast` and evaluated
exactly with
:class:`fractions.Fraction`, allowing only integer literals, ``+ - * /``, unary ``-``/``+`` and parentheses.
"""

from __future__ import annotations

import ast
import itertools
import math
import warnings
from fractions import Fraction
from typing import Any

from envs.base import PromptSpec, TextEnv, bounded_int, text_space

MAX_VALUE = 10**9  # the largest number, target or max_number/max_target (finite integers only)

INSTRUCTION = (
    "You are solving the Countdown puzzle. You should use the num list to create an equation that equals the target. "
    "Example answer format: <think> To find an equation using [3, 5, 2] to get 4. Let's check 2 + 5 = 7, 7 - 3 = 4. "
    "So the answer is 2 + 5 - 3 = 4. </think><answer>2 + 5 - 3</answer>"
)
# Typographic operators a model may write; mapped to ASCII before parsing.
_OPERATOR_ALIASES = {"×": "*", "÷": "/", "−": "-", "–": "-"}
ANSWER_CHARSET_EXTRA = "".join(_OPERATOR_ALIASES)
MAX_ANSWER_LENGTH = 1024

_BINOPS = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/"}


def evaluate_expression(text: str) -> tuple[Fraction, list[int]]:
    """Exact value of an arithmetic expression and the integer literals it uses.

    Allowed: non-negative integer literals, binary ``+ - * /``, unary ``-`` and ``+``, parentheses
    (and the aliases ``× ÷ −``). Raises ``ValueError`` for anything else (names, calls, floats,
    ``**``, ``=``, syntax errors, text over 1024 characters) and ``ZeroDivisionError`` when a
    divisor evaluates to 0; that exception carries the literals in its ``numbers`` attribute.
    """
    if not isinstance(text, str):
        raise ValueError(f"expected a string, got {type(text).__name__}")
    if len(text) > MAX_ANSWER_LENGTH:
        raise ValueError(f"expression longer than {MAX_ANSWER_LENGTH} characters")
    for alias, op in _OPERATOR_ALIASES.items():
        text = text.replace(alias, op)
    try:
        # model text like "3x" makes the parser warn; it is just an invalid answer
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", SyntaxWarning)
            tree = ast.parse(text.strip(), mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:
        raise ValueError(f"not an arithmetic expression: {exc}") from None

    numbers: list[int] = []
    zero_division = False

    def walk(node: ast.AST) -> Fraction | None:
        nonlocal zero_division
        if isinstance(node, ast.Constant) and type(node.value) is int:
            numbers.append(node.value)
            return Fraction(node.value)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
            value = walk(node.operand)
            if value is None:
                return None
            return -value if isinstance(node.op, ast.USub) else value
        if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
            left, right = walk(node.left), walk(node.right)
            if left is None or right is None:
                return None
            if isinstance(node.op, ast.Add):
                return left + right
            if isinstance(node.op, ast.Sub):
                return left - right
            if isinstance(node.op, ast.Mult):
                return left * right
            if right == 0:
                zero_division = True
                return None
            return left / right
        raise ValueError(f"not allowed in an equation: {type(node).__name__}")

    try:
        value = walk(tree.body)
    except RecursionError:
        raise ValueError("expression nested too deeply") from None
    if zero_division or value is None:
        exc = ZeroDivisionError("division by zero")
        exc.numbers = numbers  # type: ignore[attr-defined]
        raise exc
    return value, numbers


# --------------------------------------------------------------------------------------------------
# Solver: exhaustive search over every way of combining all numbers pairwise (exact rational
# arithmetic).
# --------------------------------------------------------------------------------------------------

# Precedence of an expression string's top-level operator: 3 atom, 2 multiplicative, 1 additive.
_Item = tuple[Fraction, str, int]


def _combine(a: _Item, b: _Item, natural: bool) -> list[_Item]:
    """Every ``a op b``; with ``natural`` only results that are non-negative integers (classic
    Countdown rules)."""
    (va, ea, pa), (vb, eb, pb) = a, b
    out: list[_Item] = [(va + vb, f"{ea} + {eb}", 1)]
    if not natural or va >= vb:
        out.append((va - vb, f"{ea} - {_paren(eb, pb, 1)}", 1))
    out.append((va * vb, f"{_paren(ea, pa, 1)} * {_paren(eb, pb, 1)}", 2))
    if vb != 0 and (not natural or (va / vb).denominator == 1):
        out.append((va / vb, f"{_paren(ea, pa, 1)} / {_paren(eb, pb, 2)}", 2))
    return out


def _paren(expr: str, prec: int, at_most: int) -> str:
    """Parenthesise ``expr`` when its top-level precedence is ``<= at_most``."""
    return f"({expr})" if prec <= at_most else expr


def solve_countdown(nums: list[int] | tuple[int, ...], target: int) -> str | None:
    """An expression using every number in ``nums`` exactly once that evaluates to ``target``, or
    None.

    Searches all pairwise combinations with ``+ - * /`` (both operand orders, exact fractions),
    first keeping every intermediate result a non-negative integer (the readable solutions used as
    demonstrations), then without that restriction. Deterministic: the same input always gives the
    same expression. Four numbers take milliseconds.
    """
    target_f = Fraction(target)
    seen: set[tuple[Fraction, ...]] = set()
    natural = True

    def search(items: list[_Item]) -> str | None:
        if len(items) == 1:
            return items[0][1] if items[0][0] == target_f else None
        key = tuple(sorted(item[0] for item in items))
        if key in seen:
            return None
        seen.add(key)
        for i, j in itertools.permutations(range(len(items)), 2):
            rest = [items[k] for k in range(len(items)) if k != i and k != j]
            for combined in _combine(items[i], items[j], natural):
                found = search([combined] + rest)
                if found is not None:
                    return found
        return None

    if not nums:
        return None
    leaves = [(Fraction(n), str(n), 3) for n in nums]
    found = search(leaves)
    if found is None:
        natural, seen = False, set()
        found = search(leaves)
    return found


class CountdownEnv(TextEnv):
    """Countdown: combine all given numbers with ``+ - * /`` to hit a target. One answer per
    episode.

    ## Description At reset the seed generates ``numbers`` (3 or 4, uniform in ``1..max_number``)
    and a reachable target (see the module docstring for the rule: each number used exactly once,
    positive integer intermediate results, target in ``1..max_target``). The agent answers with an
    equation string such as ``"(44 - 19) * 4 - 35"``.

    ## Action Space ``Text`` (printable ASCII plus ``× ÷ − –``, up to 1024 characters): the
    equation, without ``= target``. ``action_names`` is empty.

    ## Observation Space ``Text`` over printable ASCII. Reset: ``"Target: {target}, nums: {nums}"``
    (``nums`` as a Python list); after the answer: ``"Your answer get {reward} points."``.

    ## Rewards
    - 0.0 (bad format): not a string, not an arithmetic expression (only integer literals, ``+ - *
      /``, unary minus, parentheses are allowed; ``=`` is not), or its integer literals are not
      exactly the multiset ``nums`` (a number missing, reused or foreign).
    - ``format_score`` (0.1): right numbers, but the value differs from the target or a divisor
      evaluates to 0.
    - ``score`` (1.0): right numbers and the exact value equals the target.

    ## Episode End Terminated after one answer, whatever it is. Stepping after the end returns the
    last observation, reward 0.0, ``terminated=True`` and ``action_is_valid=False``.

    ## Info ``success`` (reward == ``score``), ``action_is_valid`` (format ok),
    ``action_is_effective`` (reward > 0).

    ## Arguments
    - ``format_score`` (0.1), ``score`` (1.0).
    - ``min_numbers`` (3), ``max_numbers`` (4): how many numbers an instance has (uniform in
      between).
    - ``max_number`` (99): numbers are drawn from ``1..max_number``. ``max_target`` (100): targets
      lie in ``1..max_target``.
    - ``render_mode``: ``None`` or ``"ansi"``.

    ## Options ``reset(options={"target": int, "nums": list[int]})`` plays a given instance instead
    of a generated one.
    """

    branchable = True  # small in-process state: turns may branch (--data.branching.branches)

    def __init__(
        self,
        format_score: float = 0.1,
        score: float = 1.0,
        min_numbers: int = 3,
        max_numbers: int = 4,
        max_number: int = 99,
        max_target: int = 100,
        render_mode: str | None = None,
    ):
        super().__init__(render_mode=render_mode)
        if not 2 <= min_numbers <= max_numbers <= 6:
            raise ValueError(
                f"need 2 <= min_numbers <= max_numbers <= 6, got min_numbers={min_numbers}, max_numbers={max_numbers}"
            )
        self.max_number = bounded_int("CountdownEnv", "max_number", max_number, 1, MAX_VALUE)
        self.max_target = bounded_int("CountdownEnv", "max_target", max_target, 1, MAX_VALUE)
        self.format_score, self.score = float(format_score), float(score)
        if not (math.isfinite(self.format_score) and math.isfinite(self.score)):
            raise ValueError(
                f"format_score and score must be finite numbers, got {format_score!r}, {score!r}"
            )
        self.min_numbers = int(min_numbers)
        self.max_numbers = int(max_numbers)

        self.action_space = text_space(ANSWER_CHARSET_EXTRA, max_length=MAX_ANSWER_LENGTH)
        self.observation_space = text_space()
        self.target: int | None = None
        self.nums: list[int] = []
        self._obs = ""
        self._done = True

    def prompt_spec(self) -> PromptSpec:
        return PromptSpec(instruction=INSTRUCTION)

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str, dict]:
        super().reset(seed=seed)
        options = self._reset_options(options, ("target", "nums"))
        if options:
            if set(options) != {"target", "nums"}:
                raise ValueError("CountdownEnv.reset: options must give both 'target' and 'nums'")
            nums = options["nums"]
            if not isinstance(nums, (list, tuple)) or not 1 <= len(nums) <= 6:
                raise ValueError(
                    f"options['nums'] must be a list of 1 to 6 integers, got {nums!r}"[:200]
                )
            nums = [
                bounded_int("CountdownEnv", "options['nums'] entries", n, 0, MAX_VALUE)
                for n in nums
            ]
            self.target = bounded_int(
                "CountdownEnv", "options['target']", options["target"], -MAX_VALUE, MAX_VALUE
            )
            self.nums = nums
        else:
            self.target, self.nums = self._generate()
        self._obs = f"Target: {self.target}, nums: {self.nums}"
        self._done = False
        return self._obs, self._info(success=False, valid=True, effective=False)

    def _generate(self) -> tuple[int, list[int]]:
        rng = self.np_random
        while True:
            count = int(rng.integers(self.min_numbers, self.max_numbers + 1))
            nums = [int(x) for x in rng.integers(1, self.max_number + 1, size=count)]
            pool = list(nums)
            while len(pool) > 1:
                i, j = (int(k) for k in rng.choice(len(pool), size=2, replace=False))
                a, b = pool[i], pool[j]
                results = [a + b, a * b]
                if a != b:
                    results.append(abs(a - b))
                big, small = max(a, b), min(a, b)
                if big % small == 0:
                    results.append(big // small)
                value = results[int(rng.integers(len(results)))]
                pool = [pool[k] for k in range(len(pool)) if k not in (i, j)] + [value]
            if 1 <= pool[0] <= self.max_target:
                return pool[0], nums

    def step(self, action: Any) -> tuple[str, float, bool, bool, dict]:
        if self.target is None:
            raise RuntimeError("CountdownEnv: call reset() before step()")
        if self._done:
            return (
                self._obs,
                0.0,
                True,
                False,
                self._info(success=False, valid=False, effective=False),
            )
        reward = self.check_answer(action)
        self._obs = f"Your answer get {reward} points."
        self._done = True
        return (
            self._obs,
            reward,
            True,
            False,
            self._info(success=reward == self.score, valid=reward > 0, effective=reward > 0),
        )

    def check_answer(self, answer: Any) -> float:
        """Reward of ``answer`` for the current instance: 0.0, ``format_score`` or ``score`` (see
        class doc)."""
        try:
            value, used = evaluate_expression(answer)
        except ValueError:
            return 0.0
        except ZeroDivisionError as exc:
            used = exc.numbers  # type: ignore[attr-defined]
            return self.format_score if sorted(used) == sorted(self.nums) else 0.0
        if sorted(used) != sorted(self.nums):
            return 0.0
        return self.score if value == self.target else self.format_score

    def _info(self, *, success: bool, valid: bool, effective: bool) -> dict[str, Any]:
        return {
            "success": success,
            "action_is_valid": valid,
            "action_is_effective": effective,
        }

    def expert_turn(self, max_actions: int) -> tuple[str, tuple[str, ...]]:
        """The warm start's expert: the solver's equation (:func:`solve_countdown`) for the current
        numbers and target."""
        expr = solve_countdown(list(self.nums), int(self.target))
        if expr is None:  # generated instances always have one; a hand-set instance might not
            expr = " + ".join(str(n) for n in self.nums)
            return f"no exact equation; closest try {expr}", (expr,)
        return f"{expr} = {self.target}", (expr,)

    def _render_text(self) -> str:
        return self._obs
