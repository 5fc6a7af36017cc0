"""RL against more imitation at equal compute, from a warm start trained to its plateau.

    python benchmarks/rl_vs_sft.py --task sokoban                        # 2 SFT seeds x 3 RL seeds
    python benchmarks/rl_vs_sft.py --task sokoban --expert-noise 0.5     # an imperfect expert
    python benchmarks/rl_vs_sft.py --task sokoban --sft-seeds 0 --stages plateau   # the plateau only
    python benchmarks/rl_vs_sft.py --task sokoban --rl-args --data.training.num_iterations 40

For every SFT seed (the task config's ``model.warm_start`` recipe with that ``seed``, and
``--expert-noise``):

1. **plateau**: supervised steps on the recipe's demonstrations at its learning rate, held-out
   success measured every ``--every`` steps (after the reading steps) on ``--val-levels``
   validation levels at ``--temperature``. The plateau is the best of these checkpoints; the search
   stops ``--patience`` measurements after the best (default 6: supervised success climbs in steps,
   flat for a few measurements and then up), or at ``--max-steps``. Saved as a model folder
   ``<out>/sft<seed>/plateau`` with ``plateau.json`` (the validation curve, steps, wall time).
2. **+RL**, per RL seed ``r``: ``python main.py fit --config <task> --model.model <plateau>
   --model.warm_start false --seed_everything r --data.training.seed 10000 (r + 1)`` plus ``--rl-args`` (``benchmarks/learning.py``'s
   run overlay: CSV log, the exported actor); the fit's wall time is recorded.
3. **+SFT**: from the plateau's weights, supervised steps continue on the same demonstrations (a
   fresh AdamW at the recipe's rate with its warm-up, a new batch order) for the mean wall time of
   that plateau's RL fits: equal wall clock, the RL fits' start-up and validation included (in
   SFT's favour). ``--sft-minutes`` sets the time instead.
4. **test**: the plateau, +SFT and every +RL actor on the same ``--test-levels`` held-out levels
   (default 1024, ``episode_seeds(0, n, "eval")`` minus every SFT seed's demonstration levels) at
   ``--temperature``; the validation levels are drawn from another stream and exclude them.

The table (markdown on stdout and in ``<out>/table.md``; everything in ``<out>/results.json``): per
SFT seed, the plateau's step and success, +SFT, +RL (mean over the RL seeds, and each), and RL − SFT
with two 95 % intervals: over levels (the levels are shared, so the per-level difference between
the RL seeds' mean success and +SFT's is paired) and over RL seeds (Student t of the per-seed
differences, which also carries the spread between training runs). Stages already done in ``<out>``
are read back, so a run can be resumed or extended with more RL seeds.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from filter_table import mean_interval  # noqa: E402
from learning import config_path, env_of, episode_of, fit_into, load_config  # noqa: E402

import envs  # noqa: E402, F401  (registers the ragen/* ids)
from ragen_lightning.metrics.intervals import paired_difference  # noqa: E402

VAL_STREAM_SEED = 7919  # the validation levels' stream: not the test levels' (seed 0)


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--task", default="sokoban", help="configs/<task>.yaml or a YAML path")
    p.add_argument("--out", default="outputs/rl_vs_sft", help="results folder")
    p.add_argument("--sft-seeds", type=int, nargs="+", default=[0, 1])
    p.add_argument("--rl-seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--expert-noise", type=float, default=0.0, help="an imperfect expert")
    p.add_argument("--every", type=int, default=250, help="SFT steps between validations")
    p.add_argument("--patience", type=int, default=6, help="validations without a new best")
    p.add_argument("--max-steps", type=int, default=6000)
    p.add_argument("--val-levels", type=int, default=256)
    p.add_argument("--test-levels", type=int, default=1024)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--sft-minutes", type=float, default=None, help="+SFT's time (default: RL's)")
    p.add_argument(
        "--stages", nargs="+", default=["plateau", "rl", "sft", "test"], help="what to run"
    )
    p.add_argument("--rl-args", nargs=argparse.REMAINDER, default=[], help="flags for the fits")
    return p.parse_args(argv)


# --------------------------------------------------------------------------------------------------
# Intervals
# --------------------------------------------------------------------------------------------------


def proportion_interval(p: float, n: int, z: float = 1.96) -> tuple[float, float]:
    half = z * math.sqrt(p * (1 - p) / n)
    return p - half, p + half


# --------------------------------------------------------------------------------------------------
# Stages
# --------------------------------------------------------------------------------------------------


class Task:
    """The task config's env, episode settings and warm-start recipe, and the level sets."""

    def __init__(self, args: argparse.Namespace):
        from ragen_lightning.rollout.seeds import episode_seeds
        from ragen_lightning.sft.warm_start import WarmStartSettings, as_warm_start

        self.args = args
        self.cfg = load_config(args.task)
        self.env_id, self.env_kwargs = env_of(self.cfg["data"])
        self.episode = episode_of(self.cfg["data"])
        self.model = self.cfg["model"].get("model", "tiny")
        recipe = as_warm_start(self.cfg["model"].get("warm_start")) or WarmStartSettings()
        self.recipes = {
            s: dataclasses.replace(recipe, seed=s, expert_noise=args.expert_noise)
            for s in args.sft_seeds
        }
        demo = sorted(
            {
                x
                for r in self.recipes.values()
                for x in episode_seeds(r.seed, r.num_episodes, "train")
            }
        )
        self.demo_seeds = demo
        self.test_seeds = episode_seeds(0, args.test_levels, "eval", exclude=demo)
        self.val_exclude = demo + self.test_seeds

    def evaluate(self, model: Any, n: int, stream: int, exclude: list[int], tokenizer=None):
        from ragen_lightning.sft.evaluation import evaluate_policy

        return evaluate_policy(
            model,
            self.env_id,
            self.env_kwargs,
            tokenizer=tokenizer,
            num_episodes=n,
            seed=stream,
            exclude_seeds=exclude,
            temperature=self.args.temperature,
            episode=self.episode,
            per_episode=True,
        )


def _save(net, tokenizer, folder: Path) -> None:
    """The model folder, written beside and renamed into place (never half-written)."""
    import shutil

    from ragen_lightning.sft.module import save_model

    tmp = folder.with_name(folder.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    save_model(net, tokenizer, tmp)
    shutil.rmtree(folder, ignore_errors=True)
    tmp.rename(folder)


def _supervised(task: Task, seed: int):
    from ragen_lightning.sft.warm_start import supervised_set

    return supervised_set(
        task.model, task.env_id, task.env_kwargs, task.recipes[seed], episode=task.episode
    )


def _train(
    task: Task,
    seed: int,
    data,
    net,
    *,
    steps: int,
    warmup: bool,
    on_step,
    batch_seed: int,
    optimizer=None,
):
    from ragen_lightning.parallel.threads import torch_threads_set
    from ragen_lightning.sft.training import train_sft

    r = task.recipes[seed]
    reading = r.reading_steps if warmup else 0
    with torch_threads_set(r.torch_threads):
        return train_sft(
            net,
            data.demos,
            data.tokenizer.pad_token_id,
            steps=steps,
            lr=r.lr,
            batch_size=r.batch_size,
            weight_decay=r.weight_decay,
            warmup_steps=r.warmup_steps if warmup else 0,
            lr_schedule=r.lr_schedule,
            seed=batch_seed,
            reading_demos=data.reading_demos if reading else (),
            reading_steps=reading,
            threads=r.threads,
            on_step=on_step,
            optimizer=optimizer,
        )


def plateau(task: Task, seed: int, folder: Path) -> dict[str, Any]:
    """Stage 1: supervised steps to the best validation success; the model folder and its record.

    Resumable: at every validation the search saves its model, AdamW state and curve under
    ``<sft seed>/search`` (and the best model so far under ``search/best``); a run that finds them
    continues from that step, with a new batch order (``seed + step``), its record naming the step
    it resumed at."""
    import torch

    from ragen_lightning import models

    args, r = task.args, task.recipes[seed]
    started = time.perf_counter()
    data = _supervised(task, seed)
    search = folder.parent / "search"
    torch.manual_seed(seed)
    saved = search / "state.pt"
    state = torch.load(saved, weights_only=False) if saved.is_file() else None
    net = models.load_causal_lm(str(search / "model") if state else data.base, r.dtype)
    params = [p for p in net.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=r.lr, weight_decay=r.weight_decay)
    first = 0
    record: dict[str, Any] = {"curve": [], "best_success": -1.0, "best_step": 0, "resumed_at": []}
    if state:
        optimizer.load_state_dict(state["optimizer"])
        first, record = state["step"], state["record"]
        record["resumed_at"].append(first)
        print(f"plateau sft{seed}: resuming the search at step {first}", flush=True)

    def on_step(local: int, loss: float) -> bool:
        step = first + local
        if step % args.every or step <= r.reading_steps:
            return False
        net.eval()
        res = task.evaluate(net, args.val_levels, VAL_STREAM_SEED, task.val_exclude, data.tokenizer)
        net.train()
        point = {
            "step": step,
            "loss": loss,
            "val_success": res["success_rate"],
            "format_valid": res["format_valid_rate"],
            "wall_s": time.perf_counter() - started,
        }
        record["curve"].append(point)
        if res["success_rate"] > record["best_success"]:
            record.update(best_success=res["success_rate"], best_step=step)
            _save(net, data.tokenizer, search / "best")
        _save(net, data.tokenizer, search / "model")
        tmp = saved.with_suffix(".tmp")
        torch.save({"step": step, "optimizer": optimizer.state_dict(), "record": record}, tmp)
        tmp.replace(saved)
        print(
            f"plateau sft{seed}: step {step} val {res['success_rate']:.3f} (best "
            f"{record['best_success']:.3f} at {record['best_step']}) {point['wall_s']:.0f} s",
            flush=True,
        )
        return step - record["best_step"] >= args.patience * args.every

    if first < args.max_steps and not (
        state and first - record["best_step"] >= args.patience * args.every
    ):
        _train(
            task,
            seed,
            data,
            net,
            steps=args.max_steps - first,
            warmup=first == 0,
            on_step=on_step,
            batch_seed=seed + first,
            optimizer=optimizer,
        )
    if not (search / "best").is_dir():
        raise SystemExit(
            f"--max-steps {args.max_steps} leaves no validation after the reading steps"
        )
    import shutil

    shutil.rmtree(folder, ignore_errors=True)
    shutil.copytree(search / "best", folder)
    out = {
        "sft_seed": seed,
        "step": record["best_step"],
        "val_success": record["best_success"],
        "curve": record["curve"],
        "resumed_at": record["resumed_at"],
        "wall_s": time.perf_counter() - started,
        "demo_stats": data.stats,
        "recipe": data.args,
    }
    (folder.parent / "plateau.json").write_text(json.dumps(out, indent=1, default=str))
    return out


def more_sft(task: Task, seed: int, start: Path, folder: Path, seconds: float) -> dict[str, Any]:
    """Stage 3: supervised steps from the plateau's weights for ``seconds`` of wall clock."""
    import torch

    from ragen_lightning import models

    data = _supervised(task, seed)
    torch.manual_seed(seed)
    net = models.load_causal_lm(str(start), task.recipes[seed].dtype)
    t0 = time.perf_counter()
    losses = _train(
        task,
        seed,
        data,
        net,
        steps=10**9,
        warmup=False,
        on_step=lambda step, loss: time.perf_counter() - t0 >= seconds,
        batch_seed=seed + 1000,
    )
    _save(net, data.tokenizer, folder)
    record = {"steps": len(losses), "seconds": time.perf_counter() - t0, "budget_s": seconds}
    (folder.parent / "more_sft.json").write_text(json.dumps(record, indent=1))
    return record


def rl_fit(task: Task, plateau_folder: Path, run_dir: Path, rl_seed: int) -> float:
    """Stage 2: one RL fit from the plateau; its wall time."""
    flags = [
        "--model.model",
        str(plateau_folder),
        "--model.warm_start",
        "false",
        "--seed_everything",
        str(rl_seed),
        "--data.training.seed",
        str(10000 * (rl_seed + 1)),  # its own training levels, as docs/learning.md's seeds
        *task.args.rl_args,
    ]
    seconds = fit_into(task.args.task, task.cfg, run_dir, flags)
    (run_dir / "wall.json").write_text(json.dumps({"wall_s": seconds}))
    return seconds


# --------------------------------------------------------------------------------------------------
# The table
# --------------------------------------------------------------------------------------------------


def compare(plateau_s: list[int], sft: list[int], rl: list[list[int]]) -> dict[str, Any]:
    """One SFT seed's row from per-level successes on the shared test levels."""
    n = len(sft)
    rl_means = [statistics.fmean(x) for x in rl]
    per_level_rl = [statistics.fmean(col) for col in zip(*rl, strict=True)]
    sft_rate = statistics.fmean(sft)
    return {
        "n": n,
        "plateau": statistics.fmean(plateau_s),
        "sft": sft_rate,
        "sft_minus_plateau": paired_difference(
            [float(x) for x in sft], [float(x) for x in plateau_s]
        ),
        "rl": rl_means,
        "rl_minus_plateau": paired_difference(per_level_rl, [float(x) for x in plateau_s]),
        "rl_minus_sft_levels": paired_difference(per_level_rl, [float(x) for x in sft]),
        "rl_minus_sft_seeds": mean_interval([m - sft_rate for m in rl_means]),
    }


def fmt(d: tuple[float, float, float]) -> str:
    return f"{d[0]:+.3f} [{d[1]:+.3f}, {d[2]:+.3f}]"


def table(rows: dict[int, dict[str, Any]], extra: dict[int, dict[str, Any]]) -> str:
    head = (
        "| SFT seed | plateau (step) | +SFT (steps) | +RL, mean (per seed) | +SFT - plateau | "
        "+RL - plateau | +RL - +SFT, over levels | +RL - +SFT, over RL seeds | minutes |\n"
        "|---|---|---|---|---|---|---|---|---|\n"
    )
    lines = []
    for seed, c in sorted(rows.items()):
        e = extra[seed]
        lo, hi = proportion_interval(c["plateau"], c["n"])
        lines.append(
            f"| {seed} | {c['plateau']:.3f} [{lo:.3f}, {hi:.3f}] ({e['plateau_step']}) | "
            f"{c['sft']:.3f} ({e['sft_steps']}) | {statistics.fmean(c['rl']):.3f} "
            f"({', '.join(f'{m:.3f}' for m in c['rl'])}) | {fmt(c['sft_minus_plateau'])} | "
            f"{fmt(c['rl_minus_plateau'])} | {fmt(c['rl_minus_sft_levels'])} | "
            f"{fmt(c['rl_minus_sft_seeds'])} | {e['minutes']:.1f} |"
        )
    return head + "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if not config_path(args.task).is_file():
        raise SystemExit(f"--task: no config {config_path(args.task)}")
    out = Path(args.out).resolve()
    task = Task(args)
    results: dict[str, Any] = {"args": vars(args), "seeds": {}}
    rows, extra = {}, {}
    for seed in args.sft_seeds:
        base = out / f"sft{seed}"
        base.mkdir(parents=True, exist_ok=True)
        plateau_dir, sft_dir = base / "plateau", base / "more_sft"
        if "plateau" in args.stages and not (base / "plateau.json").is_file():
            plateau(task, seed, plateau_dir)
        if not (base / "plateau.json").is_file():
            continue
        record = json.loads((base / "plateau.json").read_text())
        rl_dirs = [base / f"rl{r}" for r in args.rl_seeds]
        for r, run_dir in zip(args.rl_seeds, rl_dirs, strict=True):
            if "rl" in args.stages and not (run_dir / "wall.json").is_file():
                print(f"rl sft{seed} seed {r}: fitting into {run_dir}", flush=True)
                rl_fit(task, plateau_dir, run_dir, r)
        walls = [
            json.loads((d / "wall.json").read_text())["wall_s"]
            for d in rl_dirs
            if (d / "wall.json").is_file()
        ]
        budget = (
            args.sft_minutes * 60
            if args.sft_minutes
            else (statistics.fmean(walls) if walls else None)
        )
        if "sft" in args.stages and budget and not (base / "more_sft.json").is_file():
            print(f"sft sft{seed}: {budget:.0f} s of supervised steps from the plateau", flush=True)
            more_sft(task, seed, plateau_dir, sft_dir, budget)
        if "test" not in args.stages or not (base / "more_sft.json").is_file():
            continue
        done = [d for d in rl_dirs if (d / "actor").is_dir()]
        if len(done) != len(rl_dirs):
            continue
        tests = {}
        for name, folder in [("plateau", plateau_dir), ("sft", sft_dir)] + [
            (d.name, d / "actor") for d in done
        ]:
            cached = (
                folder.parent / f"test-{folder.name}-{args.test_levels}-{args.temperature}.json"
            )
            if not cached.is_file():
                print(f"test sft{seed} {name}: {args.test_levels} levels", flush=True)
                res = task.evaluate(str(folder), args.test_levels, 0, task.demo_seeds)
                cached.write_text(json.dumps(res))
            tests[name] = json.loads(cached.read_text())
            if tests[name]["seeds"] != task.test_seeds:
                raise SystemExit(f"{cached}: not the test levels of these SFT seeds; delete it")
        rows[seed] = compare(
            tests["plateau"]["successes"],
            tests["sft"]["successes"],
            [tests[d.name]["successes"] for d in done],
        )
        sft_record = json.loads((base / "more_sft.json").read_text())
        extra[seed] = {
            "plateau_step": record["step"],
            "sft_steps": sft_record["steps"],
            "minutes": sft_record["seconds"] / 60,
        }
        results["seeds"][seed] = {
            "plateau": record,
            "more_sft": sft_record,
            "comparison": rows[seed],
            "rl_wall_s": walls,
        }
    (out / "results.json").write_text(json.dumps(results, indent=1, default=str))
    if rows:
        text = table(rows, extra)
        (out / "table.md").write_text(text)
        print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
