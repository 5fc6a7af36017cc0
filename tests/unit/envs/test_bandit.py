"""BanditEnv: arm statistics, name pairs per split, group invariant (same seed => identical
envs)."""

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

import envs  # noqa: F401  (registers the ids)
from envs.text.bandit import TEST_ARM_PAIRS, TRAIN_ARM_PAIRS, BanditEnv


def _hi_index(env: BanditEnv) -> int:
    return env.action_names.index(env.hi_arm_name)


@pytest.mark.parametrize("env_id", ["ragen/Bandit-v0", "ragen/BanditTest-v0"])
def test_check_env(env_id):
    # made through the registry so render modes are checked too
    check_env(gym.make(env_id).unwrapped)


def test_pair_lists_match_ragen():
    assert len(TRAIN_ARM_PAIRS) == 12 and len(TEST_ARM_PAIRS) == 8
    assert TRAIN_ARM_PAIRS[0] == ("Teacher", "Trader")
    assert TEST_ARM_PAIRS[-1] == ("CivilServant", "StartupAccelerator")
    train_names = {n for pair in TRAIN_ARM_PAIRS for n in pair}
    test_names = {n for pair in TEST_ARM_PAIRS for n in pair}
    assert not train_names & test_names


@pytest.mark.parametrize("split, pairs", [("train", TRAIN_ARM_PAIRS), ("test", TEST_ARM_PAIRS)])
def test_split_draws_its_own_pairs_in_both_orders(split, pairs):
    env = BanditEnv(split=split)
    seen, orders = set(), set()
    for seed in range(300):
        env.reset(seed=seed)
        seen.add((env.lo_arm_name, env.hi_arm_name))
        orders.add(_hi_index(env))
    assert seen == set(pairs)  # 300 draws cover all 12 (or 8) pairs
    assert orders == {0, 1}  # the high arm appears at both indices


def test_reset_prompt_names_both_arms_and_the_answer_format():
    env = BanditEnv()
    obs, info = env.reset(seed=0)
    a, b = env.action_names
    assert obs.startswith(
        "You are playing a bandit game. Goal: Maximize your total reward by choosing which arm"
    )
    assert f"named {a} and {b}" in obs
    assert obs.rstrip().endswith(f"output like <answer> {a} </answer> or <answer> {b} </answer>.")
    assert info == {"success": False, "action_is_valid": True, "action_is_effective": False}
    spec = env.prompt_spec()
    assert spec.action_names == (a, b)
    # RAGEN's tag instruction is "", so it repeats the prompt's opening
    assert obs.startswith(spec.instruction)


def test_same_seed_envs_are_identical():
    # RAGEN offsets each instance's seed by a global counter; here five envs of one group must agree
    # exactly.
    group = [BanditEnv() for _ in range(5)]
    first = [env.reset(seed=42)[0] for env in group]
    assert len(set(first)) == 1
    assert len({env.action_names for env in group}) == 1
    results = [env.step(0)[:2] for env in group]
    assert len(set(results)) == 1


def test_different_seeds_give_different_games():
    env = BanditEnv()
    observations = {env.reset(seed=s)[0] for s in range(10)}
    assert len(observations) > 1


def test_low_arm_pays_fixed_score():
    env = BanditEnv()
    for seed in range(50):
        env.reset(seed=seed)
        lo = 1 - _hi_index(env)
        obs, reward, terminated, truncated, info = env.step(lo)
        assert reward == 0.1
        assert obs == f"{env.lo_arm_name}: 0.1 points"
        assert terminated and not truncated
        assert info == {"success": False, "action_is_valid": True, "action_is_effective": True}


def test_high_arm_mean_is_one_quarter():
    # 2000 pulls of a Bernoulli(0.25) * 1.0 arm: std of the mean = sqrt(0.25 * 0.75 / 2000) ~
    # 0.0097.
    env = BanditEnv()
    rewards = []
    for seed in range(2000):
        env.reset(seed=seed)
        obs, reward, terminated, _, info = env.step(np.int64(_hi_index(env)))
        assert reward in (0.0, 1.0) and terminated and info["success"]
        assert obs == f"{env.hi_arm_name}: {reward} points"
        rewards.append(reward)
    assert abs(np.mean(rewards) - 0.25) < 0.04


def test_custom_scores():
    env = BanditEnv(lo_arm_score=0.15, hi_arm_hiscore=2.0, hi_arm_hiscore_prob=1.0)
    env.reset(seed=1)
    assert env.step(_hi_index(env))[1] == 2.0
    env.reset(seed=1)
    assert env.step(1 - _hi_index(env))[1] == 0.15


@pytest.mark.parametrize("bad", [2, -1, "Teacher", 0.0, True, None, np.array([0, 1])])
def test_invalid_action_keeps_episode_open(bad):
    env = BanditEnv()
    env.reset(seed=3)
    obs, reward, terminated, truncated, info = env.step(bad)
    assert reward == 0.0 and not terminated and not truncated
    assert info["action_is_valid"] is False and info["success"] is False
    assert env.action_names[0] in obs and env.action_names[1] in obs
    assert env.step(0)[2] is True  # a valid pull still ends it


def test_step_after_end_is_harmless_and_step_before_reset_raises():
    env = BanditEnv()
    with pytest.raises(RuntimeError, match="reset"):
        env.step(0)
    env.reset(seed=0)
    obs, *_ = env.step(0)
    assert env.step(1) == (
        obs,
        0.0,
        True,
        False,
        {"success": False, "action_is_valid": False, "action_is_effective": False},
    )


def test_registered_ids():
    assert gym.make("ragen/BanditTest-v0").unwrapped.split == "test"
    assert gym.make("ragen/Bandit-v0").unwrapped.split == "train"


@pytest.mark.parametrize(
    "kwargs, name",
    [
        ({"split": "val"}, "split"),
        ({"hi_arm_hiscore_prob": 1.5}, "hi_arm_hiscore_prob"),
        ({"lo_arm_score": float("nan")}, "lo_arm_score"),
    ],
)
def test_constructor_errors_name_the_argument(kwargs, name):
    with pytest.raises(ValueError, match=name):
        BanditEnv(**kwargs)


def _risky_rewards(seeds, transition_seeds, **kwargs):
    """Arms and the risky arm's reward for each (seed, transition seed); transition seed None passes
    no option."""
    env = BanditEnv(**kwargs)
    out = []
    for seed, t in zip(seeds, transition_seeds):
        env.reset(seed=seed, options=None if t is None else {"transition_seed": t})
        arms = env.action_names
        out.append((arms, env.step(_hi_index(env))[1]))
    return out


def test_group_members_draw_rewards_independently_by_default():
    # two members of a group: same seed (same arms), their own transition seeds (own reward draws)
    seeds = range(200)
    a = _risky_rewards(seeds, [2 * s for s in seeds])
    b = _risky_rewards(seeds, [2 * s + 1 for s in seeds])
    assert [arms for arms, _ in a] == [arms for arms, _ in b]
    differ = sum(ra != rb for (_, ra), (_, rb) in zip(a, b))
    assert 40 < differ < 110  # P(differ) = 2 * 0.25 * 0.75 = 0.375 -> ~75 of 200
    # same seed + same transition seed: same episode
    assert a == _risky_rewards(seeds, [2 * s for s in seeds])
    assert BanditEnv.transition_seeded and not BanditEnv().shared_transitions


def test_shared_transitions_ignores_the_transition_seed():
    seeds = range(200)
    a = _risky_rewards(seeds, [2 * s for s in seeds], shared_transitions=True)
    b = _risky_rewards(seeds, [2 * s + 1 for s in seeds], shared_transitions=True)
    # = no option: the draw continues np_random
    assert a == b == _risky_rewards(seeds, [None] * 200)
    assert 20 < sum(r == 1.0 for _, r in a) < 80  # still Bernoulli(0.25) across seeds


def test_transition_seed_must_be_a_non_negative_int():
    env = BanditEnv()
    for bad in (-1, 1.5, True, "3"):
        with pytest.raises(ValueError, match="transition_seed"):
            env.reset(seed=0, options={"transition_seed": bad})
    with pytest.raises(ValueError, match="unknown options"):
        env.reset(seed=0, options={"board": 1})


def test_risky_expert_always_pulls_the_risky_arm():
    env = BanditEnv()
    for seed in range(20):
        env.reset(seed=seed)
        assert env.expert_turn(1)[1] == (env.hi_arm_name,)


def test_balanced_expert_pulls_each_arm_half_the_time_without_telling_them_apart():
    env = BanditEnv(expert_policy="balanced")
    picks = []
    for seed in range(1000):
        env.reset(seed=seed)
        reasoning, (arm,) = env.expert_turn(1)
        other = env.lo_arm_name if arm == env.hi_arm_name else env.hi_arm_name
        # the reasoning names the tried arm only (the answer copies a name written just before it)
        assert arm in env.action_names and arm in reasoning and other not in reasoning
        picks.append(
            (reasoning.replace(arm, "{arm}"), arm == env.hi_arm_name, env.action_names.index(arm))
        )
    # one sentence for both arms: nothing tells them apart
    assert len({r for r, _, _ in picks}) == 1
    assert 450 < sum(risky for _, risky, _ in picks) < 550
    assert 450 < sum(index for _, _, index in picks) < 550  # no position bias either
    again = BanditEnv(expert_policy="balanced")
    for seed in range(50):  # deterministic given the seed
        again.reset(seed=seed)
        assert (again.expert_turn(1)[1][0] == again.hi_arm_name) == picks[seed][1]
    # the coin does not move np_random: prompts and shared reward draws equal the risky expert's env
    assert _risky_rewards(range(50), [None] * 50, expert_policy="balanced") == _risky_rewards(
        range(50), [None] * 50
    )
    with pytest.raises(ValueError, match="expert_policy"):
        BanditEnv(expert_policy="greedy")
