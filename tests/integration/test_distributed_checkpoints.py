"""FSDP2 sharded checkpoints (gloo, torchrun) resume on other world sizes to the weights of one
uninterrupted run: 2 -> 1 -> 2 processes with full fine-tuning against one process, LoRA / QLoRA
against DDP, and two node ranks on loopback (a vLLM engine per rank) resumed on one node; every rank
refuses a damaged checkpoint.

Every fit is a phase of ``tests/integration/dist_worker.py`` in one of the launches that run side by
side for the whole module (``dist_launch.py``): one on 2 ranks, one on 1 process, and the two node
ranks. A stage on one world size waits for the checkpoint the previous stage wrote in another
launch, so the module pays the start-up of five workers, not one launch per stage.
"""

from __future__ import annotations

import shutil
from contextlib import ExitStack
from pathlib import Path

import pytest
import torch

from ragen_lightning.rollout.vllm_engine import vllm_installed
from tests.integration.dist_launch import VLLM, Launch, assert_same, results, vllm_tiny_model

pytestmark = pytest.mark.slow

# GAE + KL with real sampling (the HF engine's unsharded copy synced from the shards): sharded actor,
# critic and reference; 2 kept groups x 3 samples = one mini-batch of 6 -> 2 optimizer steps
# (critic, actor) per iteration
FULL = {"top_k_abs": 2, "estimator": "gae", "kl": True, "mini": 6, "micro": 3, "engine": "hf"}
# the LoRA / QLoRA test's cases: one iteration per entry of world_sizes (processes)
LORA_CASES = [("none", [2, 1, 2]), ("nf4", [2, 1])]


def lora_cfg(model: str, quantization: str, world_sizes: list[int]) -> dict:
    return {
        **FULL,
        "model": model,
        "iterations": len(world_sizes),
        "lora": {"rank": 4, "alpha": 8, "quantization": quantization},
    }


def done(root: Path, procs: int, phase: str) -> list[str]:
    """The files whose presence means ``phase`` of the ``procs``-process launch finished."""
    return [str(root / str(procs) / phase / f"rank{r}.json") for r in range(procs)]


def lora_chain(root: Path, model: str, quantization: str, world_sizes: list[int]) -> dict:
    """The LoRA stages as phases by world size: stage ``i`` on ``world_sizes[i]`` processes
    resumes stage ``i - 1``'s sharded checkpoint, waiting for that stage to finish; the last
    exports the adapter."""
    cfg, phases = lora_cfg(model, quantization, world_sizes), {1: {}, 2: {}}
    for i, procs in enumerate(world_sizes):
        phase = {**cfg, "strategy": "fsdp", "export": i == len(world_sizes) - 1}
        if i < len(world_sizes) - 1:  # 2 optimizer steps (critic, actor) per iteration
            phase.update(max_steps=2 * (i + 1), ckpt_dir=str(root / f"ck_{quantization}_{i}"))
        if i > 0:
            phase["ckpt_in"] = str(root / f"ck_{quantization}_{i - 1}" / f"step={2 * i}.ckpt")
            phase["wait_for"] = done(root, world_sizes[i - 1], f"lora_{quantization}_{i - 1}")
        phases[procs][f"lora_{quantization}_{i}"] = phase
    return phases


def damage_copies(root: Path) -> dict[str, int]:
    """Copies of a's last checkpoint with one shard damaged (a flipped bit; cut in half), each
    moved into place whole (the 2-rank launch waits for it); returns the shard's saved size."""
    saved = root / "ck_a" / "step=4.ckpt"
    size = (saved / "__1_0.distcp").stat().st_size
    for damage in ("flip", "truncate"):
        tmp = root / f".{damage}.tmp"
        shutil.copytree(saved, tmp)
        shard = tmp / "__1_0.distcp"
        data = bytearray(shard.read_bytes())
        data[len(data) // 2] ^= 0x01
        shard.write_bytes(bytes(data) if damage == "flip" else bytes(data[: len(data) // 2]))
        tmp.rename(root / f"{damage}.ckpt")
    return {"shard": size}


@pytest.fixture(scope="module")
def runs(tmp_path_factory, tiny_path):
    """Both launches, all phases: the full fine-tuning chain (a: 2 processes, iterations 1-2 -> b:
    1, iteration 3 -> c: 2, iteration 4) and one uninterrupted single process, a's checkpoint
    damaged and resumed on 2 ranks, the LoRA chains and their DDP runs."""
    root, model = tmp_path_factory.mktemp("fsdp2_ckpt"), str(tiny_path)
    full = {**FULL, "model": model, "iterations": 4, "strategy": "fsdp"}
    chains = [lora_chain(root, model, q, ws) for q, ws in LORA_CASES]
    two = {
        "a": {**full, "max_steps": 4, "ckpt_dir": str(root / "ck_a")},
        # first stages (nothing to wait for) early, resumed stages last
        **{n: p for c in chains for n, p in c[2].items() if "wait_for" not in p},
        **{
            f"bad_{damage}": {
                **full,
                "ckpt_in": str(root / f"{damage}.ckpt"),
                "wait_for": [str(root / f"{damage}.ckpt")],
                "expect_error": True,
            }
            for damage in ("flip", "truncate")
        },
        # each LoRA case's uninterrupted DDP run
        **{f"lora_{q}_ddp": {**lora_cfg(model, q, ws), "strategy": "ddp"} for q, ws in LORA_CASES},
        "c": {
            **full,
            "ckpt_in": str(root / "ck_b" / "step=6.ckpt"),
            "wait_for": done(root, 1, "b"),
        },
        **{n: p for c in chains for n, p in c[2].items() if "wait_for" in p},
    }
    one = {
        "single": {**full, "strategy": "single"},
        "b": {
            **full,
            "max_steps": 6,
            "ckpt_dir": str(root / "ck_b"),
            "ckpt_in": str(root / "ck_a" / "step=4.ckpt"),
            "wait_for": done(root, 2, "a"),
        },
        **{n: p for c in chains for n, p in c[1].items()},
    }
    nodes = {}
    if vllm_installed():  # two node ranks with vLLM, then their first checkpoint on one process
        vllm = {**VLLM, "model": str(vllm_tiny_model()), "strategy": "fsdp"}
        nodes["nodes"] = {**vllm, "ckpt_dir": str(root / "ck_nodes")}
        one["one_node"] = {
            **vllm,
            "ckpt_in": str(root / "ck_nodes" / "step=1.ckpt"),
            "wait_for": [str(root / "nodes" / "nodes" / f"rank{r}.json") for r in range(2)],
        }
    with ExitStack() as stack:
        two_ranks = stack.enter_context(Launch(root / "2", 2, two))
        one_process = stack.enter_context(Launch(root / "1", 1, one))
        if nodes:
            two_nodes = stack.enter_context(Launch(root / "nodes", 1, nodes, nodes=2))
        two_ranks.wait("a", timeout=600)
        sizes = damage_copies(root)
        out = results(two_nodes, nodes, timeout=900) if nodes else {}
        out |= results(one_process, one, timeout=900) | results(two_ranks, two, timeout=900)
    return {"root": root, **sizes, **out}


def test_fsdp2_sharded_checkpoint_resumes_on_other_world_sizes(runs):
    """4 iterations with real sampling (the engine's full copy synced from the shards), GAE + KL
    (sharded actor, critic and reference), saved and resumed across world sizes: 2 processes
    (iterations 1-2) -> 1 (iteration 3) -> 2 (iteration 4). The result equals one uninterrupted
    single-process run: same seed stream, same weights."""
    root = runs["root"]
    [(single, p_single)] = runs["single"]
    (a0, pa0), (a1, pa1) = runs["a"]
    assert a0["state"]["iteration"] == 2 and a1["kept"] == a0["kept"] == single["kept"][:2]
    # the HF engine samples from an unsharded copy synced from the shards
    assert a0["rollout_copy"] == 1
    # FSDP2 fit 2 iterations: the gathered parameters agree on both ranks
    assert_same(pa0, pa1, atol=0)
    shards = sorted(p.name for p in (root / "ck_a" / "step=4.ckpt").iterdir())
    # a sharded (distributed) checkpoint, with the digest of every file; saved atomically (no
    # temporary left)
    assert shards == [".metadata", "__0_0.distcp", "__1_0.distcp", "meta.pt", "ragen-sha256.json"]
    assert sorted(p.name for p in (root / "ck_a").iterdir()) == ["step=2.ckpt", "step=4.ckpt"]
    # every rank refuses a damaged copy with the same line naming the file (and trains nothing)
    size = runs["shard"]
    for damage in ("flip", "truncate"):
        bad = root / f"{damage}.ckpt"
        line = f"CheckpointError: --ckpt_path {bad}: corrupted checkpoint (__1_0.distcp" + (
            "'s SHA-256 differs"
            if damage == "flip"
            else f" has {size // 2} bytes, {size} were saved"
        )
        for j, params in runs[f"bad_{damage}"]:  # raised on both ranks
            assert (j["error"] or "").startswith(line) and params is None, j["error"]
            assert j["metrics"] == [] and j["global_step"] == 0
    [(b, _)] = runs["b"]
    assert b["state"]["iteration"] == 3 and len(b["metrics"]) == 1  # only iteration 3 ran
    (c0, p0), (c1, p1) = runs["c"]
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


@pytest.mark.parametrize("quantization, world_sizes", LORA_CASES)
def test_fsdp2_lora_equals_ddp_exports_the_adapter_and_reshards(
    runs, tiny_path, quantization, world_sizes
):
    """LoRA / QLoRA under FSDP2 (frozen base, 4-bit as its packed bytes, and adapters sharded per
    block), GAE + KL (the reference is the adapter-disabled actor), real sampling from the HF
    engine's copy (adapters synced from the shards). One iteration per entry of ``world_sizes``
    (processes), each resuming the last sharded checkpoint, against one uninterrupted DDP run: the
    same kept groups, adapters, value head and logits; the adapter exported at the end reproduces
    the trained actor's logits. Every rank draws other random adapters (dist_worker.py): both
    strategies must start from rank 0's."""
    root, kept, first = runs["root"], [], None
    for i, procs in enumerate(world_sizes):
        ranks = runs[f"lora_{quantization}_{i}"]
        assert len(ranks) == procs
        (j0, p0) = ranks[0]
        # one iteration per stage
        assert j0["state"]["iteration"] == i + 1 and len(j0["metrics"]) == 1
        for j, p in ranks[1:]:
            assert j["kept"] == j0["kept"]
            assert_same(p, p0, atol=0)
        kept += j0["kept"]
        first = first or p0
        if i < len(world_sizes) - 1:
            ckpt = root / f"ck_{quantization}_{i}" / f"step={2 * (i + 1)}.ckpt"
            # a sharded (distributed) checkpoint
            assert sorted(p.name for p in ckpt.iterdir()) == [
                ".metadata",
                *(f"__{r}_0.distcp" for r in range(procs)),
                "meta.pt",
                "ragen-sha256.json",
            ]
    [(d0, p_ddp), _] = runs[f"lora_{quantization}_ddp"]
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
    lora = lora_cfg(str(tiny_path), quantization, world_sizes)["lora"]
    qconfig = LoraSettings(**lora).quantization_config(torch.float32)
    base = keep_4bit_trainable(load_causal_lm(str(tiny_path), "float32", qconfig))
    last = len(world_sizes) - 1
    export = root / str(world_sizes[last]) / f"lora_{quantization}_{last}" / "export"
    exported = PeftModel.from_pretrained(base, export).eval()
    with torch.no_grad():
        logits = exported(input_ids=torch.arange(3, 19)[None]).logits
    torch.testing.assert_close(logits, p0["logits"], atol=1e-5, rtol=0)


@pytest.mark.skipif(not vllm_installed(), reason="needs vLLM (README install)")
def test_two_nodes_on_loopback_fsdp2_with_vllm_checkpoint_and_resume_on_one_node(runs):
    """Two node ranks (one torchrun each, one process per node, rendezvous on 127.0.0.1) of FSDP2
    with a vLLM engine per rank: 2 iterations, a sharded checkpoint after each; then the first
    checkpoint resumed on one node (one process) runs iteration 2 to the same weights as the
    two-node run. What it cannot show: real network fabric, NCCL, per-node filesystems (the
    checkpoint folder is shared here, as a sharded resume needs)."""
    (n0, p0), (n1, p1) = runs["nodes"]
    assert (n0["world_size"], n0["node_rank"], n1["node_rank"]) == (2, 0, 1)
    # 2 kept groups x 3 = one mini-batch: 1 step each
    assert n0["kept"] == n1["kept"] and n0["global_step"] == 2
    assert [p["step"] for p in n0["probes"]] == [0, 1] and all(
        p["max"] < 1e-3 for p in n0["probes"] + n1["probes"]
    )
    assert_same(p0, p1, atol=0)
    ckpt = runs["root"] / "ck_nodes" / "step=1.ckpt"
    assert "ragen-sha256.json" in {p.name for p in ckpt.iterdir()}  # sharded, digested
    [(one, p_one)] = runs["one_node"]
    assert (
        one["state"]["iteration"] == 2
        and len(one["metrics"]) == 1
        and one["kept"] == n0["kept"][1:]
    )
    assert_same(p_one, p0, atol=1e-5)
