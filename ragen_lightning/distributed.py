"""Data-parallel StarPO across processes (DDP, FSDP2, FSDP1 through Lightning): who rolls out what, who trains on what.

The scheme (DESIGN section 8.2, distributed-safe filtering):

1. **Rollout**: rank ``r`` of ``W`` runs the whole groups ``[r*G/W, (r+1)*G/W)`` with its own engine, keeping the
   global group ids, env indices and reset seeds, so N ranks see exactly the envs and generation seeds of 1 rank.
2. **Gather + filter**: every rank all-gathers the trajectories (rank-major order is the global group order), then
   runs the single-process filter and batch builder on the full list. Selection, score normalisation and the rollout
   metrics are therefore the single-process ones by construction, identical on every rank, with no per-rank kept set
   that could leave one rank with nothing to do.
3. **Update**: every mini-batch (the same global rows as one process) is split into ``W`` equal shares
   (:func:`rank_rows`); a short share is padded with a zero-mask row, so every rank runs the same number of
   micro-batches (forward/backward collectives never hang, even when a mini-batch has fewer rows than ranks). Losses
   keep the mini-batch's global normaliser and are multiplied by ``W`` because DDP and FSDP average gradients, so one
   data-parallel step equals the single-process step on the same batch.
4. **Scoring passes** (old log-probs, reference log-probs, values): each rank scores its share of rows (padded to equal
   counts), the results are summed across ranks (every row is filled by exactly one rank).

Also here: :class:`FSDP2Strategy` (Lightning's ``ModelParallelStrategy`` with data-parallel size = world size and
tensor-parallel size 1), :func:`shard_model` (``fully_shard`` per transformer block) and :class:`GatheredWeightsEngine`
(rollouts under FSDP2 from a full copy of the actor, refreshed from the shards before every rollout).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, TypeVar

import torch
from lightning.pytorch.strategies import FSDPStrategy, ModelParallelStrategy

from ragen_lightning.errors import ConfigError
from ragen_lightning.rollout.engine import HFEngine

T = TypeVar("T")


# -- pure helpers (unit-tested without processes) --------------------------------------------------------------------
def group_share(num_groups: int, world_size: int, rank: int) -> range:
    """The global group ids rank ``rank`` rolls out: ``[rank*G/W, (rank+1)*G/W)``.

    Raises:
        ConfigError: ``num_groups`` is not a multiple of the world size (whole groups per rank).
    """
    if num_groups % world_size:
        raise ConfigError(f"--data.num_groups ({num_groups}) must be divisible by the number of processes "
                          f"({world_size}): every rank runs whole env groups")
    per = num_groups // world_size
    return range(rank * per, (rank + 1) * per)


def concat_ranks(per_rank: Sequence[Sequence[T]]) -> list[T]:
    """The gathered per-rank lists in rank order (= global group order, see :func:`group_share`)."""
    return [x for part in per_rank for x in part]


def rank_rows(rows: torch.Tensor, world_size: int, rank: int, pad_index: int) -> torch.Tensor:
    """Rank ``rank``'s share of the row indices ``rows``, padded with ``pad_index`` to ``ceil(len(rows) / W)``.

    Shares are contiguous and differ by at most one real row, so every rank gets the same number of rows (and of
    micro-batches); ``pad_index`` names a row the caller makes inert (zero loss mask).
    """
    size = math.ceil(rows.numel() / world_size)
    share = torch.tensor_split(rows, world_size)[rank]
    if share.numel() < size:
        pad = torch.full((size - share.numel(),), pad_index, dtype=rows.dtype, device=rows.device)
        share = torch.cat([share, pad])
    return share


# -- process-group helpers (no-ops in one process) -------------------------------------------------------------------
def world() -> tuple[int, int]:
    """``(rank, world_size)`` of the default process group, ``(0, 1)`` without one."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return 0, 1


def gather_objects(obj: Any) -> list[Any]:
    """``all_gather_object``: every rank's ``obj``, in rank order (``[obj]`` in one process)."""
    size = world()[1]
    if size == 1:
        return [obj]
    out: list[Any] = [None] * size
    torch.distributed.all_gather_object(out, obj)
    return out


def all_reduce_(tensor: torch.Tensor, op: str = "sum") -> torch.Tensor:
    """In-place all-reduce (``sum`` | ``min`` | ``max``); nothing in one process."""
    if world()[1] > 1:
        ops = {"sum": torch.distributed.ReduceOp.SUM, "min": torch.distributed.ReduceOp.MIN,
               "max": torch.distributed.ReduceOp.MAX}
        torch.distributed.all_reduce(tensor, op=ops[op])
    return tensor


def full_tensor(t: torch.Tensor) -> torch.Tensor:
    """A DTensor's full value (collective); any other tensor unchanged."""
    from torch.distributed.tensor import DTensor

    return t.full_tensor() if isinstance(t, DTensor) else t


# -- FSDP2 ------------------------------------------------------------------------------------------------------------
class FSDP2Strategy(ModelParallelStrategy):
    """Lightning's ``ModelParallelStrategy`` as plain FSDP2 data parallelism: a 1-D mesh over every process.

    ``ModelParallelStrategy``'s ``"auto"`` sizes mean data-parallel across nodes and tensor-parallel within a node;
    StarPO shards data only, so the data-parallel size is the world size and the tensor-parallel size 1, whatever
    ``--trainer.devices`` / ``--trainer.num_nodes`` are. The module shards actor, critic and reference per
    transformer block in ``configure_model``.

    Args:
        save_distributed_checkpoint: save a sharded checkpoint folder (one file per rank plus metadata; it resumes on
            any number of processes under this strategy); ``False`` gathers one full file on rank 0.
        process_group_backend: ``gloo`` on CPU, ``nccl`` on GPUs (default: chosen by Lightning).
    """

    def __init__(self, save_distributed_checkpoint: bool = True, process_group_backend: str | None = None):
        super().__init__(data_parallel_size="auto", tensor_parallel_size=1,
                         save_distributed_checkpoint=save_distributed_checkpoint,
                         process_group_backend=process_group_backend)

    def setup_environment(self) -> None:
        self._data_parallel_size = self.num_nodes * self.num_processes
        super().setup_environment()


class FSDP1Strategy(FSDPStrategy):
    """Lightning's ``FSDPStrategy`` (torch FSDP1, CUDA only) wrapping every transformer block of the module's models.

    The wrap policy is built at setup from the classes the models' ``_no_split_modules`` name (decoder layers), so
    a YAML config needs no Python class objects. Gradient clipping uses the FSDP root's ``clip_grad_norm_``.

    Args:
        sharding_strategy: ``FULL_SHARD`` | ``SHARD_GRAD_OP`` | ``HYBRID_SHARD`` | ``NO_SHARD``.
        state_dict_type: ``sharded`` (a checkpoint folder, reshardable) or ``full`` (one file on rank 0).
    """

    def __init__(self, sharding_strategy: str = "FULL_SHARD", state_dict_type: str = "sharded"):
        super().__init__(sharding_strategy=sharding_strategy, state_dict_type=state_dict_type, use_orig_params=True)

    def setup(self, trainer) -> None:  # pragma: no cover - needs CUDA
        from torch.distributed.fsdp.wrap import ModuleWrapPolicy

        if self.kwargs.get("auto_wrap_policy") is None:
            blocks = {type(m) for m in transformer_blocks(self.lightning_module)}
            if blocks:
                self.kwargs["auto_wrap_policy"] = ModuleWrapPolicy(blocks)
        super().setup(trainer)


def check_strategy(strategy: Any, accelerator: Any) -> None:
    """Refuse FSDP1 without CUDA, naming the flag (Lightning would fail later with a generic error).

    Args:
        strategy: the ``--trainer.strategy`` value (a name, a class_path dict or a Strategy).
        accelerator: the ``--trainer.accelerator`` value.
    """
    if isinstance(strategy, str):
        name = strategy
    elif isinstance(strategy, dict):
        name = strategy.get("class_path", "")
    else:  # a jsonargparse Namespace with class_path, or a Strategy instance
        name = getattr(strategy, "class_path", None) or type(strategy).__name__
    is_fsdp1 = str(name).split(".")[-1] in ("fsdp", "FSDPStrategy", "FSDP1Strategy") or str(name).startswith("fsdp_")
    if is_fsdp1 and (str(accelerator) == "cpu" or not torch.cuda.is_available()):
        raise ConfigError(f"--trainer.strategy {name} (FSDP1, configs/fsdp1.yaml) needs CUDA GPUs "
                          f"(--trainer.accelerator is {accelerator!r}, CUDA available: {torch.cuda.is_available()}); "
                          "on CPU use configs/fsdp.yaml (FSDP2) or configs/ddp.yaml")


def transformer_blocks(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The repeated blocks of a transformers model (classes its ``_no_split_modules`` names, e.g. decoder layers)."""
    names: set[str] = set()
    for m in model.modules():
        names.update(getattr(m, "_no_split_modules", None) or [])
    return [m for m in model.modules() if type(m).__name__ in names]


def shard_model(model: torch.nn.Module, mesh, *, mixed_precision: bool) -> torch.nn.Module:
    """``fully_shard`` each transformer block of ``model``, then the model itself (embeddings, head, norm).

    Args:
        model: a transformers causal LM or a critic (backbone + value head).
        mesh: the 1-D data-parallel device mesh.
        mixed_precision: bf16 parameters for compute with fp32 gradient reduction (GPUs); fp32 otherwise.
    """
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if mixed_precision \
        else MixedPrecisionPolicy()
    for block in transformer_blocks(model):
        fully_shard(block, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)
    return model


class GatheredWeightsEngine(HFEngine):
    """HF generation from an unsharded copy of a sharded actor; ``sync_weights`` copies the full weights in.

    Under FSDP2 every forward of the sharded actor is a collective, and ranks generate different numbers of tokens,
    so rollouts must not run on the shards. ``sync_weights`` is itself collective (it gathers each parameter): the
    data module calls it on every rank at the start of every rollout.

    Args:
        sharded: the training actor (FSDP2-sharded).
        copy: a same-architecture, unsharded model on this rank's device.
        stop_token_ids, pad_token_id, max_batch_size: as :class:`~ragen_lightning.rollout.engine.HFEngine`.
    """

    def __init__(self, sharded: torch.nn.Module, copy: torch.nn.Module, stop_token_ids: Sequence[int],
                 pad_token_id: int, max_batch_size: int = 128):
        super().__init__(copy, stop_token_ids, pad_token_id, max_batch_size)
        self.sharded = sharded

    @torch.no_grad()
    def sync_weights(self) -> None:
        target = self.model.state_dict()
        for name, value in self.sharded.state_dict().items():
            target[name].copy_(full_tensor(value))
