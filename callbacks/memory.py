"""PeakMemory: the peak memory of every iteration (rollout + update), to compare with the memory
plan.

On CUDA the allocator's peak is reset when an iteration starts (``on_train_batch_start``, before the
rollout is generated) and read when it ends, so model loading and anything between iterations are
not counted:

* ``memory/peak_allocated_gib``: ``torch.cuda.max_memory_allocated`` (live tensors; what the memory
  plan predicts without its runtime overhead);
* ``memory/peak_reserved_gib``: ``torch.cuda.max_memory_reserved`` (the caching allocator's blocks,
  fragmentation included);
* ``memory/device_used_gib`` and ``memory/device_total_gib``: the whole device at the iteration's
  end, from ``torch.cuda.mem_get_info`` (CUDA context, other processes and libraries' workspaces
  included).

On CPU, ``memory/peak_rss_gib`` is the process's peak resident set (``VmHWM``: since the process
started, so it only grows; it holds Python, torch and the libraries as well as the model, and is not
what the plan predicts). Values are logged by rank 0's loggers (the other ranks' peaks are alike
under data parallelism and FSDP).
"""

from __future__ import annotations

import resource
import sys
from pathlib import Path

import torch
from lightning.pytorch.callbacks import Callback

from callbacks._common import log_values

GIB = 1024**3


def cpu_peak_rss_bytes() -> int:
    """This process's peak resident set in bytes: Linux's ``VmHWM`` (``getrusage`` can lag behind
    it), else ``getrusage`` (kilobytes on Linux, bytes on macOS)."""
    status = Path("/proc/self/status")
    if status.is_file():
        for line in status.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)


def cuda_memory_values(device: torch.device) -> dict[str, float]:
    """The ``memory/*`` values of a CUDA device since the last peak reset (module docstring)."""
    free, total = torch.cuda.mem_get_info(device)
    return {
        "memory/peak_allocated_gib": torch.cuda.max_memory_allocated(device) / GIB,
        "memory/peak_reserved_gib": torch.cuda.max_memory_reserved(device) / GIB,
        "memory/device_used_gib": (total - free) / GIB,
        "memory/device_total_gib": total / GIB,
    }


class PeakMemory(Callback):
    """Logs each iteration's peak memory (module docstring)."""

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if pl_module.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(pl_module.device)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if pl_module.device.type == "cuda":
            values = cuda_memory_values(pl_module.device)
        else:
            values = {"memory/peak_rss_gib": cpu_peak_rss_bytes() / GIB}
        log_values(trainer, values)
