"""Branching helpers: an answer played on a copy of the env, and the answer a branching episode
follows."""

import gymnasium as gym
import pytest

from ragen_lightning.rollout.branching import followed, play_on_copy


def _step(env, action):
    return env.step(action)


def test_followed_is_the_first_answer_or_the_best_scored_with_the_first_on_ties():
    assert followed([-1.0, 3.0, 2.0], "first") == 0
    assert followed([-1.0, 3.0, 2.0], "best") == 1
    # a tie keeps the earlier answer (the unbranched one first)
    assert followed([2.0, 0.5, 2.0], "best") == 0
    assert followed([None, -0.1, -0.5], "best") == 1  # a failed copy never wins
    assert followed([None, None], "best") == 0


class NoisyEnv(gym.Env):
    """Each step's reward is a draw from the env's own random state (a slip, a bandit pull)."""

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return "", {}

    def step(self, action):
        return "", float(self.np_random.random()) * action, False, False, {}


def test_play_on_copy_leaves_the_env_alone_and_its_outcome_repeats_on_the_env():
    env = NoisyEnv()
    env.reset(seed=7)
    start = env.np_random.bit_generator.state
    plan = [1, 2, 3]
    rewards = {play_on_copy(env, plan, _step) for _ in range(3)}
    # the copies did not draw from the env's stream
    assert env.np_random.bit_generator.state == start
    assert len(rewards) == 1  # every copy starts from the same random state
    # and the env itself then draws the same
    assert sum(env.step(a)[1] for a in plan) == rewards.pop()
    other = NoisyEnv()
    other.reset(seed=8)
    # the draws are random indeed
    assert play_on_copy(other, plan, _step) != play_on_copy(env, plan, _step)


def test_play_on_copy_stops_at_the_end_of_the_episode_and_passes_errors_on():
    class Counter:
        def __init__(self):
            self.steps = 0

        def step(self, action):
            self.steps += 1
            if action == "boom":
                raise RuntimeError("broken env")
            return "", 1.0, self.steps == 2, False, {}

        def close(self):
            pass

    env = Counter()
    # the episode ended after two
    assert play_on_copy(env, ["a", "b", "c"], _step) == 2.0 and env.steps == 0
    with pytest.raises(RuntimeError, match="broken env"):
        play_on_copy(env, ["boom"], _step)
