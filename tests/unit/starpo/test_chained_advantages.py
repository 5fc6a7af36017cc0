"""StarPO step 3 on per-turn samples with per-turn rewards: GAE over the episode, per-row returns refused."""

import pytest
import torch

from ragen_lightning.data.batching import build_batch
from ragen_lightning.starpo.advantages import advantages_for
from ragen_lightning.types import Conversation, Sample, Trajectory

SETTINGS = {"adv_estimator": "gae", "gamma": 1.0, "lam": 1.0, "turn_level_gae": False, "high_level_gamma": 0.95,
            "kl_in_reward_coef": 0.0, "kl_kind": "k1", "soft_advantage_reweight": False, "filter_loss_scaling": "none",
            "length_weight": False, "zero_task_advantage": False}


def turn_sample(reward: float) -> Sample:
    c = Conversation()
    c.extend([1], sampled=False)
    c.extend([2, 3], sampled=True, logprobs=[-0.5, -0.5])
    c.turn_spans.append((1, 3))
    return Sample(c, [reward])


def test_turn_samples_get_the_returns_of_the_whole_episode_and_rows_alone_are_refused():
    t = Trajectory(env_index=0, group_id=0, seed=0, turn_rewards=[-0.1, 10.0], penalty=0.0, success=True,
                   num_turns=2, response_tokens=4)
    t.samples = [turn_sample(-0.1), turn_sample(10.0)]  # turn 1 malformed (-0.1), turn 2 solves (+10)
    batch = build_batch([t], pad_token_id=0, reward_placement="turn")
    mask = batch.loss_mask[:, 1:].bool()
    values = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    of = advantages_for(batch, mask, None, None, SETTINGS)
    _, returns, _ = of(values, None)
    # gamma = lam = 1: every token's return is the reward to go; turn 1's includes turn 2's +10
    torch.testing.assert_close(returns, torch.tensor([[9.9, 9.9], [10.0, 10.0]]))
    with pytest.raises(ValueError, match="chains an episode"):
        of(values, torch.tensor([0]))
    # the episode score on every sample (RAGEN's turn-level placement): no chaining, each row its own return
    last = build_batch([t], pad_token_id=0)
    _, returns_last, _ = advantages_for(last, mask, None, None, SETTINGS)(values, None)
    torch.testing.assert_close(returns_last, torch.full((2, 2), 9.9))
