"""An exact checker for a small tactic language over propositional logic (intuitionistic natural deduction): the
term parser, the type checker and the tactics. Used by :mod:`envs.logic.env`; this is NOT Lean and
runs no Lean. The formulas, goals and their ASCII syntax live in :mod:`envs.logic.formulas`; the
proof search that writes proofs in this language in :mod:`envs.logic.prover`, the theorem generator
in :mod:`envs.logic.theorems`.

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

from envs.logic.formulas import (
    FALSE,
    RESERVED,
    TACTICS,
    Formula,
    Goal,
    State,
    canon,
    neg,
    premise_conclusion,
    same,
    show,
    state_text,
)

MAX_TACTIC_CHARS = 512
MAX_TACTICS_PER_LINE = 8
CONSTANTS = ("And.intro", "Or.inl", "Or.inr", "False.elim", "absurd")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_']*\Z")


class ProofError(ValueError):
    """A tactic or term the checker rejects; the message is the compiler-like error shown to the
    agent."""


# --------------------------------------------------------------------------------------------------
# Terms
# --------------------------------------------------------------------------------------------------

_TERM_TOKEN = re.compile(
    r"\s*(\(|\)|\.(?:1|2)(?![0-9])|[A-Za-z_][A-Za-z0-9_']*(?:\.[A-Za-z_][A-Za-z0-9_']*)*)"
)


def parse_term(text: str) -> tuple:
    """A term's syntax tree: ``("var", n)``, ``("const", n)``, ``("proj", t, 1|2)``, ``("app", f,
    (args...))``."""
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
    parts = [term_text(t[1])] + [
        term_text(a) if a[0] != "app" else f"({term_text(a)})" for a in t[2]
    ]
    return " ".join(parts)


def _head_args(t: tuple) -> tuple[tuple, tuple]:
    return (t[1], t[2]) if t[0] == "app" else (t, ())


def _mismatch(t: tuple, actual: Formula, expected: Formula) -> ProofError:
    return ProofError(
        f"type mismatch\n  {term_text(t)}\nhas type\n  {show(actual)}\nbut is expected to have type\n"
        f"  {show(expected)}"
    )


def infer(goal: Goal, t: tuple) -> Formula:
    """The type of term ``t`` in ``goal``'s context, or a :class:`ProofError`."""
    kind = t[0]
    if kind == "var":
        f = goal.lookup(t[1])
        if f is None:
            raise ProofError(f"unknown identifier '{t[1]}'")
        return f
    if kind == "const":
        raise ProofError(
            f"cannot infer the type of '{t[1]}' here: use it where the expected type is known "
            "(exact, apply, or as an argument)"
        )
    if kind == "proj":
        f = infer(goal, t[1])
        if f[0] != "and":
            raise ProofError(
                f"invalid projection: '{term_text(t[1])}' has type {show(f)}, which is not a "
                "conjunction"
            )
        return f[t[2]]
    head, args = _head_args(t)
    if head[0] == "const":
        raise ProofError(
            f"cannot infer the type of '{head[1]}' here: use it where the expected type is known "
            "(exact, apply, or as an argument)"
        )
    f = infer(goal, head)
    done: list[tuple] = []
    for arg in args:
        pc = premise_conclusion(f)
        if pc is None:
            applied = term_text(("app", head, tuple(done))) if done else term_text(head)
            raise ProofError(
                f"function expected: '{applied}' has type {show(f)}, it cannot be applied to "
                f"'{term_text(arg)}'"
            )
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
        raise ProofError(
            f"'{name}' expects {arity} argument{'s' if arity > 1 else ''}, got {len(args)}"
        )
    if name == "And.intro":
        if expected[0] != "and":
            raise ProofError(
                f"'And.intro' builds a conjunction, but the expected type is {show(expected)}"
            )
        check(goal, args[0], expected[1])
        check(goal, args[1], expected[2])
    elif name in ("Or.inl", "Or.inr"):
        if expected[0] != "or":
            raise ProofError(
                f"'{name}' builds a disjunction, but the expected type is {show(expected)}"
            )
        check(goal, args[0], expected[1 if name == "Or.inl" else 2])
    elif name == "False.elim":
        check(goal, args[0], FALSE)
    else:  # absurd a na : from a : A and na : ~A, anything
        check(goal, args[1], neg(infer(goal, args[0])))


# --------------------------------------------------------------------------------------------------
# Tactics
# --------------------------------------------------------------------------------------------------


def _fresh(goal_hyps: tuple[tuple[str, Formula], ...], names: list[str]) -> None:
    used = {n for n, _ in goal_hyps}
    for i, name in enumerate(names):
        if not _NAME.match(name) or name in RESERVED or name in CONSTANTS:
            raise ProofError(f"invalid hypothesis name '{name}'")
        if name in used or name in names[:i]:
            raise ProofError(
                f"the name '{name}' is already used by a hypothesis; choose a fresh name"
            )


def apply_tactic(state: State, tactic: str) -> State:
    """The proof state after ``tactic`` (one line; several tactics separated by ``;`` run as one
    block), or a
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
    name, rest = words[0], text[len(words[0]) :].strip()
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
            raise ProofError(
                f"intro failed: no premise left to introduce as '{name}', the goal is {show(target)}"
            )
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
        # a constant with arguments must close the goal (its missing arguments have no names to
        # refer to)
        if args:
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
            raise ProofError(
                f"apply failed: could not unify the conclusion of '{term_text(t)}'\n  {show(f)}\n"
                f"with the goal\n  {show(goal.target)}"
            )
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
        raise ProofError(
            f"cases failed: '{h}' has type {show(f)}, which is not a conjunction, a disjunction or "
            "False"
        )
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
    raise ProofError(
        "contradiction failed: no hypothesis is False and no two hypotheses are A and ~A"
    )


def contradiction_in(goal: Goal) -> bool:
    types = {canon(f) for _, f in goal.hyps}
    return FALSE in types or any(f[0] == "imp" and f[2] == FALSE and f[1] in types for f in types)


_TACTIC_FUNCS = {
    "intro": _intro,
    "exact": _exact,
    "apply": _apply,
    "assumption": _assumption,
    "constructor": _constructor,
    "left": _side(1, "left"),
    "right": _side(2, "right"),
    "cases": _cases,
    "specialize": _specialize,
    "exfalso": _exfalso,
    "contradiction": _contradiction,
}
