"""StarPO step 3 on per-turn samples with per-turn rewards: GAE over the episode, per-row returns
refused."""

import dataclasses

import pytest
import torch

from ragen_lightning.data.batching import build_batch
from ragen_lightning.starpo.estimators import advantages_for
from ragen_lightning.starpo.settings import AdvantageSettings
from ragen_lightning.types import Conversation, Sample, Trajectory

SETTINGS = AdvantageSettings(estimator="gae", options={"gamma": 1.0, "lam": 1.0})


def turn_sample(reward: float) -> Sample:
    c = Conversation()
    c.extend([1], sampled=False)
    c.extend([2, 3], sampled=True, logprobs=[-0.5, -0.5])
    c.turn_spans.append((1, 3))
    return Sample(c, [reward])


def test_turn_samples_get_the_returns_of_the_whole_episode_and_rows_alone_are_refused():
    t = Trajectory(
        env_index=0,
        group_id=0,
        seed=0,
        turn_rewards=[-0.1, 10.0],
        penalty=0.0,
        success=True,
        num_turns=2,
        response_tokens=4,
    )
    # turn 1 malformed (-0.1), turn 2 solves (+10)
    t.samples = [turn_sample(-0.1), turn_sample(10.0)]
    batch = build_batch([t], pad_token_id=0, reward_placement="turn")
    mask = batch.loss_mask[:, 1:].bool()
    values = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    of = advantages_for(batch, mask, None, None, SETTINGS)
    _, returns, _ = of(values, None)
    # gamma = lam = 1: every token's return is the reward to go; turn 1's includes turn 2's +10
    torch.testing.assert_close(returns, torch.tensor([[9.9, 9.9], [10.0, 10.0]]))
    with pytest.raises(ValueError, match="chains an episode"):
        of(values, torch.tensor([0]))
    # the episode score on every sample (RAGEN's turn-level placement): no chaining, each row its
    # own return
    last = build_batch([t], pad_token_id=0)
    _, returns_last, _ = advantages_for(last, mask, None, None, SETTINGS)(values, None)
    torch.testing.assert_close(returns_last, torch.full((2, 2), 9.9))


def test_explained_variance_by_hand():
    from ragen_lightning.starpo.estimators import explained_variance

    returns = torch.tensor([[0.0, 2.0, 4.0, 99.0]])
    mask = torch.tensor([[True, True, True, False]])  # the last position is not trained: never read
    # a constant prediction is no better than the mean: residuals (-1, 1, 3) vary as much as the
    # returns (var 4)
    assert explained_variance(
        torch.tensor([[1.0, 1.0, 1.0, -50.0]]), returns, mask
    ) == pytest.approx(0.0)
    # residuals (0, 0, 1): variance 1/3, so 1 - (1/3) / 4
    assert explained_variance(torch.tensor([[0.0, 2.0, 3.0, 0.0]]), returns, mask) == pytest.approx(
        11 / 12
    )
    # an offset is not an error of the critic's ranking, but a reversed one is: residuals (-4, 0,
    # 4), var 16
    assert explained_variance(returns + 5.0, returns, mask) == pytest.approx(1.0)
    assert explained_variance(torch.tensor([[4.0, 2.0, 0.0, 0.0]]), returns, mask) == pytest.approx(
        -3.0
    )
    # returns that do not vary: undefined (NaN is dropped by the module's logger)
    assert explained_variance(returns, torch.ones(1, 4), mask) != explained_variance(
        returns, torch.ones(1, 4), mask
    )


def test_the_gae_logs_name_how_well_the_critic_predicted_the_returns():
    t = Trajectory(
        env_index=0,
        group_id=0,
        seed=0,
        turn_rewards=[-0.1, 10.0],
        penalty=0.0,
        success=True,
        num_turns=2,
        response_tokens=4,
    )
    t.samples = [turn_sample(-0.1), turn_sample(10.0)]
    batch = build_batch([t], pad_token_id=0, reward_placement="turn")
    mask = batch.loss_mask[:, 1:].bool()
    perfect = torch.tensor([[9.9, 9.9], [10.0, 10.0]])  # the returns themselves (first test)
    _, _, logs = advantages_for(batch, mask, None, None, SETTINGS)(perfect, None)
    assert logs["critic/explained_variance"] == pytest.approx(1.0)


def test_the_logged_explained_variance_is_the_batch_one_under_turn_level_gae():
    """The settings of a PPO run that seemed to log EV 1.5139 and 8.5651 (its CSV held
    1.5139579772949219e-05 and 8.565187454223633e-05): per-turn rewards on per-turn samples,
    turn-level GAE with high_level_gamma 0, lam = gamma = 1, advantage floor 0. The logged EV is the
    one of all the batch's trained tokens together."""

    def episode(env: int, rewards: list[float]) -> Trajectory:
        t = Trajectory(
            env_index=env,
            group_id=0,
            seed=env,
            turn_rewards=rewards,
            penalty=0.0,
            success=False,
            num_turns=len(rewards),
            response_tokens=2 * len(rewards),
        )
        t.samples = [turn_sample(r) for r in rewards]
        return t

    batch = build_batch(
        [episode(0, [1.0, 3.0]), episode(1, [0.0, 4.0])], pad_token_id=0, reward_placement="turn"
    )
    mask = batch.loss_mask[:, 1:].bool()
    values = torch.tensor([[1.0, 1.0], [2.0, 2.0], [0.0, 0.0], [5.0, 5.0]])
    options = {"turn_level": True, "high_level_gamma": 0.0}
    settings = dataclasses.replace(SETTINGS, options=options, floor=0.0)
    _, returns, logs = advantages_for(batch, mask, None, None, settings)(values, None)
    # high_level_gamma 0: each turn's tokens return that turn's reward
    torch.testing.assert_close(
        returns, torch.tensor([[1.0, 1.0], [3.0, 3.0], [0.0, 0.0], [4.0, 4.0]])
    )
    # returns 1 1 3 3 0 0 4 4: var 20/7; residuals 0 0 1 1 0 0 -1 -1: var 4/7. Episode by episode
    # the EVs are 1 - (1/3)/(4/3) = 0.75 and 1 - (1/3)/(16/3) = 0.9375: neither their sum (1.6875)
    # nor their mean is logged
    assert logs["critic/explained_variance"] == pytest.approx(1 - 4 / 20)
