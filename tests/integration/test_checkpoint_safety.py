"""Checkpoints through the command line: ModelCheckpoint writes digested files, a resume with other
model flags is refused naming them (unless --allow_changed_settings), damaged files are one line
naming the file (slow: fits)."""

from __future__ import annotations

from pathlib import Path

import pytest

import envs  # noqa: F401
from ragen_lightning.cli import main
from ragen_lightning.errors import ConfigError
from ragen_lightning.parallel import checkpointing
from ragen_lightning.parallel.checkpointing import CheckpointError
from tests.integration.inprocess import in_process  # noqa: F401  (autouse: main() in this process)

pytestmark = pytest.mark.slow
CONFIGS = Path(__file__).resolve().parents[2] / "configs"
COMMON = [
    "--config",
    str(CONFIGS / "bandit.yaml"),
    "--model.warm_start",
    "false",
    "--trainer.logger",
    "false",
    "--data.training.num_groups",
    "2",
    "--data.training.group_size",
    "4",
    "--data.episode.max_new_tokens",
    "12",
    "--data.validation.num_groups",
    "2",
    "--model.update.mini_batch_size",
    "8",
    "--model.update.micro_batch_size",
    "4",
    "--trainer.val_check_interval",
    "1",
    "--data.engine.name",
    "hf",
]


def test_resume_refuses_other_model_settings_and_damaged_files(tmp_path):
    # stops after iteration 1
    main(["fit", *COMMON, "--data.training.num_iterations", "2", "--trainer.max_steps", "1"])
    ckpt = tmp_path / "outputs" / "bandit" / "checkpoints" / "last.ckpt"
    assert checkpointing.verify(ckpt) is True  # ModelCheckpoint wrote through SafeCheckpointIO
    assert not [p for p in ckpt.parent.iterdir() if p.name.endswith(".tmp")]
    resume = ["fit", *COMMON, "--data.training.num_iterations", "2", "--ckpt_path", str(ckpt)]

    # Before: LightningCLI put the checkpoint's model settings over these flags and trained on,
    # silently.
    with pytest.raises(ConfigError) as info:
        main([*resume, "--model.advantage.estimator", "grpo", "--model.loss.clip_high", "0.3"])
    message = str(info.value)
    assert message.startswith(f"--ckpt_path {ckpt} was trained with other model settings: ")
    assert "--model.advantage.estimator (checkpoint 'gae', now 'grpo')" in message
    assert (
        "--model.loss.clip_high (checkpoint 0.28, now 0.3)" in message
        and "Resume with the run's settings" in message
    )
    with pytest.raises(ConfigError, match=r"--model\.lora \(checkpoint None, now \{"):
        main([*resume, "--config", str(CONFIGS / "lora.yaml")])

    # explicitly allowed: the checkpoint is restored and the new setting is the one in force
    cli = main([*resume, "--model.loss.entropy_coeff", "0.01", "--allow_changed_settings", "true"])
    assert cli.model.loss.entropy_coeff == cli.model.hparams["loss"]["entropy_coeff"] == 0.01
    assert cli.trainer.global_step >= 1

    data = bytearray(ckpt.read_bytes())
    middle = len(data) // 2
    data[middle : middle + 4096] = bytes(b ^ 0xFF for b in data[middle : middle + 4096])
    ckpt.write_bytes(bytes(data))
    with pytest.raises(CheckpointError) as info:
        main(["validate", *COMMON, "--ckpt_path", str(ckpt)])
    assert str(info.value).startswith(
        f"--ckpt_path {ckpt}: corrupted checkpoint (its SHA-256 differs"
    )

    empty = tmp_path / "empty.ckpt"
    empty.write_bytes(b"")
    with pytest.raises(CheckpointError, match=r"empty\.ckpt: the file is empty, not a checkpoint$"):
        main(["validate", *COMMON, "--ckpt_path", str(empty)])
