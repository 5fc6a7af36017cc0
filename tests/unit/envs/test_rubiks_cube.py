"""RubiksCubeEnv: the move permutations are real cube physics (group facts), episode rules,
rendering."""

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

import envs  # noqa: F401  (registers the ids)
from envs.grid.rubiks_cube import (
    ACTION_NAMES,
    COLORS,
    MOVES,
    SOLVED_STATE,
    RubiksCubeEnv,
    apply_moves,
    inverse_action,
    is_solved,
)

IDENTITY = np.arange(24)
A = {name: i for i, name in enumerate(ACTION_NAMES)}


def _perm(names):
    return apply_moves(IDENTITY, [A[n] for n in names.split()])


def _face(state, face):
    """The 2x2 colour letters of face ``U/L/F/R/B/D`` as rows."""
    f = "ULFRBD".index(face)
    c = [COLORS[int(x)] for x in state[4 * f : 4 * f + 4]]
    return [c[0] + c[1], c[2] + c[3]]


def _bfs_layers(actions, max_depth=None):
    start = IDENTITY.astype(np.int8)
    seen, frontier, layers = {start.tobytes()}, [start], [1]
    while frontier and (max_depth is None or len(layers) <= max_depth):
        nxt = []
        for s in frontier:
            for a in actions:
                t = s[MOVES[a]]
                if t.tobytes() not in seen:
                    seen.add(t.tobytes())
                    nxt.append(t)
        frontier = nxt
        if nxt:
            layers.append(len(nxt))
    return layers, len(seen)


def test_check_env():
    check_env(gym.make("ragen/RubiksCube-v0").unwrapped)
    check_env(gym.make("ragen/RubiksCube-v0", scramble_depth=5, max_steps=3).unwrapped)


def test_action_names_order():
    assert RubiksCubeEnv.action_names == (
        "U",
        "U'",
        "D",
        "D'",
        "L",
        "L'",
        "R",
        "R'",
        "F",
        "F'",
        "B",
        "B'",
    )
    assert [inverse_action(a) for a in range(4)] == [1, 0, 3, 2]


@pytest.mark.parametrize("a", range(12))
def test_every_move_has_order_four_and_its_prime_undoes_it(a):
    p = IDENTITY
    for k in range(1, 5):
        p = p[MOVES[a]]
        assert (p == IDENTITY).all() == (k == 4)
    assert (IDENTITY[MOVES[a]][MOVES[inverse_action(a)]] == IDENTITY).all()
    # A quarter turn moves 4 face stickers and 8 side stickers; the other 12 stay.
    assert int((MOVES[a] != IDENTITY).sum()) == 12


def test_single_moves_on_the_solved_cube():
    # Standard facts (Singmaster, clockwise looking at the turned face):
    u = apply_moves(SOLVED_STATE, [A["U"]])  # U: front top row goes to the left face
    assert (
        _face(u, "L") == ["GG", "OO"]
        and _face(u, "F") == ["RR", "GG"]
        and _face(u, "B") == ["OO", "BB"]
    )
    r = apply_moves(SOLVED_STATE, [A["R"]])  # R: front right column goes up
    assert _face(r, "U") == ["WG", "WG"] and _face(r, "F") == ["GY", "GY"]
    assert _face(r, "D") == ["YB", "YB"] and _face(r, "B") == ["WB", "WB"]
    d = apply_moves(SOLVED_STATE, [A["D"]])  # D: front bottom row goes to the right face
    assert _face(d, "R") == ["RR", "GG"]
    l_ = apply_moves(SOLVED_STATE, [A["L"]])  # L: up left column goes to the front
    assert _face(l_, "F") == ["WG", "WG"]
    f = apply_moves(SOLVED_STATE, [A["F"]])  # F: up bottom row goes to the right face's left column
    assert _face(f, "R") == ["WR", "WR"] and _face(f, "U") == ["WW", "OO"]
    b = apply_moves(SOLVED_STATE, [A["B"]])  # B: up top row goes to the left face's left column
    assert _face(b, "L") == ["WO", "WO"]


def test_commutation():
    for x, y in [("U", "D"), ("L", "R"), ("F", "B")]:  # opposite faces commute
        assert (_perm(f"{x} {y}") == _perm(f"{y} {x}")).all()
    for x, y in [("U", "R"), ("R", "F"), ("F", "U"), ("L", "D")]:  # adjacent faces do not
        assert not (_perm(f"{x} {y}") == _perm(f"{y} {x}")).all()


def test_sexy_move_has_order_six():
    seq = "R U R' U'"
    p = IDENTITY
    for k in range(1, 7):
        p = p[_perm(seq)]
        assert (p == IDENTITY).all() == (k == 6)


def test_two_generator_group_has_29160_elements():
    # <R, U> on the 2x2 cube (6 corners move, 2 stay) is a known group of order 29,160.
    layers, size = _bfs_layers([A["R"], A["R'"], A["U"], A["U'"]])
    assert size == 29160
    assert layers[:4] == [1, 4, 10, 24]


def test_quarter_turn_distance_counts():
    # <R, U, F> fixes one corner (all 3.67M positions are reachable); positions at quarter-turn
    # distance 0..5 are 1, 6, 27, 120, 534, 2256 (the known pocket-cube QTM distribution).
    layers, _ = _bfs_layers([A[n] for n in ("R", "R'", "U", "U'", "F", "F'")], max_depth=5)
    assert layers == [1, 6, 27, 120, 534, 2256]


def test_scramble_then_inverse_solves():
    env = RubiksCubeEnv(scramble_depth=12, max_steps=20)
    for seed in range(20):
        env.reset(seed=seed)
        assert len(env.scramble) == 12 and not is_solved(env.state)
        assert all(b != inverse_action(a) for a, b in zip(env.scramble, env.scramble[1:]))
        undo = [inverse_action(a) for a in reversed(env.scramble)]
        for a in undo:
            obs, reward, terminated, truncated, info = env.step(a)
            if terminated:
                break
        assert terminated and reward == 1.0 and info["success"] and not truncated


def test_solving_step_and_game_over_render():
    env = RubiksCubeEnv()
    obs, info = env.reset(options={"scramble": ["R", "U'"]})
    assert info == {"success": False, "action_is_valid": True, "action_is_effective": False}
    obs, reward, terminated, truncated, info = env.step(A["U"])
    assert (reward, terminated, truncated) == (0.0, False, False)
    assert "What is your next move?" in obs
    obs, reward, terminated, truncated, info = env.step(A["R'"])
    assert (reward, terminated, truncated) == (1.0, True, False)
    assert info == {"success": True, "action_is_valid": True, "action_is_effective": True}
    assert obs.endswith("\n=== Game Over: Cube Solved! ===") and "Available Actions" not in obs
    assert env.step(0) == (
        obs,
        0.0,
        True,
        False,
        {**info, "action_is_valid": False, "action_is_effective": False},
    )


def test_truncation_at_max_steps():
    env = RubiksCubeEnv(max_steps=2)
    env.reset(options={"scramble": ["R"]})
    assert env.step(A["U"])[1:4] == (0.0, False, False)
    obs, reward, terminated, truncated, info = env.step(A["U"])
    assert (reward, terminated, truncated) == (0.0, False, True)
    assert obs.endswith("=== Game Over: Max steps reached. ===") and "Step: 2/2" in obs


@pytest.mark.parametrize("bad", [12, -1, "U", 1.5, True, None])
def test_invalid_actions_keep_the_cube(bad):
    env = RubiksCubeEnv()
    env.reset(seed=0)
    before = env.state.copy()
    obs, reward, terminated, truncated, info = env.step(bad)
    assert (
        reward == 0.0 and info["action_is_valid"] is False and info["action_is_effective"] is False
    )
    assert (env.state == before).all() and env.num_steps == 1


def test_render_exact_after_r():
    env = RubiksCubeEnv()
    obs, _ = env.reset(options={"scramble": ["R"]})
    assert obs == (
        "=== Rubik's Cube 2x2 State ===\n"
        "Step: 0/20\n"
        "\n"
        "Up (U):    [W, G]\n [W, G]\n"
        "Left (L):  [O, O]\n [O, O]\n"
        "Front (F): [G, Y]\n [G, Y]\n"
        "Right (R): [R, R]\n [R, R]\n"
        "Back (B):  [W, B]\n [W, B]\n"
        "Down (D):  [Y, B]\n [Y, B]\n"
        "\n"
        "Available Actions:\n"
        "U, U', D, D', L, L', R, R', F, F', B, B'\n"
        "\n"
        "What is your next move?"
    )


def test_default_scramble_is_one_move_and_seeded():
    env = RubiksCubeEnv()
    scrambles = set()
    for seed in range(60):
        env.reset(seed=seed)
        assert len(env.scramble) == 1
        scrambles.add(env.scramble)
    assert len(scrambles) == 12  # all twelve moves appear
    a, b = RubiksCubeEnv(scramble_depth=6), RubiksCubeEnv(scramble_depth=6)
    assert a.reset(seed=9)[0] == b.reset(seed=9)[0]
    assert [a.step(k)[0] for k in range(5)] == [b.step(k)[0] for k in range(5)]


def test_pure_helpers_on_the_instance():
    env = RubiksCubeEnv()
    env.reset(options={"scramble": ["F"]})
    after = env.apply_move(env.state, A["F'"])
    # the instance state is not modified
    assert env.is_solved(after) and not env.is_solved(env.state)
    assert (
        apply_moves(SOLVED_STATE, [A["R"], A["U"]])
        == env.apply_move(env.apply_move(SOLVED_STATE, 6), 0)
    ).all()


def test_prompt_spec():
    spec = RubiksCubeEnv().prompt_spec()
    assert spec.action_names == ACTION_NAMES
    assert spec.instruction.startswith("You are solving a 2x2 Rubik's Cube (Pocket Cube).")


@pytest.mark.parametrize(
    "kwargs, name", [({"scramble_depth": 0}, "scramble_depth"), ({"max_steps": 0}, "max_steps")]
)
def test_constructor_errors_name_the_argument(kwargs, name):
    with pytest.raises(ValueError, match=name):
        RubiksCubeEnv(**kwargs)


def test_bad_options_and_step_before_reset():
    env = RubiksCubeEnv()
    with pytest.raises(RuntimeError, match="reset"):
        env.step(0)
    with pytest.raises(ValueError, match="solved"):
        env.reset(options={"scramble": ["R", "R'"]})
    with pytest.raises(ValueError, match="scramble"):
        env.reset(options={"scramble": ["X"]})
    with pytest.raises(ValueError, match="unknown options"):
        env.reset(options={"depth": 3})
