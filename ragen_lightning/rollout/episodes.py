"""The state of the episodes a :class:`~ragen_lightning.rollout.runner.RolloutRunner` runs: per turn
and per episode records, the checked env step, and marks to cut a conversation back to (an env error
drops its turn)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym
import numpy as np

from ragen_lightning.types import Conversation, Trajectory


@dataclass
class Turn:
    # the message that opens this turn: the full user message (reward feedback of the previous turn
    # + turn block) or, in the tool-call format after a turn whose calls ran, the tool results (a
    # tuple, one per executed call)
    user: str | tuple[str, ...]
    state: str
    # full mode: the conversation's extent before this turn (to drop it on an env error)
    mark: tuple | None = None
    sampled: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    response: str = ""
    reward: float = 0.0
    penalty: float = 0.0
    # filled while the turn's actions run; added to the trajectory when the turn closes without an
    # env error
    plan: list[Any] = field(default_factory=list)  # the valid actions to execute, in order
    names: tuple[str, ...] = ()
    format_ok: bool = False
    executed: list[str] = field(default_factory=list)
    # the env's observation after each executed action
    observations: list[str] = field(default_factory=list)
    # the turn's last step's info: the turn's info (RAGEN)
    step_info: dict[str, float] = field(default_factory=dict)
    success: bool | None = None  # the last step's info["success"] (None: no step ran)
    terminated: bool = False
    truncated: bool = False


@dataclass
class Episode:
    traj: Trajectory
    env: gym.Env
    system: str
    obs: str
    turns: list[Turn] = field(default_factory=list)
    conv: Conversation | None = None  # full mode: the running conversation
    actions_left: int = 0
    warn_invalid: bool = False
    info_sums: dict[str, float] = field(default_factory=dict)
    done: bool = False
    slot: int = 0  # the runner's env slot (a timed-out env is replaced there)


def checked_step(env: gym.Env, action: Any) -> tuple[str, float, bool, bool, dict[str, Any]]:
    """``env.step(action)`` checked and converted on the worker, so a malformed result is that
    episode's error."""
    result = env.step(action)
    if not isinstance(result, tuple) or len(result) != 5:
        raise TypeError(
            f"step must return (obs, reward, terminated, truncated, info), got {type(result).__name__} "
            f"of length {len(result) if isinstance(result, tuple) else '?'}"
        )
    obs, reward, terminated, truncated, info = result
    if not isinstance(info, dict):
        raise TypeError(f"step's info must be a dict, got {type(info).__name__}")
    reward = float(reward)
    if not np.isfinite(reward):
        raise ValueError(f"step returned a non-finite reward {reward!r}")
    return str(obs), reward, bool(terminated), bool(truncated), info


def conversation_mark(conv: Conversation | None) -> tuple | None:
    """The extent of a conversation, to cut it back to later (None: no conversation yet)."""
    if conv is None:
        return None
    return len(conv.input_ids), len(conv.messages), len(conv.turn_spans), conv.ended_with_eos


def cut_back(conv: Conversation | None, mark: tuple | None) -> Conversation | None:
    """``conv`` cut back to ``mark`` (in place), or None when the mark predates the conversation."""
    if conv is None or mark is None:
        return None
    n, messages, spans, ended_with_eos = mark
    del conv.input_ids[n:], conv.loss_mask[n:], conv.sampled_logprobs[n:]
    del conv.messages[messages:], conv.turn_spans[spans:]
    conv.ended_with_eos = ended_with_eos
    return conv
