"""The module's typed settings groups, the flat flags they replaced, and the estimator / filter
tables."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import re
from pathlib import Path

import pytest

import ragen_lightning
from ragen_lightning.algos.filtering import FILTER_STRATEGIES
from ragen_lightning.errors import ConfigError
from ragen_lightning.starpo.checks import check_data_settings, check_module_settings
from ragen_lightning.starpo.estimators import ESTIMATORS
from ragen_lightning.starpo.module import StarPOModule
from ragen_lightning.starpo.settings import (
    GROUPS,
    MOVED_TO_OPTIONS,
    RENAMED,
    AdvantageSettings,
    ModuleSettings,
    PolicyLossSettings,
    UpdateSettings,
    as_group,
    renamed_flag_error,
)
from tests.data_groups import data_view

LIB = Path(ragen_lightning.__file__).parent


def test_the_constructor_takes_at_most_twelve_parameters():
    params = [p for p in inspect.signature(StarPOModule.__init__).parameters if p != "self"]
    assert len(params) <= 12 and set(GROUPS) <= set(params)


@pytest.mark.parametrize("old", sorted(RENAMED))
def test_every_flat_flag_of_before_names_its_new_spelling(old):
    group, field, *option = RENAMED[old].split(".")
    assert field in {f.name for f in dataclasses.fields(GROUPS[group])}  # the new spelling exists
    if option:  # an estimator's option: a field of the options dataclass MOVED_TO_OPTIONS names
        holder = next(
            cls for key, (_, cls) in MOVED_TO_OPTIONS.items() if RENAMED[key] == RENAMED[old]
        )
        assert option[0] in {f.name for f in dataclasses.fields(holder)}
    message = f'Parser key "model": unrecognized arguments: --model.{old} 3'
    line = renamed_flag_error(message)
    assert line.startswith(f"--model.{old} was renamed: use --model.{RENAMED[old]}")
    assert "\n" not in line


@pytest.mark.parametrize(
    "message",
    [
        "unrecognized arguments: --model.advantage.rft_threshold 1.5",  # a flag
        "Group 'model' does not accept option 'advantage.rft_threshold'",  # a YAML config's key
    ],
)
def test_an_option_that_moved_into_its_estimator_names_the_new_flag(message):
    assert renamed_flag_error(message) == (
        "--model.advantage.rft_threshold was renamed: use "
        "--model.advantage.options.threshold (an option of "
        "--model.advantage.estimator rft)"
    )
    line = renamed_flag_error("unrecognized arguments: --model.advantage.soft_reweight true")
    assert line.endswith("(an option of --model.advantage.estimator grpo / drgrpo / brpo / arpo)")


def test_current_flags_are_not_taken_for_renamed_ones():
    assert renamed_flag_error('Parser key "model.advantage.floor": Expected a float') is None
    message = "--model.advantage.options.gamma must be a finite number in [0, 1], got 2"
    assert renamed_flag_error(message) is None
    assert renamed_flag_error('Parser key "model.model": Expected a str') is None
    assert renamed_flag_error("unrecognized arguments: --model.use_kl_loss true").endswith(
        "(a KL loss is on when its coefficient is > 0)"
    )


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (
            lambda: UpdateSettings(mini_batch_size=4, micro_batch_size=8),
            "--model.update.micro_batch_size (8) must be <= --model.update.mini_batch_size (4)",
        ),
        (
            lambda: PolicyLossSettings(clip_low=1.0),
            "--model.loss.clip_low must be a finite number in [0, 1), got 1.0",
        ),
        (
            lambda: AdvantageSettings(floor=0.5),
            "--model.advantage.floor must be null or a finite number <= 0, got 0.5",
        ),
        (
            lambda: as_group(UpdateSettings, {"mini_batch": 4}, "--model.update"),
            "--model.update.mini_batch is not a setting; --model.update has: ppo_epochs, mini_batch_size",
        ),
        (
            lambda: ModuleSettings.build(optimisation={}),
            "--model.optimisation is not a settings group",
        ),
    ],
)
def test_each_group_checks_its_own_values_naming_the_flag(build, message):
    with pytest.raises(ConfigError) as e:
        build()
    assert str(e.value).startswith(message)


def _settings(**groups) -> ModuleSettings:
    return ModuleSettings.build(**groups)


@pytest.mark.parametrize(
    ("groups", "message"),
    [
        (
            {"advantage": {"estimator": "rft", "length_weight": True}},
            (
                "--model.advantage.length_weight applies to the group-outcome estimators "
                "(grpo, drgrpo, brpo, arpo), not rft"
            ),
        ),
        (
            {"loss": {"tis_cap": 2.0}, "temperature": 0.7},
            "--model.loss.tis_cap needs --data.sampling.temperature 1",
        ),
    ],
)
def test_combinations_read_the_estimator_table(groups, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        check_module_settings(_settings(**groups), None)


@pytest.mark.parametrize(
    ("estimator", "data", "message"),
    [
        (
            "drgrpo",
            {"group_size": 1},
            "--data.training.group_size must be >= 2 for --model.advantage.estimator drgrpo",
        ),
        (
            "grpo",
            {"group_size": 4, "branches": 8},
            (
                "--data.branching.branches 8 needs an estimator that scores every sample by "
                "its own turn reward (rft, state_baseline, state_grpo), not grpo"
            ),
        ),
        (
            "state_grpo",
            {"group_size": 1, "branches": 8, "reward_placement": "last"},
            "--model.advantage.estimator state_grpo compares the K responses",
        ),
    ],
)
def test_data_combinations_read_the_estimator_table(estimator, data, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        check_data_settings(AdvantageSettings(estimator=estimator), data_view(**data))
    # per sample
    check_data_settings(AdvantageSettings(estimator="rft"), data_view(group_size=1, branches=8))


def test_settings_travel_as_plain_dicts_in_hparams_and_the_entropy_coefficient_can_change():
    module = StarPOModule(
        advantage={"estimator": "grpo"},
        loss=PolicyLossSettings(entropy_coeff=0.01),
        optim={"actor_lr": 3e-4},
    )
    assert (
        module.hparams["advantage"]["estimator"] == "grpo"
        and module.hparams["optim"]["actor_lr"] == 3e-4
    )
    assert module.hparams["optim"]["actor_optimizer"] is None
    assert module.settings.loss.entropy_coeff == 0.01
    # callbacks.CollapseMonitor's adjust_entropy: the next iteration's loss reads it
    module.set_entropy_coeff(0.05)
    assert module.settings.loss.entropy_coeff == 0.05
    assert module.hparams["loss"]["entropy_coeff"] == 0.05
    assert not module.uses_critic and module.settings.uses_reference is False
    # a KL loss needs the reference
    assert StarPOModule(loss={"kl_coef": 0.1}).settings.uses_reference


def _code_strings(path: Path):
    """Every string constant of ``path`` outside docstrings and ``__all__``, with its line."""
    tree = ast.parse(path.read_text())
    skip = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (
            isinstance(body, list)
            and body
            and isinstance(body[0], ast.Expr)
            and isinstance(body[0].value, ast.Constant)
        ):
            skip.add(id(body[0].value))
        if isinstance(node, ast.Assign) and any(
            getattr(t, "id", "") == "__all__" for t in node.targets
        ):
            skip.update(id(n) for n in ast.walk(node.value))
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
            yield node.value, node.lineno


# Nucleus sampling's parameters share two filter strategies' names: the data module's
# --data.sampling.top_p / --data.sampling.top_k domains and the OpenAI-compatible request body (a
# different concept, not a filter).
SAMPLING = {
    ("data/settings.py", "top_p"),
    ("data/settings.py", "top_k"),
    ("rollout/api_engine.py", "top_p"),
    ("rollout/api_engine.py", "top_k"),
}


def test_estimator_and_filter_names_are_spelled_once_in_library_code():
    names = set(ESTIMATORS) | set(FILTER_STRATEGIES)
    found: dict[str, list[str]] = {name: [] for name in names}
    for path in sorted(LIB.rglob("*.py")):
        rel = path.relative_to(LIB).as_posix()
        for value, line in _code_strings(path):
            if value in names and (rel, value) not in SAMPLING:
                found[value].append(f"{rel}:{line}")
    assert {name: places for name, places in found.items() if len(places) != 1} == {}


def test_no_settings_dict_is_built_from_hparams_by_string_keys():
    # {k: hp[k] for k in NAMES}: the settings of a group re-gathered from flat hyperparameters by
    # name
    pattern = re.compile(r"\{\s*(\w+)\s*:\s*[\w.]*(hp|hparams)\w*\[\s*\1\s*\]\s+for\b|from_hparams")
    hits = [
        f"{p.relative_to(LIB)}:{i}"
        for p in sorted(LIB.rglob("*.py"))
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if pattern.search(line)
    ]
    assert hits == []


def test_the_update_scores_its_own_old_logprobs_only_in_one_epoch_over_one_mini_batch():
    from ragen_lightning.starpo.settings import scores_in_update

    class Batch:
        def __init__(self, rows=8, chains_turns=False):
            self.rows, self.chains_turns = rows, chains_turns

        def __len__(self):
            return self.rows

    one = ModuleSettings.build(update={"mini_batch_size": 8, "micro_batch_size": 4})
    assert scores_in_update(one, Batch())
    assert not scores_in_update(one, Batch(rows=9))  # two mini-batches: the second is off-policy
    assert not scores_in_update(one, Batch(chains_turns=True))  # chained GAE: returns need all rows
    two = ModuleSettings.build(
        update={"ppo_epochs": 2, "mini_batch_size": 8, "micro_batch_size": 4}
    )
    assert not scores_in_update(two, Batch())
    kl = ModuleSettings.build(
        update={"mini_batch_size": 8, "micro_batch_size": 4}, advantage={"kl_in_reward_coef": 0.1}
    )
    assert not scores_in_update(kl, Batch())  # the penalty needs the old log-probs first
