"""``--model.advantage.estimator rft`` (rejection-sampling fine-tuning): advantage 1 on the turns /
episodes the env scored above its ``threshold`` option, 0 elsewhere; with it the PPO loss at ratio 1
is the supervised loss on the kept tokens."""

from dataclasses import replace

import pytest
import torch

from ragen_lightning.algos import advantages as A
from ragen_lightning.algos.losses import ppo_policy_loss
from ragen_lightning.data.batching import build_batch
from ragen_lightning.errors import ConfigError
from ragen_lightning.starpo.estimators import advantages_for
from ragen_lightning.starpo.module import StarPOModule
from ragen_lightning.starpo.settings import AdvantageSettings
from ragen_lightning.types import Conversation, Sample, Trajectory

SETTINGS = AdvantageSettings(estimator="rft", floor=None)


def rft(threshold: float = 0.0, per_state: bool = False, **settings) -> AdvantageSettings:
    return replace(SETTINGS, options={"threshold": threshold, "per_state": per_state}, **settings)


def test_each_token_takes_the_verdict_of_its_own_turn():
    # positions:      0  1  2  3  4  5  6   (two turns: trained 1-2 and 4-6; 0 and 3 are prompt / env tokens; 7 pad)
    mask = torch.tensor([[0, 1, 1, 0, 1, 1, 1, 0]])
    ends = torch.tensor([[0, 0, 1, 0, 0, 0, 1, 0]], dtype=torch.bool)
    rewards = torch.tensor([[0.0, 0.0, 0.9, 0.0, 0.0, 0.0, -1.1, 0.0]])
    torch.testing.assert_close(
        A.rft_advantages(rewards, mask, ends, 0.0), torch.tensor([[0.0, 1, 1, 0, 0, 0, 0, 0]])
    )
    torch.testing.assert_close(
        A.rft_advantages(rewards, mask, ends, -2.0),  # both turns above -2
        torch.tensor([[0.0, 1, 1, 0, 1, 1, 1, 0]]),
    )
    # strictly greater: 0.9 is not kept
    torch.testing.assert_close(A.rft_advantages(rewards, mask, ends, 0.9), torch.zeros(1, 8))


def two_turn_episode(index: int, turn_rewards: list[float]) -> Trajectory:
    c = Conversation()
    c.extend([1], sampled=False)
    c.extend([2, 3], sampled=True, logprobs=[-0.5, -0.5])
    c.turn_spans.append((1, 3))
    c.extend([4], sampled=False)
    c.extend([5, 6, 7], sampled=True, logprobs=[-0.5] * 3)
    c.turn_spans.append((4, 7))
    score = sum(turn_rewards)
    t = Trajectory(
        env_index=index,
        group_id=0,
        seed=0,
        turn_rewards=list(turn_rewards),
        penalty=0.0,
        success=score > 0,
        num_turns=2,
        response_tokens=5,
    )
    t.samples = [Sample(c, list(turn_rewards))]
    return t


def trained_advantages(
    placement: str, threshold: float, episodes: list[list[float]]
) -> torch.Tensor:
    batch = build_batch(
        [two_turn_episode(i, r) for i, r in enumerate(episodes)],
        pad_token_id=0,
        reward_placement=placement,
    )
    mask = batch.loss_mask[:, 1:].bool()
    adv, returns, _ = advantages_for(batch, mask, None, None, rft(threshold))(None, None)
    assert torch.equal(adv, returns)
    # per episode: turn 1's two tokens, then turn 2's three
    return adv[mask].reshape(len(episodes), 5)


def test_per_turn_rewards_keep_the_turns_scored_above_the_threshold():
    adv = trained_advantages("turn", 0.0, [[0.9, -1.1], [-0.1, 1.8]])
    torch.testing.assert_close(adv, torch.tensor([[1.0, 1, 0, 0, 0], [0, 0, 1, 1, 1]]))
    adv = trained_advantages("turn", 1.0, [[0.9, -1.1], [-0.1, 1.8]])  # the flag moves the line
    torch.testing.assert_close(adv, torch.tensor([[0.0, 0, 0, 0, 0], [0, 0, 1, 1, 1]]))


def test_an_episode_score_keeps_or_drops_every_turn_of_the_episode():
    # scores -0.2 and 1.7 (the sums): the second episode's turns are all kept, its first turn's -0.1
    # included
    adv = trained_advantages("last", 0.0, [[0.9, -1.1], [-0.1, 1.8]])
    torch.testing.assert_close(adv, torch.tensor([[0.0] * 5, [1.0] * 5]))


def test_at_ratio_one_the_policy_loss_of_kept_tokens_is_the_supervised_loss():
    torch.manual_seed(0)
    logits = torch.randn(2, 3, 7, requires_grad=True)
    targets = torch.randint(0, 7, (2, 3))
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    kept = torch.tensor([[1.0, 1.0, 0.0], [0.0, 1.0, 1.0]])
    logprobs = torch.log_softmax(logits, -1).gather(-1, targets[..., None]).squeeze(-1)
    loss, _ = ppo_policy_loss(logprobs, logprobs.detach(), kept * mask, mask)
    (grad,) = torch.autograd.grad(loss, logits, retain_graph=True)
    # cross-entropy on the kept tokens, over the same token count
    sft = -(logprobs * kept).sum() / mask.sum()
    (sft_grad,) = torch.autograd.grad(sft, logits)
    torch.testing.assert_close(grad, sft_grad)


def test_rft_trains_no_critic_and_refuses_gae_options(tiny_path):
    assert not StarPOModule(model=str(tiny_path), advantage={"estimator": "rft"}).uses_critic
    with pytest.raises(
        ConfigError,
        match=r"^--model.advantage.options.turn_level is not an option "
        r"of --model.advantage.estimator rft; its options: "
        r"threshold, per_state$",
    ):
        StarPOModule(
            model=str(tiny_path), advantage={"estimator": "rft", "options": {"turn_level": True}}
        )
    with pytest.raises(
        ConfigError,
        match="--model.advantage.length_weight applies to the group-outcome estimators .*, not rft",
    ):
        # a kept token's advantage is 1
        StarPOModule(model=str(tiny_path), advantage={"estimator": "rft", "length_weight": True})


def one_turn_sample(reward: float, turn: int) -> Sample:
    c = Conversation()
    c.extend([1], sampled=False)
    c.extend([2, 3], sampled=True, logprobs=[-0.5, -0.5])
    c.turn_spans.append((1, 3))
    return Sample(c, [reward], turn=turn)


def branched_episode(turns: list[list[float]]) -> Trajectory:
    """One episode whose turn k sampled ``len(turns[k])`` responses (a branching rollout: all answer
    turn k's state)."""
    t = Trajectory(
        env_index=0, group_id=0, seed=0, turn_rewards=[r[0] for r in turns], num_turns=len(turns)
    )
    t.samples = [one_turn_sample(r, k + 1) for k, rewards in enumerate(turns) for r in rewards]
    return t


def test_per_state_sharing_gives_each_state_with_a_kept_response_one_unit_of_weight():
    # turn 1: 3 of 4 responses above 0.5; turn 2: 1 of 4; turn 3: none
    episode = branched_episode(
        [[0.9, 0.9, -1.1, 0.9], [-0.1, 0.9, -1.1, -0.1], [-0.1, -0.1, -1.1, -1.1]]
    )
    batch = build_batch([episode], pad_token_id=0, reward_placement="turn")
    assert batch.state_index.tolist() == [0] * 4 + [1] * 4 + [2] * 4
    mask = batch.loss_mask[:, 1:].bool()
    plain, _, _ = advantages_for(batch, mask, None, None, rft(0.5))(None, None)
    shared, returns, _ = advantages_for(batch, mask, None, None, rft(0.5, True))(None, None)
    per_row = lambda a: a[mask].reshape(12, 2)[:, 0].tolist()  # noqa: E731  (both tokens of a row are equal)
    assert per_row(plain) == [1, 1, 0, 1, 0, 1, 0, 0, 0, 0, 0, 0]
    assert per_row(shared) == pytest.approx([1 / 3, 1 / 3, 0, 1 / 3, 0, 1, 0, 0, 0, 0, 0, 0])
    # the weight each state gets: 1 wherever a response was kept, however many were
    assert [sum(per_row(shared)[4 * k : 4 * k + 4]) for k in range(3)] == pytest.approx([1, 1, 0])
    assert torch.equal(shared, returns)


def test_per_state_sharing_leaves_unbranched_samples_alone():
    # two episodes, one response per turn: every sample is its own state, so sharing changes nothing
    episodes = [branched_episode([[0.9], [-1.1]]), branched_episode([[-0.1], [0.9]])]
    episodes[1].env_index = 1
    batch = build_batch(episodes, pad_token_id=0, reward_placement="turn")
    assert batch.state_index.tolist() == [0, 1, 2, 3]
    mask = batch.loss_mask[:, 1:].bool()
    plain, _, _ = advantages_for(batch, mask, None, None, rft(0.5))(None, None)
    shared, _, _ = advantages_for(batch, mask, None, None, rft(0.5, per_state=True))(None, None)
    assert torch.equal(plain, shared) and plain.sum() == 4  # two kept turns of two tokens


def test_per_state_is_an_option_of_rft_only(tiny_path):
    with pytest.raises(
        ConfigError,
        match=r"^--model.advantage.options.per_state is not an option "
        r"of --model.advantage.estimator grpo; its options: "
        r"soft_reweight$",
    ):
        StarPOModule(
            model=str(tiny_path), advantage={"estimator": "grpo", "options": {"per_state": True}}
        )


def test_only_the_kept_rows_enter_the_update_and_keep_their_state_weights():
    from ragen_lightning.starpo.estimators import kept_rows

    # turn 1: 2 of 3 responses kept (weight 1/2 each), turn 2: none, turn 3: 1 of 3
    batch = build_batch(
        [branched_episode([[0.9, -1.1, 0.9], [-0.1, -0.1, -1.1], [-1.1, 0.9, -0.1]])],
        pad_token_id=0,
        reward_placement="turn",
    )
    settings = rft(0.5, per_state=True)
    kept, share = kept_rows(batch, settings)
    assert len(kept) == 3 and share == pytest.approx(3 / 9)
    assert kept.state_index.tolist() == [0, 0, 2] and [
        r[0] for r in kept.turn_ends.nonzero().tolist()
    ] == [0, 1, 2]
    mask = kept.loss_mask[:, 1:].bool()
    adv, _, _ = advantages_for(kept, mask, None, None, settings)(None, None)
    # the same as in the full batch
    assert adv[mask].reshape(3, 2)[:, 0].tolist() == pytest.approx([0.5, 0.5, 1.0])
    # a batch with nothing kept leaves nothing to train; log-prob-shaped rewards keep the batch
    # whole
    assert len(kept_rows(batch, rft(5.0, per_state=True))[0]) == 0
    assert kept_rows(batch, replace(settings, kl_in_reward_coef=0.1)) == (batch, 1.0)
