"""Micro-batches on CPU threads: several cores for one process without intra-op threading.

On CPU the configs run torch with one intra-op thread (``torch_threads: 1``): for a model as small as the embedded
one, splitting every op across cores costs more in synchronisation than it gains, and stalls when another job
holds a core. Whole micro-batches split well instead: torch ops release the GIL, so micro-batches run by different
Python threads compute at the same time, each op on one core, with no barrier between them.

Gradients of a shared parameter from concurrent ``backward`` calls accumulate under autograd's lock, in an order
that varies from run to run: the summed gradient equals the sequential one up to float rounding (and so do runs
with different thread counts), but is not bit-for-bit reproducible. One thread is the plain loop, in order.
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
    """``[fn(item) for item in items]``, computed by up to ``threads`` Python threads (results in input order).

    The caller's grad mode holds in the workers too (it is thread-local in torch, and a new thread starts with
    grad on). An exception in any call is raised here after the calls already started have finished."""
    items = list(items)
    if threads <= 1 or len(items) <= 1:
        return [fn(item) for item in items]
    grad = torch.is_grad_enabled()

    def call(item: T) -> R:
        with torch.set_grad_enabled(grad):
            return fn(item)

    with ThreadPoolExecutor(max_workers=min(threads, len(items)), thread_name_prefix="micro-batch") as pool:
        return list(pool.map(call, items))


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
