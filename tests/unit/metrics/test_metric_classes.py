"""TorchMetrics classes: hand values, split updates == one update, reset, and a simulated 2-rank merge."""

from __future__ import annotations

import math

import pytest
import torch

from ragen_lightning.metrics import (
    FilterKeepRatio,
    FormatErrorRate,
    LengthMetrics,
    MutualInformation,
    RewardMetrics,
    TokenEntropy,
    ValidThinkingRate,
)
from ragen_lightning.metrics.functional import mutual_information
from ragen_lightning.metrics.rollout import pass_at_k

# Rewards of 2 groups x 4 samples. Group 0: rewards [1, 0, 0, 1], one success; group 1: [0.5]*4, no success.
REWARDS = torch.tensor([[1.0, 0.0, 0.0, 1.0], [0.5, 0.5, 0.5, 0.5]])
SUCCESS = torch.tensor([[True, False, False, False], [False, False, False, False]])
# 3x3 cross log-prob matrix, dyadic entries; split into rows {0} and {1, 2}.
ELL = torch.tensor([[-1.0, -2.0, -3.0], [-2.5, -1.5, -0.5], [-3.0, -2.0, -1.0]])
IDX = torch.tensor([0, 1, 2])


def _close(
    x: dict[str, torch.Tensor], y: dict[str, torch.Tensor], atol: float = 0.0
) -> None:
    assert x.keys() == y.keys()
    for k, value in x.items():
        torch.testing.assert_close(value, y[k], rtol=0, atol=atol, msg=k)


def test_pass_at_k_by_hand():
    # n = 4, c = 1: pass@1 = 1/4; pass@2 = 1 - C(3,2)/C(4,2) = 1 - 3/6 = 1/2; pass@4 = 1 (n - c = 3 < 4)
    c = torch.tensor([1, 0, 4])
    assert pass_at_k(c, 4, 1).tolist() == pytest.approx([0.25, 0.0, 1.0])
    assert pass_at_k(c, 4, 2).tolist() == pytest.approx([0.5, 0.0, 1.0])
    assert pass_at_k(c, 4, 4).tolist() == [1.0, 0.0, 1.0]
    assert pass_at_k(c, 4, 8).tolist() == [1.0, 0.0, 1.0]  # k > n clipped to n


def test_reward_metrics_by_hand():
    m = RewardMetrics()
    m.update(REWARDS, SUCCESS)
    out = m.compute()
    # mean = (2 + 2) / 8 = 0.5; stds: group 0 unbiased std of [1,0,0,1] = sqrt(1/3), group 1 exactly 0
    assert float(out["reward_mean"]) == 0.5
    assert float(out["in_group_reward_std"]) == pytest.approx(
        math.sqrt(1 / 3) / 2, abs=1e-7
    )
    assert float(out["success_rate"]) == 1 / 8
    # pass@k averaged over the two groups (group 1 contributes 0): (1/4)/2, (1/2)/2, 1/2, 1/2
    assert [float(out[f"pass@{k}"]) for k in (1, 2, 4, 8)] == pytest.approx(
        [0.125, 0.25, 0.5, 0.5]
    )


def test_two_updates_equal_one_on_concatenation_and_reset():
    one, two = RewardMetrics(), RewardMetrics()
    one.update(REWARDS, SUCCESS)
    two.update(REWARDS[:1], SUCCESS[:1])
    two.update(REWARDS[1:], SUCCESS[1:])
    _close(one.compute(), two.compute())
    two.reset()
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

    ent = torch.tensor([[1.0, 2.0, 9.0], [0.5, 0.5, 0.5]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    e_one, e_two = TokenEntropy(), TokenEntropy()
    e_one.update(ent, mask)
    e_two.update(ent[:1], mask[:1])
    e_two.update(ent[1:], mask[1:])
    assert (
        float(e_one.compute())
        == float(e_two.compute())
        == pytest.approx((1 + 2 + 0.5) / 3)
    )
    e_two.reset()
    assert float(e_two.compute()) == 0.0


def test_mutual_information_metric_matches_functional_and_splits():
    one = MutualInformation()
    one.update(ELL, IDX)
    ref = mutual_information(ELL, IDX)
    got = one.compute()
    for (
        k,
        v,
    ) in (
        got.items()
    ):  # float64 sums vs the functional's float32 means: equal to ~1e-6 relative
        torch.testing.assert_close(v, ref[k], rtol=1e-5, atol=1e-6, msg=k)
    # Split rows {0} and {1, 2} of the same matrix: the per-row a, b and hits are the same, so every row-mean key is
    # equal; chance@k (k >= 2) is left out: min(1, chance·k_eff) per call differs from the whole matrix's only where
    # the clip binds, which it does here (1/3·3 = 1 for one part).
    two = MutualInformation()
    two.update(ELL[:1], IDX[:1])
    two.update(ELL[1:], IDX[1:])
    split = two.compute()
    for k in (
        "mi",
        "conditional_entropy",
        "marginal_entropy",
        "marginal_std",
        "mi_zscore",
        "retrieval_accuracy",
        "retrieval_accuracy@2",
        "retrieval_chance_level",
        "retrieval_above_chance",
        "mi_upper_bound",
    ):
        torch.testing.assert_close(split[k], got[k], rtol=0, atol=1e-6, msg=k)
    two.reset()
    assert all(float(v) == 0.0 and not torch.isnan(v) for v in two.compute().values())


def test_mutual_information_metric_accumulates_over_all_rows():
    # Two calls with different column sets: the accumulated mi is the mean over all 2 + 3 rows, not of the two means.
    m = MutualInformation(topk=(1,))
    m.update(torch.tensor([[-1.0, -3.0], [-2.0, -0.5]]), torch.tensor([0, 1]))
    m.update(ELL, IDX)
    a1 = mutual_information(
        torch.tensor([[-1.0, -3.0], [-2.0, -0.5]]), torch.tensor([0, 1])
    )
    b1 = mutual_information(ELL, IDX)
    expected = (2 * float(a1["mi"]) + 3 * float(b1["mi"])) / 5
    assert float(m.compute()["mi"]) == pytest.approx(expected, abs=1e-6)
    # mi_upper_bound = (2 log 2 + 3 log 3) / 5
    assert float(m.compute()["mi_upper_bound"]) == pytest.approx(
        (2 * math.log(2) + 3 * math.log(3)) / 5
    )


def test_ratio_metrics():
    v = ValidThinkingRate()
    v.update(torch.tensor([True, False, True, True]))  # 3 / 4
    v.update(torch.tensor(1), torch.tensor(4))  # + 1 / 4 -> 4 / 8
    assert float(v.compute()) == 0.5
    v.reset()
    assert float(v.compute()) == 0.0
    f = FormatErrorRate()
    assert float(f.compute()) == 0.0  # nothing seen: 0, not NaN
    f.update(2, 8)
    assert float(f.compute()) == 0.25
    k = FilterKeepRatio()
    k.update(torch.tensor(3), torch.tensor(8))
    k.update(torch.tensor(1), torch.tensor(8))
    assert float(k.compute()) == 0.25


def _ranks(cls, updates, **kwargs):
    """Single process over all updates vs two 'ranks' (alternating updates) merged as dist_reduce_fx='sum' would."""
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
        TokenEntropy(),
        MutualInformation(),
        ValidThinkingRate(),
    ):
        assert set(metric._reductions) == set(metric._defaults)
        assert all(
            fn.__name__ == "dim_zero_sum" for fn in metric._reductions.values()
        ), type(metric).__name__
    single, merged = _ranks(
        RewardMetrics, [(REWARDS[:1], SUCCESS[:1]), (REWARDS[1:], SUCCESS[1:])]
    )
    _close(single, merged)
    single, merged = _ranks(
        TokenEntropy,
        [
            (torch.tensor([[1.0, 2.0]]), torch.tensor([[1, 1]])),
            (torch.tensor([[4.0, 8.0]]), torch.tensor([[1, 0]])),
        ],
    )
    assert float(single) == float(merged) == pytest.approx(7 / 3)
    single, merged = _ranks(MutualInformation, [(ELL, IDX), (ELL[1:], IDX[1:])])
    _close(single, merged, atol=1e-6)
    single, merged = _ranks(
        ValidThinkingRate, [(torch.tensor([1, 0]),), (torch.tensor([1, 1, 1]),)]
    )
    assert float(single) == float(merged) == pytest.approx(0.8)  # 4 / 5
