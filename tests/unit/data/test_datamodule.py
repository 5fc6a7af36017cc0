"""Seed stream and resume state of the RolloutDataModule (no trainer, no model)."""

import pytest

import envs  # noqa: F401
from ragen_lightning.data.sampler import FilterSettings
from tests.data_groups import data_module


def dm(**kw):
    return data_module(**{"env_id": "ragen/Bandit-v0", "num_groups": 3, "group_size": 2, **kw})


def test_train_seeds_advance_per_iteration_like_ragen():
    d = dm(train_seed=10000)
    # iteration n uses 10000 + 3n + g
    assert d.group_seeds(0) == [10000, 10001, 10002]
    assert d.group_seeds(2) == [10006, 10007, 10008]
    seen = {s for n in range(100) for s in d.group_seeds(n)}
    assert len(seen) == 300  # never repeats


def test_validation_seeds_are_fixed_and_disjoint_from_training():
    d = dm(val_seed=123, val_num_groups=64)
    val = set(range(123, 123 + 64))
    train = {s for n in range(1000) for s in d.group_seeds(n)}
    assert not (val & train)


def test_state_dict_round_trip_continues_the_stream():
    d = dm()
    d.iteration, d.consecutive_empty = 7, 2
    state = d.state_dict()
    fresh = dm()
    fresh.load_state_dict(state)
    assert (fresh.iteration, fresh.consecutive_empty) == (7, 2)
    # Lightning's restored progress counts the 7 batches already done, so the epoch length stays the
    # run's total
    assert len(fresh.train_dataloader().dataset) == 200


def test_the_training_loader_is_resumable_with_the_data_modules_state():
    from lightning.pytorch.utilities.combined_loader import CombinedLoader

    d = dm()
    d.iteration, d.consecutive_empty = 7, 2
    combined = CombinedLoader(d.train_dataloader())
    # what Lightning saves (no "not resumable" warning on a mid-run resume)
    states = combined._state_dicts()
    assert states == [{"iteration": 7, "consecutive_empty": 2}]
    fresh = dm()
    CombinedLoader(fresh.train_dataloader())._load_state_dicts(states)
    assert (fresh.iteration, fresh.consecutive_empty) == (7, 2)


@pytest.mark.parametrize(
    "kw, flag",
    [
        ({"num_groups": 0}, "--data.training.num_groups"),
        ({"group_size": 0}, "--data.training.group_size"),
        ({"num_iterations": 0}, "--data.training.num_iterations"),
    ],
)
def test_bad_sizes_name_the_flag(kw, flag):
    with pytest.raises(ValueError, match=flag):
        dm(**kw)


def test_turn_rewards_need_identity_normalisation():
    with pytest.raises(ValueError, match="--data.rewards.norm_method"):
        dm(reward_placement="turn", norm_method="mean_std")


def test_stream_length_is_fixed_and_every_iteration_is_yielded(monkeypatch):
    d = dm(num_iterations=5)
    d.iteration = 1  # resumed after one iteration
    monkeypatch.setattr(d, "train_batch", lambda n: n)
    loader = d.train_dataloader()
    seen = []
    for batch in loader:
        seen.append(batch)
        # Lightning counts the epoch from this, including the batch done before the resume; it must
        # not shrink
        assert len(loader) == 5
    assert seen == [1, 2, 3, 4] and d.iteration == 5


def test_branches_are_refused_where_a_branch_cannot_be_a_scored_one_turn_sample():
    from ragen_lightning.errors import ConfigError
    from ragen_lightning.starpo.checks import check_data_settings

    windowed = {"context_window": "single_turn", "window_turns": 1}
    with pytest.raises(ConfigError, match="--data.branching.branches must be"):
        dm(branches=0)
    with pytest.raises(ConfigError, match="needs --data.rewards.placement turn and a windowed"):
        dm(branches=2, episode=windowed)  # the episode score would not say which branch did well
    with pytest.raises(ConfigError, match="needs --data.rewards.placement turn and a windowed"):
        dm(branches=2, reward_placement="turn")  # full context: one sample per episode
    import gymnasium as gym

    from envs.text.bandit import BanditEnv

    if "test/FixedBandit-v0" not in gym.registry:  # an env that does not opt in
        gym.register(
            "test/FixedBandit-v0",
            entry_point=type("FixedBandit", (BanditEnv,), {"branchable": False}),
        )
    with pytest.raises(ConfigError, match="test/FixedBandit-v0 does not declare branchable = True"):
        dm(branches=2, reward_placement="turn", episode=windowed, env_id="test/FixedBandit-v0")
    # Bandit's state deep-copies: accepted
    d = dm(branches=2, reward_placement="turn", episode=windowed)
    with pytest.raises(
        ConfigError, match="--data.branching.follow best needs --data.branching.branches > 1"
    ):
        dm(branch_follow="best", reward_placement="turn", episode=windowed)  # nothing to pick from
    with pytest.raises(
        ConfigError, match="--data.branching.follow must be one of 'first', 'best', got 'top'"
    ):
        dm(branches=2, reward_placement="turn", episode=windowed, branch_follow="top")
    assert (
        dm(
            branches=2, reward_placement="turn", episode=windowed, branch_follow="best"
        ).settings.branching.follow
        == "best"
    )
    with pytest.raises(
        ConfigError,
        match="--data.filter.over states selects among the responses to each visited "
        "state: it needs --data.branching.branches > 1",
    ):
        dm(reward_placement="turn", episode=windowed, filter=FilterSettings(over="states"))
    states = FilterSettings(over="states")
    built = dm(branches=2, reward_placement="turn", episode=windowed, filter=states)
    assert built.filter.over == "states"
    from ragen_lightning.starpo.settings import AdvantageSettings

    check_data_settings(AdvantageSettings(estimator="rft"), d.settings)
    with pytest.raises(
        ConfigError,
        match=r"--data.branching.branches 2 needs an estimator that scores every sample by its own "
        r"turn reward \(rft, .*\), not gae",
    ):
        check_data_settings(AdvantageSettings(estimator="gae"), d.settings)
