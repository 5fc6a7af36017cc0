"""Two CPU processes (gloo) under torchrun equal one process: DDP with an uneven filter (GAE and
GRPO), DDP over an environment mixture, FSDP2 with asynchronous rollouts.

Every run is a phase of ``tests/integration/dist_worker.py``: the 2-rank runs in one launch, their
single-process references in another beside it (``dist_launch.py``), so the module pays the start-up
of three processes, not three per test. Every rank writes its full parameters and logged metrics,
compared here. The filter keeps fewer groups than there are ranks (``top_k_abs``), so the kept set
is uneven across the ranks that rolled the groups out, and a mini-batch can leave a rank with only
padding.
"""

from __future__ import annotations

import pytest
import torch

from tests.integration.dist_launch import Launch, assert_same, initial, results

pytestmark = pytest.mark.slow

ESTIMATORS = ["gae", "grpo"]
# 3 + 1 groups of 3: rank 0 runs groups 0-1 (entry a), rank 1 group 2 (entry a) and group 3 (entry
# b)
MIXTURE = [
    {"env_id": "ragen/Bandit-v0", "tag": "a", "num_groups": 3},
    {"env_id": "ragen/BanditTest-v0", "tag": "b", "num_groups": 1},
]


def configs(model: str) -> dict[str, dict]:
    """Each comparison's settings, run once on 2 ranks and once on one process."""
    return {
        # 4 groups x 3; the filter keeps 1 group, which one rank rolled out (uneven kept set).
        # Mini-batches of 2 over the 3 kept samples: [0, 1] -> one row per rank; [2] -> rank 1 gets
        # only the pad row.
        **{
            estimator: {"iterations": 2, "top_k_abs": 1, "estimator": estimator, "mini": 2}
            for estimator in ESTIMATORS
        },
        "mixture": {
            "iterations": 2,
            "top_k_abs": 2,
            "estimator": "gae",
            "mini": 3,
            "mixture": MIXTURE,
        },
        "async": {
            "iterations": 3,
            "top_k_abs": 2,
            "estimator": "grpo",
            "mini": 6,
            "micro": 3,
            "engine": "hf",
            "async": True,
        },
    }


@pytest.fixture(scope="module")
def runs(tmp_path_factory, tiny_path):
    """``{name: (single-process result, 2-rank results)}`` for every entry of :func:`configs`;
    DDP on 2 ranks, FSDP2 for the asynchronous run."""
    root, cfgs = tmp_path_factory.mktemp("dist"), configs(str(tiny_path))
    two = {
        name: {**cfg, "model": str(tiny_path), "strategy": "fsdp" if name == "async" else "ddp"}
        for name, cfg in cfgs.items()
    }
    one = {
        name: {**cfg, "model": str(tiny_path), "strategy": "single"} for name, cfg in cfgs.items()
    }
    with Launch(root / "2", 2, two) as two_ranks, Launch(root / "1", 1, one) as one_process:
        singles, ranks = results(one_process, one), results(two_ranks, two)
    return {name: (singles[name][0], ranks[name]) for name in cfgs}


@pytest.mark.parametrize("estimator", ESTIMATORS)
def test_ddp_two_ranks_equal_single_process_with_uneven_filter(runs, tiny_path, estimator):
    (single, p1), [(j0, p0), (j1, p1r)] = runs[estimator]
    assert_same(p0, p1r, atol=0)  # DDP replicas stay identical
    assert_same(p0, p1, atol=1e-6)  # and equal the one-process update on the same global batch
    # the same global selection
    assert j0["kept"] == single["kept"] and all(len(k) == 1 for k in single["kept"])
    # 2 iterations x 2 mini-batches x (critic + actor | actor)
    assert j0["global_step"] == single["global_step"] == (8 if estimator == "gae" else 4)
    keys = [
        "actor/pg_loss",
        "actor/entropy",
        "actor/grad_norm",
        "train/score",
        "rollout/filter_kept_count",
        "train/batch_size",
        "train/advantage_mean",
    ] + (["critic/vf_loss"] if estimator == "gae" else [])
    for key in keys:
        assert j0["metrics"][-1][key] == pytest.approx(single["metrics"][-1][key], abs=1e-5), key
        # every rank logs the global value
        assert j1["metrics"][-1][key] == j0["metrics"][-1][key], key
    # the update did something
    assert any(not torch.equal(p0[k], v) for k, v in initial(tiny_path).items())


def test_ddp_mixture_equals_single_process(runs):
    """An environment mixture under DDP: the ranks split the concatenated groups of all entries
    (one rank runs the end of one entry and the start of the next) and the gathered batch,
    selection, per-tag metrics and update equal those of one process."""
    (single, p_single), [(j0, p0), (j1, p1)] = runs["mixture"]
    assert_same(p0, p1, atol=0)
    assert_same(p0, p_single, atol=1e-6)
    assert j0["kept"] == j1["kept"] == single["kept"] and all(len(k) == 2 for k in single["kept"])
    assert j0["state"] == single["state"] == {"iteration": 2, "consecutive_empty": 0}
    keys = [
        "train/a/success",
        "train/a/score",
        "train/b/success",
        "train/b/pass@3",
        "train/score",
        "rollout/filter_kept_count",
        "actor/pg_loss",
        "critic/vf_loss",
    ]
    for key in keys:
        for it in (0, 1):
            assert j0["metrics"][it][key] == pytest.approx(single["metrics"][it][key], abs=1e-5), (
                key,
                it,
            )
            assert j1["metrics"][it][key] == j0["metrics"][it][key], (key, it)


def test_async_rollouts_under_fsdp2_equal_one_async_process(runs):
    """``--data.training.async_level 1`` on 2 FSDP2 ranks: each rank generates its share of the next
    rollout on its worker (from the unsharded copy, synced from the shards on the training thread),
    the trajectories are gathered on the training thread; the kept groups and the weights equal one
    async process."""
    (single, p_single), [(j0, p0), (j1, p1)] = runs["async"]
    for run_ in (single, j0, j1):  # batches 2 and 3: one update old
        assert [m["rollout/staleness"] for m in run_["metrics"]] == [0.0, 1.0, 1.0]
    assert j0["kept"] == j1["kept"] == single["kept"] and len(single["kept"]) == 3
    assert_same(p0, p1, atol=0)
    assert_same(p0, p_single, atol=1e-5)
    for key in ("train/score", "actor/pg_loss", "rollout/engine_logprob_abs_diff"):
        assert j0["metrics"][-1][key] == pytest.approx(single["metrics"][-1][key], abs=1e-5), key
