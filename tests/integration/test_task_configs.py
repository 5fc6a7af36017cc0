"""Task configs and overlays compose: a model / recipe overlay over sokoban_starpo*.yaml changes no
algorithm setting (the parsed configuration, not just the YAML), and the StarPO-S command of
docs/configs.md parses to StarPO-S."""

from __future__ import annotations

import functools
from pathlib import Path

import pytest

from tests.integration.test_configs import CONFIGS, ParseOnly
from tests.unit.test_config_overlays import ALGORITHM_KEYS, TASKS

OVERLAYS = sorted([*(CONFIGS / "models").glob("*.yaml"), *(CONFIGS / "recipes").glob("*.yaml")])


def parse(*configs: Path):
    """The parsed configuration; no --gpu_memory_gb refusal (the 1.5B full recipe with a critic does
    not fit 24 GiB, the composition is what is checked here)."""
    from ragen_lightning.data.datamodule import RolloutDataModule
    from ragen_lightning.starpo.module import StarPOModule

    args = [*(a for c in configs for a in ("--config", str(c))), "--gpu_memory_gb", "null"]
    return ParseOnly(StarPOModule, RolloutDataModule, args=args, run=False).config


def algorithm_settings(cfg) -> dict[str, object]:
    flat = cfg.as_dict()
    out = {}
    for key in ALGORITHM_KEYS:
        node = flat
        for part in key.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        out[key] = node
    return out


@functools.cache
def settings_alone(task: Path) -> dict[str, object]:
    """The task config's own algorithm settings, parsed once for all the overlays compared to it
    (only compared, never changed)."""
    return algorithm_settings(parse(task))


@pytest.mark.parametrize("task", TASKS, ids=lambda p: p.stem)
@pytest.mark.parametrize("overlay", OVERLAYS, ids=lambda p: p.stem)
def test_an_overlay_changes_no_algorithm_setting(task: Path, overlay: Path):
    assert algorithm_settings(parse(task, overlay)) == settings_alone(task)


def test_starpo_s_on_qwen_05b_parses_to_starpo_s():
    cfg = parse(
        CONFIGS / "sokoban_starpo_s.yaml", CONFIGS / "models" / "qwen2.5-0.5b-instruct.yaml"
    )
    model, data = cfg.model.as_dict(), cfg.data.as_dict()
    assert model["model"] == "Qwen/Qwen2.5-0.5B-Instruct" and model["warm_start"] is False
    assert (model["optim"]["actor_lr"], model["optim"]["critic_lr"]) == (1e-6, 1e-5)
    assert model["advantage"]["estimator"] == "gae" and model["loss"]["kl_coef"] == 0.0
    assert (model["loss"]["clip_low"], model["loss"]["clip_high"]) == (0.2, 0.28)
    assert (
        data["filter"]["strategy"],
        data["filter"]["value"],
        data["filter"]["include_zero"],
    ) == ("top_p", 0.9, False)
    training = data["training"]
    assert (training["num_groups"], training["group_size"], training["num_iterations"]) == (
        8,
        16,
        200,
    )
    assert (
        data["episode"]["max_turns"],
        data["episode"]["max_new_tokens"],
        data["episode"]["max_model_len"],
    ) == (5, 400, 3600)
    assert (
        data["engine"]["name"] == "vllm" and data["engine"]["vllm"]["gpu_memory_utilization"] == 0.4
    )
