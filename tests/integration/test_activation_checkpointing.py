"""``--model.update.activation_checkpointing``: activations recomputed in backward, the same update
as without."""

from __future__ import annotations

import lightning as L
import pytest
import torch

import envs  # noqa: F401
from ragen_lightning.rollout.settings import EpisodeSettings
from ragen_lightning.starpo.module import StarPOModule
from tests.data_groups import data_module

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("pack", [False, True])
def test_activation_checkpointing_gives_the_same_update(tmp_path, tiny_path, pack):
    """Also packed: a block recomputed in backward attends within the packed rows as its forward
    did."""
    results = []
    for on in (False, True):
        torch.manual_seed(0)
        module = StarPOModule(
            model=str(tiny_path),
            advantage={"estimator": "gae"},
            update={
                "mini_batch_size": 8,
                "micro_batch_size": 4,
                "activation_checkpointing": on,
                "pack": pack,
            },
            optim={"actor_lr": 1e-2, "critic_lr": 1e-2},
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
                max_new_tokens=8,
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
        assert module.actor.is_gradient_checkpointing is on
        assert module.critic.backbone.is_gradient_checkpointing is on
        results.append({k: v.detach().clone() for k, v in module.state_dict().items()})
    off, on = results
    # the update ran (the value head starts at zero)
    assert off["critic.value_head.weight"].abs().sum() > 0
    for k in off:
        torch.testing.assert_close(on[k], off[k], atol=1e-6, rtol=0, msg=k)
