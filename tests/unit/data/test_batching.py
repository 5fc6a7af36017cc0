"""Batch building, reward placement/normalisation and the filtering sampler on hand-built
trajectories."""

import dataclasses
from dataclasses import replace

import pytest
import torch

from ragen_lightning.data.batching import build_batch, normalize_scores, rollout_metrics
from ragen_lightning.data.sampler import FilterSettings, filter_groups, filter_states
from ragen_lightning.errors import ConfigError
from ragen_lightning.types import Conversation, Sample, Trajectory


def conv(spec):
    """spec: list of (token, sampled) -> Conversation with turn spans over the sampled runs."""
    c = Conversation()
    start = None
    for i, (tok, sampled) in enumerate(spec):
        c.extend([tok], sampled=sampled, logprobs=[-0.5] if sampled else None)
        if sampled and start is None:
            start = i
        if not sampled and start is not None:
            c.turn_spans.append((start, i))
            start = None
    if start is not None:
        c.turn_spans.append((start, len(spec)))
    return c


def traj(group, index, turn_rewards, penalty=0.0, success=False, spec=None, turns=None):
    spec = spec or [(1, False), (2, False), (3, True), (4, True)]
    t = Trajectory(
        env_index=index,
        group_id=group,
        seed=group,
        turn_rewards=list(turn_rewards),
        penalty=penalty,
        success=success,
        num_turns=turns or len(turn_rewards),
        response_tokens=2,
    )
    t.samples = [Sample(conv(spec), [r for r in turn_rewards])]
    return t


def test_last_placement_puts_score_on_last_sampled_token():
    two_turns = [(1, False), (5, True), (6, True), (7, False), (8, True)]
    t = traj(0, 0, [0.5, 1.0], penalty=-0.1, spec=two_turns)
    b = build_batch([t, traj(0, 1, [0.0], spec=[(1, False), (2, True)])], pad_token_id=0)
    # row 0: score 0.5 + 1.0 - 0.1 = 1.4 on position 4 (the last sampled token); row 1 is padded to
    # length 5
    assert b.input_ids.tolist() == [[1, 5, 6, 7, 8], [1, 2, 0, 0, 0]]
    assert b.loss_mask.tolist() == [[0, 1, 1, 0, 1], [0, 1, 0, 0, 0]]
    assert b.attention_mask.tolist() == [[1, 1, 1, 1, 1], [1, 1, 0, 0, 0]]
    assert b.rewards[0].tolist() == pytest.approx([0, 0, 0, 0, 1.4])
    assert b.rewards[1].tolist() == [0, 0, 0, 0, 0]  # score 0 on position 1
    assert b.turn_ends[0].tolist() == [False, False, True, False, True]
    assert b.engine_logprobs[0].tolist() == [0, -0.5, -0.5, 0, -0.5]


def test_turn_placement_keeps_each_turn_reward_and_penalty():
    two_turns = [(1, False), (5, True), (6, True), (7, False), (8, True)]
    t = traj(0, 0, [0.5, 1.0], spec=two_turns)
    t.samples[0].turn_rewards = [0.4, 1.0]  # turn 1 carried a -0.1 format penalty
    b = build_batch([t], pad_token_id=0, reward_placement="turn")
    assert b.rewards[0].tolist() == pytest.approx([0, 0, 0.4, 0, 1.0])
    with pytest.raises(ValueError, match="identity"):
        build_batch([t], pad_token_id=0, reward_placement="turn", norm_method="mean_std")


def test_normalize_scores_methods():
    s = torch.tensor([1.0, 3.0, 5.0, 5.0])
    g = torch.tensor([0, 0, 1, 1])
    assert normalize_scores(s, g, "state", "identity").tolist() == [1, 3, 5, 5]
    assert normalize_scores(s, g, "state", "mean").tolist() == [-1, 1, 0, 0]
    # group 0: mean 2, unbiased std sqrt(2) -> (+-1)/sqrt(2); group 1 has std 0 -> zeros
    z = normalize_scores(s, g, "state", "mean_std")
    assert z.tolist() == pytest.approx([-(2**-0.5), 2**-0.5, 0, 0], abs=1e-5)
    # batch grouping: mean 3.5, std = sqrt((2.5^2 + 0.5^2 + 2 * 1.5^2) / 3) = sqrt(11/3)
    zb = normalize_scores(s, g, "batch", "mean_std")
    assert zb[0].item() == pytest.approx(-2.5 / (11 / 3) ** 0.5, abs=1e-5)
    # asym_clip clamps to [-1, 3]
    big = normalize_scores(
        torch.tensor([0.0, 0.0, 0.0, 10.0]), torch.zeros(4, dtype=torch.long), "state", "asym_clip"
    )
    assert big.tolist() == pytest.approx([-0.5, -0.5, -0.5, 1.5], abs=1e-5)
    # singletons (validation) are left alone
    assert normalize_scores(s, torch.arange(4), "state", "mean_std").tolist() == [1, 3, 5, 5]
    with pytest.raises(ValueError, match="method"):
        normalize_scores(s, g, "state", "zscore")


def test_turn_level_samples_share_episode_score_and_normalise_once():
    a = traj(0, 0, [1.0])
    a.samples.append(Sample(conv([(9, False), (3, True)]), [0.0]))  # two samples of one episode
    b = build_batch([a, traj(0, 1, [0.0])], pad_token_id=0, norm_method="mean")
    # episode scores 1 and 0 -> mean 0.5 -> +0.5 / -0.5; both samples of episode 0 carry +0.5
    assert b.episode_index.tolist() == [0, 0, 1]
    assert b.scores.tolist() == pytest.approx([0.5, 0.5, -0.5])


def test_turn_placement_on_turn_samples_chains_the_episode_for_gae():
    a = traj(0, 0, [0.5])
    # a second turn sample of episode 0
    a.samples.append(Sample(conv([(9, False), (3, True)]), [1.0]))
    rows = [a, traj(0, 1, [0.0])]
    assert build_batch(rows, pad_token_id=0, reward_placement="turn").chains_turns
    # episode score on every sample: never chained
    assert not build_batch(rows, pad_token_id=0).chains_turns
    assert not build_batch(
        [traj(0, 0, [0.5]), traj(0, 1, [0.0])],
        pad_token_id=0,
        # one sample per episode: nothing to chain
        reward_placement="turn",
    ).chains_turns
    b = build_batch(rows, pad_token_id=0, reward_placement="turn")
    assert b.select(torch.tensor([0, 1])).chains_turns and b.to("cpu").per_turn_rewards


def test_empty_batch():
    b = build_batch([], pad_token_id=0)
    assert len(b) == 0 and b.input_ids.shape == (0, 1)


def test_rollout_metrics_by_hand():
    ts = [
        traj(0, 0, [1.0], success=True),
        traj(0, 1, [0.0]),
        traj(1, 2, [0.0], penalty=-0.2),
        traj(1, 3, [0.0]),
    ]
    ts[2].num_format_errors = 2
    ts[2].num_turns = 3
    m = rollout_metrics(ts, group_size=2)
    assert m["success"] == 0.25 and m["pass@2"] == 0.5
    assert m["return"] == 0.25 and m["score"] == pytest.approx((1.0 - 0.2) / 4)
    # turns 1 + 1 + 3 + 1 = 6, format errors 2 -> 1/3; response tokens 2 each -> 8 / 6
    assert m["format_error_rate"] == pytest.approx(1 / 3) and m["response_length"] == pytest.approx(
        8 / 6
    )


def group_rollout(rewards):
    """rewards: [G][N] episode scores -> group-major trajectories."""
    out = []
    for g, row in enumerate(rewards):
        for n, r in enumerate(row):
            out.append(traj(g, g * len(row) + n, [r]))
    return out


def test_filter_default_keeps_everything_and_reports_stats():
    ts = group_rollout([[0.0, 1.0], [1.0, 1.0], [0.0, 0.0]])
    kept, idx, m = filter_groups(ts, 2, FilterSettings())
    assert len(kept) == 6 and idx.tolist() == [0, 1, 2]
    # group stds: sqrt(0.5), 0, 0 -> mean sqrt(0.5)/3; two groups have zero variance
    assert m["rollout/in_group_reward_std"] == pytest.approx(0.5**0.5 / 3)
    assert m["rollout/in_group_std"] == m["rollout/in_group_reward_std"]
    assert m["rollout/filter_zero_count"] == 2 and m["rollout/filter_kept_ratio"] == 1.0


def test_starpo_s_filter_drops_zero_variance_groups():
    ts = group_rollout([[0.0, 1.0], [1.0, 1.0], [0.0, 0.5]])
    cfg = FilterSettings(strategy="top_p", value=0.9, include_zero=False)
    kept, idx, m = filter_groups(ts, 2, cfg)
    # stds 0.707, 0, 0.354 -> threshold 0.9*1.061-0.01 = 0.945: needs both non-zero groups
    assert idx.tolist() == [0, 2] and [t.group_id for t in kept] == [0, 0, 2, 2]
    assert m["rollout/filter_kept_count"] == 2


def test_filter_all_zero_variance_is_empty_and_config_errors():
    ts = group_rollout([[1.0, 1.0], [0.0, 0.0]])
    kept, idx, _ = filter_groups(ts, 2, FilterSettings(value=0.9))
    assert kept == [] and idx.numel() == 0
    assert FilterSettings(metric="reward_std").metric == "reward_variance"
    with pytest.raises(ValueError, match="filter.metric"):
        FilterSettings(metric="loss")
    with pytest.raises(ValueError, match="filter.value"):
        FilterSettings(value=-1)


def test_filter_settings_are_frozen_and_change_by_a_checked_copy():
    # in-group stds (two samples: |a - b| / sqrt 2): .7071, .1414, .3536; sum 1.2021
    ts = group_rollout([[0.0, 1.0], [0.0, 0.2], [0.0, 0.5]])
    base = FilterSettings(value=0.9, include_zero=False)
    with pytest.raises(dataclasses.FrozenInstanceError):
        base.value = 0.5  # type: ignore[misc]
    # linear top_p 0.9: threshold .9 x 1.2021 - .01 = 1.0719; .7071 + .3536 = 1.0607 falls short:
    # all three
    assert filter_groups(ts, 2, base)[1].tolist() == [0, 1, 2]
    # eps .05 (top_p's option): threshold 1.0319, reached by .7071 + .3536: groups 0 and 2
    assert filter_groups(ts, 2, replace(base, options={"eps": 0.05}))[1].tolist() == [0, 2]
    tighter = base.with_value(0.5)  # threshold .5 x 1.2021 - .01 = .591: .7071 alone
    assert base.value == 0.9 and tighter == replace(base, value=0.5)
    assert filter_groups(ts, 2, tighter)[1].tolist() == [0]
    # softmax 0.5: p = softmax(.7071, .1414, .3536) = .4405, .2502, .3093; .4405 < .5 -> k = 2
    softmax = replace(tighter, options={"mode": "softmax"})
    assert softmax.strategy_options.mode == "softmax"
    assert filter_groups(ts, 2, softmax)[1].tolist() == [0, 2]
    with pytest.raises(ConfigError, match=r"^--data.filter.value must be a whole number .*1.6$"):
        FilterSettings(strategy="top_k_abs", value=2).with_value(1.6)


def test_length_filter_uses_response_tokens():
    ts = group_rollout([[0.0, 0.0], [0.0, 0.0]])
    for t in ts[2:]:
        t.response_tokens = 10
    _, idx, m = filter_groups(ts, 2, FilterSettings(strategy="top_k_abs", value=1, metric="length"))
    assert idx.tolist() == [1] and m["rollout/in_group_length_mean"] == pytest.approx(6.0)


def branching(state_rewards):
    """A batch of one episode whose turn t was answered K times with turn rewards
    ``state_rewards[t]``, as a branching rollout builds it."""
    t = Trajectory(
        env_index=0,
        group_id=0,
        seed=0,
        turn_rewards=[r[0] for r in state_rewards],
        penalty=0.0,
        success=False,
        num_turns=len(state_rewards),
        response_tokens=2,
    )
    t.samples = [
        Sample(conv([(1, False), (2 + k, True)]), [r], turn=turn)
        for turn, rewards in enumerate(state_rewards)
        for k, r in enumerate(rewards)
    ]
    return build_batch([t], pad_token_id=0, reward_placement="turn")


def test_state_filter_keeps_the_states_with_most_turn_reward_spread():
    # three states x K = 2: stds 0, 0.7071 * 2 = 1.414, 0.7071 * 0.2 = 0.141 (unbiased std of two
    # values: |a-b|/sqrt 2)
    b = branching([[-0.2, -0.2], [1.8, -0.2], [-0.2, -0.1]])
    assert b.state_index.tolist() == [0, 0, 1, 1, 2, 2]
    cfg = FilterSettings(strategy="top_p", value=0.9, include_zero=False, over="states")
    kept, m = filter_states(b, cfg)
    # linear top_p: threshold 0.9 x (1.414 + 0.141) - 0.01 = 1.390; 1.414 alone reaches it -> the
    # second state only
    assert kept.rewards[:, 1:].sum(dim=-1).tolist() == pytest.approx([1.8, -0.2])
    assert m["rollout/filter_kept_count"] == 1.0 and m[
        "rollout/filter_kept_ratio"
    ] == pytest.approx(1 / 3)
    assert m["rollout/filter_zero_count"] == 1.0
    assert m["rollout/in_group_std"] == pytest.approx((0 + 2 / 2**0.5 + 0.1 / 2**0.5) / 3)
    # value 1.0 with zero-variance states dropped: the two states with spread, rows in batch order
    kept, _ = filter_states(b, FilterSettings(value=1.0, include_zero=False, over="states"))
    assert kept.rewards[:, 1:].sum(dim=-1).tolist() == pytest.approx([1.8, -0.2, -0.2, -0.1])
    # the default keeps every state
    kept, m = filter_states(b, FilterSettings(over="states"))
    assert len(kept) == 6 and m["rollout/filter_kept_ratio"] == 1.0


def test_state_filter_refuses_what_it_cannot_score():
    with pytest.raises(
        ConfigError, match="turn rewards: --data.filter.metric must be reward_variance"
    ):
        FilterSettings(metric="length", over="states")
    with pytest.raises(ConfigError, match="--data.filter.over must be 'groups' or 'states'"):
        FilterSettings(over="episodes")
    unbranched = build_batch([traj(0, 0, [1.0])], pad_token_id=0, reward_placement="turn")
    with pytest.raises(ConfigError, match="every state of the batch has one response"):
        filter_states(unbranched, FilterSettings(over="states"))
    last = build_batch([traj(0, 0, [1.0])], pad_token_id=0)
    with pytest.raises(ConfigError, match="needs branching rollouts"):
        filter_states(last, FilterSettings(over="states"))
