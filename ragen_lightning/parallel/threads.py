"""Micro-batches on CPU threads: several cores for one process without intra-op threading.

On CPU the configs run torch with one intra-op thread (``torch_threads: 1``): for a model as small
as the embedded one, splitting every op across cores costs more in synchronisation than it gains,
and stalls when another job holds a core. Whole micro-batches split well instead: torch ops release
the GIL, so micro-batches run by different Python threads compute at the same time, each op on one
core, with no barrier between them.

Gradients are where threads could cost reproducibility: concurrent ``backward`` calls add into a
shared parameter's ``.grad`` in whichever order they finish, and float sums depend on the order
(with three or more micro-batches ``(g0 + g1) + g2`` and ``(g0 + g2) + g1`` differ in the last bits,
and the difference grows over a run).
:func:`backward_in_order` therefore lets each thread compute its micro-batch's gradients into fresh tensors
(``torch.autograd.grad``) and adds them into ``.grad`` on the calling thread in the micro-batches'
order: the result is bit-for-bit the sequential loop's, whatever the thread count and the timing.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

import torch

T = TypeVar("T")
R = TypeVar("R")


def map_threads(fn: Callable[[T], R], items: Iterable[T], threads: int) -> list[R]:
    """``[fn(item) for item in items]``, computed by up to ``threads`` Python threads (results in
    input order).

    The caller's grad mode holds in the workers too (it is thread-local in torch, and a new thread
    starts with grad on). An exception in any call is raised here after the calls already started
    have finished."""
    items = list(items)
    if threads <= 1 or len(items) <= 1:
        return [fn(item) for item in items]
    grad = torch.is_grad_enabled()

    def call(item: T) -> R:
        with torch.set_grad_enabled(grad):
            return fn(item)

    with ThreadPoolExecutor(
        max_workers=min(threads, len(items)), thread_name_prefix="micro-batch"
    ) as pool:
        return list(pool.map(call, items))


def backward_in_order(
    fn: Callable[[T], tuple[torch.Tensor | None, R]],
    items: Iterable[T],
    threads: int,
    params: Iterable[torch.Tensor],
) -> list[R]:
    """For every item ``fn(item)`` returns ``(loss, result)``; the gradient of each loss (None: no
    backward) with respect to ``params`` is added into their ``.grad`` in the items' order, exactly
    as ``loss.backward()`` item after item would; returns the results in order.

    ``threads`` items run at a time (:func:`map_threads`), each computing its gradients into its own
    tensors; the calling thread then adds them in order, so the sum does not depend on which thread
    finished first (it equals the one-thread loop's bit for bit). Gradient memory: one extra copy
    per thread in flight."""
    items, params = list(items), [p for p in params if p.requires_grad]

    def call(item: T) -> tuple[tuple[torch.Tensor | None, ...] | None, R]:
        loss, result = fn(item)
        return (
            None if loss is None else torch.autograd.grad(loss, params, allow_unused=True)
        ), result

    results: list[R] = []
    step = max(threads, 1)
    for start in range(0, len(items), step):
        for grads, result in map_threads(call, items[start : start + step], threads):
            for p, g in zip(params, grads or ()):
                if g is None:
                    continue
                if p.grad is None:
                    p.grad = g
                else:
                    p.grad.add_(g)
            results.append(result)
    return results


@contextlib.contextmanager
def torch_threads_set(count: int | None) -> Iterator[None]:
    """torch's CPU threads set to ``count`` (None: left as they are) inside, restored after."""
    previous = torch.get_num_threads()
    if count is not None:
        if count < 1:
            raise ValueError(f"torch_threads must be >= 1, got {count}")
        torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(previous)
