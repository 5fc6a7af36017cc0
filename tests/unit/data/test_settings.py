"""The data module's settings groups: each checks its own values in one line naming the flag, the
combinations are checked together, and every flat flag of before answers with its new spelling."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

import envs  # noqa: F401
from ragen_lightning.cli import main
from ragen_lightning.data.settings import (
    GROUPS,
    RENAMED,
    DataSettings,
    EnvSettings,
    RewardSettings,
    SamplingSettings,
    ValidationSettings,
    renamed_flag_error,
)
from ragen_lightning.errors import ConfigError
from ragen_lightning.rollout.settings import EngineSettings, VLLMSettings
from tests.data_groups import data_module

CONFIG = Path(__file__).resolve().parents[3] / "configs" / "bandit.yaml"


@pytest.mark.parametrize(
    "build, line",
    [
        (
            lambda: SamplingSettings(temperature=2.5),
            "--data.sampling.temperature must be a finite number in [0, 2], got 2.5",
        ),
        (
            lambda: SamplingSettings(top_k=0),
            "--data.sampling.top_k must be -1 or an integer >= 1, got 0",
        ),
        (
            lambda: ValidationSettings(num_groups=0),
            "--data.validation.num_groups must be an integer >= 1, got 0",
        ),
        (
            lambda: RewardSettings(placement="episode"),
            "--data.rewards.placement must be one of 'last', 'turn', got 'episode'",
        ),
        (
            lambda: EngineSettings(name="tgi"),
            "--data.engine.name must be one of hf, vllm, auto, got 'tgi'",
        ),
        (
            lambda: EngineSettings(vllm={"sleep_level": 3}),
            "--data.engine.vllm.sleep_level must be 0, 1 or 2, got 3",
        ),
        (
            lambda: EngineSettings(vllm={"sleep": 1}),
            "--data.engine.vllm.sleep is not a setting; --data.engine.vllm has: gpu_memory_utilization, enforce_eager, "
            "max_model_len, tensor_parallel_size, sleep_level, dtype, seed, probe_threshold, probe_size, "
            "probe_max_tokens, cpu_kvcache_gib, full_push",
        ),
        (
            lambda: EnvSettings(id="ragen/Bandit-v0", mixture=[{"env_id": "ragen/Bandit-v0"}]),
            "--data.env.id conflicts with --data.env.mixture, whose entries name the training envs (env_id, env_kwargs): "
            "leave --data.env.id unset",
        ),
        (
            lambda: DataSettings.build(training={"num_group": 2}),
            "--data.training.num_group is not a setting; --data.training has: num_iterations, num_groups, group_size, "
            "seed, empty_stop_steps, async_level",
        ),
        (
            lambda: DataSettings.build(val_num_groups=2),
            "--data.val_num_groups was renamed: use --data.validation.num_groups",
        ),
    ],
)
def test_a_bad_value_is_one_line_naming_the_flag(build, line):
    with pytest.raises(ConfigError) as e:
        build()
    assert str(e.value) == line


def test_groups_are_frozen_and_a_mapping_builds_the_same_settings():
    s = DataSettings.build(
        training={"group_size": 4}, engine={"name": "vllm", "vllm": {"sleep_level": 2}}
    )
    # the other fields keep their defaults
    assert s.training.group_size == 4 and s.training.num_groups == 8
    assert s.engine.vllm == VLLMSettings(sleep_level=2) and s.engine.tensor_parallel_size == 1
    with pytest.raises(dataclasses.FrozenInstanceError):
        # the collapse monitor's change goes through the filter, never past a check
        s.training.group_size = 2
    assert DataSettings.build(training=s.training, engine=s.engine) == s


def test_the_groups_reach_the_rollouts():
    d = data_module(
        env_id="ragen/Bandit-v0",
        num_groups=2,
        train_seed=50,
        temperature=0.7,
        top_k=5,
        val_temperature=0.0,
        val_seed=7,
        val_num_groups=3,
    )
    assert d.group_seeds(4) == [58, 59]  # seed + iteration * num_groups + g: 50 + 8 + {0, 1}
    assert d.val_entry_seeds() == [[7, 8, 9]]
    assert (d.train_params.temperature, d.train_params.top_k) == (0.7, 5)
    assert d.val_params.temperature == 0.0 and d.train_entries[0].env_id == "ragen/Bandit-v0"


def test_every_renamed_flag_names_an_existing_setting():
    fields = {f"{g}.{f.name}" for g, cls in GROUPS.items() for f in dataclasses.fields(cls)}
    assert set(RENAMED.values()) <= fields
    # the 27 flat parameters less episode, filter and engine (engine: below)
    assert len(RENAMED) == 24


@pytest.mark.parametrize("old", sorted(RENAMED))
def test_an_old_flag_answers_with_its_new_spelling(old):
    line = renamed_flag_error(f"Parser key \"data.{old}\": Expected a <class 'int'>")
    assert line == f"--data.{old} was renamed: use --data.{RENAMED[old]}"


def test_old_engine_and_vllm_flags_and_new_flags():
    assert (
        renamed_flag_error("unrecognized arguments: --data.vllm.sleep_level 2")
        == "--data.vllm.sleep_level was renamed: use --data.engine.vllm.sleep_level"
    )
    assert (
        renamed_flag_error('Parser key "data.engine": unable to load config from "vllm"')
        == "--data.engine takes a group now: use --data.engine.name (e.g. --data.engine.name vllm)"
    )
    assert renamed_flag_error('Parser key "data.training.num_groups": Expected int') is None
    assert renamed_flag_error('Parser key "metadata.num_groups": Expected int') is None


@pytest.mark.parametrize(
    "flags, line",
    [
        (
            ["--data.num_groups", "2"],
            "--data.num_groups was renamed: use --data.training.num_groups",
        ),
        (["--data.env_id", "ragen/Bandit-v0"], "--data.env_id was renamed: use --data.env.id"),
        (
            ["--data.engine", "hf"],
            "--data.engine takes a group now: use --data.engine.name (e.g. --data.engine.name vllm)",
        ),
        (
            ["--data.sampling.temperature", "2.5"],
            "--data.sampling.temperature must be a finite number in [0, 2], got 2.5",
        ),
    ],
)
def test_the_command_line_refuses_in_one_line(flags, line, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError) as e:
        main(["fit", "--config", str(CONFIG), *flags])
    assert str(e.value) == line


def test_the_data_module_takes_at_most_12_parameters_each_a_typed_group():
    import inspect
    import typing

    from ragen_lightning.data.datamodule import RolloutDataModule

    params = list(inspect.signature(RolloutDataModule.__init__).parameters)[1:]
    hints = typing.get_type_hints(RolloutDataModule.__init__)
    assert len(params) <= 12
    for name in params:
        kinds = [t for t in typing.get_args(hints[name]) if t is not type(None)] or [hints[name]]
        assert all(dataclasses.is_dataclass(t) for t in kinds), name


def test_the_warm_start_recipe_is_saved_as_the_config_spelled_it():
    from ragen_lightning.sft.warm_start import WarmStartSettings, as_warm_start, warm_start_hparams

    assert warm_start_hparams(False) is False and warm_start_hparams(True) is True
    saved = warm_start_hparams({"steps": 1000, "threads": 2})
    assert saved == {"steps": 1000, "threads": 2}  # a checkpoint of before the group holds the same
    assert as_warm_start(saved) == WarmStartSettings(steps=1000, threads=2)
    with pytest.raises(
        ConfigError, match=r"^--model.warm_start.reading_steps must be below steps \(10\)"
    ):
        WarmStartSettings(steps=10, reading_steps=10)
