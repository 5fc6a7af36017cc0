"""benchmarks/learning.py: the interval arithmetic, the run overlay and the indicators read from a
metrics.csv."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import yaml

from tests.conftest import load_script

SCRIPT = Path(__file__).resolve().parents[3] / "benchmarks" / "learning.py"
bench = load_script("benchmarks/learning.py", "learning_bench")


def test_difference_interval_by_hand():
    # p1 = 0.5, p2 = 0.75, n = 100: var = 0.25/100 + 0.1875/100 = 0.004375; 1.96 * sqrt(0.004375) =
    # 0.129642...
    d, lo, hi = bench.diff_interval(0.5, 100, 0.75, 100)
    assert d == pytest.approx(0.25)
    assert lo == pytest.approx(0.25 - 0.1296418) and hi == pytest.approx(0.25 + 0.1296418)
    # no variance at all: the interval is the point
    assert bench.diff_interval(0.0, 10, 1.0, 10) == pytest.approx((1.0, 1.0, 1.0))


def test_overlay_drops_checkpointing_and_logs_csv_into_the_run(tmp_path):
    cfg = yaml.safe_load((SCRIPT.parents[1] / "configs" / "bandit.yaml").read_text())
    doc = yaml.safe_load(bench.overlay(cfg, tmp_path).read_text())
    names = [c["class_path"] for c in doc["trainer"]["callbacks"]]
    assert (
        not any(n.endswith("ModelCheckpoint") for n in names)
        and "callbacks.CollapseMonitor" in names
    )
    assert doc["trainer"]["enable_checkpointing"] is False
    assert doc["trainer"]["logger"] == [
        {
            "class_path": "lightning.pytorch.loggers.CSVLogger",
            "init_args": {"save_dir": str(tmp_path), "name": "csv"},
        }
    ]
    # --select best: the run keeps its best-validation actor in run_dir/best_actor (once, whatever
    # the config had)
    cfg["trainer"]["callbacks"].append(
        {"class_path": "callbacks.BestActorExport", "init_args": {"dirpath": "x"}}
    )
    best = yaml.safe_load(bench.overlay(cfg, tmp_path, best=True).read_text())["trainer"][
        "callbacks"
    ]
    assert [c for c in best if c["class_path"] == "callbacks.BestActorExport"] == [
        {
            "class_path": "callbacks.BestActorExport",
            "init_args": {"dirpath": str(tmp_path / "best_actor"), "monitor": "val_success"},
        }
    ]


def test_config_path_accepts_a_task_name_or_a_yaml(tmp_path):
    assert bench.config_path("bandit") == SCRIPT.parents[1] / "configs" / "bandit.yaml"
    assert bench.config_path(str(tmp_path / "x.yaml")) == tmp_path / "x.yaml"


def test_indicators_average_first_and_last_quarter(tmp_path):
    # 8 iterations: quarter = 2 rows. reward std 1..8 -> first (1+2)/2 = 1.5, last (7+8)/2 = 7.5; MI
    # at steps 0 and 4
    header = (
        "epoch,step,iteration,rollout/in_group_reward_std,actor/entropy,collapse/first_turn/mi,"
        "collapse/first_turn/conditional_entropy"
    )
    rows = [header]
    for i in range(8):
        mi = {0: "0.3", 4: "0.1"}.get(i, "")
        h = {0: "2.5", 4: "2.25"}.get(i, "")
        rows.append(f"0,{i},{i}.0,{i + 1},{2.0 - 0.1 * i},{mi},{h}")
    (tmp_path / "csv" / "version_0").mkdir(parents=True)
    (tmp_path / "csv" / "version_0" / "metrics.csv").write_text("\n".join(rows) + "\n")
    ind = bench.indicators(tmp_path)
    assert ind["reward_std_first"] == pytest.approx(1.5) and ind[
        "reward_std_last"
    ] == pytest.approx(7.5)
    # entropy 2.0, 1.9 -> 1.95; 1.4, 1.3 -> 1.35
    assert ind["entropy_first"] == pytest.approx(1.95) and ind["entropy_last"] == pytest.approx(
        1.35
    )
    assert ind["mi_first"] == pytest.approx(0.3) and ind["mi_last"] == pytest.approx(0.1)
    assert ind["cond_entropy_first"] == pytest.approx(2.5) and ind[
        "cond_entropy_last"
    ] == pytest.approx(2.25)
    assert "train_success_first" not in ind and not math.isnan(ind["reward_std_last"])


def test_warm_start_override_reaches_the_evaluation_and_the_fit():
    cfg = {
        "model": {"model": "tiny", "warm_start": True, "actor_lr": 1e-4},
        "data": {"env": {"id": "x"}},
    }
    new, args = bench.with_warm_start(cfg, "{steps: 2000, num_episodes: 2048}")
    assert new["model"] == {
        "model": "tiny",
        "warm_start": {"steps": 2000, "num_episodes": 2048},
        "actor_lr": 1e-4,
    }
    assert cfg["model"]["warm_start"] is True  # the loaded config is not mutated
    assert args == ["--model.warm_start", '{"steps": 2000, "num_episodes": 2048}']
    assert bench.with_warm_start(cfg, None) == (cfg, [])
    assert bench.with_warm_start(cfg, "false")[1] == ["--model.warm_start", "false"]
    with pytest.raises(SystemExit, match="--warm-start"):
        bench.with_warm_start(cfg, "[1, 2]")


def test_warm_start_evaluation_is_cached_in_its_folder_by_everything_it_reads(
    tmp_path, monkeypatch
):
    calls = []

    def fake_evaluate(path, cfg, n, temperature, seed, exclude, tokenizer=None):
        calls.append((path, n, temperature))
        return {"success_rate": 0.25 * len(calls)}

    monkeypatch.setattr(bench, "evaluate", fake_evaluate)
    cfg = {"data": {"env": {"id": "ragen/Bandit-v0", "kwargs": None}}}
    warm = str(tmp_path)
    first = bench.evaluate_warm_start(warm, cfg, 64, 1.0, 0, [1, 2])
    assert first == {"success_rate": 0.25} and len(calls) == 1
    # read back
    assert bench.evaluate_warm_start(warm, cfg, 64, 1.0, 0, [1, 2]) == first and len(calls) == 1
    assert len(list(tmp_path.glob("heldout-*.json"))) == 1 and not list(tmp_path.glob("*.tmp"))
    # another episode count, temperature or env setting is another evaluation
    assert bench.evaluate_warm_start(warm, cfg, 128, 1.0, 0, [1, 2])["success_rate"] == 0.5
    assert bench.evaluate_warm_start(warm, cfg, 64, 0.5, 0, [1, 2])["success_rate"] == 0.75
    other = {"data": {"env": {"id": "ragen/Bandit-v0", "kwargs": {"num_arms": 3}}}}
    assert bench.evaluate_warm_start(warm, other, 64, 1.0, 0, [1, 2])["success_rate"] == 1.0
    assert len(calls) == 4
    # a model name (no warm start folder) is evaluated every time, nothing written
    bench.evaluate_warm_start(str(tmp_path / "tiny"), cfg, 64, 1.0, 0, [1, 2])
    bench.evaluate_warm_start(str(tmp_path / "tiny"), cfg, 64, 1.0, 0, [1, 2])
    assert len(calls) == 6 and len(list(tmp_path.glob("heldout-*.json"))) == 4
