"""Launching ``tests/integration/dist_worker.py`` for the distributed and vLLM integration tests
(``test_distributed.py``, ``test_distributed_checkpoints.py``, ``test_vllm.py``), and what their
assertions share.

A launch is one or two processes that run several fits (the worker's *phases*) one after another:
starting Python, torch and Lightning costs more than a fit of the tiny model, so the tests of a file
share a few launches (module-scoped fixtures) instead of starting processes per fit. Two launches run
side by side: one on 2 ranks (torchrun) and one on 1 process, and a phase can wait for a file another
launch writes (a checkpoint to resume on another world size), so a chain 2 -> 1 -> 2 processes costs
two launches. Every wait is bounded: a collective that hangs fails the test instead of blocking CI.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
WORKER = ROOT / "tests" / "integration" / "dist_worker.py"
# the vLLM runs: 4 groups x 3, the filter keeps 2: one mini-batch of 6 -> one optimizer step per
# iteration, so the second iteration's push follows a real update
VLLM = {
    "iterations": 2,
    "top_k_abs": 2,
    "estimator": "grpo",
    "mini": 6,
    "micro": 3,
    "engine": "vllm",
}
ENV = {"PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Launch:
    """The worker on ``procs`` processes per node and ``nodes`` nodes (one torchrun per node,
    static rendezvous on 127.0.0.1, as on ``nodes`` machines; a plain interpreter for one process
    on one node), running ``phases`` (name -> worker settings) in order; phase ``p`` writes into
    ``<out>/<p>/`` and the launch's log is ``<out>/log{node}.txt``. A context manager: leaving it
    kills what still runs."""

    def __init__(self, out: Path, procs: int, phases: dict[str, dict], nodes: int = 1):
        self.out, self.ranks = out, procs * nodes
        out.mkdir(parents=True)
        port, self.procs, self.logs = free_port(), [], []
        spec = json.dumps({"out": str(out), "phases": phases})
        for node in range(nodes):
            launcher = (
                [
                    *(sys.executable, "-m", "torch.distributed.run"),
                    *("--nnodes", str(nodes), "--nproc_per_node", str(procs)),
                    *("--node_rank", str(node), "--master_addr", "127.0.0.1"),
                    *("--master_port", str(port)),
                ]
                if self.ranks > 1
                else [sys.executable]
            )
            self.logs.append(out / f"log{node}.txt")
            with open(self.logs[-1], "w") as log:
                self.procs.append(
                    subprocess.Popen(
                        [*launcher, str(WORKER), spec],
                        env=dict(os.environ, **ENV),
                        cwd=ROOT,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        text=True,
                    )
                )

    def __enter__(self) -> Launch:
        return self

    def __exit__(self, *exc) -> None:
        self.kill()

    def kill(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()

    def log(self) -> str:
        return "\n".join(log.read_text()[-3000:] for log in self.logs)

    def wait(self, phase: str, timeout: float = 600) -> Path:
        """Wait until every rank finished ``phase`` (the launch goes on with its next phases);
        returns the phase's folder."""
        folder, deadline = self.out / phase, time.monotonic() + timeout

        def finished() -> bool:
            return all((folder / f"rank{r}.json").exists() for r in range(self.ranks))

        while not finished():
            codes = [proc.poll() for proc in self.procs]
            # (looked at again: the last rank may have written it just before exiting)
            if (any(c not in (None, 0) for c in codes) or None not in codes) and not finished():
                self.kill()
                pytest.fail(f"the worker ended before phase {phase} finished:\n{self.log()}")
            if time.monotonic() > deadline:  # a hung collective: fail instead of blocking
                self.kill()
                pytest.fail(f"phase {phase} did not finish in {timeout} s:\n{self.log()}")
            time.sleep(0.2)
        return folder

    def result(self, phase: str, timeout: float = 600) -> list[tuple[dict, dict | None]]:
        """``(json, params)`` per rank of ``phase`` (params None for a phase that raised)."""
        folder = self.wait(phase, timeout)
        ranks = []
        for r in range(self.ranks):
            params = folder / f"rank{r}.pt"
            ranks.append(
                (
                    json.loads((folder / f"rank{r}.json").read_text()),
                    torch.load(params) if params.exists() else None,
                )
            )
        return ranks

    def finish(self, timeout: float = 600) -> None:
        """Wait for the launch to exit after its last phase; it must succeed."""
        deadline = time.monotonic() + timeout
        for proc in self.procs:
            try:
                proc.wait(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.kill()
        assert all(proc.returncode == 0 for proc in self.procs), self.log()


def results(launch: Launch, phases, timeout: float = 600) -> dict[str, list]:
    """:meth:`Launch.result` of each phase, then :meth:`Launch.finish`."""
    out = {phase: launch.result(phase, timeout) for phase in phases}
    launch.finish(timeout)
    return out


def assert_same(a: dict, b: dict, atol: float) -> None:
    assert a.keys() == b.keys()
    for k, v in a.items():
        torch.testing.assert_close(v, b[k], atol=atol, rtol=0, msg=k)


def initial(model_path) -> dict:
    """The untrained actor's parameters under the worker's names (``actor.<name>``)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_path)
    return {f"actor.{k}": v for k, v in model.state_dict().items()}


def vllm_tiny_model() -> Path:
    """The tiny model with head_dim 32: vLLM's CPU attention has no kernel for the session tiny
    model's head_dim 16. Built once into the test cache."""
    from ragen_lightning.models.tiny import TinySpec, cache_root, tiny_model_path
    from tests.conftest import SMALL_CORPUS

    spec = TinySpec(
        hidden_size=64,
        num_layers=2,
        num_heads=2,
        num_kv_heads=1,
        intermediate_size=128,
        vocab_size=400,
    )
    return tiny_model_path(spec, cache_dir=cache_root(), corpus=SMALL_CORPUS)
