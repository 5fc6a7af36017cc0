"""The critic's optimizer steps on a worker thread, overlapping the next iteration's rollout
(``--model.critic.in_background``).

The rollout of iteration k + 1 needs the actor's new weights, not the critic's, and on CPU it keeps
one core busy (vLLM and the HF engine run one torch thread) while the other idles. Here the critic's
steps of iteration k (every epoch and mini-batch) run on a worker thread, and iteration k + 1 joins
them before anything reads the critic.

The math is the sequential update's. The actor's steps never read the critic's weights: its
advantages come from values computed before either network steps (a separate no-grad value pass,
which here replaces taking them from the critic step's own forward). The critic takes the same steps
on the same data in the same order, only later in wall-clock time.

The worker calls none of Lightning's machinery, whose hooks keep per-module state that concurrent
calls would corrupt: it backpropagates with autograd directly and steps the raw optimizer
(:meth:`~.optim.StepContext.outside_lightning`). Its steps are counted into
``trainer.global_step`` when the job is submitted (from the main thread, inside ``training_step``:
:func:`count_steps`), as in the sequential update (a step skipped for a non-finite learning rate,
which the sequential update does not count, is counted here). The module's ``state_dict`` waits for
the job, so a checkpoint holds the critic after its steps, and the checkpoint carries their metrics.
The critic's metrics of iteration k are logged with iteration k + 1 (those of the last iteration are
not logged). Lightning zeroes every gradient and switches the networks to eval mode before
validating; the module waits for the job first (``on_validation_model_zero_grad``), so a run does
not depend on how far the critic got by then.

:meth:`BackgroundSteps.active` falls back to the sequential update with several processes (a worker's collectives
would interleave with the rollout's) and under LoRA with one shared base (``lora.shared_base``: the
critic's forward switches the base's active adapter, which the actor's rollout and weight push
read).
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any


def count_steps(optimizer: Any, steps: int) -> None:
    """Count ``steps`` optimizer steps into ``trainer.global_step`` through Lightning's public path:
    its optimizer wrapper counts each ``step()`` call. The network holds no gradient here (its last
    step set them to None) and torch optimizers skip parameters without one, so nothing changes."""
    params = [p for group in optimizer.param_groups for p in group["params"]]
    if any(p.grad is not None for p in params):
        raise RuntimeError(
            "counting optimizer steps needs a network without gradients: they would be applied"
        )
    for _ in range(steps):
        optimizer.step()


class BackgroundSteps:
    """One job at a time on one worker thread: :meth:`submit` a function returning logs,
    :meth:`join` them. ``module``: the StarPO module whose settings say whether the critic steps
    here."""

    def __init__(self, module: Any = None) -> None:
        self._module = module
        self._pool: ThreadPoolExecutor | None = None
        self._future: Future | None = None
        self._logs: dict[str, float] = {}  # of a job waited for but not joined yet

    def active(self) -> BackgroundSteps | None:
        """This object when the module's critic steps may run here (``--model.critic.in_background``
        on, a critic, one process, no shared LoRA base), else None: the sequential update."""
        from ragen_lightning.parallel import world

        m = self._module
        lora = m.hparams.get("lora")
        on = m.settings.critic.in_background and getattr(m, "critic", None) is not None
        return self if on and world()[1] == 1 and not (lora or {}).get("shared_base") else None

    @property
    def pending(self) -> bool:
        return self._future is not None

    def submit(
        self, job: Callable[[], dict[str, float]], steps: int = 0, optimizer: Any = None
    ) -> None:
        """Run ``job`` (returning logs) on the worker; the ``steps`` optimizer steps it takes are
        counted now with ``optimizer`` (Lightning's wrapper, :func:`count_steps`; None: not)."""
        if self._future is not None:
            raise RuntimeError("the previous background job was not joined")
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="critic-steps")
        if optimizer is not None:
            count_steps(optimizer, steps)
        self._future = self._pool.submit(job)

    def join(self) -> dict[str, float]:
        """:meth:`wait`, then the logs of the jobs finished since the last join ({} when none)."""
        self.wait()
        logs, self._logs = self._logs, {}
        return logs

    def wait(self) -> None:
        """Wait for the pending job (if any); its exception (e.g.
        :class:`~ragen_lightning.errors.TrainingStopped` after too many skipped steps) is raised
        here."""
        if self._future is None:
            return
        future, self._future = self._future, None
        self._logs.update(future.result())

    def state_dict(self) -> dict[str, float]:
        """The logs of the finished jobs not joined yet (waits for the pending job): a checkpoint
        carries them, so a resumed run logs the critic's metrics of the checkpoint's iteration with
        the next one, as the uninterrupted run does."""
        self.wait()
        return dict(self._logs)

    def load_state_dict(self, logs: dict[str, float]) -> None:
        self._logs = {str(k): float(v) for k, v in logs.items()}

    def close(self) -> None:
        """Wait, then stop the worker thread."""
        try:
            self.wait()
        finally:
            if self._pool is not None:
                self._pool.shutdown(wait=True)
                self._pool = None
