"""Progress of the long steps (warm start, its demonstrations, evaluation, export) on stderr, so a quiet minute
never looks like a hang.

:class:`Progress` reports ``done/total`` with the rate, the time left and the latest values (a loss)::

    warm start: 120/700 steps (17%) | 1.52 s/step | ETA 14:41 | loss 0.4123

at most every ``every`` seconds and once at the end (the end line gives the total time in place of the ETA). On a
terminal it rewrites one line in place (``\\r``); otherwise (a log file, a pipe) it writes plain lines. :func:`note`
prints one line (a cached result found, an export written). Only rank 0 of a multi-process run prints
(:func:`is_rank_zero`). The clock and the stream are arguments, so tests drive them by hand.

Standard library only: any layer may use it.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from typing import TextIO

# plain lines (a log) at most this often, an in-place terminal line at most this often
LOG_EVERY_S = 10.0
TTY_EVERY_S = 1.0
# the environment variables launchers set to a process's global rank, in the order Lightning reads
# them
RANK_ENV_VARS = ("RANK", "LOCAL_RANK", "SLURM_PROCID", "JSM_NAMESPACE_RANK")


def is_rank_zero() -> bool:
    """Whether this process is rank 0: of the initialised ``torch.distributed`` group, else of the
    launcher's environment (:data:`RANK_ENV_VARS`); a single process is rank 0."""
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        return dist.get_rank() == 0
    for name in RANK_ENV_VARS:
        value = os.environ.get(name, "").strip()
        if value.isdigit():
            return int(value) == 0
    return True


def duration(seconds: float) -> str:
    """``M:SS`` below an hour, else ``H:MM:SS`` (rounded to the second)."""
    s = round(max(seconds, 0.0))
    return (
        f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"
    )


def rate(done: int, elapsed: float, unit: str) -> str:
    """``1.52 s/step`` when a unit takes a second or more, else ``12.3 steps/s``; ``-`` before the
    first one."""
    if done <= 0 or elapsed <= 0:
        return "-"
    per = elapsed / done
    return f"{per:.2f} s/{unit}" if per >= 1.0 else f"{done / elapsed:.1f} {unit}s/s"


def note(message: str, stream: TextIO | None = None) -> None:
    """Print ``message`` as one line on ``stream`` (default: stderr), on rank 0 only."""
    if is_rank_zero():
        out = stream if stream is not None else sys.stderr
        out.write(message + "\n")
        out.flush()


class Progress:
    """Reports ``done`` of ``total`` units of ``label`` (module docstring for the line).

    Args:
        label: what is running, e.g. ``warm start``.
        total: units to do (>= 0). unit: the unit's name, singular (``step``, ``episode``); the
        plural adds an ``s``. every: seconds between two reports (None: 1 s on a terminal, 10 s
        otherwise). stream: where to write (None: stderr, looked up when the reporter is made).
        clock: seconds, monotonic (``time.monotonic``; a test passes its own). tty: rewrite one line
        in place (None: whether ``stream`` is a terminal). enabled: report at all (None: on rank 0
        only, :func:`is_rank_zero`). initial: units done before this run (a resumed evaluation):
        counted in ``done``, not in the rate.

    Made, it reports ``initial/total``; :meth:`update` after each unit (or batch of units) reports
    when ``every`` seconds passed since the last report and units remain; :meth:`close` (or leaving
    the ``with`` block without an error) reports the end line.
    """

    def __init__(
        self,
        label: str,
        total: int,
        *,
        unit: str = "step",
        every: float | None = None,
        stream: TextIO | None = None,
        clock: Callable[[], float] = time.monotonic,
        tty: bool | None = None,
        enabled: bool | None = None,
        initial: int = 0,
    ):
        if total < 0:
            raise ValueError(f"progress of {label!r}: total must be >= 0, got {total}")
        self.label, self.total, self.unit = label, total, unit
        self.stream = stream if stream is not None else sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)()) if tty is None else tty
        self.every = every if every is not None else (TTY_EVERY_S if self.tty else LOG_EVERY_S)
        self.clock = clock
        self.enabled = is_rank_zero() if enabled is None else enabled
        self.initial = self.done = initial
        self.values: dict[str, float | str] = {}
        self.closed = False
        self._width = 0  # length of the line on screen (tty), to blank a longer predecessor
        self.start = self.clock()
        self._last = self.start
        self._write(self.line(self.start), final=False)

    def line(self, now: float, final: bool = False) -> str:
        """The report at time ``now``: ``label: done/total units (pct%) | rate | ETA m:ss | name
        value ...``."""
        elapsed = now - self.start
        pct = f" ({100 * self.done // self.total}%)" if self.total else ""
        ran = self.done - self.initial
        parts = [
            f"{self.label}: {self.done}/{self.total} {self.unit}s{pct}",
            rate(ran, elapsed, self.unit),
        ]
        if final:
            parts.append(f"{duration(elapsed)} total")
        elif ran > 0:
            parts.append(f"ETA {duration(elapsed / ran * max(self.total - self.done, 0))}")
        parts += [
            f"{name} {value:.4g}" if isinstance(value, float) else f"{name} {value}"
            for name, value in self.values.items()
        ]
        return " | ".join(p for p in parts if p != "-")

    def update(self, done: int, **values: float | str) -> None:
        """``done`` units so far and the latest ``values`` (e.g. ``loss=0.41``: a float shows 4
        significant digits, anything else as it prints); reports when it is time."""
        self.done = done
        self.values.update(values)
        now = self.clock()
        # the last unit: close() reports it
        if now - self._last >= self.every and self.done < self.total:
            self._last = now
            self._write(self.line(now), final=False)

    def close(self, **values: float | str) -> None:
        """Report the end line once (later calls do nothing)."""
        if self.closed:
            return
        self.closed = True
        self.values.update(values)
        self._write(self.line(self.clock(), final=True), final=True)

    def __enter__(self) -> Progress:  # noqa: PYI034 (typing.Self needs Python 3.11)
        return self

    def __exit__(self, *exc) -> None:
        if exc[0] is None:
            self.close()
        # an error: end the in-place line, report no end
        elif self.tty and self.enabled and self._width:
            self.stream.write("\n")
            self.stream.flush()

    def _write(self, line: str, final: bool) -> None:
        if not self.enabled:
            return
        if self.tty:
            text = "\r" + line + " " * max(self._width - len(line), 0) + ("\n" if final else "")
            self._width = 0 if final else len(line)
        else:
            text = line + "\n"
        self.stream.write(text)
        self.stream.flush()
