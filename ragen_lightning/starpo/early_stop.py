"""RAGEN's early-stopping rules (RAGEN's trainer) as small state machines the module feeds every
iteration.

* Reward-variance collapse: the baseline is the mean in-group reward std of the first ``window``
  trained iterations; afterwards, the run stops when each of the last ``window`` trained iterations
  is below ``ratio * baseline`` (the "echo trap": groups stop disagreeing, so there is nothing left
  to learn from).
* Low validation success: the run stops after ``patience`` consecutive validations with success
  below ``threshold``.

(The third rule, consecutive empty filter results, lives with the filter in the data module.) Both
keep their state in ``state_dict`` so a resumed run continues the same windows.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any

from ragen_lightning.errors import Domain, check_domains


@dataclass(frozen=True)
class EarlyStopSettings:
    """RAGEN's early stops (``--model.early_stop.*``; the empty-filter stop is
    ``--data.training.empty_stop_steps``).

    Args:
        rv_collapse_window: baseline = mean in-group reward std of the first N trained iterations; stop when the
            last N are all below ``rv_collapse_ratio`` x baseline (0 disables).
        rv_collapse_ratio: the collapse threshold as a fraction of the baseline.
        low_val_success_patience: stop after this many consecutive validations with success below
            ``low_val_success_threshold`` (0 disables).
        low_val_success_threshold: the validation success counted as "low".
    """

    rv_collapse_window: int = 10
    rv_collapse_ratio: float = 0.1
    low_val_success_patience: int = 5
    low_val_success_threshold: float = 0.01

    def __post_init__(self):
        windows, fractions = Domain(low=0, integer=True), Domain(0, 1)
        check_domains(
            "--model.early_stop.",
            self,
            {
                "rv_collapse_window": windows,
                "low_val_success_patience": windows,
                "rv_collapse_ratio": fractions,
                "low_val_success_threshold": fractions,
            },
        )


class RewardVarianceCollapse:
    """Stop when the in-group reward std stays below ``ratio`` x its early baseline for ``window``
    iterations.

    Args:
        window: iterations in the baseline and in the sliding window (0 disables the rule).
        ratio: fraction of the baseline under which an iteration counts as collapsed.
    """

    def __init__(self, window: int = 10, ratio: float = 0.1):
        if window < 0 or not 0 <= ratio <= 1:
            raise ValueError(
                f"reward-variance collapse needs window >= 0 and 0 <= ratio <= 1, got {window}, {ratio}"
            )
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
        return len(self.recent) == self.window and all(
            v < self.ratio * self.baseline for v in self.recent
        )

    def state_dict(self) -> dict[str, Any]:
        return {"baseline_values": list(self.baseline_values), "recent": list(self.recent)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.baseline_values = list(state.get("baseline_values", []))
        self.recent = deque(state.get("recent", []), maxlen=max(self.window, 1))


class LowValidationSuccess:
    """Stop after ``patience`` consecutive validations whose success is below ``threshold`` (0
    disables)."""

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


class EarlyStops:
    """Both rules of one run: feed them, get the reason to stop (None to go on); one checkpoint
    state."""

    def __init__(self, settings: EarlyStopSettings):
        self.rv_collapse = RewardVarianceCollapse(
            settings.rv_collapse_window, settings.rv_collapse_ratio
        )
        self.low_val_success = LowValidationSuccess(
            settings.low_val_success_patience, settings.low_val_success_threshold
        )

    def after_iteration(self, reward_std: float) -> str | None:
        rule = self.rv_collapse
        if rule.update(reward_std):
            return (
                f"in-group reward std stayed below {rule.ratio} x its baseline ({rule.baseline:.4g}) for "
                f"{rule.window} iterations"
            )
        return None

    def after_validation(self, success: float) -> str | None:
        rule = self.low_val_success
        if rule.update(success):
            return f"validation success below {rule.threshold} for {rule.patience} validations in a row"
        return None

    def state_dict(self) -> dict[str, Any]:
        return {
            "rv_collapse": self.rv_collapse.state_dict(),
            "low_val_success": self.low_val_success.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.rv_collapse.load_state_dict(state.get("rv_collapse", {}))
        self.low_val_success.load_state_dict(state.get("low_val_success", {}))
