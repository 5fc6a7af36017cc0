"""The data-parallel bookkeeping as pure functions: N simulated ranks in one process, no process
group."""

from __future__ import annotations

import pytest
import torch

from ragen_lightning.algos.losses import agg_normalizer, aggregate
from ragen_lightning.data.sampler import FilterSettings, filter_groups
from ragen_lightning.errors import ConfigError
from ragen_lightning.parallel import (
    check_strategy,
    check_tensor_parallel,
    concat_ranks,
    group_share,
    rank_rows,
    rollout_rank,
    tp_leaders,
)
from ragen_lightning.types import Trajectory


def test_group_share_is_contiguous_and_needs_divisibility():
    # 8 groups on 4 ranks: 2 each, rank r owns [2r, 2r + 2)
    assert [list(group_share(8, 4, r)) for r in range(4)] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert list(group_share(3, 1, 0)) == [0, 1, 2]
    with pytest.raises(
        ConfigError,
        match=r"--data.training.num_groups \(6\) must be divisible by the number of processes \(4\)",
    ):
        group_share(6, 4, 0)


def test_tensor_parallel_ranks_form_consecutive_groups_that_split_the_env_groups():
    # 4 ranks, TP 2: ranks 0, 1 are engine 0 and ranks 2, 3 engine 1 (vLLM's layout); 2
    # data-parallel rollout groups
    assert [rollout_rank(r, 4, 2) for r in range(4)] == [(0, 2), (0, 2), (1, 2), (1, 2)]
    # k = 1: the ranks
    assert [rollout_rank(r, 4, 1) for r in range(4)] == [(0, 4), (1, 4), (2, 4), (3, 4)]
    assert [rollout_rank(r, 4, 4) for r in range(4)] == [(0, 1)] * 4  # one engine over all ranks
    assert [rollout_rank(r, 6, 3) for r in range(6)] == [(0, 2)] * 3 + [(1, 2)] * 3
    # 8 env groups: both ranks of engine 0 run groups 0-3, both of engine 1 groups 4-7 (same seeds
    # per TP group)
    assert [list(group_share(8, *reversed(rollout_rank(r, 4, 2)))) for r in range(4)] == [
        [0, 1, 2, 3],
        [0, 1, 2, 3],
        [4, 5, 6, 7],
        [4, 5, 6, 7],
    ]
    # the gather keeps one copy per engine (ranks 0 and 2), in global group order
    assert tp_leaders(["e0", "e0'", "e1", "e1'"], 2) == ["e0", "e1"] and tp_leaders(
        [1, 2, 3], 1
    ) == [1, 2, 3]


@pytest.mark.parametrize("tp, size", [(3, 4), (2, 1), (4, 6)])
def test_tensor_parallel_size_must_divide_the_world(tp, size):
    with pytest.raises(
        ConfigError,
        match=rf"--data.engine.vllm.tensor_parallel_size \({tp}\) must divide the number of "
        rf"training processes \({size}\)",
    ):
        check_tensor_parallel(tp, size)
    with pytest.raises(ConfigError, match="--data.engine.vllm.tensor_parallel_size"):
        rollout_rank(0, size, tp)
    check_tensor_parallel(1, size)


def test_rank_rows_equal_counts_pad_short_shares():
    # a shuffled mini-batch of 5 rows on 2 ranks: ceil(5/2) = 3 each
    rows = torch.tensor([7, 3, 9, 1, 4])
    assert rank_rows(rows, 2, 0, pad_index=10).tolist() == [7, 3, 9]
    assert rank_rows(rows, 2, 1, pad_index=10).tolist() == [1, 4, 10]
    # fewer rows than ranks: rank 1 and 2 get only the pad row (same number of micro-batches,
    # nothing trained)
    assert [rank_rows(torch.tensor([5]), 3, r, pad_index=6).tolist() for r in range(3)] == [
        [5],
        [6],
        [6],
    ]
    # an empty mini-batch: nobody runs anything
    assert [
        rank_rows(torch.tensor([], dtype=torch.long), 2, r, pad_index=0).numel() for r in range(2)
    ] == [0, 0]


def _rollout(scores: list[list[float]], first_group: int = 0) -> list[Trajectory]:
    out = []
    for g, row in enumerate(scores):
        for m, s in enumerate(row):
            gid = first_group + g
            out.append(
                Trajectory(
                    env_index=gid * len(row) + m, group_id=gid, seed=100 + gid, turn_rewards=[s]
                )
            )
    return out


@pytest.mark.parametrize("world", [1, 2, 4])
def test_gathered_global_selection_equals_single_process_and_balances(world):
    # 4 groups x 2 samples; in-group reward std (group - member 0): g0 0, g1 0, g2 0.5/sqrt(2), g3
    # 1/sqrt(2)
    scores = [[1.0, 1.0], [0.0, 0.0], [0.0, 0.5], [0.0, 1.0]]
    # keeps only g3: every kept sample lives on the last rank
    config = FilterSettings(strategy="top_k_abs", value=1)
    single, kept_single, _ = filter_groups(_rollout(scores), 2, config)
    per_rank = []
    for r in range(world):  # each rank rolls out its share with global group ids
        share = group_share(4, world, r)
        per_rank.append(_rollout(scores[share.start : share.stop], first_group=share.start))
    gathered = concat_ranks(per_rank)
    kept, kept_ids, _ = filter_groups(gathered, 2, config)
    assert kept_ids.tolist() == kept_single.tolist() == [3]
    assert (
        [(t.group_id, t.env_index) for t in kept]
        == [(t.group_id, t.env_index) for t in single]
        == [(3, 6), (3, 7)]
    )
    # the 2 kept samples, one mini-batch: every rank gets ceil(2 / world) rows, each real row
    # exactly once
    rows = torch.arange(len(kept))
    shares = [rank_rows(rows, world, r, pad_index=len(kept)) for r in range(world)]
    assert {s.numel() for s in shares} == {-(-2 // world)}
    real = sorted(i for s in shares for i in s.tolist() if i != len(kept))
    assert real == [0, 1]


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean"])
def test_split_loss_times_world_averaged_equals_single_process_gradient(mode):
    """DDP/FSDP average gradients over ranks; each rank's loss uses the GLOBAL mini-batch normaliser
    times W."""
    torch.manual_seed(0)
    w = torch.randn(4, requires_grad=True)
    x = torch.randn(5, 3, 4)  # 5 samples x 3 tokens
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [1, 1, 1], [0, 1, 1], [1, 0, 0]], dtype=torch.bool)
    norm = agg_normalizer(mask, mode)  # token-mean: 9 tokens; seq-mean-token-mean: 5 sequences
    (g_single,) = torch.autograd.grad(aggregate((x @ w) ** 2, mask, mode, normalizer=norm), w)
    world, grads = 2, []
    for r in range(world):
        rows = rank_rows(torch.arange(5), world, r, pad_index=5)  # rank 1 gets [3, 4, pad]
        # the pad row has an all-zero mask
        m = torch.cat([mask, torch.zeros(1, 3, dtype=torch.bool)])[rows]
        xr = torch.cat([x, x[:1]])[rows]
        loss = aggregate((xr @ w) ** 2, m, mode, normalizer=norm) * world
        grads.append(torch.autograd.grad(loss, w)[0])
    torch.testing.assert_close(sum(grads) / world, g_single)
    # without the world-size factor the averaged gradient is half the single-process one
    torch.testing.assert_close(sum(grads) / world / world, g_single / 2)


def test_fsdp1_refused_without_cuda():
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: FSDP1 is allowed")
    for strategy in ("fsdp", {"class_path": "ragen_lightning.parallel.FSDP1Strategy"}):
        with pytest.raises(
            ConfigError, match=r"--trainer.strategy .* needs CUDA GPUs.*configs/fsdp.yaml"
        ):
            check_strategy(strategy, "gpu")
    check_strategy("ddp_find_unused_parameters_true", "cpu")  # fine
    # FSDP2 runs on CPU
    check_strategy({"class_path": "ragen_lightning.parallel.FSDP2Strategy"}, "cpu")


def test_fsdp2_takes_lora_and_qlora_but_refuses_a_shared_base():
    from ragen_lightning.models.lora import LoraSettings, as_settings
    from ragen_lightning.parallel import shard_networks

    fsdp2 = {"class_path": "ragen_lightning.parallel.FSDP2Strategy"}
    for lora in ({"rank": 8}, {"rank": 8, "quantization": "nf4"}, LoraSettings(rank=8)):
        # adapters and the (4-bit) base are sharded together
        check_strategy(fsdp2, "cpu", lora=lora)
    for lora in ({"rank": 8, "shared_base": True}, LoraSettings(shared_base=True)):
        with pytest.raises(
            ConfigError, match=r"^--model.lora.shared_base is not supported with FSDP2 .*or DDP"
        ):
            check_strategy(fsdp2, "cpu", lora=lora)
        # direct library use: the same refusal
        with pytest.raises(ConfigError, match="--model.lora.shared_base"):
            shard_networks([torch.nn.Linear(2, 2)], None, cuda=False, lora=as_settings(lora))
    # DDP takes it
    check_strategy("ddp_find_unused_parameters_true", "cpu", lora={"rank": 8, "shared_base": True})
