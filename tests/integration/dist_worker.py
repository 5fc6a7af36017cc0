"""Fits of the tiny model on 1 process or under torchrun with 2 (gloo), for the distributed
integration tests (``tests/integration/dist_launch.py`` starts them).

``python tests/integration/dist_worker.py '{"out": DIR, "phases": {NAME: CFG, ...}}'`` (or under
``python -m torch.distributed.run --nproc_per_node 2``, or two ``--nnodes 2 --nproc_per_node 1``
launchers: two node ranks on loopback) runs one fit per phase, in order, in the same processes (and
the same process group): the interpreter, torch and Lightning start once for all of them, which is
most of a small fit's cost. Before each phase the global RNG is put back to the state a fresh
process starts with, so a phase computes what it would alone. A phase's ``wait_for`` (paths) holds
it until they exist: another launch's checkpoint or result, or a file the test prepares (a damaged
checkpoint copy). A phase with ``expect_error`` must raise; the error is recorded instead of the
weights. A phase with ``script`` (a module next to this one, e.g. ``vllm_fit_script``) calls its
``main(model, out)`` instead of a fit here and writes the returned object as ``rank0.json``.

A phase's keys: ``model`` (tiny folder), ``strategy`` (``single`` | ``ddp`` | ``fsdp``),
``iterations``, ``estimator`` (``gae`` | ``grpo``), ``engine`` (``scripted``: seeded bandit answers,
exact; ``hf``: real sampling; ``vllm``: real sampling with a colocated vLLM engine per rank, each
sync's probe recorded under ``probes``), ``ckpt_in`` (resume from), ``ckpt_dir`` (a checkpoint after
every optimizer step, ``step=N.ckpt``), ``max_steps`` (stop early), ``kl`` (KL loss with a
reference), ``top_k_abs`` (filter), ``mini`` (mini-batch size), ``export`` (export the actor to
``<phase out>/export`` at the end of the fit), ``lora`` (``--model.lora`` settings as a dict),
``tp`` (``--data.engine.vllm.tensor_parallel_size``: one vLLM engine over that many ranks; each
rank's own generations, before the gather, are recorded under ``generations``), ``mixture`` (a
``--data.env.mixture`` list instead of the single Bandit env). Every rank writes into
``<out>/<phase>/``: ``rank{r}.pt`` (the full actor/critic parameters, gathered from FSDP2 shards;
under LoRA the trainable ones only, and the trained actor's ``logits`` on fixed ids), then
``rank{r}.json`` (logged metrics per iteration, kept group ids, data-module state; written last and
atomically, so its presence means the phase is done on that rank).
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from lightning.pytorch.strategies import DDPStrategy

sys.path.insert(0, str(Path(__file__).resolve().parent))

from scripted import SeededBanditEngine

import envs  # noqa: F401
from ragen_lightning.data.datamodule import RolloutDataModule
from ragen_lightning.data.sampler import FilterSettings
from ragen_lightning.parallel import FSDP2Strategy, full_tensor
from ragen_lightning.rollout.settings import EpisodeSettings
from ragen_lightning.rollout.vllm_engine import VLLMEngine, VLLMSettings
from ragen_lightning.starpo.module import StarPOModule

torch.set_num_threads(1)
# the global RNG state of a fresh process (the critic's value head and LoRA's adapters draw from
# it): put back before every phase
FRESH_RNG = torch.get_rng_state()
# the launcher's environment: a vLLM engine rewrites some of it (WORLD_SIZE, ...) in its process
FRESH_ENV = dict(os.environ)
# every phase's rollout engine, alive until the process exits: on several ranks a vLLM engine is
# never closed (VLLMEngine.close), and once the data module's teardown drops it, collecting it (its
# worker's shutdown) takes the process group with it, which the next phase still uses
ENGINES: list = []


class Scripted(StarPOModule):
    def make_engine(self, max_batch_size=128):
        return SeededBanditEngine(self.tokenizer)


class Recording(RolloutDataModule):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.kept: list[list[int]] = []

    # every batch, taken from the async worker or not
    def _finish(self, iteration, sync, generated):
        batch = super()._finish(iteration, sync, generated)
        self.kept.append(sorted({t.group_id for t in batch.trajectories}))
        return batch

    def teardown(self, stage: str) -> None:
        ENGINES.append(self.engine)
        super().teardown(stage)


class Metrics(Callback):
    def __init__(self):
        self.rows = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.rows.append(
            {k: float(v) for k, v in trainer.callback_metrics.items() if not k.startswith("timing")}
        )


def record_probes(module) -> tuple[list[dict], Callable[[], None]]:
    """Every sync's probe on this rank: its own max/mean |vLLM - trainer| log-prob before the
    cross-rank max, the probe batch size and the optimizer steps taken before the sync (> 0: the
    push follows a real update); and the undo of the patch."""
    rows: list[dict] = []
    probe_diff = VLLMEngine.probe_diff

    def recording(engine):
        max_diff, mean_diff = probe_diff(engine)
        rows.append(
            {
                "max": max_diff,
                "mean": mean_diff,
                "sequences": len(engine.probe_batch()),
                "step": module.global_step,
                "sharded": engine.sharded,
            }
        )
        return max_diff, mean_diff

    VLLMEngine.probe_diff = recording
    return rows, lambda: setattr(VLLMEngine, "probe_diff", probe_diff)


def record_generations() -> tuple[list[list[list[int]]], Callable[[], None]]:
    """The token ids this rank's engine returned, one list per ``generate`` call (and the undo of
    the patch)."""
    calls: list[list[list[int]]] = []
    generate = VLLMEngine.generate

    def recording(engine, prompts, params, seeds=None):
        out = generate(engine, prompts, params, seeds)
        calls.append([g.token_ids for g in out])
        return out

    VLLMEngine.generate = recording
    return calls, lambda: setattr(VLLMEngine, "generate", generate)


def build(cfg: dict, out: Path) -> tuple[StarPOModule, Recording, L.Trainer, Metrics]:
    """The module, data module, trainer and metrics recorder of one phase."""
    strategy = {
        "single": "auto",
        "ddp": DDPStrategy(find_unused_parameters=True),
        "fsdp": FSDP2Strategy(),
    }[cfg["strategy"]]
    world = int(os.environ.get("WORLD_SIZE", "1"))  # torchrun: every process of every node
    devices = int(os.environ.get("LOCAL_WORLD_SIZE", world))  # this node's processes
    num_nodes = world // devices
    cls = Scripted if cfg.get("engine", "scripted") == "scripted" else StarPOModule
    module = cls(
        model=cfg["model"],
        advantage={"estimator": cfg.get("estimator", "gae")},
        update={"mini_batch_size": cfg.get("mini", 2), "micro_batch_size": cfg.get("micro", 1)},
        # a KL loss: coef > 0
        loss={
            "entropy_coeff": 0.01,
            "kl_coef": 0.1 if cfg.get("kl") else 0.0,
            "tis_cap": 2.0 if cfg.get("async") else None,
        },
        optim={
            "grad_clip": 1.0,
            "actor_optimizer": partial(torch.optim.SGD, lr=0.5, momentum=0.9),
            "critic_optimizer": partial(torch.optim.SGD, lr=0.5, momentum=0.9),
        },
        export_dir=str(out / "export") if cfg.get("export") else None,
        lora=cfg.get("lora"),
    )
    engine = (
        {"name": "vllm", "vllm": VLLMSettings(probe_size=2, tensor_parallel_size=cfg.get("tp", 1))}
        if cfg.get("engine") == "vllm"
        else {}
    )
    flt = (
        FilterSettings(strategy="top_k_abs", value=cfg["top_k_abs"])
        if cfg.get("top_k_abs")
        else None
    )
    env = {"mixture": cfg["mixture"]} if cfg.get("mixture") else {"id": "ragen/Bandit-v0"}
    training = {
        "num_groups": 4,
        "group_size": 3,
        "num_iterations": cfg["iterations"],
        "async_level": int(bool(cfg.get("async"))),
    }
    dm = Recording(
        env=env,
        training=training,
        sampling={"temperature": 1.0},
        validation={"num_groups": 2},
        episode=EpisodeSettings(
            max_turns=1,
            max_actions_per_turn=1,
            max_actions_per_episode=1,
            max_new_tokens=8,
            max_model_len=1024,
        ),
        filter=flt,
        engine=engine,
    )
    callbacks = [Metrics()]
    if cfg.get("ckpt_dir"):
        callbacks.append(
            ModelCheckpoint(
                dirpath=cfg["ckpt_dir"], every_n_train_steps=1, save_top_k=-1, filename="{step}"
            )
        )
    trainer = L.Trainer(
        accelerator="cpu",
        devices=devices,
        num_nodes=num_nodes,
        strategy=strategy,
        max_epochs=1,
        logger=False,
        max_steps=cfg.get("max_steps", -1),
        enable_checkpointing=len(callbacks) > 1,
        callbacks=callbacks,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        limit_val_batches=0,
        default_root_dir=out,
    )
    return module, dm, trainer, callbacks[0]


def trained_params(module: StarPOModule, lora: bool) -> dict[str, torch.Tensor]:
    """The full actor/critic parameters (gathered from FSDP2 shards); under LoRA the trainable ones
    only, and the trained actor's logits on fixed ids (a collective forward under FSDP2)."""
    params = {}
    for prefix, net in (("actor", module.actor), ("critic", module.critic)):
        named = (
            net.state_dict().items()
            if net is not None and not lora
            else [
                (k, v)
                for k, v in (net.named_parameters() if net is not None else [])
                if v.requires_grad
            ]
        )
        params.update({f"{prefix}.{k}": full_tensor(v.detach()).clone() for k, v in named})
    if lora:
        with torch.no_grad():
            params["logits"] = (
                module.actor.eval()(input_ids=torch.arange(3, 19)[None]).logits.detach().clone()
            )
    return params


def main(cfg: dict) -> None:
    """One phase: fit, then write this rank's ``rank{r}.pt`` and ``rank{r}.json`` into
    ``cfg["out"]``."""
    out = Path(cfg["out"])
    module, dm, trainer, metrics = build(cfg, out)
    vllm = cfg.get("engine") == "vllm"
    probes, undo_probes = record_probes(module) if vllm else ([], None)
    generations, undo_generations = record_generations() if vllm else ([], None)
    # every rank draws other random adapters on purpose: each strategy must start from rank 0's
    if cfg.get("lora"):
        torch.manual_seed(int(os.environ.get("RANK", "0")))
    error = None
    try:
        trainer.fit(module, dm, ckpt_path=cfg.get("ckpt_in"))
    except Exception as exc:  # recorded for the test, which expects it
        if not cfg.get("expect_error"):
            raise
        error = f"{type(exc).__name__}: {exc}"
    finally:
        for undo in (undo_probes, undo_generations):
            if undo is not None:
                undo()
    rank = trainer.global_rank
    if error is None:
        torch.save(trained_params(module, bool(cfg.get("lora"))), out / f"rank{rank}.pt")
    result = {
        "error": error,
        "metrics": metrics.rows,
        "kept": dm.kept,
        "state": dm.state_dict(),
        "global_step": trainer.global_step,
        "world_size": trainer.world_size,
        "node_rank": trainer.node_rank,
        "probes": probes,
        "generations": generations,
        # FSDP2: an unsharded actor copy for the HF engine only
        "rollout_copy": len(module._rollout_actor),
    }
    write_result(out, rank, result)


def write_result(out: Path, rank: int, result: dict) -> None:
    tmp = out / f".rank{rank}.json.tmp"
    tmp.write_text(json.dumps(result))
    tmp.replace(out / f"rank{rank}.json")  # atomic: its presence means this phase is done here


def vllm_layout(tp: int) -> None:
    """Let this phase's engines take ``tp`` ranks each: vLLM keeps its model-parallel groups for the
    process (sized by the first engine, a later engine of another size is refused), so they are
    destroyed first when an earlier phase's engine had another size (the earlier engines are never
    used again)."""
    if "vllm" not in sys.modules:
        return
    from vllm.distributed import parallel_state

    if (
        parallel_state.model_parallel_is_initialized()
        and parallel_state.get_tensor_model_parallel_world_size() != tp
    ):
        parallel_state.destroy_model_parallel()


def wait_for(paths: list[str], timeout: float = 900) -> None:
    """Hold until every path exists (another launch's checkpoint or result, a file the test
    prepares)."""
    deadline = time.monotonic() + timeout
    while not all(Path(p).exists() for p in paths):
        if time.monotonic() > deadline:
            raise TimeoutError(f"waited {timeout} s for {paths}")
        time.sleep(0.2)


def run_phases(spec: dict) -> None:
    for name, cfg in spec["phases"].items():
        wait_for(cfg.get("wait_for", []))
        out = Path(spec["out"]) / name
        out.mkdir(parents=True, exist_ok=True)  # by every rank
        # what this phase would see and draw in a process of its own
        os.environ.clear()
        os.environ.update(FRESH_ENV)
        torch.set_rng_state(FRESH_RNG)
        if cfg.get("engine") == "vllm":
            vllm_layout(cfg.get("tp", 1))
        if "script" in cfg:  # another script's main(model, out) -> its result, as rank 0's
            script = importlib.import_module(cfg["script"])
            write_result(out, 0, script.main(cfg["model"], str(out)))
        else:
            main({**cfg, "out": str(out)})


if __name__ == "__main__":
    run_phases(json.loads(sys.argv[1]))
