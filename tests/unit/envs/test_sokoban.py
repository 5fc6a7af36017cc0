"""Sokoban: rules and rewards on hand-built boards, renders, prompt data, validation, generator and
solver."""

from __future__ import annotations

import os
import subprocess
import sys
from collections import deque
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

import envs  # noqa: F401  (registers the ids)
from envs.base import PromptSpec
from envs.grid.sokoban.env import PRESETS, SokobanEnv, solve_board

UP, DOWN, LEFT, RIGHT = 0, 1, 2, 3
REPO = Path(__file__).resolve().parents[3]


def board_env(board, **kwargs) -> tuple[SokobanEnv, str]:
    env = SokobanEnv(**kwargs)
    obs, _ = env.reset(seed=0, options={"board": board})
    return env, obs


# ---------------------------------------------------------------------------------------------------- rules


def test_walking_or_pushing_into_a_wall_changes_nothing_but_costs_a_step():
    # player (1,2), box (1,1) against the left wall, target (2,1)
    env, obs = board_env(["#####", "#XP_#", "#O__#", "#####"])
    for action in (UP, LEFT):  # Up: wall above; Left: the box would go into the wall
        obs2, reward, terminated, truncated, info = env.step(action)
        assert obs2 == obs
        assert reward == pytest.approx(-0.1)
        assert (terminated, truncated) == (False, False)
        assert info["action_is_effective"] is False and info["action_is_valid"] is True
    assert env.num_env_steps == 2


def test_two_boxes_in_a_row_cannot_be_pushed():
    env, obs = board_env(["######", "#PXX_#", "#OO__#", "######"])
    obs2, reward, _, _, info = env.step(RIGHT)
    assert obs2 == obs and reward == pytest.approx(-0.1) and not info["action_is_effective"]


def test_box_on_and_off_target_rewards():
    # targets (1,3), (2,5); boxes (1,2), (2,4); player (1,1)
    env, _ = board_env(["#######", "#PXO__#", "#___XO#", "#######"])
    obs, reward, terminated, _, info = env.step(RIGHT)  # box (1,2) -> target (1,3): -0.1 + 1
    assert reward == pytest.approx(0.9) and not terminated
    assert info["boxes_on_target"] == 1 and not info["success"]
    assert obs.split("\n")[1] == "#_P√__#"
    # box leaves the target: -0.1 - 1; player now on the target
    obs, reward, terminated, _, info = env.step(RIGHT)
    assert reward == pytest.approx(-1.1) and not terminated and info["boxes_on_target"] == 0
    assert obs.split("\n")[1] == "#__SX_#"


def test_distance_shaping_rewards_progress_and_telescopes():
    # corridor: player (1,2), box (1,4), target (1,5); shortest solution Right, Right (d = 2)
    board = ["#######", "#_P_XO#", "#######"]
    env, _ = board_env(board, distance_reward=0.5)
    plain, _ = board_env(board)
    expected = [
        (LEFT, -0.1 - 0.5),
        (RIGHT, -0.1 + 0.5),
        (RIGHT, -0.1 + 0.5),
        (RIGHT, -0.1 + 1 + 10 + 0.5),
    ]
    for action, reward in expected:  # d: 2 -> 3 -> 2 -> 1 -> 0
        _, r, terminated, _, info = env.step(action)
        assert r == pytest.approx(reward)
        assert r - plain.step(action)[1] == pytest.approx(reward - (10.9 if terminated else -0.1))
    assert info["success"]
    # a bump into the wall moves nothing: no shaping
    env, _ = board_env(["######", "#P_XO#", "######"], distance_reward=0.5)
    assert env.step(UP)[1] == pytest.approx(-0.1)


def test_distance_shaping_counts_an_unsolvable_state_as_dead_distance():
    # player (3,2) below box (2,2) below target (1,2): Up solves (d = 1)
    env, _ = board_env(
        ["#####", "#_O_#", "#_X_#", "#_P_#", "#####"], distance_reward=1.0, dead_distance=12
    )
    assert env.step(LEFT)[1] == pytest.approx(-0.1 - 1.0)  # (3,1): Right, Up -> d = 2
    assert env.step(UP)[1] == pytest.approx(-0.1 - 1.0)  # (2,1): Down, Right, Up -> d = 3
    # the box to (2,3), against the right wall: unsolvable
    _, r, terminated, truncated, _ = env.step(RIGHT)
    assert env.solve() is None and not (terminated or truncated)
    assert r == pytest.approx(-0.1 + 1.0 * (3 - 12))


def test_distance_shaping_arguments_are_checked():
    for bad in (-0.1, float("nan"), float("inf"), "1", True):
        with pytest.raises(ValueError, match="distance_reward must be a finite number >= 0"):
            SokobanEnv(distance_reward=bad)
    with pytest.raises(ValueError, match="dead_distance"):
        SokobanEnv(dead_distance=0)


def test_heuristic_shaping_reads_the_grid_and_telescopes():
    # corridor: player (1,2), box (1,4), target (1,5): h = 3 x 1 + |player - push cell (1,3)| = 4
    board = ["#######", "#_P_XO#", "#######"]
    env, _ = board_env(board, heuristic_reward=1.0)
    assert env.heuristic_distance() == 4
    expected = [(LEFT, -0.1 - 1), (RIGHT, -0.1 + 1), (RIGHT, -0.1 + 1), (RIGHT, -0.1 + 1 + 10 + 3)]
    shaping = 0.0
    for action, reward in expected:  # h: 4 -> 5 -> 4 -> 3 -> 0
        _, r, terminated, _, info = env.step(action)
        assert r == pytest.approx(reward)
        shaping += r - (10.9 if terminated else -0.1)
    # h at the start: the episode's shaping telescopes
    assert info["success"] and shaping == pytest.approx(4.0)


def test_heuristic_shaping_push_cells_and_a_cornered_box():
    # box (2,2), target (1,1): 3 x 2; push cells (3,2) (Up) and (2,3) (Left); player (3,3) one step
    # from either
    env, _ = board_env(
        ["#####", "#O__#", "#_X_#", "#__P#", "#####"], heuristic_reward=1.0, dead_distance=12
    )
    assert env.heuristic_distance() == 7
    steps = [
        (UP, 6),
        (UP, 7),
        (LEFT, 8),  # onto the push cell (2,3), then away round the box
        # pushes the box to (3,2), away from the target: 3 x 3 + 2 to (4,2) / (3,3)
        (DOWN, 11),
        (RIGHT, 10),
        (DOWN, 9),  # the player walks to (3,3), behind the box for a Left push
        (LEFT, 12),
    ]  # the box into the corner (3,1): dead, h = dead_distance
    h = 7
    for action, after in steps:
        r = env.step(action)[1]
        assert env.heuristic_distance() == after
        assert r == pytest.approx(-0.1 + (h - after))
        h = after
    assert env.solve() is None
    # a bump into the wall moves nothing: no shaping
    env, _ = board_env(["######", "#P_XO#", "######"], heuristic_reward=1.0)
    assert env.step(UP)[1] == pytest.approx(-0.1)


def test_heuristic_shaping_arguments_are_checked():
    for bad in (-0.1, float("nan"), "1", True):
        with pytest.raises(ValueError, match="heuristic_reward must be a finite number >= 0"):
            SokobanEnv(heuristic_reward=bad)
    with pytest.raises(ValueError, match="two shapings of the same progress; set one of them"):
        SokobanEnv(distance_reward=1.0, heuristic_reward=1.0)
    assert "heuristic_reward" in SokobanEnv.reward_only_kwargs  # warm starts ignore it


def test_solving_gives_plus_ten_and_terminates_then_steps_are_harmless():
    env, _ = board_env(["######", "#P_XO#", "######"])
    _, reward, terminated, _, _ = env.step(RIGHT)
    assert reward == pytest.approx(-0.1) and not terminated
    obs, reward, terminated, truncated, info = env.step(RIGHT)  # -0.1 + 1 (on target) + 10 (solved)
    assert reward == pytest.approx(10.9)
    assert (terminated, truncated) == (True, False)
    assert info["success"] is True and info["action_is_effective"] is True
    assert obs == "######\n#__P√#\n######"
    after = env.step(LEFT)
    assert after[:4] == (obs, 0.0, True, False)
    assert after[4]["action_is_effective"] is False and after[4]["success"] is True
    assert env.num_env_steps == 2


def test_truncation_at_max_steps_and_solving_on_the_last_step_is_termination():
    env, obs = board_env(["#####", "#XP_#", "#O__#", "#####"], max_steps=3)
    assert env.step(UP)[2:4] == (False, False)
    assert env.step(UP)[2:4] == (False, False)
    # third valid step: truncated, not terminated
    _, reward, terminated, truncated, info = env.step(UP)
    assert (
        (terminated, truncated) == (False, True)
        and reward == pytest.approx(-0.1)
        and not info["success"]
    )
    # harmless afterwards, the player does not move
    assert env.step(DOWN)[1:4] == (0.0, False, True)
    assert env.player_position == (1, 2)

    env, _ = board_env(["######", "#P_XO#", "######"], max_steps=2)
    env.step(RIGHT)
    assert env.step(RIGHT)[2:4] == (True, False)


@pytest.mark.parametrize(
    "action", ["Up", 4, -1, 1.5, None, True, np.float32(1.0), np.array([1, 2])]
)
def test_invalid_actions_change_nothing(action):
    env, obs = board_env(["######", "#P_XO#", "######"])
    obs2, reward, terminated, truncated, info = env.step(action)
    assert (obs2, reward, terminated, truncated) == (obs, 0.0, False, False)
    assert info["action_is_valid"] is False and info["action_is_effective"] is False
    assert env.num_env_steps == 0


@pytest.mark.parametrize("action", [np.int64(3), np.int8(3), np.array(3), 3])
def test_numpy_integers_are_valid_actions(action):
    env, _ = board_env(["######", "#P_XO#", "######"])
    _, reward, _, _, info = env.step(action)
    assert info["action_is_valid"] and info["action_is_effective"] and env.player_position == (1, 2)


# ---------------------------------------------------------------------------------------------------- renders

# player on a target (1,1), box (1,3), box on a target (2,1)
BOARD = ["######", "#S_X_#", "#√___#", "######"]
GRID = "######\n#S_X_#\n#√___#\n######"
COORD = (
    "Board size: 4 rows x 6 cols (zero-indexed).\n"
    "Targets: (1, 1), (2, 1)\n"
    "Boxes: (1, 3)\n"
    "Boxes on target: (2, 1)\n"
    "Player on target: (1, 1)"
)


def test_renders_in_all_three_formats():
    assert board_env(BOARD)[1] == GRID
    assert board_env(BOARD, observation_format="coord")[1] == COORD
    assert (
        board_env(BOARD, observation_format="grid_coord")[1]
        == "Coordinates: \n" + COORD + "\nGrid Map: \n" + GRID
    )
    env, _ = board_env(BOARD, observation_format="grid_coord")
    obs, *_ = env.step(RIGHT)  # player leaves the target
    assert obs == (
        "Coordinates: \nBoard size: 4 rows x 6 cols (zero-indexed).\nTargets: (1, 1), (2, 1)\nBoxes: (1, 3)\n"
        "Boxes on target: (2, 1)\nPlayer: (1, 2)\nGrid Map: \n######\n#OPX_#\n#√___#\n######"
    )
    assert env.render() is None
    env = SokobanEnv(render_mode="ansi")
    obs, _ = env.reset(seed=0, options={"board": BOARD})
    assert env.render() == obs == GRID


def test_coord_lists_only_non_empty_lines():
    env, obs = board_env(["#####", "#P√_#", "#####"], observation_format="coord")
    # no "Boxes:" and no "Player on target:" line
    assert obs == (
        "Board size: 3 rows x 5 cols (zero-indexed).\nTargets: (1, 2)\nBoxes on target: (1, 2)\nPlayer: (1, 1)"
    )


def test_room_state_and_room_fixed_codes():
    env, _ = board_env(BOARD)
    # codes: 0 wall, 1 empty, 2 target, 3 box on target, 4 box, 5 player
    assert env.room_state.tolist() == [[0] * 6, [0, 5, 1, 4, 1, 0], [0, 3, 1, 1, 1, 0], [0] * 6]
    assert env.room_fixed.tolist() == [[0] * 6, [0, 2, 1, 1, 1, 0], [0, 2, 1, 1, 1, 0], [0] * 6]
    assert env.boxes_on_target == 1 and env.player_position == (1, 1)


def test_custom_lookup_renders_and_legend():
    env, obs = board_env(
        ["WWWWWW", "W@.B.W", "WC...W", "WWWWWW"], preset="SokobanDifferentGridVocab"
    )
    assert obs == "WWWWWW\nW@.B.W\nWC...W\nWWWWWW"
    # same board, other symbols
    assert env.room_state.tolist() == board_env(BOARD)[0].room_state.tolist()
    assert env.observation_space.contains(obs)
    assert env.prompt_spec().symbols == (
        ("W", "wall"),
        (".", "empty"),
        ("G", "target"),
        ("C", "box on target"),
        ("B", "box"),
        ("A", "player"),
        ("@", "player on target"),
    )
    # a lookup without a vocabulary: meanings come from the cell codes
    lookup = {0: "+", 1: " ", 2: "o", 3: "*", 4: "b", 5: "@", 6: "&"}
    env = SokobanEnv(grid_lookup=lookup)
    obs, _ = env.reset(seed=3)
    assert set(obs) <= set("+ o*b@&\n") and env.observation_space.contains(obs)
    assert env.prompt_spec().symbols[4] == ("b", "box")
    # a vocabulary entry only renames its symbol
    env = SokobanEnv(grid_vocab={"X": "crate"})
    assert ("X", "crate") in env.prompt_spec().symbols and (
        "#",
        "wall",
    ) in env.prompt_spec().symbols


# ---------------------------------------------------------------------------------------------------- prompt

RAGEN_SOKOBAN_INSTRUCTION = (
    "You are solving the Sokoban puzzle. \nYou are the player and you need to push all boxes to targets. \n"
    "When you are right next to a box, you can push it by moving in the same direction. \n"
    "You cannot push a box through a wall, and you cannot pull a box. \n"
    "The answer should be a sequence of actions, like <answer>Right || Right || Up</answer>\n"
)


def test_prompt_spec_grid_and_coord():
    spec = SokobanEnv(preset="SimpleSokoban").prompt_spec()
    assert isinstance(spec, PromptSpec)
    assert spec.instruction == RAGEN_SOKOBAN_INSTRUCTION
    assert spec.action_names == ("Up", "Down", "Left", "Right")
    assert spec.symbols[0] == ("#", "wall") and spec.symbols[-1] == ("S", "player on target")

    spec = SokobanEnv(preset="CoordSokoban").prompt_spec()
    assert "a symbol grid and the zero-indexed coordinates" in spec.instruction
    assert "bottom-right corner (5, 5). \n" in spec.instruction  # 6x6 board: last index 5
    assert spec.symbols  # the grid is shown, so is its legend
    spec = SokobanEnv(dim_room=(8, 7), observation_format="grid_coord").prompt_spec()
    assert "bottom-right corner (7, 6)" in spec.instruction  # 8 rows x 7 cols
    spec = SokobanEnv(observation_format="coord").prompt_spec()
    assert (
        "symbol grid" not in spec.instruction
        and "provided with the zero-indexed" in spec.instruction
    )
    assert spec.symbols == ()


# ---------------------------------------------------------------------------------------------------- arguments


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        # 6x6 room: 4x4 = 16 interior cells for 16 boxes + the player
        ({"num_boxes": 16}, "num_boxes"),
        ({"num_boxes": 0}, "num_boxes"),
        ({"observation_format": "ascii"}, "observation_format"),
        ({"preset": "HugeSokoban"}, "preset"),
        ({"dim_room": (2, 6)}, "dim_room"),
        ({"max_steps": 0}, "max_steps"),
        ({"search_depth": 5, "min_solution_steps": 6}, "min_solution_steps"),
        ({"grid_lookup": {0: "#", 1: "_"}}, "grid_lookup"),
        ({"grid_lookup": {0: "#", 1: "#", 2: "O", 3: "√", 4: "X", 5: "P", 6: "S"}}, "grid_lookup"),
        ({"grid_vocab": {"?": "mystery"}}, "grid_vocab"),
    ],
)
def test_bad_arguments_name_the_argument(kwargs, name):
    with pytest.raises(ValueError, match=name):
        SokobanEnv(**kwargs)


def test_presets_set_defaults_that_keywords_override():
    env = SokobanEnv(preset="LargerSokoban")
    assert (env.dim_room, env.num_boxes, env.max_steps, env.search_depth) == ((8, 8), 2, 100, 10)
    env = SokobanEnv(preset="LargerSokoban", num_boxes=1, observation_format="coord")
    assert (env.dim_room, env.num_boxes, env.observation_format) == ((8, 8), 1, "coord")
    assert gym.make("ragen/CoordSokoban-v0").unwrapped.observation_format == "grid_coord"
    assert set(PRESETS) == {
        "SimpleSokoban",
        "LargerSokoban",
        "CoordSokoban",
        "SokobanDifferentGridVocab",
    }


def test_bad_boards_and_options():
    env = SokobanEnv()
    with pytest.raises(ValueError, match="one player"):
        env.reset(options={"board": ["#####", "#X_O#", "#####"]})
    with pytest.raises(ValueError, match="targets"):
        env.reset(options={"board": ["#####", "#XPO#", "#_XO#", "#O__#", "#####"]})
    with pytest.raises(ValueError, match="unknown symbol"):
        env.reset(options={"board": ["#####", "#XPO#", "#?__#", "#####"]})
    with pytest.raises(ValueError, match="options"):
        env.reset(options={"level": 3})


# ---------------------------------------------------------------------------------------------------- generator


# RAGEN's generator, seed 0: by hand, box (2,3) goes Left then Down to the target (3,2): walk Right,
# Right, Down (3), push Left (4), walk Up, Left (6), push Down (7); pushing Down first jams the box
# into the wall at (3,3)
GOLDEN_RAGEN_SEED_0 = "######\n#_P__#\n#__X_#\n#_O###\n#___##\n######"
GOLDEN_RAGEN_STEPS = 7


def test_golden_level_seed_0():
    # pins the generators: same package version + seed => same level on every machine
    obs, info = gym.make("ragen/Sokoban-v0").unwrapped.reset(seed=0)  # generator="uniform_depth"
    assert obs == "######\n#___##\n#_O_##\n#__X_#\n#__P_#\n######"
    # by hand: Right, Up, Left (box to (3,2)), Down, Left, Up (box to (2,2)) = 6 steps
    assert info["optimal_steps"] == 6
    obs, info = gym.make("ragen/SimpleSokoban-v0").unwrapped.reset(seed=0)  # generator="ragen"
    assert obs == GOLDEN_RAGEN_SEED_0
    assert info["optimal_steps"] == GOLDEN_RAGEN_STEPS


def test_ragen_generator_matches_ragens_difficulty():
    # RAGEN's generator on 300 seeds: mean shortest solution 4.0 (1-11) at 6x6/1 box, 5.8 at 8x8/2
    # boxes; the uniform-depth generator is harder (5.1 and 8.0)
    def lengths(**kw):
        env = SokobanEnv(**kw)
        return np.array([env.reset(seed=s)[1]["optimal_steps"] for s in range(300)])

    simple = lengths(preset="SimpleSokoban")
    assert 3.7 < simple.mean() < 4.3 and simple.min() == 1 and 10 <= simple.max() <= 13
    assert 5.4 < lengths(preset="LargerSokoban").mean() < 6.1
    assert lengths(preset="SimpleSokoban", generator="uniform_depth").mean() > 4.8
    assert SokobanEnv().generator == "uniform_depth" and all(
        p["generator"] == "ragen" for p in PRESETS.values()
    )
    with pytest.raises(ValueError, match="generator"):
        SokobanEnv(generator="bfs")


@pytest.mark.parametrize(
    ("preset", "generator"),
    [(p, None) for p in sorted(PRESETS)]
    + [("SimpleSokoban", "uniform_depth"), ("LargerSokoban", "uniform_depth")],
)
def test_generated_levels_are_well_formed(preset, generator):
    env = SokobanEnv(preset=preset, generator=generator)
    rows, cols = env.dim_room
    steps = set()
    for seed in range(100):
        _, info = env.reset(seed=seed)
        state = env.room_state
        assert state.shape == (rows, cols)
        border = np.concatenate([state[0], state[-1], state[:, 0], state[:, -1]])
        assert (border == 0).all()
        # no box starts on a target
        assert (state == 3).sum() == 0 and (state == 4).sum() == env.num_boxes
        assert (env.room_fixed == 2).sum() == env.num_boxes and (state == 5).sum() == 1
        if env.generator == "uniform_depth":
            assert env.min_solution_steps <= info["optimal_steps"] <= env.search_depth
        else:  # pulls of at most search_depth - 2 moves, then at most 3 walking steps
            assert 1 <= info["optimal_steps"] <= env.search_depth + 1
        assert info == {
            "success": False,
            "action_is_effective": False,
            "action_is_valid": True,
            "boxes_on_target": 0,
            "optimal_steps": info["optimal_steps"],
        }
        steps.add(info["optimal_steps"])
    assert len(steps) > 3  # a spread of difficulties, not one fixed length


def test_same_seed_same_level_other_seed_other_level():
    a, b = SokobanEnv(preset="LargerSokoban"), SokobanEnv(preset="LargerSokoban")
    assert [a.reset(seed=s)[0] for s in range(5)] == [b.reset(seed=s)[0] for s in range(5)]
    assert len({a.reset(seed=s)[0] for s in range(10)}) > 5


def test_generation_does_not_depend_on_pythonhashseed():
    script = (
        "import gymnasium as gym, envs\n"
        "for i in ('ragen/SimpleSokoban-v0', 'ragen/LargerSokoban-v0', 'ragen/FrozenLake-v0'):\n"
        "    e = gym.make(i).unwrapped\n"
        "    for s in range(4): print(e.reset(seed=s)[0])\n"
    )
    outs = []
    for hashseed in ("0", "4242"):
        env = dict(os.environ, PYTHONHASHSEED=hashseed, PYTHONPATH=str(REPO))
        proc = subprocess.run(
            [sys.executable, "-c", script],
            env=env,
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert proc.returncode == 0, proc.stderr
        outs.append(proc.stdout)
    assert outs[0] == outs[1]
    here = [
        gym.make(i).unwrapped.reset(seed=s)[0]
        for i in ("ragen/SimpleSokoban-v0",)
        for s in range(4)
    ]
    assert outs[0].startswith("\n".join(here))


# ---------------------------------------------------------------------------------------------------- solver


@pytest.mark.parametrize(
    ("preset", "generator"),
    [(p, None) for p in sorted(PRESETS)]
    + [("SimpleSokoban", "uniform_depth"), ("LargerSokoban", "uniform_depth")],
)
def test_solver_plans_solve_200_levels_in_exactly_optimal_steps(preset, generator):
    env = SokobanEnv(preset=preset, generator=generator)
    for seed in range(200):
        _, info = env.reset(seed=seed)
        plan = env.solve()
        assert len(plan) == info["optimal_steps"], seed
        for i, action in enumerate(plan):
            _, _, terminated, truncated, info = env.step(action)
            assert terminated == (i == len(plan) - 1) and not truncated
        assert info["success"], seed


def brute_force_distance(room_fixed: np.ndarray, room_state: np.ndarray) -> int | None:
    """Plain BFS over (player, boxes) on code grids (fixed: 0 wall, 1 floor, 2 target; state: 3 box
    on target, 4 box, 5 player)."""
    walls = {tuple(x) for x in np.argwhere(room_fixed == 0)}
    targets = frozenset(tuple(x) for x in np.argwhere(room_fixed == 2))
    boxes = frozenset(tuple(x) for x in np.argwhere((room_state == 3) | (room_state == 4)))
    player = tuple(np.argwhere(room_state == 5)[0])
    start = (player, boxes)
    dist = {start: 0}
    queue = deque([start])
    while queue:
        state = queue.popleft()
        (r, c), bx = state
        if bx == targets:
            return dist[state]
        for dr, dc in ((-1, 0), (1, 0), (0, -1), (0, 1)):
            nxt = (r + dr, c + dc)
            if nxt in walls:
                continue
            nbx = bx
            if nxt in bx:
                beyond = (r + 2 * dr, c + 2 * dc)
                if beyond in walls or beyond in bx:
                    continue
                nbx = (bx - {nxt}) | {beyond}
            if (nxt, nbx) not in dist:
                dist[(nxt, nbx)] = dist[state] + 1
                queue.append((nxt, nbx))
    return None


@pytest.mark.parametrize(("preset", "seeds"), [("SimpleSokoban", 20), ("LargerSokoban", 8)])
def test_solver_is_shortest_against_brute_force(preset, seeds):
    env = SokobanEnv(preset=preset)
    for seed in range(seeds):
        env.reset(seed=seed)
        assert len(env.solve()) == brute_force_distance(env.room_fixed, env.room_state)


def test_solver_mid_episode_deadlock_and_solved():
    env, _ = board_env(["######", "#P_XO#", "######"])
    assert env.solve() == [RIGHT, RIGHT]
    env.step(RIGHT)
    assert env.solve() == [RIGHT]
    env.step(RIGHT)
    assert env.solve() == []
    # box (1,1) stuck in a corner, target elsewhere: no solution
    env, _ = board_env(["#####", "#X__#", "#_P_#", "#__O#", "#####"])
    assert env.solve() is None
    assert solve_board(["######", "#P_XO#", "######"]) == [RIGHT, RIGHT]
    assert solve_board("#####\n#X__#\n#_P_#\n#__O#\n#####") is None
    # a walk around the box is part of a shortest plan: Down, Right, then Up pushes the box onto the
    # target
    assert solve_board(["#####", "#_O_#", "#PX_#", "#___#", "#####"]) == [DOWN, RIGHT, UP]
