"""Every YAML in configs/ parses against the CLI's signatures; every task config runs a short fit on
CPU that generates, updates, validates and checkpoints."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
import yaml

import envs  # noqa: F401
from ragen_lightning.cli import StarPOCLI
from ragen_lightning.models.loading import is_tiny
from tests.integration.inprocess import run_main

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
# a task config names its env; everything else (configs/models/*, diagnostics, lora, ddp, ...) is an
# overlay
TASKS = sorted(
    p for p in CONFIGS.glob("*.yaml") if "env" in (yaml.safe_load(p.read_text()).get("data") or {})
)
OVERLAYS = sorted(p for p in CONFIGS.rglob("*.yaml") if p not in TASKS)


class ParseOnly(StarPOCLI):
    def instantiate_classes(self) -> None:  # validate types and keys without building a trainer
        pass


def parse(*configs: Path, extra: tuple[str, ...] = ()):
    args = [*(a for c in configs for a in ("--config", str(c))), *extra]
    from ragen_lightning.data.datamodule import RolloutDataModule
    from ragen_lightning.starpo.module import StarPOModule

    return ParseOnly(StarPOModule, RolloutDataModule, args=args, run=False).config


def test_every_config_parses(capsys):
    checked = 0
    for task in TASKS:
        cfg = parse(task)
        # the embedded model or a named variant of it (tiny:cells): no task config downloads weights
        env = cfg.data.env
        env_ids = [env.id] if env.mixture is None else [e["env_id"] for e in env.mixture]
        assert all(i.startswith("ragen/") for i in env_ids) and is_tiny(cfg.model.model), task.name
        checked += 1
    from tests.conftest import load_script

    recipe_command = load_script("benchmarks/gpu_kit.py").recipe_command
    # over the task config the overlay names (a recipe: the command in its comment)
    for overlay in OVERLAYS:
        task, extra = (
            recipe_command(overlay)
            if overlay.parent.name == "recipes"
            else (CONFIGS / "sokoban_starpo.yaml", ())
        )
        cfg = parse(task, overlay, extra=extra)
        assert cfg.data.env.id == "ragen/SimpleSokoban-v0"  # overlays keep the task
        checked += 1
    with capsys.disabled():
        print(
            f"\n[configs] checked {checked} YAML files ({len(TASKS)} tasks, {len(OVERLAYS)} overlays)"
        )
    assert checked == len(list(CONFIGS.rglob("*.yaml"))) and checked > 0


def test_bad_value_names_the_flag():
    from ragen_lightning.errors import ConfigError

    # one line, before anything
    with pytest.raises(ConfigError, match=r"^--data.training.num_groups: expected int, got many$"):
        parse(CONFIGS / "sokoban.yaml", Path(__file__).with_name("bad_config.yaml"))


def backend_args(task: str) -> list[str]:
    """Flags that give a task whose env needs an external backend a loopback stand-in:
    configs/lean.yaml names the user's Lean server, here the fake Kimina server replaying recorded
    answers (tests/fixtures/lean)."""
    if task == "lean":
        from tests.fixtures.lean.fake_kimina import shared_url

        return ["--data.env.kwargs", json.dumps({"server_url": shared_url()})]
    return []


def update_args(task: str) -> list[str]:
    """A task config on rejection-sampling fine-tuning (configs/sokoban.yaml) trains only the turns
    scored above its threshold, and the untrained tiny model of this test scores none (no kept row:
    no optimizer step); keeping every turn (and every group, under a filter that drops zero-variance
    ones) makes the one iteration update, as the other configs do."""
    import yaml

    config = yaml.safe_load((CONFIGS / f"{task}.yaml").read_text())
    model, data = config.get("model") or {}, config.get("data") or {}
    estimator = (model.get("advantage") or {}).get("estimator")
    args = ["--model.advantage.options.threshold=-1e9"] if estimator == "rft" else []
    # a per-state estimator (configs/sokoban_starpo_s_branching.yaml) compares a state's answers,
    # and the untrained model's answers all fail the format alike (no spread: no step); rft keeping
    # every turn runs the same branching rollout, state filter and update path (the per-state
    # estimators: tests/unit/starpo/test_state_baseline.py)
    if estimator in ("state_grpo", "state_baseline"):
        args = ["--model.advantage.estimator", "rft", "--model.advantage.options.threshold=-1e9"]
    # StarPO-S's filter (configs/sokoban_starpo_s.yaml) drops zero-variance groups, and the
    # untrained tiny model's groups of 2 fail alike (no group left: no step): keep every group
    if (data.get("filter") or {}).get("include_zero") is False:
        args += ["--data.filter.value", "1.0", "--data.filter.include_zero", "true"]
    return args


# Every task config names the same engine, `auto` (vLLM where installed, else HF), with no engine
# option of its own, so the engine is not what tells one task config from another: the smoke fits
# roll out on the HF engine (~3.5 s a fit less: no vLLM start-up and shut-down), except the two that
# keep their own `auto` engine for vLLM's multi-turn prompt shapes, the full-history context
# (sokoban_starpo) and the limited window over long tool pages (webshop). vLLM through the command
# line is also fitted by tests/integration/test_cli.py, test_mixture.py and test_lora_cli.py; HF ==
# vLLM by tests/integration/test_vllm.py.
OWN_ENGINE = {"sokoban_starpo", "webshop"}


def engine_args(task: str) -> list[str]:
    return [] if task in OWN_ENGINE else ["--data.engine.name", "hf"]


def branching_args(task: str) -> list[str]:
    """A branching rollout (configs/sokoban.yaml, sokoban_starpo_s_branching.yaml: 8 answers to
    every state) with 2 answers a state still branches, scores and trains per state, on 4 times
    fewer rows (~5 s a fit less)."""
    data = yaml.safe_load((CONFIGS / f"{task}.yaml").read_text()).get("data") or {}
    branches = (data.get("branching") or {}).get("branches") or 1
    return ["--data.branching.branches", "2"] if branches > 2 else []


@pytest.mark.slow
@pytest.mark.parametrize("task", [p.stem for p in TASKS])
def test_task_config_fit_smoke(task, tmp_path, capfd):
    assert OWN_ENGINE <= {p.stem for p in TASKS}
    # --validate_first false: the configs that validate at iteration 0 would build and close the
    # rollout engine twice (~3-5 s of vLLM start-up and garbage collection each); the validation
    # after the iteration still runs (tests/integration/test_cli.py checks --validate_first itself)
    outcome = run_main(
        [
            "fit",
            "--config",
            str(CONFIGS / f"{task}.yaml"),
            *backend_args(task),
            *update_args(task),
            *engine_args(task),
            *branching_args(task),
            "--validate_first",
            "false",
            "--trainer.logger",
            "false",
            "--trainer.callbacks",
            "[]",
            "--trainer.enable_checkpointing",
            "true",
            "--model.warm_start",
            "false",
            "--trainer.max_steps",
            "2",
            "--data.training.num_iterations",
            "1",
            "--data.training.num_groups",
            "2",
            "--data.training.group_size",
            "2",
            "--data.episode.max_new_tokens",
            "12",
            "--data.episode.max_turns",
            "2",
            "--data.validation.num_groups",
            "2",
            "--trainer.val_check_interval",
            "1",
            "--model.update.mini_batch_size",
            "4",
            "--model.update.micro_batch_size",
            "2",
        ],
        cwd=tmp_path,
    )
    assert outcome.code == 0, capfd.readouterr().err[-2000:]
    cli = outcome.cli
    m = {k: float(v) for k, v in cli.trainer.callback_metrics.items()}
    # the rollout generated tokens and the episodes were scored
    assert m["rollout/generated_tokens"] > 0 and m["train/response_length"] > 0, task
    for key in ("train/success", "train/pass@2", "val/success", "train/format_error_rate"):
        assert 0.0 <= m[key] <= 1.0, (task, key, m.get(key))
    # one StarPO iteration ran its update (finite loss and grad norm) and validation ran
    # (val_check_interval 1)
    assert cli.trainer.global_step >= 1 and m["iteration"] == 0.0, task
    assert math.isfinite(m["actor/pg_loss"]) and math.isfinite(m["actor/grad_norm"]), task
    # a checkpoint was written and holds the actor's weights
    ckpts = sorted(tmp_path.rglob("*.ckpt"))
    assert ckpts, f"{task}: no checkpoint under {tmp_path}"
    state = torch.load(ckpts[-1], map_location="cpu", weights_only=False)["state_dict"]
    assert any(k.startswith("actor.") for k in state), (task, list(state)[:5])
