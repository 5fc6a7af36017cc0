"""CUDA checks (marked ``gpu``: deselected by default; run with ``python -m pytest -m gpu
tests/gpu`` on a GPU machine).

They exercise what a GPU machine without vLLM has: the HF engine and one StarPO iteration on CUDA,
fp32 and bf16.
"""

from __future__ import annotations

import lightning as L
import pytest
import torch

import envs  # noqa: F401
from ragen_lightning import models
from ragen_lightning.rollout.engine import HFEngine, SamplingParams
from ragen_lightning.rollout.settings import EpisodeSettings
from ragen_lightning.starpo.module import StarPOModule
from tests.data_groups import data_module

pytestmark = pytest.mark.gpu


@pytest.fixture(autouse=True)
def _cuda():
    if not torch.cuda.is_available():
        pytest.fail("the gpu-marked tests need a CUDA device (they are deselected by default)")


def test_hf_engine_greedy_on_cuda_equals_cpu(tiny_path, tiny_tokenizer):
    prompts = [
        tiny_tokenizer.encode(t) for t in ("Turn 1: State", "<think> push the box", "Up || Left")
    ]
    params = SamplingParams(temperature=0.0, max_new_tokens=12)
    outs = {}
    for device in ("cpu", "cuda"):
        model = models.load_causal_lm(str(tiny_path), "float32").to(device)
        engine = HFEngine(model, [tiny_tokenizer.eos_token_id], tiny_tokenizer.pad_token_id)
        outs[device] = engine.generate(prompts, params)
    assert [g.token_ids for g in outs["cuda"]] == [g.token_ids for g in outs["cpu"]]
    for a, b in zip(outs["cuda"], outs["cpu"]):
        assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs)) < 1e-4


@pytest.mark.parametrize(
    "precision, dtype",
    [("32-true", "float32"), ("bf16-mixed", "float32"), ("bf16-true", "bfloat16")],
)
def test_one_starpo_iteration_on_cuda(tmp_path, tiny_path, precision, dtype, training_devices):
    module = StarPOModule(
        model=str(tiny_path),
        dtype=dtype,
        update={"mini_batch_size": 8, "micro_batch_size": 4},
        optim={"actor_lr": 1e-3, "critic_lr": 1e-3},
    )
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
    trainer = L.Trainer(
        accelerator="gpu",
        devices=1,
        precision=precision,
        max_epochs=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        num_sanity_val_steps=0,
        limit_val_batches=0,
        default_root_dir=tmp_path,
        callbacks=[training_devices],
    )
    trainer.strategy.connect(module)
    module.configure_model()
    before = {k: v.detach().clone() for k, v in module.actor.named_parameters()}
    trainer.fit(module, dm)
    assert training_devices.seen == {"cuda"}  # after fit Lightning moves the module back to the CPU
    assert trainer.global_step == 2  # one actor and one critic step
    assert any(
        not torch.equal(before[k], v.cpu().to(before[k].dtype))
        for k, v in module.actor.named_parameters()
    )
    assert module.skips.total == 0
