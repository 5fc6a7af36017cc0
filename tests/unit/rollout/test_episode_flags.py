"""The episode settings on the argparse command lines (``python -m ragen_lightning.evaluate`` and ``python -m
ragen_lightning.sft.warm_start``): one shared parser derived from EpisodeSettings' fields, spelled like main.py's
``--data.episode`` group, giving the same settings as the YAML route, with one-line errors naming the flag."""

from __future__ import annotations

import argparse
import dataclasses

import pytest
import yaml

from ragen_lightning import evaluate
from ragen_lightning.errors import ConfigError
from ragen_lightning.rollout.settings import (
    EpisodeSettings,
    add_episode_arguments,
    episode_from_args,
)
from ragen_lightning.sft import warm_start

NAMES = [f.name for f in dataclasses.fields(EpisodeSettings)]
# a value for every field, none of them the default
VALUES = {"max_turns": 3, "max_actions_per_turn": 1, "max_actions_per_episode": 7, "max_new_tokens": 40,
          "context_window": "limited", "window_turns": 3, "max_model_len": 1024, "enable_think": False,
          "observation_last": True, "format_penalty": -0.5, "action_format": "tool_call", "stop": ["</answer>"], "max_workers": 2,
          "step_timeout_s": 2.5}


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser()
    add_episode_arguments(p)
    return p


def _flags(values: dict) -> list[str]:
    return [a for k, v in values.items() for a in (f"--episode.{k}", yaml.safe_dump(v, default_flow_style=True)
                                                   .strip().removesuffix("\n...").strip())]


def test_the_values_cover_every_field_off_its_default():
    defaults = EpisodeSettings()
    assert list(VALUES) == NAMES
    assert all(getattr(defaults, k) != (tuple(v) if isinstance(v, list) else v) for k, v in VALUES.items())


@pytest.mark.parametrize("parser", [evaluate.parser, warm_start._parser], ids=["evaluate", "warm_start"])
def test_both_command_lines_have_a_flag_per_field(parser):
    options = {o for action in parser()._actions for o in action.option_strings if o.startswith("--episode")}
    assert options == {"--episode"} | {f"--episode.{n}" for n in NAMES}


def _main_py_route(values: dict) -> EpisodeSettings:
    """What main.py's LightningCLI builds from ``data.episode`` in a YAML config (the data module's signature)."""
    from jsonargparse import ArgumentParser

    from ragen_lightning.data.datamodule import RolloutDataModule
    from ragen_lightning.rollout.settings import as_episode

    p = ArgumentParser(exit_on_error=False)
    p.add_class_arguments(RolloutDataModule, "data")
    cfg = p.parse_string(yaml.safe_dump({"data": {"env_id": "ragen/Bandit-v0", "episode": values}}))
    return as_episode(cfg.data.episode)


def test_flags_give_the_settings_of_the_yaml_route(tmp_path):
    expected = EpisodeSettings(**VALUES)
    assert episode_from_args(_parser().parse_args(_flags(VALUES))) == expected
    assert episode_from_args(_parser().parse_args(["--episode", yaml.safe_dump(VALUES)])) == expected
    assert _main_py_route(VALUES) == expected
    # evaluate --config reads the same YAML's data.episode
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({"data": {"env_id": "ragen/Bandit-v0", "episode": VALUES}}))
    _, episode = evaluate.read_suite_and_episode(evaluate.parser().parse_args(["--config", str(config)]))
    assert episode == expected


def test_no_flag_gives_the_defaults_and_flags_go_over_the_config_in_order():
    assert episode_from_args(_parser().parse_args([])) == EpisodeSettings()
    assert episode_from_args(warm_start._parser().parse_args([])) == EpisodeSettings()  # the old --max-turns 5 etc.
    config = {"max_turns": 2, "window_turns": 3, "max_new_tokens": 50}
    args = _parser().parse_args(["--episode", "{max_turns: 4, window_turns: 4}", "--episode.window_turns", "5"])
    assert episode_from_args(args, config) == EpisodeSettings(max_turns=4, window_turns=5, max_new_tokens=50)


def test_values_are_read_as_on_main_pys_command_line():
    args = _parser().parse_args(["--episode.step_timeout_s", "null", "--episode.format_penalty", "-1",
                                 "--episode.max_model_len", "2048", "--episode.stop", r'[</answer>, "\n\n"]'])
    settings = episode_from_args(args)
    assert settings.step_timeout_s is None and settings.format_penalty == -1.0
    assert settings.max_model_len == 2048 and settings.stop == ("</answer>", "\n\n")
    assert episode_from_args(_parser().parse_args(["--episode.step_timeout_s", "1e-3"])).step_timeout_s == 0.001


@pytest.mark.parametrize(("argv", "message"), [
    (["--episode.max_turns", "0"], "--episode.max_turns must be an integer >= 1, got 0"),
    (["--episode.max_turns", "two"], "--episode.max_turns must be an integer, got 'two'"),
    (["--episode.max_turns", "1.5"], "--episode.max_turns must be an integer, got 1.5"),
    (["--episode.enable_think", "maybe"], "--episode.enable_think must be true or false, got 'maybe'"),
    (["--episode.context_window", "wide"],
     "--episode.context_window must be one of 'full', 'limited', 'single_turn', got 'wide'"),
    (["--episode.format_penalty", "0.5"], "--episode.format_penalty must be a finite number <= 0, got 0.5"),
    (["--episode.step_timeout_s", "soon"], "--episode.step_timeout_s must be a number, got 'soon'"),
    (["--episode.stop", "</answer>"], "--episode.stop must be a list such as '[\"</answer>\"]', got '</answer>'"),
    (["--episode", "{max_turn: 1}"], "--episode: unknown setting 'max_turn' (the settings: " + ", ".join(NAMES) + ")"),
    (["--episode", "{max_turns: 0}"], "--episode.max_turns must be an integer >= 1, got 0"),
    (["--episode", "3"], "--episode must be a mapping such as '{max_turns: 1}', got '3'"),
])
def test_a_bad_value_is_one_line_naming_the_flag(argv, message):
    with pytest.raises(ConfigError) as e:
        episode_from_args(_parser().parse_args(argv))
    assert str(e.value) == message


def test_a_bad_config_value_names_the_config_key():
    with pytest.raises(ConfigError, match=r"^--data\.episode\.max_turns must be an integer >= 1, got 0$"):
        episode_from_args(_parser().parse_args([]), {"max_turns": 0})
    with pytest.raises(ConfigError, match=r"^--data\.episode: unknown setting 'turns' "):
        episode_from_args(_parser().parse_args([]), {"turns": 3})


@pytest.mark.parametrize("main", [evaluate.main, warm_start.main], ids=["evaluate", "warm_start"])
def test_the_command_lines_print_the_error_as_one_line(main, tmp_path, capsys):
    argv = ["--model", "tiny", "--out", str(tmp_path)] if main is evaluate.main else ["--no-base"]
    assert main(argv + ["--entry", "{env_id: ragen/Bandit-v0}"] * (main is evaluate.main)
                + ["--episode.context_window", "wide"]) == 2
    assert capsys.readouterr().err == ("error: --episode.context_window must be one of 'full', 'limited', "
                                       "'single_turn', got 'wide'\n")
