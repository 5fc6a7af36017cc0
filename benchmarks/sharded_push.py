"""Memory of the FSDP2 -> vLLM weight push: the extra peak per rank while the shards stream into
each rank's engine.

    python benchmarks/sharded_push.py                      # the medium preset (~47M parameters) on 2 processes
    python benchmarks/sharded_push.py --model small --procs 2 --repeats 3

Starts itself under ``torch.distributed.run`` (gloo, CPU). Each rank loads the actor, shards it per
decoder block with FSDP2 (:func:`ragen_lightning.parallel.shard_model`), builds its in-process vLLM
engine (:class:`~ragen_lightning.rollout.vllm_engine.VLLMEngine`) and pushes the weights
``--repeats`` times in two ways:

- ``streamed``: what training does (``weights_for_push`` -> ``VLLMEngine._push``): each parameter
  gathered from the shards only when vLLM asks for it;
- ``gathered first``: the whole state dict gathered before the push (a second full copy of the
  model), for contrast;
- ``unsharded model``: the same weights pushed from an ordinary (unsharded) copy of the model,
  nothing gathered: vLLM's own transient memory during a reload, which any push pays.

The first push of a run is reported on its own (``streamed, first push``): vLLM sets up its reload
bookkeeping then. Memory is the process's resident set (Linux ``/proc/self/status``): the peak
(``VmHWM``, reset through ``/proc/self/clear_refs`` before each push) minus the resident set just
before it. The ranks run with ``MALLOC_MMAP_THRESHOLD_=65536`` so that glibc serves every tensor
from its own mapping and returns it when freed (otherwise freed heap memory is kept and reused, and
a push can look free or be charged for an earlier one's memory). vLLM's engine already holds its own
full copy before the push, so the figure is what the push adds on top. It is compared with the
largest decoder block and the whole model (fp32 bytes). After every push the sync-fidelity probe
checks that vLLM got the weights. Models: ``tiny``, and the random-weight ``small`` / ``medium`` /
``large`` of ``benchmarks/rollout.py``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

MIB = 2**20


def _status(field: str) -> int:
    """A ``/proc/self/status`` memory field in bytes."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"{field} not in /proc/self/status (Linux only)")


def extra_peak(fn) -> tuple[int, float]:
    """``(peak resident bytes during fn() minus those before it, seconds)``."""
    Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current resident set
    before = _status("VmRSS")
    t0 = time.perf_counter()
    fn()
    return _status("VmHWM") - before, time.perf_counter() - t0


def block_bytes(model) -> tuple[int, int]:
    """``(largest decoder block, whole model)`` in bytes of their parameters (full, unsharded
    sizes)."""
    from ragen_lightning.parallel import transformer_blocks

    def size(module) -> int:
        return sum(p.numel() * p.element_size() for p in module.parameters())

    return max(size(b) for b in transformer_blocks(model)), size(model)


def worker(args) -> None:
    import torch
    from torch.distributed.device_mesh import init_device_mesh

    from ragen_lightning.models import load_causal_lm, load_tokenizer
    from ragen_lightning.parallel import gather_objects, shard_model, world
    from ragen_lightning.parallel.ranks import stream_full_tensors
    from ragen_lightning.rollout.vllm_engine import (
        VLLMEngine,
        VLLMSettings,
        weights_for_push,
    )

    torch.distributed.init_process_group("gloo")
    rank, size = world()
    actor, plain = load_causal_lm(args.path), load_causal_lm(args.path)
    block, whole = block_bytes(actor)
    shard_model(actor, init_device_mesh("cpu", (size,)), mixed_precision=False)
    tok = load_tokenizer(args.path)
    engine = VLLMEngine(
        actor,
        args.path,
        [tok.eos_token_id],
        tok.pad_token_id,
        VLLMSettings(cpu_kvcache_gib=1),
        max_model_len=512,
        max_batch_size=8,
    )
    # the push should change the engine's weights: move the actor away from the folder's
    with torch.no_grad():
        for p in [*actor.parameters(), *plain.parameters()]:
            p.mul_(1.01)

    def streamed():
        with weights_for_push(actor) as weights:
            engine._push(weights)

    def gathered_first():
        engine._push(list(stream_full_tensors(actor.state_dict().items())))

    def unsharded():
        engine._push(stream_full_tensors(plain.state_dict().items()))

    rows = []
    pushes = [("streamed, first push", streamed)]
    pushes += [
        ("streamed", streamed),
        ("gathered first", gathered_first),
        ("unsharded model", unsharded),
    ] * args.repeats
    for name, push in pushes:
        torch.distributed.barrier()
        extra, seconds = extra_peak(push)
        engine.llm.reset_prefix_cache()
        probe_max, _ = engine.probe_diff()  # collective: the sharded actor's forward
        rows.append(
            {"push": name, "extra_mib": extra / MIB, "seconds": seconds, "probe_max": probe_max}
        )
    per_rank = gather_objects({"rank": rank, "rows": rows, "rss_mib": _status("VmRSS") / MIB})
    if rank == 0:
        print(
            "RESULT_JSON "
            + json.dumps(
                {
                    "model": args.model,
                    "procs": size,
                    "block_mib": block / MIB,
                    "model_mib": whole / MIB,
                    "ranks": per_rank,
                }
            )
        )
    torch.distributed.destroy_process_group()


def report(result: dict) -> None:
    print(
        f"model {result['model']}: largest decoder block {result['block_mib']:.1f} MiB, whole model "
        f"{result['model_mib']:.1f} MiB (fp32), {result['procs']} processes (FSDP2, gloo)\n"
    )
    print("| push | rank | extra peak RSS (MiB) | / largest block | push s | probe max abs dlogp |")
    print("|---|---|---|---|---|---|")
    for part in result["ranks"]:
        for row in part["rows"]:
            print(
                f"| {row['push']} | {part['rank']} | {row['extra_mib']:.1f} | "
                f"{row['extra_mib'] / result['block_mib']:.2f} | {row['seconds']:.2f} | {row['probe_max']:.1e} |"
            )
    for name in ("streamed, first push", "streamed", "gathered first", "unsharded model"):
        worst = max(r["extra_mib"] for p in result["ranks"] for r in p["rows"] if r["push"] == name)
        print(
            f"\n{name}: worst extra peak {worst:.1f} MiB = {worst / result['block_mib']:.2f} x the largest block, "
            f"{worst / result['model_mib']:.2f} x the model",
            end="",
        )
    print()


def main(argv: list[str] | None = None) -> dict | None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="medium", help="tiny | small | medium | large | a HF folder")
    p.add_argument("--procs", type=int, default=2)
    p.add_argument("--repeats", type=int, default=2, help="pushes of each kind per rank")
    p.add_argument("--path", help=argparse.SUPPRESS)  # set for the workers
    args = p.parse_args(argv)
    if "LOCAL_RANK" in os.environ:
        return worker(args)
    from benchmarks.rollout import model_path

    path = model_path(args.model)  # built and cached once, before the ranks start
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        str(args.procs),
        __file__,
        "--model",
        args.model,
        "--repeats",
        str(args.repeats),
        "--path",
        path,
    ]
    env = dict(
        os.environ,
        PYTHONPATH=str(Path(__file__).resolve().parents[1]),
        OMP_NUM_THREADS="1",
        MALLOC_MMAP_THRESHOLD_="65536",
    )
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT_JSON ")]
    if proc.returncode or not lines:
        sys.exit(f"the ranks failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")
    result = json.loads(lines[-1][len("RESULT_JSON ") :])
    report(result)
    return result


if __name__ == "__main__":
    main()
