"""Every YAML in configs/ parses against the CLI's signatures; every task config runs a short fit on CPU."""

from __future__ import annotations

from pathlib import Path

import pytest

import envs  # noqa: F401
from ragen_lightning.cli import StarPOCLI, main

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
# a task config names its env; everything else (configs/models/*, diagnostics, lora, ddp, ...) is an overlay
TASKS = sorted(p for p in CONFIGS.glob("*.yaml") if "env_id:" in p.read_text())
OVERLAYS = sorted(p for p in CONFIGS.rglob("*.yaml") if p not in TASKS)


class ParseOnly(StarPOCLI):
    def instantiate_classes(self) -> None:  # validate types and keys without building a trainer
        pass


def parse(*configs: Path):
    args = [a for c in configs for a in ("--config", str(c))]
    from ragen_lightning.data.datamodule import RolloutDataModule
    from ragen_lightning.starpo.module import StarPOModule

    return ParseOnly(StarPOModule, RolloutDataModule, args=args, run=False).config


def test_every_config_parses(capsys):
    checked = 0
    for task in TASKS:
        cfg = parse(task)
        assert cfg.data.env_id.startswith("ragen/") and cfg.model.model == "tiny", task.name
        checked += 1
    for overlay in OVERLAYS:
        cfg = parse(CONFIGS / "sokoban.yaml", overlay)
        assert cfg.data.env_id == "ragen/SimpleSokoban-v0"  # overlays keep the task
        checked += 1
    with capsys.disabled():
        print(f"\n[configs] checked {checked} YAML files ({len(TASKS)} tasks, {len(OVERLAYS)} overlays)")
    assert checked == len(list(CONFIGS.rglob("*.yaml"))) and checked > 0


def test_bad_value_names_the_flag():
    with pytest.raises(SystemExit):  # jsonargparse rejects a wrong type before anything runs
        parse(CONFIGS / "sokoban.yaml", Path(__file__).with_name("bad_config.yaml"))


@pytest.mark.slow
@pytest.mark.parametrize("task", [p.stem for p in TASKS])
def test_task_config_fit_smoke(task, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    main(["fit", "--config", str(CONFIGS / f"{task}.yaml"), "--trainer.logger", "false",
          "--trainer.callbacks", "[]", "--trainer.enable_checkpointing", "false", "--model.warm_start", "false",
          "--trainer.max_steps", "2", "--data.num_iterations", "1", "--data.num_groups", "2",
          "--data.group_size", "2", "--data.episode.max_new_tokens", "12", "--data.episode.max_turns", "2",
          "--data.val_num_groups", "2", "--trainer.val_check_interval", "1", "--model.mini_batch_size", "4",
          "--model.micro_batch_size", "2"])
