"""StarPO-S / RAGEN-2 rollout filtering: group scores and group selection (RAGEN's rollout_filter).

A batch of rollouts is ``num_groups`` groups x ``group_size`` samples; the samples of a group share
an initial state. ``group_scores`` reduces a per-trajectory matrix ``[G, N]`` to one score per group
(by default the in-group reward std: RAGEN-2's signal-to-noise proxy), and ``select_groups`` picks
the groups to train on.

Selection (``select_groups``, as RAGEN's rollout_filter; ties broken towards the lower group index
by stable sorts) by a strategy of the table :data:`FILTER_STRATEGIES` (one function each, with its
options dataclass; a user's own is registered with :func:`~ragen_lightning.registry.register_filter`
or named ``module:name``):
0. ``include_zero=False`` first drops groups with ``|score| <= 1e-10``.
1. ``top_p``: ``value >= 1`` keeps every remaining group. Otherwise, by its ``mode``
   (:class:`TopPOptions`):
   - ``softmax``: ``p = softmax(±scores)`` sorted descending, keep the first k with ``k = 1 +
     #{cumsum(p) < value}``;
   - ``linear``: scores sorted (descending for largest, ascending for smallest), ``thr =
     value·Σscores − eps``; walk the sorted list: stop once the running sum reaches ``thr`` or at a
     score ``<= 0``, else add it. Keep the walked prefix if its sum reached ``thr``, otherwise keep
     **nothing** (all-zero or all-negative scores give an empty selection, which the caller must
     handle, e.g. by skipping the update).
2. ``top_k``: ``k = max(1, min(int(value·G), #candidates))`` best groups (G counts all groups,
   before step 0).
3. ``top_k_abs``: ``k = max(1, min(int(value), #candidates))``.
4. ``min_p``: largest keeps ``s >= max·value − 1e-10``; smallest keeps ``s <= min/(value + 1e-10) +
   1e-10``.

Departures from RAGEN (fixes)
- A group of size 1 has std 0 (RAGEN: NaN from the unbiased std), so it scores "no signal" and
  ``include_zero=False`` drops it.
- Stds are computed after subtracting a member of the group, so identical rewards give exactly 0:
  ``torch.std`` of eight copies of 0.3 is 3e-8, which would pass the ``1e-10`` zero test.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import torch

from ragen_lightning.errors import Domain
from ragen_lightning.registry import (
    FILTER_OPTIONS,
    FILTERS,
    FilterStrategy,
    get_filter,
    register_filter,
)

__all__ = [
    "DEFAULT_STRATEGY",
    "FILTER_STRATEGIES",
    "SCORE_METRICS",
    "ZERO_TOL",
    "FilterStrategy",
    "ScoreMetric",
    "TopPOptions",
    "filter_metrics",
    "get_filter",
    "group_scores",
    "in_group_std",
    "kept_sample_mask",
    "register_filter",
    "select_groups",
]

ZERO_TOL = 1e-10  # |score| at or below this counts as zero (include_zero=False, filter_zero_count)
_MIN_P_TOL = 1e-10


# --------------------------------------------------------------------------------------------------
# Group scores
# --------------------------------------------------------------------------------------------------


def in_group_std(x: torch.Tensor) -> torch.Tensor:
    """``[..., N]`` -> ``[...]``: the unbiased std of each row (one group per row), exactly 0 for
    constant rows and rows of one sample.

    The one ``[G, N]`` in-group std: the filter's ``reward_std`` scores, ``rollout/in_group_*std``,
    ``metrics.functional.within_group_reward_std`` (hence ``RewardMetrics`` and the
    gradient-analysis buckets). ``advantages.group_centre`` is its per-sample (group-index)
    counterpart."""
    n = x.shape[-1]
    if n < 2:
        return torch.zeros(x.shape[:-1], dtype=x.dtype, device=x.device)
    shifted = x - x[..., :1].detach()
    return shifted.std(dim=-1, unbiased=True)


def _row_mean(x: torch.Tensor) -> torch.Tensor:
    return x.mean(dim=-1)


def _row_sum(x: torch.Tensor) -> torch.Tensor:
    return x.sum(dim=-1)


ScoreMetric = Literal[
    "reward_variance",
    "reward_std",
    "reward",
    "reward_sum",
    "entropy",
    "entropy_variance",
    "entropy_std",
    "length",
]
_SCORE_FNS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "reward_variance": in_group_std,  # named "variance" in RAGEN, but it is the std
    "reward_std": in_group_std,
    "reward": _row_mean,
    "reward_sum": _row_sum,
    "entropy": _row_mean,
    "entropy_variance": in_group_std,
    "entropy_std": in_group_std,
    "length": _row_mean,
}
SCORE_METRICS: tuple[str, ...] = tuple(_SCORE_FNS)


def group_scores(rewards: torch.Tensor, metric: ScoreMetric = "reward_variance") -> torch.Tensor:
    """``[G, N]`` per-trajectory values -> ``[G]`` group scores.

    Args:
        rewards: ``[G, N]`` per-trajectory values, group-major. For the reward metrics the trajectory reward
            (sum of its token rewards); for ``entropy`` / ``entropy_variance`` the trajectory's mean
            token entropy; for ``length`` its trained-token count. The metric only says how a row is
            reduced.
        metric: ``reward_variance`` (alias ``reward_std``) and ``entropy_variance`` (alias
        ``entropy_std``): the
            unbiased in-group std (0 for N = 1); ``reward``, ``entropy``, ``length``: the in-group mean;
            ``reward_sum``: the in-group sum.
    """
    try:
        fn = _SCORE_FNS[metric]
    except KeyError:
        raise ValueError(f"metric must be one of {list(SCORE_METRICS)}, got {metric!r}") from None
    if rewards.dim() != 2:
        raise ValueError(
            f"rewards must be [num_groups, group_size], got shape {tuple(rewards.shape)}"
        )
    x = rewards if rewards.is_floating_point() else rewards.float()
    return fn(x)


# --------------------------------------------------------------------------------------------------
# Selection
# --------------------------------------------------------------------------------------------------

FILTER_STRATEGIES = FILTERS  # the table of :mod:`ragen_lightning.registry`, by its former name


@dataclass(frozen=True)
class TopPOptions:
    """``top_p``'s options (``--data.filter.options.*``).

    Args:
        mode: ``linear`` (score mass with ``eps``, RAGEN's default) or ``softmax``.
        eps: slack subtracted from the linear threshold ``value * sum(scores)``.
    """

    mode: Literal["linear", "softmax"] = "linear"
    eps: float = 0.01

    def __post_init__(self):
        Domain(low=0).check(f"{FILTER_OPTIONS}eps", self.eps)


def _order(scores: torch.Tensor, largest: bool) -> torch.Tensor:
    """Positions of ``scores`` best first (stable: ties keep the lower position first)."""
    return torch.sort(scores, descending=largest, stable=True).indices


def _top_p_softmax(scores: torch.Tensor, value: float, largest: bool) -> torch.Tensor:
    probs = torch.softmax(scores if largest else -scores, dim=0)
    order = torch.sort(probs, descending=True, stable=True).indices
    cumulative = torch.cumsum(probs[order], dim=0)
    target = torch.tensor([value], dtype=cumulative.dtype, device=cumulative.device)
    k = min(int(torch.searchsorted(cumulative, target, side="left").item()) + 1, scores.numel())
    return order[:k]


def _top_p_linear(scores: torch.Tensor, value: float, largest: bool, eps: float) -> torch.Tensor:
    order = _order(scores, largest)
    sorted_scores = scores[order].tolist()
    threshold = value * float(scores.sum()) - eps
    cumulative, count = 0.0, 0
    for score in sorted_scores:
        if cumulative >= threshold or score <= 0:
            break
        cumulative += score
        count += 1
    return order[:count] if cumulative >= threshold else order[:0]


def top_p(
    scores: torch.Tensor, value: float, *, largest: bool, options: TopPOptions, **_
) -> torch.Tensor:
    """Score mass: ``value >= 1`` keeps every candidate; else ``linear`` or ``softmax`` (module
    docstring)."""
    if value >= 1.0:
        return torch.arange(scores.numel(), device=scores.device)
    if options.mode == "softmax":
        return _top_p_softmax(scores, value, largest)
    return _top_p_linear(scores, value, largest, options.eps)


def top_k(
    scores: torch.Tensor, value: float, *, largest: bool, num_groups: int, **_
) -> torch.Tensor:
    """``k = max(1, min(int(value * G), #candidates))`` best groups."""
    return _order(scores, largest)[: max(1, min(int(value * num_groups), scores.numel()))]


def top_k_abs(scores: torch.Tensor, value: float, *, largest: bool, **_) -> torch.Tensor:
    """``k = max(1, min(int(value), #candidates))`` best groups."""
    return _order(scores, largest)[: max(1, min(int(value), scores.numel()))]


def min_p(scores: torch.Tensor, value: float, *, largest: bool, **_) -> torch.Tensor:
    """Largest: keep ``s >= max * value - 1e-10``; smallest: keep ``s <= min / (value + 1e-10) +
    1e-10``."""
    if largest:
        keep = scores >= scores.max() * value - _MIN_P_TOL
    else:
        keep = scores <= scores.min() / (value + _MIN_P_TOL) + _MIN_P_TOL
    return keep.nonzero(as_tuple=True)[0]


DEFAULT_STRATEGY = register_filter(
    "top_p",
    top_p,
    options=TopPOptions,
    value_domain=Domain(low=0),
    value_help="score mass (>= 1 keeps all)",
    keeps_all=lambda value: value >= 1.0,
).name
register_filter(
    "top_k", top_k, value_domain=Domain(0, 1, low_open=True), value_help="fraction of the groups"
)
register_filter(
    "top_k_abs",
    top_k_abs,
    value_domain=Domain(low=1),
    value_help="a number of groups",
    whole_value=True,
)
register_filter("min_p", min_p, value_domain=Domain(0, 1), value_help="ratio to the best score")


def select_groups(
    scores: torch.Tensor,
    strategy: str,
    value: float,
    *,
    largest: bool = True,
    include_zero: bool = True,
    options: Any = None,
) -> torch.Tensor:
    """Indices (ascending, LongTensor) of the groups to keep; possibly empty. Semantics in the
    module docstring.

    Args:
        scores: ``[G]`` group scores (``group_scores``).
        strategy: a registered strategy (:data:`FILTER_STRATEGIES`): ``top_p`` | ``top_k`` |
        ``top_k_abs`` | ``min_p``. value: top_p mass; top_k fraction of G; top_k_abs count; min_p
        ratio. largest: keep the largest scores (False: the smallest). include_zero: False drops
        groups with ``|score| <= 1e-10`` before selecting. options: the strategy's options (its
        options dataclass or a mapping of its fields; None:
            its defaults), e.g. ``TopPOptions(mode="softmax")``.
    """
    entry = get_filter(strategy)
    options = entry.make_options(options)
    if scores.dim() != 1:
        raise ValueError(f"scores must be [num_groups], got shape {tuple(scores.shape)}")
    if not scores.is_floating_point():
        scores = scores.float()
    if bool(torch.isnan(scores).any()):
        raise ValueError(
            "scores contain NaN (a group std of one sample? use group_scores, which gives 0)"
        )
    value = float(value)
    if math.isnan(value):
        raise ValueError("value must not be NaN")
    num_groups = scores.numel()
    candidates = torch.arange(num_groups, device=scores.device)
    if not include_zero:
        candidates = candidates[scores.abs() > ZERO_TOL]
    if candidates.numel() == 0:
        return candidates
    picked = entry.select(
        scores[candidates], value, largest=largest, num_groups=num_groups, options=options
    )
    return torch.sort(candidates[picked]).values


def kept_sample_mask(kept: torch.Tensor, num_groups: int, group_size: int) -> torch.Tensor:
    """``[G·N]`` bool over the group-major batch: True for every sample of a kept group."""
    group_mask = torch.zeros(num_groups, dtype=torch.bool, device=kept.device)
    group_mask[kept] = True
    return group_mask.repeat_interleave(group_size)


# --------------------------------------------------------------------------------------------------
# Metrics (RAGEN's rollout_filter)
# --------------------------------------------------------------------------------------------------


def filter_metrics(
    values: torch.Tensor, scores: torch.Tensor, kept: torch.Tensor
) -> dict[str, float]:
    """Pre-filter and kept-group statistics of a ``[G, N]`` per-trajectory matrix, as floats.

    ``in_group_{std,max,mean,sum}`` average the per-group unbiased std (0 for N = 1), max, mean and
    sum over all groups; ``chosen_in_group_*`` over the kept groups (0.0 when none is kept).
    ``filter_kept_count``, ``filter_kept_ratio`` (kept / G) and ``filter_zero_count`` (groups whose
    score is ``<= 1e-10`` in absolute value). The caller adds the ``rollout/`` prefix and, if
    wanted, the metric name (``in_group_reward_std``...).
    """
    x = values.detach().float()
    per_group = {
        "std": in_group_std(x),
        "max": x.max(dim=-1).values if x.shape[-1] else torch.zeros(x.shape[0]),
        "mean": _row_mean(x),
        "sum": _row_sum(x),
    }
    num_groups = x.shape[0]
    metrics: dict[str, float] = {}
    for name, stat in per_group.items():
        metrics[f"in_group_{name}"] = float(stat.mean()) if num_groups else 0.0
        metrics[f"chosen_in_group_{name}"] = float(stat[kept].mean()) if kept.numel() else 0.0
    metrics["filter_kept_count"] = float(kept.numel())
    metrics["filter_kept_ratio"] = kept.numel() / num_groups if num_groups else 0.0
    metrics["filter_zero_count"] = float((scores.abs() <= ZERO_TOL).sum())
    return metrics
