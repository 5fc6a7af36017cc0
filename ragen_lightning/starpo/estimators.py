"""Step 3 of a StarPO iteration: token rewards -> advantages and returns, by a registered estimator.

The table :data:`ESTIMATORS` maps each estimator's name to one function and what it needs (a critic, groups of
several samples, per-turn rewards of branching rollouts); the command line's choices, the setting checks
(:mod:`.checks`), the memory plan and the docs read that table, and nothing else spells an estimator's name. A user's
estimator is one function and one :func:`register_estimator` call, e.g. in the module that a config's
``class_path`` imports, or before calling ``main``::

    def reinforce(batch, rewards, mask, values, settings):  # every trained token gets its episode's score
        adv = broadcast_to_tokens(batch.scores.float(), mask)
        return adv, adv, {}

    register_estimator("reinforce", reinforce)

The built-ins: GAE (optionally turn-level) with batch whitening, the one estimator with a critic; ``rft``
(rejection-sampling fine-tuning: advantage 1 on the turns or episodes scored above ``rft_threshold``, 0 elsewhere);
``state_baseline`` / ``state_grpo`` (branching rollouts: each one-turn row's reward minus the mean of its state's K
responses, / their std); the group-outcome estimators (GRPO, Dr.GRPO, BRPO, ARPO) on one score per episode
(windowed context modes repeat an episode over several samples, RAGEN counts it once), broadcast to the episode's
trained tokens. :func:`starpo_advantages` applies the KL-in-reward penalty before the estimator and the SPEC 4.6
modifiers after it, in RAGEN's order. All tensors are on the target axis (``[B, T - 1]``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from ragen_lightning.algos import advantages as A
from ragen_lightning.algos.masked import masked_mean, masked_var, masked_whiten
from ragen_lightning.errors import ConfigError
from ragen_lightning.types import RolloutBatch

# (batch, token rewards [B, T-1], loss mask [B, T-1], values [B, T-1] or None, AdvantageSettings)
#   -> (advantages [B, T-1], returns [B, T-1], logs)
EstimatorFn = Callable[..., tuple[torch.Tensor, torch.Tensor, dict[str, float]]]


@dataclass(frozen=True)
class Estimator:
    """One advantage estimator and what it needs.

    Args:
        name: the ``--model.advantage.estimator`` value.
        fn: ``fn(batch, rewards, mask, values, settings) -> (advantages, returns, logs)``.
        critic: a critic is built and its values passed in (else ``values`` is None).
        groups: needs groups of >= 2 samples (``--data.training.group_size``): it compares a group's members.
        outcome: one score per episode compared across episodes (the group-outcome modifiers
            ``soft_reweight`` and ``length_weight`` apply to it).
        per_sample: scores each sample by its own turn reward, so ``--data.branching.branches > 1`` may feed it.
        branching: needs branching rollouts (``--data.branching.branches >= 2``, ``--data.rewards.placement turn``).
        sparse_rows: advantage 0 on every token of many rows: the update leaves those rows out (:func:`kept_rows`).
        whole_states: with ``sparse_rows``, a state's rows stay or go together (its statistics count all of them).
        switches: the boolean ``--model.advantage.*`` settings that only this estimator reads.
    """

    name: str
    fn: EstimatorFn
    critic: bool = False
    groups: bool = False
    outcome: bool = False
    per_sample: bool = False
    branching: bool = False
    sparse_rows: bool = False
    whole_states: bool = False
    switches: tuple[str, ...] = ()


ESTIMATORS: dict[str, Estimator] = {}


def register_estimator(name: str, fn: EstimatorFn, **needs) -> Estimator:
    """Add (or replace) the estimator ``name`` (``needs``: the flags of :class:`Estimator`)."""
    ESTIMATORS[name] = Estimator(name, fn, **needs)
    return ESTIMATORS[name]


def get_estimator(name: str) -> Estimator:
    """The registered estimator ``name``; an unknown name is a :class:`ConfigError` listing the registered ones."""
    try:
        return ESTIMATORS[name]
    except KeyError:
        raise ConfigError(f"--model.advantage.estimator must be one of {', '.join(ESTIMATORS)} (or one registered "
                          f"with ragen_lightning.starpo.register_estimator), got {name!r}") from None


def estimators_where(**flags) -> list[str]:
    """Names of the registered estimators with the given flag values (for messages and docs)."""
    return [e.name for e in ESTIMATORS.values() if all(getattr(e, k) == v for k, v in flags.items())]


# -- the built-in estimators ----------------------------------------------------------------------------------------
def gae(batch: RolloutBatch, rewards, mask, values, s):
    """GAE (turn-level with ``turn_level_gae``), whitened over the batch. Per-turn rewards on per-turn samples:
    GAE over each episode's samples in turn order."""
    r, v, ends, m = rewards, values, batch.turn_ends[:, 1:] & mask, mask
    chained = batch.chains_turns
    if chained:
        m, (r, v, ends), unpack = A.chain_rows(batch.episode_index, mask, r, v, ends)
    if s.turn_level_gae:
        adv, returns = A.turn_level_gae(r, v, m, ends, s.gamma, s.lam, s.high_level_gamma)
    else:
        adv, returns = A.gae(r, v, m, s.gamma, s.lam)
    if chained:
        adv, returns = unpack(adv), unpack(returns)
    return masked_whiten(adv, mask), returns, {}


def rft(batch: RolloutBatch, rewards, mask, values, s):
    """Per-turn rewards: each turn by its own reward; else every turn by the episode score."""
    if batch.per_turn_rewards:
        adv = A.rft_advantages(rewards, mask, batch.turn_ends[:, 1:], s.rft_threshold)
    else:
        adv = A.broadcast_to_tokens((batch.scores > s.rft_threshold).to(rewards.dtype), mask)
    if s.rft_per_state and batch.state_index is not None:
        adv = A.share_by_state(adv, mask, batch.state_index)
    return adv, adv, {}


def by_state(per_state: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> EstimatorFn:
    """An estimator that scores each one-turn row's reward against the responses to its state by ``per_state``
    (``(turn rewards [B], state index [B]) -> [B]``)."""

    def estimate(batch: RolloutBatch, rewards, mask, values, s):
        if batch.state_index is None or not batch.per_turn_rewards:
            raise ValueError(f"--model.advantage.estimator {s.estimator} needs per-turn rewards and the batch's "
                             "state_index (branching rollouts)")
        turn_reward = (rewards * mask.to(rewards.dtype)).sum(dim=-1)
        adv = A.broadcast_to_tokens(per_state(turn_reward, batch.state_index), mask)
        return adv, adv, {}

    return estimate


def by_episode_outcome(per_episode: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> EstimatorFn:
    """An estimator on one score per episode (``(scores [E], group index [E]) -> [E]``), broadcast to the
    episode's samples and trained tokens; ``soft_reweight`` scales it by its group's reward spread."""

    def estimate(batch: RolloutBatch, rewards, mask, values, s):
        first: dict[int, int] = {}  # turn-level context modes repeat an episode over several samples
        for row, ep in enumerate(batch.episode_index.tolist()):
            first.setdefault(ep, row)
        ep_rows = torch.tensor(list(first.values()), device=mask.device)
        ep_adv = per_episode(batch.scores[ep_rows].float(), batch.group_index[ep_rows])
        lookup = dict(zip(first.keys(), ep_adv.tolist()))
        per_sample = torch.tensor([lookup[e] for e in batch.episode_index.tolist()], device=mask.device)
        logs = {}
        if s.soft_reweight:
            spread = A.group_std(batch.scores.float(), batch.group_index)
            per_sample, sw = A.soft_advantage_reweight(per_sample, spread)
            logs = {f"train/{k}": float(v) for k, v in sw.items()}
        adv = A.broadcast_to_tokens(per_sample, mask)
        return adv, adv, logs

    return estimate


DEFAULT_ESTIMATOR = register_estimator("gae", gae, critic=True, switches=("turn_level_gae",)).name
register_estimator("grpo", by_episode_outcome(A.grpo), groups=True, outcome=True)
register_estimator("drgrpo", by_episode_outcome(A.drgrpo), groups=True, outcome=True)
register_estimator("brpo", by_episode_outcome(A.brpo), outcome=True)
register_estimator("arpo", by_episode_outcome(A.arpo), outcome=True)
register_estimator("rft", rft, per_sample=True, sparse_rows=True, switches=("rft_per_state",))
register_estimator("state_baseline", by_state(A.drgrpo), per_sample=True, branching=True, sparse_rows=True)
register_estimator("state_grpo", by_state(A.grpo), per_sample=True, branching=True, sparse_rows=True,
                   whole_states=True)


# -- the orchestration ----------------------------------------------------------------------------------------------
def starpo_advantages(batch: RolloutBatch, mask: torch.Tensor, *, old_logprobs: torch.Tensor | None,
                      ref_logprobs: torch.Tensor | None, values: torch.Tensor | None,
                      settings) -> tuple[torch.Tensor, torch.Tensor, dict[str, float]]:
    """``(advantages, returns, logs)`` for a rollout batch by ``settings`` (an
    :class:`~ragen_lightning.starpo.settings.AdvantageSettings`); ``mask`` is the loss mask on the target axis."""
    s, logs = settings, {}
    rewards = batch.rewards[:, 1:].float()
    if s.kl_in_reward_coef > 0:
        rewards, kl_logs = A.apply_kl_in_reward(rewards, old_logprobs, ref_logprobs, mask, s.kl_in_reward_coef,
                                                s.kl_in_reward_kind)
        logs["actor/reward_kl"] = float(kl_logs["kl"])
    adv, returns, own_logs = get_estimator(s.estimator).fn(batch, rewards, mask, values, s)
    logs.update(own_logs)
    if s.floor is not None:  # e.g. 0: learn from the better-than-baseline samples only
        adv = adv.clamp(min=s.floor)
    adv = A.filter_loss_scaling(adv, batch.metrics.get("rollout/filter_kept_ratio", 1.0), s.filter_loss_scaling)
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
    """A ``sparse_rows`` estimator's rows of ``batch`` with a kept token, and their share of its rows. Every other row
    has advantage 0 on every token, so the policy loss gives it no gradient; leaving it out of the update makes each
    mini-batch ``mini_batch_size`` kept samples (a supervised step on that many, as in SFT, not on the few kept among
    many zero rows, whose steps broke the policy: docs/learning.md, round 13) and skips its forward and backward
    passes. The entropy bonus and KL loss of the dropped rows go with them. The batch is returned as is when the
    rewards need log-probs first (``kl_in_reward_coef`` > 0). A ``whole_states`` estimator keeps every response of a
    state with spread: a state's std counts its responses at the mean too, so dropping them would change the others'
    advantages."""
    if settings.kl_in_reward_coef > 0 or len(batch) == 0:
        return batch, 1.0
    mask = batch.loss_mask[:, 1:].bool()
    adv, _, _ = starpo_advantages(batch, mask, old_logprobs=None, ref_logprobs=None, values=None, settings=settings)
    trains = (adv != 0).any(dim=-1)
    if get_estimator(settings.estimator).whole_states:
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
                   ref_logprobs: torch.Tensor | None, settings):
    """``of(values, rows)``: :func:`starpo_advantages` of the whole batch (``rows`` None) or of rows ``rows`` only
    (their returns are exact: GAE targets are per row; whitening and group statistics then cover those rows only).
    Not for rows of a batch whose GAE chains an episode's samples (``batch.chains_turns``): a row's returns then
    depend on the later turns' rows."""

    def of(values: torch.Tensor | None, rows: torch.Tensor | None):
        if rows is None:
            return starpo_advantages(batch, mask, old_logprobs=old_logprobs, ref_logprobs=ref_logprobs,
                                     values=values, settings=settings)
        if batch.chains_turns:
            raise ValueError("per-row returns are undefined when GAE chains an episode's turn samples")
        pick = lambda t: None if t is None else t[rows]
        return starpo_advantages(batch.select(rows), mask[rows], old_logprobs=pick(old_logprobs),
                                 ref_logprobs=pick(ref_logprobs), values=values, settings=settings)

    return of
