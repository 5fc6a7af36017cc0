"""Step 3 of a StarPO iteration: token rewards -> advantages and returns (orchestrates ``algos.advantages``).

GAE (optionally turn-level) with batch whitening when there is a critic; ``rft`` (rejection-sampling fine-tuning:
advantage 1 on the turns or episodes scored above ``rft_threshold``, 0 elsewhere); ``state_baseline`` / ``state_grpo``
(branching rollouts: each one-turn row's reward minus the mean of its state's K responses, / their std for
``state_grpo``); otherwise a GRPO-family outcome estimator on one score per episode (windowed context modes repeat an
episode over several samples, RAGEN counts it once), broadcast to the episode's trained tokens. Then the SPEC 4.6
modifiers in RAGEN's order. All tensors are on the target axis (``[B, T - 1]``).
"""

from __future__ import annotations

import torch

from ragen_lightning.algos import advantages as A
from ragen_lightning.algos.losses import KLKind
from ragen_lightning.algos.masked import masked_mean, masked_var, masked_whiten
from ragen_lightning.starpo.checks import STATE_ESTIMATORS
from ragen_lightning.types import RolloutBatch

# the keyword settings of starpo_advantages: the module passes its hyperparameters of the same names
ADVANTAGE_SETTINGS = ("adv_estimator", "gamma", "lam", "turn_level_gae", "high_level_gamma", "kl_in_reward_coef",
                      "kl_kind", "soft_advantage_reweight", "filter_loss_scaling", "length_weight",
                      "zero_task_advantage", "advantage_floor", "rft_threshold", "rft_per_state")
# estimators whose advantage is 0 on every token of many rows (kept_rows leaves those out of the update)
ROW_ESTIMATORS = ("rft", *STATE_ESTIMATORS)


def starpo_advantages(
    batch: RolloutBatch,
    mask: torch.Tensor,
    *,
    old_logprobs: torch.Tensor | None,
    ref_logprobs: torch.Tensor | None,
    values: torch.Tensor | None,
    adv_estimator: str,
    gamma: float,
    lam: float,
    turn_level_gae: bool,
    high_level_gamma: float,
    kl_in_reward_coef: float,
    kl_kind: KLKind,
    soft_advantage_reweight: bool,
    filter_loss_scaling: A.FilterLossScaling,
    length_weight: bool,
    zero_task_advantage: bool,
    advantage_floor: float | None = None,
    rft_threshold: float = 0.0,
    rft_per_state: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, dict[str, float]]:
    """``(advantages, returns, logs)`` for a rollout batch; ``mask`` is the loss mask on the target axis."""
    logs: dict[str, float] = {}
    rewards = batch.rewards[:, 1:].float()
    if kl_in_reward_coef > 0:
        rewards, kl_logs = A.apply_kl_in_reward(rewards, old_logprobs, ref_logprobs, mask, kl_in_reward_coef, kl_kind)
        logs["actor/reward_kl"] = float(kl_logs["kl"])
    if adv_estimator == "rft":  # per-turn rewards: each turn by its own reward; else every turn by the episode score
        if batch.per_turn_rewards:
            adv = A.rft_advantages(rewards, mask, batch.turn_ends[:, 1:], rft_threshold)
        else:
            adv = A.broadcast_to_tokens((batch.scores > rft_threshold).to(rewards.dtype), mask)
        if rft_per_state and batch.state_index is not None:
            adv = A.share_by_state(adv, mask, batch.state_index)
        returns = adv
    elif adv_estimator in STATE_ESTIMATORS:  # each row trains one turn: its reward against its state's responses
        if batch.state_index is None or not batch.per_turn_rewards:
            raise ValueError(f"{adv_estimator} needs per-turn rewards and the batch's state_index (branching rollouts)")
        turn_reward = (rewards * mask.to(rewards.dtype)).sum(dim=-1)
        by_state = A.drgrpo if adv_estimator == "state_baseline" else A.grpo
        adv = A.broadcast_to_tokens(by_state(turn_reward, batch.state_index), mask)
        returns = adv
    elif adv_estimator == "gae":
        r, v, ends, m = rewards, values, batch.turn_ends[:, 1:] & mask, mask
        chained = batch.chains_turns
        if chained:  # per-turn rewards on per-turn samples: GAE over each episode's samples in turn order
            m, (r, v, ends), unpack = A.chain_rows(batch.episode_index, mask, r, v, ends)
        if turn_level_gae:
            adv, returns = A.turn_level_gae(r, v, m, ends, gamma, lam, high_level_gamma)
        else:
            adv, returns = A.gae(r, v, m, gamma, lam)
        if chained:
            adv, returns = unpack(adv), unpack(returns)
        adv = masked_whiten(adv, mask)
    else:
        # one score per episode (turn-level context modes repeat an episode over several samples)
        first: dict[int, int] = {}
        for row, ep in enumerate(batch.episode_index.tolist()):
            first.setdefault(ep, row)
        ep_rows = torch.tensor(list(first.values()), device=mask.device)
        ep_adv = A.outcome_advantages(batch.scores[ep_rows].float(), batch.group_index[ep_rows], adv_estimator)
        lookup = dict(zip(first.keys(), ep_adv.tolist()))
        per_sample = torch.tensor([lookup[e] for e in batch.episode_index.tolist()], device=mask.device)
        if soft_advantage_reweight:
            spread = A.group_std(batch.scores.float(), batch.group_index)
            per_sample, sw = A.soft_advantage_reweight(per_sample, spread)
            logs.update({f"train/{k}": float(v) for k, v in sw.items()})
        adv = A.broadcast_to_tokens(per_sample, mask)
        returns = adv
    if advantage_floor is not None:  # e.g. 0: learn from the better-than-baseline samples only
        adv = adv.clamp(min=advantage_floor)
    adv = A.filter_loss_scaling(adv, batch.metrics.get("rollout/filter_kept_ratio", 1.0), filter_loss_scaling)
    if length_weight:
        adv = A.length_weight(adv, mask)
    if zero_task_advantage:
        adv = A.zero_task_advantage(adv)
    logs["train/advantage_mean"] = float(masked_mean(adv, mask))
    logs["train/return_mean"] = float(masked_mean(returns, mask))
    if values is not None:
        logs["critic/values_mean"] = float(masked_mean(values, mask))
        logs["critic/explained_variance"] = explained_variance(values, returns, mask)
    return adv, returns, logs


def kept_rows(batch: RolloutBatch, settings: dict) -> tuple[RolloutBatch, float]:
    """``rft`` / ``state_*``: the rows of ``batch`` with a kept token, and their share of its rows. Every other row has advantage 0
    on every token, so the policy loss gives it no gradient; leaving it out of the update makes each mini-batch
    ``mini_batch_size`` kept samples (a supervised step on that many, as in SFT, not on the few kept among many zero
    rows, whose steps broke the policy: docs/learning.md, round 13) and skips its forward and backward passes. The
    entropy bonus and KL loss of the dropped rows go with them. The batch is returned as is when the rewards need
    log-probs first (``kl_in_reward_coef`` > 0). ``state_grpo`` keeps every response of a state with spread: a
    state's std counts its responses at the mean too, so dropping them would change the others' advantages."""
    if settings["kl_in_reward_coef"] > 0 or len(batch) == 0:
        return batch, 1.0
    mask = batch.loss_mask[:, 1:].bool()
    adv, _, _ = starpo_advantages(batch, mask, old_logprobs=None, ref_logprobs=None, values=None, **settings)
    trains = (adv != 0).any(dim=-1)
    if settings["adv_estimator"] == "state_grpo":
        _, state = torch.unique(batch.state_index, return_inverse=True)
        trains = torch.zeros(int(state.max()) + 1, dtype=torch.long).index_add_(0, state, trains.long())[state] > 0
    rows = torch.nonzero(trains).squeeze(-1)
    return batch.select(rows), rows.numel() / len(batch)


def explained_variance(values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor) -> float:
    """``1 - Var(returns - values) / Var(returns)`` over the trained tokens: 1 for a critic that predicts every
    return, 0 for one no better than the batch's mean return, negative for a worse one; NaN (not logged) when the
    returns do not vary. Read before the critic's update, so it measures the values the advantages used."""
    total = masked_var(returns, mask)
    if float(total) <= 0.0:
        return float("nan")
    return float(1.0 - masked_var(returns - values, mask) / total)


def advantages_for(batch: RolloutBatch, mask: torch.Tensor, old_logprobs: torch.Tensor | None,
                   ref_logprobs: torch.Tensor | None, settings: dict):
    """``of(values, rows)``: :func:`starpo_advantages` of the whole batch (``rows`` None) or of rows ``rows`` only
    (their returns are exact: GAE targets are per row; whitening and group statistics then cover those rows only).
    Not for rows of a batch whose GAE chains an episode's samples (``batch.chains_turns``): a row's returns then
    depend on the later turns' rows."""

    def of(values: torch.Tensor | None, rows: torch.Tensor | None):
        if rows is None:
            return starpo_advantages(batch, mask, old_logprobs=old_logprobs, ref_logprobs=ref_logprobs,
                                     values=values, **settings)
        if batch.chains_turns:
            raise ValueError("per-row returns are undefined when GAE chains an episode's turn samples")
        pick = lambda t: None if t is None else t[rows]  # noqa: E731
        return starpo_advantages(batch.select(rows), mask[rows], old_logprobs=pick(old_logprobs),
                                 ref_logprobs=pick(ref_logprobs), values=values, **settings)

    return of
