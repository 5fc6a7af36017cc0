"""The warm start's cache key: cached warm-started models are found by it, so its value for given
arguments is pinned (the folder names below are those of the code before ``warm_start`` was split
into helpers)."""

from __future__ import annotations

from pathlib import Path

import pytest

import envs  # noqa: F401  (registers the ragen/* ids)
from ragen_lightning.sft import fingerprint as fp
from ragen_lightning.sft import warm_start as ws

CALLS = [
    ({"env_id": "ragen/Bandit-v0"}, "warm-9d275e072ae21dca"),
    (
        {
            "env_id": "ragen/Bandit-v0",
            "steps": 100,
            "reading_steps": 10,
            "lr": 1e-3,
            "batch_size": 8,
            "seed": 3,
            "episode": {"max_turns": 2, "observation_last": True},
        },
        "warm-2dee2d6065b1678c",
    ),
    (
        {
            "env_id": "ragen/FrozenLake-v0",
            "steps": 50,
            "more_envs": [("ragen/Bandit-v0", None, {"max_turns": 1})],
            "only_successful": True,
        },
        "warm-2b948da1a15a1f2c",
    ),
]


def call(kwargs: dict, cache_dir) -> Path:
    """``warm_start`` with the arguments of before the settings group (its recipe now a
    ``WarmStartSettings``)."""
    kw = dict(kwargs)
    env_id, episode, more = kw.pop("env_id"), kw.pop("episode", None), kw.pop("more_envs", ())
    settings = ws.WarmStartSettings(**kw, cache_dir=str(cache_dir))
    return ws.warm_start("tiny", env_id, None, settings, episode=episode, more_envs=more)


@pytest.mark.parametrize(("kwargs", "folder"), CALLS)
def test_the_cache_folder_of_given_arguments_is_unchanged(kwargs, folder, monkeypatch, tmp_path):
    # hermetic: the env sources' fingerprint and the base model folder are fixed, nothing is built
    monkeypatch.setattr(ws, "code_fingerprint", lambda env_id, env_kwargs=None: f"code-{env_id}")
    monkeypatch.setattr(ws.models, "resolve_model_path", lambda model: "/x/tiny-aaa")
    built = []
    monkeypatch.setattr(
        ws, "_build", lambda final, root, base, args, *rest: built.append(args) or final
    )
    assert call(kwargs, tmp_path) == tmp_path / folder
    assert list(built[0])[:12] == [
        "env_id",
        "steps",
        "num_episodes",
        "lr",
        "batch_size",
        "weight_decay",
        "warmup_steps",
        "lr_schedule",
        "seed",
        "only_successful",
        "dtype",
        "env_kwargs",
    ]  # warm_start.json's
    (tmp_path / folder).mkdir()
    (tmp_path / folder / ws.META_FILE).write_text("{}")
    assert call(kwargs, tmp_path) == tmp_path / folder and len(built) == 1  # cached


def test_the_code_fingerprint_covers_the_sibling_modules_an_env_uses(tmp_path, monkeypatch):
    """Editing a helper module of the env's package (its level generator, renderer, reward) rebuilds
    the warm start, as editing the env's own module does; modules it does not use, and other
    packages, do not count."""
    import importlib
    import sys

    pkg = tmp_path / "toyenvs"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "_levels.py").write_text("def level(seed):\n    return seed\n")
    (pkg / "_unused.py").write_text("X = 1\n")
    (pkg / "toy.py").write_text(
        "import json\nfrom toyenvs._levels import level\n\nclass ToyEnv:\n    pass\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    toy = importlib.import_module("toyenvs.toy")
    try:
        assert [m.__name__ for m in fp._package_helpers([toy])] == ["toyenvs._levels"]
        before = fp._class_fingerprint.__wrapped__(toy.ToyEnv)
        (pkg / "_unused.py").write_text("X = 2\n")
        assert fp._class_fingerprint.__wrapped__(toy.ToyEnv) == before
        (pkg / "_levels.py").write_text("def level(seed):\n    return seed + 1\n")
        assert fp._class_fingerprint.__wrapped__(toy.ToyEnv) != before
    finally:
        for name in [n for n in sys.modules if n.split(".")[0] == "toyenvs"]:
            del sys.modules[name]


def test_an_imperfect_expert_has_its_own_key_and_a_perfect_one_keeps_the_old(monkeypatch, tmp_path):
    monkeypatch.setattr(ws, "code_fingerprint", lambda env_id, env_kwargs=None: f"code-{env_id}")
    monkeypatch.setattr(ws.models, "resolve_model_path", lambda model: "/x/tiny-aaa")
    built = []
    monkeypatch.setattr(
        ws, "_build", lambda final, root, base, args, *rest: built.append(args) or final
    )
    kwargs, folder = CALLS[0]
    assert call({**kwargs, "expert_noise": 0.0}, tmp_path) == tmp_path / folder
    noisy = call({**kwargs, "expert_noise": 0.25}, tmp_path)
    assert noisy != tmp_path / folder and built[1]["expert_noise"] == 0.25
    assert "expert_noise" not in built[0]
    with pytest.raises(ws.ConfigError, match=r"--model\.warm_start\.expert_noise"):
        ws.WarmStartSettings(expert_noise=1.5)


def test_supervised_set_is_what_the_warm_start_would_train_on(tiny_path, monkeypatch):
    built = []
    monkeypatch.setattr(
        ws, "_build", lambda final, root, base, args, *rest: built.append(args) or final
    )
    settings = ws.WarmStartSettings(num_episodes=4, steps=20, reading_steps=5, expert_noise=0.5)
    episode = {"max_turns": 1, "max_actions_per_turn": 1, "max_actions_per_episode": 1}
    data = ws.supervised_set(str(tiny_path), "ragen/Bandit-v0", None, settings, episode=episode)
    ws.warm_start(str(tiny_path), "ragen/Bandit-v0", None, settings, episode=episode)
    assert data.args == built[0] and data.args["expert_noise"] == 0.5
    assert len(data.demos) == data.stats["demo/samples"] == 4  # one turn per bandit episode
    assert len(data.reading_demos) == 4 and data.base == str(tiny_path)
