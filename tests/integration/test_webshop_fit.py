"""WebShop from its config: a short warm start on the env's expert (demonstrations search, turn
pages, choose options and buy through the rollout runner), then one StarPO iteration whose rollouts
act in the store. Like ``tests/integration/test_tool_envs.py`` for SearchQA and DeepCoder."""

from __future__ import annotations

import math

import pytest

import envs  # noqa: F401  (registers the ids)
from ragen_lightning.cli import main
from tests.integration.test_configs import CONFIGS
from tests.integration.test_tool_envs import SMALL


@pytest.mark.slow
def test_one_iteration_after_a_short_warm_start(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cli = main(
        ["fit", "--config", str(CONFIGS / "webshop.yaml"), *SMALL, "--data.episode.max_turns", "4"]
    )
    m = {k: float(v) for k, v in cli.trainer.callback_metrics.items()}
    print(
        "webshop",
        {k: round(v, 3) for k, v in sorted(m.items()) if k.startswith(("train/", "val/"))},
    )
    # the warm-started model answers in the format, so actions reached the store, which judged them
    # (its info keys become metrics only for executed actions), no env step failed, and the val
    # split was validated under its tag
    assert m["train/format_error_rate"] < 1.0 and "train/action_is_valid" in m, m
    assert m["train/env_errors"] == 0.0 and "val/webshop_val/success" in m, m
    assert cli.trainer.global_step >= 1 and m["iteration"] == 0.0
    assert math.isfinite(m["actor/pg_loss"]) and math.isfinite(m["actor/grad_norm"])
