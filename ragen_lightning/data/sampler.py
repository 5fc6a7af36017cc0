"""The reward-variance filtering sampler (StarPO-S / RAGEN-2): which rollout groups are trained on.

A thin, typed wrapper of :mod:`ragen_lightning.algos.filtering`: it turns trajectories into the ``[G, N]`` matrix
the chosen metric needs, scores groups, selects them and reports RAGEN's ``rollout/*`` filter statistics. It runs
before any scoring forward pass, so dropped groups cost no update compute.

Per-trajectory quantities: ``reward*`` metrics use the episode score (env return + format penalty);
``entropy*`` metrics use the mean negative log-prob of the sampled tokens as reported by the engine (an unbiased
estimate of the token entropy at temperature 1; RAGEN runs an extra forward pass for it); ``length`` uses the
sampled response tokens.

With branching rollouts (``--data.branches`` K > 1) the filter can select **states** instead of episode groups
(``over: states``): the K responses sampled for one visited state are a group, scored by their turn rewards (the
turn's env reward plus its format penalty), and the rows of the dropped states leave the batch (:func:`filter_states`).
That is the StarPO-S filter for per-state baselines: a state whose K answers all scored alike carries no signal
for ``state_grpo``, and one whose answers differ only by a step penalty carries little.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import torch

from ragen_lightning.algos.filtering import (
    DEFAULT_STRATEGY,
    filter_metrics,
    get_filter,
    group_scores,
    select_groups,
)
from ragen_lightning.data.batching import sampled_entropy, trajectory_matrix
from ragen_lightning.errors import ConfigError, Domain
from ragen_lightning.types import RolloutBatch, Trajectory

_METRIC_ALIASES = {"reward_std": "reward_variance", "entropy_std": "entropy_variance"}
_METRIC_SOURCE = {"reward_variance": "reward", "reward": "reward", "reward_sum": "reward",
                  "entropy": "entropy", "entropy_variance": "entropy", "length": "length"}


@dataclass
class FilterConfig:
    """Rollout filter settings (RAGEN's ``rollout_filter_*``; the defaults keep every group).

    Args:
        strategy: a registered strategy (``algos.filtering.FILTER_STRATEGIES``): ``top_p`` | ``top_k`` (fraction of
            groups) | ``top_k_abs`` (count) | ``min_p``, or your own (``register_filter``).
        value: the strategy's threshold; ``top_p`` with ``value >= 1`` keeps every (non-zero) group.
        metric: group score: ``reward_variance`` (in-group reward std, default), ``reward`` (mean), ``reward_sum``,
            ``entropy``, ``entropy_variance``, ``length``.
        largest: keep the groups with the largest scores (False: the smallest).
        include_zero: keep groups whose score is 0 (e.g. every member got the same reward).
        top_p_mode: ``linear`` (score mass, RAGEN's default) or ``softmax``.
        eps: slack of the linear top_p threshold.
        over: ``groups`` (the ``group_size`` episodes sharing an initial state, RAGEN's filter) or ``states`` (with
            ``--data.branches`` K > 1: the K responses to each visited state, scored by their turn rewards; reward
            metrics only).
    """

    strategy: str = DEFAULT_STRATEGY
    value: float = 1.0
    metric: Literal["reward_variance", "reward_std", "reward", "reward_sum", "entropy", "entropy_variance",
                    "entropy_std", "length"] = "reward_variance"
    largest: bool = True
    include_zero: bool = True
    top_p_mode: Literal["linear", "softmax"] = "linear"
    eps: float = 0.01
    over: Literal["groups", "states"] = "groups"

    def __post_init__(self):
        self.metric = _METRIC_ALIASES.get(self.metric, self.metric)
        if self.metric not in _METRIC_SOURCE:
            raise ConfigError(f"--data.filter.metric must be one of {sorted(_METRIC_SOURCE)}, got {self.metric!r}")
        strategy = get_filter(self.strategy)
        strategy.value_domain.check("--data.filter.value", self.value,
                                    f"--data.filter.strategy {strategy.name}: {strategy.value_help}")
        if strategy.whole_value and self.value != int(self.value):
            raise ConfigError(f"--data.filter.value must be a whole number for --data.filter.strategy {strategy.name} "
                              f"({strategy.value_help}), got {self.value}")
        Domain(low=0).check("--data.filter.eps", self.eps)
        if self.over not in ("groups", "states"):
            raise ConfigError(f"--data.filter.over must be 'groups' or 'states', got {self.over!r}")
        if self.over == "states" and _METRIC_SOURCE[self.metric] != "reward":
            raise ConfigError(f"--data.filter.over states scores a state's responses by their turn rewards: "
                              f"--data.filter.metric must be reward_variance, reward or reward_sum, got {self.metric!r}")

    @property
    def keeps_everything(self) -> bool:
        keeps_all = get_filter(self.strategy).keeps_all
        return keeps_all is not None and keeps_all(self.value) and self.include_zero


def _per_trajectory(trajectories: Sequence[Trajectory], group_size: int, source: str) -> torch.Tensor:
    if source == "reward":
        return trajectory_matrix(trajectories, group_size, "score")
    if source == "length":
        return trajectory_matrix(trajectories, group_size, "response_tokens")
    return torch.tensor([sampled_entropy(t) for t in trajectories], dtype=torch.float32).view(-1, group_size)


def _select(values: torch.Tensor, config: FilterConfig) -> tuple[torch.Tensor, dict[str, float]]:
    """The kept group indices of a ``[G, N]`` matrix by ``config`` and the ``rollout/*`` filter metrics."""
    scores = group_scores(values, config.metric)
    if config.keeps_everything:
        kept = torch.arange(values.shape[0])
    else:
        kept = select_groups(scores, config.strategy, config.value, largest=config.largest,
                             include_zero=config.include_zero, top_p_mode=config.top_p_mode, eps=config.eps)
    stats = filter_metrics(values, scores, kept)
    metrics = {f"rollout/{k}": v for k, v in stats.items() if k.startswith("filter_")}
    source = _METRIC_SOURCE[config.metric]
    for k, v in stats.items():
        if k.startswith(("in_group_", "chosen_in_group_")):
            metrics[f"rollout/{k}"] = v  # RAGEN's generic names (the selection metric's statistics)
            head, _, stat = k.rpartition("_")
            metrics[f"rollout/{head}_{source}_{stat}"] = v  # and the metric-specific ones
    return kept, metrics


def filter_groups(trajectories: Sequence[Trajectory], group_size: int,
                  config: FilterConfig) -> tuple[list[Trajectory], torch.Tensor, dict[str, float]]:
    """Select groups; returns the kept trajectories, the kept group indices and ``rollout/*`` metrics.

    ``trajectories`` are group-major (``group_id * group_size + member``), as the runner returns them.
    """
    values = _per_trajectory(trajectories, group_size, _METRIC_SOURCE[config.metric])  # [G, N]
    kept, metrics = _select(values, config)
    keep = set(kept.tolist())
    kept_trajectories = [t for t in trajectories if t.group_id in keep]
    return kept_trajectories, kept, metrics


def filter_states(batch: RolloutBatch, config: FilterConfig) -> tuple[RolloutBatch, dict[str, float]]:
    """``(kept rows, rollout/* metrics)``: the StarPO-S filter over the states of a branching batch.

    Each state's responses (rows sharing ``batch.state_index``; K of them, the ``--data.branches``) form a group
    scored by ``config.metric`` over their turn rewards (row sums of ``batch.rewards``: with ``reward_placement
    turn`` a one-turn row holds its turn's env reward plus format penalty); ``select_groups`` picks the states as it
    picks episode groups, and the rows of the other states are dropped. Metrics carry the same names as the group
    filter's, counting states."""
    if batch.state_index is None or not batch.per_turn_rewards:
        raise ConfigError("--data.filter.over states needs branching rollouts (--data.branches > 1 with "
                          "--data.reward_placement turn)")
    if len(batch) == 0:
        return batch, {}
    _, state = torch.unique(batch.state_index, return_inverse=True)
    sizes = torch.bincount(state)
    k = int(sizes[0])
    if bool((sizes == 1).all()):
        raise ConfigError("--data.filter.over states: every state of the batch has one response; it needs branching "
                          "rollouts (--data.branches > 1)")
    if not bool((sizes == k).all()):
        raise ValueError(f"--data.filter.over states: every state needs the same number of responses, got sizes "
                         f"{sorted(set(sizes.tolist()))}")
    order = torch.argsort(state, stable=True)  # rows grouped by state, in row order within a state
    turn_reward = batch.rewards[:, 1:].float().sum(dim=-1)
    values = turn_reward[order].view(-1, k)  # [S, K]
    kept, metrics = _select(values, config)
    keep = torch.zeros(values.shape[0], dtype=torch.bool)
    keep[kept] = True
    rows = torch.nonzero(keep[state]).squeeze(-1)
    return batch.select(rows), metrics
