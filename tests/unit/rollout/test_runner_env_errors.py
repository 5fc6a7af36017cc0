"""Runner + worker pool: env steps run concurrently with the same results; an env that raises or
hangs ends only its episode, with the error recorded and logged once, and the turns before the
failing one stay token-exact."""

from __future__ import annotations

import logging
import threading
import time
from types import SimpleNamespace

import gymnasium as gym
import pytest
from gymnasium import spaces

from ragen_lightning.data.batching import build_batch, rollout_metrics
from ragen_lightning.rollout.engine import Generation, SamplingParams
from ragen_lightning.rollout.runner import RolloutRunner
from ragen_lightning.rollout.settings import EpisodeSettings
from ragen_lightning.rollout.tokens import ChatTokens

RELEASE = threading.Event()  # frees the hung envs' worker threads at the end of a test
MADE: list[str] = []  # one entry per env construction


class TrapEnv(gym.Env):
    """Position on a line, start = seed % 3, 'Right' +1 / 'Left' -1, reward 1 and done at 4. The
    episode reset with ``trap_seed`` raises (``mode="raise"``) or hangs (``mode="hang"``) at its
    ``trap_step``-th step (1-based; 0 = at reset)."""

    action_names = ("Left", "Right")

    def __init__(self, trap_seed=-1, trap_step=2, mode="raise"):
        self.observation_space = spaces.Text(64, charset="0123456789 pos:")
        self.action_space = spaces.Discrete(2)
        self.trap_seed, self.trap_step, self.mode = trap_seed, trap_step, mode
        self.seed_, self.steps, self.pos = None, 0, 0
        MADE.append(mode)

    def prompt_spec(self):
        return SimpleNamespace(instruction="Reach 4.", action_names=self.action_names, symbols=())

    def _trap(self):
        if self.seed_ == self.trap_seed and self.steps == self.trap_step:
            if self.mode == "hang":
                RELEASE.wait(30)
            raise RuntimeError(f"trap sprung at step {self.steps}")

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.seed_, self.steps, self.pos = seed, 0, (seed or 0) % 3
        self._trap()
        return f"pos: {self.pos}", {}

    def step(self, action):
        self.steps += 1
        self._trap()
        self.pos = max(0, self.pos + (1 if action == 1 else -1))
        done = self.pos >= 4
        return (
            f"pos: {self.pos}",
            (1.0 if done else 0.0),
            done,
            False,
            {"success": done, "action_is_effective": 1},
        )


if "test/Trap-v0" not in gym.registry:
    gym.register("test/Trap-v0", entry_point=TrapEnv)


class Scripted:
    """Answers every prompt with one fixed text (+ eos); log-probs -0.5."""

    def __init__(self, tok, text):
        self.ids = tok.encode(text, add_special_tokens=False) + [tok.eos_token_id]

    def generate(self, prompts, params, seeds=None):
        return [Generation(list(self.ids), [-0.5] * len(self.ids), "stop") for _ in prompts]

    def sync_weights(self):
        pass


PARAMS = SamplingParams(max_new_tokens=40)
# two actions per turn: never reaches 4, never terminates
LEFT_RIGHT = "x</think><answer>Left || Right</answer>"


def make(tok, env_kwargs=None, text=LEFT_RIGHT, **episode):
    episode.setdefault("max_turns", 3)
    episode.setdefault("max_actions_per_turn", 2)
    return RolloutRunner(
        "test/Trap-v0", env_kwargs, ChatTokens(tok), Scripted(tok, text), EpisodeSettings(**episode)
    )


def same(a, b):
    """Two trajectories are equal in everything but the error field."""
    assert (
        a.seed,
        a.turn_rewards,
        a.num_actions,
        a.num_turns,
        a.success,
        a.terminated,
        a.truncated,
    ) == (b.seed, b.turn_rewards, b.num_actions, b.num_turns, b.success, b.terminated, b.truncated)
    assert [s.conversation.input_ids for s in a.samples] == [
        s.conversation.input_ids for s in b.samples
    ]
    assert [s.turn_rewards for s in a.samples] == [s.turn_rewards for s in b.samples]


def test_pool_gives_the_same_rollout_as_sequential(tiny_tokenizer):
    text = "x</think><answer>Right || Right</answer>"
    serial = make(tiny_tokenizer, text=text).run([0, 1, 2], 2, PARAMS, seed=4)
    pooled = make(tiny_tokenizer, text=text, max_workers=4, step_timeout_s=5.0).run(
        [0, 1, 2], 2, PARAMS, seed=4
    )
    for a, b in zip(serial, pooled, strict=True):
        same(a, b)
        assert a.env_error is None and b.env_error is None
    assert [t.turn_rewards for t in serial] == [
        [0.0, 1.0],
        [0.0, 1.0],
        [0.0, 1.0],
        [0.0, 1.0],
        [1.0],
        [1.0],
    ]


@pytest.mark.parametrize("workers", [1, 3])
def test_a_raising_step_ends_only_its_episode_and_keeps_the_turns_before(
    tiny_tokenizer, caplog, workers
):
    # seed 7's env raises at its 3rd step = the first action of turn 2: turn 1 is kept, turn 2
    # dropped
    healthy = make(tiny_tokenizer).run([7, 8], 2, PARAMS, seed=1)
    runner = make(tiny_tokenizer, {"trap_seed": 7, "trap_step": 3}, max_workers=workers)
    with caplog.at_level(logging.WARNING, logger="ragen_lightning.rollout.runner"):
        trajs = runner.run([7, 8], 2, PARAMS, seed=1)
    failed = [t for t in trajs if t.env_error is not None]
    # both members of group 7; group 8 untouched
    assert len(failed) == 2 and {t.seed for t in failed} == {7}
    for t in trajs[2:]:
        same(t, healthy[2])
    t = failed[0]
    assert t.env_error == "turn 2, action 1: RuntimeError: trap sprung at step 3"
    assert t.num_turns == 1 and t.turn_rewards == [0.0] and t.num_actions == 2 and t.truncated
    assert not t.terminated and not t.success
    # the kept turn is exactly the healthy episode's first turn: its ids up to the end of turn 1's
    # response
    conv, ref = t.samples[0].conversation, healthy[0].samples[0].conversation
    end = ref.turn_spans[0][1]
    assert conv.input_ids == ref.input_ids[:end] and conv.loss_mask == ref.loss_mask[:end]
    assert (
        conv.sampled_logprobs == ref.sampled_logprobs[:end]
        and conv.turn_spans == ref.turn_spans[:1]
    )
    assert t.samples[0].turn_rewards == [0.0] and conv.messages[-1]["role"] == "assistant"
    assert not runner.chat.drift(conv)
    # one warning per failed episode, naming the env, the seed and the error
    records = [r.getMessage() for r in caplog.records if "failed" in r.getMessage()]
    assert len(records) == 2
    assert all(
        "test/Trap-v0" in m and "seed 7" in m and "trap sprung at step 3" in m for m in records
    )
    # the metrics count them, and the batch trains the kept turn
    assert rollout_metrics(trajs, 2)["env_errors"] == 2.0
    batch = build_batch(trajs, pad_token_id=tiny_tokenizer.pad_token_id)
    assert len(batch) == 4 and int(batch.loss_mask[0].sum()) == end - ref.turn_spans[0][0]


def test_a_failure_in_the_first_turn_or_at_reset_leaves_no_sample(tiny_tokenizer):
    for trap_step, where in ((1, "turn 1, action 1"), (0, "reset")):
        runner = make(tiny_tokenizer, {"trap_seed": 7, "trap_step": trap_step}, max_workers=2)
        trajs = runner.run([7, 8], 1, PARAMS, seed=1)
        assert trajs[0].env_error.startswith(f"{where}: RuntimeError") and trajs[0].samples == []
        assert trajs[0].num_turns == 0 and trajs[0].score == 0.0 and trajs[1].env_error is None
        batch = build_batch(trajs, pad_token_id=tiny_tokenizer.pad_token_id)
        assert len(batch) == 1 and batch.group_index.tolist() == [1]


def test_windowed_mode_keeps_one_sample_per_completed_turn(tiny_tokenizer):
    # turn 3, action 1
    runner = make(tiny_tokenizer, {"trap_seed": 7, "trap_step": 5}, context_window="limited")
    (t,) = runner.run([7], 1, PARAMS, seed=1)
    assert t.env_error.startswith("turn 3, action 1") and len(t.samples) == 2 and t.num_turns == 2


def test_a_hanging_step_times_out_and_the_rollout_goes_on(tiny_tokenizer, caplog):
    RELEASE.clear()
    try:
        runner = make(
            tiny_tokenizer,
            {"trap_seed": 7, "trap_step": 2, "mode": "hang"},
            max_workers=4,
            step_timeout_s=0.3,
        )
        MADE.clear()
        t0 = time.monotonic()
        with caplog.at_level(logging.WARNING, logger="ragen_lightning.rollout.runner"):
            trajs = runner.run([7, 8], 1, PARAMS, seed=1)
        assert time.monotonic() - t0 < 10
        assert trajs[0].env_error.startswith("turn 1, action 2: CallTimeout: no result after 0.3 s")
        assert trajs[0].samples == [] and trajs[1].env_error is None and trajs[1].num_turns == 3
        assert any(
            "seed 7" in r.getMessage() and "CallTimeout" in r.getMessage() for r in caplog.records
        )
        # the hung env is abandoned: the next rollout resets a fresh one in its slot (and hangs it
        # again)
        assert len(MADE) == 2
        trajs = runner.run([7, 8], 1, PARAMS, seed=1)
        assert len(MADE) == 3 and trajs[0].env_error is not None and trajs[1].env_error is None
    finally:
        RELEASE.set()
    runner.close()


def test_env_steps_have_a_default_timeout_that_changes_no_result(tiny_tokenizer):
    from ragen_lightning.rollout.settings import DEFAULT_STEP_TIMEOUT_S

    text = "x</think><answer>Right || Right</answer>"
    default = make(tiny_tokenizer, text=text)
    assert default.episode.step_timeout_s == DEFAULT_STEP_TIMEOUT_S == 600.0
    # a hung env cannot block forever
    assert default._workers().timeout_s == 600.0 and not default._workers().inline
    unlimited = make(tiny_tokenizer, text=text, step_timeout_s=None)
    for a, b in zip(
        default.run([0, 1, 2], 2, PARAMS, seed=4),
        unlimited.run([0, 1, 2], 2, PARAMS, seed=4),
        strict=True,
    ):
        same(a, b)
        assert a.env_error is None and b.env_error is None
    assert unlimited._workers().inline
    default.close()
    unlimited.close()
