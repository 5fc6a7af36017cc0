"""The project's errors. For bad configuration: a ``ValueError`` whose message names the flag to fix, and
:class:`Domain`, the allowed values of one numeric setting.

The command line prints it as one line (``error: --data.group_size must be >= 2 ...``) and exits with status 2
instead of a traceback; library callers get an ordinary ``ValueError`` subclass.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any


class ConfigError(ValueError):
    """A configuration value or combination is invalid; the message names the flag."""


class TrainingStopped(RuntimeError):
    """Training cannot go on (e.g. every optimizer step of a network is being skipped); the message says why and
    which flags to check. The command line prints it as one line and exits with status 1."""


@dataclass(frozen=True)
class Domain:
    """The allowed values of a numeric setting: an interval (each end open or closed, or unbounded), integers only
    or any finite number, plus ``None`` and a few listed special values where the setting takes them.

    ``Domain(low=1, integer=True)`` is "an integer >= 1"; ``Domain(0, 1, low_open=True)`` is "a number in (0, 1]";
    ``Domain(low=1, integer=True, special=(-1,))`` is "-1 or an integer >= 1". NaN and infinities are outside every
    domain: a learning rate of ``.inf`` is not a setting, it is a typo.
    """

    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    integer: bool = False
    none: bool = False
    special: tuple[Any, ...] = ()

    def __contains__(self, value: Any) -> bool:
        if value is None:
            return self.none
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return False
        if value in self.special:
            return True
        if self.integer and not isinstance(value, int):
            return False
        if not math.isfinite(value):
            return False
        if self.low is not None and (value < self.low or (self.low_open and value == self.low)):
            return False
        return self.high is None or not (value > self.high or (self.high_open and value == self.high))

    def describe(self) -> str:
        kind = "an integer" if self.integer else "a finite number"
        if self.low is not None and self.high is not None:
            text = f"{kind} in {'(' if self.low_open else '['}{self.low:g}, {self.high:g}{')' if self.high_open else ']'}"
        elif self.low is not None:
            text = f"{kind} {'>' if self.low_open else '>='} {self.low:g}"
        elif self.high is not None:
            text = f"{kind} {'<' if self.high_open else '<='} {self.high:g}"
        else:
            text = kind
        extras = [repr(v) for v in self.special] + (["null"] if self.none else [])
        return " or ".join([*extras, text])

    def check(self, flag: str, value: Any, why: str = "") -> None:
        """Raise :class:`ConfigError` ``"<flag> must be <domain>, got <value>"`` (then ``why``) unless ``value`` is
        in the domain."""
        if value not in self:
            raise ConfigError(f"{flag} must be {self.describe()}, got {value!r}" + (f" ({why})" if why else ""))


def check_domains(prefix: str, values: Any, domains: dict[str, Domain]) -> None:
    """Check every ``name`` of ``domains`` present in ``values`` (a mapping or an object with attributes) against its
    domain; the flag is ``prefix + name`` (e.g. ``--data.`` + ``top_p``)."""
    for name, domain in domains.items():
        if isinstance(values, dict):
            if name not in values:
                continue
            value = values[name]
        elif hasattr(values, name):
            value = getattr(values, name)
        else:
            continue
        domain.check(f"{prefix}{name}", value)
