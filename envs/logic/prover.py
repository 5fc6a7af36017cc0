"""The expert of :mod:`envs.logic.env`: a bounded backward proof search that writes the tactics of a
proof (:mod:`envs.logic.checker`'s language) for a goal of :mod:`envs.logic.formulas`.

The search is its own module because the checker never needs it: the checker judges the agent's
tactics, the search only proposes them (warm-start answers, and the generator's check that its
theorems have a short proof).
"""

from __future__ import annotations

from envs.logic.checker import contradiction_in
from envs.logic.formulas import FALSE, Formula, Goal, State, premise_conclusion, same


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

    Invertible steps first (``exact`` a matching hypothesis, a contradiction, ``intro``, ``cases``
    on a conjunction, ``specialize`` an implication whose premise is a hypothesis, ``constructor``);
    then the choices (``left``/ ``right``, ``apply`` a hypothesis whose conclusion is the target,
    ``exfalso`` and ``apply`` one concluding ``False``), at most ``depth`` choices deep; ``cases``
    on a disjunction last. At most ``nodes`` goals in all, so the search is bounded on any input.
    Iterative deepening over ``depth`` returns a proof with the fewest nested choices (an
    ``exfalso`` detour is never preferred to a proof without one)."""
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
    # a disjunction among the hypotheses is split last: invertible, but it doubles the rest of the
    # proof, and the choices above often prove the target without it
    for n, f in goal.hyps:
        if f[0] == "or":
            a, b = _fresh_names(Goal(goal.without(n), target), 2)
            kept = goal.without(n)
            first = _search(Goal((*kept, (a, f[1])), target), depth, budget)
            second = (
                None if first is None else _search(Goal((*kept, (b, f[2])), target), depth, budget)
            )
            return None if second is None else [f"cases {n} with {a} {b}", *first, *second]
    return None


def _choices(goal: Goal, depth: int, budget: _Budget) -> list[str] | None:
    """The non-invertible steps: ``left``/``right``, ``apply`` a hypothesis, ``exfalso`` +
    ``apply``."""
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
    """The premises ``apply`` leaves when a hypothesis of type ``f`` is applied to ``target`` (None:
    it does not conclude it; an empty list is ``exact``'s job)."""
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
