"""SudokuEnv: the six action syntaxes, conflict detection on a hand-built board, rewards, unique
generated puzzles."""

import time

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

import envs  # noqa: F401  (registers the ids)
from envs.grid.sudoku.env import SudokuEnv, parse_sudoku_action
from envs.grid.sudoku.solver import count_solutions, solve_sudoku

# A well-known puzzle with a unique solution (0 = empty), and that solution.
PUZZLE = np.array(
    [
        [5, 3, 0, 0, 7, 0, 0, 0, 0],
        [6, 0, 0, 1, 9, 5, 0, 0, 0],
        [0, 9, 8, 0, 0, 0, 0, 6, 0],
        [8, 0, 0, 0, 6, 0, 0, 0, 3],
        [4, 0, 0, 8, 0, 3, 0, 0, 1],
        [7, 0, 0, 0, 2, 0, 0, 0, 6],
        [0, 6, 0, 0, 0, 0, 2, 8, 0],
        [0, 0, 0, 4, 1, 9, 0, 0, 5],
        [0, 0, 0, 0, 8, 0, 0, 7, 9],
    ]
)
SOLUTION = np.array(
    [
        [5, 3, 4, 6, 7, 8, 9, 1, 2],
        [6, 7, 2, 1, 9, 5, 3, 4, 8],
        [1, 9, 8, 3, 4, 2, 5, 6, 7],
        [8, 5, 9, 7, 6, 1, 4, 2, 3],
        [4, 2, 6, 8, 5, 3, 7, 9, 1],
        [7, 1, 3, 9, 2, 4, 8, 5, 6],
        [9, 6, 1, 5, 3, 7, 2, 8, 4],
        [2, 8, 7, 4, 1, 9, 6, 3, 5],
        [3, 4, 5, 2, 8, 6, 1, 7, 9],
    ]
)


def _env(puzzle=PUZZLE, **kwargs) -> SudokuEnv:
    env = SudokuEnv(**kwargs)
    env.reset(seed=0, options={"puzzle": puzzle})
    return env


def _is_valid_solution(grid: np.ndarray) -> bool:
    n = grid.shape[0]
    b = int(np.sqrt(n))
    want = set(range(1, n + 1))
    units = [grid[i] for i in range(n)] + [grid[:, j] for j in range(n)]
    units += [grid[r : r + b, c : c + b].ravel() for r in range(0, n, b) for c in range(0, n, b)]
    return all(set(u.tolist()) == want for u in units)


def test_hand_puzzle_is_unique():
    assert count_solutions(PUZZLE) == 1
    assert (solve_sudoku(PUZZLE) == SOLUTION).all()
    # the empty 4x4 grid has 288 solutions
    assert count_solutions(np.zeros((4, 4), dtype=int), limit=5) == 5


@pytest.mark.parametrize(
    "env_id, kwargs",
    [
        ("ragen/Sudoku-v0", {}),
        ("ragen/Sudoku-v0", {"grid_size": 4, "render_format": "simple"}),
        ("ragen/Sudoku-v0", {"grid_size": 4, "difficulty": "hard", "render_format": "detailed"}),
    ],
)
def test_check_env(env_id, kwargs):
    check_env(gym.make(env_id, **kwargs).unwrapped)


@pytest.mark.parametrize(
    "text, parsed",
    [
        ("place 5 at row 2 col 3", (5, 2, 3)),
        ("Place 5 at Row 2, Column 3", (5, 2, 3)),
        ("place 5 at (2, 3)", (5, 2, 3)),
        ("place 5 at 2,3", (5, 2, 3)),
        ("5 at 2,3", (5, 2, 3)),
        ("(2,3,5)", (5, 2, 3)),  # bare triple: row, col, number
        ("2, 3, 5", (5, 2, 3)),
        ("I think 2,3,5", (5, 2, 3)),
        ("(5,2,3) place", (5, 2, 3)),  # the word "place" makes the triple number-first
        ("at (5, 2, 3)", (5, 2, 3)),
        ("(2,3,5) that is it", (5, 2, 3)),  # "that" contains "at" but is not the word "at"
        ("place 10 at row 1 col 1", (10, 1, 1)),  # out of range is the env's call
        ("hello", None),
        ("2,3", None),
        ("place five at row 2 col 3", None),
        (235, None),
        (None, None),
    ],
)
def test_parse_six_syntaxes(text, parsed):
    assert parse_sudoku_action(text) == parsed


def test_correct_and_legal_but_wrong_placements():
    env = _env()
    # the solution's number
    obs, reward, terminated, truncated, info = env.step("place 4 at row 1 col 3")
    assert (reward, terminated, truncated) == (1.0, False, False)
    assert info == {
        "success": False,
        "action_is_valid": True,
        "action_is_effective": True,
        "empty_cells": 50,
    }
    assert "✓ Placed 4 at row 1, col 3." in obs
    assert env.board[0, 2] == 4
    # 2 is legal at (2, 2): not in row 2 (6 1 9 5), column 2 (3 9 6) or box 1 (5 3 4 6 9 8); the
    # solution has 7.
    obs, reward, *_, info = env.step("2,2,2")
    assert reward == 0.5 and info["action_is_valid"]


@pytest.mark.parametrize(
    "action, conflicts, unit_text",
    [
        ("place 7 at row 1 col 3", [(0, 4, "row")], "row"),  # 7 at (1, 5)
        ("place 4 at row 3 col 1", [(4, 0, "column")], "column"),  # 4 at (5, 1)
        ("place 6 at row 1 col 3", [(1, 0, "box")], "box"),  # 6 at (2, 1)
        # 8 at (3, 3) shares the column AND the box: listed once, under its first unit.
        ("place 8 at row 1 col 3", [(2, 2, "column")], "column"),
        # 5 at (1, 1) is in the row and in the box: listed once, as a row conflict.
        ("place 5 at row 1 col 3", [(0, 0, "row")], "row"),
        # 9 at (2, 5); row 1 and column 4 have no 9
        ("place 9 at row 1 col 4", [(1, 4, "box")], "box"),
    ],
)
def test_conflict_detection(action, conflicts, unit_text):
    env = _env()
    before = env.board.copy()
    obs, reward, terminated, truncated, info = env.step(action)
    assert (reward, terminated, truncated) == (-0.1, False, False)
    assert info["action_is_valid"] is False and info["action_is_effective"] is False
    assert (env.board == before).all()
    assert env._conflicts == conflicts
    assert f"is already in the same {unit_text}" in obs
    r, c, _ = conflicts[0]
    assert f"*{PUZZLE[r, c]}*" in obs  # the blocking cell is marked in the grid
    assert f"Conflicts: row {r + 1} col {c + 1} ({unit_text})" in obs


def test_conflicts_in_several_units():
    env = _env()
    # 6 at (2, 2): row 2 has 6 at (2, 1); column 2 has 6 at (7, 2); box 1 has (2, 1) again (listed
    # once).
    assert env.find_conflicts(1, 1, 6) == [(1, 0, "row"), (6, 1, "column")]
    assert env.valid_numbers(0, 2) == [1, 2, 4]  # row 1: 5 3 7, column 3: 8, box 1: 5 3 6 9 8


@pytest.mark.parametrize(
    "action, message",
    [
        ("place 1 at row 1 col 1", "initial number"),  # (1, 1) holds the given 5
        ("place 10 at row 1 col 3", "Out of range"),
        ("0,3,5", "Out of range"),
        ("place 4 at row 1 col 10", "Out of range"),
        ("let me think", "Could not parse"),
        (42, "Could not parse"),
    ],
)
def test_invalid_actions(action, message):
    env = _env()
    obs, reward, terminated, truncated, info = env.step(action)
    assert (reward, terminated, truncated) == (-0.1, False, False)
    assert info["action_is_valid"] is False
    assert message in obs
    assert env.num_steps == 1


def test_filled_cell_cannot_be_rewritten():
    env = _env()
    assert env.step("place 4 at row 1 col 3")[1] == 1.0
    obs, reward, *_ = env.step("place 4 at row 1 col 3")  # no farming the +1 by rewriting
    assert reward == -0.1 and "already filled with 4" in obs
    assert env.step("place 1 at row 1 col 3")[1] == -0.1


def test_completion_bonus_and_step_after_end():
    puzzle = SOLUTION.copy()
    puzzle[0, 2] = 0
    puzzle[8, 8] = 0
    env = _env(puzzle)
    obs, reward, terminated, truncated, info = env.step("9,9,9")
    assert (reward, terminated) == (1.0, False)
    obs, reward, terminated, truncated, info = env.step("place 4 at row 1 col 3")
    assert reward == 1.0 + 10.0
    assert terminated and not truncated and info["success"] and info["empty_cells"] == 0
    assert "Puzzle solved!" in obs
    assert env.step("1,1,1") == (
        obs,
        0.0,
        True,
        False,
        {**info, "action_is_valid": False, "action_is_effective": False},
    )


def test_truncation_at_max_steps():
    env = _env(max_steps=2)
    assert env.step("nonsense")[2:4] == (False, False)
    obs, reward, terminated, truncated, info = env.step("place 4 at row 1 col 3")
    assert (reward, terminated, truncated) == (1.0, False, True)
    assert "Steps: 2/2" in obs


def test_custom_scores():
    env = _env(correct_placement_score=2.0, legal_placement_score=0.0, invalid_action_score=-1.0)
    assert env.step("place 4 at row 1 col 3")[1] == 2.0
    assert env.step("2,2,2")[1] == 0.0
    assert env.step("x")[1] == -1.0


def test_render_formats():
    simple = _env(render_format="simple")._render_text()
    assert simple.splitlines()[0] == "5 3 . . 7 . . . ."
    assert len(simple.splitlines()) == 9

    detailed = _env(render_format="detailed")._render_text().splitlines()
    assert detailed[0] == "[5][3] . | . [7] . | .  .  . "
    assert detailed[3] == "-" * len(detailed[0])
    assert detailed[-2] == "Progress: 30/81 cells filled (30 initial, 0 placed)"
    assert detailed[-1] == "Steps: 0/81"
    assert "SUDOKU PUZZLE" not in detailed

    env = _env()
    env.step("place 4 at row 1 col 3")
    lines = env._render_text().splitlines()
    assert lines[:3] == ["=" * 50, "SUDOKU PUZZLE", "=" * 50]
    assert lines[3] == "[5][3] 4 | . [7] . | .  .  . "
    assert lines[-3] == "Last action: ✓ Placed 4 at row 1, col 3."
    assert lines[-2] == "Progress: 31/81 cells filled (30 initial, 1 placed)"
    assert lines[-1] == "Steps: 1/81"
    assert env.observation_space.contains(env._render_text())


def test_valid_numbers_shown_only_near_the_end():
    puzzle = SOLUTION.copy()
    puzzle[0, 2] = puzzle[0, 3] = puzzle[4, 4] = 0
    obs = _env(puzzle)._render_text()
    # Row 1 misses 4 and 6; column 3 still has a 6 (row 5) and column 4 a 4 (row 8); row 5 misses
    # only 5.
    assert (
        "Valid numbers for empty cells:\n  row 1 col 3: 4\n  row 1 col 4: 6\n  row 5 col 5: 5"
        in obs
    )
    assert "Valid numbers" not in _env(puzzle, show_valid_numbers=False)._render_text()
    assert "Valid numbers" not in _env()._render_text()  # 51 empty cells


def test_show_conflicts_off():
    env = _env(show_conflicts=False)
    obs, reward, *_ = env.step("place 7 at row 1 col 3")
    assert reward == -0.1 and "Conflicts:" not in obs and "*7*" not in obs


@pytest.mark.parametrize(
    "grid_size, difficulty, blanks",
    [
        (9, "easy", 32),
        (9, "medium", 40),
        (9, "hard", 48),
        (4, "easy", 6),
        (4, "hard", 9),
    ],
)
def test_generated_puzzles_have_a_unique_solution(grid_size, difficulty, blanks):
    env = SudokuEnv(grid_size=grid_size, difficulty=difficulty)
    for seed in range(8):
        _, info = env.reset(seed=seed)
        # int(81 * 0.4) = 32, ...
        assert info["empty_cells"] == blanks == int((env.board == 0).sum())
        assert count_solutions(env.board) == 1
        assert _is_valid_solution(env.solution)
        given = env.board != 0
        assert (env.board[given] == env.solution[given]).all()


def test_reset_is_fast():
    env = SudokuEnv(difficulty="hard")
    env.reset(seed=0)
    start = time.perf_counter()
    for seed in range(1, 11):
        env.reset(seed=seed)
    assert (time.perf_counter() - start) / 10 < 0.05  # measured ~3-5 ms per 9x9 hard reset


def test_determinism():
    def rollout(seed):
        env = SudokuEnv()
        obs = [env.reset(seed=seed)[0]]
        for action in ["1,1,1", "place 5 at row 2 col 2", "3,3,3", "9,9,9"]:
            obs.append(env.step(action)[0])
        return obs

    assert rollout(7) == rollout(7)
    env = SudokuEnv()
    assert len({env.reset(seed=s)[0] for s in range(5)}) == 5


def test_prompt_spec():
    instruction = SudokuEnv().prompt_spec().instruction
    assert instruction.startswith(
        "You are solving a Sudoku puzzle. Fill in the grid so that every row, column, "
        "and 3x3 box contains the numbers 1-9 without repetition.\n"
    )
    assert "<answer>2,3,5</answer>" in instruction
    assert "2x2 box contains the numbers 1-4" in SudokuEnv(grid_size=4).prompt_spec().instruction


@pytest.mark.parametrize(
    "kwargs, name",
    [
        ({"grid_size": 5}, "grid_size"),
        ({"difficulty": "extreme"}, "difficulty"),
        ({"max_steps": 0}, "max_steps"),
        ({"render_format": "fancy"}, "render_format"),
    ],
)
def test_constructor_errors_name_the_argument(kwargs, name):
    with pytest.raises(ValueError, match=name):
        SudokuEnv(**kwargs)


def test_bad_options_and_step_before_reset():
    env = SudokuEnv()
    with pytest.raises(RuntimeError, match="reset"):
        env.step("1,1,1")
    with pytest.raises(ValueError, match="exactly one solution"):
        env.reset(options={"puzzle": np.zeros((9, 9), dtype=int)})
    with pytest.raises(ValueError, match="no empty cell"):
        env.reset(options={"puzzle": SOLUTION})
    with pytest.raises(ValueError, match="9x9"):
        env.reset(options={"puzzle": np.zeros((4, 4), dtype=int)})
    with pytest.raises(ValueError, match="unknown options"):
        env.reset(options={"grid": PUZZLE})
