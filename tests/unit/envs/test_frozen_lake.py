"""FrozenLake: rules on hand maps, slip statistics, renders, prompt data, map generation and
solvers."""

from __future__ import annotations

from collections import Counter, deque

import gymnasium as gym
import numpy as np
import pytest

import envs  # noqa: F401  (registers the ids)
from envs.grid.frozen_lake import FrozenLakeEnv

UP, DOWN, LEFT, RIGHT = 0, 1, 2, 3
CLASSIC = ["SFFF", "FHFH", "FFFH", "HFFG"]


def lake(desc, success_rate=1.0, **kwargs) -> tuple[FrozenLakeEnv, str]:
    env = FrozenLakeEnv(desc=desc, success_rate=success_rate, **kwargs)
    obs, _ = env.reset(seed=0)
    return env, obs


# ---------------------------------------------------------------------------------------------------- rules


def test_fall_in_a_hole():
    env, obs = lake(["SH", "FG"])
    assert obs == "PO\n_G"
    obs, reward, terminated, truncated, info = env.step(RIGHT)
    assert obs == "_X\n_G"  # start shown as empty, player in the hole as X
    assert (reward, terminated, truncated) == (0.0, True, False)
    assert info["success"] is False and info["action_is_effective"] is True


def test_reach_the_goal_then_steps_are_harmless():
    env, _ = lake(["SH", "FG"])
    obs, reward, terminated, _, _ = env.step(DOWN)
    assert (obs, reward, terminated) == ("_O\nPG", 0.0, False)
    obs, reward, terminated, truncated, info = env.step(RIGHT)
    assert (obs, reward, terminated, truncated) == ("_O\n_√", 1.0, True, False)
    assert info["success"] is True
    state = env.np_random.bit_generator.state
    after = env.step(UP)
    assert after[:4] == (obs, 0.0, True, False) and after[4]["action_is_effective"] is False
    assert env.np_random.bit_generator.state == state  # no randomness used after the end


def test_moves_off_the_board_are_clamped():
    env, obs = lake(["SH", "FG"])
    for action in (UP, LEFT):
        obs2, reward, terminated, _, info = env.step(action)
        assert (obs2, reward, terminated) == (obs, 0.0, False)
        assert info["action_is_effective"] is False and info["action_is_valid"] is True


@pytest.mark.parametrize("action", ["Left", 4, -1, 0.0, None, False, np.float64(2.0)])
def test_invalid_actions_change_nothing(action):
    env = FrozenLakeEnv(desc=CLASSIC)
    obs, _ = env.reset(seed=1)
    state = env.np_random.bit_generator.state
    obs2, reward, terminated, truncated, info = env.step(action)
    assert (obs2, reward, terminated, truncated) == (obs, 0.0, False, False)
    assert info["action_is_valid"] is False and info["action_is_effective"] is False
    assert env.np_random.bit_generator.state == state


@pytest.mark.parametrize(("action", "success_rate"), [(UP, 0.8), (RIGHT, 0.5)])
def test_slip_statistics(action, success_rate):
    # open 5x5 lake: nothing ends an episode except the far goal; info["direction"] is the direction
    # taken
    env = FrozenLakeEnv(
        desc=["FFFFF", "FFFFF", "FFSFF", "FFFFF", "FFFFG"], success_rate=success_rate
    )
    env.reset(seed=123)
    counts: Counter[int] = Counter()
    n = 20_000
    for _ in range(n):
        _, _, terminated, _, info = env.step(action)
        counts[info["direction"]] += 1
        if terminated:
            env.reset()
    perpendicular = (LEFT, RIGHT) if action in (UP, DOWN) else (UP, DOWN)
    opposite = {UP: DOWN, DOWN: UP, LEFT: RIGHT, RIGHT: LEFT}[action]
    # binomial std for n = 20k is at most 0.0035; allow about 4 std
    assert counts[action] / n == pytest.approx(success_rate, abs=0.015)
    for d in perpendicular:
        assert counts[d] / n == pytest.approx((1 - success_rate) / 2, abs=0.015)
    assert counts[opposite] == 0


def test_deterministic_lake_never_slips():
    env, _ = lake(["FFFFF", "FFFFF", "FFSFF", "FFFFF", "FFFFG"])
    directions = {env.step(a)[4]["direction"] == a for a in [UP, LEFT, DOWN, RIGHT] * 5}
    assert directions == {True}


def test_same_seed_same_slips():
    def run(seed):
        env = FrozenLakeEnv(size=6, p=0.95)
        obs, _ = env.reset(seed=seed)
        out = [obs]
        for a in [RIGHT, DOWN, RIGHT, DOWN, LEFT, UP, RIGHT, DOWN] * 3:
            obs, _, terminated, _, _ = env.step(a)
            out.append(obs)
            if terminated:
                break
        return out

    assert run(7) == run(7)


# ---------------------------------------------------------------------------------------------------- renders

COORD = (
    "Board size: 4 rows x 4 cols (zero-indexed).\nStart: (0, 0)\nGoal: (3, 3)\n{player}\n"
    "Holes: (1, 1), (1, 3), (2, 3), (3, 0)"
)


def test_renders_in_all_three_formats():
    grid = "P___\n_O_O\n___O\nO__G"
    assert lake(CLASSIC)[1] == grid
    assert lake(CLASSIC, observation_format="coord")[1] == COORD.format(player="Player: (0, 0)")
    env, obs = lake(CLASSIC, observation_format="grid_coord")
    assert (
        obs == "Coordinates: \n" + COORD.format(player="Player: (0, 0)") + "\nGrid Map: \n" + grid
    )
    obs, *_ = env.step(RIGHT)
    assert obs.endswith(
        "Player: (0, 1)\nHoles: (1, 1), (1, 3), (2, 3), (3, 0)\nGrid Map: \n_P__\n_O_O\n___O\nO__G"
    )
    env.step(DOWN)  # into the hole at (1, 1)
    assert env.render() is None
    env = FrozenLakeEnv(
        desc=CLASSIC, success_rate=1.0, observation_format="coord", render_mode="ansi"
    )
    env.reset(seed=0)
    for a in [RIGHT, DOWN]:
        env.step(a)
    assert env.render() == COORD.format(player="Player in hole: (1, 1)")
    env.reset(seed=0)
    for a in [DOWN, DOWN, RIGHT, RIGHT, DOWN, RIGHT]:  # (1,0) (2,0) (2,1) (2,2) (3,2) (3,3)
        env.step(a)
    assert env.render() == COORD.format(player="Player on goal: (3, 3)")


def test_no_holes_line_without_holes():
    env, obs = lake(["SG"], observation_format="coord")
    assert (
        obs
        == "Board size: 1 rows x 2 cols (zero-indexed).\nStart: (0, 0)\nGoal: (0, 1)\nPlayer: (0, 0)"
    )


# ---------------------------------------------------------------------------------------------------- prompt


def test_prompt_spec():
    spec = FrozenLakeEnv().prompt_spec()
    assert spec.instruction == (
        "You are solving the FrozenLake puzzle. Forbid the whole and go to the target. You may move to the "
        "unintended direction due to the slippery ice. Example answer format: <think>To forbid the hole and go to "
        "the target, I should go left then go up.</think><answer>Left || Up</answer>"
    )
    assert spec.action_names == ("Up", "Down", "Left", "Right") == FrozenLakeEnv.action_names
    assert spec.symbols == (
        ("P", "player"),
        ("_", "empty"),
        ("O", "hole"),
        ("G", "goal"),
        ("X", "player in hole"),
        ("√", "player on goal"),
    )
    coord = gym.make("ragen/CoordFrozenLake-v0").unwrapped.prompt_spec().instruction
    assert "bottom-right corner (3, 3).\n" in coord  # 4x4 lake (RAGEN says (5, 5))
    assert "both a symbol grid and zero-indexed coordinates" in coord and "slippery" in coord
    assert (
        "(5, 5)" in FrozenLakeEnv(size=6, observation_format="grid_coord").prompt_spec().instruction
    )
    only_coord = FrozenLakeEnv(observation_format="coord").prompt_spec()
    assert (
        "includes zero-indexed coordinates" in only_coord.instruction and only_coord.symbols == ()
    )
    # nothing slips: no slippery sentence
    assert "slippery" not in FrozenLakeEnv(success_rate=1.0).prompt_spec().instruction
    assert (
        "slippery"
        not in FrozenLakeEnv(success_rate=1.0, observation_format="grid_coord")
        .prompt_spec()
        .instruction
    )


# ---------------------------------------------------------------------------------------------------- arguments


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"size": 1}, "size"),
        ({"p": 0.0}, "p must"),
        ({"success_rate": 1.5}, "success_rate"),
        ({"observation_format": "image"}, "observation_format"),
        ({"desc": ["SF", "FFF"]}, "desc"),
        ({"desc": ["SF", "FF"]}, "desc"),  # no goal
        ({"desc": ["SX", "FG"]}, "desc"),
    ],
)
def test_bad_arguments_name_the_argument(kwargs, name):
    with pytest.raises(ValueError, match=name):
        FrozenLakeEnv(**kwargs)


# ---------------------------------------------------------------------------------------------------- maps


def shortest_path_length(desc) -> int | None:
    """Independent BFS from S to G through non-hole tiles."""
    n, m = len(desc), len(desc[0])
    start = next((r, c) for r in range(n) for c in range(m) if desc[r][c] == "S")
    dist = {start: 0}
    queue = deque([start])
    while queue:
        r, c = queue.popleft()
        if desc[r][c] == "G":
            return dist[(r, c)]
        for dr, dc in ((-1, 0), (1, 0), (0, -1), (0, 1)):
            nr, nc = r + dr, c + dc
            if 0 <= nr < n and 0 <= nc < m and desc[nr][nc] != "H" and (nr, nc) not in dist:
                dist[(nr, nc)] = dist[(r, c)] + 1
                queue.append((nr, nc))
    return None


def test_generated_maps_are_valid_and_seeded():
    env = FrozenLakeEnv(size=5, p=0.7)
    maps = set()
    for seed in range(200):
        env.reset(seed=seed)
        flat = "".join(env.desc)
        assert len(env.desc) == 5 and all(len(row) == 5 for row in env.desc)
        assert set(flat) <= set("SFHG") and flat.count("S") == 1 and flat.count("G") == 1
        # goal reachable (start != goal: distance >= 1)
        assert shortest_path_length(env.desc) is not None
        assert env.player_position == divmod(flat.index("S"), 5)
        maps.add(tuple(env.desc))
    assert len(maps) > 150
    env.reset(seed=3)
    first = list(env.desc)
    env.reset(seed=4)
    env.reset(seed=3)
    assert env.desc == first
    env = FrozenLakeEnv(p=1.0)
    env.reset(seed=5)
    assert "H" not in "".join(env.desc)


def test_map_seed_and_desc_fix_the_map():
    env = FrozenLakeEnv(map_seed=11)
    maps = set()
    for seed in range(5):
        env.reset(seed=seed)
        maps.add(tuple(env.desc))
    assert len(maps) == 1 and maps == {tuple(FrozenLakeEnv(map_seed=11).desc)}
    env = FrozenLakeEnv(desc=CLASSIC, map_seed=11)
    env.reset(seed=99)
    assert env.desc == CLASSIC


# ---------------------------------------------------------------------------------------------------- solvers


def test_solve_200_seeds_deterministic():
    env = FrozenLakeEnv(success_rate=1.0)
    for seed in range(200):
        env.reset(seed=seed)
        plan = env.solve()
        assert len(plan) == shortest_path_length(env.desc), seed
        for i, a in enumerate(plan):
            _, reward, terminated, _, info = env.step(a)
            assert terminated == (i == len(plan) - 1)
        assert info["success"] and reward == 1.0
        assert env.solve() == []


def test_solve_unreachable_and_in_hole():
    env, _ = lake(["SH", "HG"])  # hand map: the goal is walled off by holes
    assert env.solve() is None
    env.step(RIGHT)
    assert env.solve() is None


def test_value_iteration_on_hand_maps():
    # Corridor between two rows of holes, success_rate 0.8: every move slips into a hole with 0.2.
    # From (1,1): Right reaches G with 0.8. From S (1,0): Right reaches (1,1) with 0.8, so 0.8 * 0.8
    # = 0.64.
    env, _ = lake(["HHH", "SFG", "HHH"], success_rate=0.8)
    policy, success = env.optimal_policy()
    assert success[1, 0] == pytest.approx(0.64) and success[1, 1] == pytest.approx(0.8)
    assert policy[1, 0] == RIGHT and policy[1, 1] == RIGHT
    assert success[0].tolist() == [0.0, 0.0, 0.0] and success[1, 2] == 1.0

    # Holes only below: pushing Up into the border never falls, and slips Left/Right move along the
    # row, so the goal is reached with probability 1 by always choosing Up (Right would risk the
    # hole below with 0.1).
    env, _ = lake(["SFG", "HHH"], success_rate=0.8)
    policy, success = env.optimal_policy()
    assert success[0].tolist() == pytest.approx([1.0, 1.0, 1.0])
    assert policy[0, 0] == UP and policy[0, 1] == UP
    # without slipping the same map is two steps Right
    env, _ = lake(["SFG", "HHH"], success_rate=1.0)
    policy, success = env.optimal_policy()
    assert policy[0, 0] == RIGHT and policy[0, 1] == RIGHT and success[0, 0] == 1.0


def test_discounted_value_iteration_matches_monte_carlo():
    # gamma < 1 values E[gamma ** T] (T = steps to the goal) and keeps episodes short, so a capped
    # Monte Carlo estimate is exact up to 0.9 ** 150 ~ 1e-7
    env = FrozenLakeEnv(desc=CLASSIC, success_rate=0.8)
    env.reset(seed=0)
    policy, value = env.optimal_policy(gamma=0.9)
    target = value[0, 0]
    assert 0.1 < target < 0.9**6  # the goal is 6 steps away at best
    total, episodes = 0.0, 2000
    for _ in range(episodes):
        env.reset()
        for t in range(1, 151):
            _, reward, terminated, _, _ = env.step(int(policy[env.player_position]))
            if terminated:
                total += reward * 0.9**t
                break
    # each sample lies in [0, 1]: std of the mean <= sqrt(0.25 / 2000) = 0.011; allow 4 std
    assert total / episodes == pytest.approx(target, abs=0.045)
    # and the undiscounted success probability is at least as high
    assert env.optimal_policy()[1][0, 0] >= target


def _directions(seed, transition_seed, actions, **kwargs):
    env = FrozenLakeEnv(
        desc=["FFFFF", "FFFFF", "FFSFF", "FFFFF", "FFFFG"], success_rate=0.5, **kwargs
    )
    obs, _ = env.reset(
        seed=seed, options=None if transition_seed is None else {"transition_seed": transition_seed}
    )
    return obs, [env.step(a)[4]["direction"] for a in actions]


def test_group_members_slip_independently_by_default():
    actions = [0, 1] * 2  # Up, Down: stays on the board whatever slips
    pairs = [
        (_directions(s, 2 * s, actions), _directions(s, 2 * s + 1, actions)) for s in range(100)
    ]
    assert all(a[0] == b[0] for a, b in pairs)  # same initial state
    assert sum(a[1] != b[1] for a, b in pairs) > 80  # 4 moves at success rate 0.5: P(same) is small
    # same seed + transition seed: same slips
    assert _directions(3, 7, actions) == _directions(3, 7, actions)
    assert FrozenLakeEnv.transition_seeded and not FrozenLakeEnv().shared_transitions


def test_shared_transitions_slip_together():
    actions = [0, 1] * 2
    for s in range(50):
        a = _directions(s, 2 * s, actions, shared_transitions=True)
        assert (
            a
            == _directions(s, 2 * s + 1, actions, shared_transitions=True)
            == _directions(s, None, actions)
        )
