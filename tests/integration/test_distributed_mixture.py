"""An environment mixture under DDP (2 gloo processes): the ranks split the concatenated groups of
all entries (one rank runs the end of one entry and the start of the next) and the gathered batch,
selection, per-tag metrics and update equal those of one process."""

from __future__ import annotations

import pytest

from tests.integration.test_distributed import assert_same, run

pytestmark = pytest.mark.slow

# 3 + 1 groups of 3: rank 0 runs groups 0-1 (entry a), rank 1 group 2 (entry a) and group 3 (entry
# b)
MIXTURE = [
    {"env_id": "ragen/Bandit-v0", "tag": "a", "num_groups": 3},
    {"env_id": "ragen/BanditTest-v0", "tag": "b", "num_groups": 1},
]


def test_ddp_mixture_equals_single_process(tmp_path, tiny_path):
    cfg = {
        "model": str(tiny_path),
        "iterations": 2,
        "top_k_abs": 2,
        "estimator": "gae",
        "mini": 3,
        "mixture": MIXTURE,
    }
    [(single, p_single)] = run(tmp_path, "single", 1, strategy="single", **cfg)
    (j0, p0), (j1, p1) = run(tmp_path, "ddp", 2, strategy="ddp", **cfg)
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
