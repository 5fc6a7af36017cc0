"""2048 (RAGEN's ``game_2048`` env): slide and merge tiles on a square grid.

Departures from RAGEN:

- The invalid-move penalty survives the log reward. RAGEN computes ``0.1 * log2(raw + 1)`` for ``raw
  > 0`` and 0.0 otherwise, so the -0.1 for a move that changes nothing is erased whenever
  ``use_log_reward`` is on (the default). Here an invalid move always earns ``invalid_act_score``.
- ``success`` reflects ``max_tile >= goal_tile`` on every step (RAGEN only sets it on the
  terminating step, so a run cut by the action budget never counts as a success).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from gymnasium import spaces

from envs.base import PromptSpec, TextEnv, as_action, bounded_int, text_space

ACTION_NAMES = ("Up", "Right", "Down", "Left")
_EXPERT_ORDER = ("Up", "Down", "Left", "Right")  # the expert's tie order


def merge_line(line: list[int]) -> tuple[list[int], int]:
    """Slide one line towards index 0 and merge equal neighbours once each.

    Returns the new line and the sum of the merged tiles (the score gained): ``[2, 2, 2, 2] -> [4,
    4, 0, 0], 8``.
    """
    values = [v for v in line if v]
    out: list[int] = []
    gained = 0
    i = 0
    while i < len(values):
        if i + 1 < len(values) and values[i] == values[i + 1]:
            out.append(2 * values[i])
            gained += 2 * values[i]
            i += 2
        else:
            out.append(values[i])
            i += 1
    return out + [0] * (len(line) - len(out)), gained


def slide(grid: np.ndarray, action: int) -> tuple[np.ndarray, int, bool]:
    """``(new_grid, score_gained, moved)`` for action 0 Up, 1 Right, 2 Down, 3 Left; ``grid`` is not
    modified."""
    # Rotate so the move becomes "Left", merge every row, rotate back.
    turns = {0: 1, 1: 2, 2: 3, 3: 0}[action]
    rotated = np.rot90(grid, turns)
    merged = np.zeros_like(rotated)
    gained = 0
    for r in range(rotated.shape[0]):
        row, g = merge_line([int(v) for v in rotated[r]])
        merged[r] = row
        gained += g
    new = np.rot90(merged, -turns).copy()
    return new, gained, not np.array_equal(new, grid)


class Game2048Env(TextEnv):
    """2048 on a ``size`` x ``size`` grid.

    ## Description Reset places two tiles on an empty grid (uniform empty cell; 2 with probability
    ``two_prob``, else 4). Each move slides all tiles in one direction; two equal tiles that meet
    merge into their sum (each tile merges at most once per move). After a move that changed the
    grid a new tile spawns.

    ## Action Space
    ``Discrete(4)``: 0 Up, 1 Right, 2 Down, 3 Left (``action_names``).

    ## Observation Space
    ``Text`` over printable ASCII::

        Current 2048 Grid:
        Row 1: [2, 0, 0, 0]
        ...
        <blank line>
        Valid Actions: 0(Up), 1(Right).      (or "None.")
        Goal: Merge same numbers to reach 2048.
        Current Score: 0
        What is your next move?

    ## Rewards ``raw`` = the sum of the tiles created by merges this move. With ``use_log_reward``
    (default) the reward is ``0.1 * log2(raw + 1)`` when ``raw > 0`` and 0.0 for a valid move
    without merges; otherwise it is ``raw``. A move that changes nothing (or an action that is not
    an int in 0..3) gives ``invalid_act_score`` (-0.1) in both modes, ``action_is_valid=False`` and
    no spawn.

    ## Episode End Terminated when no move can change the grid. Truncated after ``max_steps`` steps
    (valid or not) if set. Stepping after the end returns the last observation, reward 0.0, the same
    end flags and ``action_is_valid=False``.

    ## Info ``success`` (``max_tile >= goal_tile``), ``action_is_valid``, ``action_is_effective``
    (the grid changed), ``raw_reward`` (the step's raw score, or the penalty), ``score`` (sum of raw
    merge scores so far), ``max_tile``.

    ## Arguments
    - ``size`` (4), ``two_prob`` (0.9), ``use_log_reward`` (True), ``invalid_act_score`` (-0.1).
    - ``goal_tile`` (2048): a power of two >= 4. ``max_steps`` (None = unlimited).
    - ``render_mode``: ``None`` or ``"ansi"``.

    ## Options ``reset(options={"grid": g})`` starts from a given ``size`` x ``size`` grid (0 or
    powers of two >= 2).
    """

    branchable = True  # small in-process state: turns may branch (--data.branching.branches)

    action_names = ACTION_NAMES

    def __init__(
        self,
        size: int = 4,
        two_prob: float = 0.9,
        use_log_reward: bool = True,
        invalid_act_score: float = -0.1,
        goal_tile: int = 2048,
        max_steps: int | None = None,
        render_mode: str | None = None,
    ):
        super().__init__(render_mode=render_mode)
        # a 16x16 board already renders as ~1000 characters a turn
        size = bounded_int("Game2048Env", "size", size, 2, 16)
        if not 0.0 <= two_prob <= 1.0:
            raise ValueError(f"two_prob must be in [0, 1], got {two_prob}")
        goal_tile = bounded_int("Game2048Env", "goal_tile", goal_tile, 4)
        if goal_tile & (goal_tile - 1):
            raise ValueError(f"Game2048Env: goal_tile must be a power of two >= 4, got {goal_tile}")
        if max_steps is not None:
            max_steps = bounded_int("Game2048Env", "max_steps", max_steps, 1)
        self.size = size
        self.two_prob = float(two_prob)
        self.use_log_reward = bool(use_log_reward)
        self.invalid_act_score = float(invalid_act_score)
        if not np.isfinite(self.invalid_act_score):
            raise ValueError(
                f"invalid_act_score must be a finite number, got {invalid_act_score!r}"
            )
        self.goal_tile = goal_tile
        self.max_steps = max_steps

        self.action_space = spaces.Discrete(4)
        self.observation_space = text_space()
        self.grid: np.ndarray | None = None
        self.score = 0
        self.num_steps = 0
        self._terminated = False
        self._truncated = False
        self._obs = ""

    def prompt_spec(self) -> PromptSpec:
        instruction = (
            f"You are playing the 2048 game on a {self.size}x{self.size} grid. Merge equal tiles by sliding Up, "
            "Right, Down, or Left.\n"
            "If a move is invalid (no tiles move), a small penalty is applied. Respond with a single action.\n"
            "Example: <answer>Up</answer>\n"
        )
        return PromptSpec(instruction=instruction, action_names=self.action_names)

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str, dict]:
        super().reset(seed=seed)
        options = self._reset_options(options, ("grid",))
        if "grid" in options:
            grid = np.asarray(options["grid"])
            if grid.shape != (self.size, self.size) or not np.issubdtype(grid.dtype, np.integer):
                raise ValueError(
                    f"options['grid'] must be a {self.size}x{self.size} int grid, got shape {grid.shape}"
                )
            tiles = grid[grid != 0]
            if (tiles < 2).any() or (tiles & (tiles - 1)).any():
                raise ValueError("options['grid'] tiles must be 0 or powers of two >= 2")
            self.grid = grid.astype(np.int64)
        else:
            self.grid = np.zeros((self.size, self.size), dtype=np.int64)
            self._spawn()
            self._spawn()
        self.score = 0
        self.num_steps = 0
        self._terminated = not self.valid_actions()
        self._truncated = False
        self._obs = self._render_text()
        return self._obs, self._info(valid=True, effective=False, raw=0.0)

    def step(self, action: Any) -> tuple[str, float, bool, bool, dict]:
        if self.grid is None:
            raise RuntimeError("Game2048Env: call reset() before step()")
        if self._terminated or self._truncated:
            return (
                self._obs,
                0.0,
                self._terminated,
                self._truncated,
                self._info(valid=False, effective=False, raw=0.0),
            )
        self.num_steps += 1
        a = as_action(action, 4)
        moved = False
        if a is not None:
            new_grid, gained, moved = slide(self.grid, a)
        if not moved:
            raw = reward = self.invalid_act_score
        else:
            self.grid = new_grid
            self._spawn()
            self.score += gained
            raw = float(gained)
            if self.use_log_reward:
                reward = 0.1 * math.log2(raw + 1.0) if raw > 0 else 0.0
            else:
                reward = raw
            self._terminated = not self.valid_actions()
        self._truncated = (
            not self._terminated and self.max_steps is not None and self.num_steps >= self.max_steps
        )
        self._obs = self._render_text()
        return (
            self._obs,
            reward,
            self._terminated,
            self._truncated,
            self._info(valid=moved, effective=moved, raw=raw),
        )

    @property
    def board(self) -> np.ndarray | None:
        """The grid (alias of ``grid``, the name the other board envs use)."""
        return self.grid

    def valid_actions(self) -> list[int]:
        """Actions that would change the grid."""
        assert self.grid is not None
        return [a for a in range(4) if slide(self.grid, a)[2]]

    def _spawn(self) -> None:
        assert self.grid is not None
        empty = np.flatnonzero(self.grid == 0)
        if empty.size == 0:
            return
        cell = int(empty[self.np_random.integers(empty.size)])
        self.grid.flat[cell] = 2 if self.np_random.random() < self.two_prob else 4

    def _info(self, *, valid: bool, effective: bool, raw: float) -> dict[str, Any]:
        assert self.grid is not None
        max_tile = int(self.grid.max())
        return {
            "success": max_tile >= self.goal_tile,
            "action_is_valid": valid,
            "action_is_effective": effective,
            "raw_reward": float(raw),
            "score": int(self.score),
            "max_tile": max_tile,
        }

    def expert_turn(self, max_actions: int) -> tuple[str, tuple[str, ...]]:
        """The warm start's expert: a one-step greedy heuristic on ``board``: among the moves that
        change the board, the one maximising merge score + 2 x empty cells, keeping the largest tile
        in a corner as a tie-break; ties in the fixed order Up, Down, Left, Right. One action per
        turn (a tile spawns after each)."""
        board = np.asarray(self.board)
        names = tuple(self.action_names or ACTION_NAMES)
        best, best_key = None, None
        for name in _EXPERT_ORDER:
            if name not in names:
                continue
            after, score, moved = slide(board, ACTION_NAMES.index(name))
            if not moved:
                continue
            corner = max(after[0, 0], after[0, -1], after[-1, 0], after[-1, -1]) == after.max()
            key = (score + 2 * int((after == 0).sum()), corner)
            if best_key is None or key > best_key:
                best, best_key = name, key
        if best is None:
            return f"no move changes the board; I go {names[0]}", (names[0],)
        gain = best_key[0] - 2 * int((board == 0).sum())
        if gain > 0:
            return f"{best} merges the most tiles; I go {best}", (best,)
        return f"{best} keeps the board open; I go {best}", (best,)

    def _render_text(self) -> str:
        if self.grid is None:
            return ""
        lines = ["Current 2048 Grid:"]
        for i, row in enumerate(self.grid, start=1):
            lines.append(f"Row {i}: [{', '.join(str(int(v)) for v in row)}]")
        valid = self.valid_actions()
        actions = ", ".join(f"{a}({self.action_names[a]})" for a in valid) if valid else "None"
        lines += [
            "",
            f"Valid Actions: {actions}.",
            f"Goal: Merge same numbers to reach {self.goal_tile}.",
            f"Current Score: {self.score}",
            "What is your next move?",
        ]
        return "\n".join(lines)
