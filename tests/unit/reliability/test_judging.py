"""Model text is judged in bounded time: numbers with huge exponents, repeated tags, contradictory
puzzles, and a fuzz of adversarial outputs through the runner's parsing path for every registered
env.

The hang cases run in a killed-at-the-limit subprocess (``bounded.run_bounded``): before the fixes
each of them ran for minutes, so the test failed on its limit instead of blocking the suite. The
bounds are on CPU time (``time.process_time`` / ``time.thread_time``), not wall clock, so a machine
busy with other work (two test workers on two cores) does not fail them.
"""

from __future__ import annotations

import json
import re
import time

import gymnasium as gym
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import envs  # registers the ids
from envs.grid.sudoku.env import PUZZLE_SEARCH_BUDGET, SudokuEnv
from envs.text.metamathqa import (
    MAX_EXPONENT,
    MAX_NUMERAL_LENGTH,
    MetaMathQAEnv,
    answers_match,
)
from ragen_lightning.rollout import prompting
from ragen_lightning.rollout.engine import Generation, SamplingParams
from ragen_lightning.rollout.runner import RolloutRunner
from ragen_lightning.rollout.settings import EpisodeSettings
from ragen_lightning.rollout.tokens import ChatTokens
from tests.unit.envs.test_all_envs import kwargs as backend_kwargs
from tests.unit.reliability.bounded import run_bounded

HUGE_NUMERALS = ("1e999999999", "1e-999999999", "1e10000000")


# ------------------------------------------------------------------------------------------------ MetaMathQA


def test_metamathqa_huge_exponents_are_judged_in_under_a_second():
    # Before: Fraction(text) computed 10**exp, > 20 s for each (the first two ran for minutes).
    seconds = run_bounded(f"""
        import json, time
        from envs.text.metamathqa import MetaMathQAEnv, answers_match
        out = {{}}
        env = MetaMathQAEnv()
        for text in {HUGE_NUMERALS!r}:
            t = time.process_time()
            env.reset(options={{"index": 0}})  # label "117"
            step = env.step(text)
            out[text] = [time.process_time() - t, step[1], answers_match("117", text), answers_match(text, text)]
        print(json.dumps(out))
    """)
    for text in HUGE_NUMERALS:
        elapsed, reward, wrong_vs_huge_label, itself = seconds[text]
        assert elapsed < 1.0, (text, elapsed)
        # matches only its own string
        assert reward == 0.0 and wrong_vs_huge_label is False and itself is True


@pytest.mark.parametrize(
    "answer, label, match",
    [
        ("1e1000", "10e999", True),  # exponent at the bound: judged as numbers (10**1000 both)
        ("1e-1000", "0.1e-999", True),
        ("1e1001", "10e1000", False),  # beyond the bound: text only, and the texts differ
        ("1e1001", "1E1001", True),  # ... equal after lower-casing
        # 201 characters: text only
        ("1" * MAX_NUMERAL_LENGTH, "1" * MAX_NUMERAL_LENGTH + ".0", False),
        # 200 characters: a number
        ("1" * (MAX_NUMERAL_LENGTH - 2) + ".0", "1" * (MAX_NUMERAL_LENGTH - 2), True),
        ("1_000", "1000", True),  # Fraction's digit groups still parse
        ("1,000e2", "100000", False),  # thousands separators only without an exponent (unchanged)
    ],
)
def test_numeral_bounds(answer, label, match):
    assert MAX_EXPONENT == 1000 and MAX_NUMERAL_LENGTH == 200
    assert answers_match(answer, label) is match


@pytest.mark.parametrize("label", ["1e999999999", "-2.5E+1001", "3" * 201])
def test_metamathqa_label_beyond_the_judged_range_is_refused_at_load(tmp_path, label):
    path = tmp_path / "qa.jsonl"
    path.write_text(
        json.dumps({"question": "q1", "answer": "4"})
        + "\n"
        + json.dumps({"question": "q2", "answer": label})
        + "\n",
        encoding="utf-8",
    )
    refused = r"qa\.jsonl:2: answer '.*'(\.\.\.)? is a number beyond the judged range"
    with pytest.raises(ValueError, match=refused) as info:
        MetaMathQAEnv(path=path)
    assert "\n" not in str(info.value)


def test_metamathqa_label_at_the_bounds_loads(tmp_path):
    path = tmp_path / "qa.jsonl"
    path.write_text(json.dumps({"question": "q", "answer": "1e1000"}) + "\n", encoding="utf-8")
    env = MetaMathQAEnv(path=path)
    env.reset(options={"index": 0})
    assert env.step("10e999")[1] == 1.0


# ------------------------------------------------------------------------------------------------ parse_response

# (unit, repeats, enable_think): 100 KB inputs; the old regexes backtracked from every opening tag
# to
REPEATED = {
    # the end of the text (> 20 s for the first)
    "think_close_pairs": ("<think></think>", 6667, True),
    "think_opens": ("<think>", 14286, True),
    "pairs_then_answer_open": ("<think></think><answer>", 4348, True),
    "answer_opens": ("<answer>", 12500, False),
}


def test_parse_response_on_100kb_of_repeated_tags_is_under_a_second():
    seconds = run_bounded(f"""
        import json, time
        from ragen_lightning.rollout.prompting import parse_response
        out = {{}}
        for name, (unit, repeats, think) in {REPEATED!r}.items():
            text = unit * repeats
            t = time.process_time()
            r = parse_response(text, enable_think=think)
            out[name] = [time.process_time() - t, r.format_ok, len(text)]
        print(json.dumps(out))
    """)
    for name in REPEATED:
        elapsed, format_ok, size = seconds[name]
        assert size >= 100_000 and format_ok is False
        assert elapsed < 1.0, (name, elapsed)


# (text after the generation prefix, enable_think) -> (think, answer, actions), worked out by hand
# from the regexes r"<think>(.*?)</think>\s*<answer>(.*?)</answer>" / r"<answer>(.*?)</answer>"
# (DOTALL) on prefix + text.
TRICKY = [
    # a </think> not followed by <answer> does not close: the think part runs to the next usable
    # </think>
    (("a</think>b</think> <answer>X</answer>", True), ("ab", "X", ("X",))),
    # the first usable </think> wins even though a later well-formed pair exists; the answer runs to
    # the first </answer> after it
    (("a</think><answer>X</think>\n<answer>Y</answer>", True), ("a", "X\nY", ("X\nY",))),
    # an inner <think> belongs to the think text (the match starts at the prefix)
    (("<think>a</think><answer>B</answer>", True), ("a", "B", ("B",))),
    # any whitespace between </think> and <answer>, Unicode's included (\s)
    (
        ("a</think> \n\t\u2003<answer> Up || Left </answer>", True),
        ("a", "Up || Left", ("Up", "Left")),
    ),
    (("a</think>x<answer>Up</answer>", True), None),  # text between the tags
    (("a</think><answer>Up", True), None),  # no </answer>
    # </answer> before is irrelevant
    (("a</answer></think><answer>Up</answer>", True), ("a", "Up", ("Up",))),
    (("a</think><answer>Up</answer></think><answer>Down</answer>", True), ("a", "Up", ("Up",))),
    # empty parts: format ok, no actions
    (("</think></think><answer></answer>", True), ("", "", ())),
    (("Up</answer><answer>Down</answer>", False), ("", "Up", ("Up",))),
    (("<answer>Up</answer>", False), ("", "Up", ("Up",))),  # nested opening tag is stripped
    (("Up", False), None),
    (("<|im_end|>Up||Down||Left</answer>", False), ("", "Up||Down||Left", ("Up", "Down"))),
]


@pytest.mark.parametrize("case, expected", TRICKY)
def test_parse_response_tricky_inputs(case, expected):
    text, think = case
    r = prompting.parse_response(text, enable_think=think, max_actions_per_turn=2)
    if expected is None:
        assert (r.format_ok, r.actions, r.answer, r.think) == (False, (), "", "")
    else:
        assert r.format_ok and (r.think, r.answer, r.actions) == expected


_OLD_THINK = re.compile(r"<think>(.*?)</think>\s*<answer>(.*?)</answer>", re.DOTALL)
_OLD_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_PIECES = [
    "<think>",
    "</think>",
    "<answer>",
    "</answer>",
    " ",
    "\n",
    "a",
    "||",
    "<",
    ">",
    "/",
    "think",
    "answer",
]


@settings(max_examples=400, deadline=None)
@given(st.lists(st.sampled_from(_PIECES), max_size=14), st.booleans())
def test_linear_matching_equals_the_regex_it_replaced(pieces, think):
    full = prompting.generation_prefix(think) + "".join(pieces)
    if think:
        m = _OLD_THINK.search(full)
        assert prompting._match_think_answer(full) == (None if m is None else m.groups())
    else:
        m = _OLD_ANSWER.search(full)
        assert prompting._match_answer(full) == (None if m is None else m.group(1))


# ------------------------------------------------------------------------------------------------ Sudoku


def _contradictory_16x16() -> list[list[int]]:
    """No cell is without candidates, yet box 0 has no place for a 1: rows 1-3 hold a 1 in boxes
    1-3, columns 0-2 hold a 1 further down, and (0, 3) holds a 2."""
    grid = np.zeros((16, 16), dtype=int)
    for r, c in [(1, 4), (2, 8), (3, 12), (4, 0), (8, 1), (12, 2)]:
        grid[r, c] = 1
    grid[0, 3] = 2
    return grid.tolist()


def test_sudoku_hidden_contradiction_is_refused_within_the_budget():
    # Before: the search had no budget (> 25 s; minutes).
    out = run_bounded(
        f"""
        import json, time
        import numpy as np
        from envs.grid.sudoku.env import SudokuEnv
        out = {{}}
        for budget in (None, 10_000):
            env = SudokuEnv(grid_size=16) if budget is None else SudokuEnv(grid_size=16, search_budget=budget)
            t = time.process_time()
            try:
                env.reset(options={{"puzzle": np.array({_contradictory_16x16()!r})}})
                message = None
            except ValueError as exc:
                message = str(exc)
            out[str(budget)] = [time.process_time() - t, message]
        print(json.dumps(out))
    """,
        limit_s=90,
    )
    small_s, small_msg = out["10000"]
    assert small_msg == (
        "options['puzzle']: no unique solution found within search_budget=10000 search nodes (it may hide a "
        "contradiction, or have too few givens to check); give more numbers or raise search_budget"
    )
    assert small_s < 1.0
    default_s, default_msg = out["None"]
    assert (
        f"search_budget={PUZZLE_SEARCH_BUDGET} " in default_msg and PUZZLE_SEARCH_BUDGET == 200_000
    )
    assert default_s < 20.0  # ~3 s on one busy core of the 2-core build machine


def test_sudoku_search_budget_is_validated_and_normal_puzzles_still_load():
    with pytest.raises(
        ValueError, match=r"search_budget must be an integer in \[1, 2000000\], got 0"
    ):
        SudokuEnv(search_budget=0)
    env = SudokuEnv(grid_size=4, search_budget=50)
    puzzle = [[1, 2, 3, 4], [3, 4, 1, 2], [2, 1, 4, 3], [4, 3, 2, 0]]
    obs, info = env.reset(options={"puzzle": puzzle})
    assert info["empty_cells"] == 1 and env.solution[3, 3] == 1


# ------------------------------------------------------------------------------------------------ fuzz


ADVERSARIAL = [
    "",
    "no tags at all",
    "<think></think>" * 1334,  # 20 KB each: long enough that a quadratic path shows
    "<think>" * 2858,
    "<answer>" * 2500,
    "</think><answer>" * 1250,
    "x</think><answer>" + "||" * 10_000 + "</answer>",
    "x</think><answer>" + "Up || " * 3_334 + "</answer>",
    "x</think><answer>1e999999999</answer>",
    "x</think><answer>1e-999999999 || 1e10000000</answer>",
    "x</think><answer>" + "9" * 20_000 + "</answer>",
    "x</think><answer>" + "(" * 5_000 + "1" + ")" * 5_000 + "</answer>",
    "x</think><answer>" + "1+" * 10_000 + "1</answer>",
    "x</think><answer>9**9**9**9 || 10**100000</answer>",
    "x</think><answer>__import__('os').system('echo pwned')</answer>",
    "x</think><answer>" + "1," * 10_000 + "</answer>",
    "x</think><answer>place 9999999999 at row 99999999 col 1 || (1,1,1)</answer>",
    "x</think><answer>" + " " * 20_000 + "</answer>",
    "x</think><answer>\x00\x01\x7f\ufffd\u202e✓ Up</answer>",
    "x</think><answer><|im_end|>Up<|endoftext|></answer>",
    "x</think><answer>up || DOWN || lEfT || right || U' || b</answer>",
    "x</think><answer>" + "Ü" * 10_000 + "</answer>",
    "x</think><answer>nan || inf || -0 || 0x1F || 1/0 || 1_000_000</answer>",
]


class _ListEngine:
    """Answers the i-th prompt of a call with ``texts[i]`` (token ids of the text, no EOS cut)."""

    def __init__(self, tokenizer, texts):
        self.ids = [tokenizer.encode(t, add_special_tokens=False) for t in texts]

    def generate(self, prompts, params, seeds=None, **kw):
        return [
            Generation(self.ids[i], [-1.0] * len(self.ids[i]), "length")
            for i in range(len(prompts))
        ]

    def sync_weights(self):
        pass


@pytest.mark.timeout(300)
def test_fuzz_adversarial_outputs_through_the_runner_for_every_env(tiny_tokenizer, monkeypatch):
    # every task env (the remote-env client needs a server: tests/unit/envs/test_remote.py runs it)
    env_ids = sorted(k for k in gym.registry if k.startswith("ragen/") and k != envs.REMOTE_ID)
    assert env_ids == sorted(envs.ENV_IDS)  # every registered task, none missed
    parse_seconds: list[float] = []
    parse = prompting.parse_response

    # CPU seconds of the calling thread, not wall clock: a busy machine does not fail the bound
    def timed_parse(*args, **kwargs):
        t = time.thread_time()
        try:
            return parse(*args, **kwargs)
        finally:
            parse_seconds.append(time.thread_time() - t)

    # the runner calls it through the module
    monkeypatch.setattr(prompting, "parse_response", timed_parse)
    engine = _ListEngine(tiny_tokenizer, ADVERSARIAL)
    longest = max(len(ids) for ids in engine.ids)
    episode = EpisodeSettings(
        max_turns=1,
        max_actions_per_turn=20,
        max_actions_per_episode=20,
        max_new_tokens=longest,
        max_model_len=longest + 4096,
    )
    for env_id in env_ids:
        # an env that needs a backend (Lean) gets the env contract test's loopback stand-in
        runner = RolloutRunner(
            env_id, backend_kwargs(env_id) or None, ChatTokens(tiny_tokenizer), engine, episode
        )
        trajs = runner.run(
            list(range(len(ADVERSARIAL))),
            group_size=1,
            params=SamplingParams(max_new_tokens=longest),
        )
        assert len(trajs) == len(ADVERSARIAL) and all(t.num_turns == 1 for t in trajs)
        assert all(np.isfinite(t.score) for t in trajs)
        # the output without tags and the empty one are format errors in every env
        assert trajs[0].num_format_errors == trajs[1].num_format_errors == 1
        # env resets and the steps that judge the parsed actions: a few ms an output here, but wall
        # clock (the Lean stand-in answers over loopback), so only a hang guard; the parse bound
        # below is the CPU-time one
        assert runner.timing["env"] < 30.0, (env_id, runner.timing)
        runner.close()
    assert len(parse_seconds) == len(env_ids) * len(ADVERSARIAL)
    # ~2 ms an output at most here; the quadratic parser took 0.2-0.6 s on the 20 KB tag repeats
    assert max(parse_seconds) < 0.1, max(parse_seconds)


# ------------------------------------------------------------------------------------------ tool-call fuzz

# text after the "<think>" prefix; each 100 KB case took the quadratic path it guards
TOOL_ADVERSARIAL = [
    "",
    "no calls",
    "x</think>" + "<tool_call>" * 9_000,
    "x</think>" + "<tool_call></tool_call>" * 4_200,
    "x</think><tool_call>" + "[" * 100_000 + "</tool_call>",
    "x</think><tool_call>" + '{"a":' * 20_000 + "1" + "}" * 20_000 + "</tool_call>",
    'x</think><tool_call>{"name": "search", "arguments": {"query": "'
    + "q" * 100_000
    + '"}}</tool_call>',
    'x</think><tool_call>{"name": "search", "arguments": {"query": "\\u0000\\ud800 <|im_end|>"}}</tool_call>',
    'x</think><tool_call>{"name": "click", "arguments": {"target": "buy now"}}</tool_call>' * 3,
    'x</think><tool_call>{"name": "finish", "arguments": {"answer": 1e999}}</tool_call>',
    'x</think><tool_call>{"name": "search", "arguments": {"query": NaN}}</tool_call>',
    "x</think><tool_call>{'name': 'search', 'arguments': {'query': 'single quotes'}}</tool_call>",
    'x</think><tool_call>{"name": "search", "arguments": {"query": "a"}, "name": "finish"}</tool_call>',
    "x</think></tool_call><tool_call>",
]


def test_tool_call_parsing_of_100kb_inputs_is_bounded():
    seconds = run_bounded(f"""
        import json, time
        from envs.tools.search.env import TOOLS
        from ragen_lightning.rollout.tool_calls import parse_tool_calls
        out = []
        for text in {TOOL_ADVERSARIAL!r}:
            t = time.process_time()
            r = parse_tool_calls(text, TOOLS, prefix="<think>", max_actions_per_turn=20)
            out.append([time.process_time() - t, r.num_proposed])
        print(json.dumps(out))
    """)
    assert [n for _, n in seconds][:5] == [0, 0, 1, 4200, 1]  # 9000 opens: one unclosed block
    assert max(t for t, _ in seconds) < 1.0, seconds


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.sampled_from(
            [
                "<think>",
                "</think>",
                "<tool_call>",
                "</tool_call>",
                "{",
                "}",
                '"name"',
                ":",
                '"search"',
                '"arguments"',
                '"query"',
                '"x"',
                ",",
                "[",
                "]",
                " ",
                "\n",
                "1",
                "null",
            ]
        ),
        max_size=24,
    ),
    st.booleans(),
)
def test_tool_call_parser_never_raises_and_only_runs_declared_calls(pieces, think):
    from envs.tools.search.env import TOOLS
    from ragen_lightning.rollout.tool_calls import parse_tool_calls

    text = "".join(pieces)
    p = parse_tool_calls(
        text, TOOLS, prefix="<think>" if think else "", enable_think=think, max_actions_per_turn=3
    )
    assert p.num_proposed >= len(p.actions) and (p.format_ok == (p.num_proposed > 0))
    assert all(
        a is None or (a.startswith(("search[", "finish[")) and a.endswith("]")) for a in p.actions
    )


@pytest.mark.parametrize("env_id", ["ragen/SearchQA-v0", "ragen/WebShop-v0"])
def test_fuzz_adversarial_tool_calls_through_the_runner(qwen_tokenizer, env_id):
    engine = _ListEngine(qwen_tokenizer, TOOL_ADVERSARIAL)
    longest = max(len(ids) for ids in engine.ids)
    episode = EpisodeSettings(
        max_turns=1,
        max_actions_per_turn=20,
        max_actions_per_episode=20,
        max_new_tokens=longest,
        max_model_len=longest + 8192,
        action_format="tool_call",
    )
    runner = RolloutRunner(env_id, None, ChatTokens(qwen_tokenizer), engine, episode)
    trajs = runner.run(
        list(range(len(TOOL_ADVERSARIAL))),
        group_size=1,
        params=SamplingParams(max_new_tokens=longest),
    )
    runner.close()
    assert all(t.num_turns == 1 and np.isfinite(t.score) for t in trajs)
    # no call, an unclosed block, only invalid calls: a format error each (a penalty, never an
    # exception)
    errors = [t.num_format_errors for t in trajs]
    assert errors[:6] == [1] * 6 and errors[9:13] == [1] * 4, errors
