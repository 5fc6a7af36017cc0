"""PropProof (not Lean): the formula syntax, the checker (proofs written by hand are accepted; each
class of wrong step is rejected with its message and leaves the state unchanged), the goal view,
RAGEN's Lean-shaped rewards, the step limit, the generator (provable, a depth knob, disjoint splits,
seeded) and the proof-search expert."""

from __future__ import annotations

import re

import gymnasium as gym
import numpy as np
import pytest

import envs  # noqa: F401  (registers the ids)
from envs.logic.checker import ProofError, apply_tactic
from envs.logic.env import PropProofEnv
from envs.logic.formulas import (
    FormulaSyntaxError,
    initial_state,
    parse_formula,
    show,
    state_text,
)
from envs.logic.prover import prove_state
from envs.logic.theorems import draw_theorem, generate_theorem, split_of


@pytest.fixture()
def env() -> PropProofEnv:
    return gym.make("ragen/PropProof-v0").unwrapped


def run(env: PropProofEnv, theorem: str, tactics: list[str]) -> list[tuple]:
    env.reset(seed=0, options={"theorem": theorem})
    out = []
    for tactic in tactics:
        obs, reward, terminated, truncated, info = env.step(tactic)
        out.append((obs, round(reward, 6), terminated, truncated, info))
    return out


def test_formulas_print_with_leans_precedence_and_parse_back():
    f = parse_formula("(p -> q) -> ~(p /\\ q) \\/ r -> r")
    assert f == (
        "imp",
        ("imp", ("atom", "p"), ("atom", "q")),
        (
            "imp",
            ("or", ("not", ("and", ("atom", "p"), ("atom", "q"))), ("atom", "r")),
            ("atom", "r"),
        ),
    )
    assert show(f) == "(p -> q) -> ~(p /\\ q) \\/ r -> r"
    # -> /\ \/ associate to the right; /\ binds tighter than \/, which binds tighter than ->
    assert (
        show(parse_formula("(p -> q) -> r")) == "(p -> q) -> r"
        and show(parse_formula("p -> (q -> r)")) == "p -> q -> r"
    )
    assert (
        show(parse_formula("(p \\/ q) /\\ r")) == "(p \\/ q) /\\ r"
        and show(parse_formula("p \\/ (q /\\ r)")) == "p \\/ q /\\ r"
    )
    assert show(parse_formula("~~p /\\ False")) == "~~p /\\ False"
    # Lean's unicode connectives
    assert parse_formula("p → q ∧ ¬r") == parse_formula("p -> q /\\ ~r")
    for bad, message in [
        ("p ->", "ends too early"),
        ("(p", "missing ')'"),
        ("p q", "unexpected 'q'"),
        ("p + q", "unexpected character '+'"),
        ("", "empty"),
        ("exact", "cannot be a proposition"),
        ("(" * 60 + "p" + ")" * 60, "nested too deeply"),
        ("p" * 401, "longer than 400"),
    ]:
        with pytest.raises(FormulaSyntaxError, match=re.escape(message)):
            parse_formula(bad)


def test_long_formulas_cost_no_deep_recursion():
    # the longest formulas allowed (400 characters) parse, print and are searched without a
    # RecursionError
    chain = parse_formula(" -> ".join(["p"] * 80))
    assert show(chain) == " -> ".join(["p"] * 80) and prove_state(initial_state(chain)) == [
        "intro h1 h2 " + " ".join(f"h{i}" for i in range(3, 80)),
        "exact h1",
    ]
    negs = parse_formula("~" * 399 + "p")
    assert show(negs) == "~" * 399 + "p"
    # not provable: the bounded search gives up (the full 400 characters take about 1 s at 200
    # nodes)
    assert prove_state(initial_state(parse_formula("~" * 99 + "p")), nodes=200) is None


@pytest.mark.parametrize(
    "theorem, tactics",
    [
        (
            "p /\\ q -> q /\\ p",
            ["intro h", "cases h with hp hq", "constructor", "exact hq", "exact hp"],
        ),
        ("p /\\ q -> q /\\ p", ["intro h", "exact And.intro h.2 h.1"]),
        (
            "p /\\ q -> q /\\ p",
            ["intro h; exact And.intro h.right h.left"],
        ),  # one step, two tactics
        ("(p -> q) -> (q -> r) -> p -> r", ["intro f g hp", "exact g (f hp)"]),
        ("(p -> q) -> (q -> r) -> p -> r", ["intro f g hp", "apply g", "apply f", "assumption"]),
        (
            "p \\/ q -> q \\/ p",
            ["intro h", "cases h with a b", "right", "exact a", "exact Or.inl b"],
        ),
        (
            "p \\/ q -> q \\/ p",
            ["intro h", "cases h with a b", "apply Or.inr", "exact a", "left", "exact b"],
        ),
        ("~p -> p -> q", ["intro np hp", "exact absurd hp np"]),
        ("~p -> p -> q", ["intro np hp", "contradiction"]),
        ("~p -> p -> q", ["intro np hp", "exfalso", "exact np hp"]),
        ("~p -> p -> q", ["intro np hp", "exact False.elim (np hp)"]),
        ("(p -> q) -> ~q -> ~p", ["intro f nq hp", "apply nq", "apply f", "exact hp"]),
        ("(p -> q) -> p -> q", ["intro f hp", "specialize f hp", "exact f"]),
        ("False -> p", ["intro h", "cases h"]),
        ("(p -> False) -> ~p", ["intro h", "exact h"]),  # ~p unfolds to p -> False
    ],
)
def test_proofs_written_by_hand_are_accepted(env, theorem, tactics):
    steps = run(env, theorem, tactics)
    assert [s[4]["action_is_valid"] for s in steps] == [True] * len(tactics)
    # -0.1 + 0.1 per step, +10 at the end
    assert [s[1] for s in steps] == [0.0] * (len(tactics) - 1) + [10.0]
    obs, _, terminated, truncated, info = steps[-1]
    assert terminated and not truncated and info["success"] and info["goals"] == 0
    assert obs == "no goals\nProof complete."


def test_goal_view_is_leans_in_ascii(env):
    obs, info = env.reset(seed=0, options={"theorem": "p /\\ q -> q /\\ p"})
    assert obs == "1 goal\n|- p /\\ q -> q /\\ p" and info["goals"] == 1
    ((obs, reward, terminated, truncated, info),) = [
        env.step("intro h; cases h with hp hq; constructor")
    ]
    assert obs == "2 goals\nhp : p\nhq : q\n|- q\n\nhp : p\nhq : q\n|- p"
    assert (reward, terminated, truncated, info["goals"], info["error"]) == (
        0.0,
        False,
        False,
        2,
        "",
    )
    state = initial_state(parse_formula("p"))
    assert (
        state_text(state * 6)
        == "6 goals\n" + "\n\n".join(["|- p"] * 4) + "\n\n... and 2 more goals"
    )
    assert state_text(()) == "no goals"


# Each class of wrong step on the state  f : p -> q, hp : p, hr : r /\ s  |- q \/ r  (after "intro f hp hr"):
# the message a compiler would give, reward -0.1 - 1, and the state unchanged.
WRONG = [
    ("simp", "unknown tactic 'simp'"),
    ("exact h", "unknown identifier 'h'"),  # wrong hypothesis name
    ("apply g", "unknown identifier 'g'"),
    ("cases h9 with a b", "unknown identifier 'h9'"),
    ("exact hp", "type mismatch\n  hp\nhas type\n  p\nbut is expected to have type\n  q \\/ r"),
    ("exact f hr", "type mismatch\n  hr\nhas type\n  r /\\ s\nbut is expected to have type\n  p"),
    ("exact hp f", "function expected: 'hp' has type p, it cannot be applied to 'f'"),
    ("exact hp.1", "invalid projection: 'hp' has type p, which is not a conjunction"),
    ("intro x", "intro failed: no premise left to introduce as 'x', the goal is q \\/ r"),
    ("intro", "'intro' needs a name for each premise it introduces: intro h"),
    ("constructor", "constructor failed: the goal q \\/ r is not a conjunction"),
    (
        "cases f with a b",
        "cases failed: 'f' has type p -> q, which is not a conjunction, a disjunction or False",
    ),
    ("cases hr with a", "cases on 'hr : r /\\ s' needs two names: cases hr with a b"),
    ("cases hr with hp b", "the name 'hp' is already used by a hypothesis; choose a fresh name"),
    ("cases hr a b", "expected 'with' after 'cases hr', got 'a'"),
    (
        "apply hr",
        "apply failed: could not unify the conclusion of 'hr'\n  r /\\ s\nwith the goal\n  q \\/ r",
    ),
    ("apply And.intro", "apply failed: 'And.intro' does not conclude the goal q \\/ r"),
    ("assumption", "assumption failed: no hypothesis has type q \\/ r"),
    (
        "contradiction",
        "contradiction failed: no hypothesis is False and no two hypotheses are A and ~A",
    ),
    ("exact And.intro hp hp", "'And.intro' builds a conjunction, but the expected type is q \\/ r"),
    ("exact Or.inl", "'Or.inl' expects 1 argument, got 0"),
    ("exact Or.inr hp", "type mismatch\n  hp\nhas type\n  p\nbut is expected to have type\n  r"),
    (
        "specialize f hr",
        "type mismatch\n  hr\nhas type\n  r /\\ s\nbut is expected to have type\n  p",
    ),
    ("specialize hp", "specialize expects a hypothesis applied to arguments: specialize h a"),
    ("left x", "'left' takes no arguments, got 'x'"),
    ("exact (f hp", "expected ')' in term"),
    ("exact f + hp", "unexpected token '+' in term"),
    ("exact hp.foo", "unknown identifier 'hp.foo'"),
    # a block is all or nothing
    ("exact Or.inl (f hp); simp", "in tactic 2 of 2 ('simp'): unknown tactic 'simp'"),
    # goal not closed at the end
    ("done", "unsolved goals\n1 goal\nf : p -> q\nhp : p\nhr : r /\\ s\n|- q \\/ r"),
    ("", "expected a tactic"),
    ("x" * 600, "tactic longer than 512 characters"),
]


@pytest.mark.parametrize("tactic, message", WRONG, ids=[w[0][:20] or "empty" for w in WRONG])
def test_each_wrong_step_is_rejected_with_its_message(env, tactic, message):
    steps = run(env, "(p -> q) -> p -> r /\\ s -> q \\/ r", ["intro f hp hr", tactic])
    before = "1 goal\nf : p -> q\nhp : p\nhr : r /\\ s\n|- q \\/ r"
    assert steps[0][0] == before
    obs, reward, terminated, truncated, info = steps[1]
    assert info["error"] == message and obs == f"error: {message}\n{before}"
    assert (
        reward,
        terminated,
        truncated,
        info["action_is_valid"],
        info["action_is_effective"],
    ) == (-1.1, False, False, False, False)
    # the state was left as it was: the proof still goes through
    assert env.step("exact Or.inl (f hp)")[4]["success"]


def test_non_text_actions_and_shadowing_are_errors():
    state = initial_state(parse_formula("p -> p -> p"))
    with pytest.raises(ProofError, match="^a tactic must be text$"):
        apply_tactic(state, None)  # type: ignore[arg-type]
    with pytest.raises(ProofError, match="^the name 'h' is already used"):
        apply_tactic(state, "intro h h")
    with pytest.raises(ProofError, match="^invalid hypothesis name 'exact'$"):
        apply_tactic(state, "intro exact")
    with pytest.raises(ProofError, match="^no goals to be proved$"):
        apply_tactic((), "exfalso")
    assert apply_tactic((), "done") == ()


def test_step_limit_rewards_and_after_the_end(env):
    env.max_steps = 3
    steps = run(env, "p -> q -> p", ["intro a", "exfalso", "exact a"])
    # accepted: -0.1 + 0.1; exfalso changes the target (effective); the third step is rejected
    # (-1.1) and is the last one allowed: -2 more, truncated, with the unsolved goals error
    assert [s[1] for s in steps] == [0.0, 0.0, -3.1]
    assert [s[4]["action_is_effective"] for s in steps] == [True, True, False]
    obs, _, terminated, truncated, info = steps[-1]
    assert (terminated, truncated, info["success"]) == (False, True, False)
    assert obs.endswith("|- False\nerror: unsolved goals (step limit 3 reached)")
    assert env.step("intro b") == (
        obs,
        0.0,
        False,
        True,
        {
            "success": False,
            "action_is_valid": False,
            "action_is_effective": False,
            "goals": 1,
            "error": "episode ended",
        },
    )
    # exfalso on the target False is accepted but changes nothing
    env.reset(seed=0, options={"theorem": "False -> False"})
    env.step("intro h")
    assert env.step("exfalso")[4] == {
        "success": False,
        "action_is_valid": True,
        "action_is_effective": False,
        "goals": 1,
        "error": "",
    }


def test_reward_settings_reproduce_ragens_lean_values():
    # RAGEN: -0.1 per step, +1 accepted, -1 rejected, +10 success
    env = PropProofEnv(valid_step_reward=1.0)
    env.reset(seed=0, options={"theorem": "p -> p"})
    assert env.step("simp")[1] == pytest.approx(-1.1)
    assert env.step("intro h")[1] == pytest.approx(0.9)
    assert env.step("exact h")[1] == pytest.approx(10.9)


def test_bad_settings_and_options_name_the_culprit():
    with pytest.raises(
        ValueError, match=r"^PropProofEnv: depth must be an integer in \[0, 12\], got 13"
    ):
        PropProofEnv(depth=13)
    with pytest.raises(
        ValueError, match=r"^split must be one of \['test', 'train', 'val'\], got 'dev'$"
    ):
        PropProofEnv(split="dev")
    with pytest.raises(ValueError, match=r"options\['theorem'\]: unexpected character '\+'"):
        PropProofEnv().reset(seed=0, options={"theorem": "p + q"})
    with pytest.raises(ValueError, match="unknown options"):
        PropProofEnv().reset(seed=0, options={"index": 1})


def test_generated_theorems_are_provable_raw_and_grow_with_depth():
    # generate_theorem alone (no filter): the proof search proves every one, and its proof replays
    # in the checker
    lengths = {}
    for depth in (1, 5):
        plans = []
        for seed in range(150):
            theorem = generate_theorem(np.random.default_rng(seed), depth=depth)
            plan = prove_state(initial_state(theorem))
            assert plan is not None, show(theorem)
            state = initial_state(theorem)
            for tactic in plan:
                state = apply_tactic(state, tactic)
            assert state == ()
            plans.append(len(plan))
        lengths[depth] = float(np.mean(plans))
    assert lengths[1] < 4.0 < lengths[5]  # the depth knob makes proofs longer


def test_splits_are_disjoint_and_seeded():
    draws = {
        split: {show(draw_theorem(np.random.default_rng(s), split=split)) for s in range(60)}
        for split in ("train", "val", "test")
    }
    assert all(split_of(parse_formula(t)) == split for split, ts in draws.items() for t in ts)
    assert (
        not (draws["train"] & draws["val"])
        and not (draws["train"] & draws["test"])
        and not (draws["val"] & draws["test"])
    )
    a, b = PropProofEnv(split="val"), PropProofEnv(split="val")
    assert a.reset(seed=5)[0] == b.reset(seed=5)[0] != a.reset(seed=6)[0]


@pytest.mark.parametrize("depth", [1, 3, 5])
def test_the_expert_proves_generated_theorems(depth):
    env = PropProofEnv(depth=depth, max_steps=60)
    solved = 0
    for seed in range(40):
        env.reset(seed=seed)
        for _ in range(60):
            think, actions = env.expert_turn(2)
            assert think.startswith("the goal is ") and 1 <= len(actions) <= 2
            for action in actions:
                _, _, terminated, truncated, info = env.step(action)
                assert info["action_is_valid"], (action, info["error"])
                if terminated or truncated:
                    break
            if terminated or truncated:
                break
        solved += info["success"]
    assert solved == 40


def test_expert_turn_without_a_proof_is_a_clear_error():
    env = PropProofEnv()
    env.reset(seed=0, options={"theorem": "p \\/ ~p"})  # not provable intuitionistically
    with pytest.raises(ValueError, match=r"finds no proof of the current goals of p \\/ ~p"):
        env.expert_turn(1)
