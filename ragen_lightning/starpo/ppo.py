"""Step 4 of a StarPO iteration: ``ppo_epochs`` x mini-batches of a critic step then an actor step.

:func:`ppo_update` is the loop; :func:`actor_micro_loss` / :func:`critic_micro_loss` bind the pure losses of
:mod:`ragen_lightning.algos.losses` to the networks for one micro-batch: a teacher-forced forward on its rows (cut to
their longest row), then the loss with the mini-batch's normaliser, so the terms add up over micro-batches to the
mini-batch value whatever the micro-batch size. The optimizer mechanics (accumulate, clip, step, data-parallel
shares) are :mod:`.optimizer_steps`'s.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from ragen_lightning.algos.losses import (
    AggMode,
    KLKind,
    actor_loss,
    agg_normalizer,
    aggregate,
    tis_weights,
    value_loss,
)
from ragen_lightning.parallel import all_reduce_, world
from ragen_lightning.starpo.optimizer_steps import (
    MicroOutput,
    StepResult,
    mini_batches,
    scatter_outputs,
)
from ragen_lightning.starpo.scoring import (
    actor_outputs,
    critic_values,
    first_target,
    update_order,
)
from ragen_lightning.starpo.settings import ModuleSettings
from ragen_lightning.types import UpdateBatch

# (values [b, T - 1], rows of the batch or None for all) -> (advantages, returns, logs), as starpo_advantages
AdvantagesOf = Callable[[torch.Tensor, torch.Tensor | None], tuple[torch.Tensor, torch.Tensor, dict[str, float]]]
_ACTOR_TERMS = ("pg_loss", "entropy_loss", "kl_loss")  # actor_loss's shares of the mini-batch loss


@dataclass(frozen=True)
class ActorLoss:
    """What the actor's loss of one iteration needs: the ``--model.loss.*`` settings and how log-probs are computed
    (:meth:`of` builds it from the module's settings)."""

    clip_low: float
    clip_high: float
    dual_clip: float | None
    loss_agg_mode: AggMode
    entropy_coeff: float
    kl_coef: float
    kl_kind: KLKind
    temperature: float
    tis_cap: float | None
    logits_chunk_size: int | None
    share_prefix: bool = True  # run the rows' common prefix once (scoring.shared_prefix); exact
    max_step_kl: float | None = None  # undo an actor step whose KL on its own rows exceeds this (step_kl)
    pack: bool = False  # run each micro-batch's rows packed, without padding (models.packing); exact

    @classmethod
    def of(cls, s: ModuleSettings) -> ActorLoss:
        """From the module's settings. The shared prefix is off under activation checkpointing: recomputing a block
        in backward would append its keys to the prefix cache a second time."""
        loss = s.loss
        return cls(clip_low=loss.clip_low, clip_high=loss.clip_high, dual_clip=loss.dual_clip,
                   loss_agg_mode=loss.agg_mode, entropy_coeff=loss.entropy_coeff, kl_coef=loss.kl_coef,
                   kl_kind=loss.kl_kind, temperature=s.temperature, tis_cap=loss.tis_cap,
                   logits_chunk_size=s.update.logits_chunk_size,
                   share_prefix=not s.update.activation_checkpointing, max_step_kl=s.optim.max_step_kl,
                   pack=s.update.pack)


def actor_micro_loss(actor: nn.Module, batch: UpdateBatch, settings: ActorLoss, *,
                     normalizer: torch.Tensor, horizon: int, first_pass: bool) -> MicroOutput:
    """PPO loss of one micro-batch (``batch`` = its rows). On the first pass of an on-policy update
    (``batch.old_logprobs is None``) this forward's log-probs are the old log-probs (ratio 1) and are returned,
    with the token entropy, for the iteration's logs."""
    s = settings
    record = first_pass and batch.old_logprobs is None
    logprobs, entropy = actor_outputs(actor, batch.input_ids, batch.attention_mask,
                                      with_entropy=s.entropy_coeff != 0 or record, temperature=s.temperature,
                                      chunk_size=s.logits_chunk_size, skip=first_target(batch.loss_mask),
                                      share_prefix=s.share_prefix, pack=s.pack)
    old = batch.old_logprobs if batch.old_logprobs is not None else logprobs.detach()
    is_w = tis_weights(old, batch.engine_logprobs, s.tis_cap) if s.tis_cap is not None else None
    loss, metrics = actor_loss(logprobs, old, batch.advantages, batch.loss_mask,
                               entropy=entropy if s.entropy_coeff != 0 else None,
                               ref_logprobs=batch.ref_logprobs if s.kl_coef != 0 else None,
                               entropy_coeff=s.entropy_coeff, kl_coef=s.kl_coef, kl_kind=s.kl_kind,
                               clip_low=s.clip_low, clip_high=s.clip_high, dual_clip=s.dual_clip,
                               agg=s.loss_agg_mode, normalizer=normalizer, horizon=horizon, is_weights=is_w)
    terms = {k: metrics.pop(k) for k in _ACTOR_TERMS if k in metrics}
    outputs = (logprobs.detach().float(), entropy.detach().float()) if record else ()
    probe = logprobs.detach().float() if s.max_step_kl is not None else None
    return MicroOutput(loss, terms, metrics, outputs, probe)


@torch.no_grad()
def step_kl(actor: nn.Module, data: UpdateBatch, probes: list[tuple[torch.Tensor, torch.Tensor]],
            settings: ActorLoss) -> tuple[float, str | None]:
    """``(KL, reason)`` of an actor step: the mean over the step's trained tokens of the k3 estimate of
    KL(before || after), ``exp(d) - d - 1`` with ``d = logp_after - logp_before`` (tokens sampled near the
    before-policy; >= 0 token by token), from the log-probs its loss forward recorded (``probes``) and a no-grad
    forward now; the reason is set when it exceeds ``settings.max_step_kl``. A collective with several ranks.

    Why: Adam moves nearly every weight by about ``lr`` each step, whatever the gradient's size, so one mini-batch
    dominated by a rare sample can turn the whole policy in one or two steps (measured on the tiny model: a step
    that moved the next mini-batch's tokens by 1.5 nats and emptied every answer; docs/learning.md, round 9)."""
    total = torch.zeros(2, dtype=torch.float64)
    for rows, before in probes:
        b = data.rows(rows)
        after, _ = actor_outputs(actor, b.input_ids, b.attention_mask, with_entropy=False,
                                 temperature=settings.temperature, chunk_size=settings.logits_chunk_size,
                                 skip=first_target(b.loss_mask), share_prefix=settings.share_prefix,
                                 pack=settings.pack)
        d = (after.float() - before).clamp(-20.0, 20.0)
        mask = b.loss_mask.to(d.dtype)
        total += torch.stack([((d.exp() - d - 1.0) * mask).sum(), mask.sum()]).double().cpu()
    if world()[1] > 1:
        total = all_reduce_(total.to(data.input_ids.device), "sum").cpu()
    kl = float(total[0] / total[1]) if total[1] > 0 else 0.0
    limit = settings.max_step_kl
    return kl, (f"step KL {kl:.4g} > --model.optim.max_step_kl {limit:g}" if limit is not None and kl > limit else None)


def critic_micro_loss(critic: nn.Module, batch: UpdateBatch, *, clip_range: float, normalizer: torch.Tensor,
                      returns_of: Callable[[torch.Tensor], torch.Tensor] | None = None,
                      share_prefix: bool = False, pack: bool = False) -> MicroOutput:
    """Clipped value loss of one micro-batch; ``vf_loss`` and ``vpred_mean`` are shares of the mini-batch's
    token means (they add up over micro-batches), ``vf_clipfrac`` is this micro-batch's fraction.

    On-policy (``batch.values`` None) this forward's values are the rollout-time values: the targets come from
    ``returns_of(values)`` (per row, so a micro-batch needs only its own rows) and the values are returned."""
    v = critic_values(critic, batch.input_ids, batch.attention_mask, skip=first_target(batch.loss_mask),
                      share_prefix=share_prefix, pack=pack)
    values = batch.values if batch.values is not None else v.detach()
    returns = batch.returns if batch.values is not None else returns_of(values)
    loss, metrics = value_loss(v, values, returns, batch.loss_mask, clip_range=clip_range, agg="token-mean",
                               normalizer=normalizer)
    terms = {"vf_loss": loss.detach(), "vpred_mean": aggregate(v.detach(), batch.loss_mask, normalizer=normalizer)}
    return MicroOutput(loss, terms, {"vf_clipfrac": metrics["vf_clipfrac"]}, () if batch.values is not None else (values,))


def ppo_update(data: UpdateBatch, actor: nn.Module | None, critic: nn.Module | None, *, policy_loss: ActorLoss,
               value_clip: float, ppo_epochs: int, mini_batch_size: int, shuffle: bool, iteration: int,
               step: Callable[..., StepResult], advantages_of: AdvantagesOf | None = None, background=None):
    """``ppo_epochs`` x mini-batches of a critic step (when there is a critic) then an actor step (when there is an
    actor: ``actor=None`` runs the critic's steps alone, e.g. on a worker thread, :mod:`.background`).

    ``step(network, rows, loss_fn)`` runs one optimizer step of ``"actor"`` or ``"critic"`` over this rank's
    ``rows`` (:func:`~.optimizer_steps.accumulate`). With a critic and ``data.values`` None (on-policy: one epoch over one
    mini-batch) the critic step's own forward supplies the values, so no separate value pass runs: its targets come
    from ``advantages_of(values, rows)`` per micro-batch, then ``advantages_of(values, None)`` gives the batch's
    advantages and returns for the actor (their logs are returned with the step metrics).

    With ``background`` (a :class:`~ragen_lightning.starpo.background.BackgroundSteps`) the critic's steps are
    submitted to its worker thread after the actor's (``step(..., background=background)`` there; ``data.values``
    must be given) and their metrics come from ``background.join()`` later.

    Returns the step metrics averaged over steps (``actor/<name>``, ``critic/<name>``) and, on-policy
    (``data.old_logprobs is None``), the first pass's ``(logprobs, entropy)`` ``[B, T - 1]`` (summed over ranks), else None.
    """
    if background is not None and critic is not None:
        update = functools.partial(ppo_update, data, policy_loss=policy_loss, value_clip=value_clip,
                                   ppo_epochs=ppo_epochs, mini_batch_size=mini_batch_size, shuffle=shuffle,
                                   iteration=iteration, advantages_of=advantages_of)
        steps = ppo_epochs * len(range(0, len(data), mini_batch_size))  # the critic's, counted when submitted
        return _critic_in_background(data, update, actor, critic, step, background, steps)
    B, width = len(data), data.loss_mask.shape[1]
    if critic is not None and data.values is None and (ppo_epochs > 1 or B > mini_batch_size or advantages_of is None):
        raise ValueError("values from the critic step's own forward need one epoch over one mini-batch and advantages_of")
    padded = data.with_inert_row() if world()[1] > 1 else data  # row B pads short per-rank shares of a mini-batch
    logs: dict[str, list[float]] = {}
    adv_logs: dict[str, float] = {}
    seen: list[tuple[torch.Tensor, tuple[torch.Tensor, ...]]] = []  # (rows, first-pass outputs) of the actor's steps
    step = functools.partial(step, lengths=(lengths := padded.attention_mask.sum(-1)))  # order and token budget
    for epoch in range(ppo_epochs):
        for mb, rows in mini_batches(B, mini_batch_size, shuffle=shuffle, epoch=epoch, iteration=iteration,
                                     device=data.input_ids.device):
            rows = update_order(rows, padded.input_ids, lengths, policy_loss.pack)
            if critic is not None:
                norm = agg_normalizer(padded.loss_mask[mb], "token-mean")
                result = step("critic", rows, lambda m, n=norm: critic_micro_loss(
                    critic, padded.rows(m), clip_range=value_clip, normalizer=n, share_prefix=policy_loss.share_prefix,
                    pack=policy_loss.pack,
                    returns_of=lambda v, m=m: advantages_of(_widen(v, width), torch.where(m < B, m, 0))[1][:, : v.shape[1]]))
                _merge(logs, result, "critic")
                if data.values is None:  # on-policy: the advantages need the values this step just computed
                    data, padded, adv_logs = _with_values(data, padded, result, advantages_of)
            if actor is None:
                continue
            norm = agg_normalizer(padded.loss_mask[mb], policy_loss.loss_agg_mode, horizon=width)
            guard = {} if policy_loss.max_step_kl is None else {
                "check": lambda probes, d=padded: step_kl(actor, d, probes, policy_loss)}
            result = step("actor", rows, lambda m, n=norm, first=epoch == 0: actor_micro_loss(
                actor, padded.rows(m), policy_loss, normalizer=n, horizon=width, first_pass=first), **guard)
            _merge(logs, result, "actor")
            seen += result.outputs
    means = {k: sum(v) / len(v) for k, v in logs.items()} | adv_logs
    if data.old_logprobs is not None or actor is None:
        return means, None
    return means, scatter_outputs(seen, 2, padded.loss_mask, B)


def _critic_in_background(data: UpdateBatch, update: Callable, actor, critic, step: Callable[..., StepResult],
                          background, steps: int):
    """The actor's steps now, the critic's ``steps`` submitted to ``background``'s worker (``update``:
    :func:`ppo_update` bound to ``data`` and the settings)."""
    if data.values is None:
        raise ValueError("critic steps in the background need the values of a separate value pass")
    result = update(actor, None, step=step)
    background.submit(lambda: update(None, critic, step=lambda *a, **k: step(*a, **k, background=background))[0],
                      steps=steps)
    return result


def _with_values(data: UpdateBatch, padded: UpdateBatch, result: StepResult, advantages_of: AdvantagesOf):
    """``(data, padded, advantage logs)`` with the values of the on-policy critic step ``result`` and the
    advantages and returns they give."""
    (values,) = scatter_outputs(result.outputs, 1, padded.loss_mask, len(data))
    advantages, returns, logs = advantages_of(values, None)
    data = dataclasses.replace(data, values=values, advantages=advantages, returns=returns)
    return data, (data.with_inert_row() if world()[1] > 1 else data), logs


def _widen(values: torch.Tensor, width: int) -> torch.Tensor:
    """``[b, L - 1]`` micro-batch values zero-padded to the batch's ``[b, T - 1]``."""
    return torch.nn.functional.pad(values, (0, width - values.shape[1]))


def _merge(acc: dict[str, list[float]], result: StepResult, network: str) -> None:
    for k, v in result.metrics.items():
        acc.setdefault(f"{network}/{k}", []).append(v)
