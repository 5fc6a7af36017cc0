"""Propositional formulas and proof goals: the data the checker (:mod:`envs.logic.checker`), the
proof search (:mod:`envs.logic.prover`) and the theorem generator (:mod:`envs.logic.theorems`)
share, with their ASCII text and its parser. This is NOT Lean and runs no Lean.

Formulas (ASCII, Lean's precedence and associativity): atoms (lower-case names), ``False``, ``~A`` (``A -> False``,
unfolded wherever Lean unfolds ``Not``), ``A /\\ B``, ``A \\/ B``, ``A -> B``; ``~`` binds tightest, then ``/\\``,
``\\/``, ``->``; the binary connectives associate to the right. Formulas are tuples: ``("atom", "p")``,
``("false",)``, ``("not", A)``, ``("and", A, B)``, ``("or", A, B)``, ``("imp", A, B)``.

A proof state is a tuple of goals (hypotheses ``name : formula`` and a target); :func:`state_text` is Lean's goal
view of it in ASCII. Tactic names are reserved here too: no proposition may be called ``intro``. Every function here
runs in time bounded by the text's length (inputs are capped).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

Formula = tuple
MAX_FORMULA_CHARS = 400  # bounds the depth of every recursion over a formula
FALSE: Formula = ("false",)
# the tactic language's keywords (envs.logic.checker): reserved here, so a formula never names a
# proposition after one
TACTICS = (
    "intro",
    "exact",
    "apply",
    "assumption",
    "constructor",
    "left",
    "right",
    "cases",
    "specialize",
    "exfalso",
    "contradiction",
    "done",
)
RESERVED = {"with", "False", "True", *TACTICS}


class FormulaSyntaxError(ValueError):
    """A formula that does not parse."""


# --------------------------------------------------------------------------------------------------
# Formulas
# --------------------------------------------------------------------------------------------------


def atom(name: str) -> Formula:
    return ("atom", name)


def neg(a: Formula) -> Formula:
    return ("not", a)


def conj(a: Formula, b: Formula) -> Formula:
    return ("and", a, b)


def disj(a: Formula, b: Formula) -> Formula:
    return ("or", a, b)


def imp(a: Formula, b: Formula) -> Formula:
    return ("imp", a, b)


def show(f: Formula, prec: int = 0) -> str:
    """ASCII text of ``f`` with the fewest parentheses Lean's precedences need."""
    kind = f[0]
    if kind == "atom":
        return f[1]
    if kind == "false":
        return "False"
    if kind == "not":
        return "~" + show(f[1], 4)
    if kind == "and":
        text, own = f"{show(f[1], 4)} /\\ {show(f[2], 3)}", 3
    elif kind == "or":
        text, own = f"{show(f[1], 3)} \\/ {show(f[2], 2)}", 2
    else:
        text, own = f"{show(f[1], 2)} -> {show(f[2], 1)}", 1
    return f"({text})" if prec > own else text


def canon(f: Formula) -> Formula:
    """``f`` with every ``~A`` unfolded to ``A -> False`` (Lean's ``Not`` is reducible: the two are
    the same type)."""
    kind = f[0]
    if kind == "not":
        return ("imp", canon(f[1]), FALSE)
    if kind in ("and", "or", "imp"):
        return (kind, canon(f[1]), canon(f[2]))
    return f


def same(a: Formula, b: Formula) -> bool:
    """Definitional equality of two formulas (syntactic up to unfolding ``~``): ``canon(a) ==
    canon(b)``, compared top-down so that formulas of different shapes differ at once (the search
    compares a lot of them)."""
    if a is b:
        return True
    if a[0] == "not":
        a = ("imp", a[1], FALSE)
    if b[0] == "not":
        b = ("imp", b[1], FALSE)
    if a[0] != b[0] or a[0] in ("atom", "false"):
        return a == b
    return same(a[1], b[1]) and same(a[2], b[2])


def premise_conclusion(f: Formula) -> tuple[Formula, Formula] | None:
    """``(A, B)`` when ``f`` is ``A -> B`` or ``~A`` (``B = False``), else None."""
    if f[0] == "imp":
        return f[1], f[2]
    if f[0] == "not":
        return f[1], FALSE
    return None


_FORMULA_TOKEN = re.compile(r"\s*(->|/\\|\\/|~|\(|\)|[A-Za-z_][A-Za-z0-9_']*|→|∧|∨|¬)")
_UNICODE = {"→": "->", "∧": "/\\", "∨": "\\/", "¬": "~"}


def parse_formula(text: str) -> Formula:
    """The formula of ``text`` (ASCII syntax of the module docstring; Lean's unicode connectives are
    accepted too)."""
    if not isinstance(text, str) or not text.strip():
        raise FormulaSyntaxError("empty formula")
    if len(text) > MAX_FORMULA_CHARS:
        raise FormulaSyntaxError(f"formula longer than {MAX_FORMULA_CHARS} characters")
    tokens: list[str] = []
    pos = 0
    while pos < len(text):
        if text[pos:].strip() == "":
            break
        m = _FORMULA_TOKEN.match(text, pos)
        if m is None:
            raise FormulaSyntaxError(
                f"unexpected character {text[pos:].lstrip()[0]!r} in formula {text!r}"
            )
        tokens.append(_UNICODE.get(m.group(1), m.group(1)))
        pos = m.end()
    parser = _FormulaParser(tokens, text)
    f = parser.imp()
    if parser.i != len(tokens):
        raise FormulaSyntaxError(f"unexpected {tokens[parser.i]!r} in formula {text!r}")
    return f


class _FormulaParser:
    def __init__(self, tokens: list[str], text: str):
        self.tokens, self.text, self.i, self.depth = tokens, text, 0, 0

    def peek(self) -> str | None:
        return self.tokens[self.i] if self.i < len(self.tokens) else None

    def imp(self) -> Formula:
        return self.chain("imp", "->", self.disj)

    def disj(self) -> Formula:
        return self.chain("or", "\\/", self.conj)

    def conj(self) -> Formula:
        return self.chain("and", "/\\", self.unary)

    def chain(self, kind: str, symbol: str, sub) -> Formula:
        """``a op b op c`` as ``(kind, a, (kind, b, c))`` (right associative), read in a loop: a
        long chain costs no recursion depth."""
        operands = [sub()]
        while self.peek() == symbol:
            self.i += 1
            operands.append(sub())
        f = operands[-1]
        for left in reversed(operands[:-1]):
            f = (kind, left, f)
        return f

    def unary(self) -> Formula:
        negations = 0
        while self.peek() == "~":
            negations += 1
            self.i += 1
        f = self.primary()
        for _ in range(negations):
            f = neg(f)
        return f

    def primary(self) -> Formula:
        tok = self.peek()
        if tok is None:
            raise FormulaSyntaxError(f"formula {self.text!r} ends too early")
        self.i += 1
        if tok == "(":
            self.depth += 1
            if self.depth > 50:
                raise FormulaSyntaxError("formula nested too deeply (more than 50 parentheses)")
            inner = self.imp()
            if self.peek() != ")":
                raise FormulaSyntaxError(f"missing ')' in formula {self.text!r}")
            self.i += 1
            self.depth -= 1
            return inner
        if tok == "False":
            return FALSE
        if tok[0].isalpha() or tok[0] == "_":
            if tok in RESERVED or tok == "True":
                raise FormulaSyntaxError(f"{tok!r} cannot be a proposition name")
            return atom(tok)
        raise FormulaSyntaxError(f"unexpected {tok!r} in formula {self.text!r}")


# --------------------------------------------------------------------------------------------------
# Goals and their text
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Goal:
    """One goal: named hypotheses in order, and the target."""

    hyps: tuple[tuple[str, Formula], ...]
    target: Formula

    def lookup(self, name: str) -> Formula | None:
        for n, f in self.hyps:
            if n == name:
                return f
        return None

    def without(self, name: str) -> tuple[tuple[str, Formula], ...]:
        return tuple((n, f) for n, f in self.hyps if n != name)

    def text(self) -> str:
        lines = [f"{n} : {show(f)}" for n, f in self.hyps]
        return "\n".join([*lines, f"|- {show(self.target)}"])


State = tuple[Goal, ...]


def initial_state(theorem: Formula) -> State:
    return (Goal((), theorem),)


def state_text(state: State, max_goals: int = 4) -> str:
    """Lean's goal view in ASCII: ``"2 goals"``, then each goal's hypotheses and ``|- target``,
    blank lines between; ``"no goals"`` when the proof is complete. At most ``max_goals`` goals are
    printed in full."""
    if not state:
        return "no goals"
    head = "1 goal" if len(state) == 1 else f"{len(state)} goals"
    blocks = [g.text() for g in state[:max_goals]]
    if len(state) > max_goals:
        blocks.append(f"... and {len(state) - max_goals} more goals")
    return head + "\n" + "\n\n".join(blocks)
