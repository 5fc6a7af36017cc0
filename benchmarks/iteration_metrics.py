"""Behaviour fingerprint of a config: every logged value of the first iteration (and of a validation
before it), for one or more source trees, and whether the trees agree.

    python benchmarks/iteration_metrics.py --config configs/bandit.yaml --out bandit.json      # record one tree
    python benchmarks/iteration_metrics.py --config configs/bandit.yaml --trees /work/base .   # compare two trees
    python benchmarks/iteration_metrics.py --compare before.json after.json                    # compare records
    python benchmarks/iteration_metrics.py --compare a/metrics.csv b/metrics.csv               # two whole runs

Each tree runs ``python <tree>/main.py fit --config <tree>/<config> --data.training.num_iterations
1`` (plus ``--extra-args`` and its own ``--tree-args``) in a fresh scratch directory, so the
config's relative ``outputs/`` land there; the CSV logger's ``metrics.csv`` is read back. Wall-clock
values (``timing_s/*``, ``throughput/*``, anything per second, any ``*_s``) are left out: they are
the only logged values that may differ between two runs of the same code on the same machine.
Refactors that must not change behaviour are checked with this script: every other value must be
identical (``--tolerance 0``, the default).
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

CLOCK_WORDS = ("timing", "throughput", "_per_s", "per_second", "tok_s", "/time", "wall")


def is_clock(key: str) -> bool:
    # "rollout/sync_s": seconds
    return any(word in key for word in CLOCK_WORDS) or key.endswith("_s")


def read_metrics(metrics_csv: Path) -> dict[str, float]:
    """``{"<step>:<key>": value}`` for every non-clock value the run logged."""
    out: dict[str, float] = {}
    with open(metrics_csv) as f:
        for row in csv.DictReader(f):
            step = row.get("step", "")
            for key, value in row.items():
                if key != "step" and value not in ("", None) and not is_clock(key):
                    out[f"{step}:{key}"] = float(value)
    return out


def run_tree(tree: Path, config: str, extra: list[str]) -> dict[str, float]:
    scratch = Path(tempfile.mkdtemp(prefix="iteration-metrics-"))
    # a tree from before the --data.* groups (issue 53) spells the run length --data.num_iterations
    grouped = (tree / "ragen_lightning" / "data" / "settings.py").exists()
    length = "--data.training.num_iterations" if grouped else "--data.num_iterations"
    cmd = [
        sys.executable,
        str(tree / "main.py"),
        "fit",
        "--config",
        str(tree / config),
        length,
        "1",
        *extra,
    ]
    env = dict(
        os.environ, WANDB_MODE="offline", HF_HUB_OFFLINE="1", VLLM_ENABLE_V1_MULTIPROCESSING="0"
    )
    log = scratch / "run.log"
    print(f"$ (cd {scratch} && {shlex.join(cmd)})  > {log}", flush=True)
    with open(log, "w") as out:
        proc = subprocess.run(
            cmd, cwd=scratch, stdout=out, stderr=subprocess.STDOUT, env=env, check=False
        )
    if proc.returncode != 0:
        raise SystemExit(f"{tree}: exit {proc.returncode}; see {log}")
    found = sorted(scratch.glob("**/csv/version_*/metrics.csv"), key=lambda p: p.stat().st_mtime)
    if not found:
        raise SystemExit(
            f"{tree}: no csv/version_*/metrics.csv under {scratch} (does the config log to CSV?)"
        )
    return read_metrics(found[-1])


def differences(a: dict[str, float], b: dict[str, float], tolerance: float) -> list[str]:
    lines = [f"only in the first: {k} = {a[k]}" for k in sorted(set(a) - set(b))]
    lines += [f"only in the second: {k} = {b[k]}" for k in sorted(set(b) - set(a))]
    for key in sorted(set(a) & set(b)):
        x, y = a[key], b[key]
        same = (math.isnan(x) and math.isnan(y)) or abs(x - y) <= tolerance
        if not same:
            lines.append(f"{key}: {x!r} != {y!r}")
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", help="config path inside each tree")
    p.add_argument("--trees", nargs="+", type=Path, default=[Path(".")])
    p.add_argument(
        "--tree-args", nargs="*", default=None, help="one quoted string of extra flags per tree"
    )
    p.add_argument("--extra-args", default="", help="flags added to every tree's command")
    p.add_argument("--out", type=Path, help="write the first tree's values here (JSON)")
    p.add_argument(
        "--compare",
        nargs=2,
        type=Path,
        metavar=("A", "B"),
        help="compare two recorded JSON files, or two runs' metrics.csv (every iteration)",
    )
    p.add_argument("--tolerance", type=float, default=0.0)
    args = p.parse_args(argv)
    if args.compare:
        records = [
            read_metrics(path) if path.suffix == ".csv" else json.loads(path.read_text())
            for path in args.compare
        ]
    else:
        if not args.config:
            p.error("--config is required unless --compare is given")
        tree_args = args.tree_args or [""] * len(args.trees)
        if len(tree_args) != len(args.trees):
            p.error("--tree-args needs one string per tree")
        records = [
            run_tree(tree.resolve(), args.config, shlex.split(args.extra_args) + shlex.split(targs))
            for tree, targs in zip(args.trees, tree_args)
        ]
        if args.out:
            args.out.write_text(json.dumps(records[0], indent=1, sort_keys=True) + "\n")
    print(f"{len(records[0])} values recorded")
    if len(records) < 2:
        return 0
    diffs = [
        line for other in records[1:] for line in differences(records[0], other, args.tolerance)
    ]
    for line in diffs:
        print(line)
    print("identical" if not diffs else f"{len(diffs)} differences")
    return 1 if diffs else 0


if __name__ == "__main__":
    sys.exit(main())
