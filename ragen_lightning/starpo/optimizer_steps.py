"""Step 4 of a StarPO iteration: one optimizer step of a network, network-agnostic, data parallel.

:mod:`.ppo` builds the actor and critic losses; this module owns what is the same for both and what
data parallelism changes. A :class:`StepContext` carries what a step needs (the network, its
optimizer and scheduler, the skip guard, gradient clip and micro-batching), so nothing here sees the
LightningModule:

* :func:`mini_batches`: each mini-batch's global rows (shuffled per iteration and epoch when asked) and this rank's
  share of them; short shares are padded with the inert row (:meth:`~ragen_lightning.types.UpdateBatch.with_inert_row`)
  so every rank runs the same micro-batches;
* :func:`score_sharded`: a no-grad scoring pass where each rank scores its share and the shares are summed;
* :func:`accumulate`: ``zero_grad`` -> backward over micro-batches -> clip -> step, skipped (and counted) when a
  loss, the gradient norm, the learning rate or the updated weights are non-finite (the last restored:
  :func:`~ragen_lightning.starpo.optim.guarded_step`). A loss function returns a :class:`MicroOutput`: its loss terms add up
  over micro-batches (each is already divided by the mini-batch's normaliser), its statistics are averaged, and
  the log-probs/entropy of its forward pass come back to the caller in the :class:`StepResult`;
* :func:`clip_grad_norm`: by the global norm of the optimizer's own parameters, or FSDP1's own clip.

In one process these reduce to the plain loops (``world() == (0, 1)``).
"""

from __future__ import annotations

import math
import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from ragen_lightning.parallel import (
    all_reduce_,
    full_tensor,
    gather_objects,
    rank_rows,
    world,
)
from ragen_lightning.parallel.threads import backward_in_order
from ragen_lightning.starpo.checks import check_threads_precision
from ragen_lightning.starpo.optim import SkipGuard, guarded_step
from ragen_lightning.starpo.scoring import MicroBatching, plan_micro_batches, score_batch


@dataclass
class MicroOutput:
    """What a loss function returns for one micro-batch.

    Attributes:
        loss: the micro-batch's share of the mini-batch loss (scalar, with grad).
        terms: shares of the mini-batch's loss terms (``pg_loss``, ``vf_loss``, ...): summed over micro-batches.
        stats: statistics of this micro-batch (clip fractions, ratios, ...): averaged over micro-batches.
        outputs: per-token outputs of this forward the caller needs back (the actor's first-pass log-probs and
            entropy, the on-policy critic's values), each of the micro-batch's rows.  # [b, L - 1] each
    """

    loss: torch.Tensor
    terms: dict[str, torch.Tensor] = field(default_factory=dict)
    stats: dict[str, torch.Tensor] = field(default_factory=dict)
    outputs: tuple[torch.Tensor, ...] = ()
    probe: torch.Tensor | None = None  # per-token values a post-step check compares (the actor's log-probs)


@dataclass
class StepResult:
    """One optimizer step's outcome.

    Attributes:
        metrics: loss terms (summed over micro-batches and ranks), statistics (averaged) and ``grad_norm``.
        stepped: False when the step was skipped (nothing changed: weights and optimizer state as before).
        outputs: ``(rows, MicroOutput.outputs)`` of every micro-batch whose loss function returned outputs.
        skip_reason: why the step was skipped (``non-finite loss``, ``non-finite gradient norm``, ...), else ''.
    """

    metrics: dict[str, float]
    stepped: bool
    outputs: list[tuple[torch.Tensor, tuple[torch.Tensor, ...]]] = field(default_factory=list)
    skip_reason: str = ""


LossFn = Callable[[torch.Tensor], MicroOutput]
# [(micro-batch rows, probe)] after the step -> (measured value, reason to undo the step or None)
StepCheck = Callable[[list[tuple[torch.Tensor, torch.Tensor]]], tuple[float, str | None]]


def mini_batches(n: int, size: int, *, shuffle: bool, epoch: int, iteration: int,
                 device: torch.device | str = "cpu") -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``(global rows, this rank's rows)`` of each mini-batch of ``size`` over ``n`` rows; the pad row ``n`` fills
    short per-rank shares. The shuffle depends only on ``(iteration, epoch)``, so every rank draws the same order."""
    rows = torch.arange(n, device=device)
    if shuffle:
        g = torch.Generator().manual_seed(int(iteration) * 1_000_003 + epoch)
        rows = rows[torch.randperm(n, generator=g).to(device)]
    rank, ranks = world()
    return [(mb, rank_rows(mb, ranks, rank, pad_index=n) if ranks > 1 else mb) for mb in rows.split(size)]


def score_sharded(model: torch.nn.Module, ids: torch.Tensor, att: torch.Tensor, micro: int,
                  loss_mask: torch.Tensor | None = None, **kwargs):
    """:func:`~ragen_lightning.starpo.scoring.score_batch` over the whole batch; with several ranks each scores its share
    and the zero-filled full tensors are summed across ranks."""
    rank, size = world()
    if size == 1:
        return score_batch(model, ids, att, micro, loss_mask=loss_mask, **kwargs)
    kwargs["threads"] = 1  # a sharded forward is collective: forwards on concurrent threads would mix its gathers
    B = ids.shape[0]
    rows = rank_rows(torch.arange(B, device=ids.device), size, rank, pad_index=0)
    real = torch.tensor_split(torch.arange(B, device=ids.device), size)[rank].numel()
    outs = score_batch(model, ids[rows], att[rows], micro, **kwargs,
                       loss_mask=loss_mask[rows] if loss_mask is not None else None)
    full = []
    for out in outs:
        if out is None:
            full.append(None)
            continue
        whole = torch.zeros((B, out.shape[1]), dtype=out.dtype, device=out.device)
        whole[rows[:real]] = out[:real]
        full.append(all_reduce_(whole))
    return tuple(full)


def autograd_backward(loss: torch.Tensor) -> None:
    """``loss.backward()``: the backward of a step outside Lightning (a worker thread, a test)."""
    loss.backward()


@dataclass(frozen=True)
class StepContext:
    """What one network's optimizer steps need, built by the module from its trainer per iteration.

    Attributes:
        network: ``"actor"`` | ``"critic"``: names the step in the skip guard.
        model: the network the losses run.
        optimizer: its optimizer (Lightning's wrapper: each ``step`` counts in ``global_step``).
        micro: how a step's rows split into micro-batches.
        grad_clip: max global gradient norm (<= 0: measure only).
        skips: counts skipped steps and stops the run after too many in a row (None: not counted).
        scheduler: the learning-rate scheduler stepped after each applied step (None: no schedule).
        backward: ``loss -> None``: Lightning's ``manual_backward`` or autograd's.
        pad_row: data parallel: the inert row that pads short per-rank shares of a mini-batch.
        fsdp_root: the FSDP1-wrapped root module, whose own clip is exact (None: other strategies).
        precision: the trainer's precision (threads need a ``*-true`` one).
        device: where the ranks' flags are reduced.
    """

    network: str
    model: torch.nn.Module | None
    optimizer: Any
    micro: MicroBatching = MicroBatching()
    grad_clip: float = 0.0
    skips: SkipGuard | None = None
    scheduler: Any = None
    backward: Callable[[torch.Tensor], None] = autograd_backward
    pad_row: int = -1
    fsdp_root: torch.nn.Module | None = None
    precision: Any = None
    device: torch.device | str = "cpu"

    def outside_lightning(self) -> StepContext:
        """This context for a step on a worker thread: autograd's backward, the raw torch
        optimizer (Lightning's wrapper and hooks keep state that concurrent calls would corrupt),
        one thread."""
        raw = getattr(self.optimizer, "optimizer", self.optimizer)  # LightningOptimizer's torch one
        return dataclasses.replace(self, optimizer=raw, backward=autograd_backward,
                                   micro=dataclasses.replace(self.micro, threads=1))


def fsdp1_root(strategy: Any) -> torch.nn.Module | None:
    """The FSDP1-wrapped root module when the trainer's ``strategy`` is FSDP1's, else None."""
    from lightning.pytorch.strategies import FSDPStrategy

    return strategy.model if isinstance(strategy, FSDPStrategy) else None


def clip_grad_norm(params, max_norm: float, every_param: bool = False,
                   fsdp_root: torch.nn.Module | None = None) -> float:
    """Clip ``params`` by their global norm (``max_norm <= 0``: measure only); under FSDP1 the root module's own
    clip, which is exact (Lightning refuses clip-by-norm there). ``every_param`` includes parameters without a
    gradient (a collective under FSDP2 must run on every rank)."""
    max_norm = max_norm if max_norm > 0 else float("inf")
    if fsdp_root is not None:
        return float(fsdp_root.clip_grad_norm_(max_norm))
    params = [p for p in params if p.requires_grad and (every_param or p.grad is not None)]
    if not params:
        return 0.0
    return float(full_tensor(torch.nn.utils.clip_grad_norm_(params, max_norm)))


def accumulate(ctx: StepContext, rows: torch.Tensor, loss_fn: LossFn, *,
               lengths: torch.Tensor | None = None, check: StepCheck | None = None) -> StepResult:
    """zero_grad -> backward over micro-batches of ``rows`` -> clip -> step, of ``ctx``'s network.

    The step is skipped when a loss, the gradient norm, the learning rate or the updated weights are
    non-finite (:func:`~ragen_lightning.starpo.optim.guarded_step`: weights and optimizer state stay
    as they were) and recorded with ``ctx.skips`` (which raises after too many skips in a row). With
    several ranks every rank runs all its micro-batches whatever their losses (a rank leaving the
    loop early would hang the gradient collectives), the loss is scaled by the world size (DDP/FSDP
    average gradients, the normaliser is already global), the finite flag is agreed by all ranks and
    metrics are combined across them (micro-batches of the pad row only log nothing).
    ``ctx.scheduler`` steps after a successful step. ``check(probes)`` runs after the step with
    every micro-batch's ``(rows, probe)``; it returns ``(value, reason)`` and a reason undoes the
    step (``guarded_step``'s ``after``); the value is logged as ``step_kl``.

    ``ctx.micro.threads > 1`` (one process only) runs the micro-batches on that many CPU threads,
    their gradients added in order (:func:`~ragen_lightning.parallel.threads.backward_in_order`:
    bit-for-bit the one-thread step; autograd's backward, under a ``*-true`` precision).

    ``ctx.micro.tokens`` (with every row's token count ``lengths``) forms the micro-batches by a
    token budget instead of rows (:func:`~ragen_lightning.starpo.scoring.plan_micro_batches`).
    """
    size, opt, micro = world()[1], ctx.optimizer, ctx.micro
    opt.zero_grad()
    params = [p for g in opt.param_groups for p in g["params"]]  # a shared LoRA base holds both adapters
    if micro.tokens is not None and lengths is None:
        raise ValueError("a token budget for the micro-batches needs the rows' lengths")
    micros = plan_micro_batches(rows, lengths, micro.size, micro.tokens, packed=micro.packed,
                                pad_row=ctx.pad_row)
    seen = _backward_micro_batches(ctx, micros, loss_fn, params)
    finite = seen.finite
    if size > 1:
        finite = bool(all_reduce_(torch.tensor(float(finite), device=ctx.device), "min"))
        # collective: every rank, finite or not
        norm = clip_grad_norm(params, ctx.grad_clip, every_param=True, fsdp_root=ctx.fsdp_root)
    else:
        norm = float("nan")
        if finite:
            norm = clip_grad_norm(params, ctx.grad_clip, fsdp_root=ctx.fsdp_root)
    reason = "non-finite loss" if not finite else "" if math.isfinite(norm) else "non-finite gradient norm"
    measured: dict[str, float] = {}

    def after() -> str | None:
        measured["step_kl"], why = check(seen.probes)
        return why

    # collectives inside: the ranks agree on the flags above
    reason = reason or guarded_step(opt, params, after=after if check is not None else None) or ""
    if not reason and ctx.scheduler is not None:
        ctx.scheduler.step()
    opt.zero_grad()  # FSDP1 clips every gradient of the wrapped root: leave none behind for the other network
    metrics = {k: total for k, (total, _) in _across_ranks(seen.terms).items()}
    metrics.update({k: total / count for k, (total, count) in _across_ranks(seen.stats).items()})
    metrics["grad_norm"] = norm
    metrics.update(measured)
    if ctx.skips is not None:
        ctx.skips.record(ctx.network, not reason, reason)  # raises after too many in a row
    return StepResult(metrics, not reason, seen.outputs, reason)


@dataclass
class _Backward:
    """What the backward passes of one step's micro-batches left: their loss terms and statistics (lists per name,
    combined across ranks later), outputs and probes by rows, and whether every loss was finite."""

    terms: dict[str, list[float]] = field(default_factory=dict)
    stats: dict[str, list[float]] = field(default_factory=dict)
    outputs: list = field(default_factory=list)
    probes: list[tuple[torch.Tensor, torch.Tensor]] = field(default_factory=list)
    finite: bool = True


def _backward_micro_batches(ctx: StepContext, micros: list[torch.Tensor], loss_fn: LossFn,
                            params: list[torch.Tensor]) -> _Backward:
    """Forward and backward every micro-batch (its rows) of ``micros``, in order (on
    ``ctx.micro.threads`` CPU threads in one process, the gradients of ``params`` added in
    order)."""
    size, threads, pad_row = world()[1], ctx.micro.threads, ctx.pad_row
    seen = _Backward()
    done = None
    if size == 1 and threads > 1 and len(micros) > 1:
        check_threads_precision(threads, ctx.precision)

        def forward(micro: torch.Tensor) -> tuple[torch.Tensor | None, MicroOutput]:
            out = loss_fn(micro)  # a non-finite loss skips the step: its gradient would only be discarded
            return (out.loss if torch.isfinite(out.loss) else None), out

        done = backward_in_order(forward, micros, threads, params)
    for i, micro in enumerate(micros):
        out = loss_fn(micro) if done is None else done[i]
        if out.outputs:
            seen.outputs.append((micro, out.outputs))
        if out.probe is not None:
            seen.probes.append((micro, out.probe))
        if not torch.isfinite(out.loss):
            seen.finite = False
            if size == 1:
                break
        if done is None:
            ctx.backward(out.loss * size if size > 1 else out.loss)
        if size > 1 and bool((micro == pad_row).all()):
            continue  # a micro-batch of padding only: no metrics
        for acc, values in ((seen.terms, out.terms), (seen.stats, out.stats)):
            for k, v in values.items():
                acc.setdefault(k, []).append(float(v))
    return seen


def _across_ranks(values: dict[str, list[float]]) -> dict[str, tuple[float, int]]:
    """``{name: (sum, count)}`` over every rank's micro-batch values."""
    totals: dict[str, tuple[float, int]] = {}
    for part in gather_objects({k: (sum(v), len(v)) for k, v in values.items()}):
        for k, (total, count) in part.items():
            t, c = totals.get(k, (0.0, 0))
            totals[k] = (t + total, c + count)
    return totals


def scatter_outputs(outputs: list[tuple[torch.Tensor, tuple[torch.Tensor, ...]]], count: int, like: torch.Tensor,
                    rows: int) -> tuple[torch.Tensor, ...]:
    """The ``count`` per-token outputs of a step's micro-batches as full ``[rows, T - 1]`` tensors (zeros where no
    micro-batch wrote; ``like`` gives the shape ``[B(+1), T - 1]``), summed across ranks: each rank fills its rows
    (a collective: every rank calls it)."""
    full = [torch.zeros_like(like, dtype=torch.float32) for _ in range(count)]
    for micro, tensors in outputs:
        for dest, t in zip(full, tensors):
            dest[micro, : t.shape[1]] = t
    return tuple(all_reduce_(t[:rows].contiguous()) for t in full)
