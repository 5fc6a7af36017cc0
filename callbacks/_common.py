"""Shared plumbing of the callbacks: the current iteration's data and logging from a callback
hook."""

from __future__ import annotations

import math
from typing import Any


def iteration_data(pl_module: Any) -> tuple[Any, dict[str, float]] | None:
    """``(last_rollout, last_logs)`` the module stored for the iteration that just ran, or None
    before the first."""
    batch = getattr(pl_module, "last_rollout", None)
    if batch is None:
        return None
    return batch, dict(getattr(pl_module, "last_logs", {}) or {})


def iteration_number(logs: dict[str, float], fallback: int) -> int:
    """The 1-based StarPO iteration (the data module logs the 0-based ``iteration``; it survives a
    resume)."""
    return int(logs["iteration"]) + 1 if "iteration" in logs else fallback


def advance(callback: Any, pl_module: Any) -> tuple[Any, dict[str, float], int] | None:
    """Count the iteration that just ran in ``callback.iterations`` and return ``(rollout, logs,
    iteration)`` (the 1-based iteration number), or None before the first iteration."""
    data = iteration_data(pl_module)
    if data is None:
        return None
    callback.iterations += 1
    rollout, logs = data
    return rollout, logs, iteration_number(logs, callback.iterations)


def on_schedule(iteration: int, every: int) -> bool:
    """True at iteration 1 and every ``every``-th iteration (RAGEN's ``step == 1 or step % freq ==
    0``)."""
    return every > 0 and (iteration == 1 or iteration % every == 0)


def logged_step(trainer: Any) -> int:
    """The step Lightning logs the module's values of the current iteration at, from the fit loop's
    public ``total_batch_idx`` (the 0-based index of the batch being trained, across epochs).

    Lightning logs ``self.log`` values at its count of batches that stepped, which is that index
    while the batch's hooks and the validation after it run: the module optimizes manually, and
    manual optimization has no gradient accumulation, so every batch steps. Before the first batch
    (the iteration-0 validation) the index is -1 and the logged step 0.
    """
    return max(int(trainer.fit_loop.total_batch_idx), 0)


def log_values(trainer: Any, values: dict[str, float]) -> None:
    """Send finite floats straight to the trainer's loggers at this iteration's step (from
    ``on_train_batch_end``).

    Not ``LightningModule.log``: Lightning re-sends the last value of an ``on_step`` key at every
    later step until it is logged again, which would smear a value measured every N iterations (MI,
    gradient analysis, warnings) over the iterations in between. The step is the one Lightning logs
    the module's values of this iteration at.
    """
    values = {k: float(v) for k, v in values.items() if v is not None and math.isfinite(float(v))}
    if not values:
        return
    step = logged_step(trainer)
    for logger in trainer.loggers:
        logger.log_metrics(values, step=step)
