"""One-step-off-policy rollouts (``--data.training.async_level 1``): iteration ``k + 1``'s rollout
is generated on a worker thread, with the weights iteration ``k``'s update starts from, while that
update runs.

The data module hands out iteration ``k``'s batch, syncs its rollout engine to the actor's current
weights and launches iteration ``k + 1``'s rollout (:meth:`OneStepAhead.launch`); the update of
iteration ``k`` then runs on the main thread while the worker generates. The engine samples from its
own copy of the weights (a vLLM engine's, or a copy of the actor for the HF engine,
:func:`~ragen_lightning.rollout.engines.snapshot_engine`), so the update never changes the weights a
rollout is sampling from. Each batch is thus one update old (``rollout/staleness`` 1; the first is
on-policy); the update corrects for it with the rollout's own log-probs (``--model.loss.tis_cap``).

With several processes (DDP, FSDP) every rank does the same: its worker generates the rank's share
of the groups, and the rest of the rollout (the cross-rank gather, the filter, the batch) runs when
the batch is taken, on the training thread (``finish``), so every collective stays on that thread,
in the same order on every rank. A vLLM engine that spans several ranks (tensor parallel) is
refused: its generation runs collectives of its own.

Everything that reads the rollout's state waits for the worker first: validation (it shares the
engine), a checkpoint (:meth:`OneStepAhead.state` stores the finished batch, so a resumed run trains
on the very batch the uninterrupted run trained on: the weights it was sampled with are gone by
then) and teardown.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import torch

from ragen_lightning.types import RolloutBatch

STALENESS = "rollout/staleness"


class OneStepAhead:
    """The rollout one iteration ahead: at most one in flight (``async_level`` 1: a buffer of one
    batch)."""

    def __init__(self):
        self._pool: ThreadPoolExecutor | None = None
        self._pending: tuple[int, Future, Callable[[Any], RolloutBatch] | None] | None = None

    def launch(
        self,
        iteration: int,
        produce: Callable[[], Any],
        finish: Callable[[Any], RolloutBatch] | None = None,
    ) -> None:
        """Start ``produce()`` (iteration ``iteration``'s rollout; the engine already synced) on the
        worker; its result becomes the batch through ``finish`` on the thread that takes it (or
        stores it): the part of a rollout that runs collectives (the cross-rank gather) stays on the
        training thread, in step with the other ranks."""
        if self._pending is not None:
            raise RuntimeError(f"a rollout (iteration {self._pending[0]}) is still in flight")
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="rollout-ahead")
        self._pending = (iteration, self._pool.submit(produce), finish)

    def take(self, iteration: int) -> RolloutBatch | None:
        """The batch launched for ``iteration`` (waiting for it and finishing it here; its error
        raised here), else None."""
        if self._pending is None or self._pending[0] != iteration:
            return None
        batch = self._finished()
        self._pending = None
        batch.metrics[STALENESS] = 1.0
        return batch

    def _finished(self) -> RolloutBatch:
        """The batch in flight, waited for and finished on this thread (kept finished in the
        slot)."""
        iteration, future, finish = self._pending
        if finish is not None:
            done: Future = Future()
            done.set_result(finish(future.result()))
            self._pending = (iteration, done, None)
        return self._pending[1].result()

    def wait(self) -> None:
        """Block until the rollout in flight (if any) has finished; it stays to be taken."""
        if self._pending is not None:
            self._pending[1].exception()

    def state(self) -> dict[str, Any] | None:
        """The in-flight batch, waited for and finished, as plain tensors and numbers (for a
        checkpoint), or None."""
        if self._pending is None:
            return None
        return {"iteration": self._pending[0], "batch": batch_state(self._finished())}

    def restore(self, state: dict[str, Any] | None) -> None:
        """Put a :meth:`state` back in flight, finished."""
        self._pending = None
        if state is not None:
            future: Future = Future()
            future.set_result(batch_from_state(state["batch"]))
            self._pending = (int(state["iteration"]), future, None)

    def close(self) -> None:
        """Wait for the worker and drop what it produced."""
        if self._pending is not None:
            self._pending[1].exception()
            self._pending = None
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None


def batch_state(batch: RolloutBatch) -> dict[str, Any]:
    """``batch`` as tensors, numbers and a flag (loads with ``weights_only``); its trajectories are
    left out (they serve viewers and diagnostics, not the update)."""
    out: dict[str, Any] = {k: getattr(batch, k).cpu() for k in batch._tensors()}
    out["metrics"] = {k: float(v) for k, v in batch.metrics.items()}
    out["per_turn_rewards"] = bool(batch.per_turn_rewards)
    return out


def batch_from_state(state: dict[str, Any]) -> RolloutBatch:
    """The :class:`RolloutBatch` of a :func:`batch_state` (no trajectories)."""
    tensors = {k: v for k, v in state.items() if isinstance(v, torch.Tensor)}
    return RolloutBatch(
        **tensors, per_turn_rewards=state["per_turn_rewards"], metrics=dict(state["metrics"])
    )
