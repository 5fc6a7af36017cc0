"""Step 4 of a StarPO iteration: the (data-parallel) mini-batch update, network-agnostic.

:class:`~ragen_lightning.starpo.module.StarPOModule` builds the actor and critic losses; this module owns what is the same
for both and what data parallelism changes:

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
from collections.abc import Callable
from dataclasses import dataclass, field

import lightning as L
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
from ragen_lightning.starpo.optim import guarded_step, step_warmup
from ragen_lightning.starpo.scoring import plan_micro_batches, score_batch


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


def fsdp1_root(module: L.LightningModule):
    """The FSDP1-wrapped root module when the trainer runs ``FSDPStrategy``, else None."""
    trainer = module._trainer
    if trainer is None:
        return None
    from lightning.pytorch.strategies import FSDPStrategy

    return trainer.strategy.model if isinstance(trainer.strategy, FSDPStrategy) else None


def clip_grad_norm(module: L.LightningModule, params, max_norm: float, every_param: bool = False) -> float:
    """Clip ``params`` by their global norm (``max_norm <= 0``: measure only); under FSDP1 the root module's own
    clip, which is exact (Lightning refuses clip-by-norm there). ``every_param`` includes parameters without a
    gradient (a collective under FSDP2 must run on every rank)."""
    max_norm = max_norm if max_norm > 0 else float("inf")
    root = fsdp1_root(module)
    if root is not None:
        return float(root.clip_grad_norm_(max_norm))
    params = [p for p in params if p.requires_grad and (every_param or p.grad is not None)]
    if not params:
        return 0.0
    return float(full_tensor(torch.nn.utils.clip_grad_norm_(params, max_norm)))


def accumulate(module, opt, rows: torch.Tensor, loss_fn: LossFn, *, micro_batch_size: int, max_norm: float,
               pad_row: int = -1, on_step: Callable[[object], None] | None = None, threads: int = 1,
               check: StepCheck | None = None, lengths: torch.Tensor | None = None,
               micro_batch_tokens: int | None = None, packed: bool = False) -> StepResult:
    """zero_grad -> backward over micro-batches of ``rows`` -> clip -> step.

    The step is skipped when a loss, the gradient norm, the learning rate or the updated weights are non-finite
    (:func:`~ragen_lightning.starpo.optim.guarded_step`: the weights and optimizer state stay as they were). With
    several ranks every rank runs all its
    micro-batches whatever their losses (a rank leaving the loop early would hang the gradient collectives), the
    loss is scaled by the world size (DDP/FSDP average gradients, the normaliser is already global), the finite flag
    is agreed by all ranks and metrics are combined across them (micro-batches of ``pad_row`` only log nothing).
    ``on_step(opt)`` runs after a successful step (the learning-rate schedule). ``check(probes)`` runs after the
    step with every micro-batch's ``(rows, probe)``; it returns ``(value, reason)`` and a reason undoes the step
    (:func:`~ragen_lightning.starpo.optim.guarded_step`'s ``after``); the value is logged as ``step_kl``.

    ``threads > 1`` (one process only; ignored with several ranks) runs the micro-batches' forward and backward
    on that many CPU threads, their gradients added in the micro-batches' order
    (:func:`~ragen_lightning.parallel.threads.backward_in_order`: bit-for-bit the one-thread step). Their backward
    calls autograd directly: Lightning's ``manual_backward`` keeps per-module hook state that concurrent calls would
    corrupt, and its precision plugin is plain under the ``*-true`` precisions this needs (checked with the settings).

    ``micro_batch_tokens`` (with every row's token count ``lengths``) forms the micro-batches by a token budget
    instead of ``micro_batch_size`` rows, ``packed`` counting the rows' lengths rather than their padded size
    (:func:`~ragen_lightning.starpo.scoring.plan_micro_batches`).
    """
    size = world()[1]
    opt.zero_grad()
    params = [p for g in opt.param_groups for p in g["params"]]  # a shared LoRA base holds both adapters
    if micro_batch_tokens is not None and lengths is None:
        raise ValueError("a token budget for the micro-batches needs the rows' lengths")
    micros = plan_micro_batches(rows, lengths, micro_batch_size, micro_batch_tokens, packed=packed, pad_row=pad_row)
    seen = _backward_micro_batches(module, micros, loss_fn, pad_row, threads, params)
    finite = seen.finite
    if size > 1:
        finite = bool(all_reduce_(torch.tensor(float(finite), device=module.device), "min"))
        norm = clip_grad_norm(module, params, max_norm, every_param=True)  # collective: every rank, finite or not
    else:
        norm = clip_grad_norm(module, params, max_norm) if finite else float("nan")
    reason = "non-finite loss" if not finite else "" if math.isfinite(norm) else "non-finite gradient norm"
    measured: dict[str, float] = {}

    def after() -> str | None:
        measured["step_kl"], why = check(seen.probes)
        return why

    # collectives inside: the ranks agree on the flags above
    reason = reason or guarded_step(opt, params, after=after if check is not None else None) or ""
    stepped = not reason
    if stepped and on_step is not None:
        on_step(opt)
    opt.zero_grad()  # FSDP1 clips every gradient of the wrapped root: leave none behind for the other network
    metrics = {k: total for k, (total, _) in _across_ranks(seen.terms).items()}
    metrics.update({k: total / count for k, (total, count) in _across_ranks(seen.stats).items()})
    metrics["grad_norm"] = norm
    metrics.update(measured)
    return StepResult(metrics, stepped, seen.outputs, reason)


@dataclass
class _Backward:
    """What the backward passes of one step's micro-batches left: their loss terms and statistics (lists per name,
    combined across ranks later), outputs and probes by rows, and whether every loss was finite."""

    terms: dict[str, list[float]] = field(default_factory=dict)
    stats: dict[str, list[float]] = field(default_factory=dict)
    outputs: list = field(default_factory=list)
    probes: list[tuple[torch.Tensor, torch.Tensor]] = field(default_factory=list)
    finite: bool = True


def _backward_micro_batches(module, micros: list[torch.Tensor], loss_fn: LossFn, pad_row: int, threads: int,
                            params: list[torch.Tensor]) -> _Backward:
    """Forward and backward every micro-batch (its rows) of ``micros`` (on ``threads`` CPU threads in one
    process, the gradients of ``params`` added in order), in order."""
    size = world()[1]
    seen = _Backward()
    done = None
    if size == 1 and threads > 1 and len(micros) > 1:
        check_threads_precision(threads, module._trainer.precision if module._trainer is not None else None)

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
            module.manual_backward(out.loss * size if size > 1 else out.loss)
        if size > 1 and bool((micro == pad_row).all()):
            continue  # a micro-batch of padding only: no metrics
        for acc, values in ((seen.terms, out.terms), (seen.stats, out.stats)):
            for k, v in values.items():
                acc.setdefault(k, []).append(float(v))
    return seen


def network_step(module, network: str, rows: torch.Tensor, loss_fn: LossFn, *, background=None,
                 check: StepCheck | None = None, lengths: torch.Tensor | None = None) -> StepResult:
    """One optimizer step of the StarPO ``module``'s ``network`` (``"actor"`` | ``"critic"``) over ``rows``:
    :func:`accumulate` with the module's micro-batch size, threads, gradient clip and warm-up schedule; the step is
    recorded with ``module.skips`` (which raises after too many skips in a row). With ``background`` (a
    :class:`~ragen_lightning.starpo.background.BackgroundSteps`, called on its worker thread) the step backpropagates
    directly and steps the raw optimizer, on one thread (the other core runs the rollout). ``lengths`` (every row's
    token count) sizes the micro-batches under ``--model.update.micro_batch_tokens``."""
    update, optim = module.settings.update, module.settings.optim
    opt = module.network_optimizer(network)
    scheduled = optim.warmup_steps or optim.decay_iterations
    warmup = (lambda o: step_warmup(module.lr_schedulers(), o)) if scheduled else None
    target, opt = (module, opt) if background is None else background.worker_view(module, opt)
    result = accumulate(target, opt, rows, loss_fn, micro_batch_size=update.micro_batch_size,
                        max_norm=optim.grad_clip, pad_row=module.pad_row, on_step=warmup,
                        threads=update.micro_batch_threads if background is None else 1, check=check,
                        lengths=lengths, micro_batch_tokens=update.micro_batch_tokens, packed=update.pack)
    module.skips.record(network, result.stepped, result.skip_reason)  # raises after too many in a row
    return result


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
