"""``--model.update.pack`` and ``--model.update.micro_batch_tokens``: the same fit as micro-batches
of rows."""

from __future__ import annotations

from functools import partial

import lightning as L
import pytest
import torch

import envs  # noqa: F401
from ragen_lightning.rollout.settings import EpisodeSettings
from ragen_lightning.starpo.module import StarPOModule
from tests.data_groups import data_module

pytestmark = pytest.mark.slow


def _fit(tmp_path, tiny_path, **update):
    torch.manual_seed(0)
    module = StarPOModule(
        model=str(tiny_path),
        advantage={"estimator": "gae"},
        update={"mini_batch_size": 8, "micro_batch_size": 2, **update},
        # SGD: a step proportional to the gradient (Adam's m / sqrt(v) turns float
        # rounding in near-zero gradients into lr-sized differences)
        optim={
            "actor_optimizer": partial(torch.optim.SGD, lr=0.5),
            "critic_optimizer": partial(torch.optim.SGD, lr=0.5),
        },
    )
    dm = data_module(
        env_id="ragen/Bandit-v0",
        num_groups=2,
        group_size=4,
        num_iterations=2,
        episode=EpisodeSettings(
            max_turns=1,
            max_actions_per_turn=1,
            max_actions_per_episode=1,
            max_new_tokens=12,
            max_model_len=1024,
        ),
        val_num_groups=2,
    )
    L.Trainer(
        accelerator="cpu",
        devices=1,
        max_epochs=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        limit_val_batches=0,
        default_root_dir=tmp_path,
    ).fit(module, dm)
    return module, {k: v.detach().clone() for k, v in module.state_dict().items()}


def test_packed_and_token_budget_updates_equal_the_row_micro_batches(tmp_path, tiny_path):
    _, rows = _fit(tmp_path, tiny_path)
    # a different update lands far outside the tolerance below
    _, other = _fit(tmp_path, tiny_path, ppo_epochs=2)
    assert max(float((other[k] - rows[k]).abs().max()) for k in rows) > 1e-3
    for update in (
        {"micro_batch_tokens": 600},
        {"micro_batch_tokens": 600, "pack": True},
        {"pack": True},
        # packed micro-batches on two threads at once
        {"pack": True, "micro_batch_threads": 2},
    ):
        _, got = _fit(tmp_path, tiny_path, **update)
        # the update ran (the value head starts at zero)
        assert rows["critic.value_head.weight"].abs().sum() > 0
        for k in rows:
            torch.testing.assert_close(
                got[k], rows[k], atol=1e-5, rtol=0, msg=lambda m, k=k, u=update: f"{u} {k}: {m}"
            )
