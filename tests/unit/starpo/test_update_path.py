"""The reading path of one PPO mini-batch update: which library files run, and no lambda among them.

``training_step`` (``starpo/module.py``) hands the batch to ``ppo_update``; from there the update
should be readable in a handful of files. This traces one real update of the tiny model (actor and
critic, two micro-batches) and lists the library files whose functions ran.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

import ragen_lightning
from ragen_lightning.starpo.optim import StepContext
from ragen_lightning.starpo.ppo import ppo_update
from ragen_lightning.starpo.scoring import MicroBatching
from ragen_lightning.starpo.settings import ModuleSettings
from ragen_lightning.types import UpdateBatch

ROOT = Path(ragen_lightning.__file__).parent

# The update's own logic: training_step (starpo/module.py, which calls ppo_update) plus these four.
UPDATE_LOGIC = {"starpo/ppo.py", "starpo/optim.py", "starpo/scoring.py", "algos/losses.py"}
# Kernels and plumbing the logic calls, each a leaf that reads on its own: log-probs and entropy of
# logits, the attention-mask helpers of a forward pass, the collectives (identity on one process),
# the batch container and the settings' derived views.
LEAVES = {
    "algos/logits.py",
    "models/forward.py",
    "parallel/ranks.py",
    "types.py",
    "starpo/settings.py",
}


class _Critic(torch.nn.Module):
    """A value per position: ``critic(input_ids=..., attention_mask=...) -> [b, t]``."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(256, 4)
        self.head = torch.nn.Linear(4, 1)

    def forward(self, input_ids, attention_mask=None):
        return self.head(self.embed(input_ids)).squeeze(-1)


def _trace(fn):
    seen: dict[str, set[str]] = {}

    def profile(frame, event, arg):
        if event == "call":
            path = Path(frame.f_code.co_filename)
            if path.is_relative_to(ROOT):
                seen.setdefault(path.relative_to(ROOT).as_posix(), set()).add(frame.f_code.co_name)

    sys.setprofile(profile)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return seen


@pytest.fixture
def tiny_model(tiny_path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_path).float()


def test_one_mini_batch_update_runs_in_few_library_files_and_no_lambda(tiny_model):
    torch.manual_seed(0)
    ids = torch.randint(3, 200, (4, 7))
    mask = torch.zeros(4, 6, dtype=torch.bool)
    mask[:, 3:] = True
    zeros = torch.zeros(4, 6)
    data = UpdateBatch(
        ids,
        torch.ones_like(ids),
        mask,
        advantages=torch.tensor([[1.0], [-1.0], [0.5], [0.0]]).expand(4, 6),
        engine_logprobs=zeros,
        values=zeros,
        returns=torch.ones(4, 6),
    )
    settings = ModuleSettings.build(update={"mini_batch_size": 4, "micro_batch_size": 2})
    opt = torch.optim.AdamW(tiny_model.parameters(), lr=1e-3)
    actor = StepContext("actor", tiny_model, opt, MicroBatching(size=2), grad_clip=1.0)
    net = _Critic()
    critic = StepContext("critic", net, torch.optim.SGD(net.parameters(), lr=0.1), MicroBatching(2))
    before = net.head.weight.detach().clone()

    def update():
        return ppo_update(data, settings, actor=actor, critic=critic, iteration=0)

    seen = _trace(update)
    assert set(seen) == UPDATE_LOGIC | LEAVES, sorted(seen)
    assert not any("<lambda>" in names for names in seen.values())
    # both networks were stepped, through the loss functions of losses.py
    assert not torch.equal(before, net.head.weight)
    assert {"actor_loss", "value_loss", "masked_mean"} <= seen["algos/losses.py"]
