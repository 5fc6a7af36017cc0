"""benchmarks/filter_table.py: the arms' flags, the seed convention, the intervals and the summary
of measured cells."""

from __future__ import annotations

import json

import pytest
import yaml

from tests.conftest import load_script

bench = load_script("benchmarks/filter_table.py", "filter_table_bench")


def test_arms_are_no_filter_and_ragen2s_filter():
    none = yaml.safe_load(bench.ARMS["none"])
    assert none == {"strategy": "top_p", "value": 1.0, "include_zero": True}
    assert yaml.safe_load(bench.ARMS["filter"]) == {
        "strategy": "top_p",
        "value": 0.9,
        "metric": "reward_variance",
        "include_zero": False,
        "options": {"mode": "linear"},
    }
    # both are valid filter settings; the first keeps everything, the second does not
    from ragen_lightning.data.sampler import FilterSettings

    assert FilterSettings(**none).keeps_everything
    assert not FilterSettings(**yaml.safe_load(bench.ARMS["filter"])).keeps_everything


def test_cell_flags_follow_the_learning_pages_seed_convention():
    assert bench.cell_flags("grpo", "filter", 2) == [
        "--model.advantage.estimator",
        "grpo",
        "--data.filter",
        bench.ARMS["filter"],
        "--seed_everything",
        "2",
        "--data.training.seed",
        "30000",
    ]


def test_mean_interval_by_hand():
    # 0.4, 0.5, 0.6: mean 0.5, sd 0.1, t(2) = 4.303 -> half 4.303 * 0.1 / sqrt(3) = 0.248434
    m, lo, hi = bench.mean_interval([0.4, 0.5, 0.6])
    assert (
        m == pytest.approx(0.5)
        and lo == pytest.approx(0.5 - 0.248434)
        and hi == pytest.approx(0.5 + 0.248434)
    )
    assert bench.mean_interval([0.3]) == (0.3, 0.3, 0.3)
    # Wilson at p = 0.5, n = 100: centre 0.5, half 1.96 * sqrt(0.0025 + 0.000096) / 1.038416 =
    # 0.096170
    lo, hi = bench.wilson(50, 100)
    assert lo == pytest.approx(0.5 - 0.096170, abs=1e-6) and hi == pytest.approx(
        0.5 + 0.096170, abs=1e-6
    )


def test_summary_pairs_seeds_and_averages_indicators(tmp_path):
    task = tmp_path / "bandit"
    task.mkdir()
    (task / "before.json").write_text(json.dumps({"success_rate": 0.5, "eval_episodes": 100}))
    after = {("none", 0): 0.6, ("none", 1): 0.7, ("filter", 0): 0.7, ("filter", 1): 0.9}
    for (arm, seed), p in after.items():
        cell = task / f"grpo-{arm}-s{seed}"
        cell.mkdir()
        ind = {
            "reward_std_first": 0.4 + seed * 0.2,
            "reward_std_last": 0.2,
            "mi_first": 0.1,
            "mi_last": 0.0,
        }
        if arm == "filter":
            ind.update(kept_first=0.5, kept_last=0.7)
        (cell / "result.json").write_text(
            json.dumps(
                {
                    "seed": seed,
                    "after": {"success_rate": p},
                    "eval_episodes": 100,
                    "fit_s": 60.0 * (seed + 1),
                    "indicators": ind,
                }
            )
        )
    rows = bench.summary(tmp_path, ["bandit"], ["grpo"], [0, 1]).splitlines()[2:]
    assert len(rows) == 2
    none, filt = ([c.strip() for c in r.strip("|").split("|")] for r in rows)
    # none: after 0.65 +- 12.706 * 0.070711 / sqrt(2) = 0.65 +- 0.6353; gain +0.15; no paired column
    assert none[:4] == ["bandit", "grpo", "none", "0,1"]
    assert (
        none[5] == "0.650 [0.015, 1.285]"
        and none[7] == "+0.150 [-0.485, +0.785]"
        and none[8] == "-"
    )
    # filter - none per seed: +0.1, +0.2 -> mean +0.15, sd 0.070711 -> same half width. Each seed on
    # its own (n = 100): seed 0 half 1.96 sqrt(0.6 * 0.4 / 100 + 0.7 * 0.3 / 100) = 0.1315 > 0.1
    # (inside the noise), seed 1 half 1.96 sqrt(0.7 * 0.3 / 100 + 0.9 * 0.1 / 100) = 0.1074 < 0.2
    # (beyond it)
    assert (
        filt[8] == "+0.150 [-0.485, +0.785]; per seed +0.100, +0.200 (1/2 beyond evaluation noise)"
    )
    assert filt[9] == "1.0-2.0" and filt[10] == "0.500 -> 0.200" and filt[13] == "0.100 -> 0.000"
    assert filt[14] == "0.60" and none[14] == "-"


def test_collapse_every_sets_the_monitors_compute_freq_and_samples_only():
    from pathlib import Path

    cfg = yaml.safe_load((Path(bench.ROOT) / "configs" / "bandit.yaml").read_text())
    out = bench.with_collapse_every(cfg, 4)
    monitor = [
        c for c in out["trainer"]["callbacks"] if c["class_path"] == "callbacks.CollapseMonitor"
    ]
    assert [m["init_args"] for m in monitor] == [
        {"actions": ["log"], "compute_freq": 4, "num_samples": 8}
    ]
    # the other callbacks and the task config itself are untouched
    assert len(out["trainer"]["callbacks"]) == len(cfg["trainer"]["callbacks"])
    original = [
        c for c in cfg["trainer"]["callbacks"] if c["class_path"] == "callbacks.CollapseMonitor"
    ]
    assert original[0]["init_args"]["compute_freq"] == 10
    assert bench.with_collapse_every(cfg, None) is cfg
    both = bench.with_collapse_every(cfg, None, 16)  # the number of sampled first turns alone
    monitor = [
        c for c in both["trainer"]["callbacks"] if c["class_path"] == "callbacks.CollapseMonitor"
    ]
    assert [m["init_args"] for m in monitor] == [
        {"actions": ["log"], "compute_freq": 10, "num_samples": 16}
    ]
