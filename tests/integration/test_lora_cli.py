"""LoRA / QLoRA end to end through the CLI (tiny model, CPU), the overlays' composition and the 24
GB recipes."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import envs  # noqa: F401
from ragen_lightning.cli import StarPOCLI, main
from ragen_lightning.data.datamodule import RolloutDataModule
from ragen_lightning.starpo.module import StarPOModule
from tests.integration.inprocess import in_process  # noqa: F401  (autouse: main() in this process)

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
RECIPES = sorted((CONFIGS / "recipes").glob("24gb-*.yaml"))
# --validate_first false: bandit.yaml validates at iteration 0, which builds and closes the rollout
# engine a second time; the checkpoints' own validate runs below (test_cli checks --validate_first)
SHORT = [
    "--trainer.logger",
    "false",
    "--model.warm_start",
    "false",
    "--validate_first",
    "false",
    "--data.training.num_groups",
    "2",
    "--data.training.group_size",
    "2",
    "--data.episode.max_new_tokens",
    "12",
    "--data.validation.num_groups",
    "2",
    "--model.update.mini_batch_size",
    "4",
    "--model.update.micro_batch_size",
    "2",
    "--data.training.num_iterations",
    "1",
    "--trainer.val_check_interval",
    "1",
]


class ParseOnly(StarPOCLI):
    def instantiate_classes(self) -> None:  # parse and run the preflight hooks, build nothing
        pass


def parse(*configs: Path, extra: tuple[str, ...] = ()):
    args = [*(a for c in configs for a in ("--config", str(c))), *extra]
    return ParseOnly(StarPOModule, RolloutDataModule, args=args, run=False).config


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda p: p.stem)
def test_recipes_fit_24gb_with_ragen_low_memory_settings(recipe):
    from ragen_lightning.cli.memory_check import check_memory
    from tests.conftest import load_script

    # the command the recipe shows
    task, extra = load_script("benchmarks/gpu_kit.py").recipe_command(recipe)
    cfg = parse(task, recipe, extra=extra)
    update = cfg.model["update"]  # (Namespace.update is a method)
    # the task config's mini-batch
    assert update.micro_batch_size == 1 and update.mini_batch_size == 32
    assert (cfg.data.episode.max_model_len, cfg.data.episode.max_new_tokens) == (2048, 128)
    assert cfg.gpu_memory_gb == 24
    plan = check_memory(cfg, print_plan=False)  # raises ConfigError if the estimate exceeds 24 GiB
    assert 8 * 2**30 < plan.peak <= 24 * 2**30  # a real model's plan, not an empty one
    # the rollout engine is counted (auto resolved)
    assert plan.engine_kv_cache + plan.engine_reserved > 0


def test_gpu_memory_preflight_refuses_before_anything_is_written(tmp_path):
    from ragen_lightning.errors import ConfigError

    # Qwen2.5-3B full fine-tuning with a critic at RAGEN's paper lengths cannot fit 24 GiB
    with pytest.raises(
        ConfigError, match=r"--gpu_memory_gb 24: the estimated peak \d+\.\d GiB does not fit"
    ):
        main(
            [
                "fit",
                "--config",
                str(CONFIGS / "sokoban_starpo.yaml"),
                "--config",
                str(CONFIGS / "models" / "qwen2.5-3b-instruct.yaml"),
                "--gpu_memory_gb",
                "24",
            ]
        )
    assert not list(tmp_path.iterdir())
    with pytest.raises(SystemExit) as e:  # the plan alone: printed, exit 0, nothing built
        main(
            [
                "fit",
                "--config",
                str(CONFIGS / "sokoban_starpo.yaml"),
                "--config",
                str(RECIPES[-1]),
                "--memory_plan",
                "true",
            ]
        )
    assert e.value.code == 0 and not list(tmp_path.iterdir())


@pytest.mark.slow
def test_lora_fit_exports_a_peft_adapter_and_the_checkpoint_validates(tmp_path):
    """bandit + lora overlay, KL on (reference = adapters off): 1 iteration, adapter + merged
    export, validate."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from ragen_lightning.models import resolve_model_path

    common = [
        "--config",
        str(CONFIGS / "bandit.yaml"),
        "--config",
        str(CONFIGS / "lora.yaml"),
        *SHORT,
        "--model.loss.kl_coef",
        "0.1",
    ]  # a KL loss: on when its coefficient is > 0
    cli = main(
        ["fit", *common, "--model.export_dir", "exported", "--model.lora.export_merged", "true"]
    )
    module = cli.model
    # a view, no copy
    assert module.reference is not None and not list(module.reference.parameters())
    base_path = resolve_model_path("tiny")
    base = AutoModelForCausalLM.from_pretrained(base_path)
    ids = torch.tensor([[3, 14, 15, 92, 65, 35, 89, 79]])
    with torch.no_grad():
        trained = module.actor.cpu()(input_ids=ids).logits
        loaded = PeftModel.from_pretrained(base, tmp_path / "exported")(input_ids=ids).logits
        merged = AutoModelForCausalLM.from_pretrained(tmp_path / "exported" / "merged")(
            input_ids=ids
        ).logits
    torch.testing.assert_close(loaded, trained)
    torch.testing.assert_close(merged, trained, rtol=1e-4, atol=1e-4)
    # bandit.yaml's ModelCheckpoint
    ckpt = tmp_path / "outputs" / "bandit" / "checkpoints" / "last.ckpt"
    state = torch.load(ckpt, map_location="cpu", weights_only=False)
    assert state["hyper_parameters"]["lora"]["rank"] == 64  # a plain dict in the checkpoint
    out = main(["validate", *common, "--ckpt_path", str(ckpt)])
    assert "val/success" in out.trainer.callback_metrics


@pytest.mark.slow
def test_qlora_shared_base_fit_on_the_embedded_tiny_model(tmp_path):
    """nf4 on the embedded model (hidden 128: 64-weight nf4 blocks divide it) with actor and critic
    as two adapters on one base; PPO (GAE) runs its critic through the shared base; the checkpoint
    reloads."""
    import bitsandbytes as bnb

    from ragen_lightning.models import lora

    common = [
        "--config",
        str(CONFIGS / "bandit.yaml"),
        "--config",
        str(CONFIGS / "qlora.yaml"),
        *SHORT,
        "--model.lora.shared_base",
        "true",
        "--model.lora.rank",
        "8",
        "--model.lora.alpha",
        "16",
        # this test needs the critic, whatever bandit.yaml trains with
        "--model.advantage.estimator",
        "gae",
    ]
    cli = main(["fit", *common])
    module = cli.model
    assert isinstance(module.critic, lora.SharedBaseCritic)
    assert any(isinstance(m, bnb.nn.Linear4bit) for m in module.actor.modules())
    assert cli.trainer.global_step == 2  # one actor and one critic optimizer step
    actor_opt, critic_opt = cli.trainer.optimizers
    a = {id(p) for g in actor_opt.param_groups for p in g["params"]}
    c = {id(p) for g in critic_opt.param_groups for p in g["params"]}
    assert a and c and not a & c
    # the checkpoint holds adapters + value head only (a 4-bit base could not be loaded back) and
    # validates
    ckpt = tmp_path / "outputs" / "bandit" / "checkpoints" / "last.ckpt"
    state = torch.load(ckpt, map_location="cpu", weights_only=False)["state_dict"]
    assert set(state) == {n for n, p in module.named_parameters() if p.requires_grad}
    out = main(["validate", *common, "--ckpt_path", str(ckpt)])
    assert "val/success" in out.trainer.callback_metrics
