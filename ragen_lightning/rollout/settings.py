"""The episode settings: how one multi-turn episode is shaped, declared once.

The rollout runner, the RL data module, the demonstration data module, the expert demonstrations and the warm start
all take the same :class:`EpisodeSettings` object (``--data.episode.*`` on the command line), so the demonstrations
the warm start trains on have exactly the format of the rollouts RL samples, and no copy of the keyword list can
drift (a test asserts the names are declared in this one signature).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Literal

from ragen_lightning.errors import ConfigError, Domain, check_domains

ContextWindow = Literal["full", "limited", "single_turn"]
CONTEXT_WINDOWS: tuple[str, ...] = ("full", "limited", "single_turn")
FLAG_PREFIX = "--data.episode."


@dataclass(frozen=True)
class EpisodeSettings:
    """Shape of one episode: turns, action budgets, response and context limits, answer format.

    Args:
        max_turns: assistant turns per episode at most.
        max_actions_per_turn: env actions executed per turn at most (extra parsed actions are ignored; the expert
            proposes this many).
        max_actions_per_episode: the episode's action budget, shown in the prompt (RAGEN's ``max_actions_per_traj``).
        max_new_tokens: sampled tokens per turn at most (RAGEN's ``response_length``; announced in the prompt).
        context_window: ``full`` (the whole conversation, one sample per episode), ``limited`` (system message and
            the last ``window_turns`` turns, one sample per turn) or ``single_turn`` (one user message summarising
            the last ``window_turns - 1`` turns, one sample per turn).
        window_turns: turns kept in the prompt in the ``limited`` / ``single_turn`` modes, the current one included.
        max_model_len: hard limit on prompt + response tokens; an episode whose next turn would not fit ends early.
        enable_think: ask for (and parse) ``<think>...</think>`` reasoning before the answer.
        observation_last: put each turn's instruction line (actions left, answer format, length) before
            ``State:`` instead of after it (RAGEN's order), so the observation directly precedes the response. The
            embedded 4-layer model learns to read a grid behind a ~240-token system prompt only this way
            (``benchmarks/grid_reading.py``: 0.79 exact after 500 steps with the state last, 0.29 with RAGEN's
            ~45-token instruction line between the grid and the answer; docs/learning.md).
        format_penalty: score added for every turn with an invalid or missing action.
        stop: stop strings of every turn (e.g. ``["</answer>"]``): a turn ends with the token that completes one, and
            those tokens stay in the response, token for token, as sampled. The expert demonstrations of a warm start
            do not use them (an expert answer ends with ``</answer>`` and the end-of-turn token either way).
        max_workers: env steps (and resets) of one turn run concurrently on this many worker threads; 1 runs them
            one after another in the rollout's own thread (no threads at all unless ``step_timeout_s`` is set),
            which is fastest for the in-process envs (microseconds per step); raise it for slow or remote envs.
        step_timeout_s: seconds one env reset or step may take (None = no limit); a step over it ends its episode
            with a recorded error and its worker thread is abandoned (a thread cannot be killed: a hung env keeps
            it until the env returns; it is a daemon thread, so it never blocks the run's exit).
    """

    max_turns: int = 5
    max_actions_per_turn: int = 2
    max_actions_per_episode: int = 10
    max_new_tokens: int = 100
    context_window: ContextWindow = "full"
    window_turns: int = 2
    max_model_len: int = 4096
    enable_think: bool = True
    observation_last: bool = False
    format_penalty: float = -0.1
    stop: tuple[str, ...] = ()
    max_workers: int = 1
    step_timeout_s: float | None = None

    def __post_init__(self) -> None:
        check_domains(FLAG_PREFIX, self, _DOMAINS)
        if isinstance(self.stop, str) or not all(isinstance(s, str) and s for s in self.stop):
            raise ConfigError(f"{FLAG_PREFIX}stop must be a list of non-empty strings, got {self.stop!r}")
        object.__setattr__(self, "stop", tuple(self.stop))  # a YAML list arrives as a list; keep it hashable
        if self.context_window not in CONTEXT_WINDOWS:
            raise ConfigError(f"{FLAG_PREFIX}context_window must be 'full', 'limited' or 'single_turn', "
                              f"got {self.context_window!r}")

    def demonstration_fields(self) -> dict[str, Any]:
        """The settings that shape expert demonstrations (every field but ``format_penalty``, which only moves
        the RL score, and the rollout layer's ``stop``, ``max_workers`` and ``step_timeout_s``, which the expert's
        answers and the env's transitions do not depend on); the warm start's cache key hashes exactly these."""
        fields = asdict(self)
        for name in ("format_penalty", "stop", "max_workers", "step_timeout_s"):
            fields.pop(name)
        if not fields["observation_last"]:  # RAGEN's order: the keys of warm starts built before the option
            fields.pop("observation_last")
        return fields


_COUNT = Domain(low=1, integer=True)
_DOMAINS = {"max_turns": _COUNT, "max_actions_per_turn": _COUNT, "max_actions_per_episode": _COUNT,
            "max_new_tokens": _COUNT, "window_turns": _COUNT, "max_model_len": _COUNT,
            "format_penalty": Domain(high=0), "max_workers": _COUNT,
            "step_timeout_s": Domain(low=0, low_open=True, none=True)}  # the penalty is added to the score


def as_episode(value: EpisodeSettings | dict[str, Any] | None) -> EpisodeSettings:
    """``value`` as :class:`EpisodeSettings` (None: the defaults; a mapping: its keys over the defaults)."""
    if value is None:
        return EpisodeSettings()
    if isinstance(value, EpisodeSettings):
        return value
    if hasattr(value, "as_dict"):  # a jsonargparse Namespace
        value = value.as_dict()
    return EpisodeSettings(**dict(value))
