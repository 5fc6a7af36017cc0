"""Env time of a rollout with the env steps of a turn run one after another or on the runner's
worker pool.

    python benchmarks/env_pool.py                        # every case
    python benchmarks/env_pool.py --cases sleepy         # the 200 ms env only

Cases (the engine is scripted, fixed answers and no model, so the figures are the runner's env time,
``runner.timing["env"]``: resets plus the step rounds of every turn):

* ``sleepy``: a test env whose step sleeps ``--step-ms`` (200) ms; ``--episodes`` (32) episodes of
  ``--turns`` (5) turns with one action per turn. Sequential (``max_workers 1``) vs a pool of
  ``--workers`` (32) threads, in step-times (env seconds / step time): ~160 vs ~5.
* ``cheap``: the in-process envs (FrozenLake, SimpleSokoban): 128 episodes x 5 turns x 2 actions,
  inline vs a pool of 8, to price the thread hand-off (this chose the default ``max_workers 1``).
* ``remote``: FrozenLake served by ``python -m envs.serving.serve`` (a subprocess, loopback) through
  ``ragen/Remote-v0``, inline vs a pool of 8.

Every figure is the median of ``--repeats`` rollouts. Needs the tiny model's tokenizer (built and
cached on first use).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import gymnasium as gym
from gymnasium import spaces

import envs
from envs.base import PromptSpec


class SleepyEnv(gym.Env):
    """A test env (registered as ``bench/Sleepy-v0`` by this script only): every step sleeps
    ``step_s`` and moves a counter; the episode never ends by itself (the turn limit ends it)."""

    action_names = ("Left", "Right")

    def __init__(self, step_s: float = 0.2):
        self.observation_space = spaces.Text(64, charset="0123456789 step:")
        self.action_space = spaces.Discrete(2)
        self.step_s, self.n = step_s, 0

    def prompt_spec(self) -> PromptSpec:
        return PromptSpec("Move.", self.action_names)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.n = 0
        return "step: 0", {}

    def step(self, action):
        time.sleep(self.step_s)
        self.n += 1
        return f"step: {self.n}", 0.0, False, False, {"success": False}


class Scripted:
    """Answers every prompt with the same text (plus the end-of-turn token)."""

    def __init__(self, tokenizer, text: str):
        self.ids = tokenizer.encode(text, add_special_tokens=False) + [tokenizer.eos_token_id]

    def generate(self, prompts, params, seeds=None):
        from ragen_lightning.rollout.engine import Generation

        return [Generation(list(self.ids), [0.0] * len(self.ids), "stop") for _ in prompts]

    def sync_weights(self):
        return None


def env_seconds(
    tokenizer,
    env_id: str,
    env_kwargs: dict | None,
    text: str,
    *,
    groups: int,
    group_size: int,
    turns: int,
    actions: int,
    workers: int,
    repeats: int,
) -> tuple[float, float]:
    """Median env seconds and median whole-rollout seconds of ``repeats`` rollouts."""
    from ragen_lightning.rollout.engine import SamplingParams
    from ragen_lightning.rollout.runner import RolloutRunner
    from ragen_lightning.rollout.settings import EpisodeSettings
    from ragen_lightning.rollout.tokens import ChatTokens

    episode = EpisodeSettings(
        max_turns=turns,
        max_actions_per_turn=actions,
        max_actions_per_episode=turns * actions,
        max_workers=workers,
    )
    runner = RolloutRunner(
        env_id, env_kwargs, ChatTokens(tokenizer), Scripted(tokenizer, text), episode
    )
    env_s, total_s = [], []
    try:
        for r in range(repeats):
            t0 = time.perf_counter()
            trajs = runner.run(
                list(range(100 * r, 100 * r + groups)),
                group_size,
                SamplingParams(max_new_tokens=40),
            )
            total_s.append(time.perf_counter() - t0)
            env_s.append(runner.timing["env"])
            errors = [t.env_error for t in trajs if t.env_error]
            if errors:
                raise RuntimeError(f"{env_id}: env errors in the benchmark: {errors[:3]}")
    finally:
        runner.close()
    return statistics.median(env_s), statistics.median(total_s)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--cases",
        nargs="+",
        default=["sleepy", "cheap", "remote"],
        choices=["sleepy", "cheap", "remote"],
    )
    parser.add_argument("--step-ms", type=float, default=200.0)
    parser.add_argument("--episodes", type=int, default=32)
    parser.add_argument("--turns", type=int, default=5)
    parser.add_argument("--workers", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    from transformers import AutoTokenizer

    from ragen_lightning.models.tiny import tiny_model_path

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_path())
    if "bench/Sleepy-v0" not in gym.registry:
        gym.register("bench/Sleepy-v0", entry_point=SleepyEnv)

    if "sleepy" in args.cases:
        step_s = args.step_ms / 1000
        print(
            f"sleepy: {args.episodes} episodes x {args.turns} turns x 1 action, step {args.step_ms:g} ms "
            f"({args.episodes * args.turns} steps)"
        )
        for workers, repeats in ((1, 1), (args.workers, args.repeats)):
            env_s, total_s = env_seconds(
                tokenizer,
                "bench/Sleepy-v0",
                {"step_s": step_s},
                "x</think><answer>Right</answer>",
                groups=args.episodes,
                group_size=1,
                turns=args.turns,
                actions=1,
                workers=workers,
                repeats=repeats,
            )
            print(
                f"  max_workers {workers:3d}: env {env_s:7.2f} s per rollout = {env_s / step_s:6.1f} step-times "
                f"(rollout {total_s:.2f} s)"
            )

    text = "x</think><answer>Right || Down</answer>"
    if "cheap" in args.cases:
        print("cheap: 128 episodes (32 groups x 4) x 5 turns x 2 actions, env seconds per rollout")
        for env_id in ("ragen/FrozenLake-v0", "ragen/SimpleSokoban-v0"):
            for workers in (1, 8):
                env_s, total_s = env_seconds(
                    tokenizer,
                    env_id,
                    None,
                    text,
                    groups=32,
                    group_size=4,
                    turns=5,
                    actions=2,
                    workers=workers,
                    repeats=args.repeats,
                )
                print(
                    f"  {env_id:24s} max_workers {workers}: env {env_s * 1000:8.1f} ms (rollout {total_s:.2f} s)"
                )

    if "remote" in args.cases:
        import subprocess

        command = [sys.executable, "-m", "envs.serving.serve", "ragen/FrozenLake-v0", "--port", "0"]
        server = subprocess.Popen(
            command, cwd=Path(__file__).resolve().parents[1], stdout=subprocess.PIPE, text=True
        )
        try:
            url = server.stdout.readline().split(" on ")[-1].strip()
            print(
                f"remote: ragen/FrozenLake-v0 served by python -m envs.serving.serve (another process) "
                f"at {url}, 128 episodes x 5 turns x 2 actions"
            )
            for workers in (1, 8):
                env_s, total_s = env_seconds(
                    tokenizer,
                    envs.REMOTE_ID,
                    {"url": url, "env_id": "ragen/FrozenLake-v0"},
                    text,
                    groups=32,
                    group_size=4,
                    turns=5,
                    actions=2,
                    workers=workers,
                    repeats=args.repeats,
                )
                print(
                    f"  max_workers {workers}: env {env_s * 1000:8.1f} ms (rollout {total_s:.2f} s)"
                )
        finally:
            server.terminate()
            server.wait(timeout=30)


if __name__ == "__main__":
    main()
