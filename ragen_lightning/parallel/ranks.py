"""Data-parallel StarPO across processes (DDP, FSDP2, FSDP1 through Lightning): who rolls out what,
who trains on what.

The scheme (DESIGN section 8.2, distributed-safe filtering):

1. **Rollout**: rank ``r`` of ``W`` runs the whole groups ``[r*G/W, (r+1)*G/W)`` with its own
   engine, keeping the global group ids, env indices and reset seeds, so N ranks see exactly the
   envs and generation seeds of 1 rank. With a tensor-parallel vLLM engine over ``k`` ranks
   (``--data.engine.vllm.tensor_parallel_size``) the ``W / k`` TP groups of consecutive ranks take
   the place of ranks: every rank of a group runs the group's share, one worker of the same engine
   each, and the gather keeps one copy per group (:func:`rollout_rank`, :func:`tp_leaders`).
2. **Gather + filter**: every rank all-gathers the trajectories (rank-major order is the global
   group order), then runs the single-process filter and batch builder on the full list. Selection,
   score normalisation and the rollout metrics are therefore the single-process ones by
   construction, identical on every rank, with no per-rank kept set that could leave one rank with
   nothing to do.
3. **Update**: every mini-batch (the same global rows as one process) is split into ``W`` equal
   shares (:func:`rank_rows`); a short share is padded with a zero-mask row, so every rank runs the
   same number of micro-batches (forward/backward collectives never hang, even when a mini-batch has
   fewer rows than ranks). Losses keep the mini-batch's global normaliser and are multiplied by
   ``W`` because DDP and FSDP average gradients, so one data-parallel step equals the single-process
   step on the same batch.
4. **Scoring passes** (old log-probs, reference log-probs, values): each rank scores its share of
   rows (padded to equal counts), the results are summed across ranks (every row is filled by
   exactly one rank).

The strategies and sharding live in :mod:`ragen_lightning.parallel.strategies`; rollouts under FSDP2
from a full copy of the actor are :class:`ragen_lightning.rollout.engines.GatheredWeightsEngine`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, TypeVar

import torch

from ragen_lightning.errors import ConfigError

T = TypeVar("T")


# -- pure helpers (unit-tested without processes) --------------------------------------------------
def group_share(num_groups: int, world_size: int, rank: int) -> range:
    """The global group ids rank ``rank`` rolls out: ``[rank*G/W, (rank+1)*G/W)``.

    Raises:
        ConfigError: ``num_groups`` is not a multiple of the world size (whole groups per rank).
    """
    if num_groups % world_size:
        raise ConfigError(
            f"--data.training.num_groups ({num_groups}) must be divisible by the number of processes "
            f"({world_size}): every rank runs whole env groups"
        )
    per = num_groups // world_size
    return range(rank * per, (rank + 1) * per)


def rollout_rank(rank: int, world_size: int, tensor_parallel_size: int = 1) -> tuple[int, int]:
    """``(data-parallel rank, data-parallel size)`` of rollouts when a vLLM engine is
    tensor-parallel over ``tensor_parallel_size`` = ``k`` training ranks (``external_launcher``):
    ranks ``[d*k, (d+1)*k)`` form TP group ``d`` (vLLM's layout: consecutive ranks), every rank of
    it is one worker of the same engine and feeds it the same prompts and seeds; the ``W / k``
    groups split the env groups (:func:`group_share` with ``W / k``). ``k = 1``: ``(rank, W)``.

    Raises:
        ConfigError: ``k`` does not divide the world size (:func:`check_tensor_parallel`).
    """
    check_tensor_parallel(tensor_parallel_size, world_size)
    return rank // tensor_parallel_size, world_size // tensor_parallel_size


def check_tensor_parallel(tensor_parallel_size: int, world_size: int) -> None:
    """A tensor-parallel vLLM engine takes ``k`` training processes per engine: ``k`` must divide
    the world size (a single process cannot push tensors into vLLM's own worker processes, so ``k >
    1`` needs ``k`` ranks)."""
    if world_size % tensor_parallel_size:
        raise ConfigError(
            f"--data.engine.vllm.tensor_parallel_size ({tensor_parallel_size}) must divide the number of training processes "
            f"({world_size}): each process is one worker of a tensor-parallel vLLM engine spread over "
            f"{tensor_parallel_size} consecutive ranks (external_launcher)"
        )


def tp_leaders(per_rank: Sequence[T], tensor_parallel_size: int) -> list[T]:
    """One entry per TP group of a gathered per-rank list (its first rank's, rank ``d*k``): the
    ranks of one group hold the same rollouts."""
    return list(per_rank[::tensor_parallel_size])


def concat_ranks(per_rank: Sequence[Sequence[T]]) -> list[T]:
    """The gathered per-rank lists in rank order (= global group order, see :func:`group_share`)."""
    return [x for part in per_rank for x in part]


def rank_rows(rows: torch.Tensor, world_size: int, rank: int, pad_index: int) -> torch.Tensor:
    """Rank ``rank``'s share of the row indices ``rows``, padded with ``pad_index`` to
    ``ceil(len(rows) / W)``.

    Shares are contiguous and differ by at most one real row, so every rank gets the same number of
    rows (and of micro-batches); ``pad_index`` names a row the caller makes inert (zero loss mask).
    """
    size = math.ceil(rows.numel() / world_size)
    share = torch.tensor_split(rows, world_size)[rank]
    if share.numel() < size:
        pad = torch.full((size - share.numel(),), pad_index, dtype=rows.dtype, device=rows.device)
        share = torch.cat([share, pad])
    return share


# -- process-group helpers (no-ops in one process) -------------------------------------------------
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
        ops = {
            "sum": torch.distributed.ReduceOp.SUM,
            "min": torch.distributed.ReduceOp.MIN,
            "max": torch.distributed.ReduceOp.MAX,
        }
        torch.distributed.all_reduce(tensor, op=ops[op])
    return tensor


def full_tensor(t: torch.Tensor) -> torch.Tensor:
    """A DTensor's full value (collective); any other tensor unchanged."""
    from torch.distributed.tensor import DTensor

    return t.full_tensor() if isinstance(t, DTensor) else t


def is_sharded(model: torch.nn.Module) -> bool:
    """Whether ``model`` holds DTensor parameters (FSDP2 shards)."""
    from torch.distributed.tensor import DTensor

    return any(isinstance(p, DTensor) for p in model.parameters())


def compute_dtype(model: torch.nn.Module) -> torch.dtype:
    """The dtype ``model``'s forward computes in: an FSDP2 mixed-precision policy's ``param_dtype``
    when it has one (bf16 on GPUs, :func:`~ragen_lightning.parallel.strategies.shard_model`), else
    its parameters' dtype."""
    # FSDP2 keeps its policy on the module's state (no public getter)
    state = getattr(model, "_get_fsdp_state", None)
    policy = getattr(state(), "_mp_policy", None) if callable(state) else None
    return getattr(policy, "param_dtype", None) or next(model.parameters()).dtype


def stream_full_tensors(
    named: Iterable[tuple[str, torch.Tensor]],
) -> Iterator[tuple[str, torch.Tensor]]:
    """``(name, full value)`` pairs of ``named`` (e.g. a sharded ``state_dict().items()``), gathered
    one at a time.

    A shard is gathered only when the consumer asks for the next pair and the generator keeps no
    reference to what it yielded, so a consumer that copies each tensor and lets it go holds at most
    one gathered tensor at a time: the extra peak memory is about the largest parameter (with the
    collective's buffers), never a second full copy of the model. Collective for DTensors: every
    rank must consume the same names in the same order, to the end.
    """
    for name, value in named:
        yield name, full_tensor(value.detach())
