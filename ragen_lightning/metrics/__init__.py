"""Collapse diagnostics and rollout statistics.

``functional`` is pure torch math (importable without lightning, torchmetrics or vllm; a test checks this). The
TorchMetrics ``Metric`` classes are loaded lazily on first attribute access, so ``import
ragen_lightning.metrics.functional`` does not pull in torchmetrics.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_CLASSES = {
    "TokenEntropy": "collapse",
    "MutualInformation": "collapse",
    "ValidThinkingRate": "collapse",
    "RewardMetrics": "rollout",
    "LengthMetrics": "rollout",
    "FormatErrorRate": "rollout",
    "FilterKeepRatio": "rollout",
    "RatioMetric": "rollout",
    "SumStateMetric": "rollout",
}

__all__ = [
    "FilterKeepRatio",
    "FormatErrorRate",
    "LengthMetrics",
    "MutualInformation",
    "RatioMetric",
    "RewardMetrics",
    "SumStateMetric",
    "TokenEntropy",
    "ValidThinkingRate",
    "functional",
]

if TYPE_CHECKING:  # pragma: no cover
    from . import functional
    from .collapse import MutualInformation, TokenEntropy, ValidThinkingRate
    from .rollout import (
        FilterKeepRatio,
        FormatErrorRate,
        LengthMetrics,
        RatioMetric,
        RewardMetrics,
        SumStateMetric,
    )


def __getattr__(name: str) -> Any:
    if name == "functional":
        return importlib.import_module(".functional", __name__)
    if name in _CLASSES:
        return getattr(importlib.import_module(f".{_CLASSES[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
