from dataclasses import dataclass

import pytest

from ragen_lightning.rollout import prompting as P


@dataclass
class Spec:
    instruction: str = "Push boxes."
    action_names: tuple = ("Up", "Down", "Left", "Right")
    symbols: tuple = (("#", "wall"), ("P", "player"))


def test_system_prompt_has_legend_actions_and_budget():
    text = P.system_prompt(Spec(), max_actions_per_episode=10)
    assert text == (
        "You're a helpful assistant. Push boxes."
        "\nThe meaning of each symbol in the state is:\n#: wall, P: player"
        "\nYour available actions are:\nUp, Down, Left, Right"
        '\nYou can make up to 10 actions, separated by the action separator " || "\n'
    )


def test_system_prompt_free_text_env_has_no_action_list():
    assert (
        P.system_prompt(Spec(action_names=(), symbols=()), 1)
        == "You're a helpful assistant. Push boxes."
    )


def test_turn_block_matches_ragen_format_and_warning():
    block = P.turn_block(2, "S", P.instruction_line(8, max_response_tokens=100, warn_invalid=True))
    assert block == (
        "\nTurn 2:\nState:\nS\nNo valid action provided previously. Environment state remains the same. "
        "Please try again.\nYou have 8 actions left. Always output: <think> [Your thoughts] </think> "
        "<answer> [your answer] </answer> with no extra text. Strictly follow this format. "
        "Max response length: 100 words (tokens).\n"
    )
    assert "<think>" not in P.instruction_line(1, max_response_tokens=5, enable_think=False)


def test_turn_block_observation_last_moves_only_the_state():
    instruction = P.instruction_line(4, max_response_tokens=48, warn_invalid=True)
    ragen = P.turn_block(3, "#P_\n_G_", instruction)
    last = P.turn_block(3, "#P_\n_G_", instruction, observation_last=True)
    state = "State:\n#P_\n_G_\n"
    # same lines, the state moved behind the instruction line
    assert last == ragen.replace(state, "") + state
    assert last.startswith("\nTurn 3:\nNo valid action provided previously.") and last.endswith(
        "\n_G_\n"
    )


@pytest.mark.parametrize(
    "reward, text", [(-0.1 * 3, "Reward:\n-0.3\n"), (0, "Reward:\n0\n"), (10.0, "Reward:\n10\n")]
)
def test_reward_text_rounds_float_noise(reward, text):
    assert P.reward_text(reward) == text


def test_parse_well_formed_with_think():
    # the model was primed with "<think>", so its text starts inside the think block
    r = P.parse_response(
        " box is above </think> <answer> Up || Left || Down </answer>junk", max_actions_per_turn=2
    )
    assert r.format_ok and r.think == "box is above" and r.answer == "Up || Left || Down"
    assert r.actions == ("Up", "Left") and r.num_proposed == 3


@pytest.mark.parametrize(
    "text",
    [
        "no tags at all",
        "thinking</think>no answer tags",
        "</think><answer>Up",  # unclosed answer
        "",
    ],
)
def test_parse_malformed_gives_no_actions(text):
    r = P.parse_response(text)
    assert not r.format_ok and r.actions == () and r.num_proposed == 0


def test_parse_without_think_and_unicode():
    r = P.parse_response(" Réponse ✓ || Left </answer>", enable_think=False, max_actions_per_turn=5)
    assert r.actions == ("Réponse ✓", "Left") and r.think == ""


def test_parse_strips_chat_markers_and_empty_actions():
    r = P.parse_response("x</think><answer><|im_end|> || Up ||  || </answer>")
    assert r.actions == ("Up",) and r.num_proposed == 1


def test_parse_rejects_bad_cap():
    with pytest.raises(ValueError, match="max_actions_per_turn"):
        P.parse_response("x", max_actions_per_turn=0)


def test_map_actions_case_insensitive_and_unknown():
    assert P.map_actions(["up", "LEFT", "jump"], ("Up", "Down", "Left", "Right")) == [0, 2, None]
    assert P.map_actions(["3 + 4"], ()) == ["3 + 4"]


@pytest.mark.parametrize(
    "valid, parsed, penalty", [(2, 2, 0.0), (1, 2, -0.1), (0, 0, -0.1), (0, 1, -0.1)]
)
def test_format_penalty(valid, parsed, penalty):
    assert P.turn_format_penalty(valid, parsed) == penalty
