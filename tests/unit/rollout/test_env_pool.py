"""WorkerPool: order, bounded concurrency, exceptions as outcomes, timeouts that abandon a worker,
daemon exit."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from ragen_lightning.rollout.env_pool import CallTimeout, WorkerPool

ROOT = Path(__file__).resolve().parents[3]


def test_inline_pool_runs_in_the_callers_thread_and_returns_errors():
    pool = WorkerPool(1)
    assert pool.inline
    me = threading.current_thread()

    def boom():
        raise KeyError("k")

    out = pool.map([lambda: threading.current_thread() is me, boom, lambda: 3])
    assert [o.ok for o in out] == [True, False, True] and out[0].value is True and out[2].value == 3
    assert isinstance(out[1].error, KeyError) and not out[1].timed_out


def test_calls_run_concurrently_up_to_the_bound_and_keep_their_order():
    pool = WorkerPool(3)
    barrier = threading.Barrier(3, timeout=5)  # only passes if three calls run at the same time
    lock, live, peak = threading.Lock(), [0], [0]

    def call(i):
        with lock:
            live[0] += 1
            peak[0] = max(peak[0], live[0])
        if i < 3:
            barrier.wait()
        time.sleep(0.01)
        with lock:
            live[0] -= 1
        return i * i

    out = pool.map([lambda i=i: call(i) for i in range(7)])
    assert [o.value for o in out] == [i * i for i in range(7)]
    assert peak[0] == 3  # never more than `workers` at once
    assert all(t.daemon for t in pool._threads) and len(pool._threads) == 3
    pool.close()


def test_a_worker_survives_base_exceptions():
    pool = WorkerPool(2)

    def leave():
        raise SystemExit(3)

    out = pool.map([leave, lambda: "ok"])
    assert isinstance(out[0].error, SystemExit) and out[1].value == "ok"
    assert [o.value for o in pool.map([lambda: 1, lambda: 2])] == [1, 2]


def test_a_hung_call_times_out_its_worker_is_replaced_and_the_others_finish():
    pool = WorkerPool(2, timeout_s=0.2)
    release = threading.Event()
    try:
        t0 = time.monotonic()
        out = pool.map([release.wait, lambda: "a", lambda: "b", lambda: "c"])
        took = time.monotonic() - t0
        assert (
            out[0].timed_out
            and isinstance(out[0].error, CallTimeout)
            and "0.2 s" in str(out[0].error)
        )
        assert [o.value for o in out[1:]] == ["a", "b", "c"]
        assert 0.2 <= took < 2.0 and pool.abandoned_total == 1
        # the pool keeps its size: two fresh calls still run side by side
        barrier = threading.Barrier(2, timeout=5)
        assert [o.ok for o in pool.map([barrier.wait, barrier.wait])] == [True, True]
    finally:
        release.set()  # let the abandoned worker go
    pool.close()


def test_the_timeout_counts_from_the_start_of_a_call_not_from_the_queue():
    # one worker, three calls of 0.15 s under a 0.3 s limit: 0.45 s in all, and no call is late
    pool = WorkerPool(1, timeout_s=0.3)
    out = pool.map([lambda: time.sleep(0.15)] * 3)
    assert all(o.ok for o in out)


def test_bad_arguments():
    with pytest.raises(ValueError, match="workers must be an integer >= 1"):
        WorkerPool(0)
    with pytest.raises(ValueError, match="timeout_s must be > 0"):
        WorkerPool(2, timeout_s=0)


def test_a_hung_worker_does_not_block_interpreter_exit():
    script = textwrap.dedent("""
        import threading
        from ragen_lightning.rollout.env_pool import WorkerPool
        pool = WorkerPool(2, timeout_s=0.1)
        out = pool.map([threading.Event().wait, lambda: 1])   # the first call never returns
        print(out[0].timed_out, out[1].value)
    """)
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True", "1"]
