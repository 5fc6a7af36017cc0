"""Configs compose: a task config names the env, the episode and the algorithm; a model / hardware /
engine overlay names none of it (docs/configs.md, "The rule"), so an overlay never has to reset an
algorithm setting."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

CONFIGS = Path(__file__).resolve().parents[2] / "configs"

# The definition of an algorithm key (docs/configs.md repeats it): a setting that changes what is
# optimised or what data is collected. Everything else (model, dtype, warm start, LoRA, learning
# rates and optimizer classes, micro-batch size, activation checkpointing, logits chunks, threads,
# trainer.*, the engine group data.engine.* (max_batch_size, vllm), max_model_len, max_new_tokens,
# validation size) is a model / hardware / memory setting an overlay may set.
ALGORITHM_KEYS = (
    "model.advantage",
    "model.loss",
    "model.critic.model",
    "model.critic.value_clip",
    "model.update.ppo_epochs",
    "model.update.mini_batch_size",
    "model.update.shuffle",
    "model.optim.warmup_steps",
    "model.optim.decay_iterations",
    "model.optim.weight_decay",
    "model.optim.grad_clip",
    "model.optim.max_step_kl",
    "data.env",
    "data.validation.suite",
    "data.validation.temperature",
    "data.validation.group_size",
    "data.filter",
    "data.training.empty_stop_steps",
    "data.training.group_size",
    "data.training.num_groups",
    "data.training.num_iterations",
    "data.training.async_level",
    "data.branching",
    "data.rewards",
    "data.sampling",
    "data.episode.max_turns",
    "data.episode.max_actions_per_turn",
    "data.episode.max_actions_per_episode",
    "data.episode.context_window",
    "data.episode.window_turns",
    "data.episode.enable_think",
    "data.episode.observation_last",
    "data.episode.format_penalty",
    "data.episode.action_format",
    "data.episode.stop",
)
OVERLAYS = sorted(
    [
        *(CONFIGS / "models").glob("*.yaml"),
        *(CONFIGS / "recipes").glob("*.yaml"),
        *(CONFIGS / "engines").glob("*.yaml"),
        *(
            CONFIGS / name
            for name in (
                "lora.yaml",
                "qlora.yaml",
                "ddp.yaml",
                "fsdp.yaml",
                "fsdp1.yaml",
                "diagnostics.yaml",
            )
        ),
    ]
)
TASKS = [CONFIGS / "sokoban_starpo.yaml", CONFIGS / "sokoban_starpo_s.yaml"]


def dotted_keys(tree: Any, prefix: str = "") -> list[str]:
    """Every leaf of a YAML mapping as a dotted key (``model.update.micro_batch_size``)."""
    if not isinstance(tree, dict):
        return [prefix]
    return [
        k
        for name, sub in tree.items()
        for k in dotted_keys(sub, f"{prefix}.{name}" if prefix else str(name))
    ]


def algorithm_keys(keys: list[str]) -> list[str]:
    return [k for k in keys if any(k == a or k.startswith(a + ".") for a in ALGORITHM_KEYS)]


def test_the_rule_by_hand():
    tree = {
        "model": {
            "advantage": {"estimator": "gae"},
            "update": {"micro_batch_size": 1, "mini_batch_size": 8},
            "optim": {"actor_lr": 1e-6, "warmup_steps": 3},
        },
        "data": {
            "engine": {"name": "vllm", "vllm": {"gpu_memory_utilization": 0.3}},
            "filter": {"value": 0.9},
            "episode": {"max_model_len": 2048, "max_turns": 5},
            "num_groups_x": 1,
        },
    }
    assert algorithm_keys(dotted_keys(tree)) == [
        "model.advantage.estimator",
        "model.update.mini_batch_size",
        "model.optim.warmup_steps",
        "data.filter.value",
        "data.episode.max_turns",
    ]


@pytest.mark.parametrize("path", OVERLAYS, ids=lambda p: str(p.relative_to(CONFIGS)))
def test_overlays_set_no_algorithm_key(path):
    keys = dotted_keys(yaml.safe_load(path.read_text()) or {})
    assert keys, f"{path} is empty"
    assert algorithm_keys(keys) == [], f"{path.relative_to(CONFIGS)} sets algorithm keys"


@pytest.mark.parametrize(
    "path",
    [*(CONFIGS / "models").glob("*.yaml"), *(CONFIGS / "recipes").glob("*.yaml")],
    ids=lambda p: p.stem,
)
def test_model_overlays_show_the_command_with_a_task_config(path):
    text = path.read_text()
    assert (
        "python main.py fit --config configs/sokoban_starpo" in text
        and "configs/sokoban.yaml" not in text
    )


@pytest.mark.parametrize("path", TASKS, ids=lambda p: p.stem)
def test_task_configs_name_every_algorithm_group(path):
    """Each listed algorithm key the task configs set is a real setting (the list cannot drift from
    the configs)."""
    keys = dotted_keys(yaml.safe_load(path.read_text()))
    named = algorithm_keys(keys)
    for group in (
        "model.advantage",
        "model.loss",
        "data.env.id",
        "data.training.num_groups",
        "data.training.group_size",
        "data.training.num_iterations",
        "data.episode.max_turns",
        "data.episode.context_window",
    ):
        assert any(k == group or k.startswith(group + ".") for k in named), (path.name, group)


def test_starpo_s_is_starpo_plus_filter_no_kl_clip_higher():
    flat = [dict(_flat(yaml.safe_load(p.read_text()))) for p in TASKS]
    differ = {k for k in set(flat[0]) | set(flat[1]) if flat[0].get(k) != flat[1].get(k)}
    differ = {k for k in differ if not k.startswith("trainer.")}  # output folders and run names
    assert differ == {
        "model.loss.clip_high",
        "model.loss.kl_coef",
        "data.filter.strategy",
        "data.filter.value",
        "data.filter.metric",
        "data.filter.include_zero",
        "data.filter.options.mode",
    }
    assert (flat[0]["model.loss.kl_coef"], flat[1]["model.loss.kl_coef"]) == (0.001, 0.0)
    assert (flat[0]["model.loss.clip_high"], flat[1]["model.loss.clip_high"]) == (0.2, 0.28)
    assert (flat[1]["data.filter.value"], flat[1]["data.filter.include_zero"]) == (0.9, False)


def _flat(tree: Any, prefix: str = ""):
    if not isinstance(tree, dict):
        yield prefix, tree
        return
    for name, sub in tree.items():
        yield from _flat(sub, f"{prefix}.{name}" if prefix else str(name))
