"""How well does the Sokoban heuristic shaping (``heuristic_reward``, read from the grid) agree with
the solver?

    python benchmarks/sokoban_heuristic.py                  # 200 SimpleSokoban levels, 6 visited states each
    python benchmarks/sokoban_heuristic.py --levels 1000 --preset LargerSokoban

For each visited state of a level (the walk follows a shortest solution, with a random action 30 %
of the time so that it also visits states off the solution), every one of the four actions is tried
on a copy of the env. An action is *good* when it shortens the solver's shortest solution
(:meth:`SokobanEnv.solve`) and *paid* when the heuristic shaping's term ``h_before - h_after`` is
positive. Printed: the share of actions where good and paid agree, the share of good actions that
are paid (recall) and of paid actions that are good (precision). The training signal uses only the
heuristic; the solver here only measures it.
"""

from __future__ import annotations

import argparse
import copy
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def agreement(levels: int, states: int, preset: str, seed: int) -> dict[str, float]:
    import numpy as np

    from envs.grid.sokoban.env import SokobanEnv

    rng = np.random.default_rng(seed)
    env = SokobanEnv(preset=preset, heuristic_reward=1.0)
    counts = {"actions": 0, "agree": 0, "good": 0, "paid": 0, "good_and_paid": 0}
    for level in range(levels):
        env.reset(seed=seed + level)
        for _ in range(states):
            plan = env.solve()
            if not plan:  # solved, or unsolvable: no action shortens anything
                break
            h = env.heuristic_distance()
            for action in range(4):
                trial = copy.deepcopy(env)
                trial.step(action)
                after = trial.solve()
                good = after is not None and len(after) < len(plan)
                paid = h - trial.heuristic_distance() > 0
                counts["actions"] += 1
                counts["agree"] += good == paid
                counts["good"] += good
                counts["paid"] += paid
                counts["good_and_paid"] += good and paid
            env.step(plan[0] if rng.random() < 0.7 else int(rng.integers(4)))
    n = counts["actions"]
    return {
        "actions": n,
        "agree": counts["agree"] / n,
        "recall": counts["good_and_paid"] / max(counts["good"], 1),
        "precision": counts["good_and_paid"] / max(counts["paid"], 1),
    }


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--levels", type=int, default=200)
    p.add_argument("--states", type=int, default=6, help="visited states per level")
    p.add_argument("--preset", default="SimpleSokoban")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    r = agreement(a.levels, a.states, a.preset, a.seed)
    print(
        f"{a.preset}: {r['actions']} actions from {a.levels} levels; heuristic shaping vs solver: agree "
        f"{r['agree']:.3f}, good actions paid {r['recall']:.3f}, paid actions good {r['precision']:.3f}"
    )


if __name__ == "__main__":
    main()
