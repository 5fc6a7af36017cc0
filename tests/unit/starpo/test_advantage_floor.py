"""StarPO step 3 with ``--model.advantage.floor``: advantages clamped from below after the
estimator's normalisation."""

import math

import pytest
import torch

from ragen_lightning.data.batching import build_batch
from ragen_lightning.starpo.estimators import advantages_for
from ragen_lightning.starpo.settings import AdvantageSettings
from ragen_lightning.types import Conversation, Sample, Trajectory


def episode(index: int, score: float) -> Trajectory:
    c = Conversation()
    c.extend([1], sampled=False)
    c.extend([2, 3], sampled=True, logprobs=[-0.5, -0.5])
    c.turn_spans.append((1, 3))
    t = Trajectory(
        env_index=index,
        group_id=0,
        seed=0,
        turn_rewards=[score],
        penalty=0.0,
        success=score > 0,
        num_turns=1,
        response_tokens=2,
    )
    t.samples = [Sample(c, [score])]
    return t


def advantages(
    estimator: str, floor: float | None, values: torch.Tensor | None = None
) -> torch.Tensor:
    batch = build_batch(
        [episode(i, s) for i, s in enumerate([0.0, 0.0, 10.0, 10.0])], pad_token_id=0
    )
    mask = batch.loss_mask[:, 1:].bool()
    settings = AdvantageSettings(estimator=estimator, floor=floor)
    adv, _, _ = advantages_for(batch, mask, None, None, settings)(values, None)
    return adv[mask].reshape(4, 2)


@pytest.mark.parametrize(
    ("estimator", "floor", "expected"),
    [
        # one group (0, 0, 10, 10): mean 5, unbiased std sqrt(100 / 3), so GRPO gives -+0.866
        ("grpo", None, [-math.sqrt(0.75)] * 2 + [math.sqrt(0.75)] * 2),
        # the failures teach nothing, the successes as before
        ("grpo", 0.0, [0.0, 0.0] + [math.sqrt(0.75)] * 2),
        ("grpo", -0.5, [-0.5, -0.5] + [math.sqrt(0.75)] * 2),
        ("drgrpo", 0.0, [0.0, 0.0, 5.0, 5.0]),  # score minus the group's mean, negatives dropped
    ],
)
def test_the_floor_clamps_each_trained_token_of_an_episode(estimator, floor, expected):
    torch.testing.assert_close(
        advantages(estimator, floor), torch.tensor(expected).unsqueeze(1).expand(4, 2)
    )


def test_with_a_critic_the_floor_applies_to_the_whitened_advantages():
    # values 0: returns = the scores; whitened over the 8 tokens (mean 5, unbiased std sqrt(200 /
    # 7))
    plain = advantages("gae", None, torch.zeros(4, 2))
    floored = advantages("gae", 0.0, torch.zeros(4, 2))
    torch.testing.assert_close(plain[2:], torch.full((2, 2), 5.0 / math.sqrt(200 / 7)))
    torch.testing.assert_close(floored, plain.clamp(min=0.0))
    assert (plain[:2] < 0).all()
