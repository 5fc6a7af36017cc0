"""Env keywords and reset options are bounded: absurd sizes and non-finite numbers get a one-line
ValueError naming the env and the keyword (instead of a reset running for minutes or an
OverflowError), and Sokoban refuses a step before reset."""

from __future__ import annotations

import math

import gymnasium as gym
import numpy as np
import pytest

import envs  # noqa: F401 - registers the ids
from envs.base import bounded_int
from envs.grid.sokoban.env import SokobanEnv
from envs.text.countdown import CountdownEnv


@pytest.mark.parametrize(
    ("env_id", "kwargs", "message"),
    [
        (
            "ragen/Sokoban-v0",
            {"dim_room": (200, 200)},
            r"SokobanEnv: dim_room\[0\] must be an integer in \[3, 30\]",
        ),
        (
            "ragen/Sokoban-v0",
            {"dim_room": (6, 31)},
            r"SokobanEnv: dim_room\[1\] must be an integer in \[3, 30\]",
        ),
        (
            "ragen/Sokoban-v0",
            {"search_budget": 10**12},
            r"SokobanEnv: search_budget .* in \[1, 1000000\]",
        ),
        (
            "ragen/Sokoban-v0",
            {"search_depth": 10**9},
            r"SokobanEnv: search_depth .* in \[1, 1000\]",
        ),
        (
            "ragen/RubiksCube-v0",
            {"scramble_depth": 10**9},
            r"RubiksCubeEnv: scramble_depth .* in \[1, 1000\]",
        ),
        (
            "ragen/FrozenLake-v0",
            {"size": 5000},
            r"FrozenLakeEnv: size must be an integer in \[2, 64\]",
        ),
        (
            "ragen/FrozenLake-v0",
            {"desc": ["S" + "F" * 99, "G" + "F" * 99]},
            "desc must have at most 64 rows and columns",
        ),
        ("ragen/2048-v0", {"size": 5000}, r"Game2048Env: size must be an integer in \[2, 16\]"),
        (
            "ragen/2048-v0",
            {"invalid_act_score": math.nan},
            "invalid_act_score must be a finite number",
        ),
        (
            "ragen/Sudoku-v0",
            {"search_budget": 10**12},
            r"SudokuEnv: search_budget .* in \[1, 2000000\]",
        ),
        (
            "ragen/Countdown-v0",
            {"max_target": math.inf},
            r"CountdownEnv: max_target .* in \[1, 1000000000\]",
        ),
        (
            "ragen/Countdown-v0",
            {"score": math.inf},
            "format_score and score must be finite numbers",
        ),
    ],
)
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


def test_bounded_int_names_the_owner_and_the_argument():
    assert bounded_int("X", "n", 3, 1, 5) == 3
    assert bounded_int("X", "n", 3.0, 1) == 3  # an integral float counts
    assert type(bounded_int("X", "n", np.int64(2), 1)) is int
    for bad in (True, 2.5, math.nan, math.inf, "3", None, 0, 6):
        with pytest.raises(ValueError, match=r"^X: n must be an integer in \[1, 5\], got "):
            bounded_int("X", "n", bad, 1, 5)
    with pytest.raises(ValueError, match=r"^X: n must be an integer >= 1, got -1$"):
        bounded_int("X", "n", -1, 1)


@pytest.mark.parametrize(
    ("env_id", "kwargs", "message"),
    [
        (
            "ragen/Sudoku-v0",
            {"max_steps": 0},
            "SudokuEnv: max_steps must be an integer >= 1, got 0",
        ),
        (
            "ragen/RubiksCube-v0",
            {"max_steps": 1.5},
            "RubiksCubeEnv: max_steps must be an integer >= 1",
        ),
        (
            "ragen/2048-v0",
            {"max_steps": True},
            "Game2048Env: max_steps must be an integer >= 1, got True",
        ),
        (
            "ragen/MetaMathQA-v0",
            {"max_attempts": 0},
            "MetaMathQAEnv: max_attempts must be an integer >= 1",
        ),
        (
            "ragen/PropProof-v0",
            {"depth": 13},
            r"PropProofEnv: depth must be an integer in \[0, 12\]",
        ),
        (
            "ragen/SearchQA-v0",
            {"max_search_results": 51},
            "SearchQAEnv: max_search_results must be",
        ),
        ("ragen/WebShop-v0", {"max_results": 0}, "WebShopEnv: max_results must be an integer in"),
        ("ragen/DeepCoder-v0", {"num_tests": 0}, "DeepCoderEnv: num_tests must be an integer >= 1"),
    ],
)
def test_every_env_bounds_its_integers_with_one_helper(env_id, kwargs, message):
    with pytest.raises(ValueError, match=message):
        gym.make(env_id, disable_env_checker=True, **kwargs)
