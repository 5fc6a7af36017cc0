"""Two CPU processes (gloo) under torchrun: DDP and FSDP2 equal the single-process run; sharded
checkpoints reshard; FSDP2 with a colocated vLLM engine per rank (weights gathered from the shards
and streamed in) passes the sync probe; one tensor-parallel vLLM engine over both ranks (DDP and
FSDP2) does too.

Each run is ``tests/integration/dist_worker.py`` in a subprocess (bounded by a timeout, so a
collective that hangs fails the test instead of blocking CI); every rank writes its full parameters
and logged metrics, compared here. The filter keeps fewer groups than there are ranks
(``top_k_abs``), so the kept set is uneven across the ranks that rolled the groups out, and a
mini-batch can leave a rank with only padding.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ragen_lightning.rollout.vllm_engine import vllm_installed

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
WORKER = ROOT / "tests" / "integration" / "dist_worker.py"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(tmp_path: Path, name: str, procs: int, **cfg) -> tuple[subprocess.Popen, Path, int]:
    """Start the worker on ``procs`` processes (output in ``<tmp_path>/<name>/log.txt``)."""
    out = tmp_path / name
    out.mkdir(parents=True)
    cfg = {"out": str(out), **cfg}
    launcher = (
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc_per_node",
            str(procs),
            "--master_port",
            str(free_port()),
        ]
        if procs > 1
        else [sys.executable]
    )
    env = dict(os.environ, PYTHONPATH=str(ROOT), HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1")
    with open(out / "log.txt", "w") as log:
        proc = subprocess.Popen(
            [*launcher, str(WORKER), json.dumps(cfg)],
            env=env,
            cwd=ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
            text=True,
        )
    return proc, out, procs


def collect(
    job: tuple[subprocess.Popen, Path, int], timeout: float = 240
) -> list[tuple[dict, dict]]:
    """Wait for a :func:`launch`ed worker; returns ``(json, params)`` per rank."""
    proc, out, procs = job
    try:
        proc.wait(timeout=timeout)
    finally:
        if proc.poll() is None:  # a hung collective: fail instead of blocking
            proc.kill()
    assert proc.returncode == 0, (out / "log.txt").read_text()[-3000:]
    return [
        (json.loads((out / f"rank{r}.json").read_text()), torch.load(out / f"rank{r}.pt"))
        for r in range(procs)
    ]


def launch_nodes(
    tmp_path: Path, name: str, nodes: int, **cfg
) -> list[tuple[subprocess.Popen, Path, int]]:
    """Start the worker as ``nodes`` node ranks of one process each, as on ``nodes`` machines (one
    torchrun per node, static rendezvous on 127.0.0.1); every rank writes into
    ``<tmp_path>/<name>``."""
    out = tmp_path / name
    out.mkdir(parents=True)
    port, jobs = free_port(), []
    env = dict(os.environ, PYTHONPATH=str(ROOT), HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1")
    for node in range(nodes):
        with open(out / f"log{node}.txt", "w") as log:
            cmd = [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--nnodes",
                str(nodes),
                "--nproc_per_node",
                "1",
                "--node_rank",
                str(node),
                "--master_addr",
                "127.0.0.1",
                "--master_port",
                str(port),
                str(WORKER),
                json.dumps({"out": str(out), **cfg}),
            ]
            jobs.append(
                (
                    subprocess.Popen(
                        cmd, env=env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, text=True
                    ),
                    out,
                    node,
                )
            )
    return jobs


def collect_nodes(jobs, timeout: float = 500) -> list[tuple[dict, dict]]:
    """Wait for every node of :func:`launch_nodes`; ``(json, params)`` per global rank."""
    for proc, out, node in jobs:
        try:
            proc.wait(timeout=timeout)
        finally:
            if proc.poll() is None:
                proc.kill()
        assert proc.returncode == 0, (out / f"log{node}.txt").read_text()[-3000:]
    out = jobs[0][1]
    return [
        (json.loads((out / f"rank{r}.json").read_text()), torch.load(out / f"rank{r}.pt"))
        for r in range(len(jobs))
    ]


def run(tmp_path: Path, name: str, procs: int, **cfg) -> list[tuple[dict, dict]]:
    """Run the worker on ``procs`` processes; returns ``(json, params)`` per rank."""
    return collect(launch(tmp_path, name, procs, **cfg))


def assert_same(a: dict, b: dict, atol: float) -> None:
    assert a.keys() == b.keys()
    for k, v in a.items():
        torch.testing.assert_close(v, b[k], atol=atol, rtol=0, msg=k)


@pytest.mark.parametrize("estimator", ["gae", "grpo"])
def test_ddp_two_ranks_equal_single_process_with_uneven_filter(tmp_path, tiny_path, estimator):
    # 4 groups x 3; the filter keeps 1 group, which one rank rolled out (uneven kept set).
    # Mini-batches of 2 over the 3 kept samples: [0, 1] -> one row per rank; [2] -> rank 1 gets only
    # the pad row.
    cfg = {
        "model": str(tiny_path),
        "iterations": 2,
        "top_k_abs": 1,
        "estimator": estimator,
        "mini": 2,
    }
    [(single, p1)] = run(tmp_path, "single", 1, strategy="single", **cfg)
    ranks = run(tmp_path, "ddp", 2, strategy="ddp", **cfg)
    (j0, p0), (j1, p1r) = ranks
    assert_same(p0, p1r, atol=0)  # DDP replicas stay identical
    assert_same(p0, p1, atol=1e-6)  # and equal the one-process update on the same global batch
    # the same global selection
    assert j0["kept"] == single["kept"] and all(len(k) == 1 for k in single["kept"])
    # 2 iterations x 2 mini-batches x (critic + actor | actor)
    assert j0["global_step"] == single["global_step"] == (8 if estimator == "gae" else 4)
    keys = [
        "actor/pg_loss",
        "actor/entropy",
        "actor/grad_norm",
        "train/score",
        "rollout/filter_kept_count",
        "train/batch_size",
        "train/advantage_mean",
    ] + (["critic/vf_loss"] if estimator == "gae" else [])
    for key in keys:
        assert j0["metrics"][-1][key] == pytest.approx(single["metrics"][-1][key], abs=1e-5), key
        # every rank logs the global value
        assert j1["metrics"][-1][key] == j0["metrics"][-1][key], key
    # the update did something
    assert any(not torch.equal(p0[k], v) for k, v in _initial(tiny_path).items())


def _initial(tiny_path) -> dict:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_path)
    return {f"actor.{k}": v for k, v in model.state_dict().items()}


def test_fsdp2_sharded_checkpoint_resumes_on_other_world_sizes(tmp_path, tiny_path):
    """4 iterations with real sampling (the engine's full copy synced from the shards), GAE + KL
    (sharded actor, critic and reference), saved and resumed across world sizes: 2 processes
    (iterations 1-2) -> 1 (iteration 3) -> 2 (iteration 4). The result equals one uninterrupted
    single-process run: same seed stream, same weights."""
    cfg = {
        "model": str(tiny_path),
        "iterations": 4,
        "top_k_abs": 2,
        "estimator": "gae",
        "kl": True,
        "mini": 6,
        "micro": 3,
        "engine": "hf",
    }
    [(single, p_single)] = run(tmp_path, "single", 1, strategy="single", **cfg)
    # 2 kept groups x 3 samples = one mini-batch of 6 -> 2 optimizer steps (critic, actor) per
    # iteration
    (a0, pa0), (a1, pa1) = run(
        tmp_path, "a", 2, strategy="fsdp", max_steps=4, ckpt_dir=str(tmp_path / "ck_a"), **cfg
    )
    assert a0["state"]["iteration"] == 2 and a1["kept"] == a0["kept"] == single["kept"][:2]
    # the HF engine samples from an unsharded copy synced from the shards
    assert a0["rollout_copy"] == 1
    # FSDP2 fit 2 iterations: the gathered parameters agree on both ranks
    assert_same(pa0, pa1, atol=0)
    shards = sorted(p.name for p in (tmp_path / "ck_a" / "step=4.ckpt").iterdir())
    # a sharded (distributed) checkpoint, with the digest of every file; saved atomically (no
    # temporary left)
    assert shards == [".metadata", "__0_0.distcp", "__1_0.distcp", "meta.pt", "ragen-sha256.json"]
    assert sorted(p.name for p in (tmp_path / "ck_a").iterdir()) == ["step=2.ckpt", "step=4.ckpt"]
    # every rank refuses a damaged copy with the same line naming the file
    for damage in ("flip", "truncate"):
        bad = tmp_path / f"{damage}.ckpt"
        shutil.copytree(tmp_path / "ck_a" / "step=4.ckpt", bad)
        shard = bad / "__1_0.distcp"
        data = bytearray(shard.read_bytes())
        data[len(data) // 2] ^= 0x01
        shard.write_bytes(bytes(data) if damage == "flip" else bytes(data[: len(data) // 2]))
        proc, out, _ = launch(
            tmp_path, f"bad_{damage}", 2, strategy="fsdp", ckpt_in=str(bad), **cfg
        )
        proc.wait(timeout=240)
        log = (out / "log.txt").read_text()
        assert proc.returncode != 0, log[-3000:]
        line = f"CheckpointError: --ckpt_path {bad}: corrupted checkpoint (__1_0.distcp" + (
            "'s SHA-256 differs"
            if damage == "flip"
            else f" has {len(data) // 2} bytes, {len(data)} were saved"
        )
        assert log.count(line) >= 2, log[-3000:]  # raised on both ranks
    [(b, _)] = run(
        tmp_path,
        "b",
        1,
        strategy="fsdp",
        max_steps=6,
        ckpt_dir=str(tmp_path / "ck_b"),
        ckpt_in=str(tmp_path / "ck_a" / "step=4.ckpt"),
        **cfg,
    )
    assert b["state"]["iteration"] == 3 and len(b["metrics"]) == 1  # only iteration 3 ran
    (c0, p0), (c1, p1) = run(
        tmp_path, "c", 2, strategy="fsdp", ckpt_in=str(tmp_path / "ck_b" / "step=6.ckpt"), **cfg
    )
    assert c0["state"]["iteration"] == 4 and len(c0["metrics"]) == 1 and c0["global_step"] == 8
    assert c1["kept"] == c0["kept"]
    assert_same(p0, p1, atol=0)
    assert_same(p0, p_single, atol=1e-5)
    # the same seed stream and global selection
    assert a0["kept"] + b["kept"] + c0["kept"] == single["kept"]
    for key in (
        "train/score",
        "actor/pg_loss",
        "actor/kl_loss",
        "critic/vf_loss",
        "actor/grad_norm",
    ):
        assert c0["metrics"][-1][key] == pytest.approx(single["metrics"][-1][key], abs=1e-5), key


def test_async_rollouts_under_fsdp2_equal_one_async_process(tmp_path, tiny_path):
    """``--data.training.async_level 1`` on 2 FSDP2 ranks: each rank generates its share of the next
    rollout on its worker (from the unsharded copy, synced from the shards on the training thread),
    the trajectories are gathered on the training thread; the kept groups and the weights equal one
    async process (both runs at once)."""
    cfg = {
        "model": str(tiny_path),
        "iterations": 3,
        "top_k_abs": 2,
        "estimator": "grpo",
        "mini": 6,
        "micro": 3,
        "engine": "hf",
        "async": True,
    }
    jobs = (
        launch(tmp_path, "single", 1, strategy="single", **cfg),
        launch(tmp_path, "fsdp", 2, strategy="fsdp", **cfg),
    )
    [(single, p_single)], [(j0, p0), (j1, p1)] = (collect(job, timeout=400) for job in jobs)
    for run_ in (single, j0, j1):  # batches 2 and 3: one update old
        assert [m["rollout/staleness"] for m in run_["metrics"]] == [0.0, 1.0, 1.0]
    assert j0["kept"] == j1["kept"] == single["kept"] and len(single["kept"]) == 3
    assert_same(p0, p1, atol=0)
    assert_same(p0, p_single, atol=1e-5)
    for key in ("train/score", "actor/pg_loss", "rollout/engine_logprob_abs_diff"):
        assert j0["metrics"][-1][key] == pytest.approx(single["metrics"][-1][key], abs=1e-5), key


@pytest.fixture(scope="module")
def vllm_tiny_path():
    from ragen_lightning.models.tiny import TinySpec, cache_root, tiny_model_path
    from tests.conftest import SMALL_CORPUS

    # head_dim 32: vLLM's CPU attention has no kernel for the session tiny model's head_dim 16
    spec = TinySpec(
        hidden_size=64,
        num_layers=2,
        num_heads=2,
        num_kv_heads=1,
        intermediate_size=128,
        vocab_size=400,
    )
    return tiny_model_path(spec, cache_dir=cache_root(), corpus=SMALL_CORPUS)


@pytest.mark.skipif(not vllm_installed(), reason="needs vLLM (README install)")
def test_fsdp2_with_vllm_engines_passes_the_probe_on_every_rank_and_equals_one_process(
    tmp_path, vllm_tiny_path
):
    """FSDP2 on 2 ranks, each with its own in-process vLLM engine fed by the gathered shards,
    against one process with one engine (both runs at once to save wall time). 2 iterations: the
    second sync follows a real optimizer step. Per-request seeds make each rank sample what one
    process samples for the same groups, so the filter keeps the same groups and the update reaches
    the same weights."""
    cfg = {
        "model": str(vllm_tiny_path),
        "iterations": 2,
        "top_k_abs": 2,
        "estimator": "grpo",
        "mini": 6,
        "micro": 3,
        "engine": "vllm",
        "export": True,
    }
    jobs = (
        launch(tmp_path, "single", 1, strategy="single", **cfg),
        launch(tmp_path, "fsdp", 2, strategy="fsdp", **cfg),
    )
    [(single, p_single)], [(j0, p0), (j1, p1)] = (collect(job, timeout=500) for job in jobs)
    for rank in (j0, j1):
        probes = rank["probes"]
        # a sync before each iteration; the 2nd after the first update (2 kept groups x 3 = one
        # mini-batch: 1 step)
        assert [p["step"] for p in probes] == [0, 1] and all(p["sharded"] for p in probes)
        # this rank's own engine
        assert all(p["max"] < 1e-3 and 0 <= p["mean"] <= p["max"] for p in probes)
        assert probes[-1]["sequences"] >= 2  # the synthetic probe and the run's sampled sequences
        metrics = rank["metrics"][-1]
        assert metrics["rollout/probe_max_abs_logprob_diff"] < 1e-3  # the max over ranks, logged
        # 2 layers x 12 + embed, final norm, tied lm_head
        assert metrics["rollout/sync_tensors"] == 27.0
    assert not any(p["sharded"] for p in single["probes"])
    # vLLM holds the only full copy: no HF copy is kept
    assert j0["rollout_copy"] == j1["rollout_copy"] == 0
    assert j0["kept"] == j1["kept"] == single["kept"] and all(len(k) == 2 for k in single["kept"])
    assert_same(p0, p1, atol=0)
    assert_same(p0, p_single, atol=1e-5)  # the same trajectories and update as one process
    # the update did something
    assert any(not torch.equal(p0[k], v) for k, v in _initial(vllm_tiny_path).items())
    # the export gathers the shards without an HF copy kept through the run: rank 0 writes the
    # trained actor
    assert_same(
        _initial(tmp_path / "fsdp" / "export"),
        {k: v for k, v in p0.items() if k.startswith("actor.")},
        atol=0,
    )


@pytest.mark.skipif(not vllm_installed(), reason="needs vLLM (README install)")
@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_tensor_parallel_vllm_engine_over_both_ranks(tmp_path, vllm_tiny_path, strategy):
    """DDP and FSDP2 on 2 ranks with ``--data.engine.vllm.tensor_parallel_size 2``: one vLLM engine
    (external_launcher) whose two workers are the two training ranks. Both ranks roll out all 4
    groups with the same seeds and get the same generations; every push (the second after a real
    optimizer step) sends the full weights from each rank (under FSDP2 gathered from the shards
    tensor by tensor) and the probe passes on both."""
    cfg = {
        "model": str(vllm_tiny_path),
        "iterations": 2,
        "top_k_abs": 2,
        "estimator": "grpo",
        "mini": 6,
        "micro": 3,
        "engine": "vllm",
        "tp": 2,
    }
    [(j0, p0), (j1, p1)] = collect(launch(tmp_path, "tp", 2, strategy=strategy, **cfg), timeout=800)
    g0, g1 = j0["generations"], j1["generations"]
    # one call per iteration, all 12 envs on each rank
    assert len(g0) == 2 and all(len(call) == 4 * 3 for call in g0)
    # one engine: the same tokens on both workers
    assert g0 == g1 and any(ids for call in g0 for ids in call)
    for rank in (j0, j1):
        probes = rank["probes"]
        assert [p["step"] for p in probes] == [0, 1]
        # FSDP2: the push gathers the shards
        assert all(p["sharded"] is (strategy == "fsdp") for p in probes)
        assert all(p["max"] < 1e-3 and 0 <= p["mean"] <= p["max"] for p in probes)
        # the max over ranks, logged
        assert rank["metrics"][-1]["rollout/probe_max_abs_logprob_diff"] < 1e-3
        assert rank["metrics"][-1]["rollout/sync_tensors"] == 27.0  # every tensor, from each rank
    assert j0["kept"] == j1["kept"] and all(len(k) == 2 for k in j0["kept"])
    assert_same(p0, p1, atol=0)
    # the update did something
    assert any(not torch.equal(p0[k], v) for k, v in _initial(vllm_tiny_path).items())


@pytest.mark.parametrize("quantization, world_sizes", [("none", [2, 1, 2]), ("nf4", [2, 1])])
def test_fsdp2_lora_equals_ddp_exports_the_adapter_and_reshards(
    tmp_path, tiny_path, quantization, world_sizes
):
    """LoRA / QLoRA under FSDP2 (frozen base, 4-bit as its packed bytes, and adapters sharded per
    block), GAE + KL (the reference is the adapter-disabled actor), real sampling from the HF
    engine's copy (adapters synced from the shards). One iteration per entry of ``world_sizes``
    (processes), each resuming the last sharded checkpoint, against one uninterrupted DDP run
    started at the same time: the same kept groups, adapters, value head and logits; the adapter
    exported at the end reproduces the trained actor's logits. Every rank draws other random
    adapters (dist_worker.py): both strategies must start from rank 0's."""
    lora = {"rank": 4, "alpha": 8, "quantization": quantization}
    cfg = {
        "model": str(tiny_path),
        "iterations": len(world_sizes),
        "top_k_abs": 2,
        "estimator": "gae",
        "kl": True,
        "mini": 6,
        "micro": 3,
        "engine": "hf",
        "lora": lora,
    }
    ddp = launch(tmp_path, "ddp", 2, strategy="ddp", **cfg)
    kept, ckpt, first = [], None, None
    for i, procs in enumerate(world_sizes):  # 2 optimizer steps (critic, actor) per iteration
        last = i == len(world_sizes) - 1
        stop = {} if last else {"max_steps": 2 * (i + 1), "ckpt_dir": str(tmp_path / f"ck{i}")}
        ranks = run(
            tmp_path, f"fsdp{i}", procs, strategy="fsdp", ckpt_in=ckpt, export=last, **stop, **cfg
        )
        (j0, p0) = ranks[0]
        # one iteration per stage
        assert j0["state"]["iteration"] == i + 1 and len(j0["metrics"]) == 1
        for j, p in ranks[1:]:
            assert j["kept"] == j0["kept"]
            assert_same(p, p0, atol=0)
        kept += j0["kept"]
        first = first or p0
        if not last:
            ckpt = str(tmp_path / f"ck{i}" / f"step={2 * (i + 1)}.ckpt")
            # a sharded (distributed) checkpoint
            files = sorted(p.name for p in Path(ckpt).iterdir())
            assert files == [
                ".metadata",
                *(f"__{r}_0.distcp" for r in range(procs)),
                "meta.pt",
                "ragen-sha256.json",
            ]
    [(d0, p_ddp), _] = collect(ddp)
    assert kept == d0["kept"] and j0["global_step"] == d0["global_step"] == 2 * len(world_sizes)
    # the trainable weights only
    assert not any("base_layer" in k or "embed_tokens" in k for k in p0)
    assert_same(p0, p_ddp, atol=1e-5)  # adapters, value head and the actor's logits: those of DDP
    for key in ("actor/pg_loss", "actor/kl_loss", "critic/vf_loss", "actor/grad_norm"):
        assert j0["metrics"][-1][key] == pytest.approx(d0["metrics"][-1][key], abs=1e-5), key
    # the adapters moved away from the reference (adapters off)
    assert j0["metrics"][-1]["actor/kl_loss"] > 0
    lora_a = [k for k in p0 if "lora_A" in k]
    # the resumed stages trained them
    assert lora_a and any(not torch.equal(p0[k], first[k]) for k in lora_a)
    # the exported adapter (peft format) on a fresh base, 4-bit like the trained one, gives the
    # trained logits
    from peft import PeftModel

    from ragen_lightning.models import load_causal_lm
    from ragen_lightning.models.build import keep_4bit_trainable
    from ragen_lightning.models.lora import LoraSettings

    # (bitsandbytes' CPU repacking kept off)
    qconfig = LoraSettings(**lora).quantization_config(torch.float32)
    base = keep_4bit_trainable(load_causal_lm(str(tiny_path), "float32", qconfig))
    exported = PeftModel.from_pretrained(
        base, tmp_path / f"fsdp{len(world_sizes) - 1}" / "export"
    ).eval()
    with torch.no_grad():
        logits = exported(input_ids=torch.arange(3, 19)[None]).logits
    torch.testing.assert_close(logits, p0["logits"], atol=1e-5, rtol=0)


@pytest.mark.skipif(not vllm_installed(), reason="needs vLLM (README install)")
def test_fsdp2_lora_with_vllm_engines_pushes_merged_adapters_from_the_shards(
    tmp_path, vllm_tiny_path
):
    """LoRA under FSDP2 with one vLLM engine per rank against one process with one engine (both at
    once): every push merges ``W + scaling * B A`` from the gathered base and factors, one weight at
    a time, and sends the adapted blocks only. The second push follows a real update of the
    adapters, and the probe passes on every rank."""
    cfg = {
        "model": str(vllm_tiny_path),
        "iterations": 2,
        "top_k_abs": 2,
        "estimator": "grpo",
        "mini": 6,
        "micro": 3,
        "engine": "vllm",
        "lora": {"rank": 4, "alpha": 8},
    }
    jobs = (
        launch(tmp_path, "single", 1, strategy="single", **cfg),
        launch(tmp_path, "fsdp", 2, strategy="fsdp", **cfg),
    )
    [(single, p_single)], [(j0, p0), (j1, p1)] = (collect(job, timeout=500) for job in jobs)
    for rank in (j0, j1):
        probes = rank["probes"]
        assert [p["step"] for p in probes] == [0, 1] and all(p["sharded"] for p in probes)
        # this rank's engine equals the sharded LoRA actor
        assert all(p["max"] < 1e-3 for p in probes)
        # the adapted blocks only: per layer q, k, v, o weights, q, k, v biases and gate, up, down
        # (2 layers)
        assert rank["metrics"][-1]["rollout/sync_tensors"] == 20.0
    assert j0["rollout_copy"] == 0 and j0["kept"] == j1["kept"] == single["kept"]
    assert_same(p0, p1, atol=0)
    assert_same(p0, p_single, atol=1e-5)  # adapters and logits of the one-process LoRA run
    # B starts at 0: the update moved the adapters
    assert any(p0[k].abs().max() > 0 for k in p0 if "lora_B" in k)


@pytest.mark.skipif(not vllm_installed(), reason="needs vLLM (README install)")
def test_two_nodes_on_loopback_fsdp2_with_vllm_checkpoint_and_resume_on_one_node(
    tmp_path, vllm_tiny_path
):
    """Two node ranks (one torchrun each, one process per node, rendezvous on 127.0.0.1) of FSDP2
    with a vLLM engine per rank: 2 iterations, a sharded checkpoint after each; then the first
    checkpoint resumed on one node (one process) runs iteration 2 to the same weights as the
    two-node run. What it cannot show: real network fabric, NCCL, per-node filesystems (the
    checkpoint folder is shared here, as a sharded resume needs)."""
    cfg = {
        "model": str(vllm_tiny_path),
        "iterations": 2,
        "top_k_abs": 2,
        "estimator": "grpo",
        "mini": 6,
        "micro": 3,
        "engine": "vllm",
    }
    (n0, p0), (n1, p1) = collect_nodes(
        launch_nodes(tmp_path, "nodes", 2, strategy="fsdp", ckpt_dir=str(tmp_path / "ck"), **cfg)
    )
    assert (n0["world_size"], n0["node_rank"], n1["node_rank"]) == (2, 0, 1)
    # 2 kept groups x 3 = one mini-batch: 1 step each
    assert n0["kept"] == n1["kept"] and n0["global_step"] == 2
    assert [p["step"] for p in n0["probes"]] == [0, 1] and all(
        p["max"] < 1e-3 for p in n0["probes"] + n1["probes"]
    )
    assert_same(p0, p1, atol=0)
    ckpt = tmp_path / "ck" / "step=1.ckpt"
    assert "ragen-sha256.json" in {p.name for p in ckpt.iterdir()}  # sharded, digested
    [(one, p_one)] = run(tmp_path, "one_node", 1, strategy="fsdp", ckpt_in=str(ckpt), **cfg)
    assert (
        one["state"]["iteration"] == 2
        and len(one["metrics"]) == 1
        and one["kept"] == n0["kept"][1:]
    )
    assert_same(p_one, p0, atol=1e-5)
