"""The prompt of each turn of a :class:`~ragen_lightning.rollout.runner.RolloutRunner` episode, per
context mode (``EpisodeSettings.context_window``; the runner's module docstring, "Context modes"):
the user message that opens the turn, and the prompt ids it makes within ``max_model_len``."""

from __future__ import annotations

from ragen_lightning.rollout import prompting
from ragen_lightning.rollout.episodes import Episode
from ragen_lightning.rollout.settings import EpisodeSettings
from ragen_lightning.rollout.tokens import ChatTokens


def user_message(
    ep: Episode, turn: int, announce: int, settings: EpisodeSettings, *, tools: bool
) -> str | tuple[str, ...]:
    """The message that opens ``turn`` of ``ep``: the turn block (``announce``: the response length
    its instruction states) after the history summary (``single_turn``) or the previous turn's
    reward; in the tool-call format (``tools``) after a turn whose calls ran, a tuple: one tool
    message per call, the last one the text."""
    block = _turn_block(ep, turn, announce, settings, tools)
    if settings.context_window == "single_turn":
        return _memory_summary(ep, turn, settings) + block
    if not ep.turns:
        return block
    # feedback of the previous turn opens it
    text = prompting.reward_text(ep.turns[-1].reward) + block
    observations = ep.turns[-1].observations
    if tools and observations:
        # tool-call format: one tool message per executed call; each holds the observation after
        # its call, the last one this turn's usual text (reward, turn block with the state)
        return (*observations[:-1], text)
    return text


def _turn_block(
    ep: Episode, turn: int, announce: int, settings: EpisodeSettings, tools: bool
) -> str:
    instruction = prompting.instruction_line(
        ep.actions_left,
        max_response_tokens=announce,
        enable_think=settings.enable_think,
        warn_invalid=ep.warn_invalid,
        tool_calls=tools,
    )
    return prompting.turn_block(
        turn, ep.obs, instruction, observation_last=settings.observation_last
    )


def _memory_summary(ep: Episode, turn: int, settings: EpisodeSettings) -> str:
    window = settings.window_turns
    shown = ep.turns[-(window - 1) :] if window > 1 else []
    if not shown:
        return f"Current Turn (Turn {turn}):" if ep.turns else ""
    first = turn - len(shown)
    lines = [
        (
            f"Summary: {turn - 1} step(s) completed so far. Showing the last {len(shown)} turn(s) with "
            "state/action/reward details. Recent turns:\n---\n"
        )
    ]
    for i, t in enumerate(shown, start=first):
        lines.append(
            f"Turn {i} State:\n{t.state}\nTurn {i} Action: {t.response}\n"
            f"Turn {i} Reward: {prompting.reward_text(t.reward)[len('Reward:') :].strip()}\n---\n"
        )
    lines.append(f"\nCurrent Turn (Turn {turn}):")
    return "".join(lines)


def prompt_ids(
    ep: Episode,
    user: str | tuple[str, ...],
    response_cap: int,
    settings: EpisodeSettings,
    chat: ChatTokens,
) -> list[int] | None:
    """The next prompt's ids (``ep.conv`` set to its conversation), or None (and nothing changed)
    when prompt + a ``response_cap``-token response (the sampling cap of the run) would exceed
    ``max_model_len``. ``full``: ``user`` joins the running conversation; otherwise a fresh one of
    the system message, the window's earlier turns (``limited``: replayed with loss mask 0) and
    ``user``."""
    budget = settings.max_model_len - response_cap
    if settings.context_window == "full":
        if ep.conv is None:
            conv = chat.start(ep.system, user)
            if len(conv) > budget:
                return None
            ep.conv = conv
        else:
            if len(ep.conv) + len(chat.next_message_ids(ep.conv, user)) > budget:
                return None
            chat.add_message(ep.conv, user)
        return list(ep.conv.input_ids)
    limited = settings.context_window == "limited" and settings.window_turns > 1
    window = ep.turns[-(settings.window_turns - 1) :] if limited else []
    users = [t.user for t in window] + [user]
    # a window that opens after a tool-call turn opens with that turn's text as the user message
    # (a conversation starts with one; the tool results before it are outside the window)
    conv = chat.start(ep.system, users[0] if isinstance(users[0], str) else users[0][-1])
    for prev, next_user in zip(window, users[1:]):
        chat.add_response(conv, prev.sampled, trainable=False)
        chat.add_message(conv, next_user)
    if len(conv) > budget:
        return None
    ep.conv = conv
    return list(conv.input_ids)
