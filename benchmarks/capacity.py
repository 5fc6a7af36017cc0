"""Capacity ladder: can the embedded model represent a good policy? Warm-start only, no RL.

    python benchmarks/capacity.py --task frozen_lake --preset tiny --tokenizer cells --steps 150 600
    python benchmarks/capacity.py --task sokoban --preset small --tokenizer bpe --steps 300
    python benchmarks/capacity.py --throughput          # tokens/s forward+backward of every preset, fp32, 1 thread
    python benchmarks/capacity.py --task sokoban --self-imitate 2 --warm-start '{...}'   # its own solved episodes

``--self-imitate R``: R rounds of offline expert iteration from the config's warm start
(``--warm-start`` replaces it, as in ``benchmarks/learning.py``): roll the model out on
``--si-levels`` training levels x ``--si-group`` episodes at temperature 1 (seeds disjoint from the
demonstrations' and the held-out ones), fine-tune on the turn samples of the solved episodes
(``--si-steps`` AdamW steps, batch 32, ``--si-lr`` constant), evaluate on the held-out episodes.
That is where positive-only RL on the policy's own successes (``--model.advantage.floor 0``) heads,
without RL's per-step noise: if held-out success does not rise here, RL from its own successes has
no easy gain.

For every (task, tokenizer, preset, steps) the tiny model with that spec is built
(``tiny_model_path``), warm-started on the task config's solver demonstrations exactly like
``main.py fit`` would (``benchmarks/learning.py``'s ``warm_model`` with the config's runner
settings, ``model.warm_start`` replaced by ``{steps: N, ...}``) and evaluated on ``--eval-episodes``
held-out episodes at temperature 1 (the same seeds and evaluation as ``benchmarks/learning.py
--no-fit``). Rows are appended as JSON lines to ``<out>/capacity.jsonl``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _learning():
    """``benchmarks/learning.py``, loaded once by path (benchmarks/envs.py would shadow the
    project's ``envs`` package if benchmarks/ were on the path)."""
    import importlib.util

    if "_bench_learning" not in sys.modules:
        spec = importlib.util.spec_from_file_location(
            "_bench_learning", ROOT / "benchmarks" / "learning.py"
        )
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        sys.modules["_bench_learning"] = module
    return sys.modules["_bench_learning"]


def throughput(spec, seq_len: int = 512, batch: int = 4, reps: int = 3) -> float:
    """Tokens/s of one fp32 forward+backward (loss.backward, no optimizer) of a model built from
    ``spec``."""
    import torch
    from transformers import AutoModelForCausalLM

    from ragen_lightning.models.tiny import tiny_model_path

    model = AutoModelForCausalLM.from_pretrained(tiny_model_path(spec)).train()
    ids = torch.randint(
        0, model.config.vocab_size, (batch, seq_len), generator=torch.Generator().manual_seed(0)
    )
    model(input_ids=ids, labels=ids).loss.backward()  # warm-up
    t = time.perf_counter()
    for _ in range(reps):
        model.zero_grad(set_to_none=True)
        model(input_ids=ids, labels=ids).loss.backward()
    return reps * batch * seq_len / (time.perf_counter() - t)


def random_baseline(task: str, n: int, seed: int, reps: int = 8) -> float:
    """Success of uniformly random actions (the config's action budget, no turns, no format) on the
    held-out seeds of ``n`` evaluation episodes: the floor a warm start must beat to be reading its
    observation."""
    import gymnasium as gym
    import numpy as np

    from ragen_lightning.rollout.seeds import episode_seeds

    data = _learning().load_config(task)["data"]
    budget = data.get("max_actions_per_episode", 10)
    seeds = episode_seeds(seed, n, "eval", exclude=episode_seeds(seed, 512, "train"))
    env = gym.make(data["env"]["id"], **(data["env"].get("kwargs") or {}))
    rng, wins = np.random.default_rng(seed), 0
    for s in seeds:
        for _ in range(reps):
            env.reset(seed=int(s))
            info: dict = {}
            for _ in range(budget):
                _, _, terminated, truncated, info = env.step(int(rng.integers(env.action_space.n)))
                if terminated or truncated:
                    break
            wins += bool(info.get("success", False))
    return wins / (len(seeds) * reps)


def teacher_forced_reading(
    path: str, cfg: dict, n: int, seed: int, exclude: list[int]
) -> dict[str, float]:
    """Does the warm start read the observation? Teacher-forced argmax on the expert's turns of
    ``n`` held-out expert episodes (the config's episode settings): the share of turns whose
    reasoning clause up to the first ``;`` (FrozenLake ``goal is below and right of me;``, Sokoban
    ``box is left of target;``: what the grid says) is predicted token for token, and the share
    whose whole response is."""
    import torch

    from ragen_lightning import models
    from ragen_lightning.rollout.seeds import episode_seeds
    from ragen_lightning.sft.experts import reading_clause_end, turn_spans
    from ragen_lightning.sft.module import build_demonstrations

    data = cfg["data"]
    tok = models.load_tokenizer(path)
    net = models.load_causal_lm(path).eval()
    episode = _learning().episode_of(data)
    demos, _ = build_demonstrations(
        data["env"]["id"],
        tok,
        episode_seeds(seed, n, "eval", exclude=exclude),
        env_kwargs=data["env"].get("kwargs"),
        episode=episode,
    )
    clause = response = turns = first = first_clause = 0
    with torch.no_grad():
        for d in demos:
            ids = torch.tensor([d.input_ids])
            # the episode's first turn: one grid in context
            opening = tok.decode(d.input_ids).count("State:") == 1
            pred = net(input_ids=ids).logits[0, :-1].argmax(-1).tolist()
            mask, target = d.loss_mask[1:], d.input_ids[1:]
            for k, end in turn_spans(mask):  # each run of loss-mask 1 is one expert turn
                right = [pred[j] == target[j] for j in range(k, end)]
                cut = reading_clause_end(target, k, end, tok) - k
                turns += 1
                clause += all(right[:cut])
                if opening and turns and k == d.loss_mask.index(1) - 1:
                    first += 1
                    first_clause += all(right[:cut])
                response += all(right)
    return {
        "reading_exact": clause / max(turns, 1),
        "first_turn_reading_exact": first_clause / max(first, 1),
        "response_exact": response / max(turns, 1),
        "turns": turns,
        "first_turns": first,
    }


def self_imitate(cfg: dict, a: argparse.Namespace, out: Path) -> None:
    """``a.self_imitate`` rounds of roll out / keep the solved episodes / fine-tune / evaluate
    (module docstring)."""
    from ragen_lightning import models
    from ragen_lightning.rollout.engine import HFEngine, SamplingParams
    from ragen_lightning.rollout.runner import RolloutRunner
    from ragen_lightning.rollout.seeds import episode_seeds
    from ragen_lightning.rollout.tokens import ChatTokens
    from ragen_lightning.sft.module import Demonstration
    from ragen_lightning.sft.training import train_sft

    learning = _learning()
    data, episode = cfg["data"], learning.episode_of(cfg["data"])
    warm, demo_seeds = learning.warm_model(cfg)
    tokenizer, model = models.load_tokenizer(warm), models.load_causal_lm(warm)
    res = learning.evaluate(warm, cfg, a.eval_episodes, 1.0, a.seed, demo_seeds)
    print(
        f"| round | solved / episodes | samples | success | format-valid | s |\n|---:|---:|---:|---:|---:|---:|\n"
        f"| 0 | - | - | {res['success_rate']:.3f} | {res['format_valid_rate']:.2f} | - |",
        flush=True,
    )
    held_out = episode_seeds(a.seed, a.eval_episodes, "eval", exclude=demo_seeds)
    for r in range(1, a.self_imitate + 1):
        t = time.perf_counter()
        levels = episode_seeds(
            a.seed + r, a.si_levels, "self_imitation", exclude=[*demo_seeds, *held_out]
        )
        engine = HFEngine(model.eval(), [tokenizer.eos_token_id], tokenizer.pad_token_id)
        chat = ChatTokens(tokenizer, enable_think=episode.enable_think)
        runner = RolloutRunner(data["env"]["id"], data["env"].get("kwargs"), chat, engine, episode)
        params = SamplingParams(temperature=1.0, max_new_tokens=episode.max_new_tokens)
        try:
            trajs = runner.run(levels, a.si_group, params, seed=a.seed + r)
        finally:
            runner.close()
        demos = [
            Demonstration(tuple(s.conversation.input_ids), tuple(s.conversation.loss_mask))
            for tr in trajs
            if tr.success
            for s in tr.samples
            if any(s.conversation.loss_mask)
        ]
        if not demos:
            raise SystemExit(f"round {r}: no solved episode in {len(trajs)} to imitate")
        train_sft(
            model,
            demos,
            tokenizer.pad_token_id,
            steps=a.si_steps,
            lr=a.si_lr,
            batch_size=32,
            lr_schedule="constant",
            seed=a.seed + r,
            threads=a.threads,
        )
        res = learning.evaluate(
            model, cfg, a.eval_episodes, 1.0, a.seed, demo_seeds, tokenizer=tokenizer
        )
        solved = sum(tr.success for tr in trajs)
        print(
            f"| {r} | {solved} / {len(trajs)} | {len(demos)} | {res['success_rate']:.3f} | "
            f"{res['format_valid_rate']:.2f} | {time.perf_counter() - t:.0f} |",
            flush=True,
        )
        with open(out / "capacity.jsonl", "a") as f:
            f.write(
                json.dumps(
                    {
                        "task": a.task,
                        "self_imitation_round": r,
                        "warm_start": cfg["model"]["warm_start"],
                        "solved": solved,
                        "episodes": len(trajs),
                        "samples": len(demos),
                        "si_steps": a.si_steps,
                        "si_lr": a.si_lr,
                        **res,
                    }
                )
                + "\n"
            )


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--task", default="frozen_lake", help="configs/<task>.yaml or a path")
    p.add_argument("--preset", nargs="+", default=["tiny"])
    p.add_argument("--tokenizer", nargs="+", default=["cells"], choices=["cells", "bpe"])
    p.add_argument("--steps", nargs="+", type=int, default=[150])
    p.add_argument(
        "--warm-start",
        default="{}",
        help="extra warm_start arguments (YAML mapping), e.g. '{lr: 1e-3}'",
    )
    p.add_argument("--eval-episodes", type=int, default=256)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="outputs/learning")
    p.add_argument("--throughput", action="store_true", help="only measure tokens/s of each preset")
    p.add_argument(
        "--reading",
        metavar="FOLDER",
        help="only measure the reading of a built model folder (a warm "
        "start or an exported actor) on the task's held-out expert turns",
    )
    p.add_argument(
        "--self-imitate",
        type=int,
        metavar="ROUNDS",
        default=0,
        help="rounds of fine-tuning the warm start on its own solved episodes (module docstring)",
    )
    p.add_argument(
        "--si-levels", type=int, default=256, help="training levels per self-imitation round"
    )
    p.add_argument("--si-group", type=int, default=4, help="episodes per level (temperature 1)")
    p.add_argument("--si-steps", type=int, default=100, help="SFT steps per self-imitation round")
    p.add_argument(
        "--si-lr", type=float, default=1e-4, help="SFT learning rate of the self-imitation rounds"
    )
    p.add_argument(
        "--threads", type=int, default=2, help="CPU threads of the self-imitation SFT steps"
    )
    p.add_argument(
        "--random-baseline",
        action="store_true",
        help="only measure uniformly random actions' success",
    )
    a = p.parse_args(argv)

    import torch
    import yaml

    torch.set_num_threads(1)
    import envs  # noqa: F401  (registers the env ids)

    learning = _learning()
    evaluate, load_config, warm_model = learning.evaluate, learning.load_config, learning.warm_model

    from ragen_lightning.models.tiny import PRESETS, tiny_model_path
    from ragen_lightning.rollout.seeds import episode_seeds

    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    if a.throughput:
        for name, spec in PRESETS.items():
            n = sum(
                t.numel()
                for t in __import__("safetensors.torch", fromlist=["load_file"])
                .load_file(tiny_model_path(spec) / "model.safetensors")
                .values()
            )
            print(
                f"| {name} | {spec.hidden_size} x {spec.num_layers} | {n / 1e6:.2f}M | {throughput(spec):.0f} |",
                flush=True,
            )
        return
    if a.random_baseline:
        print(
            f"| {a.task} | uniform random actions | - | - | "
            f"{random_baseline(a.task, a.eval_episodes, a.seed):.3f} | - | - | - |"
        )
        return
    extra = yaml.safe_load(a.warm_start) or {}
    if a.self_imitate:
        cfg, _ = learning.with_warm_start(load_config(a.task), a.warm_start if extra else None)
        self_imitate(cfg, a, out)
        return
    if a.reading:
        cfg = load_config(a.task)
        meta_file = Path(a.reading) / "warm_start.json"
        num = (
            json.loads(meta_file.read_text())["args"]["num_episodes"]
            if meta_file.is_file()
            else 512
        )
        demo_seeds = episode_seeds(extra.get("seed", 0), num, "train")
        print(
            a.reading, teacher_forced_reading(a.reading, cfg, 200, a.seed, demo_seeds), flush=True
        )
        return
    for tokenizer in a.tokenizer:
        for preset in a.preset:
            spec = replace(PRESETS[preset], grid_cells=tokenizer == "cells")
            base = str(tiny_model_path(spec))
            for steps in a.steps:
                cfg = load_config(a.task)
                cfg = {
                    **cfg,
                    "model": {
                        **cfg["model"],
                        "model": base,
                        "warm_start": {**extra, "steps": steps},
                    },
                }
                t = time.perf_counter()
                warm, demo_seeds = warm_model(cfg)
                meta = json.loads((Path(warm) / "warm_start.json").read_text())
                res = evaluate(warm, cfg, a.eval_episodes, 1.0, a.seed, demo_seeds)
                res.update(teacher_forced_reading(warm, cfg, 200, a.seed, demo_seeds))
                row = {
                    "task": a.task,
                    "tokenizer": tokenizer,
                    "preset": preset,
                    "spec": asdict(spec),
                    "warm_start": cfg["model"]["warm_start"],
                    "train_s": meta["wall_s"],
                    "loss_last": sum(meta["losses"][-10:]) / len(meta["losses"][-10:]),
                    "eval_episodes": a.eval_episodes,
                    **res,
                    "total_s": time.perf_counter() - t,
                }
                print(
                    f"| {a.task} | {tokenizer} | {preset} | {steps} | {res['success_rate']:.3f} | "
                    f"{res['format_valid_rate']:.2f} | {row['loss_last']:.3f} | {res['reading_exact']:.2f} | "
                    f"{meta['wall_s'] / 60:.1f} |",
                    flush=True,
                )
                with open(out / "capacity.jsonl", "a") as f:
                    f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
