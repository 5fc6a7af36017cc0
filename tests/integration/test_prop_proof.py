"""PropProof from its config: a short warm start on the proof-search expert (its demonstrations run
the checker through the rollout runner), then one StarPO iteration whose rollouts act in the env and
a validation on the val split (``--data.validation.suite``). ``tests/integration/test_configs.py``
runs the config without a warm start."""

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
        [
            "fit",
            "--config",
            str(CONFIGS / "prop_proof.yaml"),
            *SMALL,
            "--data.episode.max_turns",
            "3",
        ]
    )
    m = {k: float(v) for k, v in cli.trainer.callback_metrics.items()}
    print({k: round(v, 3) for k, v in sorted(m.items()) if k.startswith(("train/", "val/"))})
    # the warm-started model answers in the format, so tactics reached the checker, which judged
    # them (the env's info keys become metrics only for executed actions), and no env step failed
    assert (
        m["train/format_error_rate"] < 1.0 and "train/action_is_valid" in m and "train/goals" in m
    ), m
    assert m["train/env_errors"] == 0.0
    assert "val/prop_proof_val/success" in m  # validation ran on the val split's entry
    assert cli.trainer.global_step >= 1 and m["iteration"] == 0.0
    assert math.isfinite(m["actor/pg_loss"]) and math.isfinite(m["actor/grad_norm"])
