"""benchmarks/policy_anatomy.py: episodes classified from their solver distances by hand, the
summary's counts and shares, and a replay on a real Sokoban level (the solver's own plan is all
optimal; a wall bump is not)."""

from __future__ import annotations

import pytest

from tests.conftest import load_script

bench = load_script("benchmarks/policy_anatomy.py", "policy_anatomy_bench")


def test_classify_by_hand():
    # 3 -> 2 (optimal) -> 2 (bump) -> 1 (optimal) -> 0 (optimal): solved, 3 of 4 optimal
    assert bench.classify([3, 2, 2, 1, 0], True) == {
        "start": 3,
        "actions": 4,
        "optimal": 3,
        "dead_at": None,
        "outcome": "solved",
        "left": 0,
    }
    # 2 -> 3 (away) -> None (dead after action index 1) -> None: dead, nothing optimal
    assert bench.classify([2, 3, None, None], False) == {
        "start": 2,
        "actions": 3,
        "optimal": 0,
        "dead_at": 1,
        "outcome": "dead",
        "left": None,
    }
    # budget ran out while still solvable
    got = bench.classify([4, 3, 4, 3], False)
    assert (got["outcome"], got["optimal"], got["left"]) == ("unsolved", 2, 3)
    with pytest.raises(ValueError, match="solvable at reset"):
        bench.classify([None, 1], False)


def test_summarize_by_hand():
    records = [
        bench.classify(d, s)
        for d, s in [
            ([3, 2, 2, 1, 0], True),
            ([2, 3, None, None], False),
            ([4, 3, 4, 3], False),
            ([2, 1, 0], True),
        ]
    ]
    got = bench.summarize(records)
    assert got["episodes"] == 4 and got["success"] == 0.5
    assert got["outcomes"] == {"solved": 2, "dead": 1, "unsolved": 1}
    assert got["optimal_action_share"] == pytest.approx((3 + 0 + 2 + 2) / (4 + 3 + 3 + 2))
    assert got["dead_at"] == {1: 1} and got["unsolved_left"] == {3: 1}
    assert got["success_by_start"] == {2: (2, 0.5), 3: (1, 1.0), 4: (1, 0.0)}


def test_replay_on_a_sokoban_level():
    import envs  # noqa: F401
    from ragen_lightning.rollout.runner import make_env

    env = make_env("ragen/SimpleSokoban-v0")
    try:
        env.reset(seed=7)
        core = env.unwrapped
        plan = [core.action_names[a] for a in core.solve()]
        distances = bench.replay(env, 7, plan)
        # every action of a shortest solution is optimal
        assert distances == list(range(len(plan), -1, -1))
        assert bench.classify(distances, True)["optimal"] == len(plan)
        with pytest.raises(ValueError, match="not one of the env's"):
            bench.replay(env, 7, ["Jump"])
    finally:
        env.close()
