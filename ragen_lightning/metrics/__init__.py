"""Rollout statistics and collapse diagnostics.

``functional`` is the pure torch math, one function per statistic (importable without lightning,
torchmetrics or vllm; a test checks this); ``cross`` builds and scores cross log-prob matrices. The
TorchMetrics ``Metric`` classes of ``rollout`` (accumulators of the functional values, synced across
ranks) are loaded lazily on first attribute access, so ``import ragen_lightning.metrics.functional``
does not pull in torchmetrics.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_CLASSES = {
    "RewardMetrics": "rollout",
    "LengthMetrics": "rollout",
    "ValidThinkingRate": "rollout",
    "RatioMetric": "rollout",
    "SumStateMetric": "rollout",
}

__all__ = [
    "LengthMetrics",
    "RatioMetric",
    "RewardMetrics",
    "SumStateMetric",
    "ValidThinkingRate",
    "functional",
]

if TYPE_CHECKING:  # pragma: no cover
    from . import functional
    from .rollout import (
        LengthMetrics,
        RatioMetric,
        RewardMetrics,
        SumStateMetric,
        ValidThinkingRate,
    )


def __getattr__(name: str) -> Any:
    if name == "functional":
        return importlib.import_module(".functional", __name__)
    if name in _CLASSES:
        return getattr(importlib.import_module(f".{_CLASSES[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
