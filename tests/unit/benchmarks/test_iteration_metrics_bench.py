"""benchmarks/iteration_metrics.py --compare on two runs' metrics.csv: clock readings ignored, any
other value that differs (at any step) reported and the exit status 1."""

from tests.conftest import load_script


def _csv(path, rows):
    keys = ["step", "val/success", "timing_s/rollout", "throughput/iteration_s", "actor/pg_loss"]
    lines = [",".join(keys)] + [",".join(str(r.get(k, "")) for k in keys) for r in rows]
    path.write_text("\n".join(lines) + "\n")
    return path


def test_two_runs_metrics_csv_compare_every_step_but_the_clock(tmp_path, capsys):
    bench = load_script("benchmarks/iteration_metrics.py", "bench_iteration_metrics")
    a = _csv(
        tmp_path / "a.csv",
        [
            {"step": 0, "val/success": 0.3125},
            {"step": 1, "actor/pg_loss": 0.25, "timing_s/rollout": 1.5},
        ],
    )
    b = _csv(
        tmp_path / "b.csv",
        [
            {"step": 0, "val/success": 0.3125},
            {
                "step": 1,
                "actor/pg_loss": 0.25,
                "timing_s/rollout": 9.0,
                "throughput/iteration_s": 3.0,
            },
        ],
    )
    assert bench.main(["--compare", str(a), str(b)]) == 0
    assert capsys.readouterr().out.splitlines() == ["2 values recorded", "identical"]
    c = _csv(
        tmp_path / "c.csv",
        [{"step": 0, "val/success": 0.34375}, {"step": 1, "actor/pg_loss": 0.25}],
    )
    assert bench.main(["--compare", str(a), str(c)]) == 1
    assert capsys.readouterr().out.splitlines()[1:] == [
        "0:val/success: 0.3125 != 0.34375",
        "1 differences",
    ]
