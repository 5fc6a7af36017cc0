"""Experts answer from the env state in the exact rollout format: episodes succeed, masks cover
exactly the expert's tokens, and the text parses back to the expert's actions."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

import envs  # noqa: F401  (registers the ragen/* ids)
from envs.base import relation
from envs.grid.game_2048 import Game2048Env, slide
from envs.grid.rubiks_cube import SOLVED_STATE, RubiksCubeEnv, apply_move, is_solved
from ragen_lightning.errors import ConfigError
from ragen_lightning.rollout import prompting
from ragen_lightning.rollout.engine import SamplingParams
from ragen_lightning.rollout.settings import EpisodeSettings
from ragen_lightning.sft.experts import (
    ExpertEngine,
    ExpertTurn,
    collect_demonstrations,
    expert_actions,
    expert_turn,
    render_response,
)

# shortest solutions of 7, 2, 4, 5, 1, 3, 4, 6 steps (seed 2 needs 12): all fit the 10-action budget
SOKOBAN_SEEDS = [0, 1, 3, 4, 5, 6, 7, 9]


def _run(env_id, tok, seeds, env_kwargs=None, **episode):
    return collect_demonstrations(
        env_id, tok, seeds, env_kwargs=env_kwargs, episode=EpisodeSettings(**episode)
    )


def test_sokoban_expert_solves_and_uses_the_shortest_plan(tiny_tokenizer):
    trajs = _run("ragen/SimpleSokoban-v0", tiny_tokenizer, SOKOBAN_SEEDS)
    env = gym.make("ragen/SimpleSokoban-v0")
    for traj, seed in zip(trajs, SOKOBAN_SEEDS):
        _, info = env.reset(seed=seed)
        assert traj.success and traj.terminated and not traj.truncated
        assert traj.num_actions == info["optimal_steps"]  # a shortest solution, nothing wasted
        # two actions per turn, last turn may have one
        assert traj.num_turns == -(-info["optimal_steps"] // 2)
        assert traj.num_format_errors == 0 and traj.penalty == 0.0


def test_sokoban_reasoning_describes_box_and_target():
    env = gym.make("ragen/SimpleSokoban-v0")
    # box at (3, 3), target at (4, 2), player at (2, 1): the box is above and right of the target
    # and below and right of the player
    env.reset(options={"board": "######\n#____#\n#P___#\n#__X_#\n#_O__#\n######"})
    plan = env.unwrapped.solve()
    turn = expert_turn(env, 2)
    assert turn.actions == tuple(("Up", "Down", "Left", "Right")[a] for a in plan[:2])
    assert (
        turn.reasoning
        == f"box is above and right of target, below and right of me; I go {', '.join(turn.actions)}"
    )
    assert relation((1, 1), (2, 2)) == "above and left of"
    assert relation((3, 2), (1, 2)) == "below"
    assert relation((1, 0), (1, 2)) == "left of"


def test_loss_mask_covers_exactly_the_expert_tokens(tiny_tokenizer):
    tok = tiny_tokenizer
    seed = 0
    (traj,) = _run("ragen/SimpleSokoban-v0", tok, [seed])
    (sample,) = traj.samples
    conv = sample.conversation
    # replay the episode with the expert to get the expected answer of every turn
    env = gym.make("ragen/SimpleSokoban-v0")
    env.reset(seed=seed)
    expected_turns = []
    done = False
    while not done:
        turn = expert_turn(env, 2)
        expected_turns.append(
            tok.encode(render_response(turn), add_special_tokens=False) + [tok.eos_token_id]
        )
        for a in turn.actions:
            _, _, done, _, _ = env.step(env.unwrapped.action_names.index(a))
            if done:
                break
    assert len(conv.turn_spans) == len(expected_turns) == traj.num_turns
    masked_positions = [i for i, m in enumerate(conv.loss_mask) if m]
    span_positions = [i for s, e in conv.turn_spans for i in range(s, e)]
    assert masked_positions == span_positions
    for (s, e), ids in zip(conv.turn_spans, expected_turns):
        assert conv.input_ids[s:e] == ids
    # the prompt before the first span is the runner's chat prompt primed with <think>
    first = conv.turn_spans[0][0]
    assert conv.input_ids[first - 1] == tok.convert_tokens_to_ids("<think>")


@pytest.mark.parametrize("enable_think", [True, False])
def test_response_text_parses_back_to_the_actions(enable_think):
    turn = ExpertTurn("box is left of target; I go Right, Up", ("Right", "Up"))
    text = render_response(turn, enable_think)
    assert text == (
        "box is left of target; I go Right, Up</think><answer>Right || Up</answer>"
        if enable_think
        else "Right || Up</answer>"
    )
    parsed = prompting.parse_response(text, enable_think=enable_think, max_actions_per_turn=2)
    assert parsed.format_ok and parsed.actions == ("Right", "Up")
    assert parsed.think == (turn.reasoning if enable_think else "")


@pytest.mark.parametrize(
    "env_id, kwargs",
    [
        ("ragen/SimpleSokoban-v0", {}),
        ("ragen/FrozenLake-v0", {}),
        ("ragen/FrozenLake-v0", {"success_rate": 1.0}),
        ("ragen/Bandit-v0", {}),
        ("ragen/Countdown-v0", {}),
        ("ragen/MetaMathQA-v0", {}),
        ("ragen/Sudoku-v0", {"grid_size": 4}),
    ],
)
def test_expert_text_parses_to_valid_env_actions(env_id, kwargs):
    env = gym.make(env_id, **kwargs)
    for seed in range(5):
        env.reset(seed=seed)
        turn = expert_turn(env, 2)
        parsed = prompting.parse_response(render_response(turn), max_actions_per_turn=2)
        assert parsed.format_ok and parsed.actions == turn.actions
        mapped = prompting.map_actions(parsed.actions, env.unwrapped.action_names)
        assert None not in mapped


def test_frozen_lake_deterministic_follows_shortest_path(tiny_tokenizer):
    kw = {"success_rate": 1.0}
    seeds = [0, 1, 2, 3]  # shortest paths of 5, 4, 1, 2 steps
    trajs = _run("ragen/FrozenLake-v0", tiny_tokenizer, seeds, env_kwargs=kw)
    env = gym.make("ragen/FrozenLake-v0", **kw)
    for traj, seed in zip(trajs, seeds):
        env.reset(seed=seed)
        assert traj.success and traj.num_actions == len(env.unwrapped.solve())
        assert traj.env_return == 1.0


def test_frozen_lake_slippery_follows_the_optimal_policy_along_the_intended_path():
    env = gym.make("ragen/FrozenLake-v0", desc=["SFFF", "FHFH", "FFFH", "HFFG"], success_rate=0.8)
    env.reset(seed=0)
    policy, _ = env.unwrapped.optimal_policy()
    names = ("Up", "Down", "Left", "Right")
    first = names[int(policy[0, 0])]
    deltas = {"Up": (-1, 0), "Down": (1, 0), "Left": (0, -1), "Right": (0, 1)}
    # where the first move intends to go
    cell = (min(max(deltas[first][0], 0), 3), min(max(deltas[first][1], 0), 3))
    second = names[int(policy[cell])]
    turn = expert_turn(env, 2)
    assert turn.actions == (first, second)
    assert (
        turn.reasoning == f"goal is below and right of me; ice is slippery, I go {first}, {second}"
    )
    assert expert_turn(env, 1).actions == (first,)


def test_frozen_lake_slippery_turn_stops_at_the_goal():
    env = gym.make("ragen/FrozenLake-v0", desc=["SG"], success_rate=0.8)
    env.reset(seed=0)
    assert expert_turn(env, 2).actions == ("Right",)  # nothing after the move that reaches the goal


def test_bandit_expert_pulls_the_high_arm(tiny_tokenizer):
    trajs = _run(
        "ragen/Bandit-v0",
        tiny_tokenizer,
        list(range(8)),
        max_turns=1,
        max_actions_per_turn=1,
        max_actions_per_episode=1,
    )
    env = gym.make("ragen/Bandit-v0")
    for seed, traj in enumerate(trajs):
        env.reset(seed=seed)
        conv = traj.samples[0].conversation
        s, e = conv.turn_spans[0]
        answer = prompting.parse_response(tiny_tokenizer.decode(conv.input_ids[s : e - 1])).actions
        assert answer == (env.unwrapped.hi_arm_name,)
        assert traj.success and traj.num_turns == 1


def test_countdown_and_metamathqa_experts_answer_correctly(tiny_tokenizer):
    for env_id in ("ragen/Countdown-v0", "ragen/MetaMathQA-v0"):
        trajs = _run(
            env_id,
            tiny_tokenizer,
            list(range(6)),
            max_turns=1,
            max_actions_per_turn=1,
            max_actions_per_episode=1,
        )
        assert all(t.success and t.env_return == 1.0 for t in trajs), env_id
    env = gym.make("ragen/Countdown-v0")
    env.reset(options={"target": 24, "nums": [4, 6, 1]})
    (answer,) = expert_actions(env, 1)
    assert env.unwrapped.check_answer(answer) == 1.0


def test_sudoku_expert_places_correct_numbers(tiny_tokenizer):
    (traj,) = _run(
        "ragen/Sudoku-v0", tiny_tokenizer, [0], env_kwargs={"grid_size": 4}, max_turns=10
    )
    assert traj.success and traj.num_format_errors == 0
    env = gym.make("ragen/Sudoku-v0", grid_size=4)
    env.reset(seed=0)
    turn = expert_turn(env, 2)
    core = env.unwrapped
    for action in turn.actions:
        _, reward, _, _, info = env.step(action)
        assert reward >= core.correct_placement_score and info["action_is_valid"]


# the expert plans with the env's own slide (0 Up, 1 Right, 3 Left)
def test_the_one_2048_slide_by_hand():
    board = np.array([[2, 2, 4, 0], [0, 0, 0, 2], [2, 0, 2, 2], [0, 0, 0, 0]])
    left, score, _ = slide(board, 3)
    assert left.tolist() == [[4, 4, 0, 0], [2, 0, 0, 0], [4, 2, 0, 0], [0, 0, 0, 0]] and score == 8
    right, score, _ = slide(board, 1)
    assert right.tolist() == [[0, 0, 4, 4], [0, 0, 0, 2], [0, 0, 2, 4], [0, 0, 0, 0]] and score == 8
    up, score, _ = slide(board, 0)
    assert up.tolist() == [[4, 2, 4, 4], [0, 0, 2, 0], [0, 0, 0, 0], [0, 0, 0, 0]] and score == 8


def test_game_2048_expert_is_greedy():
    # Left/Right merge 2+2 twice (score 8, 2 more empties); Up/Down merge nothing useful in column
    # terms
    env = Game2048Env(size=4)
    env.reset(seed=0)
    env.grid = np.array([[2, 2, 0, 0], [4, 4, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0]])
    turn = expert_turn(env, 2)
    # Left and Right tie on score/empties; Left keeps the 8 in a corner first
    assert turn.actions == ("Left",)
    assert turn.reasoning == "Left merges the most tiles; I go Left"


def test_rubiks_expert_finds_a_shortest_solution():
    env = RubiksCubeEnv()
    env.reset(seed=0)
    names = env.action_names
    # R' U' undoes it
    scrambled = apply_move(apply_move(SOLVED_STATE, names.index("U")), names.index("R"))
    env.state = scrambled
    turn = expert_turn(env, 4)
    assert (
        len(turn.actions) == 2
        and turn.reasoning == f"2 moves solve it; I go {', '.join(turn.actions)}"
    )
    # on a 2x2 cube several 2-move answers exist; any shortest one solves it
    for action in turn.actions:
        scrambled = apply_move(scrambled, names.index(action))
    assert is_solved(scrambled)
    env.state = apply_move(SOLVED_STATE, names.index("F"))
    assert expert_turn(env, 1) == ExpertTurn("1 move solves it; I go F'", ("F'",))


@pytest.mark.parametrize("scramble_depth", [1, 3])
def test_rubiks_expert_solves_the_real_cube(tiny_tokenizer, scramble_depth):
    kw = {"scramble_depth": scramble_depth}
    trajs = _run(
        "ragen/RubiksCube-v0",
        tiny_tokenizer,
        [0, 1, 2],
        env_kwargs=kw,
        max_actions_per_turn=4,
        max_actions_per_episode=20,
    )
    env = gym.make("ragen/RubiksCube-v0", **kw)
    for seed, traj in enumerate(trajs):
        env.reset(seed=seed)
        assert traj.success and traj.num_format_errors == 0
        # never longer than undoing the scramble
        assert traj.num_actions <= len(env.unwrapped.scramble)


def test_game_2048_expert_plays_valid_moves(tiny_tokenizer):
    (traj,) = _run(
        "ragen/2048-v0",
        tiny_tokenizer,
        [0],
        max_turns=8,
        max_actions_per_turn=1,
        max_actions_per_episode=8,
    )
    assert traj.num_turns == 8 and traj.num_format_errors == 0 and traj.num_actions == 8
    # the greedy move always changes the board, so no turn earns the invalid-move penalty; some
    # turns merge
    assert all(r >= 0 for r in traj.turn_rewards) and sum(traj.turn_rewards) > 0


def test_an_env_without_an_expert_is_named_in_a_config_error():
    class MysteryEnv:
        action_names = ("Go",)

    with pytest.raises(
        ConfigError, match=r"--model.warm_start needs an expert: MysteryEnv has no expert_turn"
    ):
        expert_turn(MysteryEnv(), 1)


def test_engine_needs_envs_and_caps_length(tiny_tokenizer):
    engine = ExpertEngine(tiny_tokenizer, EpisodeSettings(max_actions_per_turn=2))
    assert engine.needs_envs
    with pytest.raises(ValueError, match="env state"):
        engine.generate([[1, 2]], SamplingParams())
    env = gym.make("ragen/SimpleSokoban-v0")
    env.reset(seed=1)
    (full,) = engine.generate([[1]], SamplingParams(max_new_tokens=200), envs=[env.unwrapped])
    assert full.finish_reason == "stop" and full.token_ids[-1] == tiny_tokenizer.eos_token_id
    assert full.logprobs == [0.0] * len(full.token_ids)
    (cut,) = engine.generate([[1]], SamplingParams(max_new_tokens=3), envs=[env.unwrapped])
    assert cut.finish_reason == "length" and cut.token_ids == full.token_ids[:3]


def test_demonstrations_without_think(tiny_tokenizer):
    (traj,) = _run("ragen/SimpleSokoban-v0", tiny_tokenizer, [3], enable_think=False)
    conv = traj.samples[0].conversation
    assert traj.success
    assert conv.messages[2]["content"] == "<answer>" + render_response(
        expert_turn_for_seed(3), False
    )


def expert_turn_for_seed(seed):
    env = gym.make("ragen/SimpleSokoban-v0")
    env.reset(seed=seed)
    return expert_turn(env, 2)


class _Grid:
    action_names = ("Up", "Down", "Left", "Right")


def test_a_lapse_draws_every_action_of_the_turn_and_the_reasoning_names_them():
    import random

    from ragen_lightning.sft.experts import lapse

    turn = ExpertTurn("box is below target, left of me; I go Down, Right", ("Down", "Right"))
    assert lapse(turn, _Grid(), random.Random(0), 0.0) is turn
    # random.Random(3): uniform 0.238, then the choices Down, Left
    lapsed = lapse(turn, _Grid(), random.Random(3), 1.0)
    assert lapsed == ExpertTurn(
        "box is below target, left of me; I go Down, Left", ("Down", "Left")
    )
    assert lapse(turn, _Grid(), random.Random(3), 0.3) == lapsed  # 0.238 < 0.3: lapses
    assert lapse(turn, _Grid(), random.Random(3), 0.2) is turn  # 0.238 >= 0.2: the expert's own
    # a reasoning that does not end with the actions is kept
    odd = ExpertTurn("thinking", ("Up",))
    assert lapse(odd, _Grid(), random.Random(1), 1.0).reasoning == "thinking"
    with pytest.raises(ConfigError, match="expert_noise needs an env with discrete actions"):
        lapse(odd, object(), random.Random(1), 1.0)


def test_an_imperfect_experts_demonstrations_do_not_depend_on_batching(tiny_tokenizer):
    from ragen_lightning.sft.module import build_demonstrations

    def build(noise, chunk):
        return build_demonstrations(
            "ragen/SimpleSokoban-v0",
            tiny_tokenizer,
            SOKOBAN_SEEDS,
            episode=EpisodeSettings(),
            chunk=chunk,
            expert_noise=noise,
        )

    clean, clean_stats = build(0.0, 8)
    noisy, noisy_stats = build(0.5, 8)
    assert noisy == build(0.5, 3)[0]  # the same episodes in chunks of 3
    assert clean_stats["demo/expert_success_rate"] == 1.0  # every seed here fits the budget
    assert noisy_stats["demo/expert_success_rate"] < 1.0 and noisy != clean
    with pytest.raises(ValueError, match=r"noise must be in \[0, 1\]"):
        ExpertEngine(tiny_tokenizer, EpisodeSettings(), noise=-0.1)
