"""Env keywords and reset options are bounded: absurd sizes and non-finite numbers get a one-line ValueError naming
the keyword (instead of a reset running for minutes or an OverflowError), and Sokoban refuses a step before reset."""

from __future__ import annotations

import math

import gymnasium as gym
import pytest

import envs  # noqa: F401 - registers the ids
from envs.countdown import CountdownEnv
from envs.sokoban import SokobanEnv


@pytest.mark.parametrize(("env_id", "kwargs", "message"), [
    ("ragen/Sokoban-v0", {"dim_room": (200, 200)}, r"dim_room must be two integers in \[3, 30\]"),
    ("ragen/Sokoban-v0", {"dim_room": (31, 6)}, r"dim_room must be two integers in \[3, 30\]"),
    ("ragen/Sokoban-v0", {"search_budget": 10**12}, r"search_budget must be an integer in \[1, 1000000\]"),
    ("ragen/Sokoban-v0", {"search_depth": 10**9}, r"search_depth must be an integer in \[1, 1000\]"),
    ("ragen/RubiksCube-v0", {"scramble_depth": 10**9}, r"scramble_depth must be an integer in \[1, 1000\]"),
    ("ragen/FrozenLake-v0", {"size": 5000}, r"size must be an integer in \[2, 64\]"),
    ("ragen/FrozenLake-v0", {"desc": ["S" + "F" * 99, "G" + "F" * 99]}, "desc must have at most 64 rows and columns"),
    ("ragen/2048-v0", {"size": 5000}, r"size must be an integer in \[2, 16\]"),
    ("ragen/2048-v0", {"invalid_act_score": math.nan}, "invalid_act_score must be a finite number"),
    ("ragen/Sudoku-v0", {"search_budget": 10**12}, r"search_budget must be an integer in \[1, 2000000\]"),
    ("ragen/Countdown-v0", {"max_target": math.inf}, r"max_target must be an integer in \[1, 1000000000\]"),
    ("ragen/Countdown-v0", {"score": math.inf}, "format_score and score must be finite numbers"),
])
def test_absurd_keywords_are_refused_naming_the_keyword(env_id, kwargs, message):
    with pytest.raises(ValueError, match=message):
        gym.make(env_id, disable_env_checker=True, **kwargs)


def test_the_largest_allowed_sizes_still_work():
    assert SokobanEnv(dim_room=(30, 30), num_boxes=1).reset(seed=0)[0].count("\n") >= 29
    lake = gym.make("ragen/FrozenLake-v0", size=64, disable_env_checker=True).unwrapped
    lake.reset(seed=0)
    assert len(lake.desc) == 64


def test_countdown_options_must_be_finite_integers():
    env = CountdownEnv()
    with pytest.raises(ValueError, match=r"options\['target'\] must be an integer in"):
        env.reset(options={"target": math.inf, "nums": [1, 2]})
    with pytest.raises(ValueError, match=r"options\['nums'\] entries must be an integer in"):
        env.reset(options={"target": 3, "nums": [1, 2.5]})
    with pytest.raises(ValueError, match=r"options\['nums'\] must be a list of 1 to 6 integers"):
        env.reset(options={"target": 3, "nums": list(range(20))})
    assert env.reset(options={"target": 3.0, "nums": [1, 2]})[0] == "Target: 3, nums: [1, 2]"
    assert env.step("1 + 2")[1] == 1.0


def test_sokoban_refuses_a_step_before_reset():
    env = SokobanEnv()
    with pytest.raises(RuntimeError, match="step called before reset"):
        env.step(0)
    env.reset(seed=0)
    assert env.step(0)[4]["success"] is False
