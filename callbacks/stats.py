"""RolloutStatistics: the TorchMetrics classes of ``ragen_lightning.metrics`` fed from each
iteration's kept rollout.

Logs only what the data module does not already log as floats (``train/*`` holds success, score,
turns, actions, response length and pass@group_size of the whole rollout; ``rollout/*`` the filter
statistics):

* ``stats/pass@k`` for each ``k`` in ``ks`` (unbiased estimator per group, ``RewardMetrics``);
* ``stats/think_tokens_mean``: reasoning tokens (strictly between ``<think>`` and ``</think>``) per
  trajectory, and ``stats/valid_thinking_rate``: turns with a non-empty reasoning / turns
  (``LengthMetrics``, ``ValidThinkingRate``); a shrinking, input-independent reasoning length is one
  face of template collapse.

The metrics are reset every iteration and computed with TorchMetrics' cross-rank sync, so under DDP
every rank logs the value over all ranks' rollouts. Computed on the kept (post-filter) trajectories,
group-major.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from lightning.pytorch.callbacks import Callback

from callbacks._common import iteration_data, log_values
from ragen_lightning.metrics import LengthMetrics, RewardMetrics, ValidThinkingRate
from ragen_lightning.metrics.cross import (
    ReasoningFinder,
    thinking_flags,
    trajectory_turns,
)


class RolloutStatistics(Callback):
    """pass@k, reasoning length and valid-thinking rate of the kept rollouts (module docstring).

    Args:
        ks: the k of ``stats/pass@k``.
    """

    def __init__(self, ks: Sequence[int] = (1, 2, 4, 8)):
        self.ks = tuple(int(k) for k in ks)
        self.rewards = RewardMetrics(ks=self.ks)
        self.lengths = LengthMetrics()
        self.valid = ValidThinkingRate()
        self._finder: ReasoningFinder | None = None

    def values(self, trajectories: list[Any], group_size: int, tokenizer: Any) -> dict[str, float]:
        """Update the metrics with one iteration's trajectories and return the logged values."""
        for m in (self.rewards, self.lengths, self.valid):
            m.reset()
        if self._finder is None:
            self._finder = ReasoningFinder(tokenizer)
        scores = torch.tensor([t.score for t in trajectories], dtype=torch.float32).view(
            -1, group_size
        )
        success = torch.tensor([bool(t.success) for t in trajectories]).view(-1, group_size)
        self.rewards.update(scores, success)
        turns = trajectory_turns(trajectories, self._finder)
        self.lengths.update(
            think_tokens=torch.tensor(
                [float(sum(len(t.reasoning or []) for t in ts)) for ts in turns]
            )
        )
        self.valid.update(thinking_flags(turns))
        out = {
            f"stats/{k}": float(v)
            for k, v in self.rewards.compute().items()
            if k.startswith("pass@")
        }
        out["stats/think_tokens_mean"] = float(self.lengths.compute()["think_tokens_mean"])
        out["stats/valid_thinking_rate"] = float(self.valid.compute())
        return out

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        data = iteration_data(pl_module)
        if data is None or not data[0].trajectories:
            return
        group_size = int(trainer.datamodule.settings.training.group_size)
        log_values(trainer, self.values(data[0].trajectories, group_size, pl_module.tokenizer))

    def state_dict(self) -> dict[str, Any]:
        return {}  # reset every iteration: nothing to carry over

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        return None
