"""The reward-variance filtering sampler (StarPO-S / RAGEN-2): which rollout groups are trained on.

A thin, typed wrapper of :mod:`ragen_lightning.algos.filtering`: it turns trajectories into the
``[G, N]`` matrix the chosen metric needs, scores groups, selects them and reports RAGEN's
``rollout/*`` filter statistics. It runs before any scoring forward pass, so dropped groups cost no
update compute.

Per-trajectory quantities: ``reward*`` metrics use the episode score (env return + format penalty);
``entropy*`` metrics use the mean negative log-prob of the sampled tokens as reported by the engine
(an unbiased estimate of the token entropy at temperature 1; RAGEN runs an extra forward pass for
it); ``length`` uses the sampled response tokens.

With branching rollouts (``--data.branching.branches`` K > 1) the filter can select **states**
instead of episode groups (``over: states``): the K responses sampled for one visited state are a
group, scored by their turn rewards (the turn's env reward plus its format penalty), and the rows of
the dropped states leave the batch (:func:`filter_states`). That is the StarPO-S filter for
per-state baselines: a state whose K answers all scored alike carries no signal for ``state_grpo``,
and one whose answers differ only by a step penalty carries little.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch

from ragen_lightning.algos.filtering import (
    DEFAULT_STRATEGY,
    FILTERS,
    TopPOptions,
    filter_metrics,
    get_filter,
    group_scores,
    select_groups,
)
from ragen_lightning.data.batching import sampled_entropy, trajectory_matrix
from ragen_lightning.errors import ConfigError
from ragen_lightning.types import RolloutBatch, Trajectory

_METRIC_ALIASES = {"reward_std": "reward_variance", "entropy_std": "entropy_variance"}
_METRIC_SOURCE = {
    "reward_variance": "reward",
    "reward": "reward",
    "reward_sum": "reward",
    "entropy": "entropy",
    "entropy_variance": "entropy",
    "length": "length",
}


@dataclass(frozen=True)
class FilterSettings:
    """Rollout filter settings (``--data.filter.*``, RAGEN's ``rollout_filter_*``; the defaults keep
    every group). Frozen: a change is a checked copy (:meth:`with_value`).

    Args:
        strategy: a registered strategy (:mod:`ragen_lightning.registry`): ``top_p`` | ``top_k``
            (fraction of groups) | ``top_k_abs`` (count) | ``min_p``, a ``package.module:name`` or
            an installed ``ragen_lightning.filters`` entry point.
        value: the strategy's threshold; ``top_p`` with ``value >= 1`` keeps every (non-zero) group.
        options: the strategy's own options (null: its defaults); ``top_p``: ``mode`` (``linear``,
            RAGEN's default, or ``softmax``) and ``eps`` (slack of the linear threshold, 0.01).
        metric: group score: ``reward_variance`` (in-group reward std, default), ``reward`` (mean),
        ``reward_sum``,
            ``entropy``, ``entropy_variance``, ``length``.
        largest: keep the groups with the largest scores (False: the smallest). include_zero: keep
        groups whose score is 0 (e.g. every member got the same reward). over: ``groups`` (the
        ``group_size`` episodes sharing an initial state, RAGEN's filter) or ``states`` (with
            ``--data.branching.branches`` K > 1: the K responses to each visited state, scored by their turn rewards; reward
            metrics only).
    """

    strategy: str = DEFAULT_STRATEGY
    value: float = 1.0
    options: dict[str, Any] | None = None
    metric: Literal[
        "reward_variance",
        "reward_std",
        "reward",
        "reward_sum",
        "entropy",
        "entropy_variance",
        "entropy_std",
        "length",
    ] = "reward_variance"
    largest: bool = True
    include_zero: bool = True
    over: Literal["groups", "states"] = "groups"

    def __post_init__(self):
        object.__setattr__(self, "metric", _METRIC_ALIASES.get(self.metric, self.metric))
        if self.metric not in _METRIC_SOURCE:
            raise ConfigError(
                f"--data.filter.metric must be one of {sorted(_METRIC_SOURCE)}, got {self.metric!r}"
            )
        strategy = get_filter(self.strategy)
        strategy.value_domain.check(
            "--data.filter.value",
            self.value,
            f"--data.filter.strategy {strategy.name}: {strategy.value_help}",
        )
        if strategy.whole_value and self.value != int(self.value):
            raise ConfigError(
                f"--data.filter.value must be a whole number for --data.filter.strategy {strategy.name} "
                f"({strategy.value_help}), got {self.value}"
            )
        options = strategy.make_options(self.options)
        if self.options is not None:  # None when not given: a parser's default fits every strategy
            object.__setattr__(self, "options", options)
        if self.over not in ("groups", "states"):
            raise ConfigError(f"--data.filter.over must be 'groups' or 'states', got {self.over!r}")
        if self.over == "states" and _METRIC_SOURCE[self.metric] != "reward":
            raise ConfigError(
                f"--data.filter.over states scores a state's responses by their turn rewards: "
                f"--data.filter.metric must be reward_variance, reward or reward_sum, got {self.metric!r}"
            )

    def with_value(self, value: float) -> FilterSettings:
        """A copy with ``value`` (checked again, e.g. the collapse monitor's tighter filter)."""
        return dataclasses.replace(self, value=float(value))

    @functools.cached_property
    def strategy_options(self) -> Any:
        """The strategy's options, its defaults filled in (None for a strategy without options)."""
        return get_filter(self.strategy).make_options(self.options)

    @property
    def keeps_everything(self) -> bool:
        keeps_all = get_filter(self.strategy).keeps_all
        return keeps_all is not None and keeps_all(self.value) and self.include_zero


FilterConfig = FilterSettings  # the former name


# --data.filter.<old> -> its name among the options of the strategy that reads it
MOVED_TO_OPTIONS = {"top_p_mode": "mode", "eps": "eps"}


def renamed_filter_flag_error(message: str) -> str | None:
    """The one-line error for a parse error about a ``--data.filter.*`` setting that became a
    strategy's option, else None."""
    if "data.filter" not in message:
        return None
    given = re.findall(r"data\.filter\.(\w+)", message)
    given += re.findall(r"Option '(\w+)' is not accepted", message)
    for old in given:
        if old in MOVED_TO_OPTIONS:
            owners = " / ".join(f.name for f in FILTERS.values() if f.options is TopPOptions)
            return (
                f"--data.filter.{old} was renamed: use --data.filter.options."
                f"{MOVED_TO_OPTIONS[old]} (an option of --data.filter.strategy {owners})"
            )
    return None


def _per_trajectory(
    trajectories: Sequence[Trajectory], group_size: int, source: str
) -> torch.Tensor:
    if source == "reward":
        return trajectory_matrix(trajectories, group_size, "score")
    if source == "length":
        return trajectory_matrix(trajectories, group_size, "response_tokens")
    return torch.tensor([sampled_entropy(t) for t in trajectories], dtype=torch.float32).view(
        -1, group_size
    )


def _select(values: torch.Tensor, config: FilterSettings) -> tuple[torch.Tensor, dict[str, float]]:
    """The kept group indices of a ``[G, N]`` matrix by ``config`` and the ``rollout/*`` filter
    metrics."""
    scores = group_scores(values, config.metric)
    if config.keeps_everything:
        kept = torch.arange(values.shape[0])
    else:
        kept = select_groups(
            scores,
            config.strategy,
            config.value,
            largest=config.largest,
            include_zero=config.include_zero,
            options=config.strategy_options,
        )
    stats = filter_metrics(values, scores, kept)
    metrics = {f"rollout/{k}": v for k, v in stats.items() if k.startswith("filter_")}
    source = _METRIC_SOURCE[config.metric]
    for k, v in stats.items():
        if k.startswith(("in_group_", "chosen_in_group_")):
            metrics[f"rollout/{k}"] = v  # RAGEN's generic names (the selection metric's statistics)
            head, _, stat = k.rpartition("_")
            metrics[f"rollout/{head}_{source}_{stat}"] = v  # and the metric-specific ones
    return kept, metrics


def filter_groups(
    trajectories: Sequence[Trajectory], group_size: int, config: FilterSettings
) -> tuple[list[Trajectory], torch.Tensor, dict[str, float]]:
    """Select groups; returns the kept trajectories, the kept group indices and ``rollout/*``
    metrics.

    ``trajectories`` are group-major (``group_id * group_size + member``), as the runner returns
    them.
    """
    values = _per_trajectory(trajectories, group_size, _METRIC_SOURCE[config.metric])  # [G, N]
    kept, metrics = _select(values, config)
    keep = set(kept.tolist())
    kept_trajectories = [t for t in trajectories if t.group_id in keep]
    return kept_trajectories, kept, metrics


def filter_states(
    batch: RolloutBatch, config: FilterSettings
) -> tuple[RolloutBatch, dict[str, float]]:
    """``(kept rows, rollout/* metrics)``: the StarPO-S filter over the states of a branching batch.

    Each state's responses (rows sharing ``batch.state_index``; K of them, the
    ``--data.branching.branches``) form a group scored by ``config.metric`` over their turn rewards
    (row sums of ``batch.rewards``: with ``reward_placement turn`` a one-turn row holds its turn's
    env reward plus format penalty); ``select_groups`` picks the states as it picks episode groups,
    and the rows of the other states are dropped. Metrics carry the same names as the group
    filter's, counting states."""
    if batch.state_index is None or not batch.per_turn_rewards:
        raise ConfigError(
            "--data.filter.over states needs branching rollouts (--data.branching.branches > 1 with "
            "--data.rewards.placement turn)"
        )
    if len(batch) == 0:
        return batch, {}
    _, state = torch.unique(batch.state_index, return_inverse=True)
    sizes = torch.bincount(state)
    k = int(sizes[0])
    if bool((sizes == 1).all()):
        raise ConfigError(
            "--data.filter.over states: every state of the batch has one response; it needs branching "
            "rollouts (--data.branching.branches > 1)"
        )
    if not bool((sizes == k).all()):
        raise ValueError(
            f"--data.filter.over states: every state needs the same number of responses, got sizes "
            f"{sorted(set(sizes.tolist()))}"
        )
    order = torch.argsort(state, stable=True)  # rows grouped by state, in row order within a state
    turn_reward = batch.rewards[:, 1:].float().sum(dim=-1)
    values = turn_reward[order].view(-1, k)  # [S, K]
    kept, metrics = _select(values, config)
    keep = torch.zeros(values.shape[0], dtype=torch.bool)
    keep[kept] = True
    rows = torch.nonzero(keep[state]).squeeze(-1)
    return batch.select(rows), metrics
