"""Seed stream and resume state of the RolloutDataModule (no trainer, no model)."""

import pytest

import envs  # noqa: F401
from ragen_lightning.data.datamodule import RolloutDataModule


def dm(**kw):
    return RolloutDataModule(**{"env_id": "ragen/Bandit-v0", "num_groups": 3, "group_size": 2, **kw})


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
    # Lightning's restored progress counts the 7 batches already done, so the epoch length stays the run's total
    assert len(fresh.train_dataloader().dataset) == 200


@pytest.mark.parametrize("kw, flag", [({"num_groups": 0}, "--data.num_groups"), ({"group_size": 0}, "--data.group_size"),
                                      ({"num_iterations": 0}, "--data.num_iterations")])
def test_bad_sizes_name_the_flag(kw, flag):
    with pytest.raises(ValueError, match=flag):
        dm(**kw)


def test_turn_rewards_need_identity_normalisation():
    with pytest.raises(ValueError, match="--data.norm_method"):
        dm(reward_placement="turn", norm_method="mean_std")


def test_stream_length_is_fixed_and_every_iteration_is_yielded(monkeypatch):
    d = dm(num_iterations=5)
    d.iteration = 1  # resumed after one iteration
    monkeypatch.setattr(d, "train_batch", lambda n: n)
    loader = d.train_dataloader()
    seen = []
    for batch in loader:
        seen.append(batch)
        # Lightning counts the epoch from this, including the batch done before the resume; it must not shrink
        assert len(loader) == 5
    assert seen == [1, 2, 3, 4] and d.iteration == 5
