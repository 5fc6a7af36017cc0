"""The command line's preflight: every bad setting is one :class:`ConfigError` naming the flag and
its allowed values, raised before anything is built or written (end-to-end cases in
tests/integration/test_cli.py).

The configuration is parsed once from configs/bandit.yaml; each case changes a few keys and runs the
preflight on it (a few ms). The messages are written out in full: the flag, the domain, the value.
"""

from __future__ import annotations

import copy
import math
import os
import warnings
from pathlib import Path

import pytest
from jsonargparse import Namespace

import envs  # noqa: F401  (registers ragen/* ids)
from ragen_lightning.cli import preflight
from ragen_lightning.errors import ConfigError, Domain

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


class _Parsed(Exception):
    pass


@pytest.fixture(scope="module")
def config(tmp_path_factory):
    """configs/bandit.yaml parsed by the real CLI parser (which runs the preflight on it: a good
    config passes)."""
    from ragen_lightning.cli import StarPOCLI
    from ragen_lightning.data.datamodule import RolloutDataModule
    from ragen_lightning.starpo.module import StarPOModule

    class Parse(StarPOCLI):
        def before_instantiate_classes(self):
            raise _Parsed(self.config)

    cwd = os.getcwd()
    # the output-folder check probes the (relative) outputs/ folder here
    os.chdir(tmp_path_factory.mktemp("cwd"))
    try:
        Parse(
            StarPOModule, RolloutDataModule, args=["fit", "--config", str(CONFIGS / "bandit.yaml")]
        )
    except _Parsed as parsed:
        return parsed.args[0].fit
    finally:
        os.chdir(cwd)
    raise AssertionError("the CLI did not reach instantiation")


def changed(config, **changes) -> Namespace:
    cfg = copy.deepcopy(config)
    for key, value in changes.items():
        cfg[key.replace("__", ".")] = value
    return cfg


INF, NAN = math.inf, math.nan
ALLOWED_WARM_START = (
    "steps, num_episodes, lr, batch_size, weight_decay, warmup_steps, lr_schedule, seed, "
    "reading_steps, only_successful, expert_noise, dtype, episode, cache_dir, torch_threads, threads, verbose"
)
BAD = [  # (changes, the whole message)
    (
        {"data__episode__max_model_len": -1},
        "--data.episode.max_model_len must be an integer in [1, 1048576], got -1",
    ),
    ({"data__episode__max_turns": 0}, "--data.episode.max_turns must be an integer >= 1, got 0"),
    (
        {"data__episode__max_new_tokens": 0},
        "--data.episode.max_new_tokens must be an integer >= 1, got 0",
    ),
    (
        {"data__episode__max_actions_per_turn": 0},
        "--data.episode.max_actions_per_turn must be an integer >= 1, got 0",
    ),
    (
        {"data__episode__window_turns": 0},
        "--data.episode.window_turns must be an integer >= 1, got 0",
    ),
    (
        {"data__episode__format_penalty": 1.0},
        "--data.episode.format_penalty must be a finite number <= 0, got 1.0",
    ),
    (
        {"data__episode__context_window": "sliding"},
        "--data.episode.context_window must be 'full', 'limited' or 'single_turn', got 'sliding'",
    ),
    (
        {"data__sampling__top_p": 0.0},
        "--data.sampling.top_p must be a finite number in (0, 1], got 0.0",
    ),
    (
        {"data__sampling__top_p": 1.5},
        "--data.sampling.top_p must be a finite number in (0, 1], got 1.5",
    ),
    ({"data__sampling__top_k": 0}, "--data.sampling.top_k must be -1 or an integer >= 1, got 0"),
    (
        {"data__sampling__temperature": -1.0},
        "--data.sampling.temperature must be a finite number in [0, 2], got -1.0",
    ),
    (
        {"data__sampling__temperature": NAN},
        "--data.sampling.temperature must be a finite number in [0, 2], got nan",
    ),
    (
        {"data__validation__temperature": -0.5},
        "--data.validation.temperature must be a finite number in [0, 2], got -0.5",
    ),
    (
        {"data__engine__max_batch_size": 0},
        "--data.engine.max_batch_size must be an integer >= 1, got 0",
    ),
    (
        {"data__training__num_groups": 0},
        "--data.training.num_groups must be an integer >= 1, got 0",
    ),
    (
        {"data__training__group_size": 0},
        "--data.training.group_size must be an integer >= 1, got 0",
    ),
    (
        {"data__training__num_iterations": 0},
        "--data.training.num_iterations must be an integer >= 1, got 0",
    ),
    (
        {"data__validation__num_groups": 0},
        "--data.validation.num_groups must be an integer >= 1, got 0",
    ),
    (
        {"data__validation__group_size": 0},
        "--data.validation.group_size must be an integer >= 1, got 0",
    ),
    (
        {"data__training__empty_stop_steps": -1},
        "--data.training.empty_stop_steps must be an integer >= 0, got -1",
    ),
    ({"data__training__seed": -1}, "--data.training.seed must be an integer >= 0, got -1"),
    ({"data__validation__seed": -5}, "--data.validation.seed must be an integer >= 0, got -5"),
    (
        {"data__rewards__placement": "turn", "data__rewards__norm_method": "mean_std"},
        "--data.rewards.norm_method must be 'identity' with --data.rewards.placement turn",
    ),
    ({"data__env__id": "ragen/Nope-v0"}, "--data.env.id: unknown env id 'ragen/Nope-v0'"),
    (
        {"data__env__kwargs": {"bogus": 1}},
        "--data.env.kwargs for ragen/Bandit-v0: BanditEnv.__init__() got an unexpected keyword argument 'bogus'",
    ),
    (
        {
            "data__env__id": "ragen/MetaMathQA-v0",
            "data__env__kwargs": {"path": "/nonexistent/qa.jsonl"},
        },
        "--data.env.kwargs for ragen/MetaMathQA-v0: no such QA file: /nonexistent/qa.jsonl",
    ),
    (
        {"data__filter": {"value": -1.0}},
        "--data.filter.value must be a finite number >= 0, got -1.0 (--data.filter.strategy top_p: score mass (>= 1 keeps all))",
    ),
    (
        {"data__filter": {"strategy": "top_k", "value": 1.5}},
        "--data.filter.value must be a finite number in (0, 1], got 1.5 (--data.filter.strategy top_k: fraction of the groups)",
    ),
    (
        {"data__filter": {"strategy": "top_k_abs", "value": 1.5}},
        (
            "--data.filter.value must be a whole number for --data.filter.strategy top_k_abs (a number of groups), "
            "got 1.5"
        ),
    ),
    (
        {"data__engine__vllm": {"gpu_memory_utilization": 2.0}},
        "--data.engine.vllm.gpu_memory_utilization must be a finite number in (0, 1], got 2.0",
    ),
    (
        {"model__model": "/nonexistent"},
        "--model.model '/nonexistent': no such folder, and not 'tiny' or a hub id 'org/name'",
    ),
    (
        {"model__model": "nonexistent"},
        "--model.model 'nonexistent': no such folder, and not 'tiny' or a hub id 'org/name'",
    ),
    (
        {"model__critic__model": "/nonexistent"},
        "--model.critic.model '/nonexistent': no such folder, and not 'tiny' or a hub id 'org/name'",
    ),
    (
        {"model__model": "tiny:big"},
        "--model.model: model 'tiny:big': the embedded model is 'tiny' or 'tiny:' followed by "
        "'+'-joined options, at most one preset of ['small', 'tiny', 'wide'] and one of 'cells' (one token per grid "
        "cell) or 'qwen' (Qwen2.5's tokenizer) (e.g. 'tiny:cells', 'tiny:small+cells', 'tiny:qwen')",
    ),
    (
        {"model__dtype": "float33"},
        "--model.dtype must be one of float32, fp32, bfloat16, bf16, float16, fp16, got 'float33'",
    ),
    (
        {"model__warm_start": {"steps": 10, "reading_steps": 10}},
        "--model.warm_start.reading_steps must be below steps (10), got 10",
    ),
    (
        {"model__warm_start": {"stepz": 3}},
        f"--model.warm_start.stepz is not a setting; --model.warm_start has: {ALLOWED_WARM_START}",
    ),
    (
        {"model__warm_start": {"steps": -1}},
        "--model.warm_start.steps must be null or an integer >= 1, got -1",
    ),
    (
        {"model__warm_start": {"lr_schedule": "linear"}},
        "--model.warm_start.lr_schedule must be 'constant' or 'cosine', got 'linear'",
    ),
    (
        {"model__optim__grad_clip": -1.0},
        "--model.optim.grad_clip must be 0 or a finite number >= 1e-06, got -1.0",
    ),
    (
        {"model__optim__actor_lr": -1e-3},
        "--model.optim.actor_lr must be a finite number in (0, 1], got -0.001",
    ),
    (
        {"model__optim__actor_lr": 0.0},
        "--model.optim.actor_lr must be a finite number in (0, 1], got 0.0",
    ),
    (
        {"model__optim__critic_lr": INF},
        "--model.optim.critic_lr must be a finite number in (0, 1], got inf",
    ),
    (
        {"model__optim__actor_lr": 1e30},
        "--model.optim.actor_lr must be a finite number in (0, 1], got 1e+30",
    ),
    (
        {"model__optim__weight_decay": -1.0},
        "--model.optim.weight_decay must be a finite number >= 0, got -1.0",
    ),
    (
        {"model__advantage__options": {"gamma": 1.5}},
        "--model.advantage.options.gamma must be a finite number in [0, 1], got 1.5",
    ),
    (
        {"model__advantage__options": {"lam": -0.1}},
        "--model.advantage.options.lam must be a finite number in [0, 1], got -0.1",
    ),
    (
        {"model__advantage__options": {"high_level_gamma": 2.0}},
        "--model.advantage.options.high_level_gamma must be a finite number in [0, 1], got 2.0",
    ),
    (
        {"model__advantage__options": {"turn_level": "yes"}},
        "--model.advantage.options.turn_level must be true or false, got 'yes'",
    ),
    (
        {"data__filter": {"options": {"eps": -1.0}}},
        "--data.filter.options.eps must be a finite number >= 0, got -1.0",
    ),
    (
        {"data__filter": {"options": {"mode": "cubic"}}},
        "--data.filter.options.mode must be linear | softmax, got 'cubic'",
    ),
    (
        {"data__filter": {"strategy": "top_k", "value": 0.5, "options": {"mode": "softmax"}}},
        "--data.filter.options.mode is not an option: --data.filter.strategy top_k takes none",
    ),
    (
        {"model__loss__clip_low": 1.0},
        "--model.loss.clip_low must be a finite number in [0, 1), got 1.0",
    ),
    (
        {"model__loss__clip_high": -1.0},
        "--model.loss.clip_high must be a finite number in [0, 10], got -1.0",
    ),
    (
        {"model__loss__dual_clip": 0.5},
        "--model.loss.dual_clip must be null or a finite number > 1, got 0.5",
    ),
    (
        {"model__critic__value_clip": 0.0},
        "--model.critic.value_clip must be a finite number > 0, got 0.0",
    ),
    (
        {"model__loss__entropy_coeff": -1.0},
        "--model.loss.entropy_coeff must be a finite number in [0, 1], got -1.0",
    ),
    ({"model__loss__kl_coef": -1.0}, "--model.loss.kl_coef must be a finite number >= 0, got -1.0"),
    (
        {"model__advantage__kl_in_reward_coef": -0.5},
        "--model.advantage.kl_in_reward_coef must be a finite number >= 0, got -0.5",
    ),
    (
        {"model__update__micro_batch_size": 0},
        "--model.update.micro_batch_size must be an integer >= 1, got 0",
    ),
    (
        {"model__update__micro_batch_threads": 0},
        "--model.update.micro_batch_threads must be an integer >= 1, got 0",
    ),
    (
        {"model__update__micro_batch_threads": 2, "trainer__precision": "bf16-mixed"},
        "--model.update.micro_batch_threads 2 runs backward outside Lightning's precision plugin, which --trainer.precision "
        "bf16-mixed needs: use a '*-true' precision or micro_batch_threads 1",
    ),
    ({"model__update__ppo_epochs": 0}, "--model.update.ppo_epochs must be an integer >= 1, got 0"),
    (
        {"model__optim__warmup_steps": -1},
        "--model.optim.warmup_steps must be an integer >= 0, got -1",
    ),
    (
        {"model__update__logprob_micro_batch_size": 0},
        "--model.update.logprob_micro_batch_size must be null or an integer >= 1, got 0",
    ),
    (
        {"model__update__logits_chunk_size": 0},
        "--model.update.logits_chunk_size must be null or an integer >= 1, got 0",
    ),
    (
        {"model__loss__tis_cap": -1.0},
        "--model.loss.tis_cap must be null or a finite number > 0, got -1.0",
    ),
    (
        {"model__advantage__floor": 0.5},
        "--model.advantage.floor must be null or a finite number <= 0, got 0.5",
    ),
    (
        {"model__update__micro_batch_size": 64},
        "--model.update.micro_batch_size (64) must be <= --model.update.mini_batch_size (32)",
    ),
    ({"model__lora": {"rank": 0}}, "--model.lora.rank must be an integer >= 1, got 0"),
    (
        {"model__early_stop": {"rv_collapse_ratio": 2.0}},
        "--model.early_stop.rv_collapse_ratio must be a finite number in [0, 1], got 2.0",
    ),
    (
        {"data__training__group_size": 1, "model__advantage__estimator": "grpo"},
        "--data.training.group_size must be >= 2 for --model.advantage.estimator grpo",
    ),
    # the groups' own checks: an unknown estimator or key, a switch of another estimator, a
    # cross-group combination
    (
        {"model__advantage__estimator": "reinforce"},
        "--model.advantage.estimator must be one of gae, grpo, drgrpo",
    ),
    (
        {"model__advantage__bogus": 1},
        "--model.advantage.bogus is not a setting; --model.advantage has: estimator, options",
    ),
    (
        {"model__advantage__estimator": "grpo", "model__advantage__options": {"turn_level": True}},
        "--model.advantage.options.turn_level is not an option of --model.advantage.estimator grpo; "
        "its options: soft_reweight",
    ),
    (
        {"model__loss__tis_cap": 2.0, "data__sampling__temperature": 0.7},
        "--model.loss.tis_cap needs --data.sampling.temperature 1 (engine log-probs are the raw model's), "
        "got temperature=0.7",
    ),
    (
        {"trainer__devices": 3, "data__training__num_groups": 4},
        "--data.training.num_groups (4) must be divisible by the number of processes (3): every rank runs "
        "whole env groups",
    ),
    (
        {
            "trainer__devices": "2",
            "trainer__num_nodes": 2,
            "data__training__num_groups": 8,
            "data__validation__num_groups": 6,
        },
        "--data.validation.num_groups (6) must be divisible by the number of processes (4)",
    ),
    ({"torch_threads": 0}, "--torch_threads must be null or an integer >= 1, got 0"),
    # bounds past which a value is a typo, and values that only failed after the run's folders were
    # written
    (
        {"model__advantage__estimator": "rft", "model__advantage__options": {"threshold": NAN}},
        "--model.advantage.options.threshold must be a finite number, got nan",
    ),
    (
        {"model__advantage__estimator": "rft", "model__advantage__options": {"threshold": INF}},
        "--model.advantage.options.threshold must be a finite number, got inf",
    ),
    (
        {"model__optim__grad_clip": 1e-30},
        "--model.optim.grad_clip must be 0 or a finite number >= 1e-06, got 1e-30",
    ),
    (
        {"model__loss__entropy_coeff": 1e30},
        "--model.loss.entropy_coeff must be a finite number in [0, 1], got 1e+30",
    ),
    (
        {"model__loss__clip_high": 1e30},
        "--model.loss.clip_high must be a finite number in [0, 10], got 1e+30",
    ),
    (
        {"data__sampling__temperature": 1e30},
        "--data.sampling.temperature must be a finite number in [0, 2], got 1e+30",
    ),
    (
        {"data__validation__temperature": 2.5},
        "--data.validation.temperature must be a finite number in [0, 2], got 2.5",
    ),
    (
        {"data__episode__max_model_len": 10_000_000_000},
        "--data.episode.max_model_len must be an integer in [1, 1048576], got 10000000000",
    ),
    (
        {"seed_everything": -1},
        "--seed_everything must be null or an integer in [0, 4294967295], got -1",
    ),
    (
        {"seed_everything": 2**32},
        "--seed_everything must be null or an integer in [0, 4294967295], got 4294967296",
    ),
    (
        {
            "model__optim__actor_optimizer": {
                "class_path": "torch.optim.SGD",
                "init_args": {"lr": -1.0},
            }
        },
        "--model.optim.actor_optimizer torch.optim.SGD: Invalid learning rate: -1.0",
    ),
    (
        {
            "model__optim__critic_optimizer": {
                "class_path": "torch.optim.Adam",
                "init_args": {"betas": [0.9, 2.0]},
            }
        },
        "--model.optim.critic_optimizer torch.optim.Adam: Invalid beta parameter at index 1: 2.0",
    ),
    ({"gpu_memory_gb": -1.0}, "--gpu_memory_gb must be null or a finite number > 0, got -1.0"),
    (
        {"trainer__strategy": "fsdp"},
        "--trainer.strategy fsdp (FSDP1, configs/fsdp1.yaml) needs CUDA GPUs",
    ),
    (
        {
            "trainer__strategy": {"class_path": "ragen_lightning.parallel.FSDP2Strategy"},
            "model__lora": {"rank": 8, "shared_base": True},
        },
        (
            "--model.lora.shared_base is not supported with FSDP2 (configs/fsdp.yaml): the critic runs the actor's "
            "backbone without the actor's root module"
        ),
    ),
]


@pytest.mark.parametrize("changes, message", BAD, ids=[",".join(c) for c, _ in BAD])
def test_every_bad_setting_is_one_line_naming_the_flag(config, changes, message):
    with pytest.raises(ConfigError) as err:
        preflight.check_settings(changed(config, **changes))
    assert str(err.value).startswith(message) and "\n" not in str(err.value)


def test_a_run_needs_hub_models_in_the_cache_when_offline(config, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    cfg = changed(config, model__model="no-such-org/no-such-model")
    preflight.check_settings(cfg)  # parsing a config or planning memory needs no download
    with pytest.raises(ConfigError) as err:
        preflight.check_models_loadable(cfg)
    assert str(err.value) == (
        "--model.model 'no-such-org/no-such-model' is not in the Hugging Face cache and "
        "HF_HUB_OFFLINE=1: download it first (hf download no-such-org/no-such-model) or run with "
        "HF_HUB_OFFLINE=0"
    )
    preflight.check_models_loadable(config)  # tiny


def test_the_good_config_and_edge_values_pass(config):
    preflight.check_settings(config)
    edges = {
        "data__sampling__top_p": 1.0,
        "data__sampling__top_k": -1,
        "data__validation__temperature": 0.0,
        "model__optim__grad_clip": 0.0,
        "model__loss__dual_clip": None,
        "model__advantage__options": {"gamma": 0.0},
        "model__loss__clip_low": 0.0,
        "data__training__seed": 0,
        "model__warm_start": {"steps": 3, "lr": 1e-3},
        "data__filter": {"strategy": "top_k_abs", "value": 2.0},
        "model__advantage__floor": 0.0,
        "model__loss__clip_high": 10.0,
        "model__loss__entropy_coeff": 1.0,
        "data__sampling__temperature": 2.0,
        "data__episode__max_model_len": 2**20,
        "seed_everything": 2**32 - 1,
        "model__optim__actor_optimizer": {
            "class_path": "torch.optim.SGD",
            "init_args": {"lr": 0.1},
        },
    }
    preflight.check_settings(changed(config, **edges))
    preflight.check_settings(changed(config, model__optim__grad_clip=1e-6))


def test_fsdp2_takes_the_vllm_engine_lora_and_qlora_but_not_a_shared_base(config, monkeypatch):
    from ragen_lightning.data import checks

    monkeypatch.setattr(checks, "require_vllm", lambda: None)  # as where vLLM is installed
    fsdp2 = {
        "trainer__strategy": {"class_path": "ragen_lightning.parallel.FSDP2Strategy"},
        "trainer__devices": 2,
    }
    # each rank's vLLM engine receives the weights gathered from the shards
    for engine in ("vllm", "auto", "hf"):
        preflight.check_settings(changed(config, data__engine__name=engine, **fsdp2))
        # adapters and base sharded together
        for lora in ({"rank": 8}, {"rank": 8, "quantization": "nf4"}):
            preflight.check_settings(
                changed(config, data__engine__name=engine, model__lora=lora, **fsdp2)
            )
    with pytest.raises(ConfigError, match="--model.lora.shared_base is not supported with FSDP2"):
        preflight.check_settings(
            changed(config, model__lora={"rank": 8, "shared_base": True}, **fsdp2)
        )
    ddp = {"trainer__strategy": "ddp_find_unused_parameters_true", "trainer__devices": 2}
    # DDP takes it
    preflight.check_settings(changed(config, model__lora={"rank": 8, "shared_base": True}, **ddp))


def test_a_k1_kl_loss_warns_that_it_pulls_nothing_back(config):
    kl = {"model__loss__kl_coef": 0.1}  # a KL loss is on when its coefficient is > 0
    with pytest.warns(UserWarning, match="gradient is zero in expectation.*low_var_kl"):
        preflight.check_settings(changed(config, **kl))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        preflight.check_settings(changed(config, **kl, model__loss__kl_kind="low_var_kl"))


def test_seed_everything_takes_true_and_false(config):
    for seed in (True, False, 0):
        preflight.check_settings(changed(config, seed_everything=seed))


@pytest.mark.parametrize(
    "flag, line",
    [
        (
            "--optimizer torch.optim.SGD",
            (
                "--optimizer is not a flag of this command line: use "
                "--model.optim.actor_optimizer (and --model.optim.critic_optimizer)"
            ),
        ),
        (
            "--lr_scheduler torch.optim.lr_scheduler.StepLR",
            "--lr_scheduler is not a flag of this command line: use --model.optim.warmup_steps and --model.optim.decay_iterations",
        ),
    ],
)
def test_lightnings_generic_optimizer_flags_are_refused_naming_ours(
    flag, line, tmp_path, monkeypatch
):
    from ragen_lightning.cli import StarPOCLI
    from ragen_lightning.data.datamodule import RolloutDataModule
    from ragen_lightning.starpo.module import StarPOModule

    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError) as err:
        StarPOCLI(
            StarPOModule,
            RolloutDataModule,
            args=["fit", "--config", str(CONFIGS / "bandit.yaml"), *flag.split()],
        )
    assert str(err.value) == line
    assert list(tmp_path.iterdir()) == []  # refused before anything was written
    assert preflight.removed_flag_error("unrecognized arguments: --model.optim.optimizer 1") is None


def test_world_size_from_the_trainer_flags():
    assert [
        preflight.world_size(t)
        for t in (
            {"devices": 2},
            {"devices": "3", "num_nodes": 2},
            {"devices": [0, 1]},
            {"devices": "0,1,"},
            {"devices": "auto"},
            {"devices": -1},
            {},
        )
    ] == [2, 6, 2, 2, None, None, None]


def test_domain_membership_and_wording():
    unit, count = Domain(0, 1, low_open=True), Domain(low=1, integer=True, special=(-1,))
    assert [v in unit for v in (0.0, 1e-9, 1.0, 1.5, INF, NAN, None, True, "0.5")] == [
        False,
        True,
        True,
        False,
        False,
        False,
        False,
        False,
        False,
    ]
    assert [v in count for v in (-1, 0, 1, 7, 2.0)] == [True, False, True, True, False]
    assert unit.describe() == "a finite number in (0, 1]"
    assert count.describe() == "-1 or an integer >= 1"
    assert Domain(high=0, none=True).describe() == "null or a finite number <= 0"
    # whole bounds in full
    assert Domain(0, 2**32 - 1, integer=True).describe() == "an integer in [0, 4294967295]"
    assert Domain(low=1e-6, special=(0,)).describe() == "0 or a finite number >= 1e-06"


def test_output_folders_must_be_writable(config, tmp_path):
    dirs = preflight.output_dirs(changed(config, trainer__default_root_dir=str(tmp_path / "run")))
    assert dirs == {
        "--trainer.default_root_dir": str(tmp_path / "run"),
        "--trainer.logger[0] (WandbLogger) save_dir": "outputs/bandit",
        "--trainer.logger[1] (CSVLogger) save_dir": "outputs/bandit",
        "--trainer.callbacks[0] (ModelCheckpoint) dirpath": "outputs/bandit/checkpoints",
    }
    # creatable: fine, and nothing is left behind
    preflight.check_writable("--x", tmp_path / "a" / "b")
    assert list(tmp_path.iterdir()) == []
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(
        ConfigError, match=rf"^--x '{blocker}/sub': {blocker} is a file, not a folder$"
    ):
        preflight.check_writable("--x", blocker / "sub")
    with pytest.raises(
        ConfigError, match=r"^--trainer.default_root_dir '/proc/nope': cannot write in /proc \("
    ):
        preflight.check_output_dirs(changed(config, trainer__default_root_dir="/proc/nope"))


@pytest.mark.parametrize(
    "message, line",
    [
        (
            "Parser key \"data.training.num_groups\":\n  Expected a <class 'int'>. Got value: many",
            "--data.training.num_groups: expected int, got many",
        ),
        ("unrecognized arguments: --model.bogus 1", "unrecognized arguments: --model.bogus 1"),
        (
            'Parser key "model.e":\n  Does not validate against any of the Union subtypes\n  Subtypes: [<class '
            "'pkg.E'>, <class 'NoneType'>]\n  Errors:\n    - Problem with given class_path 'pkg.E':\n        Option 'b' "
            "is not accepted\n    - Expected a <class 'NoneType'>\n  Given value type: <class 'dict'>\n  Given value: "
            "{'b': 1}",
            "--model.e: Option 'b' is not accepted (got {'b': 1})",
        ),
    ],
)
def test_parse_errors_become_one_line(message, line):
    assert preflight.parse_error_line(message) == line


def test_wandb_unreachable_switches_to_offline(config, monkeypatch):
    import socket

    # a loopback port that was free a moment ago: connecting is refused at once
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("WANDB_BASE_URL", f"http://127.0.0.1:{port}")
    monkeypatch.delenv("WANDB_MODE", raising=False)
    cfg = changed(config)
    cfg.trainer.logger[0].init_args.offline = False
    assert preflight.wandb_offline_fallback(cfg) == (
        f"warning: wandb server http://127.0.0.1:{port} unreachable (Connection refused): logging offline instead; "
        "upload later with `wandb sync <save_dir>/wandb/offline-run-*`"
    )
    assert cfg.trainer.logger[0].init_args.offline is True
    assert preflight.wandb_offline_fallback(cfg) is None  # offline loggers need no server


def test_unreachable_bounds_a_hanging_connection(monkeypatch):
    import socket
    import time

    def hang(*args, **kwargs):  # a connection attempt that answers long after the timeout
        time.sleep(2)
        raise OSError("too late")

    monkeypatch.setattr(socket, "create_connection", hang)
    start = time.perf_counter()
    assert preflight.unreachable("https://example.invalid", timeout=0.2) == "no answer within 0.2 s"
    assert time.perf_counter() - start < 1.0


def test_a_server_that_accepts_but_never_answers_is_unreachable(config, monkeypatch):
    import socket
    import time

    # the kernel completes the TCP handshake; nobody ever reads or answers
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(4)
        url = f"http://127.0.0.1:{server.getsockname()[1]}"
        start = time.perf_counter()
        reason = preflight.unreachable(url, timeout=0.3)
        assert (
            reason in ("timed out", "no answer within 0.3 s") and time.perf_counter() - start < 1.5
        )
        monkeypatch.setenv("WANDB_BASE_URL", url)
        monkeypatch.delenv("WANDB_MODE", raising=False)
        cfg = changed(config)
        cfg.trainer.logger[0].init_args.offline = False
        assert preflight.wandb_offline_fallback(cfg, timeout=0.3).startswith(
            f"warning: wandb server {url} unreachable ("
        )
        assert cfg.trainer.logger[0].init_args.offline is True


def test_a_server_that_answers_any_http_status_is_reachable():
    import http.server
    import threading

    class NotFound(http.server.BaseHTTPRequestHandler):
        def do_HEAD(self):  # http.server's method naming
            self.send_response(404)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), NotFound)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        assert preflight.unreachable(f"http://127.0.0.1:{server.server_port}", timeout=2.0) is None
    finally:
        server.shutdown()
        server.server_close()


def test_max_model_len_must_fit_the_models_positions(config, tmp_path):
    from ragen_lightning.models.loading import resolve_model_path
    from ragen_lightning.rollout.settings import EpisodeSettings

    assert preflight.model_positions("tiny") == 4096  # the embedded model's max_position_embeddings
    preflight.check_context_length("--model.model", "tiny", [EpisodeSettings(max_model_len=4096)])
    # before: vLLM's multi-line validation error after the folders existed
    with pytest.raises(ConfigError) as err:
        preflight.check_run(changed(config, data__episode__max_model_len=8192))
    assert str(err.value) == (
        "--data.episode.max_model_len 8192 exceeds the 4096 positions of --model.model tiny "
        "(its config's max_position_embeddings)"
    )
    scaled = tmp_path / "scaled"  # a RoPE scaling factor lengthens the context as vLLM counts it
    scaled.mkdir()
    (scaled / "config.json").write_text(
        Path(resolve_model_path("tiny"), "config.json")
        .read_text()
        .replace(
            '"max_position_embeddings": 4096',
            '"max_position_embeddings": 4096, "rope_scaling": {"rope_type": "yarn", '
            '"factor": 4.0, "original_max_position_embeddings": 4096}',
        )
    )
    assert preflight.model_positions(str(scaled)) == 16384
    # no config: nothing to check here
    assert preflight.model_positions(str(tmp_path / "missing")) is None
