"""Tool calls as the action format (``--data.episode.action_format tool_call``): pure functions, no
tokenizer.

An env that declares tools (``PromptSpec.tools``: name, one string argument, and the action string a
call becomes, e.g. ``search`` + ``{"query": "x"}`` -> ``search[x]``) has them offered through the
chat template's ``tools=`` list, and the model acts by writing Qwen2.5's / Hermes' blocks::

    <think> ... </think>
    <tool_call>
    {"name": "search", "arguments": {"query": "capital of France"}}
    </tool_call>

The result of each executed call goes back as a ``tool`` message (the runner;
``ChatTokens.tool_ids``). A block that is not a well-formed call of a declared tool with exactly its
one string argument is an invalid action: the turn gets the format penalty, never an exception.
Parsing is linear in the text (every scan moves forward; JSON nesting deeper than Python's recursion
limit is caught like any other malformed JSON).

The env object is duck-typed (tools with ``name``, ``argument``, ``action`` and ``schema()``), so
this module does not import ``envs``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, Protocol

from ragen_lightning.rollout.prompting import (
    THINK_CLOSE,
    THINK_OPEN,
    TOOL_CALL_CLOSE,
    TOOL_CALL_OPEN,
    ParsedResponse,
)


class ToolLike(Protocol):
    name: str
    argument: str
    action: str

    def schema(self) -> dict[str, Any]: ...


def tool_schemas(tools: Sequence[ToolLike]) -> list[dict[str, Any]]:
    """The chat template's ``tools`` list (OpenAI function format) of an env's tools."""
    return [t.schema() for t in tools]


def call_block(name: str, arguments: dict[str, Any]) -> str:
    """One call as the model writes it (Qwen2.5's format: the JSON on its own line inside the
    tags)."""
    return f"{TOOL_CALL_OPEN}\n{json.dumps({'name': name, 'arguments': arguments}, ensure_ascii=False)}\n{TOOL_CALL_CLOSE}"


def action_as_call(action: str, tools: Sequence[ToolLike]) -> str:
    """The call block that :func:`parse_tool_calls` turns into the env action string ``action``
    (expert demonstrations in the tool-call format). Raises ``ValueError`` when no tool's action
    pattern matches it."""
    for tool in tools:
        head, tail = tool.action.split("{}", 1)
        if (
            action.startswith(head)
            and action.endswith(tail)
            and len(action) >= len(head) + len(tail)
        ):
            return call_block(
                tool.name, {tool.argument: action[len(head) : len(action) - len(tail)]}
            )
    raise ValueError(f"action {action!r} matches none of the tools {[t.name for t in tools]}")


def call_action(block: str, tools: Sequence[ToolLike]) -> str | None:
    """The env action string of one block's inner text, or None when it is not a valid call: JSON
    object with exactly the keys ``name`` (a declared tool) and ``arguments`` (an object holding
    exactly that tool's one argument, a string)."""
    try:
        call = json.loads(block)
    except (ValueError, RecursionError):
        return None
    if not isinstance(call, dict) or set(call) != {"name", "arguments"}:
        return None
    tool = next((t for t in tools if t.name == call["name"]), None)
    args = call["arguments"]
    if tool is None or not isinstance(args, dict) or set(args) != {tool.argument}:
        return None
    value = args[tool.argument]
    return tool.action.format(value) if isinstance(value, str) else None


def _split_reasoning(full: str, enable_think: bool) -> tuple[str, str] | None:
    """``(reasoning, calls region)``: thinking on, the text between ``<think>`` and the first
    ``</think>`` after it and the text after that; thinking off, ``("", full)``. None when the
    reasoning is not closed."""
    if not enable_think:
        return "", full
    start = full.find(THINK_OPEN)
    close = full.find(THINK_CLOSE, start + len(THINK_OPEN)) if start >= 0 else -1
    return (
        None
        if close < 0
        else (full[start + len(THINK_OPEN) : close], full[close + len(THINK_CLOSE) :])
    )


def parse_tool_calls(
    text: str,
    tools: Sequence[ToolLike],
    *,
    prefix: str,
    enable_think: bool = True,
    max_actions_per_turn: int = 2,
) -> ParsedResponse:
    """Parse the decoded assistant text (after the generation ``prefix``, which is prepended) into
    env actions.

    ``actions`` holds one entry per proposed call, in order, at most ``max_actions_per_turn``: the
    env action string of a valid call, None for an invalid one (malformed JSON, unknown tool, wrong
    or non-string arguments, a block never closed); ``num_proposed`` counts every block.
    ``format_ok`` is True when the reasoning (thinking on) is closed and at least one block opens
    after it. ``answer`` is the text of the calls region.
    """
    if max_actions_per_turn < 1:
        raise ValueError(f"max_actions_per_turn must be >= 1, got {max_actions_per_turn}")
    split = _split_reasoning(prefix + text, enable_think)
    if split is None:
        return ParsedResponse("", "", (), False, 0)
    think, region = split
    actions: list[str | None] = []
    pos = region.find(TOOL_CALL_OPEN)
    while pos >= 0:
        end = region.find(TOOL_CALL_CLOSE, pos + len(TOOL_CALL_OPEN))
        if end < 0:  # an unclosed block: one invalid call, and nothing after it can be a block
            actions.append(None)
            break
        actions.append(call_action(region[pos + len(TOOL_CALL_OPEN) : end], tools))
        pos = region.find(TOOL_CALL_OPEN, end + len(TOOL_CALL_CLOSE))
    return ParsedResponse(
        think.strip(),
        region.strip(),
        tuple(actions[:max_actions_per_turn]),
        bool(actions),
        len(actions),
    )
