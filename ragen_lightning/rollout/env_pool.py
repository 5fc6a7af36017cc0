"""A bounded pool of daemon worker threads that runs env calls with a per-call timeout.

The rollout runner hands it the env resets and steps of one turn (one call per live episode): calls
run on at most ``workers`` threads at once, each call's outcome (its value, its exception, or a
timeout) comes back in the calls' order, so results are applied in the same order whatever finished
first and a rollout stays reproducible.

Why threads and not processes: an env is a Python object that holds its episode's state, and envs
that are slow are slow because they wait (an HTTP round trip to a remote env, a sandboxed
subprocess, a sleep), which releases the GIL. Why not
:class:`concurrent.futures.ThreadPoolExecutor`: a thread cannot be killed, so a call that hangs past
its timeout is abandoned, still running, and the executor's threads are joined at interpreter exit
(a hung env would then block the end of the run). Here every worker is a daemon thread; an abandoned
worker is replaced by a fresh one so the pool keeps its size, and the abandoned one exits (its late
result discarded) if its call ever returns.

With ``workers == 1`` and no timeout the calls run in the caller's thread, one after another: the
in-process envs step in microseconds, and a thread hand-off per step would only cost time
(``benchmarks/env_pool.py``).
"""

from __future__ import annotations

import itertools
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any


class CallTimeout(TimeoutError):
    """A call ran past the pool's timeout (its worker thread was abandoned, still running it)."""


@dataclass
class Outcome:
    """What one call gave: ``value``, or ``error`` (the exception it raised, or a
    :class:`CallTimeout`)."""

    value: Any = None
    error: BaseException | None = None
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def timed_out(self) -> bool:
        return isinstance(self.error, CallTimeout)


class WorkerPool:
    """Runs batches of zero-argument calls on at most ``workers`` daemon threads, each call limited
    to ``timeout_s``.

    Args:
        workers: calls run concurrently at most (>= 1).
        timeout_s: seconds one call may run, counted from the moment a worker starts it (a call
        waiting for a free
            worker is not charged); None = no limit.
        name: prefix of the worker threads' names (shown in stack dumps of a hung run).
    """

    def __init__(self, workers: int = 1, timeout_s: float | None = None, name: str = "env-worker"):
        if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
            raise ValueError(f"workers must be an integer >= 1, got {workers!r}")
        if timeout_s is not None and not timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0 or None, got {timeout_s!r}")
        self.workers, self.timeout_s, self.name = workers, timeout_s, name
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._abandoned: set[threading.Thread] = set()
        # (batch, index) -> worker, start
        self._running: dict[tuple[int, int], tuple[threading.Thread, float]] = {}
        self._lock = threading.Lock()
        self._batches = itertools.count()
        self._names = itertools.count()
        self.abandoned_total = 0  # workers given up on over the pool's life

    @property
    def inline(self) -> bool:
        """Calls run in the caller's thread (one worker and no timeout to enforce)."""
        return self.workers == 1 and self.timeout_s is None

    def map(self, calls: Sequence[Callable[[], Any]]) -> list[Outcome]:
        """Run every call; their outcomes in the calls' order. Never raises for a call's exception
        or timeout."""
        if self.inline:
            return [_run(call) for call in calls]
        if not calls:
            return []
        batch = next(self._batches)
        results: queue.SimpleQueue = queue.SimpleQueue()
        self._grow(min(self.workers, len(calls)))
        for i, call in enumerate(calls):
            self._jobs.put((batch, i, call, results))
        outcomes: list[Outcome | None] = [None] * len(calls)
        pending = set(range(len(calls)))
        # when to look for timed-out calls next: no running call can expire before it
        check_at = 0.0
        while pending:
            wait = None
            if self.timeout_s is not None:
                now = time.monotonic()
                if now >= check_at:
                    check_at = now + self._expire(batch, pending, outcomes)
                    if not pending:
                        break
                wait = max(check_at - now, 1e-3)
            try:
                i, outcome = results.get(timeout=wait)
            except queue.Empty:
                continue
            if i in pending:  # not already given up on
                pending.discard(i)
                outcomes[i] = outcome
        return outcomes  # type: ignore[return-value]

    def _expire(
        self, batch: int, pending: set[int], outcomes: list[Outcome | None]
    ) -> float | None:
        """Give up on this batch's calls that ran past the timeout (their workers are replaced);
        returns how long to wait for the next result before checking again (None: no timeout to
        watch)."""
        if self.timeout_s is None:
            return None
        now = time.monotonic()
        wait, lost = self.timeout_s, 0
        with self._lock:
            for i in sorted(pending):
                started = self._running.get((batch, i))
                if started is None:
                    continue  # still queued: its clock has not started
                thread, t0 = started
                left = t0 + self.timeout_s - now
                if left > 0:
                    wait = min(wait, left)
                    continue
                pending.discard(i)
                outcomes[i] = Outcome(
                    error=CallTimeout(
                        f"no result after {self.timeout_s:g} s (the worker thread "
                        "was abandoned, still running the call)"
                    ),
                    seconds=now - t0,
                )
                del self._running[(batch, i)]
                self._abandoned.add(thread)
                self._threads.remove(thread)
                self.abandoned_total += 1
                lost += 1
            replace = len(self._threads) + lost
        if lost:
            self._grow(replace)  # fresh workers for the queued calls
        return max(wait, 1e-3)

    def _grow(self, n: int) -> None:
        with self._lock:
            while len(self._threads) < min(n, self.workers):
                thread = threading.Thread(
                    target=self._work, name=f"{self.name}-{next(self._names)}", daemon=True
                )
                self._threads.append(thread)
                thread.start()

    def _work(self) -> None:
        me = threading.current_thread()
        while True:
            job = self._jobs.get()
            if job is None:
                return
            batch, i, call, results = job
            with self._lock:
                self._running[(batch, i)] = (me, time.monotonic())
            # whatever a call raises, its worker lives and reports it
            outcome = _run(call, BaseException)
            with self._lock:
                self._running.pop((batch, i), None)
                abandoned = me in self._abandoned
                self._abandoned.discard(me)
            # an abandoned call's result lands in a queue nobody reads any more
            results.put((i, outcome))
            if abandoned:
                return

    def close(self) -> None:
        """Let the idle workers exit (a worker still inside a hung call exits when the call
        returns)."""
        with self._lock:
            threads, self._threads = self._threads, []
        for _ in threads:
            self._jobs.put(None)


def _run(call: Callable[[], Any], catch: type[BaseException] = Exception) -> Outcome:
    t0 = time.perf_counter()
    try:
        value = call()
    except catch as e:  # the caller decides what an env's exception means
        return Outcome(error=e, seconds=time.perf_counter() - t0)
    return Outcome(value=value, seconds=time.perf_counter() - t0)
