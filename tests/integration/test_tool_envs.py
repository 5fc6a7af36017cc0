"""SearchQA and DeepCoder from their configs: a short warm start on the envs' own experts (its
demonstrations run real searches and sandboxed reference solutions through the rollout runner), then
one StarPO iteration whose rollouts act in the envs. ``tests/integration/test_configs.py`` runs the
configs without a warm start (untrained text); this test checks that the envs' actions, observations
and rewards flow through a fit."""

from __future__ import annotations

import math

import pytest

import envs  # noqa: F401  (registers the ids)
from ragen_lightning.cli import main
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
EPISODE = {"searchqa": ["--data.episode.max_turns", "3"], "deepcoder": []}


@pytest.mark.slow
@pytest.mark.parametrize("task", sorted(EPISODE))
def test_one_iteration_after_a_short_warm_start(task, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cli = main(["fit", "--config", str(CONFIGS / f"{task}.yaml"), *SMALL, *EPISODE[task]])
    m = {k: float(v) for k, v in cli.trainer.callback_metrics.items()}
    print(task, {k: round(v, 3) for k, v in sorted(m.items()) if k.startswith("train/")})
    # the warm-started model answers in the format, so actions reached the env, which judged them
    # (its info keys become metrics only for executed actions), and no env step failed (a missing
    # sandbox would be an env error)
    assert m["train/format_error_rate"] < 1.0 and "train/action_is_valid" in m, (task, m)
    assert m["train/env_errors"] == 0.0
    assert cli.trainer.global_step >= 1 and m["iteration"] == 0.0
    assert math.isfinite(m["actor/pg_loss"]) and math.isfinite(m["actor/grad_norm"])
