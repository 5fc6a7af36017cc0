"""scripts/slurm_fsdp.sh under a fake SLURM allocation: the command it hands srun, and what
Lightning makes of SLURM's per-task environment with those flags (world size, ranks, root node; a
task count that does not match the flags is refused). No cluster runs here: srun is a stub that
records its arguments."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import lightning as L
import pytest
from lightning.fabric.plugins.environments import SLURMEnvironment

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = ROOT / "scripts" / "slurm_fsdp.sh"
# what SLURM sets in each task of `sbatch --nodes 2 --ntasks-per-node 4 ...`: here task 5 (node 1,
# local 1)
TASK_ENV = {
    "SLURM_JOB_NUM_NODES": "2",
    "SLURM_NNODES": "2",
    "SLURM_NTASKS_PER_NODE": "4",
    "SLURM_NTASKS": "8",
    "SLURM_PROCID": "5",
    "SLURM_LOCALID": "1",
    "SLURM_NODEID": "1",
    "SLURM_NODELIST": "gpu[017-018]",
    "SLURM_JOB_NAME": "starpo-fsdp",
    "SLURM_JOB_ID": "4242",
}


def _srun_args(tmp_path: Path, env: dict[str, str], *configs: str) -> list[str]:
    stub = tmp_path / "bin" / "srun"
    stub.parent.mkdir()
    stub.write_text('#!/bin/bash\nprintf "%s\\n" "$@" > "$SRUN_ARGS"\n')
    stub.chmod(0o755)
    out = tmp_path / "args.txt"
    run_env = {
        **os.environ,
        **env,
        "PATH": f"{stub.parent}:{os.environ['PATH']}",
        "SRUN_ARGS": str(out),
    }
    subprocess.run(["bash", str(SCRIPT), *configs], cwd=ROOT, env=run_env, check=True, timeout=30)
    return out.read_text().splitlines()


def test_the_script_maps_the_allocation_to_lightnings_flags(tmp_path):
    args = _srun_args(
        tmp_path,
        TASK_ENV,
        "configs/sokoban_starpo.yaml",
        "configs/models/qwen2.5-0.5b-instruct.yaml",
    )
    assert args == [
        "python",
        "main.py",
        "fit",
        "--config",
        "configs/sokoban_starpo.yaml",
        "--config",
        "configs/models/qwen2.5-0.5b-instruct.yaml",
        "--config",
        "configs/fsdp.yaml",
        "--trainer.accelerator",
        "gpu",
        "--trainer.num_nodes",
        "2",
        "--trainer.devices",
        "4",
    ]
    (tmp_path / "b").mkdir()
    no_model = _srun_args(
        tmp_path / "b",
        {**TASK_ENV, "SLURM_JOB_NUM_NODES": "1", "SLURM_NTASKS_PER_NODE": "2"},
        "configs/sokoban.yaml",
    )
    assert no_model[3:] == [
        "--config",
        "configs/sokoban.yaml",
        "--config",
        "configs/fsdp.yaml",
        "--trainer.accelerator",
        "gpu",
        "--trainer.num_nodes",
        "1",
        "--trainer.devices",
        "2",
    ]


def test_lightning_reads_each_tasks_rank_from_slurm_with_those_flags(monkeypatch):
    """The flags the script passes (2 nodes x 4 devices), on CPU here, under task 5's
    environment."""
    for key, value in TASK_ENV.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("MASTER_ADDR", raising=False)
    monkeypatch.delenv("MASTER_PORT", raising=False)
    trainer = L.Trainer(
        accelerator="cpu",
        devices=4,
        num_nodes=2,
        strategy="ddp",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    env = trainer.strategy.cluster_environment
    assert isinstance(env, SLURMEnvironment)
    assert (trainer.world_size, trainer.global_rank, trainer.local_rank, trainer.node_rank) == (
        8,
        5,
        1,
        1,
    )
    assert env.main_address == "gpu017"  # the first node of the list is the rendezvous host
    # from the job id's last digits: the same on every task
    assert env.main_port == 15000 + 4242 % 10000
    # what the launcher checks before any process group exists: the flags match the allocation, or
    # one error
    env.validate_settings(num_devices=4, num_nodes=2)
    monkeypatch.setenv("SLURM_NTASKS_PER_NODE", "8")
    with pytest.raises(
        ValueError, match=r"`devices=4` in Lightning, but .* `--ntasks-per-node=8` does not match"
    ):
        env.validate_settings(num_devices=4, num_nodes=2)
