"""The tool-call action format (``--data.episode.action_format tool_call``): parsing, rendering
through Qwen2.5's chat template, tool messages token-in/token-out, SearchQA and WebShop episodes,
refusals."""

from __future__ import annotations

import json

import pytest

import envs  # noqa: F401  (registers the ids)
from envs.tools.search.env import TOOLS as SEARCH_TOOLS
from envs.tools.webshop.env import TOOLS as SHOP_TOOLS
from ragen_lightning.errors import ConfigError
from ragen_lightning.rollout.engine import Generation, SamplingParams
from ragen_lightning.rollout.runner import RolloutRunner
from ragen_lightning.rollout.settings import EpisodeSettings
from ragen_lightning.rollout.tokens import ChatTokens
from ragen_lightning.rollout.tool_calls import (
    action_as_call,
    call_block,
    parse_tool_calls,
    tool_schemas,
)
from ragen_lightning.sft.experts import collect_demonstrations

TOOL = EpisodeSettings(
    action_format="tool_call",
    max_turns=3,
    max_actions_per_turn=1,
    max_actions_per_episode=3,
    max_new_tokens=200,
    max_model_len=8192,
)
SEARCH = '<tool_call>\n{"name": "search", "arguments": {"query": "Paris"}}\n</tool_call>'


def parse(text, *, think=True, k=2, tools=SEARCH_TOOLS):
    return parse_tool_calls(
        text, tools, prefix="<think>" if think else "", enable_think=think, max_actions_per_turn=k
    )


# ---------------------------------------------------------------------------------------------------- parsing


def test_a_call_after_the_reasoning_becomes_the_env_action():
    p = parse(" I look it up.</think>\n" + SEARCH)
    assert (
        p.actions == ("search[Paris]",)
        and p.format_ok
        and p.num_proposed == 1
        and p.think == "I look it up."
    )


def test_calls_beyond_the_turn_budget_are_counted_not_run():
    finish = '<tool_call>{"name": "finish", "arguments": {"answer": "France"}}</tool_call>'
    p = parse("x</think>" + SEARCH + "\n" + finish + SEARCH, k=2)
    assert p.actions == ("search[Paris]", "finish[France]") and p.num_proposed == 3


@pytest.mark.parametrize(
    "inner",
    [
        '{"name": "search", "arguments": {"query": "Paris"}',  # malformed JSON
        '{"name": "browse", "arguments": {"query": "Paris"}}',  # unknown tool
        '{"name": "search", "arguments": {"query": "Paris", "k": "3"}}',  # an extra argument
        '{"name": "search", "arguments": {"q": "Paris"}}',  # the wrong argument
        '{"name": "search", "arguments": {"query": 3}}',  # not a string
        '{"name": "search", "arguments": {}}',  # missing
        '{"name": "search"}',  # no arguments
        # arguments as a string, not an object
        '{"name": "search", "arguments": "{\\"query\\": \\"Paris\\"}"}',
        '{"name": "search", "arguments": {"query": "Paris"}, "id": 1}',  # an extra key
        '["search", {"query": "Paris"}]',  # not an object
        "[" * 100_000,  # nesting past the recursion limit
    ],
)
def test_an_invalid_call_is_an_invalid_action(inner):
    p = parse("x</think><tool_call>" + inner + "</tool_call>")
    assert p.actions == (None,) and p.format_ok and p.num_proposed == 1


def test_an_unclosed_block_is_one_invalid_call_and_ends_the_parse():
    p = parse(
        "x</think>" + SEARCH + "<tool_call>" + SEARCH[len("<tool_call>") : -len("</tool_call>")]
    )
    assert p.actions == ("search[Paris]", None) and p.num_proposed == 2


@pytest.mark.parametrize(
    "text", ["no reasoning close " + SEARCH, "x</think> just text", "", "<tool_call></think>"]
)
def test_no_call_after_closed_reasoning_is_a_format_error(text):
    p = parse(text)
    assert p.actions == () and not p.format_ok


def test_without_thinking_the_calls_stand_alone():
    assert parse(SEARCH, think=False).actions == ("search[Paris]",)
    # a call inside the reasoning does not count with thinking on
    assert parse(SEARCH + "</think>").actions == ()


def test_expert_actions_round_trip_through_call_blocks():
    for action, tools in [
        ("search[capital of France]", SEARCH_TOOLS),
        ("finish[Paris]", SEARCH_TOOLS),
        ("click[buy now]", SHOP_TOOLS),
        ("click[< prev]", SHOP_TOOLS),
        ("search[shampoo sulfate free]", SHOP_TOOLS),
    ]:
        block = action_as_call(action, tools)
        assert parse("x</think>" + block, tools=tools).actions == (action,)
    assert action_as_call("finish[Paris]", SEARCH_TOOLS) == (
        '<tool_call>\n{"name": "finish", "arguments": {"answer": "Paris"}}\n</tool_call>'
    )
    with pytest.raises(ValueError, match="matches none of the tools"):
        action_as_call("click[x]", SEARCH_TOOLS)


def test_call_block_writes_qwens_format():
    assert (
        call_block("click", {"target": "b0"})
        == '<tool_call>\n{"name": "click", "arguments": {"target": "b0"}}\n</tool_call>'
    )


# ---------------------------------------------------------------------------------------------- chat template


def test_qwen_template_puts_the_tools_in_the_system_message(qwen_tokenizer):
    chat = ChatTokens(qwen_tokenizer).with_tools(tool_schemas(SEARCH_TOOLS))
    text = qwen_tokenizer.decode(chat.start("SYS", "Q").input_ids)
    schemas = "\n".join(json.dumps(s) for s in tool_schemas(SEARCH_TOOLS))
    assert text.startswith("<|im_start|>system\nSYS\n\n# Tools\n\n")
    assert f"<tools>\n{schemas}\n</tools>" in text
    assert text.endswith("<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\n<think>")


def test_tool_message_glue_is_derived_from_the_template(qwen_tokenizer):
    chat = ChatTokens(qwen_tokenizer, enable_think=False).with_tools(tool_schemas(SEARCH_TOOLS))
    assert chat._tool_glue == (
        "<|im_start|>user\n<tool_response>\n",
        "\n</tool_response>\n<tool_response>\n",
        "\n</tool_response><|im_end|>\n<|im_start|>assistant\n",
    )
    # no thinking: the model opens its own <tool_call>
    assert chat.prefix == "" and chat.prefix_ids == []
    conv = chat.start("S", "U")
    chat.add_response(conv, qwen_tokenizer.encode(SEARCH) + [qwen_tokenizer.eos_token_id])
    chat.add_tools(conv, ["first result", "second"])
    assert qwen_tokenizer.decode(conv.input_ids).endswith(
        SEARCH
        + "<|im_end|>\n<|im_start|>user\n<tool_response>\nfirst result\n</tool_response>\n<tool_response>\n"
        "second\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    )
    assert not chat.drift(conv)


def test_a_template_that_ignores_tools_is_refused(tiny_tokenizer):
    with pytest.raises(
        ValueError, match="ignores tools=.*--data.episode.action_format tool_call.*tiny:qwen"
    ):
        ChatTokens(tiny_tokenizer).with_tools(tool_schemas(SEARCH_TOOLS))


def test_an_env_without_tools_is_refused_in_the_tool_call_format(qwen_tokenizer):
    with pytest.raises(
        ConfigError,
        match=r"^--data.episode.action_format tool_call: ragen/SimpleSokoban-v0 declares "
        r"no tools",
    ):
        RolloutRunner(
            "ragen/SimpleSokoban-v0",
            None,
            ChatTokens(qwen_tokenizer),
            _Scripted(qwen_tokenizer, []),
            TOOL,
        )


# -------------------------------------------------------------------------------------------------- episodes


class _Scripted:
    """Answers turn t of every episode with ``texts[t]`` (+ eos)."""

    def __init__(self, tok, texts):
        self.tok, self.texts, self.turn = tok, texts, 0

    def generate(self, prompts, params, seeds=None, **kw):
        ids = self.tok.encode(self.texts[self.turn], add_special_tokens=False) + [
            self.tok.eos_token_id
        ]
        self.turn += 1
        return [Generation(list(ids), [-0.5] * len(ids), "stop") for _ in prompts]

    def sync_weights(self):
        pass


def test_searchqa_episode_acts_through_tool_calls_and_gets_tool_messages(qwen_tokenizer):
    texts = [
        " I search.</think>\n" + SEARCH,
        " Bad JSON.</think>\n<tool_call>{oops</tool_call>",
        ' Done.</think>\n<tool_call>\n{"name": "finish", "arguments": {"answer": "x"}}\n</tool_call>',
    ]
    runner = RolloutRunner(
        "ragen/SearchQA-v0",
        None,
        ChatTokens(qwen_tokenizer),
        _Scripted(qwen_tokenizer, texts),
        TOOL,
    )
    (traj,) = runner.run([3], 1, SamplingParams(max_new_tokens=200))
    runner.close()
    assert [i["actions"] for i in traj.turn_info] == [["search[Paris]"], [], ["finish[x]"]]
    assert [i["penalty"] for i in traj.turn_info] == [
        0.0,
        -0.1,
        0.0,
    ] and traj.num_format_errors == 1
    conv = traj.samples[0].conversation
    roles = [m["role"] for m in conv.messages]
    # the search's result comes back as a tool message; after the malformed call, a user message
    # with the warning
    assert roles == ["system", "user", "assistant", "tool", "assistant", "user", "assistant"]
    assert (
        conv.messages[3]["content"].startswith("Reward:\n")
        and "Turn 2:" in conv.messages[3]["content"]
    )
    assert (
        conv.messages[5]["content"].startswith("Reward:\n")
        and "No valid action provided" in conv.messages[5]["content"]
    )
    # the instruction line asks for a call block
    assert "<tool_call>" in conv.messages[3]["content"]
    assert not runner.chat.drift(conv)


@pytest.mark.parametrize("env_id", ["ragen/SearchQA-v0", "ragen/WebShop-v0"])
def test_expert_demonstrations_in_the_tool_call_format(qwen_tokenizer, env_id):
    trajs = collect_demonstrations(env_id, qwen_tokenizer, [0, 1], episode=TOOL)
    chat = ChatTokens(qwen_tokenizer).with_tools(
        tool_schemas(SEARCH_TOOLS if "Search" in env_id else SHOP_TOOLS)
    )
    for t in trajs:
        assert t.num_format_errors == 0 and all(i["actions"] for i in t.turn_info)
        conv = t.samples[0].conversation
        assert "tool" in [m["role"] for m in conv.messages[2:]] or t.num_turns == 1
        assert "<tool_call>\n{" in conv.messages[2]["content"] and not chat.drift(conv)


def test_the_api_engine_is_refused_in_the_tool_call_format(qwen_tokenizer):
    engine = _Scripted(qwen_tokenizer, [])
    engine.needs_messages = True  # text-in/text-out engines get the messages, not the tools
    with pytest.raises(
        ConfigError, match=r"^--data.episode.action_format tool_call: the API engine"
    ):
        RolloutRunner("ragen/SearchQA-v0", None, ChatTokens(qwen_tokenizer), engine, TOOL)


def test_a_limited_window_after_tool_turns_opens_with_a_user_message(qwen_tokenizer):
    texts = [" a</think>\n" + SEARCH, " b</think>\n" + SEARCH, " c</think>\n" + SEARCH]
    episode = EpisodeSettings(**{**TOOL.__dict__, "context_window": "limited", "window_turns": 2})
    runner = RolloutRunner(
        "ragen/SearchQA-v0",
        None,
        ChatTokens(qwen_tokenizer),
        _Scripted(qwen_tokenizer, texts),
        episode,
    )
    (traj,) = runner.run([3], 1, SamplingParams(max_new_tokens=200))
    runner.close()
    roles = [[m["role"] for m in s.conversation.messages] for s in traj.samples]
    # turn 1 alone; turn 2: turn 1 replayed, its result as a tool message; turn 3: the window starts
    # at turn 2, whose opening tool results become its user text, then turn 2's result as a tool
    # message
    assert roles == [
        ["system", "user", "assistant"],
        ["system", "user", "assistant", "tool", "assistant"],
        ["system", "user", "assistant", "tool", "assistant"],
    ]
    assert "Turn 2:" in traj.samples[2].conversation.messages[1]["content"]
    assert not any(runner.chat.drift(s.conversation) for s in traj.samples)
