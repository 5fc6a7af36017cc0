"""Step 3 of a StarPO iteration: token rewards -> advantages and returns, by a registered estimator.

The table (:data:`~ragen_lightning.registry.ESTIMATORS`) maps each estimator's name to one
function, its options dataclass and what it needs (a critic, groups of several samples, per-turn
rewards of branching rollouts); the command line's choices, the setting checks (:mod:`.checks`),
the memory plan and the docs read that table, and nothing else spells an estimator's name. A
user's estimator is one file: see :mod:`ragen_lightning.registry`.

The built-ins: GAE (optionally turn-level) with batch whitening, the one estimator with a critic;
``rft`` (rejection-sampling fine-tuning: advantage 1 on the turns or episodes scored above
``threshold``); ``state_baseline`` / ``state_grpo`` (branching rollouts: each one-turn row's reward
minus the mean of its state's K responses, / their std); the group-outcome estimators (GRPO,
Dr.GRPO, BRPO, ARPO) on one score per episode (windowed context modes repeat an episode over several
samples, RAGEN counts it once), broadcast to the episode's trained tokens. :func:`starpo_advantages`
applies the KL-in-reward penalty before the estimator and RAGEN's modifiers after it, in RAGEN's
order. All tensors are on the target axis (``[B, T - 1]``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from ragen_lightning.algos import advantages as A
from ragen_lightning.algos.losses import masked_mean, masked_var, masked_whiten
from ragen_lightning.errors import Domain, check_domains
from ragen_lightning.registry import (
    ESTIMATOR_OPTIONS,
    ESTIMATORS,
    Estimator,
    EstimatorFn,
    get_estimator,
    register_estimator,
)
from ragen_lightning.types import RolloutBatch

__all__ = [
    "ESTIMATORS",
    "Estimator",
    "EstimatorFn",
    "GAEOptions",
    "OutcomeOptions",
    "RFTOptions",
    "advantages_for",
    "estimators_where",
    "get_estimator",
    "kept_rows",
    "register_estimator",
    "starpo_advantages",
]
_UNIT = Domain(0, 1)


def estimators_where(**flags) -> list[str]:
    """Names of the registered estimators with the given flag values (for messages and docs)."""
    return [
        e.name for e in ESTIMATORS.values() if all(getattr(e, k) == v for k, v in flags.items())
    ]


# -- the built-in estimators and their options ----------------------------------------------------
@dataclass(frozen=True)
class GAEOptions:
    """``gae``'s options (``--model.advantage.options.*``).

    Args:
        gamma: token-level discount.
        lam: GAE lambda.
        turn_level: bi-level GAE over turn ends, with ``high_level_gamma`` between turns.
        high_level_gamma: discount between turns for ``turn_level``.
    """

    gamma: float = 1.0
    lam: float = 1.0
    turn_level: bool = False
    high_level_gamma: float = 0.95

    def __post_init__(self):
        check_domains(
            ESTIMATOR_OPTIONS, self, {"gamma": _UNIT, "lam": _UNIT, "high_level_gamma": _UNIT}
        )


@dataclass(frozen=True)
class RFTOptions:
    """``rft``'s options (``--model.advantage.options.*``).

    Args:
        threshold: advantage 1 on the turns / episodes scored above it, 0 elsewhere.
        per_state: with ``--data.branching.branches``: a state's kept responses share one unit of
        weight.
    """

    threshold: float = 0.0
    per_state: bool = False

    def __post_init__(self):
        Domain().check(f"{ESTIMATOR_OPTIONS}threshold", self.threshold)


@dataclass(frozen=True)
class OutcomeOptions:
    """The group-outcome estimators' options (``--model.advantage.options.*``).

    Args:
        soft_reweight: scale each episode's advantage by its group's reward std / the largest one.
    """

    soft_reweight: bool = False


def gae(batch: RolloutBatch, rewards, mask, values, o: GAEOptions):
    """GAE (turn-level with ``turn_level``), whitened over the batch. Per-turn rewards on per-turn
    samples: GAE over each episode's samples in turn order."""
    r, v, ends, m = rewards, values, batch.turn_ends[:, 1:] & mask, mask
    chained = batch.chains_turns
    if chained:
        m, (r, v, ends), unpack = A.chain_rows(batch.episode_index, mask, r, v, ends)
    if o.turn_level:
        adv, returns = A.turn_level_gae(r, v, m, ends, o.gamma, o.lam, o.high_level_gamma)
    else:
        adv, returns = A.gae(r, v, m, o.gamma, o.lam)
    if chained:
        adv, returns = unpack(adv), unpack(returns)
    return masked_whiten(adv, mask), returns, {}


def rft(batch: RolloutBatch, rewards, mask, values, o: RFTOptions):
    """Per-turn rewards: each turn by its own reward; else every turn by the episode score."""
    if batch.per_turn_rewards:
        adv = A.rft_advantages(rewards, mask, batch.turn_ends[:, 1:], o.threshold)
    else:
        adv = A.broadcast_to_tokens((batch.scores > o.threshold).to(rewards.dtype), mask)
    if o.per_state and batch.state_index is not None:
        adv = A.share_by_state(adv, mask, batch.state_index)
    return adv, adv, {}


def by_state(
    per_state: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], name: str
) -> EstimatorFn:
    """The estimator ``name`` that scores each one-turn row's reward against the responses to its
    state by ``per_state`` (``(turn rewards [B], state index [B]) -> [B]``)."""

    def estimate(batch: RolloutBatch, rewards, mask, values, options):
        if batch.state_index is None or not batch.per_turn_rewards:
            raise ValueError(
                f"--model.advantage.estimator {name} needs per-turn rewards and the "
                "batch's state_index (branching rollouts)"
            )
        turn_reward = (rewards * mask.to(rewards.dtype)).sum(dim=-1)
        adv = A.broadcast_to_tokens(per_state(turn_reward, batch.state_index), mask)
        return adv, adv, {}

    return estimate


def by_episode_outcome(
    per_episode: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
) -> EstimatorFn:
    """An estimator on one score per episode (``(scores [E], group index [E]) -> [E]``), broadcast
    to the episode's samples and trained tokens; ``soft_reweight`` scales it by its group's reward
    spread."""

    def estimate(batch: RolloutBatch, rewards, mask, values, o: OutcomeOptions):
        # turn-level context modes repeat an episode over several samples
        first: dict[int, int] = {}
        for row, ep in enumerate(batch.episode_index.tolist()):
            first.setdefault(ep, row)
        ep_rows = torch.tensor(list(first.values()), device=mask.device)
        ep_adv = per_episode(batch.scores[ep_rows].float(), batch.group_index[ep_rows])
        lookup = dict(zip(first.keys(), ep_adv.tolist()))
        per_sample = torch.tensor(
            [lookup[e] for e in batch.episode_index.tolist()], device=mask.device
        )
        logs = {}
        if o.soft_reweight:
            spread = A.group_std(batch.scores.float(), batch.group_index)
            per_sample, sw = A.soft_advantage_reweight(per_sample, spread)
            logs = {f"train/{k}": float(v) for k, v in sw.items()}
        adv = A.broadcast_to_tokens(per_sample, mask)
        return adv, adv, logs

    return estimate


DEFAULT_ESTIMATOR = register_estimator("gae", gae, options=GAEOptions, critic=True).name
for _name, _fn, _groups in (
    ("grpo", A.grpo, True),
    ("drgrpo", A.drgrpo, True),
    ("brpo", A.brpo, False),
    ("arpo", A.arpo, False),
):
    register_estimator(
        _name, by_episode_outcome(_fn), options=OutcomeOptions, groups=_groups, outcome=True
    )
register_estimator("rft", rft, options=RFTOptions, per_sample=True, sparse_rows=True)
for _name, _fn, _whole in (("state_baseline", A.drgrpo, False), ("state_grpo", A.grpo, True)):
    register_estimator(
        _name,
        by_state(_fn, _name),
        per_sample=True,
        branching=True,
        sparse_rows=True,
        whole_states=_whole,
    )


# -- the orchestration -----------------------------------------------------------------------------
def starpo_advantages(
    batch: RolloutBatch,
    mask: torch.Tensor,
    *,
    old_logprobs: torch.Tensor | None,
    ref_logprobs: torch.Tensor | None,
    values: torch.Tensor | None,
    settings,
) -> tuple[torch.Tensor, torch.Tensor, dict[str, float]]:
    """``(advantages, returns, logs)`` for a rollout batch by ``settings`` (an
    :class:`~ragen_lightning.starpo.settings.AdvantageSettings`); ``mask`` is the loss mask on the target
    axis."""
    s, logs = settings, {}
    rewards = batch.rewards[:, 1:].float()
    if s.kl_in_reward_coef > 0:
        rewards, kl_logs = A.apply_kl_in_reward(
            rewards, old_logprobs, ref_logprobs, mask, s.kl_in_reward_coef, s.kl_in_reward_kind
        )
        logs["actor/reward_kl"] = float(kl_logs["kl"])
    estimate = get_estimator(s.estimator).fn
    adv, returns, own_logs = estimate(batch, rewards, mask, values, s.estimator_options)
    logs.update(own_logs)
    if s.floor is not None:  # e.g. 0: learn from the better-than-baseline samples only
        adv = adv.clamp(min=s.floor)
    adv = A.filter_loss_scaling(
        adv, batch.metrics.get("rollout/filter_kept_ratio", 1.0), s.filter_loss_scaling
    )
    if s.length_weight:
        adv = A.length_weight(adv, mask)
    if s.zero_task_advantage:
        adv = A.zero_task_advantage(adv)
    logs["train/advantage_mean"] = float(masked_mean(adv, mask))
    logs["train/return_mean"] = float(masked_mean(returns, mask))
    if values is not None:
        logs["critic/values_mean"] = float(masked_mean(values, mask))
        logs["critic/explained_variance"] = explained_variance(values, returns, mask)
    return adv, returns, logs


def kept_rows(batch: RolloutBatch, settings) -> tuple[RolloutBatch, float]:
    """A ``sparse_rows`` estimator's rows of ``batch`` with a kept token, and their share of its
    rows. Every other row has advantage 0 on every token, so the policy loss gives it no gradient;
    leaving it out of the update makes each mini-batch ``mini_batch_size`` kept samples (a
    supervised step on that many, as in SFT, not on the few kept among many zero rows, whose steps
    broke the policy: docs/learning.md, round 13) and skips its forward and backward passes. The
    entropy bonus and KL loss of the dropped rows go with them. The batch is returned as is when the
    rewards need log-probs first (``kl_in_reward_coef`` > 0). A ``whole_states`` estimator keeps
    every response of a state with spread: a state's std counts its responses at the mean too, so
    dropping them would change the others' advantages."""
    if settings.kl_in_reward_coef > 0 or len(batch) == 0:
        return batch, 1.0
    mask = batch.loss_mask[:, 1:].bool()
    adv, _, _ = starpo_advantages(
        batch, mask, old_logprobs=None, ref_logprobs=None, values=None, settings=settings
    )
    trains = (adv != 0).any(dim=-1)
    if get_estimator(settings.estimator).whole_states:
        _, state = torch.unique(batch.state_index, return_inverse=True)
        trains = (
            torch.zeros(int(state.max()) + 1, dtype=torch.long).index_add_(0, state, trains.long())[
                state
            ]
            > 0
        )
    rows = torch.nonzero(trains).squeeze(-1)
    return batch.select(rows), rows.numel() / len(batch)


def explained_variance(values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor) -> float:
    """``1 - Var(returns - values) / Var(returns)`` over the trained tokens: 1 for a critic that
    predicts every return, 0 for one no better than the batch's mean return, negative for a worse
    one; NaN (not logged) when the returns do not vary. Read before the critic's update, so it
    measures the values the advantages used."""
    total = masked_var(returns, mask)
    if float(total) <= 0.0:
        return float("nan")
    return float(1.0 - masked_var(returns - values, mask) / total)


def _pick(t: torch.Tensor | None, rows: torch.Tensor) -> torch.Tensor | None:
    return None if t is None else t[rows]


def advantages_for(
    batch: RolloutBatch,
    mask: torch.Tensor,
    old_logprobs: torch.Tensor | None,
    ref_logprobs: torch.Tensor | None,
    settings,
):
    """``of(values, rows)``: :func:`starpo_advantages` of the whole batch (``rows`` None) or of rows
    ``rows`` only (their returns are exact: GAE targets are per row; whitening and group statistics
    then cover those rows only). Not for rows of a batch whose GAE chains an episode's samples
    (``batch.chains_turns``): a row's returns then depend on the later turns' rows."""

    def of(values: torch.Tensor | None, rows: torch.Tensor | None):
        if rows is None:
            return starpo_advantages(
                batch,
                mask,
                old_logprobs=old_logprobs,
                ref_logprobs=ref_logprobs,
                values=values,
                settings=settings,
            )
        if batch.chains_turns:
            raise ValueError(
                "per-row returns are undefined when GAE chains an episode's turn samples"
            )
        return starpo_advantages(
            batch.select(rows),
            mask[rows],
            old_logprobs=_pick(old_logprobs, rows),
            ref_logprobs=_pick(ref_logprobs, rows),
            values=values,
            settings=settings,
        )

    return of
