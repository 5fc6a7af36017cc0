"""Does the reward-variance filter help? Filter vs no filter, per task and estimator, over training seeds.

    python benchmarks/filter_table.py --tasks bandit --out outputs/filter_table --fit-args \\
        --model.update.micro_batch_threads 1 --model.critic.in_background false      # docs/learning.md, C10
    python benchmarks/filter_table.py --summary --tasks bandit frozen_lake --out outputs/filter_table

Every cell (task x estimator x arm x training seed) runs ``python main.py fit --config configs/<task>.yaml`` with
the estimator, the arm's filter and the seed's flags (seed k: ``--seed_everything k --data.training.seed
10000 * (k + 1)``, as docs/learning.md), then evaluates the exported actor on the task's held-out episodes (the same
episodes for every cell and for the warm start: common random numbers). The two arms:

- ``none``: ``--data.filter {strategy: top_p, value: 1.0, include_zero: true}`` (every group trains);
- ``filter``: RAGEN-2's / StarPO-S's ``{strategy: top_p, value: 0.9, metric: reward_variance, include_zero: false,
  options: {mode: linear}}``: the groups that carry 90 % of the summed in-group reward std,
  zero-variance groups dropped.

Both arms generate the same rollouts per iteration (same groups, same iterations, same learning rate); the filter
only chooses which of them train, as in RAGEN. Cells already measured (``<out>/<task>/<cell>/result.json``) are
read, not rerun, so an interrupted table resumes (stop it with Ctrl-C, which reaches the whole process group;
killing the main process alone leaves the pool's workers finishing their cells). ``--jobs 2`` runs two cells at a
time (set the fit flags so that each uses one core, e.g. ``--model.update.micro_batch_threads 1``).

The summary gives per (task, estimator, arm): held-out success after training (mean over seeds with Student's t
95 % interval), the gain over the warm start, the paired filter - none difference per seed (same seed, same training
levels) with its t interval, fit minutes, and the collapse indicators from each run's metrics.csv (first -> last
quarter of in-group reward std and token entropy; first -> last measured H(Z|X) and MI of the first turn; the
filter's mean kept ratio). ``--summary`` only prints the table of what is measured.
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import statistics
import sys
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))  # learning.py
# before benchmarks/: `import envs` is the project's envs package, not benchmarks/envs.py
sys.path.insert(0, str(ROOT))

from ragen_lightning.metrics.intervals import wilson

ARMS: dict[str, str] = {
    "none": "{strategy: top_p, value: 1.0, include_zero: true}",
    "filter": (
        "{strategy: top_p, value: 0.9, metric: reward_variance, include_zero: false, "
        "options: {mode: linear}}"
    ),
}

# Student's t, two-sided 95 %, by degrees of freedom
T95 = {
    1: 12.706,
    2: 4.303,
    3: 3.182,
    4: 2.776,
    5: 2.571,
    6: 2.447,
    7: 2.365,
    8: 2.306,
    9: 2.262,
    10: 2.228,
}


def mean_interval(values: list[float]) -> tuple[float, float, float]:
    """Mean and its Student's t 95 % interval (the mean itself twice for one value)."""
    m = statistics.fmean(values)
    if len(values) < 2:
        return m, m, m
    half = T95.get(len(values) - 1, 1.96) * statistics.stdev(values) / math.sqrt(len(values))
    return m, m - half, m + half


def seed_flags(seed: int) -> list[str]:
    return ["--seed_everything", str(seed), "--data.training.seed", str(10000 * (seed + 1))]


def cell_flags(estimator: str, arm: str, seed: int) -> list[str]:
    return ["--model.advantage.estimator", estimator, "--data.filter", ARMS[arm], *seed_flags(seed)]


def with_collapse_every(
    cfg: dict[str, Any], every: int | None, samples: int | None = None
) -> dict[str, Any]:
    """``cfg`` with its ``callbacks.CollapseMonitor`` measuring MI every ``every`` iterations on
    ``samples`` sampled first turns (each unchanged for None)."""
    if every is None and samples is None:
        return cfg
    changes = {
        k: v for k, v in (("compute_freq", every), ("num_samples", samples)) if v is not None
    }
    callbacks = []
    for c in cfg.get("trainer", {}).get("callbacks", []):
        if str(c.get("class_path", "")).endswith("CollapseMonitor"):
            c = {**c, "init_args": {**c.get("init_args", {}), **changes}}
        callbacks.append(c)
    return {**cfg, "trainer": {**cfg.get("trainer", {}), "callbacks": callbacks}}


def run_cell(
    task: str,
    estimator: str,
    arm: str,
    seed: int,
    fit_args: list[str],
    eval_episodes: int,
    temperature: float,
    eval_seed: int,
    out: str,
    collapse_every: int | None = None,
    collapse_samples: int | None = None,
) -> dict[str, Any]:
    """Fit one cell in a subprocess, evaluate its actor here (one torch thread), write
    ``result.json``."""
    import torch

    torch.set_num_threads(1)
    import learning

    import envs  # noqa: F401  (registers the env ids)

    cfg = with_collapse_every(learning.load_config(task), collapse_every, collapse_samples)
    run_dir = Path(out) / Path(task).stem / f"{estimator}-{arm}-s{seed}"
    fit_s = learning.fit_into(task, cfg, run_dir, [*cell_flags(estimator, arm, seed), *fit_args])
    _, demo = learning.warm_model(cfg)
    after = learning.evaluate(
        str(run_dir / "actor"), cfg, eval_episodes, temperature, eval_seed, demo
    )
    row = {
        "task": Path(task).stem,
        "estimator": estimator,
        "arm": arm,
        "seed": seed,
        "fit_s": fit_s,
        "after": after,
        "eval_episodes": eval_episodes,
        "temperature": temperature,
        "indicators": learning.indicators(run_dir),
        "command": (run_dir / "command.txt").read_text().strip(),
    }
    (run_dir / "result.json").write_text(json.dumps(row, indent=1))
    return row


def before_of(
    task: str, eval_episodes: int, temperature: float, eval_seed: int, out: Path
) -> dict[str, Any]:
    """The warm start's held-out result (cached in ``<out>/<task>/before.json``)."""
    path = out / Path(task).stem / "before.json"
    if path.exists():
        saved = json.loads(path.read_text())
        if (saved["eval_episodes"], saved["temperature"], saved["eval_seed"]) == (
            eval_episodes,
            temperature,
            eval_seed,
        ):
            return saved
    import learning

    import envs  # noqa: F401

    cfg = learning.load_config(task)
    warm, demo = learning.warm_model(cfg)
    result = learning.evaluate_warm_start(warm, cfg, eval_episodes, temperature, eval_seed, demo)
    saved = {
        "warm_start": warm,
        "eval_episodes": eval_episodes,
        "temperature": temperature,
        "eval_seed": eval_seed,
        **result,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(saved, indent=1))
    return saved


def fmt(x: float | None, f: str = "{:.3f}") -> str:
    return "-" if x is None else f.format(x)


def paired_cell(pairs: list[tuple[dict[str, Any], dict[str, Any]]]) -> str:
    """``filter - none`` over seeds: the mean with its t interval, each seed's difference, and how
    many seeds' differences exclude 0 on their own evaluation (normal approximation for two
    proportions over the episodes)."""
    if not pairs:
        return "-"
    import learning

    d, beyond = [], 0
    for none, filt in pairs:
        diff, lo, hi = learning.diff_interval(
            none["after"]["success_rate"],
            none["eval_episodes"],
            filt["after"]["success_rate"],
            filt["eval_episodes"],
        )
        d.append(diff)
        beyond += lo > 0 or hi < 0
    m, lo, hi = mean_interval(d)
    return (
        f"{m:+.3f} [{lo:+.3f}, {hi:+.3f}]; per seed {', '.join(f'{x:+.3f}' for x in d)} "
        f"({beyond}/{len(d)} beyond evaluation noise)"
    )


def summary(out: Path, tasks: list[str], estimators: list[str], seeds: list[int]) -> str:
    header = (
        "| task | estimator | arm | seeds | before [95 %] | after: mean [95 %] | after per seed | "
        "gain: mean [95 %] | filter - none, paired: mean [95 %] | fit min | reward std first -> last | "
        "entropy first -> last | H(Z|X) first -> last | MI first -> last | kept |"
    )
    lines = [header, "|---" * 15 + "|"]
    for task in tasks:
        name = Path(task).stem
        bpath = out / name / "before.json"
        if not bpath.exists():
            continue
        before = json.loads(bpath.read_text())
        b = before["success_rate"]
        blo, bhi = wilson(round(b * before["eval_episodes"]), before["eval_episodes"])
        for est in estimators:
            rows = {}
            for arm in ARMS:
                for s in seeds:
                    p = out / name / f"{est}-{arm}-s{s}" / "result.json"
                    if p.exists():
                        rows[(arm, s)] = json.loads(p.read_text())
            for arm in ARMS:
                got = [rows[(arm, s)] for s in seeds if (arm, s) in rows]
                if not got:
                    continue
                after = [r["after"]["success_rate"] for r in got]
                m, lo, hi = mean_interval(after)
                g, glo, ghi = mean_interval([a - b for a in after])
                paired = "-"
                if arm == "filter":
                    paired = paired_cell(
                        [
                            (rows[("none", s)], rows[("filter", s)])
                            for s in seeds
                            if ("filter", s) in rows and ("none", s) in rows
                        ]
                    )

                def ind(key: str, got: list[dict[str, Any]] = got) -> float | None:
                    vals = [r["indicators"][key] for r in got if key in r["indicators"]]
                    return statistics.fmean(vals) if vals else None

                def pair(key: str) -> str:
                    return f"{fmt(ind(key + '_first'))} -> {fmt(ind(key + '_last'))}"

                kept = [ind("kept_first"), ind("kept_last")]
                kept_s = fmt(statistics.fmean(kept), "{:.2f}") if None not in kept else "-"
                fits = [r["fit_s"] / 60 for r in got]
                lines.append(
                    f"| {name} | {est} | {arm} | {','.join(str(r['seed']) for r in got)} | "
                    f"{b:.3f} [{blo:.3f}, {bhi:.3f}] | {m:.3f} [{lo:.3f}, {hi:.3f}] | "
                    f"{', '.join(f'{a:.3f}' for a in after)} | {g:+.3f} [{glo:+.3f}, {ghi:+.3f}] | {paired} | "
                    f"{min(fits):.1f}-{max(fits):.1f} | {pair('reward_std')} | {pair('entropy')} | "
                    f"{pair('cond_entropy')} | {pair('mi')} | {kept_s} |"
                )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tasks", nargs="+", default=["bandit", "frozen_lake"])
    p.add_argument("--estimators", nargs="+", default=["gae", "grpo"])
    p.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    p.add_argument("--eval-episodes", type=int, default=1024)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument(
        "--eval-seed", type=int, default=0, help="seed of the held-out evaluation episodes"
    )
    p.add_argument("--jobs", type=int, default=2, help="cells at a time")
    p.add_argument("--out", default="outputs/filter_table")
    p.add_argument(
        "--collapse-every",
        type=int,
        default=None,
        help="measure the MI proxy every N iterations (the task config's CollapseMonitor compute_freq)",
    )
    p.add_argument(
        "--collapse-samples",
        type=int,
        default=None,
        help="sampled first turns per MI measurement (the CollapseMonitor's num_samples)",
    )
    p.add_argument(
        "--summary", action="store_true", help="only print the table of the cells measured"
    )
    p.add_argument(
        "--fit-args", nargs=argparse.REMAINDER, default=[], help="extra main.py flags (put last)"
    )
    a = p.parse_args(argv)
    out = Path(a.out).resolve()
    if not a.summary:
        import torch

        torch.set_num_threads(1)
        for task in a.tasks:
            before = before_of(task, a.eval_episodes, a.temperature, a.eval_seed, out)
            print(
                f"{task}: warm start {before['warm_start']}: success {before['success_rate']:.3f}",
                flush=True,
            )
        cells = [
            (t, e, arm, s)
            for t in a.tasks
            for e in a.estimators
            for s in a.seeds
            for arm in a.arms
            if not (out / Path(t).stem / f"{e}-{arm}-s{s}" / "result.json").exists()
        ]
        print(f"{len(cells)} cells to run, {a.jobs} at a time", flush=True)
        ctx = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(max_workers=a.jobs, mp_context=ctx) as pool:
            futures = {
                pool.submit(
                    run_cell,
                    *c,
                    a.fit_args,
                    a.eval_episodes,
                    a.temperature,
                    a.eval_seed,
                    str(out),
                    a.collapse_every,
                    a.collapse_samples,
                ): c
                for c in cells
            }
            for f in as_completed(futures):
                c = futures[f]
                try:
                    r = f.result()
                    print(
                        f"{'/'.join(map(str, c))}: success {r['after']['success_rate']:.3f}, "
                        f"fit {r['fit_s'] / 60:.1f} min",
                        flush=True,
                    )
                except Exception as e:  # noqa: BLE001  (one failed cell does not stop the table)
                    print(f"{'/'.join(map(str, c))}: FAILED: {e}", flush=True)
    print(summary(out, a.tasks, a.estimators, a.seeds))


if __name__ == "__main__":
    main()
