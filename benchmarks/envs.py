"""Reset and step throughput of every registered env id, single process on one core.

    python benchmarks/envs.py                       # all ids, 1 s per measurement
    python benchmarks/envs.py --seconds 3 --ids ragen/SimpleSokoban-v0 ragen/LargerSokoban-v0
    python benchmarks/envs.py --histogram            # Sokoban difficulty: shortest-solution histogram per generator
    python benchmarks/envs.py --expert --ids ragen/DeepCoder-v0   # steps with the expert's actions (sandbox runs)

For each id: a warm-up, then ``reset(seed=s)`` over the fixed seeds ``--seed``, ``--seed + 1``, ...
for ``--seconds`` (resets/s), then steps with actions drawn from the seeded action space (a ``Text``
action space samples strings), resetting with the next seed whenever an episode ends; steps/s counts
only the time inside ``step``. Envs are used unwrapped (no Gymnasium checker wrappers). Ids whose
module is not importable, or whose backend is not configured (``ragen/Lean-v0``: set
``$RAGEN_LEAN_SERVER_URL``), are skipped with a note. Imports only ``envs``, NumPy and Gymnasium.

``--histogram`` prints, for the SimpleSokoban (6x6, 1 box) and LargerSokoban (8x8, 2 boxes, search
depth 10) presets and each level generator (``"ragen"``, the presets' default, and
``"uniform_depth"``), the histogram of the shortest solution length (``info["optimal_steps"]``) over
seeds ``0 .. --levels - 1``. RAGEN's own generator gives mean 4.0 (1-11) and 5.8 on 300 seeds.

Reference point for Sokoban: RAGEN's generator (gym-sokoban's reverse play) does about 210 resets/s
for 6x6 rooms with one box and 84/s for 8x8 with two boxes on one core of the build machines.
"""

from __future__ import annotations

import os

# one core: keep BLAS/OpenMP pools (if any library starts one) single-threaded
for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import importlib  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import gymnasium as gym  # noqa: E402

import envs  # noqa: E402


def _make(env_id: str) -> tuple[gym.Env | None, str]:
    """The unwrapped env, or None and the reason it cannot be built yet (missing module, import
    error)."""
    module = envs.ENV_IDS[env_id][0].split(":")[0]
    try:
        importlib.import_module(module)
    except ModuleNotFoundError as e:
        return None, f"{module} not importable ({e})"
    from envs.tools.lean.backends import LeanBackendUnavailable

    try:
        return gym.make(env_id).unwrapped, ""
    # ragen/Lean-v0 without $RAGEN_LEAN_SERVER_URL / $RAGEN_LEAN_PROJECT
    except LeanBackendUnavailable as e:
        return None, str(e)


def bench_resets(env: gym.Env, seconds: float, seed: int, warmup: int) -> float:
    for i in range(warmup):
        env.reset(seed=seed + i)
    n = 0
    start = time.perf_counter()
    deadline = start + seconds
    while True:
        env.reset(seed=seed + n)
        n += 1
        if n % 8 == 0 and time.perf_counter() >= deadline:
            break
    return n / (time.perf_counter() - start)


def bench_steps(env: gym.Env, seconds: float, seed: int, warmup: int) -> float:
    env.action_space.seed(seed)
    episode = 0
    env.reset(seed=seed)
    for _ in range(warmup):
        _, _, terminated, truncated, _ = env.step(env.action_space.sample())
        if terminated or truncated:
            episode += 1
            env.reset(seed=seed + episode)
    actions = [env.action_space.sample() for _ in range(4096)]
    n = 0
    in_step = 0.0
    wall_start = time.perf_counter()
    clock = time.perf_counter
    while clock() - wall_start < seconds:
        for _ in range(64):
            t0 = clock()
            _, _, terminated, truncated, _ = env.step(actions[n % len(actions)])
            in_step += clock() - t0
            n += 1
            if terminated or truncated:
                episode += 1
                env.reset(seed=seed + episode)
    return n / in_step


def bench_expert_steps(env: gym.Env, seconds: float, seed: int, warmup: int) -> float:
    """Steps/s with the env's own expert choosing each action (``expert_turn``, computed outside the
    timed region): the path a solving agent takes, e.g. DeepCoder's sandbox runs or SearchQA's
    searches, which random text never reaches."""
    clock = time.perf_counter
    episode = 0
    env.reset(seed=seed)

    def one_step() -> float:
        nonlocal episode
        action = env.expert_turn(1)[1][0]
        t0 = clock()
        _, _, terminated, truncated, _ = env.step(action)
        elapsed = clock() - t0
        if terminated or truncated:
            episode += 1
            env.reset(seed=seed + episode)
        return elapsed

    for _ in range(warmup):
        one_step()
    n, in_step, wall_start = 0, 0.0, clock()
    while n == 0 or clock() - wall_start < seconds:
        in_step += one_step()
        n += 1
    return n / in_step


def sokoban_histograms(levels: int) -> None:
    from collections import Counter

    from envs.grid.sokoban.env import GENERATORS, SokobanEnv

    for preset in ("SimpleSokoban", "LargerSokoban"):
        for generator in GENERATORS:
            env = SokobanEnv(preset=preset, generator=generator)
            start = time.perf_counter()
            steps = [env.reset(seed=s)[1]["optimal_steps"] for s in range(levels)]
            seconds = time.perf_counter() - start
            counts = Counter(steps)
            print(
                f"{preset} generator={generator}: {levels} levels, mean {sum(steps) / levels:.2f} steps, "
                f"range {min(steps)}-{max(steps)}, {levels / seconds:,.0f} resets/s"
            )
            top = max(counts.values())
            for k in range(min(steps), max(steps) + 1):
                print(f"  {k:>3} {counts.get(k, 0):>5} {'#' * round(40 * counts.get(k, 0) / top)}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--ids", nargs="*", default=None, help="env ids (default: every id in envs.ENV_IDS)"
    )
    parser.add_argument("--seconds", type=float, default=1.0, help="duration of each measurement")
    parser.add_argument("--seed", type=int, default=0, help="first reset seed")
    parser.add_argument("--warmup", type=int, default=20, help="resets/steps before measuring")
    parser.add_argument("--cpu", type=int, default=None, help="pin the process to this CPU (Linux)")
    parser.add_argument(
        "--expert",
        action="store_true",
        help="step with each env's expert action (expert_turn) instead of sampled actions",
    )
    parser.add_argument(
        "--histogram", action="store_true", help="Sokoban shortest-solution histograms instead"
    )
    parser.add_argument("--levels", type=int, default=300, help="levels per histogram")
    args = parser.parse_args(argv)
    if args.cpu is not None:
        os.sched_setaffinity(0, {args.cpu})
    if args.histogram:
        sokoban_histograms(args.levels)
        return

    ids = args.ids or list(envs.ENV_IDS)
    unknown = [i for i in ids if i not in envs.ENV_IDS]
    if unknown:
        parser.error(f"unknown ids {unknown}; known: {list(envs.ENV_IDS)}")

    print(f"{'env id':<38} {'resets/s':>10} {'steps/s':>10}")
    for env_id in ids:
        env, why = _make(env_id)
        if env is None:
            print(f"{env_id:<38} skipped: {why}")
            continue
        resets = bench_resets(env, args.seconds, args.seed, args.warmup)
        bench = bench_expert_steps if args.expert else bench_steps
        steps = bench(env, args.seconds, args.seed, args.warmup)
        env.close()
        print(f"{env_id:<38} {resets:>10,.0f} {steps:>10,.0f}", flush=True)


if __name__ == "__main__":
    main()
