"""The tables of advantage estimators and filter strategies: Gymnasium's ``register`` / ``make``.

A config names an entry by its registered name (``rft``), as ``package.module:attr`` (imported on
first use) or as an installed entry point of the ``ragen_lightning.estimators`` /
``ragen_lightning.filters`` groups (as ``ragen_lightning.envs`` names env packages). Each entry
declares its options dataclass, whose fields are the ``--model.advantage.options.*`` /
``--data.filter.options.*`` settings. A user's estimator with its own option is one file, selected
as ``advantage: {estimator: mypkg.reinforce:reinforce, options: {baseline: 0.5}}``::

    @dataclass(frozen=True)
    class ReinforceOptions:
        baseline: float = 0.0

    def reinforce(batch, rewards, mask, values, options):
        adv = broadcast_to_tokens(batch.scores.float() - options.baseline, mask)
        return adv, adv, {}

    register_estimator("reinforce", reinforce, options=ReinforceOptions)

The built-ins are registered where they are defined (:mod:`ragen_lightning.starpo.estimators`,
:mod:`ragen_lightning.algos.filtering`); this module is stdlib-only so that ``algos`` can use it.
"""

from __future__ import annotations

import dataclasses
import importlib
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from importlib import metadata
from typing import Any

from ragen_lightning.errors import ConfigError, Domain

ESTIMATOR_FLAG = "--model.advantage.estimator"
ESTIMATOR_OPTIONS = "--model.advantage.options."
FILTER_FLAG = "--data.filter.strategy"
FILTER_OPTIONS = "--data.filter.options."
ESTIMATOR_GROUP = "ragen_lightning.estimators"
FILTER_GROUP = "ragen_lightning.filters"

# (batch, token rewards [B, T-1], loss mask [B, T-1], values [B, T-1] or None, options)
#   -> (advantages [B, T-1], returns [B, T-1], logs)
EstimatorFn = Callable[..., Any]
# (scores [C] of the candidate groups, value, *, largest, num_groups, options) -> kept positions
SelectFn = Callable[..., Any]


@dataclass(frozen=True)
class Estimator:
    """One advantage estimator and what it needs.

    Args:
        name: its name in the table.
        fn: ``fn(batch, rewards, mask, values, options) -> (advantages, returns, logs)``. options:
        its options dataclass (``--model.advantage.options.*``; None: it takes none). critic: a
        critic is built and its values passed in (else ``values`` is None). groups: needs groups of
        >= 2 samples (``--data.training.group_size``): it compares a group's members. outcome: one
        score per episode compared across episodes (``length_weight`` applies). per_sample: scores
        each sample by its own turn reward (``--data.branching.branches > 1`` may feed it).
        branching: needs branching rollouts (``--data.branching.branches >= 2``, ``reward_placement
        turn``). sparse_rows: advantage 0 on every token of many rows: the update leaves those rows
        out. whole_states: with ``sparse_rows``, a state's rows stay or go together (its statistics
            count all of them).
    """

    name: str
    fn: EstimatorFn
    options: type | None = None
    critic: bool = False
    groups: bool = False
    outcome: bool = False
    per_sample: bool = False
    branching: bool = False
    sparse_rows: bool = False
    whole_states: bool = False

    def make_options(self, given: Any = None) -> Any:
        """``given`` (None: the defaults, a mapping or an instance) as this estimator's options."""
        return build_options(
            self.options, given, ESTIMATOR_OPTIONS, f"{ESTIMATOR_FLAG} {self.name}"
        )


@dataclass(frozen=True)
class FilterStrategy:
    """One group-selection strategy (``--data.filter.strategy``).

    Args:
        name: its name in the table.
        select: ``select(scores, value, *, largest, num_groups, options) -> positions``: which of
            the candidate groups' ``scores`` ``[C]`` to keep (any order; ``num_groups`` counts every
            group, before zero scores were dropped).
        options: its options dataclass (``--data.filter.options.*``; None: it takes none).
        value_domain: the allowed ``--data.filter.value``.
        value_help: what the value means, for messages.
        keeps_all: ``keeps_all(value)`` True when the strategy keeps every group whatever the scores
            (the filter is then skipped, and with ``include_zero`` keeps everything).
        whole_value: the value must be a whole number.
    """

    name: str
    select: SelectFn
    options: type | None = None
    value_domain: Domain = Domain()  # noqa: RUF009 (frozen)
    value_help: str = ""
    keeps_all: Callable[[float], bool] | None = None
    whole_value: bool = False

    def make_options(self, given: Any = None) -> Any:
        """``given`` (None: the defaults, a mapping or an instance) as this strategy's options."""
        return build_options(self.options, given, FILTER_OPTIONS, f"{FILTER_FLAG} {self.name}")


ESTIMATORS: dict[str, Estimator] = {}
FILTERS: dict[str, FilterStrategy] = {}
_RESOLVED: dict[tuple[str, str], Any] = {}  # (group, module:attr or entry point) -> entry


def register_estimator(
    name: str, fn: EstimatorFn, *, options: type | None = None, **needs: bool
) -> Estimator:
    """Add (or replace) the estimator ``name`` (``needs``: the flags of :class:`Estimator`)."""
    ESTIMATORS[name] = Estimator(name, fn, options, **needs)
    return ESTIMATORS[name]


def register_filter(
    name: str, select: SelectFn, *, options: type | None = None, **fields: Any
) -> FilterStrategy:
    """Add (or replace) the strategy ``name`` (``fields``: those of :class:`FilterStrategy`)."""
    FILTERS[name] = FilterStrategy(name, select, options, **fields)
    return FILTERS[name]


def get_estimator(name: str) -> Estimator:
    """The estimator a config names; else a :class:`ConfigError` listing the registered ones."""
    return _lookup(ESTIMATORS, Estimator, name, ESTIMATOR_GROUP, ESTIMATOR_FLAG)


def get_filter(name: str) -> FilterStrategy:
    """The strategy a config names; else a :class:`ConfigError` listing the registered ones."""
    return _lookup(FILTERS, FilterStrategy, name, FILTER_GROUP, FILTER_FLAG)


def _lookup(table: dict[str, Any], kind: type, name: str, group: str, flag: str) -> Any:
    if name in table:
        return table[name]
    if (group, name) in _RESOLVED:
        return _RESOLVED[(group, name)]
    if ":" in name:
        obj = _import(table, name, flag)
    else:
        found = [ep for ep in metadata.entry_points(group=group) if ep.name == name]
        if not found:
            raise ConfigError(
                f"{flag} must be one of {', '.join(table)} (or a module:name, an installed "
                f"{group!r} entry point, or one registered with ragen_lightning.registry), "
                f"got {name!r}"
            )
        try:
            obj = found[0].load()
        except (ImportError, AttributeError) as e:
            raise ConfigError(
                f"{flag} {name}: its {group!r} entry point {found[0].value} cannot be loaded ({e})"
            ) from None
    entry = _as_entry(table, kind, obj, name, flag)
    _RESOLVED[(group, name)] = entry
    return entry


def _import(table: dict[str, Any], name: str, flag: str) -> Any:
    """The object ``module:attr`` names (importing the module registers what it registers)."""
    module, _, attr = name.partition(":")
    try:
        loaded = importlib.import_module(module)
    except ImportError as e:
        raise ConfigError(f"{flag} {name}: cannot import {module!r} ({e})") from None
    if hasattr(loaded, attr):
        return getattr(loaded, attr)
    if attr in table:  # the module registered the name
        return table[attr]
    raise ConfigError(f"{flag} {name}: module {module!r} has no {attr!r}")


def _as_entry(table: dict[str, Any], kind: type, obj: Any, name: str, flag: str) -> Any:
    """``obj`` as a table entry: an entry as is, a registered function as its entry, another
    function as a new entry without options."""
    if isinstance(obj, kind):
        return obj
    function = "fn" if kind is Estimator else "select"
    for entry in table.values():
        if getattr(entry, function) is obj:
            return entry
    if callable(obj):
        return kind(name, obj)
    raise ConfigError(
        f"{flag} {name} is a {type(obj).__name__}, not a function or a registered entry"
    )


# -- options ------------------------------------------------------------------------------------
def build_options(cls: type | None, given: Any, prefix: str, owner: str) -> Any:
    """``given`` as an instance of the options dataclass ``cls``: None gives the defaults, an
    instance stays, a mapping is checked key by key (an unknown key or a value of the wrong type is
    a :class:`ConfigError` naming ``prefix + key``); the dataclass's own ``__post_init__`` checks
    the values' domains. ``owner`` names the entry (``--model.advantage.estimator rft``)."""
    if cls is None:
        if given is None or given == {}:
            return None
        if isinstance(given, Mapping):
            raise ConfigError(f"{prefix}{next(iter(given))} is not an option: {owner} takes none")
        raise ConfigError(f"{prefix[:-1]} {given!r}: {owner} takes no options")
    if given is None:
        return cls()
    if isinstance(given, cls):
        return given
    if not isinstance(given, Mapping):
        raise ConfigError(
            f"{prefix[:-1]} must be a mapping of the options of {owner}, got {given!r}"
        )
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    values = dict(given)
    for key, value in values.items():
        if key not in names:
            raise ConfigError(
                f"{prefix}{key} is not an option of {owner}; its options: {', '.join(names)}"
            )
        values[key] = _typed(f"{prefix}{key}", hints[key], value)
    return cls(**values)


def _typed(flag: str, hint: Any, value: Any) -> Any:
    """``value`` checked against a simple type hint (bool, int, float, str, Literal, ``X | None``);
    a whole number is accepted for a float (and becomes one). Other hints are left to the class."""
    if value is None and type(None) in typing.get_args(hint):
        return value
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    base = args[0] if typing.get_origin(hint) in (typing.Union, _UNION) and len(args) == 1 else hint
    if typing.get_origin(base) is typing.Literal:
        if value not in typing.get_args(base):
            choices = " | ".join(map(str, typing.get_args(base)))
            raise ConfigError(f"{flag} must be {choices}, got {value!r}")
        return value
    ok = {
        bool: isinstance(value, bool),
        str: isinstance(value, str),
        int: isinstance(value, int) and not isinstance(value, bool),
        float: isinstance(value, (int, float)) and not isinstance(value, bool),
    }.get(base, True)
    if not ok:
        raise ConfigError(f"{flag} must be {_KIND.get(base, base.__name__)}, got {value!r}")
    return float(value) if base is float else value


_UNION = type(int | None)
_KIND = {bool: "true or false", int: "a whole number", float: "a number", str: "a string"}
