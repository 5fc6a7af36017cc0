"""The vLLM engine on the ``tiny:qwen`` stand-in (Qwen2.5's tokenizer and 151,936-row vocabulary),
against the HF engine: stop strings that Qwen's BPE splits across tokens or ends inside one, greedy
ids, and the prefix cache across turns. One subprocess (``qwen_vllm_script.py``, ~30 s of CPU)
whose JSON result the tests below check."""

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

SCRIPT = Path(__file__).with_name("qwen_vllm_script.py")


@pytest.fixture(scope="module")
def result(qwen_standin_path, tmp_path_factory):
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=str(Path(__file__).parents[2]))
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), str(qwen_standin_path)],
        check=False,
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
        cwd=tmp_path_factory.mktemp("qwen-vllm"),
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT_JSON ")]
    assert proc.returncode == 0 and lines, proc.stderr[-4000:]
    return json.loads(lines[-1][len("RESULT_JSON ") :])


@pytest.mark.parametrize("case", ["split", "inside"])
def test_stop_strings_end_on_the_completing_token_in_vllm_as_in_hf(result, case):
    """vLLM samples "</" "answer" ">" (or ">\\n": "</answer>" then ends inside a token) in random order; with the stop
    string each request keeps exactly its free ids up to the one completing "</answer>", in vLLM and in the HF
    engine made to sample the same ids."""
    c = result["stop"][case]
    stopped = [k for k in c["reference_lengths"] if k is not None]
    assert len(stopped) >= 2 and len(stopped) < len(c["free"])  # both kinds of request occur
    for free, k, vl, hf, vf, hf_f in zip(
        c["free"], c["reference_lengths"], c["vllm"], c["hf"], c["vllm_finish"], c["hf_finish"]
    ):
        if k is None:
            assert vl == hf == free and vf == hf_f == "length"
        else:
            assert vl == hf == free[:k] and vf == hf_f == "stop"
            # "</" "answer" ">" / ">\n"
            assert free[k - 3 : k] == [522, 9217, 29 if case == "split" else 397]
    # the log-probs of the kept ids are unchanged
    for cut, free in zip(c["vllm_logprobs"], c["free_logprobs"]):
        assert cut == pytest.approx(free[: len(cut)], abs=1e-5)


def test_hf_and_vllm_agree_greedily_over_the_151936_row_vocabulary(result):
    g = result["greedy"]
    assert result["vocab_size"] == 151936 and result["sync"]["rollout/sync_tensors"] > 0
    assert g["vllm"] == g["hf"] and all(len(ids) == 12 for ids in g["hf"])
    for a, b in zip(g["hf_logprobs"], g["vllm_logprobs"]):
        assert max(abs(x - y) for x, y in zip(a, b)) < 1e-3


def test_prefix_cache_across_turns_changes_no_token(result):
    """Seeded sampling over 3 turns: with vLLM's prefix cache kept between turns and with it reset
    before each."""
    assert result["prefix_caching"]
    cached, reset = result["turns"]["cached"], result["turns"]["reset"]
    for turn_a, turn_b in zip(cached, reset):
        for (ids_a, lp_a), (ids_b, lp_b) in zip(turn_a, turn_b):
            assert ids_a == ids_b and lp_a == pytest.approx(lp_b, abs=1e-4)
    assert len(cached) == 3 and all(len(out[0]) > 0 for turn in cached for out in turn)
