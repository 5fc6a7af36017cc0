"""Data modules for tests, with single settings written by their flat names of before the groups:
``RENAMED`` (the command line's old -> new map) places each in its group, so a test reads
``dm(num_groups=3)`` and the map's every entry is exercised."""

from __future__ import annotations

from typing import Any

from ragen_lightning.data.datamodule import RolloutDataModule
from ragen_lightning.data.settings import RENAMED


def grouped(**flat: Any) -> dict[str, Any]:
    """``flat`` settings as the data module's groups: ``{"num_groups": 3}`` -> ``{"training":
    {"num_groups": 3}}``; a group (``episode``, ``filter``, ``engine`` as a mapping) passes as it
    is, ``engine="hf"`` names the engine."""
    out: dict[str, Any] = {}
    for name, value in flat.items():
        if name == "engine" and isinstance(value, str):
            out.setdefault("engine", {})["name"] = value
        elif name in RENAMED:
            group, field = RENAMED[name].split(".", 1)
            out.setdefault(group, {})[field] = value
        else:
            out[name] = value
    return out


def data_module(**flat: Any) -> RolloutDataModule:
    return RolloutDataModule(**grouped(**flat))


def data_view(
    group_size: int = 2, branches: int = 1, reward_placement: str = "turn", async_level: int = 0
) -> Any:
    """The data settings ``check_data_settings`` reads, unchecked (the data groups' own checks are
    tested with them), so a combination the estimator table refuses can be built."""
    from types import SimpleNamespace as NS

    return NS(
        training=NS(group_size=group_size, async_level=async_level),
        branching=NS(branches=branches),
        rewards=NS(placement=reward_placement),
    )
