"""The two optimizers of a StarPO run (actor, critic) and one optimizer step of a network.

Optimizers: AdamW unless a factory is given, and an optional learning-rate schedule (linear warm-up
per step, cosine decay per iteration: :class:`LRSchedule`). With manual optimisation Lightning does
not step schedulers: a network's step steps its scheduler (:func:`scheduler_of`),
:func:`start_iteration` moves the decay to the new iteration.

One step (:func:`accumulate`): ``zero_grad`` -> backward over micro-batches -> clip -> step, of the
network a :class:`StepContext` names (its optimizer and scheduler, skip guard, gradient clip and
micro-batching: built by the module from its trainer, so nothing here sees the LightningModule). A
loss function returns a :class:`MicroOutput`: its loss terms add up over micro-batches (each is
already divided by the mini-batch's normaliser), its statistics are averaged, and the per-token
outputs of its forward come back to the caller in the :class:`StepResult`. With several ranks every
rank runs the same micro-batches and the metrics are combined; in one process these reduce to the
plain loops (``world() == (0, 1)``).

Non-finite guard (:func:`guarded_step`): a step is not applied when its inputs are non-finite (loss,
gradient norm: checked by :func:`accumulate`; learning rate: checked before the step) or when the
weights it produces are (an absurd finite learning rate overflows): up to :data:`SNAPSHOT_LIMIT`
trainable elements per rank the trainable weights and the optimizer state are copied to host memory
before the step and put back when any weight comes out non-finite, so a skipped step leaves the
network and its optimizer exactly as they were (GPU memory, which the memory plan budgets, is
unchanged). Above the limit that copy would cost three times the shard per step, so only the checks
before the step protect the weights and a non-finite result stops the run. :class:`SkipGuard`
counts skipped steps and stops the run after ``max_consecutive`` skips of one network in a row.
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from ragen_lightning.errors import TrainingStopped
from ragen_lightning.parallel import all_reduce_, full_tensor, gather_objects, world
from ragen_lightning.parallel.threads import backward_in_order
from ragen_lightning.starpo.checks import check_threads_precision
from ragen_lightning.starpo.scoring import MicroBatching, plan_micro_batches

OptimizerFactory = Callable[..., torch.optim.Optimizer]


MIN_LR_RATIO = 0.1  # where the cosine decay ends (as the supervised warm start's cosine schedule)


@dataclass
class LRSchedule:
    """The learning-rate multiplier of a network at its optimizer step ``step``: a linear warm-up
    over its first ``warmup_steps`` steps (``(step + 1) / warmup_steps``), times a cosine decay over
    the run's first ``decay_iterations`` StarPO iterations from 1 to :data:`MIN_LR_RATIO`, held
    there after (0: no decay).

    The decay follows iterations, not steps: with rejection sampling or a filter the number of
    optimizer steps per iteration varies, while the iteration count is the run's length
    (``--data.training.num_iterations``). ``iteration`` (0-based) is set by :func:`start_iteration`
    before each iteration's first step."""

    warmup_steps: int = 0
    decay_iterations: int = 0
    iteration: int = 0

    @property
    def active(self) -> bool:
        return self.warmup_steps > 0 or self.decay_iterations > 0

    def __call__(self, step: int) -> float:
        warm = min(1.0, (step + 1) / self.warmup_steps) if self.warmup_steps > 0 else 1.0
        if self.decay_iterations <= 0:
            return warm
        progress = min(1.0, self.iteration / self.decay_iterations)
        return warm * (
            MIN_LR_RATIO + (1.0 - MIN_LR_RATIO) * 0.5 * (1.0 + math.cos(math.pi * progress))
        )


def build_optimizers(
    actor_params,
    critic_params,
    *,
    actor_factory: OptimizerFactory | None,
    critic_factory: OptimizerFactory | None,
    actor_lr: float,
    critic_lr: float,
    weight_decay: float,
    with_critic: bool,
    schedule: LRSchedule,
):
    """``[actor_opt, critic_opt?]`` (AdamW unless a factory is given), plus one ``LambdaLR`` each
    following ``schedule`` when it warms up or decays."""

    def build(factory, params, lr):
        return (
            factory(params)
            if factory is not None
            else torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)
        )

    opts = [build(actor_factory, actor_params, actor_lr)]
    if with_critic:
        opts.append(build(critic_factory, critic_params, critic_lr))
    if schedule.active:
        return opts, [torch.optim.lr_scheduler.LambdaLR(o, schedule) for o in opts]
    return opts


def _schedulers(schedulers) -> list:
    return (
        schedulers if isinstance(schedulers, list) else [] if schedulers is None else [schedulers]
    )


def scheduler_of(schedulers, opt):
    """The scheduler of ``opt`` (a ``LightningOptimizer`` or a plain one) among ``schedulers``, else
    None: stepped after each of the network's applied steps (Lightning's manual optimisation does
    not step it)."""
    inner = getattr(opt, "optimizer", opt)
    return next((sched for sched in _schedulers(schedulers) if sched.optimizer is inner), None)


def start_iteration(schedulers, iteration: int) -> None:
    """Set every :class:`LRSchedule` to the 0-based ``iteration`` and apply the rate it gives now,
    so the iteration's first step already runs at it (a scheduler recomputes the rate only when it
    steps)."""
    for sched in _schedulers(schedulers):
        for group, base, schedule in zip(
            sched.optimizer.param_groups, sched.base_lrs, sched.lr_lambdas, strict=True
        ):
            if isinstance(schedule, LRSchedule):
                schedule.iteration = int(iteration)
                group["lr"] = base * schedule(sched.last_epoch)
        sched._last_lr = [group["lr"] for group in sched.optimizer.param_groups]


def _inner(opt) -> torch.optim.Optimizer:
    return getattr(opt, "optimizer", opt)  # a LightningOptimizer wraps the torch optimizer


def _local(t: torch.Tensor) -> torch.Tensor:
    """This rank's shard of a DTensor (FSDP2), else the tensor itself."""
    return t.to_local() if hasattr(t, "to_local") else t


def learning_rate_problem(opt) -> str | None:
    """``"non-finite learning rate (inf)"`` when a parameter group's ``lr`` is not a finite number,
    else None."""
    for group in _inner(opt).param_groups:
        lr = float(group["lr"])
        if not math.isfinite(lr):
            return f"non-finite learning rate ({lr})"
    return None


class WeightSnapshot:
    """Host-memory copies of everything ``opt.step()`` may change: each parameter's data and its
    optimizer state (a parameter without state yet gets none back, so the optimizer initialises it
    again on its next step)."""

    def __init__(self, opt):
        self.opt = _inner(opt)
        self.params = [p for g in self.opt.param_groups for p in g["params"]]
        self.data = [_local(p.detach()).to("cpu", copy=True) for p in self.params]
        self.state = [
            None
            if p not in self.opt.state
            else {
                k: _local(v.detach()).to("cpu", copy=True) if torch.is_tensor(v) else v
                for k, v in self.opt.state[p].items()
            }
            for p in self.params
        ]

    @torch.no_grad()
    def restore(self) -> None:
        for p, data, state in zip(self.params, self.data, self.state, strict=True):
            _local(p.data).copy_(data)
            if state is None:
                self.opt.state.pop(p, None)
                continue
            current = self.opt.state[p]
            for k, v in state.items():
                if torch.is_tensor(v) and torch.is_tensor(current.get(k)):
                    _local(current[k]).copy_(v)
                else:
                    current[k] = v


def weights_finite(params) -> bool:
    """Every element of every parameter is finite, agreed by all ranks (shards differ under
    FSDP)."""
    local = [_local(p.detach()) for p in params]
    finite = all(bool(torch.isfinite(t).all()) for t in local)
    if world()[1] > 1:
        device = local[0].device if local else "cpu"
        finite = bool(all_reduce_(torch.tensor(float(finite), device=device), "min"))
    return finite


# trainable elements per rank up to which a step is undoable (~0.77 GiB of host copy)
SNAPSHOT_LIMIT = 64 * 2**20


def local_numel(opt) -> int:
    """Trainable elements of ``opt`` on this rank (its shards under FSDP2)."""
    return sum(_local(p.detach()).numel() for g in _inner(opt).param_groups for p in g["params"])


def guarded_step(
    opt, params, snapshot_limit: int = SNAPSHOT_LIMIT, after: Callable[[], str | None] | None = None
) -> str | None:
    """``opt.step()`` unless it would put a non-finite value into the weights: None when applied,
    else the reason (nothing changed). Every rank calls it (the finite check is a collective).

    Up to ``snapshot_limit`` trainable elements per rank (the tiny model, LoRA adapters, a sharded
    small model) the step is undoable: weights and optimizer state are copied to host memory first
    and put back when the step produced a non-finite weight. Above it (a full fine-tune of a large
    model, where that copy would cost three times the shard in host memory and time every step) only
    the finite checks before the step run (learning rate here, loss and gradient norm in
    :func:`accumulate`); a step that still produces a non-finite weight (a finite but absurd
    learning rate) stops the run before anything is saved.

    ``after()`` (the step-KL trust region, ``--model.optim.max_step_kl``) runs once the step
    produced finite weights; a reason it returns undoes the step like a non-finite weight. Above the
    snapshot limit the step cannot be undone: it is kept, with a warning."""
    if reason := learning_rate_problem(opt):
        return reason
    snapshot = WeightSnapshot(opt) if local_numel(opt) <= snapshot_limit else None
    try:
        opt.step()
    # torch refuses an lr * grad that overflows a float ("... without overflow")
    except RuntimeError as exc:
        if "overflow" not in str(exc):
            raise
        if snapshot is None:
            raise TrainingStopped(
                f"an optimizer step overflowed ({exc}); stopped before anything was saved. Lower "
                "the learning rate or --model.optim.grad_clip"
            ) from exc
        snapshot.restore()  # a multi-tensor step may have updated some parameters already
        return f"optimizer step overflowed ({exc})"
    if weights_finite(params):
        why = after() if after is not None else None
        if why is None:
            return None
        if snapshot is None:
            warnings.warn(
                f"{why}; the step is kept: {local_numel(opt):,} trainable elements are above the "
                f"snapshot limit ({snapshot_limit:,}) that makes a step undoable",
                stacklevel=2,
            )
            return None
        snapshot.restore()
        return f"{why} (restored)"
    if snapshot is None:
        raise TrainingStopped(
            "an optimizer step produced non-finite weights (the learning rate is finite but too "
            "large for these gradients); stopped before anything was saved. Lower the learning "
            "rate or --model.optim.grad_clip"
        )
    snapshot.restore()
    return "non-finite weights after the step (restored)"


@dataclass
class SkipGuard:
    """Counts skipped optimizer steps (``total``, logged as ``train/skipped_steps``) and each
    network's skips in a row; raises :class:`~ragen_lightning.errors.TrainingStopped` once one
    network's reach ``max_consecutive`` (0: never)."""

    max_consecutive: int = 5
    total: int = 0
    in_a_row: dict[str, int] = field(default_factory=dict)

    def state_dict(self) -> dict:
        return {"skipped_steps": self.total, "skips_in_a_row": dict(self.in_a_row)}

    def load_state_dict(self, state: dict) -> None:
        self.total = int(state.get("skipped_steps", 0))
        self.in_a_row = dict(state.get("skips_in_a_row", {}))

    def record(self, network: str, stepped: bool, reason: str = "") -> None:
        """Count one step of ``network``; raises when it has now skipped ``max_consecutive`` in a
        row."""
        if stepped:
            self.in_a_row[network] = 0
            return
        self.total += 1
        self.in_a_row[network] = self.in_a_row.get(network, 0) + 1
        if self.max_consecutive and self.in_a_row[network] >= self.max_consecutive:
            kept = (
                "every step was undone: a smaller --model.optim.actor_lr takes smaller steps, a larger "
                "--model.optim.max_step_kl allows larger ones"
                if "max_step_kl" in reason
                else "nothing non-finite reached the weights"
            )
            raise TrainingStopped(
                f"{self.in_a_row[network]} {network} optimizer steps in a row were skipped ({reason}); {kept}. Check "
                f"--model.optim.{network}_lr (or --model.optim.{network}_optimizer), --model.optim.grad_clip and --data.sampling.temperature; "
                "--model.optim.max_consecutive_skips sets this limit"
            )


@dataclass
class MicroOutput:
    """What a loss function returns for one micro-batch.

    Attributes:
        loss: the micro-batch's share of the mini-batch loss (scalar, with grad).
        terms: shares of the mini-batch's loss terms (``pg_loss``, ``vf_loss``, ...): summed over
            micro-batches.
        stats: statistics of this micro-batch (clip fractions, ratios, ...): averaged.
        outputs: per-token outputs of this forward the caller needs back (the actor's first-pass
            log-probs and entropy, the on-policy critic's values), each of the micro-batch's rows.
            # [b, L - 1] each
        probe: per-token values a post-step check compares (the actor's log-probs).
    """

    loss: torch.Tensor
    terms: dict[str, torch.Tensor] = field(default_factory=dict)
    stats: dict[str, torch.Tensor] = field(default_factory=dict)
    outputs: tuple[torch.Tensor, ...] = ()
    probe: torch.Tensor | None = None


@dataclass
class StepResult:
    """One optimizer step's outcome.

    Attributes:
        metrics: loss terms (summed over micro-batches and ranks), statistics (averaged) and
            ``grad_norm``.
        stepped: False when the step was skipped (nothing changed: weights, optimizer state).
        outputs: ``(rows, MicroOutput.outputs)`` of every micro-batch that returned outputs.
        skip_reason: why the step was skipped (``non-finite loss``, ...), else ''.
    """

    metrics: dict[str, float]
    stepped: bool
    outputs: list[tuple[torch.Tensor, tuple[torch.Tensor, ...]]] = field(default_factory=list)
    skip_reason: str = ""


LossFn = Callable[[torch.Tensor], MicroOutput]
# [(micro-batch rows, probe)] after the step -> (measured value, reason to undo the step or None)
StepCheck = Callable[[list[tuple[torch.Tensor, torch.Tensor]]], tuple[float, str | None]]


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
        return dataclasses.replace(
            self,
            optimizer=raw,
            backward=autograd_backward,
            micro=dataclasses.replace(self.micro, threads=1),
        )


def fsdp1_root(strategy: Any) -> torch.nn.Module | None:
    """The FSDP1-wrapped root module when the trainer's ``strategy`` is FSDP1's, else None."""
    from lightning.pytorch.strategies import FSDPStrategy

    return strategy.model if isinstance(strategy, FSDPStrategy) else None


def clip_grad_norm(
    params, max_norm: float, every_param: bool = False, fsdp_root: torch.nn.Module | None = None
) -> float:
    """Clip ``params`` by their global norm (``max_norm <= 0``: measure only); under FSDP1 the root
    module's own clip, which is exact (Lightning refuses clip-by-norm there). ``every_param``
    includes parameters without a gradient (a collective under FSDP2 must run on every rank)."""
    max_norm = max_norm if max_norm > 0 else float("inf")
    if fsdp_root is not None:
        return float(fsdp_root.clip_grad_norm_(max_norm))
    params = [p for p in params if p.requires_grad and (every_param or p.grad is not None)]
    if not params:
        return 0.0
    return float(full_tensor(torch.nn.utils.clip_grad_norm_(params, max_norm)))


def accumulate(
    ctx: StepContext,
    rows: torch.Tensor,
    loss_fn: LossFn,
    *,
    lengths: torch.Tensor | None = None,
    check: StepCheck | None = None,
) -> StepResult:
    """zero_grad -> backward over micro-batches of ``rows`` -> clip -> step, of ``ctx``'s network.

    The step is skipped when a loss, the gradient norm, the learning rate or the updated weights are
    non-finite (:func:`guarded_step`: weights and optimizer state stay
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
    params = [p for g in opt.param_groups for p in g["params"]]  # a shared LoRA base: both adapters
    if micro.tokens is not None and lengths is None:
        raise ValueError("a token budget for the micro-batches needs the rows' lengths")
    micros = plan_micro_batches(
        rows, lengths, micro.size, micro.tokens, packed=micro.packed, pad_row=ctx.pad_row
    )
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
    reason = (
        "non-finite loss"
        if not finite
        else ""
        if math.isfinite(norm)
        else "non-finite gradient norm"
    )
    measured: dict[str, float] = {}

    def after() -> str | None:
        measured["step_kl"], why = check(seen.probes)
        return why

    # collectives inside: the ranks agree on the flags above
    reason = reason or guarded_step(opt, params, after=after if check is not None else None) or ""
    if not reason and ctx.scheduler is not None:
        ctx.scheduler.step()
    opt.zero_grad()  # FSDP1 clips every gradient of the wrapped root: leave none for the other net
    metrics = {k: total for k, (total, _) in _across_ranks(seen.terms).items()}
    metrics.update({k: total / count for k, (total, count) in _across_ranks(seen.stats).items()})
    metrics["grad_norm"] = norm
    metrics.update(measured)
    if ctx.skips is not None:
        ctx.skips.record(ctx.network, not reason, reason)  # raises after too many in a row
    return StepResult(metrics, not reason, seen.outputs, reason)


@dataclass
class _Backward:
    """What the backward passes of one step's micro-batches left: their loss terms and statistics
    (lists per name, combined across ranks later), outputs and probes by rows, and whether every
    loss was finite."""

    terms: dict[str, list[float]] = field(default_factory=dict)
    stats: dict[str, list[float]] = field(default_factory=dict)
    outputs: list = field(default_factory=list)
    probes: list[tuple[torch.Tensor, torch.Tensor]] = field(default_factory=list)
    finite: bool = True


def _backward_micro_batches(
    ctx: StepContext, micros: list[torch.Tensor], loss_fn: LossFn, params: list[torch.Tensor]
) -> _Backward:
    """Forward and backward every micro-batch (its rows) of ``micros``, in order (on
    ``ctx.micro.threads`` CPU threads in one process, the gradients of ``params`` added in
    order)."""
    size, threads, pad_row = world()[1], ctx.micro.threads, ctx.pad_row
    seen = _Backward()
    done = None
    if size == 1 and threads > 1 and len(micros) > 1:
        check_threads_precision(threads, ctx.precision)

        def forward(micro: torch.Tensor) -> tuple[torch.Tensor | None, MicroOutput]:
            out = loss_fn(micro)  # a non-finite loss skips the step: no use for its gradient
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
