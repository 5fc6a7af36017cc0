"""Step 4 of a StarPO iteration: the (data-parallel) mini-batch update, network-agnostic.

:class:`~ragen_lightning.starpo.module.StarPOModule` builds the actor and critic losses; this module owns what is the same
for both and what data parallelism changes:

* :func:`mini_batches`: each mini-batch's global rows (shuffled per iteration and epoch when asked) and this rank's
  share of them; short shares are padded with the inert row (:func:`with_inert_row`) so every rank runs the same
  micro-batches;
* :func:`score_sharded`: a no-grad scoring pass where each rank scores its share and the shares are summed;
* :func:`accumulate`: ``zero_grad`` -> backward over micro-batches -> clip -> step, skipped (and counted) when a
  loss or the gradient norm is non-finite;
* :func:`clip_grad_norm`: by the global norm of the optimizer's own parameters, or FSDP1's own clip.

In one process these reduce to the plain loops (``world() == (0, 1)``).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import lightning as L
import torch

from ragen_lightning.parallel import (
    all_reduce_,
    full_tensor,
    gather_objects,
    rank_rows,
    world,
)
from ragen_lightning.starpo.scoring import micro_slices, score_batch

LossFn = Callable[[torch.Tensor], tuple[torch.Tensor, dict[str, torch.Tensor]]]


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


def score_sharded(model: torch.nn.Module, ids: torch.Tensor, att: torch.Tensor, micro: int, **kwargs):
    """:func:`~ragen_lightning.starpo.scoring.score_batch` over the whole batch; with several ranks each scores its share
    and the zero-filled full tensors are summed across ranks."""
    rank, size = world()
    if size == 1:
        return score_batch(model, ids, att, micro, **kwargs)
    B = ids.shape[0]
    rows = rank_rows(torch.arange(B, device=ids.device), size, rank, pad_index=0)
    real = torch.tensor_split(torch.arange(B, device=ids.device), size)[rank].numel()
    outs = score_batch(model, ids[rows], att[rows], micro, **kwargs)
    full = []
    for out in outs:
        if out is None:
            full.append(None)
            continue
        whole = torch.zeros((B, out.shape[1]), dtype=out.dtype, device=out.device)
        whole[rows[:real]] = out[:real]
        full.append(all_reduce_(whole))
    return tuple(full)


def with_inert_row(data: dict[str, torch.Tensor | None]) -> dict[str, torch.Tensor | None]:
    """``data`` plus one row that trains nothing: a copy of row 0's tokens with an all-zero loss mask and zero
    advantages/returns (it pads a rank's share of a mini-batch so every rank runs the same micro-batches)."""
    out = {}
    for k, v in data.items():
        if v is None:
            out[k] = None
            continue
        row = v[:1].clone() if k in ("ids", "att") else torch.zeros_like(v[:1])
        out[k] = torch.cat([v, row])
    return out


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
               pad_row: int = -1, on_step: Callable[[object], None] | None = None) -> tuple[dict[str, float], bool]:
    """zero_grad -> backward over micro-batches of ``rows`` -> clip -> step; returns ``(metrics, stepped)``.

    The step is skipped when a loss or the gradient norm is non-finite. With several ranks every rank runs all its
    micro-batches whatever their losses (a rank leaving the loop early would hang the gradient collectives), the
    loss is scaled by the world size (DDP/FSDP average gradients, the normaliser is already global), the finite flag
    is agreed by all ranks and loss metrics are summed across them (micro-batches of ``pad_row`` only log nothing).
    ``on_step(opt)`` runs after a successful step (the learning-rate schedule).
    """
    size = world()[1]
    opt.zero_grad()
    logs: dict[str, list[float]] = {}
    finite = True
    for micro in micro_slices(rows, micro_batch_size):
        loss, metrics = loss_fn(micro)
        if not torch.isfinite(loss):
            finite = False
            if size == 1:
                break
        module.manual_backward(loss * size if size > 1 else loss)
        if size > 1 and bool((micro == pad_row).all()):
            continue  # a micro-batch of padding only: no metrics
        for k, v in metrics.items():
            logs.setdefault(k, []).append(float(v))
    params = [p for g in opt.param_groups for p in g["params"]]  # a shared LoRA base holds both adapters
    if size > 1:
        finite = bool(all_reduce_(torch.tensor(float(finite), device=module.device), "min"))
        norm = clip_grad_norm(module, params, max_norm, every_param=True)  # collective: every rank, finite or not
    else:
        norm = clip_grad_norm(module, params, max_norm) if finite else float("nan")
    stepped = finite and math.isfinite(norm)
    if stepped:
        opt.step()
        if on_step is not None:
            on_step(opt)
    opt.zero_grad()  # FSDP1 clips every gradient of the wrapped root: leave none behind for the other network
    parts = gather_objects({k: (sum(v), len(v)) for k, v in logs.items()})
    totals: dict[str, list[float]] = {}
    for part in parts:
        for k, (total, count) in part.items():
            acc = totals.setdefault(k, [0.0, 0])
            acc[0], acc[1] = acc[0] + total, acc[1] + count
    out = {k: (t if k.endswith("_loss") else t / c) for k, (t, c) in totals.items()}
    out["grad_norm"] = norm
    return out, stepped
