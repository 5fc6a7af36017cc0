"""How a grid policy plays and how it fails: every held-out episode's actions replayed against the env's solver.

    python benchmarks/policy_anatomy.py --model ~/.cache/ragen_lightning/warm-... --config TASK.yaml
    python benchmarks/policy_anatomy.py --model outputs/learning/sokoban-ppo/actor --config configs/sokoban.yaml \\
        --temperature 0.5 --episodes 256

The policy (a Hugging Face folder) plays ``--episodes`` held-out episodes of the config's env under its
``data.episode`` settings (HF engine, ``--temperature``), on the seeds ``benchmarks/learning.py`` evaluates
(``episode_seeds(--seed, n, "eval")`` minus the demonstration seeds of the config's warm start, its ``seed``
and ``num_episodes``). Each episode is then
replayed action by action on a fresh env with the same reset seed, and after every action the env's solver
(``env.unwrapped.solve()``: a shortest solution, None when the state cannot be solved any more) gives the distance
``d`` still to go. Printed:

* the outcome of every episode: solved, dead (a state the solver cannot solve was reached, e.g. a box pushed into a
  corner) or still solvable when the episode ended (the action budget ran out), with the distance left;
* the share of actions that were optimal (``d`` fell by exactly one);
* success by the level's shortest solution at reset.

Needs an env whose unwrapped object has ``solve()`` (Sokoban's and FrozenLake's do).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter, defaultdict
from collections.abc import Sequence
from itertools import pairwise
from pathlib import Path
from typing import Any

DEAD = "dead"
SOLVED = "solved"
UNSOLVED = "unsolved"


def classify(distances: Sequence[int | None], success: bool) -> dict[str, Any]:
    """One episode from its solver distances ``[d_0, d_1, ..., d_n]`` (``d_i`` after the i-th
    action, None when unsolvable): ``actions`` n, ``optimal`` (steps with ``d_{i+1} == d_i - 1``),
    ``dead_at`` (index of the first action after which the state was unsolvable, None if never),
    ``outcome`` and ``left`` (the last distance)."""
    if not distances or distances[0] is None:
        raise ValueError(f"the level must be solvable at reset, got distances {list(distances)!r}")
    optimal, dead_at = 0, None
    for i, (before, after) in enumerate(pairwise(distances)):
        if after is None:
            dead_at = i if dead_at is None else dead_at
        elif before is not None and after == before - 1:
            optimal += 1
    outcome = SOLVED if success else DEAD if dead_at is not None else UNSOLVED
    return {
        "start": distances[0],
        "actions": len(distances) - 1,
        "optimal": optimal,
        "dead_at": dead_at,
        "outcome": outcome,
        "left": distances[-1],
    }


def summarize(records: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Totals over :func:`classify` records: outcome counts, the optimal share of all actions,
    success by ``start``."""
    actions = sum(r["actions"] for r in records)
    by_start: dict[int, list[bool]] = defaultdict(list)
    for r in records:
        by_start[r["start"]].append(r["outcome"] == SOLVED)
    return {
        "episodes": len(records),
        "success": sum(r["outcome"] == SOLVED for r in records) / max(len(records), 1),
        "outcomes": dict(Counter(r["outcome"] for r in records)),
        "optimal_action_share": sum(r["optimal"] for r in records) / actions if actions else 0.0,
        "dead_at": dict(
            sorted(Counter(r["dead_at"] for r in records if r["dead_at"] is not None).items())
        ),
        "unsolved_left": dict(
            sorted(Counter(r["left"] for r in records if r["outcome"] == UNSOLVED).items())
        ),
        "success_by_start": {d: (len(v), sum(v) / len(v)) for d, v in sorted(by_start.items())},
    }


def replay(env: Any, seed: int, actions: Sequence[str]) -> list[int | None]:
    """The solver distance at reset and after each of ``actions`` (action words) on ``env`` reset
    with ``seed``."""
    core = env.unwrapped
    names = list(core.action_names)
    env.reset(seed=seed)

    def distance() -> int | None:
        plan = core.solve()
        return None if plan is None else len(plan)

    out = [distance()]
    for word in actions:
        if word not in names:
            raise ValueError(f"action {word!r} is not one of the env's {names}")
        *_, terminated, truncated, _ = env.step(names.index(word))
        out.append(distance())
        if terminated or truncated:
            break
    return out


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--model", required=True, help="a Hugging Face folder (a warm start, an exported actor)"
    )
    p.add_argument(
        "--config", required=True, help="the task config: env, env_kwargs, episode settings"
    )
    p.add_argument("--episodes", type=int, default=256)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0, help="seed of the held-out episodes")
    p.add_argument(
        "--demo-episodes",
        type=int,
        default=None,
        help="demonstration episodes to exclude (default: the config's warm start num_episodes, else 512)",
    )
    p.add_argument("--json", action="store_true", help="print the summary as one JSON line")
    a = p.parse_args(argv)

    import torch
    import yaml

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import envs  # noqa: F401  (registers the env ids)
    from ragen_lightning import models
    from ragen_lightning.rollout.engine import HFEngine, SamplingParams
    from ragen_lightning.rollout.runner import RolloutRunner, make_env
    from ragen_lightning.rollout.seeds import episode_seeds
    from ragen_lightning.rollout.settings import as_episode
    from ragen_lightning.rollout.tokens import ChatTokens

    torch.set_num_threads(1)
    cfg = yaml.safe_load(Path(a.config).read_text()) or {}
    data, model_cfg = cfg.get("data", {}), cfg.get("model", {})
    ws = model_cfg.get("warm_start")
    ws = ws if isinstance(ws, dict) else {}
    demo = a.demo_episodes if a.demo_episodes is not None else ws.get("num_episodes", 512)
    episode = as_episode(data.get("episode"))
    env_id, env_kwargs = data["env"]["id"], data["env"].get("kwargs")
    tokenizer, net = models.load_tokenizer(a.model), models.load_causal_lm(a.model).eval()
    engine = HFEngine(net, [tokenizer.eos_token_id], tokenizer.pad_token_id)
    runner = RolloutRunner(
        env_id,
        env_kwargs,
        ChatTokens(tokenizer, enable_think=episode.enable_think),
        engine,
        episode,
    )
    seeds = episode_seeds(
        a.seed, a.episodes, "eval", exclude=episode_seeds(ws.get("seed", 0), demo, "train")
    )
    try:
        trajectories = runner.run(
            seeds,
            1,
            SamplingParams(temperature=a.temperature, max_new_tokens=episode.max_new_tokens),
            seed=a.seed,
        )
    finally:
        runner.close()
    env = make_env(env_id, env_kwargs)
    try:
        records = [
            classify(
                replay(env, t.seed, [w for turn in t.turn_info for w in turn["actions"]]), t.success
            )
            for t in trajectories
        ]
    finally:
        env.close()
    summary = summarize(records)
    if a.json:
        print(json.dumps(summary))
        return
    print(f"{a.model} on {env_id}, {summary['episodes']} episodes, T = {a.temperature}")
    print(f"success {summary['success']:.3f}; outcomes {summary['outcomes']}")
    print(f"optimal actions {summary['optimal_action_share']:.3f} of all actions")
    print(f"first dead state after action index: {summary['dead_at']}")
    print(f"distance left when unsolved: {summary['unsolved_left']}")
    print(
        "success by shortest solution at reset: "
        + ", ".join(f"d={d}: {s:.2f} ({n})" for d, (n, s) in summary["success_by_start"].items())
    )


if __name__ == "__main__":
    main()
