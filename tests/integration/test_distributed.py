"""Two CPU processes (gloo) under torchrun: DDP and FSDP2 equal the single-process run; sharded checkpoints reshard.

Each run is ``tests/integration/dist_worker.py`` in a subprocess (bounded by a timeout, so a collective that hangs
fails the test instead of blocking CI); every rank writes its full parameters and logged metrics, compared here.
The filter keeps fewer groups than there are ranks (``top_k_abs``), so the kept set is uneven across the ranks that
rolled the groups out, and a mini-batch can leave a rank with only padding.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
WORKER = ROOT / "tests" / "integration" / "dist_worker.py"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(tmp_path: Path, name: str, procs: int, **cfg) -> list[tuple[dict, dict]]:
    """Run the worker on ``procs`` processes; returns ``(json, params)`` per rank."""
    out = tmp_path / name
    cfg = {"out": str(out), **cfg}
    launcher = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(procs),
                "--master_port", str(free_port())] if procs > 1 else [sys.executable]
    env = dict(os.environ, PYTHONPATH=str(ROOT), HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1")
    proc = subprocess.run([*launcher, str(WORKER), json.dumps(cfg)], env=env, cwd=ROOT, capture_output=True,
                          text=True, timeout=240, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return [(json.loads((out / f"rank{r}.json").read_text()), torch.load(out / f"rank{r}.pt"))
            for r in range(procs)]


def assert_same(a: dict, b: dict, atol: float) -> None:
    assert a.keys() == b.keys()
    for k, v in a.items():
        torch.testing.assert_close(v, b[k], atol=atol, rtol=0, msg=k)


@pytest.mark.parametrize("estimator", ["gae", "grpo"])
def test_ddp_two_ranks_equal_single_process_with_uneven_filter(tmp_path, tiny_path, estimator):
    # 4 groups x 3; the filter keeps 1 group, which one rank rolled out (uneven kept set). Mini-batches of 2 over
    # the 3 kept samples: [0, 1] -> one row per rank; [2] -> rank 1 gets only the pad row.
    cfg = {"model": str(tiny_path), "iterations": 2, "top_k_abs": 1, "estimator": estimator, "mini": 2}
    [(single, p1)] = run(tmp_path, "single", 1, strategy="single", **cfg)
    ranks = run(tmp_path, "ddp", 2, strategy="ddp", **cfg)
    (j0, p0), (j1, p1r) = ranks
    assert_same(p0, p1r, atol=0)  # DDP replicas stay identical
    assert_same(p0, p1, atol=1e-6)  # and equal the one-process update on the same global batch
    assert j0["kept"] == single["kept"] and all(len(k) == 1 for k in single["kept"])  # the same global selection
    # 2 iterations x 2 mini-batches x (critic + actor | actor)
    assert j0["global_step"] == single["global_step"] == (8 if estimator == "gae" else 4)
    keys = ["actor/pg_loss", "actor/entropy", "actor/grad_norm", "train/score", "rollout/filter_kept_count",
            "train/batch_size", "train/advantage_mean"] + (["critic/vf_loss"] if estimator == "gae" else [])
    for key in keys:
        assert j0["metrics"][-1][key] == pytest.approx(single["metrics"][-1][key], abs=1e-5), key
        assert j1["metrics"][-1][key] == j0["metrics"][-1][key], key  # every rank logs the global value
    assert any(not torch.equal(p0[k], v) for k, v in _initial(tiny_path).items())  # the update did something


def _initial(tiny_path) -> dict:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_path)
    return {f"actor.{k}": v for k, v in model.state_dict().items()}


def test_fsdp2_sharded_checkpoint_resumes_on_other_world_sizes(tmp_path, tiny_path):
    """4 iterations with real sampling (the engine's full copy synced from the shards), GAE + KL (sharded actor,
    critic and reference), saved and resumed across world sizes: 2 processes (iterations 1-2) -> 1 (iteration 3) ->
    2 (iteration 4). The result equals one uninterrupted single-process run: same seed stream, same weights."""
    cfg = {"model": str(tiny_path), "iterations": 4, "top_k_abs": 2, "estimator": "gae", "kl": True, "mini": 6,
           "micro": 3, "engine": "hf"}
    [(single, p_single)] = run(tmp_path, "single", 1, strategy="single", **cfg)
    # 2 kept groups x 3 samples = one mini-batch of 6 -> 2 optimizer steps (critic, actor) per iteration
    (a0, pa0), (a1, pa1) = run(tmp_path, "a", 2, strategy="fsdp", max_steps=4, ckpt_dir=str(tmp_path / "ck_a"), **cfg)
    assert a0["state"]["iteration"] == 2 and a1["kept"] == a0["kept"] == single["kept"][:2]
    assert_same(pa0, pa1, atol=0)  # FSDP2 fit 2 iterations: the gathered parameters agree on both ranks
    shards = sorted(p.name for p in (tmp_path / "ck_a" / "step=4.ckpt").iterdir())
    assert shards == [".metadata", "__0_0.distcp", "__1_0.distcp", "meta.pt"]  # a sharded (distributed) checkpoint
    [(b, _)] = run(tmp_path, "b", 1, strategy="fsdp", max_steps=6, ckpt_dir=str(tmp_path / "ck_b"),
                   ckpt_in=str(tmp_path / "ck_a" / "step=4.ckpt"), **cfg)
    assert b["state"]["iteration"] == 3 and len(b["metrics"]) == 1  # only iteration 3 ran
    (c0, p0), (c1, p1) = run(tmp_path, "c", 2, strategy="fsdp", ckpt_in=str(tmp_path / "ck_b" / "step=6.ckpt"), **cfg)
    assert c0["state"]["iteration"] == 4 and len(c0["metrics"]) == 1 and c0["global_step"] == 8
    assert c1["kept"] == c0["kept"]
    assert_same(p0, p1, atol=0)
    assert_same(p0, p_single, atol=1e-5)
    assert a0["kept"] + b["kept"] + c0["kept"] == single["kept"]  # the same seed stream and global selection
    for key in ("train/score", "actor/pg_loss", "actor/kl_loss", "critic/vf_loss", "actor/grad_norm"):
        assert c0["metrics"][-1][key] == pytest.approx(single["metrics"][-1][key], abs=1e-5), key
