"""``fit``, ``evaluate`` and ``warm_start`` spell the env, episode, engine and batch settings the
same way and build the same settings from them, from flags and from a fit's config file; old flags
answer with their new spelling."""

from __future__ import annotations

import dataclasses

import pytest
import yaml
from jsonargparse import ArgumentParser

from ragen_lightning import evaluate
from ragen_lightning.data.datamodule import RolloutDataModule
from ragen_lightning.data.settings import DataSettings
from ragen_lightning.data.shared_flags import SHARED_GROUPS, parse
from ragen_lightning.rollout.settings import EngineSettings, EpisodeSettings, VLLMSettings
from ragen_lightning.sft import warm_start

# one value for every shared setting, none of them its default
EPISODE = {
    "max_turns": 3,
    "max_actions_per_turn": 1,
    "max_actions_per_episode": 7,
    "max_new_tokens": 40,
    "context_window": "limited",
    "window_turns": 3,
    "max_model_len": 1024,
    "enable_think": False,
    "observation_last": True,
    "format_penalty": -0.5,
    "action_format": "tool_call",
    "stop": ["</answer>"],
    "max_workers": 2,
    "step_timeout_s": 2.5,
}
ENV = {"id": "ragen/Bandit-v0", "kwargs": {"expert_policy": "balanced"}}
ENGINE = {"name": "vllm", "max_batch_size": 16, "vllm": {"sleep_level": 2, "probe_size": 3}}
EXPECTED = {
    "env": DataSettings.build(env=ENV).env,
    "episode": EpisodeSettings(**EPISODE),
    "engine": EngineSettings("vllm", 16, VLLMSettings(sleep_level=2, probe_size=3)),
}


def _flags() -> list[str]:
    def text(v):
        return yaml.safe_dump(v, default_flow_style=True).strip().removesuffix("...").strip()

    groups = {"env": ENV, "episode": EPISODE, "engine": {**ENGINE, "vllm": None}}
    flags = [
        a
        for g, values in groups.items()
        for k, v in values.items()
        if v is not None
        for a in (f"--data.{g}.{k}", text(v))
    ]
    return flags + [
        a for k, v in ENGINE["vllm"].items() for a in (f"--data.engine.vllm.{k}", text(v))
    ]


def _fit(argv: list[str]) -> dict:
    """What ``python main.py fit`` builds from ``argv``: the data module's signature, then its
    groups."""
    p = ArgumentParser(exit_on_error=False)
    p.add_argument("--config", action="config")
    p.add_class_arguments(RolloutDataModule, "data")
    # (the module's: not this test's subject)
    p.add_argument("--model", type=dict | None, default=None)
    cfg = p.parse_args(argv)
    s = DataSettings.build(**{k: v for k, v in cfg.data.as_dict().items()})
    return {name: getattr(s, name) for name in SHARED_GROUPS}


def _side(parser) -> callable:
    def run(argv: list[str]) -> dict:
        c = parse(parser(), argv)
        return {name: getattr(c.data, name) for name in SHARED_GROUPS}

    return run


COMMANDS = {"fit": _fit, "evaluate": _side(evaluate.parser), "warm_start": _side(warm_start.parser)}


def test_the_values_cover_every_shared_setting_off_its_default():
    assert list(EPISODE) == [f.name for f in dataclasses.fields(EpisodeSettings)]
    for name, settings in EXPECTED.items():
        default = SHARED_GROUPS[name]()
        assert all(
            getattr(settings, f.name) != getattr(default, f.name)
            for f in dataclasses.fields(settings)
            if f.name != "mixture"
        ), name


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_builds_the_same_settings_from_the_same_flags(command):
    assert COMMANDS[command](_flags()) == EXPECTED


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_reads_a_fit_config(command, tmp_path):
    # a fit's config: the side commands leave out what they do not have
    config = tmp_path / "fit.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "model": {"model": "tiny", "advantage": {"estimator": "grpo"}},
                "data": {
                    **{k: v for k, v in (("env", ENV), ("episode", EPISODE), ("engine", ENGINE))},
                    "training": {"num_groups": 4},
                },
            }
        )
    )
    assert COMMANDS[command](["--config", str(config)]) == EXPECTED
    # a flag after the config goes over it, in every command alike
    got = COMMANDS[command](["--config", str(config), "--data.episode.max_turns", "5"])
    assert got["episode"] == dataclasses.replace(EXPECTED["episode"], max_turns=5)


@pytest.mark.parametrize(
    "main, argv, line",
    [
        (
            evaluate.main,
            ["--max-batch-size", "8"],
            "--max-batch-size was renamed: use --data.engine.max_batch_size",
        ),
        (
            evaluate.main,
            ["--episode.max_turns", "2"],
            "--episode.max_turns was renamed: use --data.episode.max_turns",
        ),
        (
            warm_start.main,
            ["--env-kwargs", "{}"],
            "--env-kwargs was renamed: use --data.env.kwargs",
        ),
        (
            warm_start.main,
            ["--batch-size", "8"],
            "--batch-size was renamed: use --model.warm_start.batch_size",
        ),
        (
            warm_start.main,
            ["--data.episode.max_turns", "0"],
            "--data.episode.max_turns must be an integer >= 1, got 0",
        ),
        (
            evaluate.main,
            ["--data.engine.max_batch_size", "0"],
            "--data.engine.max_batch_size must be an integer >= 1, got 0",
        ),
    ],
)
def test_a_bad_or_old_flag_is_one_line_and_status_2(main, argv, line, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {line}") and err.count("\n") == 1
