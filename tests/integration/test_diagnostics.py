"""The diagnostics overlay end to end: it keeps the task's callbacks, every callback runs in a real
fit, and a resumed fit restores the callbacks' state."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

import envs  # noqa: F401
from ragen_lightning.cli import StarPOCLI, main

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


class ParseOnly(StarPOCLI):
    def instantiate_classes(self) -> None:
        pass


def test_overlay_appends_to_the_task_callbacks():
    from ragen_lightning.data.datamodule import RolloutDataModule
    from ragen_lightning.starpo.module import StarPOModule

    args = ["--config", str(CONFIGS / "bandit.yaml"), "--config", str(CONFIGS / "diagnostics.yaml")]
    cfg = ParseOnly(StarPOModule, RolloutDataModule, args=args, run=False).config
    assert [c.class_path for c in cfg.trainer.callbacks] == [
        "lightning.pytorch.callbacks.ModelCheckpoint",  # the task's own, kept by `callbacks+:`
        "callbacks.RolloutThroughput",
        "callbacks.CollapseMonitor",  # the task's cheap diagnostics
        # the overlay's
        "callbacks.RolloutStatistics",
        "callbacks.TrajectoryLogger",
        "callbacks.GradientAnalysis",
    ]
    assert [lg.class_path.rsplit(".", 1)[1] for lg in cfg.trainer.logger] == [
        "WandbLogger",
        "CSVLogger",
    ]


def _rows(root: Path) -> list[dict[str, str]]:
    rows = []
    for path in sorted(root.rglob("metrics.csv")):
        with open(path, newline="") as f:
            rows += list(csv.DictReader(f))
    return rows


@pytest.mark.slow
def test_fit_with_every_callback_then_resume(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WANDB_MODE", "offline")
    common = [
        "--config",
        str(CONFIGS / "bandit.yaml"),
        "--config",
        str(CONFIGS / "diagnostics.yaml"),
        "--trainer.logger",
        "lightning.pytorch.loggers.CSVLogger",
        "--trainer.logger.save_dir",
        "logs",
        "--model.warm_start",
        "false",
        # the HF engine: the callbacks are under test, not the sampler (engine auto would build a
        # vLLM engine inside the test process when vLLM is installed: ~20 s of CPU for two fits,
        # most of it its start-up and the full garbage collections of its close)
        "--data.engine.name",
        "hf",
        "--data.training.num_groups",
        "2",
        "--data.training.group_size",
        "4",
        "--data.episode.max_new_tokens",
        "12",
        "--trainer.limit_val_batches",
        "0",
        "--trainer.val_check_interval",
        "1",
        "--model.update.mini_batch_size",
        "8",
        "--model.update.micro_batch_size",
        "4",
        "--model.advantage.estimator",
        "gae",  # the step counts below assume a critic
        # a mid-epoch checkpoint after every iteration (GAE: two optimizer steps each) to
        # resume from
        "--trainer.callbacks+=lightning.pytorch.callbacks.ModelCheckpoint",
        "--trainer.callbacks.dirpath=steps",
        "--trainer.callbacks.every_n_train_steps=2",
        "--trainer.callbacks.save_top_k=-1",
        "--trainer.callbacks.filename={step}",
    ]
    # stop after iteration 2 of 3, then resume from its checkpoint for iteration 3
    cli = main(["fit", *common, "--data.training.num_iterations", "3", "--trainer.max_steps", "4"])
    ckpt = tmp_path / "outputs" / "bandit" / "checkpoints" / "last.ckpt"
    assert ckpt.is_file()  # the task's ModelCheckpoint survived the overlay
    by_name = {type(c).__name__: c for c in cli.trainer.callbacks}
    assert (
        by_name["CollapseMonitor"].iterations == 2 and by_name["TrajectoryLogger"].iterations == 2
    )
    assert by_name["GradientAnalysis"].analysed == [1]  # every_n 5: iteration 1 only
    rows = _rows(tmp_path / "logs")
    logged = {k for r in rows for k, v in r.items() if v}
    for key in (
        "throughput/generate_tokens_per_s",
        "throughput/update_fraction",
        "timing_s/rollout_env",
        "stats/pass@1",
        "stats/valid_thinking_rate",
        "collapse/first_turn/num_turns",
        "collapse_monitor/warnings",
        "collapse_monitor/filter_value",
        "grad_norm/all/task",
        "grad_norm/bucket_1/reward_std_mean",
    ):
        assert key in logged, key
    # scheduled values are logged at their iteration only (not repeated at later steps)
    assert sum(bool(r.get("grad_norm/all/task")) for r in rows) == 1
    # the trajectory viewer ran at iteration 1 (every_n 5); its JSONL holds 4 trajectories
    viewer = tmp_path / "logs" / "lightning_logs"
    jsonl = next(viewer.rglob("trajectories.jsonl"))
    assert [json.loads(line)["iteration"] for line in jsonl.read_text().splitlines()] == [
        1,
        1,
        1,
        1,
    ]
    tokens_first = sum(
        float(r["rollout/generated_tokens"]) for r in rows if r.get("rollout/generated_tokens")
    )

    cli = main(
        [
            "fit",
            *common,
            "--data.training.num_iterations",
            "3",
            "--ckpt_path",
            str(tmp_path / "steps" / "step=4.ckpt"),
        ]
    )
    assert cli.trainer.datamodule.iteration == 3
    by_name = {type(c).__name__: c for c in cli.trainer.callbacks}
    # restored, then one more iteration
    assert (
        by_name["CollapseMonitor"].iterations == 3 and by_name["TrajectoryLogger"].iterations == 3
    )
    assert by_name["GradientAnalysis"].analysed == [1]
    rows = _rows(tmp_path / "logs")
    third = [
        float(r["rollout/generated_tokens"]) for r in rows if r.get("rollout/generated_tokens")
    ][-1]
    assert by_name["RolloutThroughput"].total_tokens == pytest.approx(tokens_first + third)
