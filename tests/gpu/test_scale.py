"""CUDA checks at scale (marked ``gpu``: deselected by default; ``python -m pytest -m gpu
tests/gpu`` on a GPU machine).

bf16, LoRA / QLoRA, FSDP2 over two GPUs (skipped, saying so, with fewer) and a
Qwen2.5-0.5B-architecture StarPO iteration through the GPU validation kit
(``benchmarks/gpu_kit.py``) with its peak memory checked against the memory plan. Written without a
GPU to run them on (none was available in the session that wrote them): they assert behaviour
(finite logged losses, weights that changed or stayed frozen, memory bounds), not timings.
"""

from __future__ import annotations

import csv
import math
import os
import subprocess
import sys
from pathlib import Path

import lightning as L
import pytest
import torch

import envs  # noqa: F401
from ragen_lightning.models.lora import LoraSettings
from ragen_lightning.models.memory import GIB, PUBLISHED, plan
from ragen_lightning.rollout.settings import EpisodeSettings
from ragen_lightning.starpo.module import StarPOModule
from tests.conftest import load_script
from tests.data_groups import data_module

pytestmark = pytest.mark.gpu
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _cuda():
    if not torch.cuda.is_available():
        pytest.fail("the gpu-marked tests need a CUDA device (they are deselected by default)")


def _two_gpus():
    if torch.cuda.device_count() < 2:
        pytest.skip(
            f"FSDP2 across GPUs needs 2 CUDA devices; this machine has {torch.cuda.device_count()}"
        )


@pytest.fixture(scope="module")
def kit():
    return load_script("benchmarks/gpu_kit.py", "bench_gpu_kit")


def _trainer_for(
    module: StarPOModule, tmp_path, precision: str, callbacks: list, accelerator: str = "gpu"
) -> L.Trainer:
    """A one-iteration trainer with the module's networks already built (to compare weights before
    and after)."""
    trainer = L.Trainer(
        accelerator=accelerator,
        devices=1,
        precision=precision,
        max_epochs=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        num_sanity_val_steps=0,
        limit_val_batches=0,
        default_root_dir=tmp_path,
        callbacks=callbacks,
    )
    trainer.strategy.connect(module)
    module.configure_model()
    return trainer


def _fit(trainer: L.Trainer, module: StarPOModule) -> None:
    dm = data_module(
        env_id="ragen/Bandit-v0",
        num_groups=2,
        group_size=4,
        num_iterations=1,
        episode=EpisodeSettings(
            max_turns=1,
            max_actions_per_turn=1,
            max_actions_per_episode=1,
            max_new_tokens=12,
            max_model_len=1024,
        ),
        val_num_groups=2,
    )
    trainer.fit(module, dm)


def _finite_logged(trainer: L.Trainer, *keys: str) -> None:
    # the module logs only finite values (StarPOModule._log): a missing key is a non-finite one
    for key in keys:
        assert key in trainer.callback_metrics, f"{key} not logged (non-finite?)"
        assert math.isfinite(float(trainer.callback_metrics[key]))


def test_bf16_true_trains_bf16_weights_with_finite_losses(tmp_path, tiny_path, training_devices):
    module = StarPOModule(
        model=str(tiny_path),
        dtype="bfloat16",
        update={"mini_batch_size": 8, "micro_batch_size": 4},
        optim={"actor_lr": 1e-3, "critic_lr": 1e-3},
    )
    trainer = _trainer_for(module, tmp_path, "bf16-true", [training_devices])
    before = {k: v.detach().clone() for k, v in module.actor.named_parameters()}
    _fit(trainer, module)
    params = dict(module.actor.named_parameters())
    assert {p.dtype for p in params.values()} == {torch.bfloat16}
    assert training_devices.seen == {"cuda"}  # after fit Lightning moves the module back to the CPU
    assert any(not torch.equal(before[k], p.detach().cpu()) for k, p in params.items())
    _finite_logged(trainer, "actor/pg_loss", "critic/vf_loss")
    assert module.skips.total == 0


@pytest.mark.parametrize("quantization", ["none", "nf4"])
def test_lora_and_qlora_iteration_trains_adapters_only(
    tmp_path, tiny_path, quantization, training_devices
):
    if quantization == "nf4":
        pytest.importorskip(
            "bitsandbytes", reason="QLoRA needs bitsandbytes (pip install bitsandbytes)"
        )
    settings = LoraSettings(rank=8, alpha=16, quantization=quantization)
    module = StarPOModule(
        model=str(tiny_path),
        dtype="bfloat16",
        lora=settings,
        update={"mini_batch_size": 8, "micro_batch_size": 4},
        optim={"actor_lr": 1e-2, "critic_lr": 1e-2},
    )
    trainer = _trainer_for(module, tmp_path, "bf16-mixed", [training_devices])
    named = dict(module.actor.named_parameters())
    adapters = {k for k in named if "lora_" in k}
    assert adapters and {k for k, p in named.items() if p.requires_grad} == adapters
    before = {k: p.detach().float().cpu().clone() for k, p in named.items()}
    _fit(trainer, module)
    after = {k: p.detach().float().cpu() for k, p in module.actor.named_parameters()}
    # lora_B starts at 0: one step moves it
    assert any(not torch.equal(before[k], after[k]) for k in adapters)
    # the base stays frozen
    assert all(torch.equal(before[k], after[k]) for k in named if k not in adapters)
    if quantization == "nf4":
        import bitsandbytes as bnb

        assert any(isinstance(m, bnb.nn.Linear4bit) for m in module.actor.modules())
    assert training_devices.seen == {"cuda"}  # after fit Lightning moves the module back to the CPU
    _finite_logged(trainer, "actor/pg_loss", "critic/vf_loss")
    assert module.skips.total == 0


def test_fsdp2_on_two_gpus_through_the_cli_exports_changed_finite_weights(tmp_path, tiny_path):
    _two_gpus()
    cmd = [
        sys.executable,
        str(ROOT / "main.py"),
        "fit",
        "--config",
        str(ROOT / "configs" / "bandit.yaml"),
        "--config",
        str(ROOT / "configs" / "fsdp.yaml"),
        "--trainer.accelerator",
        "gpu",
        "--trainer.devices",
        "2",
        "--model.model",
        str(tiny_path),
        "--model.warm_start",
        "false",
        "--data.engine.name",
        "hf",
        "--model.update.micro_batch_threads",
        "1",
        "--model.critic.in_background",
        "false",
        "--trainer.logger",
        "lightning.pytorch.loggers.CSVLogger",
        "--trainer.logger.save_dir",
        "logs",
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
        "--data.training.num_iterations",
        "2",
        "--trainer.limit_val_batches",
        "0",
        "--validate_first",
        "false",
        "--model.optim.actor_lr",
        "1e-3",
        "--model.export_dir",
        "exported",
    ]
    proc = subprocess.run(
        cmd,
        check=False,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
        env=dict(os.environ, WANDB_MODE="offline", HF_HUB_OFFLINE="1"),
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    with open(next((tmp_path / "logs").rglob("metrics.csv"))) as f:
        rows = list(csv.DictReader(f))
    losses = [float(r["actor/pg_loss"]) for r in rows if r.get("actor/pg_loss")]
    assert len(losses) == 2 and all(math.isfinite(x) for x in losses)
    from transformers import AutoModelForCausalLM

    start = dict(AutoModelForCausalLM.from_pretrained(tiny_path).named_parameters())
    trained = dict(AutoModelForCausalLM.from_pretrained(tmp_path / "exported").named_parameters())
    assert trained.keys() == start.keys()
    assert all(torch.isfinite(p).all() for p in trained.values())
    assert any(not torch.equal(start[k], trained[k]) for k in start)


def _kit_row(kit, tmp_path, devices: int):
    out = tmp_path / "table.md"
    rows = kit.main(
        [
            "--recipes",
            "24gb-qwen2.5-0.5b-full",
            "--iterations",
            "2",
            "--num-groups",
            "2",
            "--group-size",
            "4",
            "--max-turns",
            "1",
            "--devices",
            str(devices),
            "--budget-s",
            "500",
            "--run-dir",
            str(tmp_path / "runs"),
            "--out",
            str(out),
        ]
    )
    assert out.is_file() and "24gb-qwen2.5-0.5b-full" in out.read_text()
    return rows[0]


def test_qwen2_5_0_5b_architecture_iteration_peak_within_the_plan(kit, tmp_path):
    """Random-weight Qwen2.5-0.5B, the 24 GB full fine-tuning recipe (PPO: actor + critic, fp32
    master weights, bf16 autocast), 2 groups x 4 one-turn episodes. The allocator's peak must hold
    at least 3/4 of the plan's static part (weights, gradients and AdamW states of both networks:
    one network's gradients are freed while the other steps) and at most the plan's peak (planned
    for 2048-token samples; these are a few hundred tokens)."""
    row = _kit_row(kit, tmp_path, devices=1)
    assert row.status == "ok" and row.iterations == 2
    static = (
        plan(PUBLISHED["Qwen/Qwen2.5-0.5B-Instruct"], dtype="float32", with_critic=True).static
        / GIB
    )
    assert row.planned_gib is not None and row.planned_gib > static
    assert 0.75 * static <= row.peak_allocated_gib <= row.planned_gib
    assert row.peak_allocated_gib <= row.peak_reserved_gib <= row.device_total_gib
    assert row.rollout_tokens_per_s > 0 and row.update_tokens_per_s > 0
    if row.update_mfu is not None:  # a device the kit knows the peak of
        assert 0 < row.update_mfu < 1 and 0 < row.rollout_mfu < 1


def test_kit_runs_the_recipe_under_fsdp2_on_two_gpus(kit, tmp_path):
    _two_gpus()
    row = _kit_row(kit, tmp_path, devices=2)
    assert row.status == "ok" and row.mode == "full + FSDP2" and row.devices == 2
    # the plan knows no sharding: each rank holds about half the static part
    single_gpu_plan = row.planned_gib
    assert 0 < row.peak_allocated_gib < single_gpu_plan
