"""Supervised warm start from the environments' own solvers (RAGEN v1's SFT step, token-exact).

* :mod:`~ragen_lightning.sft.experts`: per-env experts, the :class:`ExpertEngine` and demonstration
  collection through the real rollout runner;
* :mod:`~ragen_lightning.sft.module`: the shared SFT loss, :class:`SFTModule` and
  :class:`DemonstrationDataModule`;
* :mod:`~ragen_lightning.sft.training`: the warm start's plain-PyTorch SFT loop (:func:`train_sft`);
* :mod:`~ragen_lightning.sft.warm_start`: the cached :func:`warm_start` used before RL, and its
  evaluation.

Submodules are imported lazily so ``import ragen_lightning.sft.experts`` does not pull in Lightning.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "ExpertEngine": "experts",
    "ExpertTurn": "experts",
    "collect_demonstrations": "experts",
    "expert_actions": "experts",
    "expert_turn": "experts",
    "SFTModule": "module",
    "DemonstrationDataModule": "module",
    "SFTBatch": "module",
    "sft_loss": "module",
    "causal_lm_sft_loss": "module",
    "warm_start": "warm_start",
    "evaluate_policy": "warm_start",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
