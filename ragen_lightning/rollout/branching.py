"""Branching rollouts (``RolloutRunner``, module docstring "Branching"): an answer played on a copy
of the env, and the answer a branching episode continues with (``branch_follow``)."""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Sequence
from typing import Any, Literal

import gymnasium as gym

BranchFollow = Literal["first", "best"]
BRANCH_FOLLOW = ("first", "best")


def play_on_copy(env: gym.Env, plan: Sequence[Any], step: Callable[[gym.Env, Any], tuple]) -> float:
    """The summed reward of ``plan`` played on a deep copy of ``env`` (up to the copy's end);
    ``env`` is untouched. A deep copy carries the env's random state, so the same plan on ``env``
    itself then repeats the copy's outcome. Raises whatever the copy's ``step`` raises."""
    twin, reward = copy.deepcopy(env), 0.0
    try:
        for action in plan:
            _obs, r, terminated, truncated, _info = step(twin, action)
            reward += r
            if terminated or truncated:
                break
    finally:
        twin.close()
    return reward


def followed(scores: Sequence[float | None], follow: BranchFollow) -> int:
    """The index of the answer a branching episode continues with: 0 (the unbranched rollout's) for
    ``first``; for ``best`` the best score, the first on ties (None: that answer's copy failed; all
    None: 0)."""
    if follow == "first":
        return 0
    ranked = [-math.inf if s is None else s for s in scores]
    return ranked.index(max(ranked))
