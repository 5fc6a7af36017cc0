"""Teacher-forced forward passes in micro-batches: token log-probs, entropies and critic values.

Everything here works on the *target* axis of a right-padded batch: position ``j`` of an output
describes token ``input_ids[:, j + 1]`` (so outputs are ``[B, T - 1]``). Micro-batches are trimmed
to their longest row, so a short micro-batch never pays for the batch's longest conversation.

Rollout batches are right-padded, and the actor and critic are causal decoders: a real token attends
only to earlier positions, which are all real, so the padding mask changes nothing on real tokens
(positions count from 0 either way). :func:`causal_only` then drops the mask, which lets attention
take its causal fast path (SDPA ``is_causal``, no ``[B, 1, T, T]`` mask built per layer); outputs on
padding differ and are never used.

Rows of one micro-batch usually start with the same tokens: every conversation of an env opens with
the same system prompt, and a group's members share their first observation too (a third to a half
of a multi-turn row). With ``share_prefix`` that common prefix runs once (batch 1) and its key/value
cache is repeated across the rows, whose remaining tokens then run on top of it
(:func:`shared_prefix`). This is the same function of the weights (values agree to float rounding;
the prefix's gradient is the sum of every row's), at a fraction of the prefix's cost.

:func:`scoring_passes` is step 2 of a StarPO iteration: the no-grad passes over the rollout batch
that give the update its old log-probs, reference log-probs and values.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import nn

from ragen_lightning.algos.logits import entropy_from_logits, logprobs_from_logits
from ragen_lightning.models.forward import (
    MIN_SHARED,
    causal_only,
    run_on_shared_prefix,
    shared_prefix,
)
from ragen_lightning.models.packing import (
    by_tokens,
    run_packed,
    unpack,
    use_packed_attention,
)
from ragen_lightning.models.packing import pack as pack_rows
from ragen_lightning.parallel.ranks import all_reduce_, rank_rows, world
from ragen_lightning.parallel.threads import map_threads
from ragen_lightning.types import RolloutBatch, UpdateBatch

if TYPE_CHECKING:
    from ragen_lightning.starpo.settings import ModuleSettings


@dataclass(frozen=True)
class ForwardSettings:
    """How a teacher-forced forward pass runs; every choice gives the same outputs up to rounding.

    Attributes:
        temperature: log-probs and entropies are those of ``logits / temperature`` (the rollouts').
        logits_chunk_size: rows per chunk when computing log-probs/entropy from logits (memory).
        share_prefix: run the rows' common prefix once (:func:`shared_prefix`); off under activation
            checkpointing, whose recomputed blocks would append to the prefix cache a second time.
        pack: run the rows packed without padding (:mod:`ragen_lightning.models.packing`).
    """

    temperature: float = 1.0
    logits_chunk_size: int | None = None
    share_prefix: bool = False
    pack: bool = False


@dataclass(frozen=True)
class MicroBatching:
    """How an optimizer step's rows split into forward/backward passes (``--model.update.*``); every
    split gives the same step (losses are divided by the mini-batch's normaliser).

    Attributes:
        size: rows per micro-batch.
        tokens: a token budget per micro-batch instead of ``size`` rows (:func:`token_slices`).
        packed: the budget counts the rows' lengths (packed rows) rather than their padded size.
        threads: micro-batches run at once on CPU threads (one process).
    """

    size: int = 4
    tokens: int | None = None
    packed: bool = False
    threads: int = 1


def micro_slices(rows: torch.Tensor, micro_batch_size: int) -> Iterator[torch.Tensor]:
    """Consecutive chunks of the row indices ``rows``."""
    for start in range(0, rows.numel(), micro_batch_size):
        yield rows[start : start + micro_batch_size]


def token_slices(
    rows: torch.Tensor, lengths: torch.Tensor, budget: int, *, packed: bool
) -> list[torch.Tensor]:
    """Consecutive chunks of ``rows`` (in order; longest first, :func:`by_length`, makes them
    fullest) holding as many rows as fit ``budget`` tokens: padded, a chunk costs its rows times its
    longest row; ``packed``, the sum of its rows' lengths. A row longer than the budget forms a
    chunk of its own. Exact like any other split."""
    chunks, current, cost, longest = [], [], 0, 0
    for row, n in zip(rows.tolist(), lengths[rows].tolist()):
        grown = cost + n if packed else (len(current) + 1) * max(longest, n)
        if current and grown > budget:
            chunks.append(current)
            current, grown, longest = [], n, 0
        current.append(row)
        cost, longest = grown, max(longest, n)
    if current:
        chunks.append(current)
    return [torch.tensor(c, dtype=rows.dtype, device=rows.device) for c in chunks]


def plan_micro_batches(
    rows: torch.Tensor,
    lengths: torch.Tensor,
    micro_batch_size: int,
    micro_batch_tokens: int | None = None,
    *,
    packed: bool = False,
    pad_row: int | None = None,
) -> list[torch.Tensor]:
    """The micro-batches of ``rows``: ``micro_batch_size`` rows each, or by a token budget
    (:func:`token_slices`). With several ranks and a token budget every rank must run as many as the
    busiest one (each forward and backward is collective): the others get extra micro-batches of
    ``pad_row`` alone (a collective: every rank calls it)."""
    if micro_batch_tokens is None:
        return list(micro_slices(rows, micro_batch_size))
    micros = token_slices(rows, lengths, micro_batch_tokens, packed=packed)
    if world()[1] > 1:
        most = int(all_reduce_(torch.tensor(float(len(micros)), device=rows.device), "max"))
        fill = (
            rows[:1]
            if pad_row is None
            else torch.tensor([pad_row], dtype=rows.dtype, device=rows.device)
        )
        micros += [fill] * (most - len(micros))
    return micros


def by_length(rows: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """``rows`` longest first (ties in order), so consecutive micro-batches hold rows of similar
    length and each is trimmed to little padding. Exact: a mini-batch's loss and gradient do not
    depend on how it is split."""
    return rows[torch.argsort(lengths[rows], descending=True, stable=True)]


def update_order(
    rows: torch.Tensor, input_ids: torch.Tensor, lengths: torch.Tensor, packed: bool
) -> torch.Tensor:
    """The order micro-batches take ``rows`` in: longest first when padded (:func:`by_length`: least
    padding); packed, where padding costs nothing, rows that start alike together
    (:func:`~ragen_lightning.models.packing.by_tokens`: each common prefix packs once)."""
    return by_tokens(rows, input_ids, lengths) if packed else by_length(rows, lengths)


def trimmed(attention_mask: torch.Tensor, rows: torch.Tensor) -> int:
    """Length of the longest row among ``rows`` (at least 2, so there is one target)."""
    return max(int(attention_mask[rows].sum(-1).max()), 2)


def first_target(loss_mask: torch.Tensor | None) -> int:
    """The first target column any row of ``loss_mask`` [b, t - 1] trains (0 without a mask; the
    last column when no row trains anything)."""
    if loss_mask is None:
        return 0
    trained = loss_mask.any(0).nonzero()
    return int(trained[0]) if len(trained) else max(loss_mask.shape[1] - 1, 0)


def actor_outputs(
    actor: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    forward: ForwardSettings = ForwardSettings(),  # noqa: B008 (frozen)
    *,
    with_entropy: bool,
    skip: int = 0,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs (and entropies) of ``input_ids[:, 1:]`` under ``actor``: ``[b, t - 1]`` each.

    The first ``skip`` target columns (a prompt no row trains, :func:`first_target`) read 0: the LM
    head, the log-softmax and the entropy run only on the other positions (``logits_to_keep``),
    which is exact and saves the vocabulary-sized work on the prompt (half of a multi-turn row's
    tokens). With ``forward.share_prefix`` the rows' common leading tokens (up to ``skip``) run once
    (:func:`run_on_shared_prefix`). With ``forward.pack`` the rows run as one packed sequence
    without padding; columns past a row's end read 0.
    """
    temperature, chunk_size = forward.temperature, forward.logits_chunk_size
    share_prefix, pack = forward.share_prefix, forward.pack
    length = input_ids.shape[1]
    skip = min(max(skip, 0), length - 1)
    keep = length - skip if skip else 0
    prefix = shared_prefix(input_ids, attention_mask, skip, actor) if share_prefix else 0
    packing = (
        cheaper_packing(input_ids, attention_mask, skip if share_prefix else 0, prefix)
        if pack
        else None
    )
    if packing is not None:
        return _packed_actor_outputs(
            actor,
            input_ids,
            attention_mask,
            skip,
            packing,
            with_entropy=with_entropy,
            temperature=temperature,
            chunk_size=chunk_size,
        )
    if prefix:
        logits = run_on_shared_prefix(
            actor, input_ids, prefix, attention_mask=None, logits_to_keep=keep
        ).logits
    else:
        logits = actor(
            input_ids=input_ids, attention_mask=causal_only(attention_mask), logits_to_keep=keep
        ).logits
    logits = logits[:, :-1]
    if temperature != 1.0:
        logits = logits / temperature
    logprobs = logprobs_from_logits(logits, input_ids[:, skip + 1 :], chunk_size=chunk_size)
    entropy = entropy_from_logits(logits, chunk_size=chunk_size) if with_entropy else None
    if skip:
        logprobs = torch.nn.functional.pad(logprobs, (skip, 0))
        entropy = torch.nn.functional.pad(entropy, (skip, 0)) if entropy is not None else None
    return logprobs, entropy


PACK_SAVING = 0.95  # pack only when it runs at most this fraction of the padded pass's tokens


def cheaper_packing(input_ids: torch.Tensor, attention_mask: torch.Tensor, limit: int, prefix: int):
    """The rows' :class:`~ragen_lightning.models.packing.Packing` (prefixes shared up to ``limit``)
    when it runs at most :data:`PACK_SAVING` of the tokens the padded pass would (``prefix``: its
    own shared prefix, run once), else None: with rows of one length and one common prefix packing
    saves nothing and its per-row attention calls cost a little (measured: 0.92x on 32 equal-length
    distinct rows). Either pass is exact."""
    b = input_ids.shape[0]
    if b < 2 or causal_only(attention_mask) is not None:
        return None
    packing = pack_rows(input_ids, attention_mask, limit=limit, min_shared=MIN_SHARED)
    padded = prefix + b * (int(attention_mask.sum(-1).max()) - prefix)
    return packing if packing.input_ids.shape[1] <= PACK_SAVING * padded else None


def _packed_actor_outputs(
    actor: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    skip: int,
    packing,
    *,
    with_entropy: bool,
    temperature: float,
    chunk_size: int | None,
):
    """:func:`actor_outputs` on the rows packed as ``packing``: the LM head runs on the trained
    columns' positions only (from ``skip`` to each row's last-but-one token)."""
    use_packed_attention(actor)
    b, length = input_ids.shape
    lengths = attention_mask.sum(-1)
    owned = packing.owned
    rows, cols = packing.rows[owned], packing.cols[owned]
    keep = owned[(cols >= skip) & (cols <= lengths[rows] - 2)]
    logits = run_packed(actor, packing, logits_to_keep=keep).logits[0]
    if temperature != 1.0:
        logits = logits / temperature
    targets = input_ids[packing.rows[keep], packing.cols[keep] + 1]
    logprobs = unpack(
        logprobs_from_logits(logits, targets, chunk_size=chunk_size), packing, (b, length - 1), keep
    )
    entropy = (
        unpack(entropy_from_logits(logits, chunk_size=chunk_size), packing, (b, length - 1), keep)
        if with_entropy
        else None
    )
    return logprobs, entropy


def critic_values(
    critic: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    forward: ForwardSettings = ForwardSettings(),  # noqa: B008 (frozen)
    *,
    skip: int = 0,
) -> torch.Tensor:
    """``V`` after each prefix, on the target axis: ``[b, t - 1]`` (``forward``'s temperature and
    logits chunks do not apply). With ``forward.share_prefix`` the rows' common leading tokens (up
    to ``skip``, the first column a value is read from) run once and their columns read 0. With
    ``forward.pack`` the rows run packed without padding; columns past a row's end read 0."""
    share_prefix, pack = forward.share_prefix, forward.pack
    prefix = shared_prefix(input_ids, attention_mask, skip, critic) if share_prefix else 0
    packing = (
        cheaper_packing(input_ids, attention_mask, skip if share_prefix else 0, prefix)
        if pack
        else None
    )
    if packing is not None:
        use_packed_attention(critic)
        owned = packing.owned
        values = run_packed(critic, packing)[0, owned].float()
        return unpack(values, packing, tuple(input_ids.shape), owned)[:, :-1]
    if prefix:
        values = run_on_shared_prefix(critic, input_ids, prefix, attention_mask=None)
        return torch.nn.functional.pad(values, (prefix, 0))[:, :-1].float()
    return critic(input_ids=input_ids, attention_mask=causal_only(attention_mask))[:, :-1].float()


@torch.no_grad()
def score_batch(
    model: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    micro_batch_size: int,
    *,
    kind: str,
    forward: ForwardSettings = ForwardSettings(),  # noqa: B008 (frozen)
    with_entropy: bool = False,
    loss_mask: torch.Tensor | None = None,
    threads: int = 1,
    micro_batch_tokens: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Run ``actor`` (``kind="actor"``: log-probs [+ entropy]) or ``critic`` (``kind="critic"``:
    values) over a whole batch in micro-batches, returning ``[B, T - 1]`` tensors padded with zeros.
    With ``loss_mask`` [B, T - 1] outputs are computed on trained columns onward only
    (:func:`actor_outputs` ``skip``) and read 0 before. No backward runs here, so the rows' common
    prefix always runs once (``forward.share_prefix`` is ignored). ``threads`` > 1 scores that many
    micro-batches at a time on CPU threads (:func:`~ragen_lightning.parallel.threads.map_threads`).
    ``micro_batch_tokens`` forms the micro-batches by a token budget instead
    (:func:`plan_micro_batches`)."""
    B, T = input_ids.shape
    forward, pack = dataclasses.replace(forward, share_prefix=True), forward.pack
    first = torch.zeros((B, T - 1), device=input_ids.device)
    second = torch.zeros((B, T - 1), device=input_ids.device) if with_entropy else None

    def score(rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        L = trimmed(attention_mask, rows)
        ids, att = input_ids[rows, :L], attention_mask[rows, :L]
        skip = first_target(loss_mask[rows, : L - 1] if loss_mask is not None else None)
        if kind == "actor":
            return actor_outputs(model, ids, att, forward, with_entropy=with_entropy, skip=skip)
        return critic_values(model, ids, att, forward, skip=skip), None

    lengths = attention_mask.sum(-1)
    micros = plan_micro_batches(
        update_order(torch.arange(B, device=input_ids.device), input_ids, lengths, pack),
        lengths,
        micro_batch_size,
        micro_batch_tokens,
        packed=pack,
    )
    for rows, (a, b) in zip(micros, map_threads(score, micros, threads)):
        first[rows, : a.shape[1]] = a.float()
        if second is not None and b is not None:
            second[rows, : b.shape[1]] = b.float()
    return first, second


def score_sharded(
    model: nn.Module,
    ids: torch.Tensor,
    att: torch.Tensor,
    micro: int,
    loss_mask: torch.Tensor | None = None,
    **kwargs,
):
    """:func:`score_batch` over the whole batch; with several ranks each scores its share and the
    zero-filled full tensors are summed across ranks."""
    rank, size = world()
    if size == 1:
        return score_batch(model, ids, att, micro, loss_mask=loss_mask, **kwargs)
    kwargs["threads"] = 1  # a sharded forward is collective: concurrent forwards would mix gathers
    B = ids.shape[0]
    rows = rank_rows(torch.arange(B, device=ids.device), size, rank, pad_index=0)
    real = torch.tensor_split(torch.arange(B, device=ids.device), size)[rank].numel()
    outs = score_batch(
        model,
        ids[rows],
        att[rows],
        micro,
        **kwargs,
        loss_mask=loss_mask[rows] if loss_mask is not None else None,
    )
    full = []
    for out in outs:
        if out is None:
            full.append(None)
            continue
        whole = torch.zeros((B, out.shape[1]), dtype=out.dtype, device=out.device)
        whole[rows[:real]] = out[:real]
        full.append(all_reduce_(whole))
    return tuple(full)


def scoring_passes(
    batch: RolloutBatch,
    settings: ModuleSettings,
    *,
    actor: nn.Module | None,
    reference: nn.Module | None,
    critic: nn.Module | None,
) -> tuple[UpdateBatch, torch.Tensor | None]:
    """Step 2 of a StarPO iteration: ``batch`` as the update reads it, with the outputs of the
    no-grad passes (:func:`score_sharded`, in the scoring micro-batches of ``settings.update``) of
    ``actor`` (old log-probs, and the entropy returned beside), ``reference`` (its log-probs) and
    ``critic`` (values), in that order. A network given as None does not run and its outputs are
    None; the advantages and returns (step 3) are None too."""
    # mask: target axis
    ids, att, mask = batch.input_ids, batch.attention_mask, batch.loss_mask[:, 1:].bool()
    u = settings.update  # (a critic pass ignores temperature, chunking and the mask)

    def score(net: nn.Module | None, kind: str = "actor", with_entropy: bool = False):
        if net is None:
            return None, None
        return score_sharded(
            net,
            ids,
            att,
            u.scoring_micro_batch_size,
            kind=kind,
            with_entropy=with_entropy,
            forward=settings.forward,
            loss_mask=mask,
            threads=u.micro_batch_threads,
            micro_batch_tokens=u.micro_batch_tokens,
        )

    old_logprobs, entropy = score(actor, with_entropy=True)
    ref_logprobs, _ = score(reference)
    values, _ = score(critic, kind="critic")
    data = UpdateBatch(
        ids,
        att,
        mask,
        None,
        batch.engine_logprobs[:, 1:],
        old_logprobs=old_logprobs,
        ref_logprobs=ref_logprobs,
        values=values,
    )
    return data, entropy
