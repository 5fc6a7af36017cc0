"""Task configs train one RL iteration on the Qwen2.5 stand-in (``--model.model tiny:qwen``):
Qwen2.5's tokenizer, chat template and 151,936-row vocabulary through rollout, update and
validation: SearchQA and WebShop acting through tool calls; bandit with the LoRA overlay, exported
and reloaded. ``tests/integration/standin_every_config.py`` runs every task config the same way (~25
s each; its table is in docs/hub-models.md).

The tool-call fits sample with the HF engine, the LoRA fit with the config's own (``auto``: vLLM
where installed). The engines are token-in/token-out: the tool calls are rendered into the prompt
ids and parsed from the sampled ids by the runner, the same for either, and vLLM on the stand-in is
test_qwen_standin_vllm.py's and test_qwen_standin_parity.py's; an in-process vLLM engine costs ~10 s
of CPU per fit (build and close), ~1/3 of one."""

from __future__ import annotations

import math

import pytest

from tests.integration.standin_every_config import run

pytestmark = pytest.mark.slow
TOOL_CALLS = ("--data.episode.action_format", "tool_call", "--data.engine.name", "hf")


@pytest.mark.parametrize(
    "task,more",
    [("searchqa", TOOL_CALLS), ("webshop", TOOL_CALLS)],
    ids=["searchqa-tool_call", "webshop-tool_call"],
)
def test_task_config_fit_on_the_qwen_standin(task, more):
    m = run(task, *more)
    assert m["vocab"] == 151936 and m["global_step"] >= 1, m
    assert m["rollout/generated_tokens"] > 0 and 0.0 <= m["train/format_error_rate"] <= 1.0
    assert math.isfinite(m["actor/pg_loss"]) and math.isfinite(m["actor/grad_norm"])
    assert 0.0 <= m["rollout/token_drift_rate"] <= 1.0 and 0.0 <= m["val/success"] <= 1.0
    # the runs offered the env's two tools (search/finish, search/click)
    assert m["tools"] == 2.0


def test_the_lora_overlay_fits_and_exports_the_standin(
    qwen_standin_path, qwen_standin_tokenizer, tmp_path
):
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from tests.integration.standin_every_config import ROOT

    exported = tmp_path / "exported"
    m = run(
        "bandit",
        "--config",
        str(ROOT / "configs" / "lora.yaml"),
        "--model.export_dir",
        str(exported),
        "--model.lora.export_merged",
        "true",
    )
    assert m["global_step"] >= 1 and math.isfinite(m["actor/pg_loss"])
    ids = torch.tensor(
        [qwen_standin_tokenizer.encode("<|im_start|>user\n你好 Left</answer><|im_end|>")]
    )
    with torch.no_grad():
        adapter = PeftModel.from_pretrained(
            AutoModelForCausalLM.from_pretrained(qwen_standin_path), exported
        )
        merged = AutoModelForCausalLM.from_pretrained(exported / "merged")
        base = AutoModelForCausalLM.from_pretrained(qwen_standin_path)
        a, merged_logits, b = (model(input_ids=ids).logits for model in (adapter, merged, base))
    assert a.shape == (1, ids.shape[1], 151936)
    # merged = base + the exported adapter
    torch.testing.assert_close(merged_logits, a, rtol=1e-4, atol=1e-4)
    assert not torch.allclose(a, b)  # the iteration moved the adapter (peft starts it at zero)
    for folder in (exported, exported / "merged"):
        tok = AutoTokenizer.from_pretrained(folder)
        assert len(tok) == 151665 and tok.chat_template == qwen_standin_tokenizer.chat_template
