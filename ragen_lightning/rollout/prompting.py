"""Prompt text and response parsing for multi-turn agent episodes (pure functions, no tokenizer).

Follows RAGEN's context manager (system prompt, per-turn user blocks, ``<think>``/``<answer>``
parsing, ``||`` action separator, per-turn format penalty) with two deliberate departures:

* the symbol legend and the action list come from the env's own :class:`~envs.base.PromptSpec`-like
  data, so a variant with a different grid vocabulary shows its real legend (RAGEN shows the default
  one);
* the parsed response is never re-rendered into training text: the trainer keeps the sampled token
  ids (``rollout/tokens.py``); :class:`ParsedResponse` only says which actions to execute.

The env object is duck-typed (anything with ``instruction``, ``action_names`` and ``symbols``), so
this module does not import ``envs``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

SYSTEM_PREFIX = "You're a helpful assistant. "
THINK_OPEN, THINK_CLOSE, ANSWER_OPEN, ANSWER_CLOSE = "<think>", "</think>", "<answer>", "</answer>"
TAG_TOKENS = (THINK_OPEN, THINK_CLOSE, ANSWER_OPEN, ANSWER_CLOSE)
# the tool-call action format (rollout/tool_calls.py)
TOOL_CALL_OPEN, TOOL_CALL_CLOSE = "<tool_call>", "</tool_call>"
ACTION_SEP = "||"
FORMAT_PENALTY = -0.1
INVALID_ACTION_WARNING = (
    "No valid action provided previously. Environment state remains the same. Please try again.\n"
)

_ANSWER_AFTER_THINK = re.compile(r"\s*<answer>")
# strings stripped from the parsed parts (tags and the chat markers a model may emit as text)
_STRIP_STRINGS = (*TAG_TOKENS, "<|im_start|>", "<|im_end|>", "<|endoftext|>")


class PromptSpecLike(Protocol):
    instruction: str
    action_names: tuple[str, ...]
    symbols: tuple[tuple[str, str], ...]


def format_prompt(enable_think: bool = True, tool_calls: bool = False) -> str:
    """The answer-format reminder of every turn block (``tool_calls``: the tool-call action
    format)."""
    answer = (
        f'{TOOL_CALL_OPEN} {{"name": <function-name>, "arguments": <args-json-object>}} {TOOL_CALL_CLOSE}'
        if tool_calls
        else "<answer> [your answer] </answer>"
    )
    return f"<think> [Your thoughts] </think> {answer}" if enable_think else answer


def generation_prefix(enable_think: bool = True, tool_calls: bool = False) -> str:
    """Text the assistant turn is primed with (given to the model, never trained on): ``<think>``
    with thinking on; else ``<answer>``, or nothing in the tool-call format (the model opens its
    ``<tool_call>`` blocks itself)."""
    return THINK_OPEN if enable_think else "" if tool_calls else ANSWER_OPEN


def system_prompt(
    spec: PromptSpecLike, max_actions_per_episode: int | None = None, tool_calls: bool = False
) -> str:
    """RAGEN's system message: instruction, symbol legend, action list and the action budget line.

    Args:
        spec: the env's prompt data (instruction, action names, legend).
        max_actions_per_episode: the episode's action budget shown in the prompt; omitted when None.
        tool_calls: the tool-call action format: the env's ``tool_instruction`` when it has one (the
        tools
            themselves are rendered by the chat template).
    """
    instruction = getattr(spec, "tool_instruction", None) if tool_calls else None
    text = SYSTEM_PREFIX + (instruction or spec.instruction)
    if spec.symbols:
        text += "\nThe meaning of each symbol in the state is:\n" + ", ".join(
            f"{s}: {m}" for s, m in spec.symbols
        )
    if spec.action_names:
        text += "\nYour available actions are:\n" + ", ".join(spec.action_names)
        if max_actions_per_episode is not None:
            text += (
                f"\nYou can make up to {max_actions_per_episode} actions, separated by the action separator "
                f'" {ACTION_SEP} "\n'
            )
    return text


def instruction_line(
    actions_left: int,
    *,
    max_response_tokens: int,
    enable_think: bool = True,
    warn_invalid: bool = False,
    tool_calls: bool = False,
) -> str:
    """The per-turn instruction: the invalid-action warning (when due), actions left, answer format,
    length."""
    return (
        f"{INVALID_ACTION_WARNING if warn_invalid else ''}You have {actions_left} actions left. "
        f"Always output: {format_prompt(enable_think, tool_calls)} with no extra text. Strictly follow this format. "
        f"Max response length: {max_response_tokens} words (tokens).\n"
    )


def turn_block(turn: int, state: str, instruction: str, *, observation_last: bool = False) -> str:
    """The per-turn user block (``turn`` is 1-based; ``instruction`` from :func:`instruction_line`):
    RAGEN's order (state, then the instruction), or with ``observation_last`` the instruction first,
    so the state is what the response follows."""
    if observation_last:
        return f"\nTurn {turn}:\n{instruction}State:\n{state}\n"
    return f"\nTurn {turn}:\nState:\n{state}\n{instruction}"


def reward_text(reward: float) -> str:
    """Feedback prepended to the next turn block: the summed env reward of the previous turn."""
    return f"Reward:\n{_number(reward)}\n"


def _number(x: float) -> str:
    # 0.1 * 3 prints as 0.30000000000000004 in Python; rewards are shown rounded like a human would
    # write them
    r = round(float(x), 6)
    return str(int(r)) if r == int(r) else repr(r)


@dataclass(frozen=True)
class ParsedResponse:
    """What the env gets out of one assistant turn.

    Attributes:
        think: the reasoning text (empty when missing or thinking is off).
        answer: the raw answer text between the answer tags ('' when the format did not match).
        actions: the parsed action strings, at most ``max_actions_per_turn`` of them (tool-call
        format: None for a
            call that is not a valid call of a declared tool, :func:`~ragen_lightning.rollout.tool_calls.parse_tool_calls`).
        format_ok: the response matched the required tag format. num_proposed: how many actions the
        answer proposed before truncation to ``max_actions_per_turn``.
    """

    think: str
    answer: str
    actions: tuple[str, ...]
    format_ok: bool
    num_proposed: int


def _clean(text: str) -> str:
    for s in _STRIP_STRINGS:
        text = text.replace(s, "")
    return text.strip()


def _match_think_answer(full: str) -> tuple[str, str] | None:
    """The groups of ``re.search(r"<think>(.*?)</think>\\s*<answer>(.*?)</answer>", full, re.DOTALL)``, in linear time.

    The regex backtracks from every ``<think>`` over every later ``</think>``: quadratic on repeated tags (100 KB of
    ``<think></think>`` took > 20 s). Whether a ``</think>`` at ``j`` can close the match does not depend on where
    the match starts (``\\s*<answer>`` must follow it, and some ``</answer>`` must follow that), so the leftmost
    ``<think>`` with a usable ``</think>`` after it is the first ``<think>``, closed by the first usable
    ``</think>``. The whitespace runs scanned after different ``</think>`` never overlap: one pass in all.
    """
    start = full.find(THINK_OPEN)
    last_close = full.rfind(ANSWER_CLOSE)
    if start < 0 or last_close < 0:
        return None
    j = full.find(THINK_CLOSE, start + len(THINK_OPEN))
    while 0 <= j < last_close:
        m = _ANSWER_AFTER_THINK.match(full, j + len(THINK_CLOSE))
        if m is not None and m.end() <= last_close:
            return full[start + len(THINK_OPEN) : j], full[
                m.end() : full.find(ANSWER_CLOSE, m.end())
            ]
        j = full.find(THINK_CLOSE, j + 1)
    return None


def _match_answer(full: str) -> str | None:
    """The group of ``re.search(r"<answer>(.*?)</answer>", full, re.DOTALL)``, in linear time (the
    regex is quadratic on many ``<answer>`` without a ``</answer>``)."""
    start = full.find(ANSWER_OPEN)
    if start < 0:
        return None
    end = full.find(ANSWER_CLOSE, start + len(ANSWER_OPEN))
    return None if end < 0 else full[start + len(ANSWER_OPEN) : end]


def parse_response(
    text: str, *, enable_think: bool = True, max_actions_per_turn: int = 2
) -> ParsedResponse:
    """Parse the decoded assistant text (without the generation prefix) into actions.

    The generation prefix (``<think>`` or ``<answer>``) was given to the model, so it is prepended
    before matching. The first match wins; anything after ``</answer>`` is ignored. No match gives
    no actions. Runs in time linear in ``len(text)`` (any model text is judged in bounded time).
    """
    if max_actions_per_turn < 1:
        raise ValueError(f"max_actions_per_turn must be >= 1, got {max_actions_per_turn}")
    full = generation_prefix(enable_think) + text
    if enable_think:
        groups = _match_think_answer(full)
        if groups is None:
            return ParsedResponse("", "", (), False, 0)
        think, answer = _clean(groups[0]), _clean(groups[1])
    else:
        found = _match_answer(full)
        if found is None:
            return ParsedResponse("", "", (), False, 0)
        think, answer = "", _clean(found)
    proposed = [a.strip() for a in answer.split(ACTION_SEP) if a.strip()]
    return ParsedResponse(
        think, answer, tuple(proposed[:max_actions_per_turn]), True, len(proposed)
    )


def map_actions(actions: Sequence[str], action_names: Sequence[str]) -> list[int | str | None]:
    """Map action words to env action indices (case-insensitive); unknown words map to None.

    Free-text envs (no ``action_names``) take the answer string itself, so each action passes
    through unchanged.
    """
    if not action_names:
        return list(actions)
    lookup = {name.lower(): i for i, name in enumerate(action_names)}
    return [lookup.get(a.strip().lower()) for a in actions]


def turn_format_penalty(num_valid: int, num_parsed: int, penalty: float = FORMAT_PENALTY) -> float:
    """RAGEN's per-turn format penalty: charged once when any parsed action was invalid or none was
    valid."""
    return penalty if (num_valid == 0 or num_valid != num_parsed) else 0.0
