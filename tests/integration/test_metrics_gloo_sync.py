"""Metric states synced across 2 real gloo ranks equal the values computed by hand on the
concatenated data (two processes: lives in the integration tier)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
# the hermetic caches of tests/conftest.py
CACHE_PREFIXES = ("RAGEN_LIGHTNING_", "HF_", "WANDB_", "MPLCONFIGDIR")

# rank 0 gets group 0 / 2 turns / 1 trajectory, rank 1 the rest
REWARDS = [[1.0, 0.0, 0.0, 1.0], [0.5, 0.5, 0.5, 0.5]]

# The ranks are forked from a parent that imported torch and the metrics once (spawned ranks would
# import them again, ~5 s of CPU each); the parent runs no torch op, so there is no thread pool to
# inherit.
WORKER = textwrap.dedent("""
    import json, os, sys
    import torch
    import torch.distributed as dist
    import torch.multiprocessing as mp
    from ragen_lightning.metrics import LengthMetrics, RewardMetrics, ValidThinkingRate

    def worker(rank, port, out):
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        dist.init_process_group("gloo", rank=rank, world_size=2)
        rewards = torch.tensor(%(rewards)r)
        rw, lens, valid = RewardMetrics(), LengthMetrics(), ValidThinkingRate()
        rows = slice(0, 1) if rank == 0 else slice(1, None)
        rw.update(rewards[rows], rewards[rows] == 1.0)
        lens.update(think_tokens=torch.tensor([4.0] if rank == 0 else [0.0, 8.0]))
        valid.update(torch.tensor([True, False] if rank == 0 else [True, True, True]))
        result = {**{f"reward/{k}": float(v) for k, v in rw.compute().items()},  # compute() all-reduces the states
                  "think": float(lens.compute()["think_tokens_mean"]), "valid": float(valid.compute()),
                  "local_turns": float(valid.denominator)}
        with open(f"{out}.{rank}", "w") as f:
            json.dump(result, f)
        dist.barrier()  # both ranks are done with gloo
        dist.destroy_process_group()
        # skip interpreter teardown: gloo's threads sometimes abort it ("terminate called without an active
        # exception", a torch exit race seen in about 1 run in 4 on 2 cores), after the results are written
        os._exit(0)

    if __name__ == "__main__":
        torch.set_num_threads(1)
        mp.start_processes(
            worker, args=(int(sys.argv[1]), sys.argv[2]), nprocs=2, join=True, start_method="fork"
        )
""")


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_metrics_synced_across_two_gloo_ranks(tmp_path):
    script = tmp_path / "worker.py"
    script.write_text(WORKER % {"rewards": REWARDS})
    out = tmp_path / "result"
    proc = subprocess.run(
        [sys.executable, str(script), str(_free_port()), str(out)],
        check=False,
        cwd=ROOT,
        env={
            "PYTHONPATH": str(ROOT),
            "PATH": "/usr/bin:/bin",
            "OMP_NUM_THREADS": "1",
            **{k: v for k, v in os.environ.items() if k.startswith(CACHE_PREFIXES)},
        },
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    r0, r1 = (json.loads(Path(f"{out}.{r}").read_text()) for r in (0, 1))
    # each rank holds only its own turns (2 and 3), yet both compute the same synced values
    assert (r0.pop("local_turns"), r1.pop("local_turns")) == (2.0, 3.0)
    assert r0 == r1
    # rewards by hand: mean = (1+0+0+1+4*0.5)/8 = 0.5; in-group std = (sqrt(1/3) + 0)/2; success 2/8
    assert r0["reward/reward_mean"] == pytest.approx(0.5)
    assert r0["reward/in_group_reward_std"] == pytest.approx(math.sqrt(1 / 3) / 2)
    assert r0["reward/success_rate"] == pytest.approx(0.25)
    # pass@1 per group: group 0 has c = 2 of n = 4 -> 1/2, group 1 none -> 0; mean 1/4
    assert r0["reward/pass@1"] == pytest.approx(0.25)
    assert r0["think"] == pytest.approx(4.0)  # (4 + 0 + 8) / 3 trajectories
    assert r0["valid"] == pytest.approx(0.8)  # (1 + 3) / 5 turns
