"""Sudoku (RAGEN's ``sudoku`` env): place one number per step, free-text actions, feedback
rendering. The solver and the puzzle generator live in :mod:`envs.grid.sudoku.solver`.

Departures from RAGEN (each fixes a flaw of the original):

- Every puzzle has exactly ONE solution. RAGEN blanks a shuffled prefix of cells without checking.
  Here cells are blanked one at a time in a seeded random order, and a blank is kept only if the
  puzzle still has a unique solution (a search for a second solution that differs in that cell). If
  the requested number of blanks cannot be reached that way (a single pass over all cells found no
  more removable cell), the puzzle keeps the blanks it has: ``info["empty_cells"]`` reports the real
  count. For 9x9 the targets (32/40/48 blanks) are reached in practice.
- All randomness comes from ``self.np_random`` (RAGEN reseeds the global ``random``/``np.random``).
- A filled cell cannot be overwritten (initial or placed): RAGEN only protects initial cells, which
  lets an agent farm the +1.0/+0.5 placement rewards by rewriting the same cell forever.
- The ``place``/``at`` keyword test that decides the order of a bare triple matches whole words only
  (RAGEN's substring test reads ``"(2,3,5) that is it"`` as number-first because ``"that"`` contains
  ``"at"``).
"""

from __future__ import annotations

import math
import re
from typing import Any

import numpy as np

from envs.base import PromptSpec, TextEnv, bounded_int, text_space
from envs.grid.sudoku.solver import (
    PUZZLE_SEARCH_BUDGET,
    check_grid,
    generate_sudoku,
    search_solutions,
)

DIFFICULTY_BLANK_FRACTION = {"easy": 0.4, "medium": 0.5, "hard": 0.6}
RENDER_FORMATS = ("simple", "detailed", "with_feedback")
FEEDBACK_SYMBOLS = "✓⚠❌"
MAX_ACTION_LENGTH = 512

# --------------------------------------------------------------------------------------------------
# Action parsing: RAGEN's six syntaxes, all 1-indexed, the first pattern that matches (lower-cased
# text) wins.
# --------------------------------------------------------------------------------------------------

_NUM_FIRST_PATTERNS = (
    # place N at row R col C
    re.compile(r"place\s+(\d+)\s+at\s+row\s+(\d+)\s*,?\s*(?:col|column)\s+(\d+)", re.ASCII),
    re.compile(r"place\s+(\d+)\s+at\s+\(\s*(\d+)\s*,\s*(\d+)\s*\)", re.ASCII),  # place N at (R,C)
    re.compile(r"place\s+(\d+)\s+at\s+(\d+)\s*,\s*(\d+)", re.ASCII),  # place N at R,C
    re.compile(r"(\d+)\s+at\s+\(?\s*(\d+)\s*,\s*(\d+)", re.ASCII),  # N at R,C
)
_TRIPLE_PATTERNS = (
    re.compile(r"\(\s*(\d+)\s*,\s*(\d+)\s*,\s*(\d+)\s*\)", re.ASCII),  # (a,b,c)
    re.compile(r"(\d+)\s*,\s*(\d+)\s*,\s*(\d+)", re.ASCII),  # a,b,c
)
_KEYWORD = re.compile(r"\b(?:place|at)\b")


def _small_int(digits: str) -> int:
    # Longer digit strings are out of range anyway; int() on thousands of digits would be slow or
    # raise.
    return int(digits) if len(digits) <= 4 else 10**4


def parse_sudoku_action(text: Any) -> tuple[int, int, int] | None:
    """``(number, row, col)``, all 1-indexed as written, or None when no syntax matches.

    Syntaxes: ``place N at row R col C``, ``place N at (R,C)``, ``place N at R,C``, ``N at R,C``,
    ``(a,b,c)``, ``a,b,c``. A bare triple is ``(row, col, number)`` unless the text contains the
    word ``place`` or ``at``, then it is ``(number, row, col)``. Range checks are the env's job.
    """
    if not isinstance(text, str):
        return None
    s = text[:MAX_ACTION_LENGTH].lower()
    for pattern in _NUM_FIRST_PATTERNS:
        m = pattern.search(s)
        if m:
            n, r, c = (_small_int(g) for g in m.groups())
            return n, r, c
    for pattern in _TRIPLE_PATTERNS:
        m = pattern.search(s)
        if m:
            a, b, c = (_small_int(g) for g in m.groups())
            return (a, b, c) if _KEYWORD.search(s) else (c, a, b)
    return None


# --------------------------------------------------------------------------------------------------
# The env
# --------------------------------------------------------------------------------------------------


class SudokuEnv(TextEnv):
    """Sudoku with a unique solution; one number placed per step, described in free text.

    ## Description At reset the seed generates a full grid and blanks ``difficulty``'s share of
    cells (easy 40 %, medium 50 %, hard 60 %) while the solution stays unique (see the module
    docstring for the fallback). Each step places one number in an empty cell; placements must obey
    the row/column/box rule.

    ## Action Space ``Text`` (printable ASCII, up to 512 characters), 1-indexed, one of RAGEN's six
    syntaxes: ``place N at row R col C``, ``place N at (R,C)``, ``place N at R,C``, ``N at R,C``,
    ``(a,b,c)``, ``a,b,c``. A bare triple is ``(row, col, number)`` unless the text has the word
    ``place`` or ``at``, then ``(number, row, col)``. ``action_names`` is empty.

    ## Observation Space
    ``Text`` over printable ASCII plus ``✓ ⚠ ❌``. ``render_format``:
    - ``simple``: the grid, one row per line, numbers separated by spaces, ``.`` for empty.
    - ``detailed``: the grid with box separators (``[N]`` initial, `` N `` placed, `` . `` empty), a
      legend line, ``Progress: a/81 cells filled (i initial, p placed)`` and ``Steps: s/81``.
    - ``with_feedback`` (default): a ``SUDOKU PUZZLE`` banner, the detailed grid where ``*N*`` marks
      the cells that blocked the last (rejected) move, the legend, the last action's feedback
      (``✓``/``⚠``/``❌``), the conflicts of the last move (``show_conflicts``), the valid numbers of
      every empty cell when at most 10 are left (``show_valid_numbers``), progress and steps.

    ## Rewards
    - ``invalid_action_score`` (-0.1), ``action_is_valid=False``, board unchanged: unparseable text,
      row/col/number out of ``1..grid_size``, an initial cell, an already filled cell, or a number
      that already appears in the row, column or box.
    - Legal placement: ``correct_placement_score`` (1.0) if it equals the solution, else
      ``legal_placement_score`` (0.5, RAGEN's value; such a board can no longer be completed).
    - ``completion_bonus`` (10.0) added on the placement that completes the grid.

    ## Episode End Terminated when the grid is full (solved). Truncated when ``max_steps`` steps
    (valid or not) have been taken. Stepping after the end returns the last observation, reward 0.0,
    the same end flags and ``action_is_valid=False``.

    ## Info ``success`` (solved), ``action_is_valid``, ``action_is_effective`` (a number was
    placed), ``empty_cells``.

    ## Arguments
    - ``grid_size``: 4, 9 (default) or 16. ``difficulty``: ``"easy"`` (default), ``"medium"`` or
      ``"hard"``.
    - ``max_steps`` (81). ``render_format`` (``"with_feedback"``). ``show_conflicts`` (True),
      ``show_valid_numbers`` (True).
    - ``correct_placement_score`` (1.0), ``legal_placement_score`` (0.5), ``invalid_action_score``
      (-0.1), ``completion_bonus`` (10.0).
    - ``search_budget`` (200,000, at most 2,000,000): search nodes allowed for checking a puzzle
      given in ``reset`` options.
    - ``render_mode``: ``None`` or ``"ansi"``.

    ## Options ``reset(options={"puzzle": grid})`` plays a given ``grid_size`` x ``grid_size``
    puzzle (0 = empty); it must have exactly one solution and at least one empty cell. Checking it
    is bounded by ``search_budget`` search nodes (about 3 s): a puzzle whose uniqueness is not
    settled by then is refused with a ``ValueError``.
    """

    branchable = True  # small in-process state: turns may branch (--data.branching.branches)

    def __init__(
        self,
        grid_size: int = 9,
        difficulty: str = "easy",
        max_steps: int = 81,
        render_format: str = "with_feedback",
        show_conflicts: bool = True,
        show_valid_numbers: bool = True,
        correct_placement_score: float = 1.0,
        legal_placement_score: float = 0.5,
        invalid_action_score: float = -0.1,
        completion_bonus: float = 10.0,
        search_budget: int = PUZZLE_SEARCH_BUDGET,
        render_mode: str | None = None,
    ):
        super().__init__(render_mode=render_mode)
        if grid_size not in (4, 9, 16):
            raise ValueError(f"grid_size must be 4, 9 or 16, got {grid_size!r}")
        if difficulty not in DIFFICULTY_BLANK_FRACTION:
            raise ValueError(
                f"difficulty must be one of {list(DIFFICULTY_BLANK_FRACTION)}, got {difficulty!r}"
            )
        max_steps = bounded_int("SudokuEnv", "max_steps", max_steps, 1)
        if render_format not in RENDER_FORMATS:
            raise ValueError(
                f"render_format must be one of {list(RENDER_FORMATS)}, got {render_format!r}"
            )
        # at most 10x the default: each unit is one solver node, so a reset stays within seconds
        self.search_budget = bounded_int(
            "SudokuEnv", "search_budget", search_budget, 1, 10 * PUZZLE_SEARCH_BUDGET
        )
        self.grid_size = grid_size
        self.box_size = math.isqrt(grid_size)
        self.difficulty = difficulty
        self.num_blanks = int(grid_size * grid_size * DIFFICULTY_BLANK_FRACTION[difficulty])
        self.max_steps = max_steps
        self.render_format = render_format
        self.show_conflicts = bool(show_conflicts)
        self.show_valid_numbers = bool(show_valid_numbers)
        self.correct_placement_score = float(correct_placement_score)
        self.legal_placement_score = float(legal_placement_score)
        self.invalid_action_score = float(invalid_action_score)
        self.completion_bonus = float(completion_bonus)

        self.action_space = text_space(max_length=MAX_ACTION_LENGTH)
        self.observation_space = text_space(FEEDBACK_SYMBOLS)

        self.board: np.ndarray | None = None  # current grid, 0 = empty
        self.solution: np.ndarray | None = None
        self.initial_mask: np.ndarray | None = None  # True where the puzzle gave the number
        self.num_steps = 0
        self._feedback = ""
        # (row, col, unit) 0-indexed, of the last rejected move
        self._conflicts: list[tuple[int, int, str]] = []
        self._terminated = False
        self._truncated = False
        self._obs = ""

    # ------------------------------------------------------------------ gym API

    def prompt_spec(self) -> PromptSpec:
        n, b = self.grid_size, self.box_size
        instruction = (
            f"You are solving a Sudoku puzzle. Fill in the grid so that every row, column, and {b}x{b} box contains "
            f"the numbers 1-{n} without repetition.\n"
            "Initial cells are shown in [brackets] and cannot be modified. Empty cells are shown as dots (.).\n"
            "Place numbers one at a time using the format: <answer>place 5 at row 2 col 3</answer> or "
            "<answer>2,3,5</answer>\n"
            "The environment will provide feedback on valid/invalid moves and show conflicts if any occur.\n"
        )
        return PromptSpec(instruction=instruction)

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str, dict]:
        super().reset(seed=seed)
        options = self._reset_options(options, ("puzzle",))
        if "puzzle" in options:
            puzzle = check_grid(options["puzzle"], self.grid_size, "options['puzzle']")
            if (puzzle != 0).all():
                raise ValueError("options['puzzle'] has no empty cell")
            count, first = search_solutions(
                [int(v) for v in puzzle.ravel()], self.grid_size, 2, max_nodes=self.search_budget
            )
            if count == -1:
                raise ValueError(
                    f"options['puzzle']: no unique solution found within search_budget={self.search_budget} search "
                    "nodes (it may hide a contradiction, or have too few givens to check); give more numbers or raise "
                    "search_budget"
                )
            if count != 1:
                found = "none" if count == 0 else "several"
                raise ValueError(
                    f"options['puzzle'] must have exactly one solution, it has {found}"
                )
            solution = np.array(first, dtype=np.int64).reshape(self.grid_size, self.grid_size)
        else:
            puzzle, solution = generate_sudoku(self.np_random, self.grid_size, self.num_blanks)
        self.board = puzzle.copy()
        self.solution = solution
        self.initial_mask = puzzle != 0
        self.num_steps = 0
        self._feedback = "New puzzle. Fill every empty cell."
        self._conflicts = []
        self._terminated = self._truncated = False
        self._obs = self._render_text()
        return self._obs, self._info(valid=True, effective=False)

    def step(self, action: Any) -> tuple[str, float, bool, bool, dict]:
        if self.board is None:
            raise RuntimeError("SudokuEnv: call reset() before step()")
        if self._terminated or self._truncated:
            return (
                self._obs,
                0.0,
                self._terminated,
                self._truncated,
                self._info(valid=False, effective=False),
            )
        self.num_steps += 1
        self._conflicts = []
        reward, valid = self._apply(action)
        self._terminated = bool((self.board != 0).all())
        if self._terminated:
            reward += self.completion_bonus
            self._feedback += " Puzzle solved!"
        self._truncated = not self._terminated and self.num_steps >= self.max_steps
        self._obs = self._render_text()
        return (
            self._obs,
            reward,
            self._terminated,
            self._truncated,
            self._info(valid=valid, effective=valid),
        )

    def _apply(self, action: Any) -> tuple[float, bool]:
        """Execute one action on the board; returns ``(reward, valid)`` and sets the feedback
        text."""
        assert (
            self.board is not None and self.solution is not None and self.initial_mask is not None
        )
        n = self.grid_size
        parsed = parse_sudoku_action(action)
        if parsed is None:
            self._feedback = (
                "⚠ Could not parse the action. Use e.g. 'place 5 at row 2 col 3' or '2,3,5'."
            )
            return self.invalid_action_score, False
        num, row, col = parsed
        if not (1 <= num <= n and 1 <= row <= n and 1 <= col <= n):
            self._feedback = (
                f"⚠ Out of range: number, row and column must each be between 1 and {n}."
            )
            return self.invalid_action_score, False
        r, c = row - 1, col - 1
        if self.initial_mask[r, c]:
            self._feedback = (
                f"❌ Cell (row {row}, col {col}) holds an initial number and cannot be changed."
            )
            return self.invalid_action_score, False
        if self.board[r, c] != 0:
            self._feedback = (
                f"❌ Cell (row {row}, col {col}) is already filled with {self.board[r, c]}."
            )
            return self.invalid_action_score, False
        conflicts = self.find_conflicts(r, c, num)
        if conflicts:
            units = ", ".join(dict.fromkeys(unit for _, _, unit in conflicts))
            self._feedback = f"❌ Cannot place {num} at row {row}, col {col}: {num} is already in the same {units}."
            self._conflicts = conflicts
            return self.invalid_action_score, False
        self.board[r, c] = num
        self._feedback = f"✓ Placed {num} at row {row}, col {col}."
        if num == self.solution[r, c]:
            return self.correct_placement_score, True
        return self.legal_placement_score, True

    def find_conflicts(self, r: int, c: int, num: int) -> list[tuple[int, int, str]]:
        """Cells (0-indexed ``(row, col, unit)``) that already hold ``num`` in cell ``(r, c)``'s
        row, column or box.

        A cell is listed once, under the first unit that contains it (row, then column, then box).
        """
        assert self.board is not None
        b = self.box_size
        found: dict[tuple[int, int], str] = {}
        for cc in range(self.grid_size):
            if cc != c and self.board[r, cc] == num:
                found.setdefault((r, cc), "row")
        for rr in range(self.grid_size):
            if rr != r and self.board[rr, c] == num:
                found.setdefault((rr, c), "column")
        r0, c0 = r // b * b, c // b * b
        for rr in range(r0, r0 + b):
            for cc in range(c0, c0 + b):
                if (rr, cc) != (r, c) and self.board[rr, cc] == num:
                    found.setdefault((rr, cc), "box")
        return [(rr, cc, unit) for (rr, cc), unit in found.items()]

    def valid_numbers(self, r: int, c: int) -> list[int]:
        """Numbers that could legally go into empty cell ``(r, c)`` (0-indexed) right now."""
        return [v for v in range(1, self.grid_size + 1) if not self.find_conflicts(r, c, v)]

    def _info(self, *, valid: bool, effective: bool) -> dict[str, Any]:
        assert self.board is not None
        return {
            "success": self._terminated,
            "action_is_valid": valid,
            "action_is_effective": effective,
            "empty_cells": int((self.board == 0).sum()),
        }

    # ------------------------------------------------------------------ rendering

    def _grid_lines(self, mark_conflicts: bool) -> list[str]:
        assert self.board is not None and self.initial_mask is not None
        n, b = self.grid_size, self.box_size
        w = len(str(n))
        marked = {(r, c) for r, c, _ in self._conflicts} if mark_conflicts else set()
        lines = []
        for r in range(n):
            if r and r % b == 0:
                lines.append("-" * len(lines[-1]))
            cells = []
            for c in range(n):
                v = int(self.board[r, c])
                if v == 0:
                    cells.append(f" {'.':>{w}} ")
                elif (r, c) in marked:
                    cells.append(f"*{v:>{w}}*")
                elif self.initial_mask[r, c]:
                    cells.append(f"[{v:>{w}}]")
                else:
                    cells.append(f" {v:>{w}} ")
            lines.append("|".join("".join(cells[k : k + b]) for k in range(0, n, b)))
        return lines

    def expert_turn(self, max_actions: int) -> tuple[str, tuple[str, ...]]:
        """The warm start's expert: up to ``max_actions`` correct placements (``place N at row R col
        C``, 1-indexed) from ``solution``, the most constrained empty cells first (fewest legal
        numbers, then row-major). Placements from the unique solution never conflict with each
        other, so their order within a turn does not matter."""
        board, solution = np.asarray(self.board), np.asarray(self.solution)
        empty = [(int(r), int(c)) for r, c in np.argwhere(board == 0)]
        if not empty:
            return "the grid is full", ("place 1 at row 1 col 1",)
        options = {rc: len(self.valid_numbers(*rc)) for rc in empty}
        cells = sorted(empty, key=lambda rc: (options[rc], rc))[:max_actions]
        actions = tuple(f"place {int(solution[r, c])} at row {r + 1} col {c + 1}" for r, c in cells)
        r, c = cells[0]
        why = "can only be" if options[(r, c)] == 1 else "must be"
        return f"row {r + 1} col {c + 1} {why} {int(solution[r, c])}", actions

    def _render_text(self) -> str:
        if self.board is None:
            return ""
        n = self.grid_size
        if self.render_format == "simple":
            return "\n".join(" ".join(str(int(v)) if v else "." for v in row) for row in self.board)
        assert self.initial_mask is not None
        filled = int((self.board != 0).sum())
        initial = int(self.initial_mask.sum())
        legend = "Legend: [N] = initial number, N = your number, . = empty"
        feedback = self.render_format == "with_feedback"
        lines: list[str] = []
        if feedback:
            lines += ["=" * 50, "SUDOKU PUZZLE", "=" * 50]
            legend = "Legend: [N] = initial number, N = your number, *N* = conflict, . = empty"
        lines += self._grid_lines(mark_conflicts=feedback and self.show_conflicts)
        lines.append(legend)
        if feedback:
            lines.append(f"Last action: {self._feedback}")
            if self.show_conflicts and self._conflicts:
                listed = ", ".join(
                    f"row {r + 1} col {c + 1} ({unit})" for r, c, unit in self._conflicts
                )
                lines.append(f"Conflicts: {listed}")
            empties = list(zip(*np.nonzero(self.board == 0)))
            if self.show_valid_numbers and 0 < len(empties) <= 10:
                lines.append("Valid numbers for empty cells:")
                for r, c in empties:
                    nums = self.valid_numbers(int(r), int(c))
                    lines.append(
                        f"  row {r + 1} col {c + 1}: {', '.join(map(str, nums)) if nums else 'none'}"
                    )
        lines.append(
            f"Progress: {filled}/{n * n} cells filled ({initial} initial, {filled - initial} placed)"
        )
        lines.append(f"Steps: {self.num_steps}/{self.max_steps}")
        return "\n".join(lines)
