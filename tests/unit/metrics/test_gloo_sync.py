"""Metric states synced across 2 real gloo ranks equal the functional on the concatenated data."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from ragen_lightning.metrics.functional import mutual_information

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[3]

# rank 0 gets row 0 / group 0 / token row 0, rank 1 the rest
ELL = [[-1.0, -2.0, -3.0], [-2.5, -1.5, -0.5], [-3.0, -2.0, -1.0]]
REWARDS = [[1.0, 0.0, 0.0, 1.0], [0.5, 0.5, 0.5, 0.5]]

WORKER = textwrap.dedent("""
    import json, os, sys
    import torch
    import torch.distributed as dist
    import torch.multiprocessing as mp

    def worker(rank, port, out):
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        dist.init_process_group("gloo", rank=rank, world_size=2)
        from ragen_lightning.metrics import MutualInformation, RewardMetrics, TokenEntropy
        ell = torch.tensor(%(ell)r)
        rewards = torch.tensor(%(rewards)r)
        mi, rw, ent = MutualInformation(), RewardMetrics(), TokenEntropy()
        rows = slice(0, 1) if rank == 0 else slice(1, None)
        mi.update(ell[rows], torch.arange(3)[rows])
        rw.update(rewards[rows], rewards[rows] == 1.0)
        ent.update(torch.tensor([[1.0, 2.0]] if rank == 0 else [[4.0, 8.0]]),
                   torch.tensor([[1, 1]] if rank == 0 else [[1, 0]]))
        result = {**{f"mi/{k}": float(v) for k, v in mi.compute().items()},  # compute() all-reduces the states
                  **{f"reward/{k}": float(v) for k, v in rw.compute().items()}, "entropy": float(ent.compute()),
                  "local_rows": float(mi.rows)}
        with open(f"{out}.{rank}", "w") as f:
            json.dump(result, f)
        dist.destroy_process_group()

    if __name__ == "__main__":
        torch.set_num_threads(1)
        mp.spawn(worker, args=(int(sys.argv[1]), sys.argv[2]), nprocs=2, join=True)
""")


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_metrics_synced_across_two_gloo_ranks(tmp_path):
    script = tmp_path / "worker.py"
    script.write_text(WORKER % {"ell": ELL, "rewards": REWARDS})
    out = tmp_path / "result"
    proc = subprocess.run([sys.executable, str(script), str(_free_port()), str(out)], check=False, cwd=ROOT,
                          env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"},
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    r0, r1 = (json.loads(Path(f"{out}.{r}").read_text()) for r in (0, 1))
    # each rank holds only its own rows (1 and 2), yet both compute the same synced values
    assert (r0.pop("local_rows"), r1.pop("local_rows")) == (1.0, 2.0)
    assert r0 == r1
    expected = mutual_information(torch.tensor(ELL), torch.arange(3))
    for key in ("mi", "conditional_entropy", "marginal_entropy", "retrieval_accuracy", "retrieval_accuracy@2",
                "mi_upper_bound"):
        assert r0[f"mi/{key}"] == pytest.approx(float(expected[key]), abs=1e-6), key
    # rewards by hand: mean = (1+0+0+1+4*0.5)/8 = 0.5; in-group std = (sqrt(1/3) + 0)/2; success 2/8
    assert r0["reward/reward_mean"] == pytest.approx(0.5)
    assert r0["reward/in_group_reward_std"] == pytest.approx(math.sqrt(1 / 3) / 2)
    assert r0["reward/success_rate"] == pytest.approx(0.25)
    assert r0["entropy"] == pytest.approx(7 / 3)  # (1 + 2 + 4) / 3 trained tokens
