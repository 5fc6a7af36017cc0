"""Lightning strategies for sharded StarPO (FSDP2 through ``ModelParallelStrategy``, FSDP1) and
per-block sharding.

:class:`FSDP2Strategy` is Lightning's ``ModelParallelStrategy`` with data-parallel size = world size and tensor-parallel
size 1; :func:`shard_model` applies ``fully_shard`` per transformer block; :func:`check_strategy`
refuses combinations before Lightning's generic errors.
"""

from __future__ import annotations

import copy
import os
import shutil
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch.strategies import FSDPStrategy, ModelParallelStrategy

from ragen_lightning.errors import ConfigError
from ragen_lightning.parallel import checkpointing
from ragen_lightning.parallel.ranks import gather_objects


class FSDP2Strategy(ModelParallelStrategy):
    """Lightning's ``ModelParallelStrategy`` as plain FSDP2 data parallelism: a 1-D mesh over every
    process.

    ``ModelParallelStrategy``'s ``"auto"`` sizes mean data-parallel across nodes and tensor-parallel
    within a node; StarPO shards data only, so the data-parallel size is the world size and the
    tensor-parallel size 1, whatever ``--trainer.devices`` / ``--trainer.num_nodes`` are. The module
    shards actor, critic and reference per transformer block in ``configure_model``.

    Args:
        save_distributed_checkpoint: save a sharded checkpoint folder (one file per rank plus metadata; it resumes on
            any number of processes under this strategy); ``False`` gathers one full file on rank 0.
        process_group_backend: ``gloo`` on CPU, ``nccl`` on GPUs (default: chosen by Lightning).
    """

    def __init__(
        self, save_distributed_checkpoint: bool = True, process_group_backend: str | None = None
    ):
        super().__init__(
            data_parallel_size="auto",
            tensor_parallel_size=1,
            save_distributed_checkpoint=save_distributed_checkpoint,
            process_group_backend=process_group_backend,
        )

    def setup_environment(self) -> None:
        self._data_parallel_size = self.num_nodes * self.num_processes
        super().setup_environment()

    def save_checkpoint(
        self, checkpoint: dict[str, Any], filepath, storage_options: Any | None = None
    ) -> None:
        """A sharded checkpoint written atomically and digested: every rank writes into
        ``.<name>.<pid>.tmp``, rank 0 records every file's size and SHA-256
        (:func:`~ragen_lightning.parallel.checkpointing.write_folder_digest`) and swaps the finished
        folder in (:func:`~ragen_lightning.parallel.checkpointing.replace_path`): a crash or a full
        disk mid-save leaves the previous checkpoint of that name whole."""
        if (
            not self._save_distributed_checkpoint
            or storage_options is not None
            or "://" in str(filepath)
        ):
            return super().save_checkpoint(checkpoint, filepath, storage_options)
        path = Path(self.broadcast(str(filepath)))
        tmp = path.with_name(f".{path.name}.{self.broadcast(os.getpid())}.tmp")
        if self.global_rank == 0:
            path.parent.mkdir(parents=True, exist_ok=True)
            checkpointing.remove_stale_temps(path.parent)
            shutil.rmtree(tmp, ignore_errors=True)
        self.barrier("ragen_sharded_save_start")
        super().save_checkpoint(checkpoint, tmp)
        self.barrier("ragen_sharded_save_written")
        if self.global_rank == 0:
            checkpointing.write_folder_digest(tmp)
            checkpointing.replace_path(tmp, path)
        self.barrier("ragen_sharded_save_done")
        return None

    def load_checkpoint(self, checkpoint_path, weights_only: bool | None = None) -> dict[str, Any]:
        """Verify a sharded checkpoint's digest first (the ranks share the hashing; every rank
        raises the same one-line error naming the damaged file), then Lightning's load."""
        path = Path(self.broadcast(str(checkpoint_path)))
        problem = None
        try:
            if path.is_dir():
                checkpointing.verify_folder(path, self.global_rank, self.world_size)
            elif path.is_file():
                checkpointing.verify(path)
        except checkpointing.CheckpointError as exc:
            problem = str(exc)
        problems = [p for p in gather_objects(problem) if p]
        if problems:
            raise checkpointing.CheckpointError(problems[0])
        return super().load_checkpoint(path, weights_only=weights_only)


class FSDP1Strategy(FSDPStrategy):
    """Lightning's ``FSDPStrategy`` (torch FSDP1, CUDA only) wrapping every transformer block of the
    module's models.

    The wrap policy is built at setup from the classes the models' ``_no_split_modules`` name
    (decoder layers), so a YAML config needs no Python class objects. Gradient clipping uses the
    FSDP root's ``clip_grad_norm_``.

    Args:
        sharding_strategy: ``FULL_SHARD`` | ``SHARD_GRAD_OP`` | ``HYBRID_SHARD`` | ``NO_SHARD``.
        state_dict_type: ``sharded`` (a checkpoint folder, reshardable) or ``full`` (one file on
        rank 0).
    """

    def __init__(self, sharding_strategy: str = "FULL_SHARD", state_dict_type: str = "sharded"):
        super().__init__(
            sharding_strategy=sharding_strategy,
            state_dict_type=state_dict_type,
            use_orig_params=True,
        )

    def setup(self, trainer) -> None:  # pragma: no cover - needs CUDA
        from torch.distributed.fsdp.wrap import ModuleWrapPolicy

        if self.kwargs.get("auto_wrap_policy") is None:
            blocks = {type(m) for m in transformer_blocks(self.lightning_module)}
            if blocks:
                self.kwargs["auto_wrap_policy"] = ModuleWrapPolicy(blocks)
        super().setup(trainer)


_SHARED_BASE_UNDER_FSDP2 = (
    "--model.lora.shared_base is not supported with FSDP2 (configs/fsdp.yaml): the critic runs "
    "the actor's backbone without the actor's root module, whose sharded embeddings FSDP2 "
    "gathers only in the root's forward; use separate bases (shared_base false) or DDP "
    "(configs/ddp.yaml)"
)


def strategy_name(strategy: Any) -> str:
    """The class or registry name of a ``--trainer.strategy`` value (a name, a class_path dict or
    Namespace, or a Strategy instance), without its module path."""
    if isinstance(strategy, str):
        name = strategy
    elif isinstance(strategy, dict):
        name = strategy.get("class_path", "")
    else:  # a jsonargparse Namespace with class_path, or a Strategy instance
        name = getattr(strategy, "class_path", None) or type(strategy).__name__
    return str(name).split(".")[-1]


def check_strategy(
    strategy: Any, accelerator: Any, *, lora: Any = None, hardware: bool = True
) -> None:
    """Refuse what a strategy cannot run, naming the flag, before any process starts (Lightning
    would fail later with a generic error, or the module after the run's config and logs were
    written): FSDP1 without CUDA, and a shared LoRA base under FSDP2. (LoRA / QLoRA with separate
    bases and the vLLM engine run under FSDP2: adapters and the frozen, possibly 4-bit, base are
    sharded; each rank's engine receives the weights gathered from the shards.)

    Args:
        strategy: the ``--trainer.strategy`` value (a name, a class_path dict or Namespace, or a Strategy).
        accelerator: the ``--trainer.accelerator`` value.
        lora: the ``--model.lora`` value (None: full fine-tuning).
        hardware: also check what this machine lacks (CUDA); False when only parsing a config.
    """
    name = strategy_name(strategy)
    is_fsdp1 = name in ("fsdp", "FSDPStrategy", "FSDP1Strategy") or name.startswith("fsdp_")
    if hardware and is_fsdp1 and (str(accelerator) == "cpu" or not torch.cuda.is_available()):
        raise ConfigError(
            f"--trainer.strategy {name} (FSDP1, configs/fsdp1.yaml) needs CUDA GPUs "
            f"(--trainer.accelerator is {accelerator!r}, CUDA available: {torch.cuda.is_available()}); "
            "on CPU use configs/fsdp.yaml (FSDP2) or configs/ddp.yaml"
        )
    shared = (
        lora.get("shared_base") if isinstance(lora, dict) else getattr(lora, "shared_base", False)
    )
    if name in ("FSDP2Strategy", "ModelParallelStrategy") and shared:
        raise ConfigError(_SHARED_BASE_UNDER_FSDP2)


def transformer_blocks(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The repeated blocks of a transformers model (classes its ``_no_split_modules`` names, e.g.
    decoder layers)."""
    names: set[str] = set()
    for m in model.modules():
        names.update(getattr(m, "_no_split_modules", None) or [])
    return [m for m in model.modules() if type(m).__name__ in names]


def shard_model(model: torch.nn.Module, mesh, *, mixed_precision: bool) -> torch.nn.Module:
    """``fully_shard`` each transformer block of ``model``, then the model itself (embeddings, head,
    norm).

    Args:
        model: a transformers causal LM or a critic (backbone + value head).
        mesh: the 1-D data-parallel device mesh. mixed_precision: bf16 parameters for compute with
        fp32 gradient reduction (GPUs); fp32 otherwise.
    """
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    policy = (
        MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        if mixed_precision
        else MixedPrecisionPolicy()
    )
    for block in transformer_blocks(model):
        fully_shard(block, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)
    return model


def shard_networks(
    nets: list[torch.nn.Module | None],
    device_mesh,
    *,
    cuda: bool,
    lora: Any = None,
    rollout_copy: bool = True,
) -> list[torch.nn.Module]:
    """FSDP2: shard every network of ``nets`` per transformer block over the mesh's data-parallel
    dimension (bf16 compute on CUDA). Returns ``[copy]``, an unsharded, frozen copy of ``nets[0]``
    (the actor) for the HF rollout engine, or ``[]`` without ``rollout_copy`` (the vLLM engine holds
    its own full copy, pushed from the shards).

    Under LoRA (``lora``: the settings) the frozen base and the adapters of each block are sharded
    together, a 4-bit (nf4) base as its packed bytes (FSDP2 gathers them for each forward;
    bitsandbytes keeps the quantization constants on the layer, replicated); the reference (the
    adapter-disabled actor, a view without parameters of its own) is not sharded again. The
    adapters' random initialisation is first broadcast from rank 0: FSDP2, unlike DDP, keeps each
    rank's own values for its shard, so ranks that drew different adapters would train a mixture."""
    if getattr(lora, "shared_base", False):  # the CLI refuses it before launch (check_strategy)
        raise ConfigError(_SHARED_BASE_UNDER_FSDP2)
    if lora:
        nets = [net for net in nets if net is not None and any(True for _ in net.parameters())]
        broadcast_trainable_(nets)
    copies = [copy.deepcopy(nets[0]).eval().requires_grad_(False)] if rollout_copy else []
    for net in nets:
        if net is not None:
            shard_model(net, device_mesh["data_parallel"], mixed_precision=cuda)
    return copies


def broadcast_trainable_(nets: list[torch.nn.Module]) -> None:
    """Give every rank rank 0's values of the trainable parameters of ``nets`` (in place; nothing in
    one process)."""
    if (
        torch.distributed.is_available()
        and torch.distributed.is_initialized()
        and torch.distributed.get_world_size() > 1
    ):
        for net in nets:
            for p in net.parameters():
                if p.requires_grad:
                    torch.distributed.broadcast(p.data, src=0)
