"""Task configs train one RL iteration on the Qwen2.5 stand-in (``--model.model tiny:qwen``): Qwen2.5's tokenizer,
chat template and 151,936-row vocabulary through rollout, update and validation; SearchQA and WebShop acting through
tool calls. ``tests/integration/standin_every_config.py`` runs every task config the same way (~25 s each; its table
is in docs/hub-models.md); the suite runs these three."""

from __future__ import annotations

import math

import pytest

from tests.integration.standin_every_config import run

pytestmark = pytest.mark.slow
TOOL_CALLS = ("--data.episode.action_format", "tool_call")


@pytest.mark.parametrize("task,more", [("bandit", ()), ("searchqa", TOOL_CALLS), ("webshop", TOOL_CALLS)],
                         ids=["bandit", "searchqa-tool_call", "webshop-tool_call"])
def test_task_config_fit_on_the_qwen_standin(task, more):
    m = run(task, *more)
    assert m["vocab"] == 151936 and m["global_step"] >= 1, m
    assert m["rollout/generated_tokens"] > 0 and 0.0 <= m["train/format_error_rate"] <= 1.0
    assert math.isfinite(m["actor/pg_loss"]) and math.isfinite(m["actor/grad_norm"])
    assert 0.0 <= m["rollout/token_drift_rate"] <= 1.0 and 0.0 <= m["val/success"] <= 1.0
    # the tool-call runs offered the env's two tools (search/finish, search/click); the text run none
    assert m["tools"] == (2.0 if more else 0.0)
