"""The estimator and filter tables (:mod:`ragen_lightning.registry`): one home for both
``register_*``, entries named by ``module:name`` or an installed entry point, and each entry's
options dataclass checked naming the flag."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import pytest
import torch

from ragen_lightning import registry
from ragen_lightning.algos import filtering
from ragen_lightning.algos.filtering import select_groups
from ragen_lightning.data.sampler import FilterSettings
from ragen_lightning.errors import ConfigError
from ragen_lightning.starpo import estimators
from ragen_lightning.starpo.estimators import starpo_advantages
from ragen_lightning.starpo.settings import AdvantageSettings
from ragen_lightning.types import RolloutBatch

# A user's estimator with its own option and a user's filter strategy: one file each.
USER_FILES = {
    "every_token.py": '''\
"""Advantage ``weight`` on every trained token: a supervised step on every sample, scaled."""
from dataclasses import dataclass

from ragen_lightning.errors import Domain
from ragen_lightning.registry import ESTIMATOR_OPTIONS, register_estimator


@dataclass(frozen=True)
class EveryTokenOptions:
    weight: float = 1.0

    def __post_init__(self):
        Domain(-1, 1).check(f"{ESTIMATOR_OPTIONS}weight", self.weight)


def every_token(batch, rewards, mask, values, options):
    adv = mask.to(rewards.dtype) * options.weight
    return adv, adv, {"train/every_token_weight": options.weight}


register_estimator("every_token", every_token, options=EveryTokenOptions)
''',
    "keep_last.py": '''\
"""Keep the last ``count`` candidate groups, whatever their scores."""
from dataclasses import dataclass

import torch

from ragen_lightning.errors import Domain
from ragen_lightning.registry import FILTER_OPTIONS, register_filter


@dataclass(frozen=True)
class KeepLastOptions:
    count: int = 1

    def __post_init__(self):
        Domain(low=1, integer=True).check(f"{FILTER_OPTIONS}count", self.count)


def keep_last(scores, value, *, options, **_):
    return torch.arange(scores.numel())[-options.count:]


register_filter("keep_last", keep_last, options=KeepLastOptions)
''',
}
ENTRY_POINTS = """\
[ragen_lightning.estimators]
everywhere = userpkg.every_token:every_token

[ragen_lightning.filters]
last_ones = userpkg.keep_last:keep_last
broken = userpkg.nowhere:nothing
"""


def make_user_package(tmp_path, monkeypatch):
    """A folder on ``sys.path`` holding the package ``userpkg`` (:data:`USER_FILES`) and an
    installed distribution's entry points for it; the tables and ``sys.modules`` are restored
    afterwards (a generator: the fixture below, and the integration tests')."""
    site = tmp_path / "site"
    (site / "userpkg").mkdir(parents=True)
    (site / "userpkg" / "__init__.py").write_text("")
    for name, text in USER_FILES.items():
        (site / "userpkg" / name).write_text(text)
    info = site / "userpkg-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: userpkg\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(ENTRY_POINTS)
    monkeypatch.syspath_prepend(str(site))
    saved = [
        (table, dict(table))
        for table in (registry.ESTIMATORS, registry.FILTERS, registry._RESOLVED)
    ]
    yield site
    for table, before in saved:
        table.clear()
        table.update(before)
    for name in [m for m in sys.modules if m == "userpkg" or m.startswith("userpkg.")]:
        del sys.modules[name]


@pytest.fixture
def user_package(tmp_path, monkeypatch):
    yield from make_user_package(tmp_path, monkeypatch)


def one_row_batch(trained: list[int], score: float = 1.0) -> tuple[RolloutBatch, torch.Tensor]:
    """A one-sample batch whose loss mask (target axis) is ``trained``."""
    n = len(trained) + 1
    mask = torch.tensor([[0, *trained]])
    batch = RolloutBatch(
        input_ids=torch.ones(1, n, dtype=torch.long),
        attention_mask=torch.ones(1, n),
        loss_mask=mask,
        rewards=torch.zeros(1, n),
        turn_ends=torch.zeros(1, n, dtype=torch.bool),
        engine_logprobs=torch.zeros(1, n),
        scores=torch.tensor([score]),
        group_index=torch.tensor([0]),
        episode_index=torch.tensor([0]),
    )
    return batch, mask[:, 1:].bool()


def test_one_home_for_both_register_functions():
    from ragen_lightning import starpo

    assert starpo.register_estimator is estimators.register_estimator is registry.register_estimator
    assert filtering.register_filter is registry.register_filter
    assert (
        filtering.FILTER_STRATEGIES is registry.FILTERS and starpo.ESTIMATORS is registry.ESTIMATORS
    )


def test_a_module_name_imports_the_users_file_and_takes_its_options(user_package):
    settings = AdvantageSettings(
        estimator="userpkg.every_token:every_token", options={"weight": 0.5}
    )
    assert settings.estimator_options.weight == 0.5
    assert registry.get_estimator(settings.estimator) is registry.ESTIMATORS["every_token"]
    batch, mask = one_row_batch([1, 1, 0, 1])
    adv, returns, logs = starpo_advantages(
        batch, mask, old_logprobs=None, ref_logprobs=None, values=None, settings=settings
    )
    # 0.5 on the three trained tokens, 0 elsewhere; the mean over trained tokens is the weight
    assert adv.tolist() == [[0.5, 0.5, 0.0, 0.5]] and torch.equal(adv, returns)
    assert logs["train/every_token_weight"] == 0.5 and logs["train/advantage_mean"] == 0.5
    # the defaults when no options are given; bad values name the flag
    assert (
        AdvantageSettings(estimator="userpkg.every_token:every_token").estimator_options.weight
        == 1.0
    )
    with pytest.raises(
        ConfigError,
        match=r"^--model.advantage.options.weight must be a finite number in "
        r"\[-1, 1\], got 2.0$",
    ):
        AdvantageSettings(estimator="userpkg.every_token:every_token", options={"weight": 2})


def test_a_users_filter_selects_with_its_own_option(user_package):
    strategy = "userpkg.keep_last:keep_last"
    # scores [3, 0, 2, 1]: the last two candidates are groups 2 and 3
    assert select_groups(
        torch.tensor([3.0, 0.0, 2.0, 1.0]), strategy, 1.0, options={"count": 2}
    ).tolist() == [2, 3]
    # zero scores dropped first: candidates 0, 2, 3; the last one is group 3
    kept = select_groups(torch.tensor([3.0, 0.0, 2.0, 1.0]), strategy, 1.0, include_zero=False)
    assert kept.tolist() == [3]
    settings = FilterSettings(strategy=strategy, options={"count": 3})
    assert settings.strategy_options.count == 3 and not settings.keeps_everything
    with pytest.raises(
        ConfigError, match=r"^--data.filter.options.count must be an integer >= 1, got 0$"
    ):
        FilterSettings(strategy=strategy, options={"count": 0})


def test_installed_entry_points_name_estimators_and_filters(user_package):
    settings = AdvantageSettings(estimator="everywhere", options={"weight": -0.25})
    assert registry.get_estimator("everywhere").fn.__module__ == "userpkg.every_token"
    assert settings.estimator_options.weight == -0.25
    assert select_groups(torch.tensor([1.0, 2.0, 3.0]), "last_ones", 1.0).tolist() == [2]
    with pytest.raises(
        ConfigError,
        match=r"^--data.filter.strategy broken: its 'ragen_lightning.filters' entry "
        r"point userpkg.nowhere:nothing cannot be loaded",
    ):
        FilterSettings(strategy="broken")


def halve(batch, rewards, mask, values, options):
    """A plain function, never registered: an estimator without options."""
    adv = mask.to(rewards.dtype) / 2
    return adv, adv, {}


def test_a_plain_function_is_an_estimator_without_options():
    name = f"{__name__}:halve"
    entry = registry.get_estimator(name)
    assert entry.fn is halve and entry.options is None and not entry.critic
    batch, mask = one_row_batch([1, 0])
    adv, _, _ = starpo_advantages(
        batch,
        mask,
        old_logprobs=None,
        ref_logprobs=None,
        values=None,
        settings=AdvantageSettings(estimator=name),
    )
    assert adv.tolist() == [[0.5, 0.0]]
    with pytest.raises(
        ConfigError,
        match=rf"^--model.advantage.options.scale is not an option: "
        rf"--model.advantage.estimator {name} takes none$",
    ):
        AdvantageSettings(estimator=name, options={"scale": 2})


@pytest.mark.parametrize(
    ("name", "message"),
    [
        (
            "nosuchpkg.mod:fn",
            "--model.advantage.estimator nosuchpkg.mod:fn: cannot import 'nosuchpkg.mod' "
            "(No module named 'nosuchpkg')",
        ),
        ("math:nosuch", "--model.advantage.estimator math:nosuch: module 'math' has no 'nosuch'"),
        (
            "math:pi",
            "--model.advantage.estimator math:pi is a float, not a function or a registered entry",
        ),
        (
            "nope",
            "--model.advantage.estimator must be one of gae, grpo, drgrpo, brpo, arpo, rft, "
            "state_baseline, "
            "state_grpo (or a module:name, an installed 'ragen_lightning.estimators' entry point",
        ),
    ],
)
def test_a_name_that_is_no_estimator_is_one_line(name, message):
    with pytest.raises(ConfigError) as e:
        AdvantageSettings(estimator=name)
    assert str(e.value).startswith(message) and "\n" not in str(e.value)


@pytest.mark.parametrize(
    ("estimator", "options", "message"),
    [
        (
            "rft",
            {"per_state": "yes"},
            "--model.advantage.options.per_state must be true or false, got 'yes'",
        ),
        (
            "rft",
            {"threshold": "high"},
            "--model.advantage.options.threshold must be a number, got 'high'",
        ),
        (
            "gae",
            {"threshold": 1.0},
            (
                "--model.advantage.options.threshold is not an option of "
                "--model.advantage.estimator gae; its options: gamma, lam, turn_level, "
                "high_level_gamma"
            ),
        ),
        (
            "state_grpo",
            {"threshold": 1.0},
            (
                "--model.advantage.options.threshold is not an option: "
                "--model.advantage.estimator state_grpo takes none"
            ),
        ),
        (
            "grpo",
            [1],
            "--model.advantage.options must be a mapping of the options of "
            "--model.advantage.estimator grpo",
        ),
    ],
)
def test_options_check_their_keys_and_types_naming_the_flag(estimator, options, message):
    with pytest.raises(ConfigError) as e:
        AdvantageSettings(estimator=estimator, options=options)
    assert str(e.value).startswith(message)


def test_options_not_given_stay_unset_so_a_parsers_default_fits_every_entry():
    """The module's default ``AdvantageSettings()`` is the CLI's default: its options stay None
    (not ``gae``'s filled in), so ``--model.advantage.estimator rft`` alone does not inherit
    options rft lacks."""
    assert (
        AdvantageSettings().options is None
        and FilterSettings(strategy="top_k", value=0.5).options is None
    )
    assert AdvantageSettings().estimator_options == estimators.GAEOptions(gamma=1.0, lam=1.0)
    rft = AdvantageSettings(estimator="rft", options={"threshold": 1})
    assert rft.options == estimators.RFTOptions(threshold=1.0) and isinstance(
        rft.options.threshold, float
    )
    assert dataclasses.asdict(rft)["options"] == {
        "threshold": 1.0,
        "per_state": False,
    }  # as hparams save it
    with pytest.raises(
        ConfigError, match="must be a mapping of the options of --model.advantage.estimator grpo"
    ):
        dataclasses.replace(rft, estimator="grpo")  # rft's options are not grpo's


def test_the_user_files_are_small_single_modules():
    assert sorted(USER_FILES) == ["every_token.py", "keep_last.py"]
    assert all(len(text.splitlines()) < 25 for text in USER_FILES.values())
    assert all(Path(name).suffix == ".py" for name in USER_FILES)
