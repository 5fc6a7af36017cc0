"""Data parallelism: which rank rolls out and trains on what (:mod:`.ranks`); strategies and
sharding (:mod:`.strategies`)."""

from ragen_lightning.parallel.ranks import (
    all_reduce_,
    check_tensor_parallel,
    concat_ranks,
    full_tensor,
    gather_objects,
    group_share,
    rank_rows,
    rollout_rank,
    tp_leaders,
    world,
)
from ragen_lightning.parallel.strategies import (
    FSDP1Strategy,
    FSDP2Strategy,
    check_strategy,
    shard_model,
    shard_networks,
    transformer_blocks,
)

__all__ = [
    "FSDP1Strategy",
    "FSDP2Strategy",
    "all_reduce_",
    "check_strategy",
    "check_tensor_parallel",
    "concat_ranks",
    "full_tensor",
    "gather_objects",
    "group_share",
    "rank_rows",
    "rollout_rank",
    "shard_model",
    "shard_networks",
    "tp_leaders",
    "transformer_blocks",
    "world",
]
