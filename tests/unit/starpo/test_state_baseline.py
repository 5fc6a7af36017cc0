"""``--model.advantage.estimator state_baseline`` on branching rollouts: every response is scored by
its own turn reward minus the mean turn reward of the K responses that answer the same state (its
visited state's baseline); two-sided, unlike ``rft``, so worse-than-average answers are pushed
down."""

from dataclasses import replace

import pytest
import torch

from ragen_lightning.data.batching import build_batch
from ragen_lightning.errors import ConfigError
from ragen_lightning.starpo.checks import check_data_settings
from ragen_lightning.starpo.estimators import advantages_for, kept_rows
from ragen_lightning.starpo.module import StarPOModule
from tests.data_groups import data_view
from tests.unit.starpo.test_rft import SETTINGS, branched_episode

STATE = replace(SETTINGS, estimator="state_baseline")


def per_row(batch, settings=STATE) -> list[float]:
    mask = batch.loss_mask[:, 1:].bool()
    adv, returns, _ = advantages_for(batch, mask, None, None, settings)(None, None)
    assert torch.equal(adv, returns)
    # two trained tokens per row, both with the row's advantage
    rows = adv[mask].reshape(len(batch), 2)
    assert torch.equal(rows[:, 0], rows[:, 1])
    return rows[:, 0].tolist()


def test_each_response_is_its_turn_reward_minus_its_states_mean():
    # state 1: rewards 2, 0, -1, 3 (mean 1); state 2: all 1 (nothing to compare); state 3: 10, -2,
    # -2, -2 (mean 1)
    episode = branched_episode(
        [[2.0, 0.0, -1.0, 3.0], [1.0, 1.0, 1.0, 1.0], [10.0, -2.0, -2.0, -2.0]]
    )
    batch = build_batch([episode], pad_token_id=0, reward_placement="turn")
    assert per_row(batch) == pytest.approx([1, -1, -2, 2, 0, 0, 0, 0, 9, -3, -3, -3])


def test_state_grpo_divides_by_the_states_std():
    # state 1: 2, 0, -1, 3 (mean 1, unbiased std sqrt(10/3)); state 2: all 1 (no spread: 0, not a
    # division by 0)
    episode = branched_episode([[2.0, 0.0, -1.0, 3.0], [1.0, 1.0, 1.0, 1.0]])
    batch = build_batch([episode], pad_token_id=0, reward_placement="turn")
    std = (10 / 3) ** 0.5
    expected = [1 / std, -1 / std, -2 / std, 2 / std, 0, 0, 0, 0]
    assert per_row(batch, replace(STATE, estimator="state_grpo")) == pytest.approx(
        expected, rel=1e-5
    )


def test_states_of_different_episodes_are_never_mixed():
    a, b = branched_episode([[1.0, 0.0]]), branched_episode([[5.0, 3.0]])
    b.env_index = 1
    batch = build_batch([a, b], pad_token_id=0, reward_placement="turn")
    assert batch.state_index.tolist() == [0, 0, 1, 1]
    # each against its own state's mean (0.5, 4)
    assert per_row(batch) == pytest.approx([0.5, -0.5, 1, -1])


def test_the_update_takes_the_rows_with_an_advantage_and_their_values_do_not_change():
    # state 1: 2, 0, 1 (mean 1: the response scored 1 has advantage 0); state 2: no spread
    episode = branched_episode([[2.0, 0.0, 1.0], [0.5, 0.5, 0.5]])
    batch = build_batch([episode], pad_token_id=0, reward_placement="turn")
    kept, share = kept_rows(batch, STATE)
    assert kept.state_index.tolist() == [0, 0] and share == pytest.approx(2 / 6)
    # the state's mean is unchanged without its mean response
    assert per_row(kept) == pytest.approx([1, -1])


def test_state_grpo_keeps_a_states_response_at_the_mean_so_its_std_does_not_change():
    # 2, 0, 1: mean 1, std 1 -> advantages 1, -1, 0; without the response at the mean the std would
    # be sqrt(2)
    batch = build_batch(
        [branched_episode([[2.0, 0.0, 1.0], [0.5, 0.5, 0.5]])],
        pad_token_id=0,
        reward_placement="turn",
    )
    settings = replace(STATE, estimator="state_grpo")
    kept, share = kept_rows(batch, settings)
    assert kept.state_index.tolist() == [0, 0, 0] and share == pytest.approx(3 / 6)
    assert (
        per_row(kept, settings)
        == per_row(batch, settings)[:3]
        == pytest.approx([1, -1, 0], abs=1e-5)
    )


def test_a_batch_without_branches_is_refused():
    episodes = [branched_episode([[1.0], [0.0]])]
    with pytest.raises(ValueError, match="state_baseline needs per-turn rewards"):
        per_row(build_batch(episodes, pad_token_id=0, reward_placement="last"))


def test_the_settings_it_needs_are_checked(tiny_path):
    module = StarPOModule(model=str(tiny_path), advantage={"estimator": "state_baseline"})
    adv = module.advantage
    assert (
        adv.estimator == "state_baseline"
        and module.hparams["advantage"]["estimator"] == "state_baseline"
    )
    assert not module.uses_critic
    check_data_settings(adv, data_view(group_size=1, branches=8, reward_placement="turn"))
    with pytest.raises(
        ConfigError, match="needs --data.branching.branches >= 2 and --data.rewards.placement turn"
    ):
        check_data_settings(adv, data_view(group_size=1, branches=1, reward_placement="turn"))
    with pytest.raises(ConfigError, match=r"placement 'last'"):
        check_data_settings(adv, data_view(group_size=1, branches=8, reward_placement="last"))
    with pytest.raises(
        ConfigError,
        match=r"--data.branching.branches 8 needs an estimator that scores every sample by its own "
        r"turn reward \(rft, state_baseline, state_grpo\), not grpo",
    ):
        check_data_settings(
            replace(adv, estimator="grpo"),
            data_view(group_size=4, branches=8, reward_placement="turn"),
        )
