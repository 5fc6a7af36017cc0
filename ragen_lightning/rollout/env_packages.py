"""The environment packages installed beside the library, found through package metadata, never by
name.

A package that registers gymnasium ids declares itself in the ``ragen_lightning.envs`` entry-point
group of its distribution; this project's own ``envs`` package does so in pyproject.toml::

    [project.entry-points."ragen_lightning.envs"]
    envs = "envs"

:func:`import_env_packages` imports every declared package, so the ids they register resolve in ``gymnasium.make``.
It is how ``python -m ragen_lightning.evaluate`` and ``python -m ragen_lightning.sft.warm_start``
find envs without ``--import``, and how the tiny model finds the envs its tokenizer corpus is
rendered from. The library never names an env package itself (tests/unit/test_layering.py checks
that, string imports included); ``main.py``, outside the library, imports ``envs`` directly. Entry
points are read from the installed metadata: a package's new entry point is seen after ``pip install
-e .`` re-runs.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from importlib import metadata

ENTRY_POINT_GROUP = "ragen_lightning.envs"


def env_packages() -> list[str]:
    """The modules of the installed env packages: the ``ragen_lightning.envs`` entry points (ordered
    by name, each module once)."""
    points = sorted(
        metadata.entry_points(group=ENTRY_POINT_GROUP), key=lambda ep: (ep.name, ep.value)
    )
    return list(dict.fromkeys(ep.module for ep in points))


def import_env_packages(modules: Sequence[str] | None = None) -> list[str]:
    """Import ``modules`` (None: every installed env package, :func:`env_packages`) so that the
    gymnasium ids they register resolve; returns their names.

    Raises:
        ImportError: a module cannot be imported (the message names it).
    """
    names = env_packages() if modules is None else list(modules)
    for name in names:
        try:
            importlib.import_module(name)
        except ImportError as e:
            where = (
                f" (an installed {ENTRY_POINT_GROUP!r} entry point names it)"
                if modules is None
                else ""
            )
            raise ImportError(f"env package {name!r} cannot be imported{where}: {e}") from e
    return names
