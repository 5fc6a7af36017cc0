"""benchmarks/iteration.py reads per-iteration timings from Lightning's CSV logger; rollout.py reads
task configs."""

from pathlib import Path

from tests.conftest import load_script

ROOT = Path(__file__).resolve().parents[3]


def load(name):
    return load_script(f"benchmarks/{name}.py", f"bench_{name}")


def test_read_iterations_merges_rows_by_step(tmp_path):
    bench = load("iteration")
    csv = tmp_path / "metrics.csv"
    csv.write_text(
        "epoch,step,timing_s/rollout,timing_s/update,throughput/iteration_s,train/success\n"
        "0,1,10.0,20.0,,0.5\n"
        "0,1,,,31.0,\n"
        "0,3,5.0,7.0,12.5,0.6\n"
        "0,4,,,,0.1\n"  # a row with no timing (e.g. validation) is not an iteration
    )
    its = bench.read_iterations(csv)
    assert its == [
        {"timing_s/rollout": 10.0, "timing_s/update": 20.0, "throughput/iteration_s": 31.0},
        {"timing_s/rollout": 5.0, "timing_s/update": 7.0, "throughput/iteration_s": 12.5},
    ]
    s = bench.summary([(its, 60.0)], skip=1)
    assert (
        s["kept"]["timing_s/update"] == 7.0
        and s["first"]["timing_s/update"] == 20.0
        and s["n"] == 1
    )


def test_task_settings_reads_the_sokoban_config():
    d, m = load("rollout").task_settings(str(ROOT / "configs" / "sokoban.yaml"))
    assert (
        d["num_groups"] * d["group_size"] >= 1 and d["max_turns"] >= 1 and d["max_new_tokens"] >= 1
    )
    assert "temperature" in d and "train_seed" in d  # defaults from RolloutDataModule's signature
    # nested as in the YAML
    assert m.get("model") == "tiny:cells" and m["advantage"]["estimator"] == "rft"
