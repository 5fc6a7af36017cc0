"""Suites of environments: ``{env_id, env_kwargs, num_episodes, tag}`` entries, read from YAML or
flags.

A suite names what one evaluation (``python -m ragen_lightning.evaluate``) runs: each entry is one
environment configuration with its episode count and a tag that identifies it in reports and
exported trajectories (two entries of the same env with different kwargs need different tags). An
entry may also override episode settings for its env (``episode: {max_turns: 1}`` for a one-turn
bandit beside multi-turn grids). The entry type is kept apart from the evaluation so that
training-time env mixtures reuse it: the data module's ``--data.env.mixture`` and
``--data.validation.suite`` entries (:mod:`ragen_lightning.data.mixture`) are the same type, their
count written ``num_groups`` (see :attr:`SuiteEntry.num_episodes`).

YAML: a list of entries, or a mapping with a ``suite`` list::

    suite:
      - {env_id: ragen/Bandit-v0, num_episodes: 64, episode: {max_turns: 1}}
      - {env_id: ragen/Sokoban-v0, env_kwargs: {dim_room: [6, 6], num_boxes: 1}, num_episodes: 128, tag: sokoban6}
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

from ragen_lightning.errors import ConfigError
from ragen_lightning.rollout.settings import EpisodeSettings


@dataclass(frozen=True)
class SuiteEntry:
    """One environment configuration of a suite.

    Args:
        env_id: a registered gymnasium id (``ragen/Sokoban-v0``; ``module:id`` imports the module first).
        env_kwargs: keyword arguments of the env. num_episodes: distinct reset seeds (initial
        states) to run: the episodes of an evaluation pass; in the data
            module's mixtures the key is ``num_groups`` (each seed is one group of ``group_size`` rollouts), the
            same field under its training name (:func:`as_entry`'s ``count``).
        tag: the entry's name in reports and exports; default the env id. episode: episode settings
        that differ for this env (keys of ``EpisodeSettings``), over the run's own.
    """

    env_id: str
    env_kwargs: dict[str, Any] | None = None
    num_episodes: int = 64
    tag: str = ""
    episode: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.env_id, str) or not self.env_id:
            raise ConfigError(
                f"suite entry: env_id must be a non-empty string, got {self.env_id!r}"
            )
        where = f"suite entry {self.tag or self.env_id!r}"
        if (
            isinstance(self.num_episodes, bool)
            or not isinstance(self.num_episodes, int)
            or self.num_episodes < 1
        ):
            raise ConfigError(
                f"{where}: num_episodes must be an integer >= 1, got {self.num_episodes!r}"
            )
        for name in ("env_kwargs", "episode"):
            if getattr(self, name) is not None and not isinstance(getattr(self, name), dict):
                raise ConfigError(f"{where}: {name} must be a mapping, got {getattr(self, name)!r}")
        if not isinstance(self.tag, str):
            raise ConfigError(f"{where}: tag must be a string, got {self.tag!r}")
        if not self.tag:
            object.__setattr__(self, "tag", self.env_id)
        unknown = set(self.episode or {}) - {f.name for f in fields(EpisodeSettings)}
        if unknown:
            raise ConfigError(
                f"{where}: unknown episode setting(s) {sorted(unknown)}; valid: "
                f"{[f.name for f in fields(EpisodeSettings)]}"
            )

    @property
    def num_groups(self) -> int:
        """The count under its training name: groups of a ``--data.env.mixture`` /
        ``--data.validation.suite`` entry."""
        return self.num_episodes

    def episode_settings(self, base: EpisodeSettings) -> EpisodeSettings:
        """``base`` with this entry's overrides (their values are checked like
        ``--data.episode.*``)."""
        if not self.episode:
            return base
        try:
            return replace(base, **self.episode)
        except ValueError as e:
            raise ConfigError(f"suite entry {self.tag!r}: episode: {e}") from None


def as_entry(
    value: Any,
    where: str = "suite entry",
    *,
    count: str = "num_episodes",
    default_count: int | None = None,
) -> SuiteEntry:
    """A :class:`SuiteEntry` from a mapping (unknown keys are an error naming ``where``).

    ``count`` is the name of the count key: ``num_episodes`` in an evaluation suite, ``num_groups``
    in the data module's mixtures (the other name is then an unknown key); an entry without it gets
    ``default_count`` (None: the field's default).
    """
    if isinstance(value, SuiteEntry):
        return value
    if not isinstance(value, dict):
        raise ConfigError(
            f"{where}: expected a mapping with env_id, env_kwargs, {count}, tag, got {value!r}"
        )
    known = {f.name for f in fields(SuiteEntry)} - {"num_episodes"} | {count}
    if unknown := set(value) - known:
        raise ConfigError(
            f"{where}: unknown key(s) {sorted(unknown)}; an entry takes {sorted(known)}"
        )
    if "env_id" not in value:
        raise ConfigError(f"{where}: env_id is missing")
    if count != "num_episodes":
        value = dict(value)
        n = value.pop(count, default_count)
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ConfigError(f"{where}: {count} must be an integer >= 1, got {n!r}")
        value["num_episodes"] = n
    elif default_count is not None:
        value = {"num_episodes": default_count, **value}
    try:
        return SuiteEntry(**value)
    except ConfigError as e:
        raise ConfigError(f"{where}: {e}") from None


def check_suite(entries: list[SuiteEntry]) -> list[SuiteEntry]:
    """``entries`` unchanged when there is at least one and the tags are distinct; a
    :class:`ConfigError` otherwise."""
    if not entries:
        raise ConfigError("the suite is empty: give --suite FILE, --entry or --data.env.id")
    seen: dict[str, int] = {}
    for i, e in enumerate(entries):
        if e.tag in seen:
            raise ConfigError(
                f"suite entries {seen[e.tag]} and {i} share the tag {e.tag!r}: give each its own tag"
            )
        seen[e.tag] = i
    return entries


def load_suite(path: str | Path) -> list[SuiteEntry]:
    """The entries of a suite YAML file (module docstring); errors name the file and the entry."""
    import yaml

    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as e:
        raise ConfigError(f"--suite {path}: cannot read it ({e.strerror})") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"--suite {path}: not valid YAML ({str(e).splitlines()[0]})") from None
    if isinstance(data, dict) and set(data) == {"suite"}:
        data = data["suite"]
    if not isinstance(data, list):
        raise ConfigError(
            f"--suite {path}: expected a list of entries (or a mapping with a 'suite' list)"
        )
    return check_suite([as_entry(v, f"--suite {path}: entry {i}") for i, v in enumerate(data)])
