"""The command line end to end: fit writes metrics and a checkpoint, validate reloads it, the actor exports."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
import torch

import envs  # noqa: F401
from ragen_lightning.cli import main

pytestmark = pytest.mark.slow
CONFIGS = Path(__file__).resolve().parents[2] / "configs"


def test_fit_validate_and_export(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    common = ["--config", str(CONFIGS / "bandit.yaml"), "--model.warm_start", "false",
              "--trainer.logger", "lightning.pytorch.loggers.CSVLogger", "--trainer.logger.save_dir", "logs",
              "--data.num_groups", "2", "--data.group_size", "4", "--data.episode.max_new_tokens", "12",
              "--data.val_num_groups", "4", "--model.mini_batch_size", "8", "--model.micro_batch_size", "4"]
    main(["fit", *common, "--data.num_iterations", "2", "--trainer.val_check_interval", "2",
          "--model.export_dir", "exported"])
    ckpt = tmp_path / "outputs" / "bandit" / "checkpoints" / "last.ckpt"
    assert ckpt.is_file()
    rows = list(csv.DictReader(open(next((tmp_path / "logs").rglob("metrics.csv")))))
    trained = [r for r in rows if r.get("train/batch_size")]
    assert len(trained) == 2 and all(float(r["train/batch_size"]) == 8.0 for r in trained)
    assert any(r.get("val/success") for r in rows)

    # the exported folder loads without this package and holds the trained actor
    from transformers import AutoModelForCausalLM

    exported = AutoModelForCausalLM.from_pretrained(tmp_path / "exported")
    state = torch.load(ckpt, map_location="cpu", weights_only=False)["state_dict"]
    for name, p in exported.named_parameters():
        torch.testing.assert_close(p, state[f"actor.{name}"])

    cli = main(["validate", *common, "--ckpt_path", str(ckpt)])
    results = cli.trainer.callback_metrics
    assert "val/success" in results and 0.0 <= float(results["val/success"]) <= 1.0
    assert float(results["val/num_turns"]) == 1.0  # bandit is single-turn


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--model.adv_estimator", "grpo", "--data.group_size", "1"], "error: --data.group_size must be >= 2"),
        (["--data.episode.max_model_len", "64"], "error: --data.episode.max_model_len=64 is too small for the first prompt"),
        (["--data.env_id", "ragen/Nope-v0"], "error: --data.env_id: unknown env id 'ragen/Nope-v0'"),
        (["--model.micro_batch_size", "64"], "error: --model.micro_batch_size (64) must be <="),
        (["--trainer.devices", "3", "--data.num_groups", "4"],  # checked before any process is launched
         "error: --data.num_groups (4) must be divisible by the number of processes (3)"),
    ],
)
def test_bad_config_is_one_line_and_writes_nothing(tmp_path, flags, message):
    import subprocess
    import sys

    main_py = Path(__file__).resolve().parents[2] / "main.py"
    proc = subprocess.run([sys.executable, str(main_py), "fit", "--config", str(CONFIGS / "bandit.yaml"),
                           "--model.warm_start", "false", *flags], cwd=tmp_path, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.strip().splitlines()[-1].startswith(message)
    assert "Traceback" not in proc.stderr
    assert list(tmp_path.iterdir()) == []  # no config, logs or checkpoints written
