"""RAGEN's early-stopping rules (SPEC 5.6) as small state machines the module feeds every iteration.

* Reward-variance collapse: the baseline is the mean in-group reward std of the first ``window`` trained
  iterations; afterwards, the run stops when each of the last ``window`` trained iterations is below
  ``ratio * baseline`` (the "echo trap": groups stop disagreeing, so there is nothing left to learn from).
* Low validation success: the run stops after ``patience`` consecutive validations with success below
  ``threshold``.

(The third rule, consecutive empty filter results, lives with the filter in the data module.) Both keep their state
in ``state_dict`` so a resumed run continues the same windows.
"""

from __future__ import annotations

from collections import deque
from typing import Any


class RewardVarianceCollapse:
    """Stop when the in-group reward std stays below ``ratio`` x its early baseline for ``window`` iterations.

    Args:
        window: iterations in the baseline and in the sliding window (0 disables the rule).
        ratio: fraction of the baseline under which an iteration counts as collapsed.
    """

    def __init__(self, window: int = 10, ratio: float = 0.1):
        if window < 0 or not 0 <= ratio <= 1:
            raise ValueError(f"reward-variance collapse needs window >= 0 and 0 <= ratio <= 1, got {window}, {ratio}")
        self.window, self.ratio = window, ratio
        self.baseline_values: list[float] = []
        self.recent: deque[float] = deque(maxlen=max(window, 1))

    @property
    def baseline(self) -> float | None:
        if self.window and len(self.baseline_values) >= self.window:
            return sum(self.baseline_values) / len(self.baseline_values)
        return None

    def update(self, reward_std: float) -> bool:
        """Feed one trained iteration's mean in-group reward std; True when the run should stop."""
        if not self.window:
            return False
        if self.baseline is None:
            self.baseline_values.append(float(reward_std))
            return False
        self.recent.append(float(reward_std))
        return len(self.recent) == self.window and all(v < self.ratio * self.baseline for v in self.recent)

    def state_dict(self) -> dict[str, Any]:
        return {"baseline_values": list(self.baseline_values), "recent": list(self.recent)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.baseline_values = list(state.get("baseline_values", []))
        self.recent = deque(state.get("recent", []), maxlen=max(self.window, 1))


class LowValidationSuccess:
    """Stop after ``patience`` consecutive validations whose success is below ``threshold`` (0 disables)."""

    def __init__(self, patience: int = 5, threshold: float = 0.01):
        if patience < 0:
            raise ValueError(f"low-validation-success patience must be >= 0, got {patience}")
        self.patience, self.threshold = patience, threshold
        self.streak = 0

    def update(self, success: float) -> bool:
        if not self.patience:
            return False
        self.streak = self.streak + 1 if success < self.threshold else 0
        return self.streak >= self.patience

    def state_dict(self) -> dict[str, Any]:
        return {"streak": self.streak}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.streak = int(state.get("streak", 0))
