"""Runner tests with a hand-written env and a scripted engine (no model): exact turns, rewards,
masks, seeds."""

from __future__ import annotations

from dataclasses import replace

import gymnasium as gym
import pytest
from gymnasium import spaces

from ragen_lightning.rollout import prompting
from ragen_lightning.rollout.engine import Generation, SamplingParams
from ragen_lightning.rollout.runner import RolloutRunner, request_seed, transition_seed
from ragen_lightning.rollout.settings import EpisodeSettings
from ragen_lightning.rollout.tokens import ChatTokens


class LineEnv(gym.Env):
    """Position 0..4 on a line; start = seed % 3; 'Right' moves +1, 'Left' -1; reward 1 and success
    at 4."""

    action_names = ("Left", "Right")

    def __init__(self):
        self.observation_space = spaces.Text(64, charset="0123456789 pos:")
        self.action_space = spaces.Discrete(2)
        self.pos = 0

    def prompt_spec(self):
        return prompting_spec()

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.pos = (seed or 0) % 3
        return f"pos: {self.pos}", {}

    def step(self, action):
        self.pos = max(0, self.pos + (1 if action == 1 else -1))
        done = self.pos >= 4
        return (
            f"pos: {self.pos}",
            (1.0 if done else 0.0),
            done,
            False,
            {"success": done, "action_is_effective": 1},
        )


def prompting_spec():
    from types import SimpleNamespace

    return SimpleNamespace(instruction="Reach 4.", action_names=("Left", "Right"), symbols=())


if "test/Line-v0" not in gym.registry:
    gym.register("test/Line-v0", entry_point=LineEnv)


class ScriptedEngine:
    """Answers every prompt with ``script(prompt_text)``; records prompts and seeds."""

    def __init__(self, tokenizer, script):
        self.tok, self.script = tokenizer, script
        self.prompts, self.seeds = [], []

    def generate(self, prompts, params, seeds=None):
        self.prompts.append([list(p) for p in prompts])
        self.seeds.append(list(seeds))
        outs = []
        for p in prompts:
            ids = self.tok.encode(self.script(self.tok.decode(p)), add_special_tokens=False)[
                : params.max_new_tokens
            ]
            if len(ids) < params.max_new_tokens:
                ids.append(self.tok.eos_token_id)
            outs.append(
                Generation(
                    ids, [-0.5] * len(ids), "stop" if ids[-1] == self.tok.eos_token_id else "length"
                )
            )
        return outs

    def sync_weights(self):
        pass


def make(tok, script, **kw):
    engine = ScriptedEngine(tok, script)
    kw.setdefault("max_turns", 3)
    return RolloutRunner(
        "test/Line-v0", None, ChatTokens(tok), engine, EpisodeSettings(**kw)
    ), engine


PARAMS = SamplingParams(max_new_tokens=40)


def test_groups_share_seed_and_actions_execute(tiny_tokenizer):
    runner, engine = make(
        tiny_tokenizer,
        lambda p: "go</think><answer>Right || Right</answer>",
        max_actions_per_turn=2,
    )
    trajs = runner.run([10, 11], group_size=2, params=PARAMS, seed=0)
    assert [t.group_id for t in trajs] == [0, 0, 1, 1] and [t.seed for t in trajs] == [
        10,
        10,
        11,
        11,
    ]
    # seed 10 starts at pos 1: turn 1 moves to 3 (reward 0), turn 2 moves to 4 (reward 1,
    # terminated) after 1 action
    t = trajs[0]
    assert t.turn_rewards == [0.0, 1.0] and t.num_actions == 3 and t.num_turns == 2
    assert t.success and t.terminated and not t.truncated and t.penalty == 0.0
    # seed 11 starts at pos 2: done in the first turn
    assert trajs[2].turn_rewards == [1.0] and trajs[2].num_turns == 1
    # each turn counts its last action's info (RAGEN's turn_info), averaged over turns: a rate stays
    # a rate (summing the three actions' flags over two turns would read 3 / 2)
    assert t.info["action_is_effective"] == pytest.approx(1.0)
    # the run's time split is measured (env resets + steps, engine calls), and a new run starts from
    # zero
    assert (
        set(runner.timing) == {"generate", "env"}
        and runner.timing["env"] > 0
        and runner.timing["generate"] > 0
    )
    runner.timing["env"] = 1000.0
    runner.run([10], group_size=1, params=PARAMS, seed=0)
    assert 0 < runner.timing["env"] < 1000.0  # reset at the start of every run, not accumulated


def test_malformed_output_costs_penalty_and_warns(tiny_tokenizer):
    runner, engine = make(tiny_tokenizer, lambda p: "no tags here", max_turns=2)
    (t,) = runner.run([0], group_size=1, params=PARAMS)
    assert t.penalty == pytest.approx(-0.2) and t.num_format_errors == 2 and t.num_actions == 0
    assert t.score == pytest.approx(-0.2) and t.truncated and not t.success
    second_prompt = tiny_tokenizer.decode(engine.prompts[1][0])
    assert prompting.INVALID_ACTION_WARNING in second_prompt and "Reward:\n0\n" in second_prompt


def test_unknown_action_word_is_penalised_but_valid_one_runs(tiny_tokenizer):
    runner, _ = make(
        tiny_tokenizer, lambda p: "x</think><answer>Jump || Right</answer>", max_turns=1
    )
    (t,) = runner.run([0], 1, PARAMS)
    assert t.num_actions == 1 and t.penalty == pytest.approx(-0.1)


def test_full_mode_stored_ids_are_engine_prompts_plus_samples(tiny_tokenizer):
    runner, engine = make(tiny_tokenizer, lambda p: "x</think><answer>Left</answer>", max_turns=3)
    (t,) = runner.run([0], 1, PARAMS)
    (sample,) = t.samples
    conv = sample.conversation
    # every prompt the engine saw is a prefix of the stored stream, followed by exactly the sampled
    # tokens
    for turn, (start, _end) in enumerate(conv.turn_spans):
        prompt = engine.prompts[turn][0]
        assert conv.input_ids[:start] == prompt
    assert sum(conv.loss_mask) == sum(e - s for s, e in conv.turn_spans)
    assert all(conv.loss_mask[i] == 1 for s, e in conv.turn_spans for i in range(s, e))
    assert sample.turn_rewards == [0.0, 0.0, 0.0] and not runner.chat.drift(conv)


def test_action_budget_truncates(tiny_tokenizer):
    runner, _ = make(
        tiny_tokenizer,
        lambda p: "x</think><answer>Left || Left</answer>",
        max_turns=5,
        max_actions_per_episode=3,
    )
    (t,) = runner.run([0], 1, PARAMS)
    assert t.num_actions == 3 and t.num_turns == 2 and t.truncated and not t.terminated


def test_max_model_len_ends_episode_without_corrupting(tiny_tokenizer):
    runner, engine = make(tiny_tokenizer, lambda p: "x</think><answer>Left</answer>", max_turns=5)
    first = len(engine.prompts) or len(
        runner.chat.start(
            prompting.system_prompt(prompting_spec(), 10),
            prompting.turn_block(
                1, "pos: 0", prompting.instruction_line(10, max_response_tokens=40)
            ),
        )
    )
    runner.episode = replace(runner.episode, max_model_len=first + 40 + 5)  # room for turn 1 only
    (t,) = runner.run([0], 1, PARAMS)
    assert t.context_truncated and t.truncated and t.num_turns == 1
    conv = t.samples[0].conversation
    assert len(conv.turn_spans) == 1 and conv.messages[-1]["role"] == "assistant"
    runner.episode = replace(runner.episode, max_model_len=first + 10)
    with pytest.raises(ValueError, match="max_model_len=.* too small for the first prompt"):
        runner.run([0], 1, PARAMS)


def test_limited_window_one_sample_per_turn_last_turn_trained(tiny_tokenizer):
    runner, engine = make(
        tiny_tokenizer,
        lambda p: "x</think><answer>Left</answer>",
        max_turns=3,
        context_window="limited",
        window_turns=2,
    )
    (t,) = runner.run([0], 1, PARAMS)
    assert len(t.samples) == 3
    third = t.samples[2].conversation
    assert len(third.turn_spans) == 1  # only the current turn is trained
    text = tiny_tokenizer.decode(third.input_ids)
    assert "Turn 2:" in text and "Turn 3:" in text and "Turn 1:" not in text  # window of 2 turns
    # the replayed turn 2 appears with its sampled ids but mask 0
    n_assistant = text.count("<|im_start|>assistant")
    assert (
        n_assistant == 2 and sum(third.loss_mask) == third.turn_spans[0][1] - third.turn_spans[0][0]
    )


def test_single_turn_memory_summary(tiny_tokenizer):
    runner, engine = make(
        tiny_tokenizer,
        lambda p: "x</think><answer>Right</answer>",
        max_turns=2,
        context_window="single_turn",
        window_turns=3,
    )
    runner.run([0], 1, PARAMS)
    second = tiny_tokenizer.decode(engine.prompts[1][0])
    assert (
        "Summary: 1 step(s) completed so far" in second
        and "Turn 1 Action: <think>x</think>" in second
    )
    assert second.count("<|im_start|>user") == 1


def test_request_seeds_are_deterministic_and_distinct(tiny_tokenizer):
    runner, engine = make(tiny_tokenizer, lambda p: "x</think><answer>Left</answer>", max_turns=1)
    runner.run([5, 6], 2, PARAMS, seed=7)
    seeds = engine.seeds[0]
    assert seeds == [request_seed(7, i, 1) for i in range(4)] and len(set(seeds)) == 4


def test_unknown_env_id_is_a_clear_error(tiny_tokenizer):
    with pytest.raises(ValueError, match="unknown env id 'nope/Nothing-v0'"):
        RolloutRunner("nope/Nothing-v0", None, ChatTokens(tiny_tokenizer), None)


class SeededLineEnv(LineEnv):
    """LineEnv that declares ``transition_seeded`` and records the reset options it got."""

    transition_seeded = True

    def reset(self, *, seed=None, options=None):
        self.options = options
        return super().reset(seed=seed)


class UnseededLineEnv(SeededLineEnv):
    transition_seeded = False


for _id, _entry in (
    ("test/SeededLine-v0", SeededLineEnv),
    ("test/UnseededLine-v0", UnseededLineEnv),
):
    if _id not in gym.registry:
        gym.register(_id, entry_point=_entry)


def test_transition_seeds_only_for_envs_that_declare_them(tiny_tokenizer):
    # members of a group share the reset seed; a transition_seeded env also gets its own,
    # reproducible transition seed
    engine = ScriptedEngine(tiny_tokenizer, lambda _: "<think>go</think><answer>Right</answer>")
    runner = RolloutRunner(
        "test/SeededLine-v0", None, ChatTokens(tiny_tokenizer), engine, EpisodeSettings(max_turns=1)
    )
    runner.run([5, 6], group_size=3, params=PARAMS)
    options = [env.unwrapped.options for env in runner._envs]
    assert options == [{"transition_seed": transition_seed(s, m)} for s in (5, 6) for m in range(3)]
    assert len({o["transition_seed"] for o in options}) == 6  # every member its own stream
    assert transition_seed(5, 1) == transition_seed(5, 1) != transition_seed(6, 1)
    plain = RolloutRunner(
        "test/UnseededLine-v0",
        None,
        ChatTokens(tiny_tokenizer),
        engine,
        EpisodeSettings(max_turns=1),
    )
    # an env that does not declare it gets no options at all
    plain.run([5], group_size=2, params=PARAMS)
    assert [env.unwrapped.options for env in plain._envs] == [None, None]


class BranchableLineEnv(LineEnv):
    branchable = True


if "test/BranchLine-v0" not in gym.registry:
    gym.register("test/BranchLine-v0", entry_point=BranchableLineEnv)


class SeededEngine(ScriptedEngine):
    """Answers each request with ``script(seed)``."""

    def generate(self, prompts, params, seeds=None):
        script = iter(seeds)
        self.script = lambda prompt: self.by_seed(next(script))
        return super().generate(prompts, params, seeds)


def test_branches_answer_each_state_k_times_and_score_each_answer_by_its_own_turn(tiny_tokenizer):
    own_seeds = {request_seed(0, 0, turn) for turn in (1, 2, 3)}
    engine = SeededEngine(tiny_tokenizer, None)
    # the episode's own response (branch 0) always moves Right; the others Left (odd seed) or out of
    # format
    engine.by_seed = lambda seed: (
        "go</think><answer>"
        + ("Right" if seed in own_seeds else "Left" if seed % 2 else "Jump")
        + "</answer>"
    )
    runner = RolloutRunner(
        "test/BranchLine-v0",
        None,
        ChatTokens(tiny_tokenizer),
        engine,
        EpisodeSettings(
            max_turns=3, max_actions_per_turn=1, context_window="single_turn", window_turns=1
        ),
        branches=3,
    )
    # start at 0: three Rights reach 3, not 4
    (t,) = runner.run([0], group_size=1, params=PARAMS, seed=0)
    assert engine.seeds == [[request_seed(0, 0, turn, k) for k in range(3)] for turn in (1, 2, 3)]
    # both kinds of branch answer ran
    assert {s % 2 for seeds in engine.seeds for s in seeds[1:]} == {0, 1}
    assert all(p[0] == p[1] == p[2] for p in engine.prompts)  # the same prompt three times per turn
    # the episode is the unbranched one (three Rights, rewards 0); per turn 2 branch samples, then
    # its own
    assert (
        t.num_turns == 3
        and t.turn_rewards == [0.0, 0.0, 0.0]
        and t.num_actions == 3
        and len(t.samples) == 9
    )
    for turn, seeds in enumerate(engine.seeds):
        *branches, own = t.samples[3 * turn : 3 * turn + 3]
        assert own.turn_rewards == [0.0]
        # all three answer this turn's state
        assert [s.turn for s in (*branches, own)] == [turn + 1] * 3
        prompt = engine.prompts[turn][0]
        for sample, seed in zip(branches, seeds[1:]):
            assert (
                sample.conversation.input_ids[: len(prompt)] == prompt
                and len(sample.conversation.turn_spans) == 1
            )
            # Left from pos 0 / 1 / 2: reward 0 (no penalty); "Jump" is no action: the format
            # penalty -0.1
            assert sample.turn_rewards == [pytest.approx(0.0 if seed % 2 else -0.1)]
    # branches ran on copies: the env itself only saw the episode's own three Rights
    assert runner._envs[0].unwrapped.pos == 3
    # with branches the episode's own samples equal the unbranched rollout's, token for token
    plain = RolloutRunner(
        "test/BranchLine-v0",
        None,
        ChatTokens(tiny_tokenizer),
        engine,
        EpisodeSettings(
            max_turns=3, max_actions_per_turn=1, context_window="single_turn", window_turns=1
        ),
    )
    (u,) = plain.run([0], group_size=1, params=PARAMS, seed=0)
    assert [s.conversation.input_ids for s in u.samples] == [
        s.conversation.input_ids for s in t.samples[2::3]
    ]


class ShapedLineEnv(BranchableLineEnv):
    """BranchLine with a shaped reward: the move's change of position, plus 1 at the goal."""

    def step(self, action):
        before = self.pos
        obs, reward, done, truncated, info = super().step(action)
        return obs, reward + self.pos - before, done, truncated, info


if "test/ShapedLine-v0" not in gym.registry:
    gym.register("test/ShapedLine-v0", entry_point=ShapedLineEnv)


def test_branch_follow_best_continues_with_the_best_scored_answer_and_the_first_on_ties(
    tiny_tokenizer,
):
    # branch k answers answers[k]; "Jump" is out of format (penalty -0.1)
    answers = ("Left", "Jump", "Right")
    by_branch = {request_seed(0, 0, turn, k): answers[k] for turn in range(1, 6) for k in range(3)}
    engine = SeededEngine(tiny_tokenizer, None)
    engine.by_seed = lambda seed: f"go</think><answer>{by_branch[seed]}</answer>"
    windowed = EpisodeSettings(
        max_turns=5, max_actions_per_turn=1, context_window="single_turn", window_turns=1
    )
    runner = RolloutRunner(
        "test/ShapedLine-v0",
        None,
        ChatTokens(tiny_tokenizer),
        engine,
        windowed,
        branches=3,
        branch_follow="best",
    )
    (t,) = runner.run([2], group_size=1, params=PARAMS, seed=0)  # start at 2
    # scores at pos 2: Left -1, Jump -0.1, Right +1 -> Right; at pos 3: Left -1, Jump -0.1, Right 1
    # + 1 (goal)
    assert (
        t.turn_rewards == [1.0, 2.0]
        and t.success
        and t.num_turns == 2
        and runner._envs[0].unwrapped.pos == 4
    )
    assert t.num_format_errors == 0  # the episode's own answers are the chosen Rights
    # the two others first, then the episode's own (chosen) answer of that state
    for turn in range(2):
        left, jump, own = t.samples[3 * turn : 3 * turn + 3]
        assert [left.turn_rewards, own.turn_rewards] == [[-1.0], [[1.0], [2.0]][turn]]
        assert jump.turn_rewards == [pytest.approx(-0.1)]
        assert "<answer>Right</answer>" in tiny_tokenizer.decode(own.conversation.input_ids)
    # the same answers without shaping: Left and Right both score 0 until the goal, so every tie
    # follows branch 0
    flat = RolloutRunner(
        "test/BranchLine-v0",
        None,
        ChatTokens(tiny_tokenizer),
        engine,
        windowed,
        branches=3,
        branch_follow="best",
    )
    (f,) = flat.run([2], group_size=1, params=PARAMS, seed=0)
    # Left from 2 to 0, then stays
    assert flat._envs[0].unwrapped.pos == 0 and not f.success and f.num_turns == 5
    first = RolloutRunner(
        "test/BranchLine-v0", None, ChatTokens(tiny_tokenizer), engine, windowed, branches=3
    )
    (g,) = first.run([2], group_size=1, params=PARAMS, seed=0)
    assert [s.conversation.input_ids for s in g.samples] == [
        s.conversation.input_ids for s in f.samples
    ]
    assert [s.turn_rewards for s in g.samples] == [s.turn_rewards for s in f.samples]
    with pytest.raises(ValueError, match="branch_follow must be 'first' or 'best', got 'top'"):
        RolloutRunner(
            "test/BranchLine-v0",
            None,
            ChatTokens(tiny_tokenizer),
            engine,
            windowed,
            branches=3,
            branch_follow="top",
        )


def test_branching_needs_a_windowed_context_and_a_branchable_env(tiny_tokenizer):
    with pytest.raises(ValueError, match="branches > 1 needs a windowed context"):
        RolloutRunner(
            "test/BranchLine-v0",
            None,
            ChatTokens(tiny_tokenizer),
            ScriptedEngine(tiny_tokenizer, str),
            EpisodeSettings(),
            branches=2,
        )
    with pytest.raises(ValueError, match="does not declare branchable = True"):
        RolloutRunner(
            "test/Line-v0",
            None,
            ChatTokens(tiny_tokenizer),
            ScriptedEngine(tiny_tokenizer, str),
            EpisodeSettings(context_window="single_turn"),
            branches=2,
        )
    with pytest.raises(ValueError, match="branches must be an int >= 1"):
        RolloutRunner(
            "test/BranchLine-v0",
            None,
            ChatTokens(tiny_tokenizer),
            ScriptedEngine(tiny_tokenizer, str),
            EpisodeSettings(context_window="single_turn"),
            branches=0,
        )
