"""Lean from its config: a short warm start on the env's expert (its demonstrations step the env,
whose every tactic goes over HTTP to the loopback fake Kimina server replaying recorded answers),
then one StarPO iteration whose rollouts' tactics are judged through the same client.
``tests/integration/test_configs.py`` runs the config without a warm start; this test checks that
tactics, Lean feedback and RAGEN's rewards flow through a fit."""

from __future__ import annotations

import json
import math

import pytest

import envs  # noqa: F401  (registers the ids)
from ragen_lightning.cli import main
from tests.fixtures.lean.fake_kimina import THEOREMS, FakeKimina
from tests.integration.test_configs import CONFIGS

SMALL = [
    "--trainer.logger",
    "false",
    "--trainer.callbacks",
    "[]",
    "--trainer.enable_checkpointing",
    "false",
    "--trainer.max_steps",
    "2",
    "--data.training.num_iterations",
    "1",
    "--data.training.num_groups",
    "2",
    "--data.training.group_size",
    "4",
    "--data.validation.num_groups",
    "2",
    "--trainer.val_check_interval",
    "1",
    "--model.update.mini_batch_size",
    "8",
    "--model.update.micro_batch_size",
    "4",
    "--data.episode.max_turns",
    "3",
    # The warm start only has to make some turns well-formed, so that actions reach the env: 30
    # steps on 8 expert episodes do (measured on the HF engine: format error rates 0.72-0.88 of the
    # training episodes' turns on the five envs; 40 steps on 32 episodes: 0.54-0.79 on three of
    # them, for a fifth more CPU).
    "--model.warm_start",
    "{steps: 30, num_episodes: 8, batch_size: 2, threads: 2}",
    # the HF engine rather than the config's auto (vLLM where installed): the env's side of the fit
    # is the same with either engine (tests/integration/test_configs.py runs the configs as they
    # are), and this fit on vLLM took half again the CPU of the HF engine's (its start-up)
    "--data.engine.name",
    "hf",
]


@pytest.mark.slow
def test_one_iteration_after_a_short_warm_start(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with FakeKimina() as fake:
        kwargs = json.dumps({"server_url": fake.url, "data_path": str(THEOREMS)})
        cli = main(
            ["fit", "--config", str(CONFIGS / "lean.yaml"), "--data.env.kwargs", kwargs, *SMALL]
        )
        requests = len(fake.requests)
    m = {k: float(v) for k, v in cli.trainer.callback_metrics.items()}
    print(
        "lean",
        requests,
        "requests;",
        {k: round(v, 3) for k, v in sorted(m.items()) if k.startswith("train/")},
    )
    # the warm-started model answers in the format, so tactics reached the server, which judged them
    # (info keys become metrics only for executed actions), and no step failed (an unreachable
    # server would be an env error)
    assert requests > 0 and m["train/format_error_rate"] < 1.0 and "train/action_is_valid" in m, m
    assert m["train/env_errors"] == 0.0
    assert cli.trainer.global_step >= 1 and m["iteration"] == 0.0
    assert math.isfinite(m["actor/pg_loss"]) and math.isfinite(m["actor/grad_norm"])
