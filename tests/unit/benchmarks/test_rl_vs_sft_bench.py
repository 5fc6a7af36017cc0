"""benchmarks/rl_vs_sft.py: the paired and per-seed intervals of its table, by hand."""

from __future__ import annotations

import math

import pytest

from tests.conftest import load_script

bench = load_script("benchmarks/rl_vs_sft.py", "rl_vs_sft_bench")


def test_paired_interval_by_hand():
    # differences 1, 0, 0, 1: mean 0.5, sample sd sqrt(1/3), se sqrt(1/3)/2 = 0.288675
    d, lo, hi = bench.paired_difference([1.0, 1.0, 0.0, 1.0], [0.0, 1.0, 0.0, 0.0])
    half = 1.96 * math.sqrt(1 / 3) / 2
    assert (d, lo, hi) == pytest.approx((0.5, 0.5 - half, 0.5 + half))
    with pytest.raises(ValueError, match="two equal lists"):
        bench.paired_difference([1.0], [0.0])


def test_the_seeds_interval_is_student_t():
    # 0.1, 0.2, 0.3: mean 0.2, sd 0.1, t(2) = 4.303: half 4.303 * 0.1 / sqrt(3) = 0.248434
    m, lo, hi = bench.mean_interval([0.1, 0.2, 0.3])
    assert (m, lo, hi) == pytest.approx((0.2, 0.2 - 0.248434, 0.2 + 0.248434), abs=1e-6)
    assert bench.mean_interval([0.4]) == (0.4, 0.4, 0.4)


def test_compare_pairs_levels_and_averages_rl_seeds_per_level():
    plateau = [0, 0, 1, 1]
    sft = [0, 1, 1, 1]
    rl = [[1, 1, 1, 1], [1, 0, 1, 1]]  # per level: 1, 0.5, 1, 1; seed means 1.0 and 0.75
    row = bench.compare(plateau, sft, rl)
    assert row["plateau"] == 0.5 and row["sft"] == 0.75 and row["rl"] == [1.0, 0.75]
    # per-level RL - SFT: 1, -0.5, 0, 0 -> mean 0.125
    assert row["rl_minus_sft_levels"][0] == pytest.approx(0.125)
    # per-seed RL - SFT: 0.25 and 0.0 -> mean 0.125, sd 0.25 / sqrt 2, t(1) = 12.706: half 12.706 / 8
    m, lo, _ = row["rl_minus_sft_seeds"]
    assert m == pytest.approx(0.125) and lo == pytest.approx(0.125 - 12.706 / 8)
    assert row["rl_minus_plateau"][0] == pytest.approx((1 + 0.5 + 0 + 0) / 4)
