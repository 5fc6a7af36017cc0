"""Does StarPO improve the warm-started tiny model? Before/after success on held-out seeds, per task
and variant.

    python benchmarks/learning.py                                   # bandit, frozen_lake, sokoban with their configs
    python benchmarks/learning.py --tasks bandit --variants ppo grpo ppo_filter
    python benchmarks/learning.py --tasks bandit --fit-args --data.training.num_iterations 8
    python benchmarks/learning.py --tasks frozen_lake --warm-start '{steps: 600}' --no-fit   # the warm start only

For every task (``configs/<task>.yaml``) and variant:

1. the warm-started model the config trains from (``model.warm_start``, built or read from the
   cache) is evaluated on ``--eval-episodes`` held-out episodes (``episode_seeds(--seed, n,
   "eval")`` minus the warm start's demonstration seeds; the RL training seeds are small integers
   from ``--data.training.seed``), sampled at ``--temperature`` (default 1.0, the training
   temperature: the policy RL actually optimises);
2. ``python main.py fit --config configs/<task>.yaml <variant flags>`` runs in a subprocess with its
   own CSV logger and ``--model.export_dir`` (no checkpoints, no wandb);
3. the exported actor is evaluated on the same episodes; with ``--select best`` also the actor of
   the run's best validation success (``callbacks.BestActorExport``: model selection on the
   validation seeds, which are not evaluation seeds), as a second row ``<variant>@best(it N)``.

The table gives success before and after, the difference with its 95 % interval (normal
approximation for the difference of two independent proportions: d +- 1.96 sqrt(p1 (1 - p1) / n + p2
(1 - p2) / n)), mean env return, format-valid turn rate, the fit's wall time, and the collapse
indicators from the run's ``metrics.csv`` (in-group reward std and token entropy averaged over the
first and last quarter of the iterations, MI first and last measured). Results are appended as JSON
lines to ``<out>/results.jsonl``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

# variant name -> extra main.py flags
VARIANTS: dict[str, list[str]] = {
    "default": [],
    "ppo": ["--model.advantage.estimator", "gae"],
    "grpo": ["--model.advantage.estimator", "grpo"],
    # rejection-sampling fine-tuning (set --model.advantage.options.threshold)
    "rft": ["--model.advantage.estimator", "rft"],
    # branching: turn reward minus the state's mean
    "state_baseline": ["--model.advantage.estimator", "state_baseline"],
    # branching: ... over the state's std
    "state_grpo": ["--model.advantage.estimator", "state_grpo"],
    "drgrpo": ["--model.advantage.estimator", "drgrpo"],
    "drgrpo_filter": [
        "--model.advantage.estimator",
        "drgrpo",
        "--data.filter",
        "{strategy: top_p, value: 0.9, include_zero: false}",
    ],
    "ppo_filter": [
        "--model.advantage.estimator",
        "gae",
        "--data.filter",
        "{strategy: top_p, value: 0.9, include_zero: false}",
    ],
    "ppo_nofilter": [
        "--model.advantage.estimator",
        "gae",
        "--data.filter",
        "{strategy: top_p, value: 1.0}",
    ],
    "grpo_filter": [
        "--model.advantage.estimator",
        "grpo",
        "--data.filter",
        "{strategy: top_p, value: 0.9, include_zero: false}",
    ],
    # StarPO vs StarPO-S (docs/starpo_s.md), both GRPO without KL: no filter and clip 0.2/0.2,
    # against the reward-variance filter and clip-higher 0.2/0.28
    "starpo": ["--model.advantage.estimator", "grpo", "--model.loss.clip_high", "0.2"],
    "starpo_s": [
        "--model.advantage.estimator",
        "grpo",
        "--model.loss.clip_high",
        "0.28",
        "--data.filter",
        "{strategy: top_p, value: 0.9, include_zero: false}",
    ],
}


def episode_of(data: dict[str, Any]):
    """The config's ``data.episode`` settings (the rollouts' format; the warm start and evaluation
    reuse it)."""
    from ragen_lightning.rollout.settings import as_episode

    return as_episode(data.get("episode"))


def env_of(data: dict[str, Any]) -> tuple[str, dict[str, Any] | None]:
    """The config's single env: ``data.env.id`` and ``data.env.kwargs``."""
    env = data.get("env") or {}
    return env["id"], env.get("kwargs")


def diff_interval(
    p1: float, n1: int, p2: float, n2: int, z: float = 1.96
) -> tuple[float, float, float]:
    """``(d, lo, hi)`` for d = p2 - p1: normal approximation with unpooled variance."""
    d = p2 - p1
    half = z * math.sqrt(p1 * (1 - p1) / n1 + p2 * (1 - p2) / n2)
    return d, d - half, d + half


def config_path(task: str) -> Path:
    """``configs/<task>.yaml``, or ``task`` itself when it is a path to a YAML file."""
    return (
        Path(task).resolve()
        if task.endswith((".yaml", ".yml"))
        else ROOT / "configs" / f"{task}.yaml"
    )


def load_config(task: str) -> dict[str, Any]:
    import yaml

    return yaml.safe_load(config_path(task).read_text())


def warm_model(cfg: dict[str, Any]) -> tuple[str, list[int]]:
    """The warm-started folder ``main.py fit`` would train from, and its demonstration seeds."""
    from ragen_lightning.rollout.seeds import episode_seeds
    from ragen_lightning.sft.warm_start import WarmStartSettings, as_warm_start, warm_start

    data, model = cfg["data"], cfg["model"]
    settings = as_warm_start(model.get("warm_start")) or WarmStartSettings()
    env_id, env_kwargs = env_of(data)
    path = warm_start(
        model.get("model", "tiny"), env_id, env_kwargs, settings, episode=episode_of(data)
    )
    demo = episode_seeds(settings.seed, settings.num_episodes, "train")
    return str(path), demo


def evaluate(
    path,
    cfg: dict[str, Any],
    n: int,
    temperature: float,
    seed: int,
    exclude: list[int],
    tokenizer=None,
) -> dict[str, float]:
    """``evaluate_policy`` of a model folder (or a model object with its ``tokenizer``) on held-out
    seeds."""
    from ragen_lightning.sft.warm_start import evaluate_policy

    data = cfg["data"]
    t = time.perf_counter()
    out = evaluate_policy(
        path,
        *env_of(data),
        tokenizer=tokenizer,
        num_episodes=n,
        seed=seed,
        exclude_seeds=exclude,
        temperature=temperature,
        episode=episode_of(data),
    )
    out["eval_s"] = time.perf_counter() - t
    return out


def evaluate_warm_start(
    path: str, cfg: dict[str, Any], n: int, temperature: float, seed: int, exclude: list[int]
) -> dict[str, float]:
    """:func:`evaluate` of a cached warm start, itself cached in the warm start's folder
    (content-addressed, so the figure cannot go stale): ``heldout-<key>.json``, the key a hash of
    everything the evaluation reads. Several benchmark runs from one warm start then share one
    "before" instead of each spending minutes on it."""
    import hashlib

    if not Path(path).is_dir():  # no warm start: a model name
        return evaluate(path, cfg, n, temperature, seed, exclude)
    data = cfg["data"]
    env_id, env_kwargs = env_of(data)
    spec = {
        "env_id": env_id,
        "env_kwargs": env_kwargs,
        "n": n,
        "temperature": temperature,
        "seed": seed,
        "exclude": list(exclude),
        "episode": str(episode_of(data)),
    }
    key = hashlib.sha256(json.dumps(spec, sort_keys=True, default=str).encode()).hexdigest()[:16]
    cached = Path(path) / f"heldout-{key}.json"
    if cached.is_file():
        return json.loads(cached.read_text())
    out = evaluate(path, cfg, n, temperature, seed, exclude)
    tmp = cached.with_suffix(".tmp")
    tmp.write_text(json.dumps(out))
    tmp.replace(cached)  # whole or not at all: a concurrent run reads the old state or the new file
    return out


def with_warm_start(cfg: dict[str, Any], spec: str | None) -> tuple[dict[str, Any], list[str]]:
    """``cfg`` with ``model.warm_start`` replaced by the JSON/YAML ``spec`` (e.g. ``'{steps:
    2000}'``), and the ``main.py`` flags that make the fit train from that same warm start;
    unchanged when ``spec`` is None."""
    if spec is None:
        return cfg, []
    import yaml

    value = yaml.safe_load(spec)
    if not isinstance(value, (bool, dict)):
        raise SystemExit(
            f"--warm-start must be true, false or a mapping such as '{{steps: 300}}', got {spec!r}"
        )
    cfg = {**cfg, "model": {**cfg.get("model", {}), "warm_start": value}}
    return cfg, ["--model.warm_start", json.dumps(value)]


def overlay(cfg: dict[str, Any], run_dir: Path, best: bool = False) -> Path:
    """A config overlay: CSV logging into ``run_dir``, the task's callbacks minus checkpointing
    (plus, with ``best``, ``callbacks.BestActorExport`` into ``run_dir/best_actor``)."""
    import yaml

    callbacks = [
        c
        for c in cfg.get("trainer", {}).get("callbacks", [])
        if not str(c.get("class_path", "")).endswith(("ModelCheckpoint", "BestActorExport"))
    ]
    if best:
        callbacks.append(
            {
                "class_path": "callbacks.BestActorExport",
                "init_args": {"dirpath": str(run_dir / "best_actor"), "monitor": "val_success"},
            }
        )
    doc = {
        "trainer": {
            "default_root_dir": str(run_dir),
            "enable_checkpointing": False,
            "logger": [
                {
                    "class_path": "lightning.pytorch.loggers.CSVLogger",
                    "init_args": {"save_dir": str(run_dir), "name": "csv"},
                }
            ],
            "callbacks": callbacks,
        }
    }
    path = run_dir / "overlay.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def indicators(run_dir: Path) -> dict[str, float]:
    """Collapse indicators from the run's metrics.csv: first/last-quarter means of reward std and
    entropy, first and last MI and H(Z|X) of the first turn, the filter keep ratio and the training
    success of the first and last quarter."""
    from plot_run import read_metrics

    series = read_metrics(run_dir / "csv")
    out: dict[str, float] = {}

    def quarter(key: str, name: str) -> None:
        vals = [v for _, v in series.get(key, [])]
        if vals:
            q = max(1, len(vals) // 4)
            out[f"{name}_first"] = sum(vals[:q]) / q
            out[f"{name}_last"] = sum(vals[-q:]) / q

    quarter("rollout/in_group_reward_std", "reward_std")
    quarter("actor/entropy", "entropy")
    quarter("train/success", "train_success")
    quarter("rollout/filter_kept_ratio", "kept")
    for key, name in (
        ("collapse/first_turn/mi", "mi"),
        ("collapse/first_turn/conditional_entropy", "cond_entropy"),
    ):
        vals = [v for _, v in series.get(key, [])]
        if vals:
            out[f"{name}_first"], out[f"{name}_last"] = vals[0], vals[-1]
    return out


def fit_into(
    task: str,
    cfg: dict[str, Any],
    run_dir: Path,
    flags: list[str],
    best: bool = False,
    echo: bool = False,
) -> float:
    """Run ``main.py fit --config <task>`` plus the run overlay and ``flags`` into a fresh
    ``run_dir`` (its ``command.txt``, ``fit.log``, ``csv/`` and the exported ``actor/``); the wall
    time in seconds. A failed fit raises RuntimeError naming its log."""
    if run_dir.exists():
        import shutil

        shutil.rmtree(run_dir)
    run_dir.mkdir(parents=True)
    cmd = [
        sys.executable,
        str(ROOT / "main.py"),
        "fit",
        "--config",
        str(config_path(task)),
        "--config",
        str(overlay(cfg, run_dir, best)),
        *flags,
        "--model.export_dir",
        str(run_dir / "actor"),
    ]
    (run_dir / "command.txt").write_text(" ".join(cmd) + "\n")
    if echo:
        print("$", " ".join(cmd), flush=True)
    t = time.perf_counter()
    with open(run_dir / "fit.log", "w") as log:
        rc = subprocess.call(
            cmd,
            cwd=ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "WANDB_MODE": "offline"},
        )
    if rc != 0:
        raise RuntimeError(f"fit failed ({rc}); see {run_dir / 'fit.log'}")
    return time.perf_counter() - t


def run_fit(
    task: str, cfg: dict[str, Any], variant: str, extra: list[str], out: Path, best: bool = False
) -> tuple[Path, float]:
    run_dir = (out / f"{Path(task).stem}-{variant}").resolve()
    try:
        return run_dir, fit_into(task, cfg, run_dir, [*VARIANTS[variant], *extra], best, echo=True)
    except RuntimeError as e:
        raise SystemExit(str(e)) from None


def fmt_row(r: dict[str, Any]) -> str:
    b, a = r["before"], r["after"]
    ind = r.get("indicators", {})

    def g(k: str, f: str = "{:.3f}") -> str:
        return f.format(ind[k]) if k in ind else "-"

    return (
        f"| {r['task']} | {r['variant']} | {b['success_rate']:.3f} | {a['success_rate']:.3f} | "
        f"{r['diff']:+.3f} [{r['diff_lo']:+.3f}, {r['diff_hi']:+.3f}] | "
        f"{b['mean_return']:.3f} -> {a['mean_return']:.3f} | {b['format_valid_rate']:.2f} -> "
        f"{a['format_valid_rate']:.2f} | {r['fit_s'] / 60:.1f} | "
        f"{g('reward_std_first')} -> {g('reward_std_last')} | {g('entropy_first')} -> {g('entropy_last')} | "
        f"{g('mi_first')} -> {g('mi_last')} |"
    )


HEADER = (
    "| task | variant | success before | success after | diff [95% CI] | return before -> after | "
    "format-valid | fit min | reward std (first -> last quarter) | entropy | MI first -> last |\n"
    "|---|---|---:|---:|---|---|---|---:|---|---|---|"
)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument(
        "--tasks",
        nargs="+",
        default=["bandit", "frozen_lake", "sokoban"],
        help="configs/<task>.yaml, or paths to task YAML files",
    )
    p.add_argument("--variants", nargs="+", default=["default"], choices=sorted(VARIANTS))
    p.add_argument("--eval-episodes", type=int, default=256)
    p.add_argument("--temperature", type=float, default=1.0, help="evaluation sampling temperature")
    p.add_argument("--seed", type=int, default=0, help="seed of the held-out evaluation episodes")
    p.add_argument("--out", default="outputs/learning")
    p.add_argument(
        "--warm-start",
        default=None,
        help="replace the config's model.warm_start, e.g. '{steps: 2000, num_episodes: 2048}'",
    )
    p.add_argument("--no-fit", action="store_true", help="only build and evaluate the warm start")
    p.add_argument(
        "--select",
        choices=["last", "best"],
        default="last",
        help="best: also evaluate the actor of the best validation success (callbacks.BestActorExport; "
        "validation seeds are not evaluation seeds), reported as a second row '<variant>@best'",
    )
    p.add_argument(
        "--fit-args", nargs=argparse.REMAINDER, default=[], help="extra main.py flags (put last)"
    )
    a = p.parse_args(argv)

    import torch

    torch.set_num_threads(1)
    import envs  # noqa: F401  (registers the env ids)

    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for task in a.tasks:
        cfg, warm_args = with_warm_start(load_config(task), a.warm_start)
        t = time.perf_counter()
        warm, demo_seeds = warm_model(cfg)
        warm_s = time.perf_counter() - t
        before = evaluate_warm_start(warm, cfg, a.eval_episodes, a.temperature, a.seed, demo_seeds)
        print(
            f"{task} warm start {warm} ({warm_s:.0f} s, {cfg['model'].get('warm_start')}): {before}",
            flush=True,
        )
        if a.no_fit:
            continue
        for variant in a.variants:
            run_dir, wall = run_fit(
                task, cfg, variant, [*warm_args, *a.fit_args], out, best=a.select == "best"
            )
            actors = {variant: run_dir / "actor"}
            if a.select == "best":
                record = json.loads((run_dir / "best_actor" / "best.json").read_text())
                actors[f"{variant}@best(it {record['iteration']})"] = run_dir / "best_actor"
            for name, folder in actors.items():
                after = evaluate(
                    str(folder), cfg, a.eval_episodes, a.temperature, a.seed, demo_seeds
                )
                d, lo, hi = diff_interval(
                    before["success_rate"], a.eval_episodes, after["success_rate"], a.eval_episodes
                )
                row = {
                    "task": task,
                    "variant": name,
                    "fit_args": [*warm_args, *a.fit_args],
                    "eval_episodes": a.eval_episodes,
                    "temperature": a.temperature,
                    "before": before,
                    "after": after,
                    "diff": d,
                    "diff_lo": lo,
                    "diff_hi": hi,
                    "fit_s": wall,
                    "indicators": indicators(run_dir),
                    "run_dir": str(run_dir),
                }
                print(f"{task}/{name}: {after}; diff {d:+.3f} [{lo:+.3f}, {hi:+.3f}]", flush=True)
                with open(out / "results.jsonl", "a") as f:
                    f.write(json.dumps(row) + "\n")
                rows.append(row)
    print(HEADER)
    for r in rows:
        print(fmt_row(r))


if __name__ == "__main__":
    main()
