"""The StarPO-S SimpleSokoban configs train on RAGEN's rewards plus a shaping term read from the grid:
no training reward may read the solver. With the solver made to fail after every reset, random play
under each config's env settings still steps and scores (the level generator may search at reset:
that builds the level, it scores nothing)."""

from __future__ import annotations

from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import yaml

import envs  # noqa: F401  (registers the ragen/* ids)
from envs.grid.sokoban import env as sokoban_env
from envs.grid.sokoban import generate as gen

CONFIGS = Path(__file__).resolve().parents[3] / "configs"
NO_SOLVER = ["sokoban_starpo_s_branching"]


def _forbidden(*args, **kwargs):
    raise AssertionError("a training reward read the solver")


@pytest.mark.parametrize("config", NO_SOLVER)
def test_no_training_reward_reads_the_solver(config, monkeypatch):
    data = yaml.safe_load((CONFIGS / f"{config}.yaml").read_text())["data"]
    env = gym.make(data["env"]["id"], **(data["env"].get("kwargs") or {}))
    shaped = env.unwrapped.heuristic_reward > 0  # the config's shaping is on, and exercised here
    rng = np.random.default_rng(0)
    rewards = []
    for seed in range(8):
        env.reset(seed=seed)
        with monkeypatch.context() as m:
            m.setattr(gen, "solve", _forbidden)
            m.setattr(sokoban_env.SokobanEnv, "solve", _forbidden)
            for _ in range(10):
                _, reward, terminated, truncated, _ = env.step(int(rng.integers(4)))
                rewards.append(reward)
                if terminated or truncated:
                    break
    # RAGEN's rewards alone are -0.1 a step (+-1 a box on/off a target, +10 solved); shaping adds
    # other values
    assert shaped and any(abs(r + 0.1) > 1e-9 and abs(r - 0.9) > 1e-9 for r in rewards)
