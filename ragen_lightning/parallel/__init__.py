"""Data parallelism: which rank rolls out and trains on what (:mod:`.ranks`); strategies and sharding
(:mod:`.strategies`)."""

from ragen_lightning.parallel.ranks import (
    all_reduce_,
    concat_ranks,
    full_tensor,
    gather_objects,
    group_share,
    rank_rows,
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

__all__ = ["FSDP1Strategy", "FSDP2Strategy", "all_reduce_", "check_strategy", "concat_ranks", "full_tensor",
           "gather_objects", "group_share", "rank_rows", "shard_model", "shard_networks", "transformer_blocks", "world"]
