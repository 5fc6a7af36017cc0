"""The two optimizers of a StarPO run (actor, critic), their optional learning-rate schedule (linear warm-up per
step, cosine decay per iteration: :class:`LRSchedule`), and the guard that keeps non-finite values out of the weights.

With manual optimisation Lightning does not step schedulers: :func:`step_warmup` advances the schedule of the
network whose optimizer just stepped, :func:`start_iteration` moves the decay to the new iteration.

Non-finite guard (:func:`guarded_step`): a step is not applied when its inputs are non-finite (loss, gradient norm:
checked by :func:`~ragen_lightning.starpo.optimizer_steps.accumulate`; learning rate: checked here before the step) or when
the weights it produces are (an absurd finite learning rate overflows): up to :data:`SNAPSHOT_LIMIT` trainable
elements per rank the trainable weights and the optimizer state are copied to host memory before the step and put
back when any weight comes out non-finite, so a skipped step leaves the network and its optimizer exactly as they
were (GPU memory, which the memory plan budgets, is unchanged). Above the limit that copy would cost three times the
shard per step, so only the checks before the step protect the weights and a non-finite result stops the run. :class:`SkipGuard` counts skipped steps and stops the run after ``max_consecutive`` skips of one
network in a row.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from ragen_lightning.errors import TrainingStopped
from ragen_lightning.parallel import all_reduce_, world

OptimizerFactory = Callable[..., torch.optim.Optimizer]


MIN_LR_RATIO = 0.1  # where the cosine decay ends (as the supervised warm start's cosine schedule)


@dataclass
class LRSchedule:
    """The learning-rate multiplier of a network at its optimizer step ``step``: a linear warm-up over its first
    ``warmup_steps`` steps (``(step + 1) / warmup_steps``), times a cosine decay over the run's first
    ``decay_iterations`` StarPO iterations from 1 to :data:`MIN_LR_RATIO`, held there after (0: no decay).

    The decay follows iterations, not steps: with rejection sampling or a filter the number of optimizer steps per
    iteration varies, while the iteration count is the run's length (``--data.training.num_iterations``). ``iteration``
    (0-based) is set by :func:`start_iteration` before each iteration's first step."""

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
        return warm * (MIN_LR_RATIO + (1.0 - MIN_LR_RATIO) * 0.5 * (1.0 + math.cos(math.pi * progress)))


def build_optimizers(actor_params, critic_params, *, actor_factory: OptimizerFactory | None,
                     critic_factory: OptimizerFactory | None, actor_lr: float, critic_lr: float, weight_decay: float,
                     with_critic: bool, schedule: LRSchedule):
    """``[actor_opt, critic_opt?]`` (AdamW unless a factory is given), plus one ``LambdaLR`` each following
    ``schedule`` when it warms up or decays."""

    def build(factory, params, lr):
        return factory(params) if factory is not None else torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)

    opts = [build(actor_factory, actor_params, actor_lr)]
    if with_critic:
        opts.append(build(critic_factory, critic_params, critic_lr))
    if schedule.active:
        return opts, [torch.optim.lr_scheduler.LambdaLR(o, schedule) for o in opts]
    return opts


def _schedulers(schedulers) -> list:
    return schedulers if isinstance(schedulers, list) else [] if schedulers is None else [schedulers]


def step_warmup(schedulers, opt) -> None:
    """One scheduler step for the network of ``opt`` (a ``LightningOptimizer`` or a plain optimizer)."""
    inner = getattr(opt, "optimizer", opt)
    for sched in _schedulers(schedulers):
        if sched.optimizer is inner:
            sched.step()


def start_iteration(schedulers, iteration: int) -> None:
    """Set every :class:`LRSchedule` to the 0-based ``iteration`` and apply the rate it gives now, so the iteration's
    first step already runs at it (a scheduler recomputes the rate only when it steps)."""
    for sched in _schedulers(schedulers):
        for group, base, schedule in zip(sched.optimizer.param_groups, sched.base_lrs, sched.lr_lambdas, strict=True):
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
    """``"non-finite learning rate (inf)"`` when a parameter group's ``lr`` is not a finite number, else None."""
    for group in _inner(opt).param_groups:
        lr = float(group["lr"])
        if not math.isfinite(lr):
            return f"non-finite learning rate ({lr})"
    return None


class WeightSnapshot:
    """Host-memory copies of everything ``opt.step()`` may change: each parameter's data and its optimizer state
    (a parameter without state yet gets none back, so the optimizer initialises it again on its next step)."""

    def __init__(self, opt):
        self.opt = _inner(opt)
        self.params = [p for g in self.opt.param_groups for p in g["params"]]
        self.data = [_local(p.detach()).to("cpu", copy=True) for p in self.params]
        self.state = [None if p not in self.opt.state else
                      {k: _local(v.detach()).to("cpu", copy=True) if torch.is_tensor(v) else v
                       for k, v in self.opt.state[p].items()} for p in self.params]

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
    """Every element of every parameter is finite, agreed by all ranks (shards differ under FSDP)."""
    local = [_local(p.detach()) for p in params]
    finite = all(bool(torch.isfinite(t).all()) for t in local)
    if world()[1] > 1:
        device = local[0].device if local else "cpu"
        finite = bool(all_reduce_(torch.tensor(float(finite), device=device), "min"))
    return finite


SNAPSHOT_LIMIT = 64 * 2**20  # trainable elements per rank up to which a step is undoable (~0.77 GiB of host copy)


def local_numel(opt) -> int:
    """Trainable elements of ``opt`` on this rank (its shards under FSDP2)."""
    return sum(_local(p.detach()).numel() for g in _inner(opt).param_groups for p in g["params"])


def guarded_step(opt, params, snapshot_limit: int = SNAPSHOT_LIMIT,
                 after: Callable[[], str | None] | None = None) -> str | None:
    """``opt.step()`` unless it would put a non-finite value into the weights: None when applied, else the reason
    (nothing changed). Every rank calls it (the finite check is a collective).

    Up to ``snapshot_limit`` trainable elements per rank (the tiny model, LoRA adapters, a sharded small model) the
    step is undoable: weights and optimizer state are copied to host memory first and put back when the step
    produced a non-finite weight. Above it (a full fine-tune of a large model, where that copy would cost three
    times the shard in host memory and time every step) only the finite checks before the step run (learning
    rate here, loss and gradient norm in :func:`~ragen_lightning.starpo.optimizer_steps.accumulate`); a step that still
    produces a non-finite weight (a finite but absurd learning rate) stops the run before anything is saved.

    ``after()`` (the step-KL trust region, ``--model.optim.max_step_kl``) runs once the step produced finite weights; a
    reason it returns undoes the step like a non-finite weight. Above the snapshot limit the step cannot be undone:
    it is kept, with a warning."""
    if reason := learning_rate_problem(opt):
        return reason
    snapshot = WeightSnapshot(opt) if local_numel(opt) <= snapshot_limit else None
    try:
        opt.step()
    except RuntimeError as exc:  # torch refuses an lr * grad that overflows a float ("... without overflow")
        if "overflow" not in str(exc):
            raise
        if snapshot is None:
            raise TrainingStopped(f"an optimizer step overflowed ({exc}); stopped before anything was saved. Lower "
                                  "the learning rate or --model.optim.grad_clip") from exc
        snapshot.restore()  # a multi-tensor step may have updated some parameters already
        return f"optimizer step overflowed ({exc})"
    if weights_finite(params):
        why = after() if after is not None else None
        if why is None:
            return None
        if snapshot is None:
            warnings.warn(f"{why}; the step is kept: {local_numel(opt):,} trainable elements are above the "
                          f"snapshot limit ({snapshot_limit:,}) that makes a step undoable", stacklevel=2)
            return None
        snapshot.restore()
        return f"{why} (restored)"
    if snapshot is None:
        raise TrainingStopped("an optimizer step produced non-finite weights (the learning rate is finite but too "
                              "large for these gradients); stopped before anything was saved. Lower the learning "
                              "rate or --model.optim.grad_clip")
    snapshot.restore()
    return "non-finite weights after the step (restored)"


@dataclass
class SkipGuard:
    """Counts skipped optimizer steps (``total``, logged as ``train/skipped_steps``) and each network's skips in a
    row; raises :class:`~ragen_lightning.errors.TrainingStopped` once one network's reach ``max_consecutive``
    (0: never)."""

    max_consecutive: int = 5
    total: int = 0
    in_a_row: dict[str, int] = field(default_factory=dict)

    def state_dict(self) -> dict:
        return {"skipped_steps": self.total, "skips_in_a_row": dict(self.in_a_row)}

    def load_state_dict(self, state: dict) -> None:
        self.total = int(state.get("skipped_steps", 0))
        self.in_a_row = dict(state.get("skips_in_a_row", {}))

    def record(self, network: str, stepped: bool, reason: str = "") -> None:
        """Count one step of ``network``; raises when it has now skipped ``max_consecutive`` in a row."""
        if stepped:
            self.in_a_row[network] = 0
            return
        self.total += 1
        self.in_a_row[network] = self.in_a_row.get(network, 0) + 1
        if self.max_consecutive and self.in_a_row[network] >= self.max_consecutive:
            kept = ("every step was undone: a smaller --model.optim.actor_lr takes smaller steps, a larger "
                    "--model.optim.max_step_kl allows larger ones" if "max_step_kl" in reason else
                    "nothing non-finite reached the weights")
            raise TrainingStopped(
                f"{self.in_a_row[network]} {network} optimizer steps in a row were skipped ({reason}); {kept}. Check "
                f"--model.optim.{network}_lr (or --model.optim.{network}_optimizer), --model.optim.grad_clip and --data.sampling.temperature; "
                "--model.optim.max_consecutive_skips sets this limit"
            )
