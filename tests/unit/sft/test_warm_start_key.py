"""The warm start's cache key: cached warm-started models are found by it, so its value for given arguments is pinned
(the folder names below are those of the code before ``warm_start`` was split into helpers)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import envs  # noqa: F401  (registers the ragen/* ids)
from ragen_lightning.sft import warm_start as ws

CALLS = [
    ({"env_id": "ragen/Bandit-v0"}, "warm-9d275e072ae21dca"),
    ({"env_id": "ragen/Bandit-v0", "steps": 100, "reading_steps": 10, "lr": 1e-3, "batch_size": 8, "seed": 3,
      "episode": {"max_turns": 2, "observation_last": True}}, "warm-2dee2d6065b1678c"),
    ({"env_id": "ragen/FrozenLake-v0", "steps": 50, "more_envs": [("ragen/Bandit-v0", None, {"max_turns": 1})],
      "only_successful": True}, "warm-2b948da1a15a1f2c"),
]


@pytest.mark.parametrize(("kwargs", "folder"), CALLS)
def test_the_cache_folder_of_given_arguments_is_unchanged(kwargs, folder, monkeypatch, tmp_path):
    # hermetic: the env sources' fingerprint and the base model folder are fixed, nothing is built
    monkeypatch.setattr(ws, "code_fingerprint", lambda env_id, env_kwargs=None: f"code-{env_id}")
    monkeypatch.setattr(ws.models, "resolve_model_path", lambda model: "/x/tiny-aaa")
    built = []
    monkeypatch.setattr(ws, "_build", lambda final, root, base, args, *rest: built.append(args) or final)
    assert ws.warm_start("tiny", cache_dir=tmp_path, **kwargs) == tmp_path / folder
    assert list(built[0])[:12] == ["env_id", "steps", "num_episodes", "lr", "batch_size", "weight_decay", "warmup_steps",
                               "lr_schedule", "seed", "only_successful", "dtype", "env_kwargs"]  # warm_start.json's
    (tmp_path / folder).mkdir()
    (tmp_path / folder / ws.META_FILE).write_text("{}")
    assert ws.warm_start("tiny", cache_dir=tmp_path, **kwargs) == tmp_path / folder and len(built) == 1  # cached


def test_no_function_of_the_warm_start_spans_more_than_60_lines():
    source = Path(ws.__file__).read_text()
    spans = {n.name: n.end_lineno - n.lineno + 1 for n in ast.walk(ast.parse(source))
             if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    assert {name: n for name, n in spans.items() if n > 60} == {}
