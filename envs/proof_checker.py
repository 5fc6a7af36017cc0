"""An exact checker for a small tactic language over propositional logic (intuitionistic natural deduction), its
proof search, and a generator of provable goals. Used by :mod:`envs.prop_proof`; this is NOT Lean and runs no Lean.

Formulas (ASCII, Lean's precedence and associativity): atoms (lower-case names), ``False``, ``~A`` (``A -> False``,
unfolded wherever Lean unfolds ``Not``), ``A /\\ B``, ``A \\/ B``, ``A -> B``; ``~`` binds tightest, then ``/\\``,
``\\/``, ``->``; the binary connectives associate to the right. Formulas are tuples: ``("atom", "p")``,
``("false",)``, ``("not", A)``, ``("and", A, B)``, ``("or", A, B)``, ``("imp", A, B)``.

A proof state is a tuple of goals (hypotheses ``name : formula`` and a target); tactics act on the first goal, as
Lean's do on the main goal:

====================  ==================================================================================
``intro a b ...``      target ``A -> B`` (or ``~A``): hypothesis ``a : A``, target ``B``; one name per premise
``exact t``            close the goal with the term ``t`` (checked against the target)
``apply t``            ``t : A1 -> ... -> An -> T`` with ``T`` the target: new goals ``A1 .. An``
``assumption``         close the goal with a hypothesis whose type is the target
``constructor``        target ``A /\\ B``: goals ``A`` and ``B``
``left`` / ``right``   target ``A \\/ B``: goal ``A`` / ``B``
``cases h with a b``   ``h : A /\\ B``: ``a : A``, ``b : B``; ``h : A \\/ B``: two goals with ``a : A`` / ``b : B``;
                       ``cases h`` with ``h : False`` closes the goal
``specialize h t ..``  ``h : A -> B`` and ``t : A``: ``h : B``
``exfalso``            target ``False``
``contradiction``      close the goal when a hypothesis is ``False`` or two are ``A`` and ``~A``
``done``               fails with ``unsolved goals`` while goals remain
====================  ==================================================================================

Terms (for ``exact``/``apply``/``specialize``): hypothesis names, application by juxtaposition with parentheses,
projections ``t.1``/``t.2`` (or ``h.left``/``h.right``), and the constants ``And.intro a b``, ``Or.inl a``,
``Or.inr b``, ``False.elim t``, ``absurd a na``. Types are checked bidirectionally: the constants need the expected
type (``exact``/``apply`` positions and arguments), as elaboration in Lean does.

Departures from Lean, on purpose: hypothesis names may not be shadowed (a reused name is an error naming it, where
Lean would make the old hypothesis inaccessible), ``intro`` needs explicit names, ``cases`` takes Lean 3's
``with a b`` names, and a tactic line may hold several tactics separated by ``;`` that are checked as one block
(all or nothing). Every function here runs in time bounded by the text's length (inputs are capped).
"""

from __future__ import annotations

import re
import zlib
from dataclasses import dataclass

import numpy as np

Formula = tuple
MAX_TACTIC_CHARS = 512
MAX_TACTICS_PER_LINE = 8
MAX_FORMULA_CHARS = 400  # bounds the depth of every recursion over a formula
FALSE: Formula = ("false",)
TACTICS = ("intro", "exact", "apply", "assumption", "constructor", "left", "right", "cases", "specialize",
           "exfalso", "contradiction", "done")
CONSTANTS = ("And.intro", "Or.inl", "Or.inr", "False.elim", "absurd")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_']*\Z")
_RESERVED = {"with", "False", "True", *TACTICS}


class ProofError(ValueError):
    """A tactic or term the checker rejects; the message is the compiler-like error shown to the agent."""


class FormulaSyntaxError(ValueError):
    """A formula that does not parse."""


# ----------------------------------------------------------------------------------------------------------------
# Formulas
# ----------------------------------------------------------------------------------------------------------------


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
    """``f`` with every ``~A`` unfolded to ``A -> False`` (Lean's ``Not`` is reducible: the two are the same type)."""
    kind = f[0]
    if kind == "not":
        return ("imp", canon(f[1]), FALSE)
    if kind in ("and", "or", "imp"):
        return (kind, canon(f[1]), canon(f[2]))
    return f


def same(a: Formula, b: Formula) -> bool:
    """Definitional equality of two formulas (syntactic up to unfolding ``~``): ``canon(a) == canon(b)``, compared
    top-down so that formulas of different shapes differ at once (the search compares a lot of them)."""
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
    """The formula of ``text`` (ASCII syntax of the module docstring; Lean's unicode connectives are accepted too)."""
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
            raise FormulaSyntaxError(f"unexpected character {text[pos:].lstrip()[0]!r} in formula {text!r}")
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
        """``a op b op c`` as ``(kind, a, (kind, b, c))`` (right associative), read in a loop: a long chain costs no
        recursion depth."""
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
            if tok in _RESERVED or tok == "True":
                raise FormulaSyntaxError(f"{tok!r} cannot be a proposition name")
            return atom(tok)
        raise FormulaSyntaxError(f"unexpected {tok!r} in formula {self.text!r}")


# ----------------------------------------------------------------------------------------------------------------
# Goals and their text
# ----------------------------------------------------------------------------------------------------------------


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
    """Lean's goal view in ASCII: ``"2 goals"``, then each goal's hypotheses and ``|- target``, blank lines between;
    ``"no goals"`` when the proof is complete. At most ``max_goals`` goals are printed in full."""
    if not state:
        return "no goals"
    head = "1 goal" if len(state) == 1 else f"{len(state)} goals"
    blocks = [g.text() for g in state[:max_goals]]
    if len(state) > max_goals:
        blocks.append(f"... and {len(state) - max_goals} more goals")
    return head + "\n" + "\n\n".join(blocks)


# ----------------------------------------------------------------------------------------------------------------
# Terms
# ----------------------------------------------------------------------------------------------------------------

_TERM_TOKEN = re.compile(r"\s*(\(|\)|\.(?:1|2)(?![0-9])|[A-Za-z_][A-Za-z0-9_']*(?:\.[A-Za-z_][A-Za-z0-9_']*)*)")


def parse_term(text: str) -> tuple:
    """A term's syntax tree: ``("var", n)``, ``("const", n)``, ``("proj", t, 1|2)``, ``("app", f, (args...))``."""
    tokens: list[str] = []
    pos = 0
    while pos < len(text):
        if not text[pos:].strip():
            break
        m = _TERM_TOKEN.match(text, pos)
        if m is None:
            raise ProofError(f"unexpected token {text[pos:].split()[0]!r} in term")
        tokens.append(m.group(1))
        pos = m.end()
    if not tokens:
        raise ProofError("expected a term")
    parser = _TermParser(tokens)
    term = parser.application()
    if parser.i != len(tokens):
        raise ProofError(f"unexpected token {tokens[parser.i]!r} in term")
    return term


class _TermParser:
    def __init__(self, tokens: list[str]):
        self.tokens, self.i, self.depth = tokens, 0, 0

    def peek(self) -> str | None:
        return self.tokens[self.i] if self.i < len(self.tokens) else None

    def application(self) -> tuple:
        head = self.primary()
        args = []
        while self.peek() not in (None, ")"):
            args.append(self.primary())
        return ("app", head, tuple(args)) if args else head

    def primary(self) -> tuple:
        tok = self.peek()
        if tok is None:
            raise ProofError("expected a term")
        if tok.startswith(".") or tok == ")":
            raise ProofError(f"unexpected token {tok!r} in term")
        self.i += 1
        if tok == "(":
            self.depth += 1
            if self.depth > 50:
                raise ProofError("term nested too deeply")
            term = self.application()
            if self.peek() != ")":
                raise ProofError("expected ')' in term")
            self.i += 1
            self.depth -= 1
        else:
            term = _name_term(tok)
        while self.peek() in (".1", ".2"):
            term = ("proj", term, int(self.tokens[self.i][1]))
            self.i += 1
        return term


def _name_term(token: str) -> tuple:
    if token in CONSTANTS:
        return ("const", token)
    base, *fields = token.split(".")
    term: tuple = ("var", base)
    for name in fields:
        if name not in ("left", "right"):
            raise ProofError(f"unknown identifier '{token}'")
        term = ("proj", term, 1 if name == "left" else 2)
    return term


def term_text(t: tuple) -> str:
    kind = t[0]
    if kind in ("var", "const"):
        return t[1]
    if kind == "proj":
        inner = term_text(t[1])
        return f"{inner if t[1][0] != 'app' else '(' + inner + ')'}.{t[2]}"
    parts = [term_text(t[1])] + [term_text(a) if a[0] != "app" else f"({term_text(a)})" for a in t[2]]
    return " ".join(parts)


def _head_args(t: tuple) -> tuple[tuple, tuple]:
    return (t[1], t[2]) if t[0] == "app" else (t, ())


def _mismatch(t: tuple, actual: Formula, expected: Formula) -> ProofError:
    return ProofError(f"type mismatch\n  {term_text(t)}\nhas type\n  {show(actual)}\nbut is expected to have type\n"
                      f"  {show(expected)}")


def infer(goal: Goal, t: tuple) -> Formula:
    """The type of term ``t`` in ``goal``'s context, or a :class:`ProofError`."""
    kind = t[0]
    if kind == "var":
        f = goal.lookup(t[1])
        if f is None:
            raise ProofError(f"unknown identifier '{t[1]}'")
        return f
    if kind == "const":
        raise ProofError(f"cannot infer the type of '{t[1]}' here: use it where the expected type is known "
                         "(exact, apply, or as an argument)")
    if kind == "proj":
        f = infer(goal, t[1])
        if f[0] != "and":
            raise ProofError(f"invalid projection: '{term_text(t[1])}' has type {show(f)}, which is not a "
                             "conjunction")
        return f[t[2]]
    head, args = _head_args(t)
    if head[0] == "const":
        raise ProofError(f"cannot infer the type of '{head[1]}' here: use it where the expected type is known "
                         "(exact, apply, or as an argument)")
    f = infer(goal, head)
    done: list[tuple] = []
    for arg in args:
        pc = premise_conclusion(f)
        if pc is None:
            applied = term_text(("app", head, tuple(done))) if done else term_text(head)
            raise ProofError(f"function expected: '{applied}' has type {show(f)}, it cannot be applied to "
                             f"'{term_text(arg)}'")
        check(goal, arg, pc[0])
        done.append(arg)
        f = pc[1]
    return f


def check(goal: Goal, t: tuple, expected: Formula) -> None:
    """Raise a :class:`ProofError` unless term ``t`` has type ``expected`` in ``goal``'s context."""
    head, args = _head_args(t)
    if head[0] != "const":
        actual = infer(goal, t)
        if not same(actual, expected):
            raise _mismatch(t, actual, expected)
        return
    name = head[1]
    arity = {"And.intro": 2, "Or.inl": 1, "Or.inr": 1, "False.elim": 1, "absurd": 2}[name]
    if len(args) != arity:
        raise ProofError(f"'{name}' expects {arity} argument{'s' if arity > 1 else ''}, got {len(args)}")
    if name == "And.intro":
        if expected[0] != "and":
            raise ProofError(f"'And.intro' builds a conjunction, but the expected type is {show(expected)}")
        check(goal, args[0], expected[1])
        check(goal, args[1], expected[2])
    elif name in ("Or.inl", "Or.inr"):
        if expected[0] != "or":
            raise ProofError(f"'{name}' builds a disjunction, but the expected type is {show(expected)}")
        check(goal, args[0], expected[1 if name == "Or.inl" else 2])
    elif name == "False.elim":
        check(goal, args[0], FALSE)
    else:  # absurd a na : from a : A and na : ~A, anything
        check(goal, args[1], neg(infer(goal, args[0])))


# ----------------------------------------------------------------------------------------------------------------
# Tactics
# ----------------------------------------------------------------------------------------------------------------


def _fresh(goal_hyps: tuple[tuple[str, Formula], ...], names: list[str]) -> None:
    used = {n for n, _ in goal_hyps}
    for i, name in enumerate(names):
        if not _NAME.match(name) or name in _RESERVED or name in CONSTANTS:
            raise ProofError(f"invalid hypothesis name '{name}'")
        if name in used or name in names[:i]:
            raise ProofError(f"the name '{name}' is already used by a hypothesis; choose a fresh name")


def apply_tactic(state: State, tactic: str) -> State:
    """The proof state after ``tactic`` (one line; several tactics separated by ``;`` run as one block), or a
    :class:`ProofError` with the compiler-like message. ``state`` is never changed."""
    if not isinstance(tactic, str):
        raise ProofError("a tactic must be text")
    if len(tactic) > MAX_TACTIC_CHARS:
        raise ProofError(f"tactic longer than {MAX_TACTIC_CHARS} characters")
    parts = [p.strip() for p in tactic.replace("\n", ";").split(";")]
    parts = [p for p in parts if p]
    if not parts:
        raise ProofError("expected a tactic")
    if len(parts) > MAX_TACTICS_PER_LINE:
        raise ProofError(f"at most {MAX_TACTICS_PER_LINE} tactics per step, got {len(parts)}")
    for i, part in enumerate(parts):
        try:
            state = _one_tactic(state, part)
        except ProofError as exc:
            if len(parts) == 1:
                raise
            raise ProofError(f"in tactic {i + 1} of {len(parts)} ('{part}'): {exc}") from None
    return state


def _one_tactic(state: State, text: str) -> State:
    words = text.split()
    name, rest = words[0], text[len(words[0]):].strip()
    if name not in TACTICS:
        raise ProofError(f"unknown tactic '{name}'")
    if name == "done":
        if rest:
            raise ProofError("'done' takes no arguments")
        if state:
            raise ProofError("unsolved goals\n" + state_text(state))
        return state
    if not state:
        raise ProofError("no goals to be proved")
    goal, others = state[0], state[1:]
    new = _TACTIC_FUNCS[name](goal, rest)
    return (*new, *others)


def _no_args(name: str, rest: str) -> None:
    if rest:
        raise ProofError(f"'{name}' takes no arguments, got '{rest}'")


def _intro(goal: Goal, rest: str) -> tuple[Goal, ...]:
    names = rest.split()
    if not names:
        raise ProofError("'intro' needs a name for each premise it introduces: intro h")
    _fresh(goal.hyps, names)
    hyps, target = list(goal.hyps), goal.target
    for name in names:
        pc = premise_conclusion(target)
        if pc is None:
            raise ProofError(f"intro failed: no premise left to introduce as '{name}', the goal is {show(target)}")
        hyps.append((name, pc[0]))
        target = pc[1]
    return (Goal(tuple(hyps), target),)


def _exact(goal: Goal, rest: str) -> tuple[Goal, ...]:
    if not rest:
        raise ProofError("'exact' needs a term: exact h")
    check(goal, parse_term(rest), goal.target)
    return ()


def _apply(goal: Goal, rest: str) -> tuple[Goal, ...]:
    if not rest:
        raise ProofError("'apply' needs a term: apply h")
    t = parse_term(rest)
    head, args = _head_args(t)
    if head[0] == "const":
        if args:  # a constant with arguments must close the goal (its missing arguments have no names to refer to)
            check(goal, t, goal.target)
            return ()
        target = goal.target
        if head[1] == "And.intro" and target[0] == "and":
            return (Goal(goal.hyps, target[1]), Goal(goal.hyps, target[2]))
        if head[1] in ("Or.inl", "Or.inr") and target[0] == "or":
            return (Goal(goal.hyps, target[1 if head[1] == "Or.inl" else 2]),)
        if head[1] == "False.elim":
            return (Goal(goal.hyps, FALSE),)
        raise ProofError(f"apply failed: '{head[1]}' does not conclude the goal {show(target)}")
    f = infer(goal, t)
    premises: list[Formula] = []
    conclusion = f
    while not same(conclusion, goal.target):
        pc = premise_conclusion(conclusion)
        if pc is None:
            raise ProofError(f"apply failed: could not unify the conclusion of '{term_text(t)}'\n  {show(f)}\n"
                             f"with the goal\n  {show(goal.target)}")
        premises.append(pc[0])
        conclusion = pc[1]
    return tuple(Goal(goal.hyps, p) for p in premises)


def _assumption(goal: Goal, rest: str) -> tuple[Goal, ...]:
    _no_args("assumption", rest)
    if any(same(f, goal.target) for _, f in goal.hyps):
        return ()
    raise ProofError(f"assumption failed: no hypothesis has type {show(goal.target)}")


def _constructor(goal: Goal, rest: str) -> tuple[Goal, ...]:
    _no_args("constructor", rest)
    if goal.target[0] != "and":
        raise ProofError(f"constructor failed: the goal {show(goal.target)} is not a conjunction")
    return (Goal(goal.hyps, goal.target[1]), Goal(goal.hyps, goal.target[2]))


def _side(index: int, name: str):
    def tactic(goal: Goal, rest: str) -> tuple[Goal, ...]:
        _no_args(name, rest)
        if goal.target[0] != "or":
            raise ProofError(f"{name} failed: the goal {show(goal.target)} is not a disjunction")
        return (Goal(goal.hyps, goal.target[index]),)

    return tactic


def _cases(goal: Goal, rest: str) -> tuple[Goal, ...]:
    words = rest.split()
    if not words:
        raise ProofError("'cases' needs a hypothesis: cases h with a b")
    h, names = words[0], words[1:]
    if names and names[0] != "with":
        raise ProofError(f"expected 'with' after 'cases {h}', got '{names[0]}'")
    names = names[1:]
    f = goal.lookup(h)
    if f is None:
        raise ProofError(f"unknown identifier '{h}'")
    kept = goal.without(h)
    if f[0] == "false":
        if names:
            raise ProofError(f"'{h}' has type False, which has no cases: write 'cases {h}'")
        return ()
    if f[0] not in ("and", "or"):
        raise ProofError(f"cases failed: '{h}' has type {show(f)}, which is not a conjunction, a disjunction or "
                         "False")
    if len(names) != 2:
        raise ProofError(f"cases on '{h} : {show(f)}' needs two names: cases {h} with a b")
    _fresh(kept, names)
    a, b = names
    if f[0] == "and":
        return (Goal((*kept, (a, f[1]), (b, f[2])), goal.target),)
    return (Goal((*kept, (a, f[1])), goal.target), Goal((*kept, (b, f[2])), goal.target))


def _specialize(goal: Goal, rest: str) -> tuple[Goal, ...]:
    if not rest:
        raise ProofError("'specialize' needs a hypothesis and arguments: specialize h a")
    t = parse_term(rest)
    head, args = _head_args(t)
    if head[0] != "var" or not args:
        raise ProofError("specialize expects a hypothesis applied to arguments: specialize h a")
    f = infer(goal, t)
    return (Goal(tuple((n, f if n == head[1] else g) for n, g in goal.hyps), goal.target),)


def _exfalso(goal: Goal, rest: str) -> tuple[Goal, ...]:
    _no_args("exfalso", rest)
    return (Goal(goal.hyps, FALSE),)


def _contradiction(goal: Goal, rest: str) -> tuple[Goal, ...]:
    _no_args("contradiction", rest)
    if contradiction_in(goal):
        return ()
    raise ProofError("contradiction failed: no hypothesis is False and no two hypotheses are A and ~A")


def contradiction_in(goal: Goal) -> bool:
    types = {canon(f) for _, f in goal.hyps}
    return FALSE in types or any(f[0] == "imp" and f[2] == FALSE and f[1] in types for f in types)


_TACTIC_FUNCS = {"intro": _intro, "exact": _exact, "apply": _apply, "assumption": _assumption,
                 "constructor": _constructor, "left": _side(1, "left"), "right": _side(2, "right"),
                 "cases": _cases, "specialize": _specialize, "exfalso": _exfalso, "contradiction": _contradiction}


# ----------------------------------------------------------------------------------------------------------------
# Proof search (the expert)
# ----------------------------------------------------------------------------------------------------------------


class _Budget:
    def __init__(self, nodes: int):
        self.nodes = nodes

    def spend(self) -> bool:
        self.nodes -= 1
        return self.nodes >= 0


def _fresh_names(goal: Goal, k: int) -> list[str]:
    used = {n for n, _ in goal.hyps}
    out, i = [], 1
    while len(out) < k:
        if f"h{i}" not in used:
            out.append(f"h{i}")
        i += 1
    return out


def prove_goal(goal: Goal, depth: int = 6, nodes: int = 20000) -> list[str] | None:
    """Tactics that close ``goal`` (and only it), found by a backward proof search, or None.

    Invertible steps first (``exact`` a matching hypothesis, a contradiction, ``intro``, ``cases`` on a conjunction,
    ``specialize`` an implication whose premise is a hypothesis, ``constructor``); then the choices (``left``/
    ``right``, ``apply`` a hypothesis whose conclusion is the target, ``exfalso`` and ``apply`` one concluding
    ``False``), at most ``depth`` choices deep; ``cases`` on a disjunction last. At most ``nodes`` goals in all, so
    the search is bounded on any input. Iterative deepening over ``depth`` returns a proof with the fewest nested
    choices (an ``exfalso`` detour is never preferred to a proof without one)."""
    budget = _Budget(nodes)
    for d in range(depth + 1):
        plan = _search(goal, d, budget)
        if plan is not None or budget.nodes < 0:
            return plan
    return None


def prove_state(state: State, depth: int = 6, nodes: int = 20000) -> list[str] | None:
    """Tactics that close every goal of ``state`` in order, or None."""
    plan: list[str] = []
    for goal in state:
        tactics = prove_goal(goal, depth, nodes)
        if tactics is None:
            return None
        plan += tactics
    return plan


def _search(goal: Goal, depth: int, budget: _Budget) -> list[str] | None:
    if not budget.spend():
        return None
    target = goal.target
    for n, f in goal.hyps:
        if same(f, target):
            return [f"exact {n}"]
    for n, f in goal.hyps:
        if f == FALSE:
            return [f"cases {n}"]
    if contradiction_in(goal):
        return ["contradiction"]
    if premise_conclusion(target) is not None:
        hyps, names, t = list(goal.hyps), [], target
        while (pc := premise_conclusion(t)) is not None:
            name = _fresh_names(Goal(tuple(hyps), t), 1)[0]
            hyps.append((name, pc[0]))
            names.append(name)
            t = pc[1]
        rest = _search(Goal(tuple(hyps), t), depth, budget)
        return None if rest is None else [f"intro {' '.join(names)}", *rest]
    for n, f in goal.hyps:
        if f[0] == "and":
            a, b = _fresh_names(Goal(goal.without(n), target), 2)
            rest = _search(Goal((*goal.without(n), (a, f[1]), (b, f[2])), target), depth, budget)
            return None if rest is None else [f"cases {n} with {a} {b}", *rest]
    for n, f in goal.hyps:
        pc = premise_conclusion(f)
        if pc is None:
            continue
        for m, g in goal.hyps:
            if m != n and same(g, pc[0]):
                hyps = tuple((k, pc[1] if k == n else x) for k, x in goal.hyps)
                rest = _search(Goal(hyps, target), depth, budget)
                return None if rest is None else [f"specialize {n} {m}", *rest]
    if target[0] == "and":
        first = _search(Goal(goal.hyps, target[1]), depth, budget)
        second = None if first is None else _search(Goal(goal.hyps, target[2]), depth, budget)
        return None if second is None else ["constructor", *first, *second]
    if depth > 0:
        plan = _choices(goal, depth, budget)
        if plan is not None:
            return plan
    # a disjunction among the hypotheses is split last: invertible, but it doubles the rest of the proof, and the
    # choices above often prove the target without it
    for n, f in goal.hyps:
        if f[0] == "or":
            a, b = _fresh_names(Goal(goal.without(n), target), 2)
            kept = goal.without(n)
            first = _search(Goal((*kept, (a, f[1])), target), depth, budget)
            second = None if first is None else _search(Goal((*kept, (b, f[2])), target), depth, budget)
            return None if second is None else [f"cases {n} with {a} {b}", *first, *second]
    return None


def _choices(goal: Goal, depth: int, budget: _Budget) -> list[str] | None:
    """The non-invertible steps: ``left``/``right``, ``apply`` a hypothesis, ``exfalso`` + ``apply``."""
    target = goal.target
    if target[0] == "or":
        for side, word in ((1, "left"), (2, "right")):
            rest = _search(Goal(goal.hyps, target[side]), depth - 1, budget)
            if rest is not None:
                return [word, *rest]
    for n, f in goal.hyps:
        premises = _premises_for(f, target)
        if premises is not None:
            plan = _all(goal, premises, depth - 1, budget)
            if plan is not None:
                return [f"apply {n}", *plan]
    if target != FALSE:
        for n, f in goal.hyps:
            premises = _premises_for(f, FALSE)
            if premises is not None:
                plan = _all(goal, premises, depth - 1, budget)
                if plan is not None:
                    return ["exfalso", f"apply {n}", *plan]
    return None


def _premises_for(f: Formula, target: Formula) -> list[Formula] | None:
    """The premises ``apply`` leaves when a hypothesis of type ``f`` is applied to ``target`` (None: it does not
    conclude it; an empty list is ``exact``'s job)."""
    premises: list[Formula] = []
    while not same(f, target):
        pc = premise_conclusion(f)
        if pc is None:
            return None
        premises.append(pc[0])
        f = pc[1]
    return premises or None


def _all(goal: Goal, targets: list[Formula], depth: int, budget: _Budget) -> list[str] | None:
    plan: list[str] = []
    for t in targets:
        sub = _search(Goal(goal.hyps, t), depth, budget)
        if sub is None:
            return None
        plan += sub
    return plan


# ----------------------------------------------------------------------------------------------------------------
# Goal generator
# ----------------------------------------------------------------------------------------------------------------

ATOMS = ("p", "q", "r", "s", "t", "u", "v", "w")
SPLITS = {"train": range(8), "val": range(8, 9), "test": range(9, 10)}
_TRANSFORMS = ("imp_intro", "and_intro", "or_intro", "mp", "and_elim", "or_elim", "neg_intro", "explosion")


def split_of(theorem: Formula) -> str:
    """The split a theorem belongs to: a stable hash of its text, 8 of 10 buckets train, 1 val, 1 test. Drawing by
    seed and filtering by this bucket keeps the splits disjoint by content, whatever seeds they are drawn with."""
    bucket = zlib.crc32(show(theorem).encode()) % 10
    return next(name for name, buckets in SPLITS.items() if bucket in buckets)


def generate_theorem(rng: np.random.Generator, depth: int = 3, num_atoms: int = 4) -> Formula:
    """A provable theorem built by ``depth`` sound construction steps from ``a |- a``.

    The state is a sequent (premises ``P``, target ``T``) that is provable by construction; each step keeps it so:
    ``imp_intro`` moves a premise into the target (``X -> T``); ``and_intro`` conjoins a premise (or a new atom
    premise) to the target; ``or_intro`` disjoins any small formula; ``mp`` replaces a premise ``X`` by ``Y -> X``
    and adds ``Y``; ``and_elim`` replaces ``X`` by ``X /\\ Y``; ``or_elim`` replaces ``X`` by ``Y \\/ Z`` with
    ``Y -> X`` and ``Z -> X``; ``neg_intro`` turns the target into ``~Y`` with the premise ``Y -> ~T``;
    ``explosion`` replaces ``X`` by ``Y`` and ``~Y``. The theorem is the premises, shuffled, curried onto the
    target: ``P1 -> ... -> Pn -> T``.
    """
    atoms = ATOMS[:num_atoms]

    def new_atom() -> Formula:
        return atom(atoms[int(rng.integers(len(atoms)))])

    def small() -> Formula:
        a = new_atom()
        return neg(a) if rng.random() < 0.25 else a

    first = new_atom()
    premises: list[Formula] = [first]
    target: Formula = first
    for _ in range(depth):
        step = _TRANSFORMS[int(rng.integers(len(_TRANSFORMS)))]
        if not premises and step not in ("and_intro", "or_intro", "neg_intro"):
            step = "and_intro"
        j = int(rng.integers(len(premises))) if premises else 0
        if step == "imp_intro":
            target = imp(premises.pop(j), target)
        elif step == "and_intro":
            if premises and rng.random() < 0.5:
                side = premises[j]
            else:
                side = new_atom()
                premises.append(side)
            target = conj(target, side) if rng.random() < 0.5 else conj(side, target)
        elif step == "or_intro":
            other = small()
            target = disj(target, other) if rng.random() < 0.5 else disj(other, target)
        elif step == "mp":
            y = new_atom()
            premises[j] = imp(y, premises[j])
            premises.append(y)
        elif step == "and_elim":
            y = small()
            premises[j] = conj(premises[j], y) if rng.random() < 0.5 else conj(y, premises[j])
        elif step == "or_elim":
            x, y, z = premises[j], new_atom(), new_atom()
            premises[j] = disj(y, z)
            premises += [imp(y, x), imp(z, x)]
        elif step == "neg_intro":
            y = new_atom()
            premises.append(imp(y, neg(target)))
            target = neg(y)
        else:  # explosion
            y = new_atom()
            premises[j] = y
            premises.append(neg(y))
    order = rng.permutation(len(premises))
    theorem = target
    for i in order[::-1]:
        theorem = imp(premises[int(i)], theorem)
    return theorem


def draw_theorem(rng: np.random.Generator, depth: int = 3, num_atoms: int = 4, split: str = "train",
                 max_draws: int = 1000) -> Formula:
    """Theorems from :func:`generate_theorem` until one is in ``split`` (see :func:`split_of`) and the proof search
    proves it (its construction makes it provable; the search bounds only keep the expert's plans short)."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {sorted(SPLITS)}, got {split!r}")
    for _ in range(max_draws):
        theorem = generate_theorem(rng, depth, num_atoms)
        if split_of(theorem) == split and prove_state(initial_state(theorem)) is not None:
            return theorem
    raise RuntimeError(f"no {split} theorem of depth {depth} over {num_atoms} atoms in {max_draws} draws")
