"""Plain progress lines for runs whose stderr is not a terminal (``nohup``, CI, a scheduler's log
file).

Lightning's bar redraws one line in place and draws nothing useful into a file;
:class:`IterationLines` takes its place there (the CLI adds it when stderr is not a terminal) and
writes one line per RL iteration and one per validation, on global rank 0 only::

    iteration 3/80 | 14.2 s/it | ETA 18:40 | reward 0.512 | success 0.250
    validation at iteration 20: success 0.414 | reward 0.803 | gain +0.102 [+0.031, +0.173]

(the gain and its interval where ``callbacks.ValidationGain`` runs).
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable
from typing import TextIO

from lightning.pytorch.callbacks import ProgressBar

from ragen_lightning.sft.progress import duration

# (logged key, name on the line); "score" is a trajectory's reward: env return plus format penalties
TRAIN_VALUES = (("train/score", "reward"), ("train/success", "success"))
VAL_VALUES = (("val/success", "success"), ("val/score", "reward"))
# callbacks.ValidationGain's paired gain over the first validation, printed with its interval
GAIN = ("val/success_gain", "val/success_gain_lo", "val/success_gain_hi")


class IterationLines(ProgressBar):
    """One line per iteration (iteration, time per iteration, ETA, reward, success) and one per
    validation.

    Args:
        stream: where to write (None: stderr, looked up when a line is written).
        clock: seconds, monotonic (a test passes its own).
    """

    def __init__(self, stream: TextIO | None = None, clock: Callable[[], float] = time.monotonic):
        super().__init__()
        self.stream, self.clock = stream, clock
        self.enabled = True
        self._start: float | None = None
        self._first = 0  # the first iteration this process trains (a resumed run starts past 0)
        self._done = 0  # iterations done, for the validation line

    def disable(self) -> None:
        self.enabled = False

    def enable(self) -> None:
        self.enabled = True

    def _write(self, line: str) -> None:
        if self.enabled:  # Lightning's ProgressBar.setup disables the bar on every rank but 0
            out = self.stream if self.stream is not None else sys.stderr
            out.write(line + "\n")
            out.flush()

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        self._start = None

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx: int) -> None:
        if self._start is None:  # timed from the first iteration's start: the rollout is part of it
            self._start, self._first = self.clock(), batch_idx

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        done, total = batch_idx + 1, self.total_train_batches
        self._done = done
        ran = done - self._first
        elapsed = self.clock() - (self._start if self._start is not None else self.clock())
        parts = [f"iteration {done}/{total}" if math.isfinite(total) else f"iteration {done}"]
        if ran > 0 and elapsed > 0:
            parts.append(f"{elapsed / ran:.1f} s/it")
            if math.isfinite(total):
                parts.append(f"ETA {duration(elapsed / ran * max(total - done, 0))}")
        parts += _values(trainer.callback_metrics, TRAIN_VALUES)
        self._write(" | ".join(parts))

    def on_validation_end(self, trainer, pl_module) -> None:
        if trainer.sanity_checking:
            return
        values = _values(trainer.callback_metrics, VAL_VALUES)
        gain = [float(trainer.callback_metrics[k]) for k in GAIN if k in trainer.callback_metrics]
        if values and len(gain) == 3:
            values.append(f"gain {gain[0]:+.3f} [{gain[1]:+.3f}, {gain[2]:+.3f}]")
        if values:
            where = f" at iteration {self._done}" if trainer.state.fn == "fit" else ""
            self._write(f"validation{where}: " + " | ".join(values))


def _values(metrics, keys: tuple[tuple[str, str], ...]) -> list[str]:
    """``name value`` (4 significant digits) of each of ``keys`` that ``metrics`` holds."""
    out = []
    for key, name in keys:
        if key in metrics:
            out.append(f"{name} {float(metrics[key]):.4g}")
    return out


def plain_lines_wanted(stream: TextIO | None = None) -> bool:
    """Whether the run should print :class:`IterationLines`: its stderr is not a terminal."""
    stream = stream if stream is not None else sys.stderr
    return not bool(getattr(stream, "isatty", lambda: False)())
