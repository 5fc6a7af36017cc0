"""TorchMetrics for rollout statistics (RAGEN's es_manager; RAGEN's rollout_filter; RAGEN's
collapse_metrics): rewards (mean, in-group std, success, pass@k), lengths and the valid-thinking
rate; fed by the ``callbacks.RolloutStatistics`` callback.

The classes only accumulate: the math is ``functional`` (``within_group_reward_std``, ``pass_at_k``,
``valid_thinking_rate``). Every metric keeps float64 sums and counts with ``dist_reduce_fx="sum"``:
the all-reduced state of W ranks equals the state of one process that saw all their updates, so
``compute`` is exact across ranks (never a mean of per-rank means), and ``merge_state`` works.
Nothing seen gives 0, not NaN. ``SumStateMetric`` and ``RatioMetric`` are the shared plumbing.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torchmetrics import Metric

from .functional import pass_at_k, within_group_reward_std

__all__ = ["LengthMetrics", "RatioMetric", "RewardMetrics", "SumStateMetric", "ValidThinkingRate"]


class SumStateMetric(Metric):
    """A ``Metric`` whose states are float64 zeros of a given shape, summed across ranks."""

    # update() never reads the accumulated state: forward() may use the fast path
    full_state_update = False
    is_differentiable = False
    higher_is_better: bool | None = None

    def _add_sum_state(self, name: str, shape: tuple[int, ...] = ()) -> None:
        self.add_state(name, default=torch.zeros(shape, dtype=torch.float64), dist_reduce_fx="sum")

    def _add(self, name: str, value: torch.Tensor | float) -> None:
        state = getattr(self, name)
        setattr(
            self,
            name,
            state + torch.as_tensor(value, device=state.device).to(torch.float64),
        )


def _ratio(numerator: torch.Tensor, denominator: torch.Tensor) -> torch.Tensor:
    """``numerator / denominator`` in float32, 0 where the denominator is 0."""
    safe = torch.where(denominator > 0, denominator, torch.ones_like(denominator))
    return (numerator / safe * (denominator > 0)).float()


def _f64(x: torch.Tensor | float | bool) -> torch.Tensor:
    return torch.as_tensor(x).to(torch.float64)


class RatioMetric(SumStateMetric):
    """``Σ numerator / Σ denominator`` over all updates (and ranks); 0 before any denominator.

    Generic: ``higher_is_better`` is None here and set by subclasses.

    ``update(flags)`` with a bool / 0-1 tensor adds ``flags.sum()`` over ``flags.numel()``;
    ``update(numerator, denominator)`` adds counts (tensors of any shape are summed, or numbers).
    """

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self._add_sum_state("numerator")
        self._add_sum_state("denominator")

    def update(
        self,
        numerator: torch.Tensor | float,
        denominator: torch.Tensor | float | None = None,
    ) -> None:
        num = _f64(numerator)
        den = _f64(num.numel()) if denominator is None else _f64(denominator).sum()
        self._add("numerator", num.sum())
        self._add("denominator", den)

    def compute(self) -> torch.Tensor:
        return _ratio(self.numerator, self.denominator)


class RewardMetrics(SumStateMetric):
    """Reward mean, within-group reward std, success rate and pass@k of grouped rollouts.

    ``update(rewards [G, N], success [G, N] | None)`` (group-major, N = group size, fixed per
    update).

    - ``reward_mean = Σ r / #trajectories``; ``success_rate = Σ success / #trajectories``.
    - ``in_group_reward_std = Σ_g std_g / #groups`` with ``std_g`` the unbiased in-group std (0 for
      N = 1, exactly 0 for identical rewards): RAGEN-2's signal-to-noise proxy. Healthy: clearly
      above 0. Falling towards 0 (with falling token entropy) is the echo-trap warning: groups stop
      disagreeing, so the task gradient vanishes.
    - ``pass@k`` = mean over groups of the unbiased estimator ``1 − C(N − c, k)/C(N, k)`` (c
      successes in the group; k > N clipped to N). pass@k well above success_rate = diversity worth
      exploiting; pass@k ≈ pass@1 = collapse.

    ``higher_is_better`` refers to reward, success and pass@k (the in-group std is a diagnostic, not
    a target).
    """

    higher_is_better = True

    def __init__(self, ks: Sequence[int] = (1, 2, 4, 8), **kwargs) -> None:
        super().__init__(**kwargs)
        if any(k < 1 for k in ks):
            raise ValueError(f"ks must be >= 1, got {tuple(ks)}")
        self.ks = tuple(int(k) for k in ks)
        for name in (
            "reward_sum",
            "trajectories",
            "group_std_sum",
            "groups",
            "success_sum",
            "success_trajectories",
            "success_groups",
        ):
            self._add_sum_state(name)
        self._add_sum_state("pass_sum", (len(self.ks),))

    def update(self, rewards: torch.Tensor, success: torch.Tensor | None = None) -> None:
        if rewards.dim() != 2:
            raise ValueError(
                f"rewards must be [num_groups, group_size], got shape {tuple(rewards.shape)}"
            )
        num_groups, group_size = rewards.shape
        r = rewards.to(torch.float64)
        self._add("reward_sum", r.sum())
        self._add("trajectories", float(r.numel()))
        self._add("group_std_sum", within_group_reward_std(r).sum())
        self._add("groups", float(num_groups))
        if success is not None:
            if success.shape != rewards.shape:
                raise ValueError(
                    f"success must match rewards {tuple(rewards.shape)}, got {tuple(success.shape)}"
                )
            s = success.to(torch.float64)
            self._add("success_sum", s.sum())
            self._add("success_trajectories", float(s.numel()))
            self._add("success_groups", float(num_groups))
            if num_groups:
                c = s.sum(dim=1)
                self._add(
                    "pass_sum",
                    torch.stack([pass_at_k(c, group_size, k).sum() for k in self.ks]),
                )

    def compute(self) -> dict[str, torch.Tensor]:
        out = {
            "reward_mean": _ratio(self.reward_sum, self.trajectories),
            "in_group_reward_std": _ratio(self.group_std_sum, self.groups),
            "success_rate": _ratio(self.success_sum, self.success_trajectories),
        }
        for i, k in enumerate(self.ks):
            out[f"pass@{k}"] = _ratio(self.pass_sum[i], self.success_groups)
        return out


class LengthMetrics(SumStateMetric):
    """Per-trajectory means of lengths: ``Σ x / #trajectories`` for each field given to ``update``.

    Fields (each ``[B]``, any subset per call): ``response_tokens`` (trained response tokens),
    ``think_tokens`` (tokens inside ``<think>…</think>``), ``turns``, ``actions``. Reading: think
    length shrinking to a fixed short value across inputs, with MI falling, is template collapse;
    response length hitting the cap is truncation.
    """

    FIELDS = ("response_tokens", "think_tokens", "turns", "actions")
    higher_is_better = None  # lengths are read, not maximised

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        for f in self.FIELDS:
            self._add_sum_state(f"{f}_sum")
            self._add_sum_state(f"{f}_count")

    def update(
        self,
        response_tokens: torch.Tensor | None = None,
        think_tokens: torch.Tensor | None = None,
        turns: torch.Tensor | None = None,
        actions: torch.Tensor | None = None,
    ) -> None:
        for name, x in zip(self.FIELDS, (response_tokens, think_tokens, turns, actions)):
            if x is not None:
                self._add(f"{name}_sum", _f64(x).sum())
                self._add(f"{name}_count", float(x.numel()))

    def compute(self) -> dict[str, torch.Tensor]:
        return {
            f"{f}_mean": _ratio(getattr(self, f"{f}_sum"), getattr(self, f"{f}_count"))
            for f in self.FIELDS
        }


class ValidThinkingRate(RatioMetric):
    """``Σ valid turns / Σ turns`` (RAGEN's collapse_metrics ``valid_thinking_rate``):
    ``functional.valid_thinking_rate`` accumulated over updates and ranks.

    A turn is valid when its ``<think>…</think>`` block is non-empty (``cross.thinking_flags``).
    ``update(flags)`` or ``update(num_valid, num_turns)``. Healthy: near 1; falling means the model
    drops its reasoning (MI cannot be measured on those turns, and they often precede low-entropy
    collapse).
    """

    higher_is_better = True
