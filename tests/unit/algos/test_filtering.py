"""Rollout filtering: the 18 cases of RAGEN's `tests/test_rollout_filter.py`, the selection of its
`ragen/trainer/rollout_filter.py`, and properties."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ragen_lightning.algos.filtering import (
    SCORE_METRICS,
    TopPOptions,
    filter_metrics,
    group_scores,
    kept_sample_mask,
    select_groups,
)

T = torch.tensor
LINEAR, SOFTMAX = TopPOptions(mode="linear"), TopPOptions(mode="softmax")  # top_p's two modes


def close(actual, expected, atol: float = 1e-6) -> None:
    actual = torch.as_tensor(actual)
    torch.testing.assert_close(
        actual, torch.as_tensor(expected, dtype=actual.dtype), atol=atol, rtol=1e-6
    )


def kept(*indices: int) -> torch.Tensor:
    return T(list(indices), dtype=torch.long)


# ------------------------------------------------------------------- RAGEN's tests/test_rollout_filter.py cases
# RAGEN's helper batch: token scores arange(G*S*T).reshape(G*S, T), loss mask all ones, groups of
# contiguous rows.


def _helper_batch(num_groups: int, group_size: int, horizon: int) -> torch.Tensor:
    rows = num_groups * group_size
    return torch.arange(rows * horizon, dtype=torch.float32).reshape(rows, horizon)


def test_case01_reward_variance_filter_reduces_batch_size():
    # G=4, S=2, T=3: per-sample sums 3, 12, 21, ..., 66; every group (a, a+9) has std 9/sqrt(2) =
    # 6.3639610 top_k 0.5 -> k = max(int(0.5*4), 1) = 2; all tied -> the lower indices [0, 1] -> 2*2
    # = 4 rows
    token_scores = _helper_batch(4, 2, 3)
    per_sample = token_scores.sum(-1).reshape(4, 2)
    scores = group_scores(per_sample)
    close(scores, [9 / math.sqrt(2)] * 4, atol=1e-5)
    selected = select_groups(scores, "top_k", 0.5)
    assert torch.equal(selected, kept(0, 1))
    rows = kept_sample_mask(selected, 4, 2)
    assert int(rows.sum()) == 4
    assert "in_group_std" in filter_metrics(per_sample, scores, selected)
    close(filter_metrics(per_sample, scores, selected)["in_group_std"], 9 / math.sqrt(2), atol=1e-5)


def test_case02_entropy_filter_keeps_higher_entropy_group():
    # entropys = linspace(.1, 1, 24).reshape(6, 4), step d = .9/23; per-sample masked mean over 4
    # tokens: row i -> .1 + d*(4i + 1.5). Group means: group 0 (rows 0-2) .1 + 5.5d = .3152174,
    # group 1 .1 + 17.5d = .7847826 metric entropy (in-group mean), top_k .5 -> k = 1 -> group 1 ->
    # 3 rows
    entropys = torch.linspace(0.1, 1.0, 24).reshape(6, 4)
    per_sample = entropys.mean(-1).reshape(2, 3)
    d = 0.9 / 23
    scores = group_scores(per_sample, "entropy")
    close(scores, [0.1 + 5.5 * d, 0.1 + 17.5 * d], atol=1e-6)
    selected = select_groups(scores, "top_k", 0.5)
    assert torch.equal(selected, kept(1))
    assert int(kept_sample_mask(selected, 2, 3).sum()) == 3
    # in-group entropy std: rows of a group are (a, a+4d, a+8d) -> std 4d = .1565217
    close(filter_metrics(per_sample, scores, selected)["in_group_std"], 4 * d, atol=1e-6)


def test_case03_reward_metric_selects_high_mean_group():
    # samples [10, 11 | 0, 5]: group means 10.5, 2.5 -> top_k .5 keeps group 0 -> retained scores
    # [10, 11]
    token_scores = T([[10.0], [11.0], [0.0], [5.0]])
    per_sample = token_scores.sum(-1).reshape(2, 2)
    selected = select_groups(group_scores(per_sample, "reward"), "top_k", 0.5)
    rows = kept_sample_mask(selected, 2, 2)
    assert token_scores[rows].flatten().tolist() == [10.0, 11.0]


def test_case04_reward_sum_keeps_top_half_groups():
    # row sums 5, 5 | 3, 3 | 4, 3 | 1, 0 -> group sums 10, 6, 7, 1 -> top_k .5 -> groups [0, 2]
    # in_group_sum = mean(10, 6, 7, 1) = 6.0; chosen = mean(10, 7) = 8.5
    token_scores = T(
        [
            [3.0, 2.0],
            [1.0, 4.0],
            [2.0, 1.0],
            [1.0, 2.0],
            [2.0, 2.0],
            [1.0, 2.0],
            [0.0, 1.0],
            [0.0, 0.0],
        ]
    )
    per_sample = token_scores.sum(-1).reshape(4, 2)
    scores = group_scores(per_sample, "reward_sum")
    close(scores, [10.0, 6.0, 7.0, 1.0])
    selected = select_groups(scores, "top_k", 0.5)
    assert torch.equal(selected, kept(0, 2))
    retained = token_scores[kept_sample_mask(selected, 4, 2)]
    assert retained.tolist() == [[3.0, 2.0], [1.0, 4.0], [2.0, 2.0], [1.0, 2.0]]
    metrics = filter_metrics(per_sample, scores, selected)
    assert metrics["in_group_sum"] == pytest.approx(6.0)
    assert metrics["chosen_in_group_sum"] == pytest.approx(8.5)


def test_case05_reward_sum_metric_is_supported():
    # RAGEN builds a RewardRolloutFilter with metric reward_sum; here: the metric exists and sums
    # each group.
    assert "reward_sum" in SCORE_METRICS
    close(group_scores(T([[1.0, 2.0], [3.0, 4.0]]), "reward_sum"), [3.0, 7.0])


def test_case06_top_p_softmax_preserves_previous_behavior():
    # p = [1/3, 1/3, 1/3], cumsum [.333, .667, 1]; first cumsum >= .6 at index 1 -> k = 2 -> [0, 1]
    assert torch.equal(select_groups(T([1.0, 1.0, 1.0]), "top_p", 0.6, options=SOFTMAX), kept(0, 1))


def test_case07_top_p_linear_matches_score_sum_rule():
    # thr = .6*10 - .01 = 5.99; 4 < 5.99 -> add -> 4; 4 < 5.99 -> add 3 -> 7 >= 5.99 -> keep 2 ->
    # [0, 1]
    out = select_groups(T([4.0, 3.0, 2.0, 1.0]), "top_p", 0.6, options=LINEAR)
    assert torch.equal(out, kept(0, 1))


def test_case08_top_p_linear_returns_empty_when_mass_is_non_positive():
    # thr = .9*0 - .01 = -.01; 0 >= -.01 at once -> count 0 -> nothing kept
    out = select_groups(T([0.0, 0.0, 0.0]), "top_p", 0.9, options=LINEAR)
    assert out.numel() == 0 and out.dtype == torch.long


@pytest.mark.parametrize(
    ("scores", "expected"),
    [
        ([4.0, 2.0, 0.0, 0.0], [0, 1, 2, 3]),
        ([0.0, 0.0, 0.0], [0, 1, 2]),
        ([1.0, 3.0, 2.0], [0, 1, 2]),
    ],
    ids=["case09a", "case09b", "case09c"],
)
def test_case09_top_p_nofilter_keeps_all_groups(scores, expected):
    # value >= 1 with include_zero keeps every group
    out = select_groups(T(scores), "top_p", 1.0, options=LINEAR, include_zero=True)
    assert out.tolist() == expected


@pytest.mark.parametrize(
    ("scores", "value", "expected"),
    [
        # zeros dropped; [10, 1]: p = [.99988, .00012] -> cumsum >= .9 at 0 -> k = 1
        ([10.0, 1.0, 0.0, 0.0], 0.9, [0]),
        # [4, 2]: p = [.8808, .1192] -> cumsum [.8808, 1] -> k = 2
        ([4.0, 2.0, 0.0, 0.0], 0.9, [0, 1]),
        # [1, 1, 1]: cumsum [.333, .667, 1] >= .6 at 1 -> k = 2
        ([1.0, 1.0, 1.0, 0.0], 0.6, [0, 1]),
    ],
    ids=["case10a", "case10b", "case10c"],
)
def test_case10_top_p_softmax_excludes_zero(scores, value, expected):
    out = select_groups(T(scores), "top_p", value, options=SOFTMAX, include_zero=False)
    assert out.tolist() == expected


@pytest.mark.parametrize(
    ("scores", "expected"),
    [
        ([10.0, 1.0, 0.0, 0.0], [0]),  # thr .9*11 - .01 = 9.89: 10 -> done, 1 group
        ([4.0, 2.0, 0.0, 0.0], [0, 1]),  # thr 5.39: 4 -> 6 -> done, 2 groups
        ([3.0, 1.0, 1.0, 0.0], [0, 1, 2]),  # thr 4.49: 3 -> 4 -> 5 -> done, 3 groups
    ],
    ids=["case11a", "case11b", "case11c"],
)
def test_case11_top_p_linear_excludes_zero(scores, expected):
    linear = TopPOptions(mode="linear", eps=0.01)
    out = select_groups(T(scores), "top_p", 0.9, include_zero=False, options=linear)
    assert out.tolist() == expected


def test_case12_verify_lower_ratio_intended_behaviour():
    # groups [1,2], [5,5], [10,20], [0,0]: stds .7071, 0, 7.0711, 0; include_zero False drops G1,
    # G3. "ratio" .5 as top_p: linear thr .5*7.7782 - .01 = 3.879 -> 7.0711 first -> keep G2 only;
    # softmax: p(G2) ~ .9982
    per_sample = T([[1.0, 2.0], [5.0, 5.0], [10.0, 20.0], [0.0, 0.0]])
    scores = group_scores(per_sample)
    close(scores, [math.sqrt(0.5), 0.0, math.sqrt(50.0), 0.0], atol=1e-5)
    for mode in ("linear", "softmax"):
        options = TopPOptions(mode=mode)
        out = select_groups(scores, "top_p", 0.5, include_zero=False, options=options)
        assert out.tolist() == [2]


# ------------------------------------------------------------------------------------------------ group scores


def test_group_scores_reductions():
    rewards = T([[1.0, 2.0, 3.0], [4.0, 4.0, 10.0]])
    # unbiased std: [1, sqrt(((−2)^2 + (−2)^2 + 4^2)/2) = sqrt(12)]; mean [2, 6]; sum [6, 18]
    close(group_scores(rewards), [1.0, math.sqrt(12.0)], atol=1e-6)
    close(group_scores(rewards, "reward_std"), [1.0, math.sqrt(12.0)], atol=1e-6)
    close(group_scores(rewards, "entropy_variance"), [1.0, math.sqrt(12.0)], atol=1e-6)
    close(group_scores(rewards, "entropy_std"), [1.0, math.sqrt(12.0)], atol=1e-6)
    close(group_scores(rewards, "reward"), [2.0, 6.0])
    close(group_scores(rewards, "length"), [2.0, 6.0])
    close(group_scores(T([[3, 5]]), "length"), [4.0])  # integer lengths are fine


def test_group_scores_size_one_and_constant_groups_are_exact_zero():
    # group of size 1: std 0 (RAGEN: NaN)
    assert torch.equal(group_scores(T([[0.7], [2.0]])), torch.zeros(2))
    # eight copies of 0.3: torch.std gives 3e-8; here exactly 0, so include_zero=False drops it
    scores = group_scores(torch.full((2, 8), 0.3))
    assert torch.equal(scores, torch.zeros(2))
    assert select_groups(scores, "top_p", 1.0, include_zero=False).numel() == 0


def test_group_scores_errors():
    with pytest.raises(ValueError, match="metric"):
        group_scores(torch.ones(2, 2), "variance")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"num_groups, group_size"):
        group_scores(torch.ones(4))


# ------------------------------------------------------------------------------------------------ selection


def test_top_p_value_one_with_include_zero_keeps_everything():
    gen = torch.Generator().manual_seed(0)
    for _ in range(20):
        scores = torch.randn(9, generator=gen)
        scores[::3] = 0.0
        for mode in ("linear", "softmax"):
            for largest in (True, False):
                options = TopPOptions(mode=mode)
                out = select_groups(
                    scores, "top_p", 1.0, options=options, largest=largest, include_zero=True
                )
                assert out.tolist() == list(range(9))


def test_top_k_and_top_k_abs():
    scores = T([0.5, 3.0, 1.0, 3.0, 0.0])
    # fraction .4 of 5 -> k = 2: best 3.0 (idx 1), 3.0 (idx 3) -> [1, 3]
    assert select_groups(scores, "top_k", 0.4).tolist() == [1, 3]
    # tiny fraction -> at least 1: ties -> lower index -> [1]
    assert select_groups(scores, "top_k", 0.01).tolist() == [1]
    # smallest 2: 0.0 (idx 4), 0.5 (idx 0)
    assert select_groups(scores, "top_k", 0.4, largest=False).tolist() == [0, 4]
    # without zeros, smallest 2 of [.5, 3, 1, 3]: .5 (0), 1 (2)
    assert select_groups(scores, "top_k", 0.4, largest=False, include_zero=False).tolist() == [0, 2]
    # k is capped by the candidates: int(1.0 * 5) = 5 > 4 non-zero groups -> 4
    assert select_groups(scores, "top_k", 1.0, include_zero=False).tolist() == [0, 1, 2, 3]
    assert select_groups(scores, "top_k_abs", 3).tolist() == [1, 2, 3]
    assert select_groups(scores, "top_k_abs", 0).tolist() == [1]
    assert select_groups(scores, "top_k_abs", 99).tolist() == [0, 1, 2, 3, 4]
    # int(value * G) truncates like RAGEN: .29 * 100 = 28.999... -> 28
    assert select_groups(torch.arange(100.0), "top_k", 0.29).numel() == 28


def test_min_p():
    # largest: keep s >= 10 * .5 - 1e-10 = 5 -> [0, 1]
    assert select_groups(T([10.0, 5.0, 2.0, 0.0]), "min_p", 0.5).tolist() == [0, 1]
    # smallest: keep s <= 1 / (.5 + 1e-10) + 1e-10 = 2 -> [0, 1]
    assert select_groups(T([1.0, 2.0, 4.0, 8.0]), "min_p", 0.5, largest=False).tolist() == [0, 1]


def test_top_p_smallest():
    # linear, smallest: ascending [1, 2, 3, 4]; thr .3*10 - .01 = 2.99: 1 -> 3 >= 2.99 -> scores 1,
    # 2 -> idx [2, 3]
    assert select_groups(T([4.0, 3.0, 2.0, 1.0]), "top_p", 0.3, largest=False).tolist() == [2, 3]
    # softmax, smallest: logits -[0, 10] -> p ~ [1, 4.5e-5] -> k = 1 -> [0]
    out = select_groups(T([0.0, 10.0]), "top_p", 0.5, largest=False, options=SOFTMAX)
    assert out.tolist() == [0]


def test_top_p_linear_non_positive_mass_is_empty():
    # sum -3, thr .5*(-3) - .01 = -1.51; 0 >= -1.51 at once -> count 0 -> empty
    assert select_groups(T([-1.0, -2.0]), "top_p", 0.5).numel() == 0


def test_selection_errors_and_empty_candidates():
    with pytest.raises(ValueError, match="strategy"):
        select_groups(T([1.0]), "top_q", 0.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"--data.filter.options.mode must be linear \| softmax"):
        select_groups(T([1.0]), "top_p", 0.5, options={"mode": "cubic"})
    with pytest.raises(ValueError, match="NaN"):
        select_groups(T([1.0, float("nan")]), "top_k", 0.5)
    assert select_groups(T([1, 3, 2]), "top_k_abs", 1).tolist() == [1]  # integer scores are fine
    out = select_groups(torch.zeros(3), "top_k", 0.5, include_zero=False)
    assert out.numel() == 0 and out.dtype == torch.long
    assert select_groups(torch.zeros(0), "top_p", 0.5).numel() == 0


def test_kept_sample_mask_and_filter_metrics_when_empty():
    assert kept_sample_mask(kept(1), 3, 2).tolist() == [False, False, True, True, False, False]
    per_sample = T([[1.0, 1.0], [0.0, 2.0]])
    scores = group_scores(per_sample)  # [0, sqrt(2)]
    metrics = filter_metrics(per_sample, scores, kept())
    assert metrics["filter_kept_count"] == 0.0 and metrics["filter_kept_ratio"] == 0.0
    assert metrics["chosen_in_group_std"] == 0.0
    assert metrics["filter_zero_count"] == 1.0
    # in_group: std mean (0 + 1.4142)/2, max mean (1 + 2)/2, mean mean (1 + 1)/2
    assert metrics["in_group_std"] == pytest.approx(math.sqrt(2) / 2, abs=1e-6)
    assert metrics["in_group_max"] == pytest.approx(1.5)
    assert metrics["in_group_mean"] == pytest.approx(1.0)
    metrics = filter_metrics(per_sample, scores, kept(1))
    assert metrics["filter_kept_ratio"] == 0.5 and metrics["chosen_in_group_max"] == pytest.approx(
        2.0
    )


# ------------------------------------------------------------------------------------------------ properties

score_lists = st.lists(
    st.one_of(st.just(0.0), st.floats(min_value=-10, max_value=10, allow_nan=False, width=32)),
    min_size=0,
    max_size=12,
)
values = st.floats(min_value=0.0, max_value=1.5, allow_nan=False)


@settings(max_examples=150, deadline=None)
@given(
    scores=score_lists,
    strategy=st.sampled_from(["top_p", "top_k", "top_k_abs", "min_p"]),
    value=st.floats(min_value=0.0, max_value=12.0, allow_nan=False),
    largest=st.booleans(),
    include_zero=st.booleans(),
    mode=st.sampled_from(["linear", "softmax"]),
)
def test_kept_indices_are_unique_sorted_and_in_range(
    scores, strategy, value, largest, include_zero, mode
):
    s = T(scores, dtype=torch.float32)
    options = TopPOptions(mode=mode) if strategy == "top_p" else None  # the others take no options
    out = select_groups(
        s, strategy, value, largest=largest, include_zero=include_zero, options=options
    )
    assert out.dtype == torch.long
    items = out.tolist()
    assert items == sorted(set(items))
    assert all(0 <= i < len(scores) for i in items)
    if not include_zero:
        assert all(abs(scores[i]) > 1e-10 for i in items)


@settings(max_examples=200, deadline=None)
@given(
    scores=score_lists,
    strategy=st.sampled_from(["top_p", "top_k"]),
    v1=values,
    v2=values,
    largest=st.booleans(),
    include_zero=st.booleans(),
    mode=st.sampled_from(["linear", "softmax"]),
)
def test_larger_value_keeps_a_superset(scores, strategy, v1, v2, largest, include_zero, mode):
    low, high = sorted((v1, v2))
    s = T(scores, dtype=torch.float32)
    options = TopPOptions(mode=mode) if strategy == "top_p" else None
    kwargs = dict(largest=largest, include_zero=include_zero, options=options)
    small = set(select_groups(s, strategy, low, **kwargs).tolist())
    big = set(select_groups(s, strategy, high, **kwargs).tolist())
    assert small <= big
