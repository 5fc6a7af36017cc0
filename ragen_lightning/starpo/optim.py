"""The two optimizers of a StarPO run (actor, critic) and their optional linear learning-rate warm-up.

With manual optimisation Lightning does not step schedulers: :func:`step_warmup` advances the schedule of the
network whose optimizer just stepped.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

OptimizerFactory = Callable[..., torch.optim.Optimizer]


def build_optimizers(actor_params, critic_params, *, actor_factory: OptimizerFactory | None,
                     critic_factory: OptimizerFactory | None, actor_lr: float, critic_lr: float, weight_decay: float,
                     with_critic: bool, warmup_steps: int):
    """``[actor_opt, critic_opt?]`` (AdamW unless a factory is given), plus one ``LambdaLR`` each when
    ``warmup_steps > 0``: optimizer step ``k`` uses ``lr * min(1, (k + 1) / warmup_steps)``."""

    def build(factory, params, lr):
        return factory(params) if factory is not None else torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)

    opts = [build(actor_factory, actor_params, actor_lr)]
    if with_critic:
        opts.append(build(critic_factory, critic_params, critic_lr))
    if warmup_steps > 0:
        return opts, [torch.optim.lr_scheduler.LambdaLR(o, lambda k: min(1.0, (k + 1) / warmup_steps)) for o in opts]
    return opts


def step_warmup(schedulers, opt) -> None:
    """One scheduler step for the network of ``opt`` (a ``LightningOptimizer`` or a plain optimizer)."""
    inner = getattr(opt, "optimizer", opt)
    for sched in schedulers if isinstance(schedulers, list) else [schedulers]:
        if sched.optimizer is inner:
            sched.step()
