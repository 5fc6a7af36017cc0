"""Game2048Env: merge rules, directions, log reward, the invalid-move penalty that survives the log
reward."""

import math

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

import envs  # noqa: F401  (registers the ids)
from envs.grid.game_2048 import Game2048Env, merge_line, slide

HAND = np.array(
    [
        [2, 2, 2, 2],
        [2, 0, 2, 4],
        [0, 0, 0, 0],
        [4, 0, 0, 4],
    ]
)
# A checkerboard of 8s and 16s whose last row is shifted right by one: Left closes the hole and
# restores the checkerboard; Up and Down would merge the two 16s in column 2 (and Down also slides
# column 1); Right does nothing.
NEARLY_STUCK = np.array(
    [
        [8, 16, 8, 16],
        [16, 8, 16, 8],
        [8, 16, 8, 16],
        [0, 16, 8, 16],
    ]
)


def _env(grid, **kwargs) -> Game2048Env:
    env = Game2048Env(**kwargs)
    env.reset(seed=0, options={"grid": np.array(grid)})
    return env


def test_check_env():
    check_env(gym.make("ragen/2048-v0").unwrapped)
    assert Game2048Env.action_names == ("Up", "Right", "Down", "Left")


@pytest.mark.parametrize(
    "line, merged, score",
    [
        ([2, 2, 2, 2], [4, 4, 0, 0], 8),  # two merges, each tile merges once: 4 + 4
        ([2, 2, 4, 0], [4, 4, 0, 0], 4),  # the new 4 does not merge again with the old 4
        ([4, 0, 4, 4], [8, 4, 0, 0], 8),  # the leading pair merges first
        ([2, 4, 8, 16], [2, 4, 8, 16], 0),
        ([0, 0, 0, 2], [2, 0, 0, 0], 0),
        ([8, 8, 0, 16], [16, 16, 0, 0], 16),
    ],
)
def test_merge_line(line, merged, score):
    assert merge_line(line) == (merged, score)


def test_slide_directions():
    up, gained, moved = slide(HAND, 0)
    # Columns move to the top: col0 [2,2,0,4] -> [4,4,0,0] (+4), col1 [2,0,0,0] stays, col2
    # [2,2,0,0] -> [4,0,0,0] (+4), col3 [2,4,0,4] -> [2,8,0,0] (+8).
    assert up.tolist() == [[4, 2, 4, 2], [4, 0, 0, 8], [0, 0, 0, 0], [0, 0, 0, 0]]
    assert (gained, moved) == (16, True)
    right, gained, _ = slide(HAND, 1)
    # Rows move to the right: [2,2,2,2] -> [0,0,4,4] (+8), [2,0,2,4] -> [0,0,4,4] (+4), [4,0,0,4] ->
    # [0,0,0,8] (+8).
    assert right.tolist() == [[0, 0, 4, 4], [0, 0, 4, 4], [0, 0, 0, 0], [0, 0, 0, 8]]
    assert gained == 20
    down, gained, _ = slide(HAND, 2)
    # col0 [2,2,0,4] -> [0,0,4,4] (+4: the 4 is already at the bottom, the two 2s merge above it),
    # col1 [2,0,0,0] -> [0,0,0,2], col2 [2,2,0,0] -> [0,0,0,4] (+4), col3 [2,4,0,4] -> [0,0,2,8]
    # (+8).
    assert down.tolist() == [[0, 0, 0, 0], [0, 0, 0, 0], [4, 0, 0, 2], [4, 2, 4, 8]]
    assert gained == 16
    left, gained, _ = slide(HAND, 3)
    assert left.tolist() == [[4, 4, 0, 0], [4, 4, 0, 0], [0, 0, 0, 0], [8, 0, 0, 0]]
    assert gained == 20
    assert HAND[0].tolist() == [2, 2, 2, 2]  # the input is not modified


def test_valid_move_with_merges_log_reward():
    env = _env([[2, 2, 2, 2], [0] * 4, [0] * 4, [0] * 4])
    obs, reward, terminated, truncated, info = env.step(3)  # Left
    assert env.grid[0].tolist() == [4, 4, 0, 0]
    assert int((env.grid != 0).sum()) == 3  # two merged tiles + one spawned tile
    assert reward == pytest.approx(0.1 * math.log2(8 + 1))  # raw 8 -> 0.1 * log2(9) = 0.31699...
    assert not terminated and not truncated
    assert info == {
        "success": False,
        "action_is_valid": True,
        "action_is_effective": True,
        "raw_reward": 8.0,
        "score": 8,
        "max_tile": 4,
    }
    assert "Current Score: 8" in obs


def test_raw_reward_mode_and_move_without_merge():
    env = _env([[2, 2, 4, 0], [0] * 4, [0] * 4, [0] * 4], use_log_reward=False)
    assert env.step(3)[1] == 4.0  # [2,2,4,0] -> [4,4,0,0]: raw score 4
    env = _env([[0, 0, 0, 2], [0] * 4, [0] * 4, [0] * 4])
    obs, reward, _, _, info = env.step(3)  # slides without merging
    assert reward == 0.0 and info["action_is_valid"] and info["raw_reward"] == 0.0


@pytest.mark.parametrize("use_log_reward", [True, False])
def test_invalid_move_is_penalised_even_with_log_reward(use_log_reward):
    grid = [[2, 4, 8, 16], [0] * 4, [0] * 4, [0] * 4]
    env = _env(grid, use_log_reward=use_log_reward)
    obs, reward, terminated, truncated, info = env.step(3)  # Left changes nothing
    assert reward == -0.1  # RAGEN returns 0.0 here when use_log_reward is on
    assert info["action_is_valid"] is False and info["action_is_effective"] is False
    assert info["raw_reward"] == -0.1 and info["score"] == 0
    assert env.grid.tolist() == grid  # no spawn after an invalid move
    assert not terminated


@pytest.mark.parametrize("bad", [4, -1, "Up", 1.0, True, None])
def test_malformed_actions_are_invalid_moves(bad):
    env = _env(HAND)
    obs, reward, terminated, truncated, info = env.step(bad)
    assert reward == -0.1 and info["action_is_valid"] is False
    assert (env.grid == HAND).all()


def test_termination_when_no_move_is_possible():
    env = _env(NEARLY_STUCK)
    assert env.valid_actions() == [0, 2, 3]  # Up, Down, Left
    # row 4: [0, 16, 8, 16] -> [16, 8, 16, 0]
    obs, reward, terminated, truncated, info = env.step(3)
    # The new tile (2 or 4) lands in the bottom-right corner next to two 16s: the board is a
    # checkerboard of 8s and 16s plus that tile, so nothing can merge any more.
    assert env.grid[3].tolist()[:3] == [16, 8, 16] and env.grid[3, 3] in (2, 4)
    assert (reward, terminated, truncated) == (0.0, True, False)
    assert info["success"] is False and info["max_tile"] == 16
    assert "Valid Actions: None." in obs
    assert env.step(0) == (
        obs,
        0.0,
        True,
        False,
        {**info, "action_is_valid": False, "action_is_effective": False, "raw_reward": 0.0},
    )


def test_goal_tile_sets_success():
    env = _env([[16, 16, 0, 0], [0] * 4, [0] * 4, [0] * 4], goal_tile=32)
    obs, reward, terminated, truncated, info = env.step(3)
    assert info["success"] and info["max_tile"] == 32 and not terminated
    assert "Goal: Merge same numbers to reach 32." in obs


def test_render_exact():
    env = _env(HAND)
    assert env._render_text() == (
        "Current 2048 Grid:\n"
        "Row 1: [2, 2, 2, 2]\n"
        "Row 2: [2, 0, 2, 4]\n"
        "Row 3: [0, 0, 0, 0]\n"
        "Row 4: [4, 0, 0, 4]\n"
        "\n"
        "Valid Actions: 0(Up), 1(Right), 2(Down), 3(Left).\n"
        "Goal: Merge same numbers to reach 2048.\n"
        "Current Score: 0\n"
        "What is your next move?"
    )
    assert "Valid Actions: 0(Up), 2(Down), 3(Left)." in _env(NEARLY_STUCK)._render_text()


def test_reset_spawns_two_tiles_mostly_twos():
    env = Game2048Env()
    tiles = []
    for seed in range(300):
        obs, info = env.reset(seed=seed)
        nonzero = env.grid[env.grid != 0]
        assert nonzero.size == 2
        tiles += nonzero.tolist()
        assert info["raw_reward"] == 0.0 and info["score"] == 0
    assert set(tiles) <= {2, 4}
    assert abs(tiles.count(2) / len(tiles) - 0.9) < 0.05  # 600 draws of P(2) = 0.9: std ~ 0.012


def test_max_steps_truncation():
    env = _env(HAND, max_steps=2)
    assert env.step(7)[2:4] == (False, False)  # invalid actions count as steps too
    assert env.step(3)[2:4] == (False, True)


def test_determinism_and_different_seeds():
    def rollout(seed):
        env = Game2048Env()
        obs = [env.reset(seed=seed)[0]]
        for a in [0, 1, 2, 3] * 10:
            obs.append(env.step(a)[0])
        return obs

    assert rollout(3) == rollout(3)
    env = Game2048Env()
    assert len({env.reset(seed=s)[0] for s in range(10)}) > 1


def test_board_alias():
    env = _env(HAND)
    assert env.board is env.grid


def test_prompt_spec():
    spec = Game2048Env().prompt_spec()
    assert spec.action_names == ("Up", "Right", "Down", "Left")
    assert spec.instruction.startswith("You are playing the 2048 game on a 4x4 grid.")


@pytest.mark.parametrize(
    "kwargs, name",
    [
        ({"size": 1}, "size"),
        ({"two_prob": 1.5}, "two_prob"),
        ({"goal_tile": 1000}, "goal_tile"),
        ({"max_steps": 0}, "max_steps"),
    ],
)
def test_constructor_errors_name_the_argument(kwargs, name):
    with pytest.raises(ValueError, match=name):
        Game2048Env(**kwargs)


def test_bad_options_and_step_before_reset():
    env = Game2048Env()
    with pytest.raises(RuntimeError, match="reset"):
        env.step(0)
    with pytest.raises(ValueError, match="powers of two"):
        env.reset(options={"grid": np.full((4, 4), 3)})
    with pytest.raises(ValueError, match="4x4"):
        env.reset(options={"grid": np.zeros((3, 3), dtype=int)})
