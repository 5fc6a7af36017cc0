"""Where a StarPO iteration's time goes, for one or more source trees side by side.

    python benchmarks/iteration.py --config configs/sokoban.yaml --iterations 3
    python benchmarks/iteration.py --trees /work/base . --config configs/sokoban.yaml --iterations 3 --repeats 2
    python benchmarks/iteration.py --trees . . --labels hf vllm --tree-args "" "--data.engine.name vllm"

For every repetition, each tree in turn (interleaved, so a busy machine slows all trees alike) runs

    python <tree>/main.py fit --config <tree>/<config> --data.training.num_iterations N --trainer.limit_val_batches 0 \\
        [--extra-args ...] [its --tree-args]

in a fresh scratch directory (the config's relative ``outputs/...`` land there, not in the tree; ``main.py`` by
path puts the tree first on ``sys.path``, so each run imports its own tree's packages). Only the CLI and Lightning's
CSV logger (``<default_root_dir>/csv/version_*/metrics.csv``) are used, so an older tree works too as long as its
config logs to CSV. Per iteration it reads every ``timing_s/*`` column (``rollout`` with its ``rollout_generate``
and ``rollout_env`` parts; ``update``, which includes the no-grad scoring passes in trees that log no separate
``timing_s/scoring``) and ``throughput/iteration_s`` (the iteration's wall clock, logged by the
``RolloutThroughput`` callback) when present. The first ``--skip`` iterations of every run (one-off start-up such as
a vLLM engine build or a compile) are reported separately and left out of the means. Flags that differ between
trees (e.g. ``--data.max_turns`` vs ``--data.episode.max_turns``) go in ``--tree-args``, one string per tree.
"""

from __future__ import annotations

import argparse
import csv
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ITERATION = "throughput/iteration_s"


def read_iterations(metrics_csv: Path) -> list[dict[str, float]]:
    """One dict per training iteration (rows merged by ``step``) with the timing columns that have
    values."""
    by_step: dict[str, dict[str, float]] = {}
    with open(metrics_csv) as f:
        for row in csv.DictReader(f):
            keep = {
                k: float(v)
                for k, v in row.items()
                if v not in ("", None)
                and (k.startswith("timing_s/") or k in (ITERATION, "rollout/generated_tokens"))
            }
            if keep:
                by_step.setdefault(row.get("step", ""), {}).update(keep)
    rows = [r for r in by_step.values() if "timing_s/update" in r or "timing_s/rollout" in r]
    return rows


def run_tree(
    tree: Path, config: str, iterations: int, extra: list[str], log_dir: Path
) -> tuple[list[dict], float]:
    scratch = Path(tempfile.mkdtemp(prefix="iteration-bench-"))
    cmd = [
        sys.executable,
        str(tree / "main.py"),
        "fit",
        "--config",
        str(tree / config),
        "--data.training.num_iterations",
        str(iterations),
        "--trainer.limit_val_batches",
        "0",
        *extra,
    ]
    env = dict(
        os.environ, WANDB_MODE="offline", HF_HUB_OFFLINE="1", VLLM_ENABLE_V1_MULTIPROCESSING="0"
    )
    log = log_dir / f"{tree.name}-{int(time.time())}.log"
    print(f"$ (cd {scratch} && {shlex.join(cmd)})  > {log}", flush=True)
    t0 = time.perf_counter()
    with open(log, "w") as out:
        proc = subprocess.run(
            cmd, cwd=scratch, stdout=out, stderr=subprocess.STDOUT, env=env, check=False
        )
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{tree}: exit {proc.returncode}; see {log}")
    found = sorted(scratch.glob("**/csv/version_*/metrics.csv"), key=lambda p: p.stat().st_mtime)
    if not found:
        raise SystemExit(
            f"{tree}: no csv/version_*/metrics.csv under {scratch} (does the config log to CSV?)"
        )
    return read_iterations(found[-1]), wall


def mean(xs):
    return sum(xs) / len(xs) if xs else float("nan")


def summary(runs: list[tuple[list[dict], float]], skip: int) -> dict:
    kept = [it for its, _ in runs for it in its[skip:]]
    first = [it for its, _ in runs for it in its[:skip]]
    cols = sorted({k for it in kept + first for k in it})
    return {
        "kept": {k: mean([it[k] for it in kept if k in it]) for k in cols},
        "first": {k: mean([it[k] for it in first if k in it]) for k in cols},
        "n": len(kept),
        "process_s": mean([w for _, w in runs]),
    }


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--trees", nargs="+", default=["."], help="source trees (each has main.py and the config)"
    )
    p.add_argument(
        "--labels",
        nargs="+",
        default=None,
        help="a name per tree for the tables (default: the path)",
    )
    p.add_argument("--config", default="configs/sokoban.yaml", help="relative to each tree")
    p.add_argument("--iterations", type=int, default=3)
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument(
        "--skip", type=int, default=1, help="leading iterations per run reported apart (start-up)"
    )
    p.add_argument("--extra-args", default="", help="extra CLI flags for every tree (one string)")
    p.add_argument(
        "--tree-args",
        nargs="+",
        default=None,
        help="extra CLI flags per tree (one string per tree)",
    )
    p.add_argument(
        "--log-dir", default=None, help="where each run's output goes (default: a temp dir)"
    )
    args = p.parse_args(argv)
    trees = [Path(t).resolve() for t in args.trees]
    labels = args.labels or [str(t) for t in trees]
    tree_args = args.tree_args or [""] * len(trees)
    if len(labels) != len(trees) or len(tree_args) != len(trees):
        p.error("--labels and --tree-args need one entry per tree")
    log_dir = Path(args.log_dir or tempfile.mkdtemp(prefix="iteration-bench-logs-"))
    log_dir.mkdir(parents=True, exist_ok=True)

    runs: list[list] = [[] for _ in trees]
    for _ in range(args.repeats):
        for i, tree in enumerate(trees):  # interleaved: load on the machine is shared fairly
            extra = shlex.split(args.extra_args) + shlex.split(tree_args[i])
            runs[i].append(run_tree(tree, args.config, args.iterations, extra, log_dir))

    sums = [summary(r, args.skip) for r in runs]
    cols = sorted({k for s in sums for k in s["kept"]}, key=lambda k: (k != ITERATION, k))
    print(
        f"\n{args.config}: {args.iterations} iterations x {args.repeats} run(s) per tree; means over iterations "
        f"after the first {args.skip} of each run; {os.cpu_count()} CPU cores\n"
    )
    print("| metric | " + " | ".join(labels) + " |")
    print("|---|" + "---:|" * len(labels))
    for k in cols:
        print(
            f"| {k} | " + " | ".join(f"{s['kept'].get(k, float('nan')):.2f}" for s in sums) + " |"
        )
    print("| iterations averaged | " + " | ".join(str(s["n"]) for s in sums) + " |")
    print(
        "| process wall s (incl. start-up) | "
        + " | ".join(f"{s['process_s']:.1f}" for s in sums)
        + " |"
    )
    if args.skip:
        for k in (ITERATION, "timing_s/rollout", "timing_s/update"):
            print(
                f"| first {args.skip} iteration(s): {k} | "
                + " | ".join(f"{s['first'].get(k, float('nan')):.2f}" for s in sums)
                + " |"
            )
    base = sums[0]["kept"]
    if len(trees) > 1:
        print(f"\nspeed-up vs {labels[0]} (its time / this time):")
        for label, s in zip(labels[1:], sums[1:]):
            parts = [
                f"{k.split('/')[-1]} {base[k] / s['kept'][k]:.2f}x"
                for k in (ITERATION, "timing_s/rollout", "timing_s/update")
                if k in base and s["kept"].get(k)
            ]
            print(f"  {label}: " + ", ".join(parts))
    print(f"\nrun logs: {log_dir}")
    return {"labels": labels, "summaries": sums}


if __name__ == "__main__":
    main()
