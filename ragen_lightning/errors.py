"""The project's errors, and the third-party warnings it silences as harmless.

For bad configuration: a ``ValueError`` whose message names the flag to fix, and :class:`Domain`,
the allowed values of one numeric setting. The command line prints it as one line (``error:
--data.training.group_size must be >= 2 ...``) and exits with status 2 instead of a traceback;
library callers get an ordinary ``ValueError`` subclass.

:data:`HARMLESS_WARNINGS`: third-party warnings that every run printed and that say nothing about the run, filtered
by the command line (:func:`filter_harmless_warnings`) and by the test suite (tests/conftest.py),
each with the reason it is harmless. Anything not listed still shows.

Standard library only (a leaf of the import graph), so the test suite can import it without
Lightning.
"""

from __future__ import annotations

import logging
import math
import warnings
from dataclasses import dataclass
from typing import Any


class ConfigError(ValueError):
    """A configuration value or combination is invalid; the message names the flag."""


class TrainingStopped(RuntimeError):
    """Training cannot go on (e.g. every optimizer step of a network is being skipped); the message
    says why and which flags to check. The command line prints it as one line and exits with status
    1."""


@dataclass(frozen=True)
class Domain:
    """The allowed values of a numeric setting: an interval (each end open or closed, or unbounded),
    integers only or any finite number, plus ``None`` and a few listed special values where the
    setting takes them.

    ``Domain(low=1, integer=True)`` is "an integer >= 1"; ``Domain(0, 1, low_open=True)`` is "a
    number in (0, 1]"; ``Domain(low=1, integer=True, special=(-1,))`` is "-1 or an integer >= 1".
    NaN and infinities are outside every domain: a learning rate of ``.inf`` is not a setting, it is
    a typo.
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
        return self.high is None or not (
            value > self.high or (self.high_open and value == self.high)
        )

    def describe(self) -> str:
        kind = "an integer" if self.integer else "a finite number"
        if self.low is not None and self.high is not None:
            text = (
                f"{kind} in {'(' if self.low_open else '['}{_num(self.low)}, {_num(self.high)}"
                + (")" if self.high_open else "]")
            )
        elif self.low is not None:
            text = f"{kind} {'>' if self.low_open else '>='} {_num(self.low)}"
        elif self.high is not None:
            text = f"{kind} {'<' if self.high_open else '<='} {_num(self.high)}"
        else:
            text = kind
        extras = [repr(v) for v in self.special] + (["null"] if self.none else [])
        return " or ".join([*extras, text])

    def check(self, flag: str, value: Any, why: str = "") -> None:
        """Raise :class:`ConfigError` ``"<flag> must be <domain>, got <value>"`` (then ``why``)
        unless ``value`` is in the domain."""
        if value not in self:
            raise ConfigError(
                f"{flag} must be {self.describe()}, got {value!r}" + (f" ({why})" if why else "")
            )


def _num(value: float) -> str:
    """A bound as written: whole numbers in full (``4294967295``, not ``4.29497e+09``), others as
    ``%g``."""
    return str(int(value)) if float(value).is_integer() and abs(value) < 1e16 else f"{value:g}"


def check_domains(prefix: str, values: Any, domains: dict[str, Domain]) -> None:
    """Check every ``name`` of ``domains`` present in ``values`` (a mapping or an object with
    attributes) against its domain; the flag is ``prefix + name`` (e.g. ``--data.`` + ``top_p``)."""
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


# -- harmless third-party warnings -----------------------------------------------------------------
# (message regex matched at the start of the warning's text, category, why it is harmless)
HARMLESS_WARNINGS: tuple[tuple[str, type[Warning], str], ...] = (
    (
        r"You are using the `dataloader_iter` step flavor",
        UserWarning,
        "StarPOModule.training_step pulls exactly one rollout batch per step (the warning is about consuming it twice)",
    ),
    (
        r"Found `dataloader_iter` argument in the `training_step`",
        UserWarning,
        "the dataloader_iter signature is deliberate (no pre-fetched stale rollouts); Lightning flags it experimental",
    ),
    (
        r"Your `IterableDataset` has `__len__` defined",
        UserWarning,
        "the rollout stream always runs with num_workers=0, where its length is exact",
    ),
    (
        r"It is recommended to use `self.log\('val",
        UserWarning,
        "validation metrics are logged with sync_dist=True; the warning fires because vLLM's in-process engine starts "
        "a one-process torch.distributed group, where there is nothing to sync",
    ),
    (
        r"`isinstance\(treespec, LeafSpec\)` is deprecated",
        Warning,
        "Lightning 2.6 calls a torch API that torch 2.13 deprecated; behaviour unchanged",
    ),
    (
        r"`torch.distributed.reduce_op` is deprecated",
        FutureWarning,
        "vLLM's triton dispatcher scans torch.distributed's attributes at import; nothing calls reduce_op",
    ),
    (
        r"\s*By default only one JsonargparseDeprecationWarning per type is shown",
        Warning,
        "jsonargparse's preamble to the next entry",
    ),
    (
        r"\s*[^\n]{0,80} was deprecated in v4\.49\.0",
        Warning,
        "LightningCLI 2.6 calls jsonargparse APIs (add_instantiator, instantiate_classes, skip_none) that jsonargparse "
        "4.49 deprecated for removal in 5.0; behaviour unchanged, and jsonargparse is kept below 5 by lightning",
    ),
)
# Lightning's info line advertising its cloud logger on every fit
LIGHTNING_ADVERT = "try installing [litlogger]"


def _not_an_advert(record: logging.LogRecord) -> bool:
    return LIGHTNING_ADVERT not in record.getMessage()


def filter_harmless_warnings() -> None:
    """Silence :data:`HARMLESS_WARNINGS` in this process, and Lightning's logger advertisement
    (idempotent)."""
    for message, category, _why in HARMLESS_WARNINGS:
        warnings.filterwarnings("ignore", message=message, category=category)
    logger = logging.getLogger("lightning.pytorch.utilities.rank_zero")
    if _not_an_advert not in logger.filters:
        logger.addFilter(_not_an_advert)
