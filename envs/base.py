"""Shared pieces of the text environments: the prompt data an env hands to the prompt builder, and
the observation space helper.

Every env in this package is a plain :class:`gymnasium.Env` whose observations are strings. Turning
model text into actions is NOT the env's job (it lives in the trainer's prompting code); an env only
publishes the words it understands (``action_names``) and the instruction/legend text a prompt needs
(:meth:`TextEnv.prompt_spec`).

An env also owns what a trainer may want to know about solving it, in plain types (this package
never imports a trainer): the optional expert policy ``expert_turn`` and the warm-start hint
``warm_start_steps`` (see
:class:`TextEnv`). :func:`relation` and :func:`going` are reasoning-sentence helpers several experts
share; :func:`bounded_int` checks every integer keyword; :func:`read_rows` and :func:`check_file`
read data files.
"""

from __future__ import annotations

import json
import operator
import os
import string
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

# The reset option of envs with ``transition_seeded = True`` (see :class:`TextEnv`).
TRANSITION_SEED = "transition_seed"

# Printable ASCII (letters, digits, punctuation, space, \t \n \r \x0b \x0c); envs add their own
# non-ASCII symbols.
PRINTABLE = string.printable


def text_space(extra_chars: str = "", max_length: int = 8192) -> spaces.Text:
    """A ``spaces.Text`` over printable ASCII plus ``extra_chars``.

    gymnasium's default ``Text`` charset is alphanumeric only, so a board with spaces, newlines or
    ``#`` would not be "in" the space and ``check_env`` would fail; every env declares the full set
    of characters it renders.
    """
    charset = "".join(dict.fromkeys(PRINTABLE + extra_chars))  # ordered, unique
    return spaces.Text(min_length=0, max_length=max_length, charset=charset)


def bounded_int(owner: str, name: str, value: Any, lo: int, hi: int | None = None) -> int:
    """``value`` as an int in ``[lo, hi]`` (``hi=None``: no upper bound), else a ValueError.

    The one check of every integer keyword, reset option and limit in this package. An integral
    finite float (``3.0``) counts, a bool does not; the error names ``owner`` (the env or class)
    and ``name``: ``"SokobanEnv: search_depth must be an integer in [1, 1000], got 5000"``.
    """
    if isinstance(value, (float, np.floating)) and np.isfinite(value) and float(value).is_integer():
        value = int(value)
    integer = isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))
    if not integer or value < lo or (hi is not None and value > hi):
        bound = f">= {lo}" if hi is None else f"in [{lo}, {hi}]"
        raise ValueError(f"{owner}: {name} must be an integer {bound}, got {value!r}")
    return int(value)


def as_action(action: Any, n: int) -> int | None:
    """``action`` as an index in ``[0, n)``; None for anything else (bools, floats, strings, arrays,
    out of range).

    Discrete envs use it so a bad action gives their documented invalid-action result instead of an
    exception.
    """
    if isinstance(action, (bool, np.bool_)):
        return None
    try:
        a = operator.index(action)
    except TypeError:
        return None
    return a if 0 <= a < n else None


def read_rows(path: str) -> list[tuple[Any, str]]:
    """``(row, where)`` pairs of a ``.jsonl`` or ``.parquet`` file; ``where`` names file and line
    (row)."""
    rows: list[tuple[Any, str]] = []
    if path.endswith(".jsonl"):
        with open(path, encoding="utf-8") as f:
            for lineno, line in enumerate(f, start=1):
                if line.strip():
                    try:
                        rows.append((json.loads(line), f"{path}:{lineno}"))
                    except json.JSONDecodeError as exc:
                        raise ValueError(f"{path}:{lineno}: invalid JSON ({exc.msg})") from None
    elif path.endswith(".parquet"):
        import pyarrow.parquet as pq

        try:
            table = pq.read_table(path).to_pylist()
        except Exception as exc:  # noqa: BLE001 - pyarrow raises several types for unreadable files
            raise ValueError(f"{path}: not a readable parquet file ({exc})") from None
        rows = [(row, f"{path}: row {i}") for i, row in enumerate(table)]
    else:
        raise ValueError(f"expected a .jsonl or .parquet file, got {path!r}")
    return rows


def check_file(path: str | os.PathLike, what: str) -> str:
    """``path`` as a string after checking it names an existing ``.jsonl``/``.parquet`` file."""
    path = os.fspath(path)
    if not path.endswith((".jsonl", ".parquet")):
        raise ValueError(f"{what} must end in .jsonl or .parquet, got {path!r}")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"no such {what}: {path}")
    return path


def relation(a: tuple[int, int], b: tuple[int, int]) -> str:
    """Where cell ``a`` lies relative to cell ``b``: ``"above and left of"``, ``"below"``, ``"right
    of"``, ``"at"``."""
    vertical = "above" if a[0] < b[0] else "below" if a[0] > b[0] else ""
    horizontal = "left of" if a[1] < b[1] else "right of" if a[1] > b[1] else ""
    if vertical and horizontal:
        return f"{vertical} and {horizontal}"
    return vertical or horizontal or "at"


def going(actions: Sequence[str]) -> str:
    """``"I go Up, Left"``: the tail of an expert's reasoning sentence."""
    return "I go " + ", ".join(actions)


@dataclass(frozen=True)
class ToolSpec:
    """One env action offered as a function in the chat template's tool list
    (``--data.episode.action_format tool_call``): a call ``{"name": name, "arguments": {argument:
    value}}`` becomes the action string ``action.format(value)`` (e.g. ``search`` + ``{"query":
    "x"}`` -> ``search[x]``).

    Attributes:
        name: the function name.
        description: what calling it does (shown to the model).
        argument: the name of its one string argument.
        argument_description: what the argument holds (shown to the model).
        action: the env action string with ``{}`` where the argument's value goes.
    """

    name: str
    description: str
    argument: str
    argument_description: str
    action: str

    def schema(self) -> dict[str, Any]:
        """The function as a chat template's ``tools`` entry (the OpenAI / transformers function
        format)."""
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": {
                    "type": "object",
                    "required": [self.argument],
                    "properties": {
                        self.argument: {"type": "string", "description": self.argument_description}
                    },
                },
            },
        }


@dataclass(frozen=True)
class PromptSpec:
    """What a prompt needs to know about an env, as plain data.

    Attributes:
        instruction: the task description placed in the system prompt (RAGEN's ``env_instruction``).
        action_names: the action words, in action-index order, for discrete envs; empty for
        free-text envs
            (the answer string itself is the action).
        symbols: the legend of the rendered state, ``(symbol, meaning)`` pairs in display order;
        empty when the
            observation needs no legend.
        tools: the env's actions as functions, for the tool-call action format; empty when the env
        offers none. tool_instruction: the task description when the actions are tool calls (None:
        ``instruction``).
    """

    instruction: str
    action_names: tuple[str, ...] = ()
    symbols: tuple[tuple[str, str], ...] = field(default=())
    tools: tuple[ToolSpec, ...] = ()
    tool_instruction: str | None = None


class TextEnv(gym.Env[str, Any]):
    """Base class: string observations, ``render_mode="ansi"`` returns the current observation text.

    Subclasses set ``action_names`` (class or instance attribute) and implement :meth:`prompt_spec`
    and
    :meth:`_render_text`.

    Optional, for a supervised warm start before RL (``--model.warm_start``; the trainer reaches
    them duck-typed through ``env.unwrapped``, so any gymnasium env may define them):

    * ``expert_turn(self, max_actions: int) -> tuple[str, tuple[str, ...]]``: the expert's answer
      for the current state: a short, deterministic reasoning sentence that says something true
      about the state (it is placed between ``<think>`` and ``</think>``; keep it short, a small
      model imitates it) and one to ``max_actions`` action words (``action_names`` spelling) or
      answer strings (free-text envs). Not defined here: an env without it has no expert, and a warm
      start on it fails at configuration time naming the class.
    * ``warm_start_steps``: optimizer steps of a warm start that names none (default 150; raise it
      for an env whose answer format a small model learns slowly).

    Initial state per group, transitions per instance: a trainer resets every member of a group with
    the same seed (same initial state). An env with random transitions (Bandit's reward draw,
    FrozenLake's slips) sets the class attribute ``transition_seeded = True`` and accepts the reset
    option ``options={"transition_seed": int}``: its transitions then draw from a stream seeded by
    that int (:meth:`_seed_transitions`), so members given different transition seeds see
    independent draws (RAGEN's behaviour: each instance has its own random stream) while sharing the
    initial state. Without the option, or when constructed with ``shared_transitions=True`` (the
    option is then ignored), transitions continue ``np_random`` after the reset draws, so every env
    reset with the same seed draws the same transitions. The same seed and transition seed always
    give the same episode.
    """

    metadata = {"render_modes": ["ansi"], "render_fps": 4}
    action_names: tuple[str, ...] = ()
    warm_start_steps: int = 150
    # True: reset accepts options={"transition_seed": int} (see above)
    transition_seeded: bool = False
    # True: copy.deepcopy gives an independent env in the same state (--data.branching.branches)
    branchable: bool = False
    # envs with transition_seeded take it as a constructor keyword (default False)
    shared_transitions: bool = True

    def __init__(self, render_mode: str | None = None):
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ValueError(
                f"render_mode must be one of {self.metadata['render_modes']} or None, got {render_mode!r}"
            )
        self.render_mode = render_mode

    def _reset_options(
        self, options: dict[str, Any] | None, allowed: tuple[str, ...]
    ) -> dict[str, Any]:
        """``options`` as a dict, with a clear error naming any key this env does not understand."""
        options = dict(options or {})
        unknown = set(options) - set(allowed)
        if unknown:
            names = ", ".join(repr(a) for a in allowed)
            raise ValueError(
                f"{type(self).__name__}.reset: unknown options {sorted(unknown)}; allowed: {names}"
            )
        return options

    @property
    def transition_rng(self) -> np.random.Generator:
        """The stream of transition randomness: the one :meth:`_seed_transitions` chose at reset,
        else ``np_random``."""
        rng = getattr(self, "_transition_rng", None)
        return self.np_random if rng is None else rng

    def _seed_transitions(self, options: dict[str, Any]) -> None:
        """Choose :attr:`transition_rng` after ``super().reset(seed=...)``: a fresh generator seeded
        by ``options["transition_seed"]``, or ``np_random`` itself when the option is absent or
        ``shared_transitions`` is set (the group-shared behaviour)."""
        seed = options.get(TRANSITION_SEED)
        self._transition_rng = None
        if seed is None or self.shared_transitions:
            return
        seed = bounded_int(f"{type(self).__name__}.reset", "transition_seed", seed, 0)
        self._transition_rng = np.random.Generator(np.random.PCG64(seed))

    def prompt_spec(self) -> PromptSpec:  # pragma: no cover - every env overrides it
        raise NotImplementedError

    def _render_text(self) -> str:  # pragma: no cover - every env overrides it
        raise NotImplementedError

    def render(self) -> str | None:
        if self.render_mode == "ansi":
            return self._render_text()
        return None
