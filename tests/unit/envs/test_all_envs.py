"""The contract every registered env id meets (parametrised over ``envs.ENV_IDS``).

* ``gymnasium.utils.env_checker.check_env`` passes on the unwrapped env without complaints
  (render-mode notes aside);
* same seed + same actions => same observations, rewards and end flags; different seeds => different
  starts;
* ``action_names`` and ``prompt_spec()`` give the prompt data; observations stay in the observation
  space;
* ``info`` of every reset and step carries ``success``, ``action_is_valid`` and
  ``action_is_effective`` as bools.

An id whose module does not exist yet is skipped (envs are written in parallel); once the module
exists it must pass.

An env that needs an external backend refuses to build without one (``ragen/Lean-v0`` checks proofs
with a Lean server); ``BACKENDS`` gives it the kwargs of a loopback stand-in (the fake Kimina server
replaying recorded answers), so it meets the same contract over its real HTTP client.
"""

from __future__ import annotations

import importlib.util
import warnings

import gymnasium as gym
import numpy as np
import pytest
from gymnasium import spaces
from gymnasium.utils.env_checker import check_env

import envs
from envs.base import PromptSpec, TextEnv

IDS = list(envs.ENV_IDS)
INFO_FLAGS = ("success", "action_is_valid", "action_is_effective")


def _lean_backend() -> dict:
    from tests.fixtures.lean.fake_kimina import shared_url

    return {"server_url": shared_url()}


BACKENDS = {"ragen/Lean-v0": _lean_backend}  # id -> kwargs of a stand-in backend


def kwargs(env_id: str) -> dict:
    return BACKENDS[env_id]() if env_id in BACKENDS else {}


# closed after each test: an env holding a connection (Lean's HTTP client) must not
_OPEN: list[gym.Env] = []
# leave it to the garbage collector, whose "unclosed socket" warning would land in a later test's
# warning check


@pytest.fixture(autouse=True)
def _close_envs():
    yield
    while _OPEN:
        _OPEN.pop().close()


def make(env_id: str, **extra) -> gym.Env:
    module = envs.ENV_IDS[env_id][0].split(":")[0]
    if importlib.util.find_spec(module) is None:
        pytest.skip(f"{module} is not written yet")
    env = gym.make(env_id, **kwargs(env_id), **extra).unwrapped
    _OPEN.append(env)
    return env


def sampled_actions(env: gym.Env, n: int, seed: int = 0) -> list:
    """``n`` actions from the env's own action space, seeded (a ``Text`` space samples strings)."""
    env.action_space.seed(seed)
    return [env.action_space.sample() for _ in range(n)]


def rollout(env: gym.Env, seed: int, actions: list) -> list[tuple]:
    obs, _ = env.reset(seed=seed)
    out: list[tuple] = [(obs,)]
    for action in actions:
        obs, reward, terminated, truncated, _ = env.step(action)
        out.append((obs, float(reward), bool(terminated), bool(truncated)))
        if terminated or truncated:
            break
    return out


def assert_info_flags(info: dict) -> None:
    for key in INFO_FLAGS:
        assert key in info, f"info lacks {key!r}"
        assert isinstance(info[key], (bool, np.bool_)), (
            f"info[{key!r}] is {type(info[key]).__name__}, not bool"
        )


@pytest.mark.parametrize("env_id", IDS)
def test_check_env_passes(env_id):
    env = make(env_id)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        check_env(env)
    complaints = [
        str(w.message)
        for w in caught
        if ("WARN:" in str(w.message) or "ERROR:" in str(w.message))
        and "render" not in str(w.message).lower()
    ]
    assert complaints == []


@pytest.mark.parametrize("env_id", IDS)
def test_check_env_with_ansi_rendering(env_id):
    # with render_mode="ansi" the checker also exercises render(): no warning of any kind is allowed
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        # a ResourceWarning here is the garbage collector finalising another test's object (e.g. a
        # socket of the loopback servers), not something this env or the checker said
        warnings.simplefilter("ignore", ResourceWarning)
        check_env(make(env_id, render_mode="ansi"))
    assert [str(w.message) for w in caught] == []


@pytest.mark.parametrize("env_id", IDS)
def test_same_seed_same_trajectory(env_id):
    a, b = make(env_id), make(env_id)
    actions = sampled_actions(a, 30)
    first = rollout(a, 123, actions)
    assert first == rollout(b, 123, actions)  # a second instance
    assert first == rollout(a, 123, actions)  # the same instance again, after it was used


@pytest.mark.parametrize("env_id", IDS)
def test_different_seeds_give_different_starts(env_id):
    env = make(env_id)
    starts = {env.reset(seed=seed)[0] for seed in range(10)}
    assert len(starts) > 1


@pytest.mark.parametrize("env_id", IDS)
def test_prompt_data(env_id):
    env = make(env_id)
    assert isinstance(env, TextEnv)
    env.reset(seed=0)  # action words may depend on the episode (e.g. bandit arm names)
    names = env.action_names
    assert isinstance(names, tuple) and all(isinstance(x, str) and x for x in names)
    if isinstance(env.action_space, spaces.Discrete):
        assert len(names) == env.action_space.n  # one word per action index
    else:
        assert names == ()  # free-text actions
    spec = env.prompt_spec()
    assert isinstance(spec, PromptSpec)
    assert isinstance(spec.instruction, str) and spec.instruction.strip()
    assert spec.action_names == names
    assert all(isinstance(s, str) and isinstance(m, str) and s and m for s, m in spec.symbols)


@pytest.mark.parametrize("env_id", IDS)
def test_observations_stay_in_space_and_info_has_flags(env_id):
    env = make(env_id)
    obs, info = env.reset(seed=7)
    assert env.observation_space.contains(obs)
    assert_info_flags(info)
    episode = 0
    for action in sampled_actions(env, 60, seed=1):
        obs, reward, terminated, truncated, info = env.step(action)
        assert env.observation_space.contains(obs), repr(obs)
        assert isinstance(float(reward), float) and np.isfinite(reward)
        assert_info_flags(info)
        if terminated or truncated:
            episode += 1
            obs, info = env.reset(seed=7 + episode)
            assert env.observation_space.contains(obs)
            assert_info_flags(info)
