"""TorchMetrics classes: hand values, split updates == one update, reset, and a simulated 2-rank
merge."""

from __future__ import annotations

import math

import pytest
import torch

import ragen_lightning.metrics as metrics_pkg
from ragen_lightning.metrics import LengthMetrics, RewardMetrics, ValidThinkingRate
from ragen_lightning.metrics.functional import pass_at_k, valid_thinking_rate
from ragen_lightning.metrics.rollout import SumStateMetric

# Rewards of 2 groups x 4 samples. Group 0: rewards [1, 0, 0, 1], one success; group 1: [0.5]*4, no
# success.
REWARDS = torch.tensor([[1.0, 0.0, 0.0, 1.0], [0.5, 0.5, 0.5, 0.5]])
SUCCESS = torch.tensor([[True, False, False, False], [False, False, False, False]])


def _close(x: dict[str, torch.Tensor], y: dict[str, torch.Tensor], atol: float = 0.0) -> None:
    assert x.keys() == y.keys()
    for k, value in x.items():
        torch.testing.assert_close(value, y[k], rtol=0, atol=atol, msg=k)


def test_pass_at_k_by_hand():
    # n = 4, c = 1: pass@1 = 1/4; pass@2 = 1 - C(3,2)/C(4,2) = 1 - 3/6 = 1/2; pass@4 = 1 (n - c = 3
    # < 4)
    c = torch.tensor([1, 0, 4])
    assert pass_at_k(c, 4, 1).tolist() == pytest.approx([0.25, 0.0, 1.0])
    assert pass_at_k(c, 4, 2).tolist() == pytest.approx([0.5, 0.0, 1.0])
    assert pass_at_k(c, 4, 4).tolist() == [1.0, 0.0, 1.0]
    assert pass_at_k(c, 4, 8).tolist() == [1.0, 0.0, 1.0]  # k > n clipped to n
    # per-group sizes: n = (4, 2, 3) with c = (1, 0, 1) and k = 2: 1/2 (above), 0, 1 - C(2,2)/C(3,2)
    # = 1 - 1/3 = 2/3
    got = pass_at_k(torch.tensor([1, 0, 1]), torch.tensor([4, 2, 3]), 2).tolist()
    assert got == pytest.approx([0.5, 0.0, 2 / 3])
    # pass@n is exactly the share of groups with a success (the data module's train/pass@group_size)
    assert pass_at_k(torch.tensor([0, 3, 1, 0]), 4, 4).mean().item() == 0.5
    with pytest.raises(ValueError):
        pass_at_k(c, 4, 0)


def test_valid_thinking_rate_functional_and_metric_agree():
    # 2 of 3 turns have a reasoning: 2/3 in float64 (the collapse monitor's value), 0 with no turn
    flags = torch.tensor([True, False, True])
    assert float(valid_thinking_rate(flags)) == 2 / 3
    assert float(valid_thinking_rate(torch.zeros(0, dtype=torch.bool))) == 0.0
    v = ValidThinkingRate()
    v.update(flags)
    assert float(v.compute()) == pytest.approx(2 / 3)


def test_every_metric_class_declares_its_direction():
    for name in metrics_pkg.__all__:
        cls = getattr(metrics_pkg, name)
        if not isinstance(cls, type) or cls is SumStateMetric:
            continue
        assert "higher_is_better" in vars(cls) or cls.__name__ == "RatioMetric", name
        assert cls.full_state_update is False and cls.is_differentiable is False, name
    assert RewardMetrics.higher_is_better is True and ValidThinkingRate.higher_is_better is True
    assert LengthMetrics.higher_is_better is None


def test_reward_metrics_by_hand():
    m = RewardMetrics()
    m.update(REWARDS, SUCCESS)
    out = m.compute()
    # mean = (2 + 2) / 8 = 0.5; stds: group 0 unbiased std of [1,0,0,1] = sqrt(1/3), group 1 exactly
    # 0
    assert float(out["reward_mean"]) == 0.5
    assert float(out["in_group_reward_std"]) == pytest.approx(math.sqrt(1 / 3) / 2, abs=1e-7)
    assert float(out["success_rate"]) == 1 / 8
    # pass@k averaged over the two groups (group 1 contributes 0): (1/4)/2, (1/2)/2, 1/2, 1/2
    assert [float(out[f"pass@{k}"]) for k in (1, 2, 4, 8)] == pytest.approx([0.125, 0.25, 0.5, 0.5])


def test_two_updates_equal_one_on_concatenation_and_reset():
    one, two = RewardMetrics(), RewardMetrics()
    one.update(REWARDS, SUCCESS)
    two.update(REWARDS[:1], SUCCESS[:1])
    two.update(REWARDS[1:], SUCCESS[1:])
    _close(one.compute(), two.compute())
    two.reset()
    # deliberately: the reset state
    with pytest.warns(UserWarning, match="was called before the ``update`` method"):
        assert all(float(v) == 0.0 for v in two.compute().values())

    lens_one, lens_two = LengthMetrics(), LengthMetrics()
    resp, think, turns = (
        torch.tensor([10, 20, 30]),
        torch.tensor([4, 0, 8]),
        torch.tensor([1, 2, 3]),
    )
    lens_one.update(response_tokens=resp, think_tokens=think, turns=turns)
    lens_two.update(response_tokens=resp[:2], think_tokens=think[:2], turns=turns[:2])
    lens_two.update(response_tokens=resp[2:], think_tokens=think[2:], turns=turns[2:])
    out = lens_two.compute()
    _close(lens_one.compute(), out)
    # 60/3 = 20, 12/3 = 4, 6/3 = 2; actions never given -> 0
    assert [
        float(out[k])
        for k in (
            "response_tokens_mean",
            "think_tokens_mean",
            "turns_mean",
            "actions_mean",
        )
    ] == [
        20.0,
        4.0,
        2.0,
        0.0,
    ]


def test_ratio_metrics():
    v = ValidThinkingRate()
    v.update(torch.tensor([True, False, True, True]))  # 3 / 4
    v.update(torch.tensor(1), torch.tensor(4))  # + 1 / 4 -> 4 / 8
    assert float(v.compute()) == 0.5
    v.reset()
    # deliberately: the reset state
    with pytest.warns(UserWarning, match="was called before the ``update`` method"):
        assert float(v.compute()) == 0.0
    v.update(2, 8)
    assert float(v.compute()) == 0.25


def _ranks(cls, updates, **kwargs):
    """Single process over all updates vs two 'ranks' (alternating updates) merged as
    dist_reduce_fx='sum' would."""
    single, r0, r1 = cls(**kwargs), cls(**kwargs), cls(**kwargs)
    for i, args in enumerate(updates):
        single.update(*args)
        (r0 if i % 2 == 0 else r1).update(*args)
    r0.merge_state(r1)
    return single.compute(), r0.compute()


def test_simulated_two_rank_merge_equals_single_process():
    for metric in (
        RewardMetrics(),
        LengthMetrics(),
        ValidThinkingRate(),
    ):
        assert set(metric._reductions) == set(metric._defaults)
        assert all(fn.__name__ == "dim_zero_sum" for fn in metric._reductions.values()), type(
            metric
        ).__name__
    single, merged = _ranks(RewardMetrics, [(REWARDS[:1], SUCCESS[:1]), (REWARDS[1:], SUCCESS[1:])])
    _close(single, merged)
    single, merged = _ranks(
        ValidThinkingRate, [(torch.tensor([1, 0]),), (torch.tensor([1, 1, 1]),)]
    )
    assert float(single) == float(merged) == pytest.approx(0.8)  # 4 / 5
