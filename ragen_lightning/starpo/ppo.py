"""Step 4 of a StarPO iteration: ``ppo_epochs`` x mini-batches of a critic step then an actor step.

:func:`ppo_update` is the loop; :func:`critic_step` and :func:`actor_step` are one optimizer step
each (the mechanics: :func:`~.optim.accumulate`). Their micro-batch losses,
:func:`critic_micro_loss` and :func:`actor_micro_loss`, bind the pure losses of
:mod:`ragen_lightning.algos.losses` to the networks: a teacher-forced forward on the micro-batch's
rows (cut to their longest row), then the loss with the mini-batch's normaliser, so the terms add up
over micro-batches to the mini-batch value whatever the micro-batch size.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable

import torch
from torch import nn

from ragen_lightning.algos.losses import (
    actor_loss,
    agg_normalizer,
    aggregate,
    tis_weights,
    value_loss,
)
from ragen_lightning.parallel import all_reduce_, rank_rows, world
from ragen_lightning.starpo.background import BackgroundSteps
from ragen_lightning.starpo.optim import MicroOutput, StepContext, StepResult, accumulate
from ragen_lightning.starpo.scoring import (
    ForwardSettings,
    actor_outputs,
    critic_values,
    first_target,
    update_order,
)
from ragen_lightning.starpo.settings import ModuleSettings
from ragen_lightning.types import UpdateBatch

# (values [b, T - 1], rows of the batch or None for all) -> (advantages, returns, logs)
AdvantagesOf = Callable[
    [torch.Tensor, torch.Tensor | None], tuple[torch.Tensor, torch.Tensor, dict[str, float]]
]
# (values [b, L - 1], the micro-batch's rows) -> the critic's targets [b, L - 1]
ReturnsOf = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
_ACTOR_TERMS = ("pg_loss", "entropy_loss", "kl_loss")  # actor_loss's shares of the mini-batch loss


def ppo_update(
    data: UpdateBatch,
    settings: ModuleSettings,
    *,
    actor: StepContext | None,
    critic: StepContext | None,
    iteration: int,
    advantages_of: AdvantagesOf | None = None,
    background: BackgroundSteps | None = None,
):
    """``ppo_epochs`` x mini-batches of a critic step (with a critic) then an actor step.

    On-policy with a critic (``data.values`` None: one epoch over one mini-batch) the critic step's
    own forward supplies the values: its targets come from ``advantages_of(values, rows)`` per
    micro-batch, then ``advantages_of(values, None)`` gives the actor's advantages (their logs are
    returned with the step metrics). With ``background`` the critic's steps (same mini-batches,
    same order; ``data.values`` given) run on its worker thread after the actor's; their metrics
    come from ``background.join()`` later.

    Returns the step metrics averaged over steps (``actor/<name>``, ``critic/<name>``) and,
    on-policy (``data.old_logprobs`` None), the first pass's ``(logprobs, entropy)``
    ``[B, T - 1]`` (summed over ranks), else None.
    """
    u, B = settings.update, len(data)
    deferred = [] if background is not None and critic is not None else None  # critic's (mb, rows)
    if deferred is not None and data.values is None:
        raise ValueError("critic steps in the background need the values of a separate value pass")
    if (
        critic is not None
        and data.values is None
        and (u.ppo_epochs > 1 or B > u.mini_batch_size or advantages_of is None)
    ):
        raise ValueError(
            "values from the critic step's own forward need one epoch over one "
            "mini-batch and advantages_of"
        )
    padded = data.with_inert_row() if world()[1] > 1 else data  # row B pads short per-rank shares
    lengths = padded.attention_mask.sum(-1)  # the micro-batches' order and token budget
    returns_of = None  # on-policy: the critic's targets from the values of its own forward
    if data.values is None and critic is not None:
        returns_of = functools.partial(_returns, advantages_of, B, data.loss_mask.shape[1])
    logs: dict[str, list[float]] = {}
    adv_logs: dict[str, float] = {}
    seen: list[tuple[torch.Tensor, tuple[torch.Tensor, ...]]] = []  # actor's first-pass outputs
    for epoch in range(u.ppo_epochs):
        for mb, rows in mini_batches(
            B,
            u.mini_batch_size,
            shuffle=u.shuffle,
            epoch=epoch,
            iteration=iteration,
            device=data.input_ids.device,
        ):
            rows = update_order(rows, padded.input_ids, lengths, u.pack)
            if deferred is not None:  # the critic steps on the worker thread, after the actor's
                deferred.append((mb, rows))
            elif critic is not None:
                result = critic_step(
                    critic, padded, mb, rows, settings, lengths=lengths, returns_of=returns_of
                )
                _merge(logs, result, "critic")
                if data.values is None:  # on-policy: the advantages need the values just computed
                    data, padded, adv_logs = _with_values(data, padded, result, advantages_of)
            if actor is not None:
                result = actor_step(
                    actor, padded, mb, rows, settings, lengths=lengths, first_pass=epoch == 0
                )
                _merge(logs, result, "actor")
                seen += result.outputs
    if deferred is not None:
        job = functools.partial(
            critic_steps, critic.outside_lightning(), padded, deferred, settings, lengths
        )
        background.submit(job, steps=len(deferred), optimizer=critic.optimizer)
    means = {k: sum(v) / len(v) for k, v in logs.items()} | adv_logs
    if data.old_logprobs is not None or actor is None:
        return means, None
    return means, scatter_outputs(seen, 2, padded.loss_mask, B)


def critic_step(
    critic: StepContext,
    data: UpdateBatch,
    mb: torch.Tensor,
    rows: torch.Tensor,
    settings: ModuleSettings,
    *,
    lengths: torch.Tensor,
    returns_of: ReturnsOf | None = None,
) -> StepResult:
    """One critic optimizer step on mini-batch ``mb`` (its global rows; ``rows``: this rank's
    share, in order): the clipped value loss, token-mean. On-policy (``data.values`` None) the
    targets come from ``returns_of``."""
    normalizer = agg_normalizer(data.loss_mask[mb], "token-mean")
    loss_fn = functools.partial(
        critic_micro_loss,
        critic.model,
        data,
        settings,
        normalizer=normalizer,
        returns_of=returns_of,
    )
    return accumulate(critic, rows, loss_fn, lengths=lengths)


def critic_steps(
    critic: StepContext,
    data: UpdateBatch,
    batches: list[tuple[torch.Tensor, torch.Tensor]],
    settings: ModuleSettings,
    lengths: torch.Tensor,
) -> dict[str, float]:
    """The critic's steps over ``batches`` (``(mb, rows)`` in the update's order), as one job of
    :class:`~.background.BackgroundSteps`: its metrics averaged over steps."""
    logs: dict[str, list[float]] = {}
    for mb, rows in batches:
        _merge(logs, critic_step(critic, data, mb, rows, settings, lengths=lengths), "critic")
    return {k: sum(v) / len(v) for k, v in logs.items()}


def actor_step(
    actor: StepContext,
    data: UpdateBatch,
    mb: torch.Tensor,
    rows: torch.Tensor,
    settings: ModuleSettings,
    *,
    lengths: torch.Tensor,
    first_pass: bool,
) -> StepResult:
    """One actor optimizer step on mini-batch ``mb`` (its global rows; ``rows``: this rank's
    share, in order): the PPO loss. With ``--model.optim.max_step_kl`` the step is undone when it
    moves its own rows too far (:func:`step_kl`)."""
    width = data.loss_mask.shape[1]
    normalizer = agg_normalizer(data.loss_mask[mb], settings.loss.agg_mode, horizon=width)
    loss_fn = functools.partial(
        actor_micro_loss, actor.model, data, settings, normalizer=normalizer, first_pass=first_pass
    )
    limit = settings.optim.max_step_kl
    check = None
    if limit is not None:
        check = functools.partial(step_kl, actor.model, data, settings.forward, limit)
    return accumulate(actor, rows, loss_fn, lengths=lengths, check=check)


def actor_micro_loss(
    actor: nn.Module,
    data: UpdateBatch,
    settings: ModuleSettings,
    rows: torch.Tensor,
    *,
    normalizer: torch.Tensor,
    first_pass: bool,
) -> MicroOutput:
    """PPO loss of the micro-batch ``rows`` of ``data``. On the first pass of an on-policy update
    (``data.old_logprobs`` None) this forward's log-probs are the old log-probs (ratio 1) and are
    returned, with the token entropy, for the iteration's logs."""
    batch, loss = data.rows(rows), settings.loss
    record = first_pass and batch.old_logprobs is None
    logprobs, entropy = actor_outputs(
        actor,
        batch.input_ids,
        batch.attention_mask,
        settings.forward,
        skip=first_target(batch.loss_mask),
        with_entropy=loss.entropy_coeff != 0 or record,
    )
    old = batch.old_logprobs if batch.old_logprobs is not None else logprobs.detach()
    is_w = None
    if loss.tis_cap is not None:
        is_w = tis_weights(old, batch.engine_logprobs, loss.tis_cap)
    total, metrics = actor_loss(
        logprobs,
        old,
        batch.advantages,
        batch.loss_mask,
        loss,
        entropy=entropy if loss.entropy_coeff != 0 else None,
        ref_logprobs=batch.ref_logprobs if loss.kl_coef != 0 else None,
        normalizer=normalizer,
        horizon=data.loss_mask.shape[1],
        is_weights=is_w,
    )
    terms = {k: metrics.pop(k) for k in _ACTOR_TERMS if k in metrics}
    outputs = (logprobs.detach().float(), entropy.detach().float()) if record else ()
    probe = logprobs.detach().float() if settings.optim.max_step_kl is not None else None
    return MicroOutput(total, terms, metrics, outputs, probe)


def critic_micro_loss(
    critic: nn.Module,
    data: UpdateBatch,
    settings: ModuleSettings,
    rows: torch.Tensor,
    *,
    normalizer: torch.Tensor,
    returns_of: ReturnsOf | None = None,
) -> MicroOutput:
    """Clipped value loss of the micro-batch ``rows`` of ``data``; ``vf_loss`` and ``vpred_mean``
    are shares of the mini-batch's token means (they add up over micro-batches), ``vf_clipfrac`` is
    this micro-batch's fraction.

    On-policy (``data.values`` None) this forward's values are the rollout-time values: the targets
    come from ``returns_of(values, rows)`` (per row: a micro-batch needs only its own rows) and the
    values are returned."""
    batch = data.rows(rows)
    v = critic_values(
        critic,
        batch.input_ids,
        batch.attention_mask,
        settings.forward,
        skip=first_target(batch.loss_mask),
    )
    on_policy = batch.values is None
    values = v.detach() if on_policy else batch.values
    returns = returns_of(values, rows) if on_policy else batch.returns
    loss, metrics = value_loss(
        v,
        values,
        returns,
        batch.loss_mask,
        agg_mode="token-mean",
        clip_range=settings.critic.value_clip,
        normalizer=normalizer,
    )
    terms = {
        "vf_loss": loss.detach(),
        "vpred_mean": aggregate(v.detach(), batch.loss_mask, normalizer=normalizer),
    }
    stats = {"vf_clipfrac": metrics["vf_clipfrac"]}
    return MicroOutput(loss, terms, stats, (values,) if on_policy else ())


@torch.no_grad()
def step_kl(
    actor: nn.Module,
    data: UpdateBatch,
    forward: ForwardSettings,
    limit: float,
    probes: list[tuple[torch.Tensor, torch.Tensor]],
) -> tuple[float, str | None]:
    """``(KL, reason)`` of an actor step: the mean over the step's trained tokens of the k3 estimate
    of KL(before || after), ``exp(d) - d - 1`` with ``d = logp_after - logp_before``, from the
    log-probs its loss forward recorded (``probes``) and a no-grad forward now; the reason is set
    when it exceeds ``limit`` (``--model.optim.max_step_kl``). A collective with several ranks.

    Why: Adam moves nearly every weight by about ``lr`` each step whatever the gradient's size, so
    one mini-batch dominated by a rare sample can turn the whole policy (docs/learning.md)."""
    total = torch.zeros(2, dtype=torch.float64)
    for rows, before in probes:
        b = data.rows(rows)
        after, _ = actor_outputs(
            actor,
            b.input_ids,
            b.attention_mask,
            forward,
            with_entropy=False,
            skip=first_target(b.loss_mask),
        )
        d = (after.float() - before).clamp(-20.0, 20.0)
        mask = b.loss_mask.to(d.dtype)
        total += torch.stack([((d.exp() - d - 1.0) * mask).sum(), mask.sum()]).double().cpu()
    if world()[1] > 1:
        total = all_reduce_(total.to(data.input_ids.device), "sum").cpu()
    kl = float(total[0] / total[1]) if total[1] > 0 else 0.0
    too_far = kl > limit
    return kl, (f"step KL {kl:.4g} > --model.optim.max_step_kl {limit:g}" if too_far else None)


def mini_batches(
    n: int,
    size: int,
    *,
    shuffle: bool,
    epoch: int,
    iteration: int,
    device: torch.device | str = "cpu",
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``(global rows, this rank's rows)`` of each mini-batch of ``size`` over ``n`` rows; the pad
    row ``n`` fills short per-rank shares (``UpdateBatch.with_inert_row``) so every rank runs the
    same micro-batches. The shuffle depends only on ``(iteration, epoch)``, so every rank draws the
    same order."""
    rows = torch.arange(n, device=device)
    if shuffle:
        g = torch.Generator().manual_seed(int(iteration) * 1_000_003 + epoch)
        rows = rows[torch.randperm(n, generator=g).to(device)]
    rank, ranks = world()
    return [
        (mb, rank_rows(mb, ranks, rank, pad_index=n) if ranks > 1 else mb)
        for mb in rows.split(size)
    ]


def scatter_outputs(
    outputs: list[tuple[torch.Tensor, tuple[torch.Tensor, ...]]],
    count: int,
    like: torch.Tensor,
    rows: int,
) -> tuple[torch.Tensor, ...]:
    """The ``count`` per-token outputs of a step's micro-batches as full ``[rows, T - 1]`` tensors
    (zeros where no micro-batch wrote; ``like`` gives the shape ``[B(+1), T - 1]``), summed across
    ranks: each rank fills its rows (a collective: every rank calls it)."""
    full = [torch.zeros_like(like, dtype=torch.float32) for _ in range(count)]
    for micro, tensors in outputs:
        for dest, t in zip(full, tensors):
            dest[micro, : t.shape[1]] = t
    return tuple(all_reduce_(t[:rows].contiguous()) for t in full)


def _returns(
    advantages_of: AdvantagesOf,
    real_rows: int,
    width: int,
    values: torch.Tensor,
    rows: torch.Tensor,
) -> torch.Tensor:
    """The on-policy critic's targets for the micro-batch ``rows`` from its ``values``
    ``[b, L - 1]``: the returns ``advantages_of`` gives them (values zero-padded to the batch's
    ``width``; the pad row reads row 0)."""
    widened = torch.nn.functional.pad(values, (0, width - values.shape[1]))
    return advantages_of(widened, torch.where(rows < real_rows, rows, 0))[1][:, : values.shape[1]]


def _with_values(
    data: UpdateBatch, padded: UpdateBatch, result: StepResult, advantages_of: AdvantagesOf
):
    """``(data, padded, advantage logs)`` with the values of the on-policy critic step ``result``
    and the advantages and returns they give."""
    (values,) = scatter_outputs(result.outputs, 1, padded.loss_mask, len(data))
    advantages, returns, logs = advantages_of(values, None)
    data = dataclasses.replace(data, values=values, advantages=advantages, returns=returns)
    return data, (data.with_inert_row() if world()[1] > 1 else data), logs


def _merge(acc: dict[str, list[float]], result: StepResult, network: str) -> None:
    for k, v in result.metrics.items():
        acc.setdefault(f"{network}/{k}", []).append(v)
