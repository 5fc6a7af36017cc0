"""The actor step's trust region (``--model.optim.max_step_kl``): a step whose KL on its own rows
exceeds the limit is undone (weights and optimizer state exactly as before, counted as a skip), the
KL is the k3 mean over the step's trained tokens, and the flag reaches the actor step through
``ppo_update``."""

from __future__ import annotations

import math

import pytest
import torch

from ragen_lightning.errors import ConfigError, TrainingStopped
from ragen_lightning.starpo.optim import MicroOutput, SkipGuard, StepContext, accumulate
from ragen_lightning.starpo.ppo import ppo_update, step_kl
from ragen_lightning.starpo.scoring import ForwardSettings, MicroBatching, actor_outputs
from ragen_lightning.starpo.settings import ModuleSettings, OptimSettings
from ragen_lightning.types import UpdateBatch

X = torch.tensor([[1.0, 1.0]])


@pytest.fixture
def tiny_model(tiny_path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_path).float()


def _linear():
    net = torch.nn.Linear(2, 1, bias=False)
    with torch.no_grad():
        net.weight.copy_(torch.tensor([[1.0, 2.0]]))
    return net


def _accumulate(net, opt, check):
    # loss = w . x, gradient [1, 1]; the probe is the output before the step
    ctx = StepContext("actor", net, opt, MicroBatching(size=1))
    return accumulate(
        ctx,
        torch.arange(1),
        lambda rows: MicroOutput(net(X).sum(), probe=net(X).detach()),
        check=check,
    )


def test_a_rejected_step_is_undone_with_its_optimizer_state_and_the_value_is_logged():
    net = _linear()
    opt = torch.optim.AdamW(net.parameters(), lr=0.1, weight_decay=0.0)
    seen = []

    # the change of the probed output: 3 before, 3 - 0.2 after one Adam step of 0.1 per weight
    def check(probes):
        ((rows, before),) = probes
        seen.append((rows.tolist(), float(before)))
        change = float(net(X).detach()) - float(before)
        return abs(change), ("too far" if abs(change) > 0.15 else None)

    result = _accumulate(net, opt, check)
    assert seen == [([0], 3.0)]
    assert not result.stepped and result.skip_reason == "too far (restored)"
    assert result.metrics["step_kl"] == pytest.approx(0.2, abs=1e-6)
    # Adam's moments never started
    assert net.weight.tolist() == [[1.0, 2.0]] and len(opt.state) == 0
    opt.param_groups[0]["lr"] = 0.05  # 0.1 of change: inside the limit, applied
    result = _accumulate(net, opt, check)
    assert result.stepped and result.metrics["step_kl"] == pytest.approx(0.1, abs=1e-6)
    assert (
        net.weight.tolist() == [[pytest.approx(0.95), pytest.approx(1.95)]]
        and int(opt.state[net.weight]["step"]) == 1
    )


def test_without_the_check_nothing_is_measured():
    net = _linear()
    result = _accumulate(net, torch.optim.SGD(net.parameters(), lr=0.1), None)
    assert result.stepped and "step_kl" not in result.metrics


def _batch(tiny_model):
    torch.manual_seed(0)
    ids = torch.randint(3, 200, (3, 7))
    mask = torch.zeros(3, 6, dtype=torch.bool)
    mask[:, 3:] = True
    mask[2, 5] = False  # a row with one token fewer
    zeros = torch.zeros(3, 6)
    return UpdateBatch(
        ids,
        torch.ones_like(ids),
        mask,
        advantages=torch.tensor([[1.0], [-1.0], [0.5]]).expand(3, 6),
        engine_logprobs=zeros,
    )


def _settings(limit):
    return ModuleSettings.build(
        loss={"entropy_coeff": 0.0, "dual_clip": None},
        optim={"max_step_kl": limit},
        update={"mini_batch_size": 3, "micro_batch_size": 2},
    )


@torch.no_grad()
def test_step_kl_is_the_k3_mean_over_the_trained_tokens(tiny_model):
    data = _batch(tiny_model)
    before, _ = actor_outputs(tiny_model, data.input_ids, data.attention_mask, with_entropy=False)
    tiny_model.lm_head.weight.mul_(1.3)  # tied with the embeddings: every log-prob moves
    after, _ = actor_outputs(tiny_model, data.input_ids, data.attention_mask, with_entropy=False)
    d = (after - before)[data.loss_mask]
    expected = float((d.exp() - d - 1).mean())  # 3 + 3 + 2 tokens
    assert d.numel() == 8 and expected > 0
    rows = [torch.tensor([0, 1]), torch.tensor([2])]  # two micro-batches
    probes = [(r, before[r].detach()) for r in rows]
    kl, reason = step_kl(tiny_model, data, ForwardSettings(), expected * 2, probes)
    assert kl == pytest.approx(expected, rel=1e-5) and reason is None
    kl, reason = step_kl(tiny_model, data, ForwardSettings(), expected / 2, probes)
    assert reason == f"step KL {kl:.4g} > --model.optim.max_step_kl {expected / 2:g}"


@pytest.mark.parametrize("limit", [None, 1e-12])
def test_ppo_update_guards_the_actor_step_only_when_set(tiny_model, limit):
    data = _batch(tiny_model)
    start = {k: v.clone() for k, v in tiny_model.state_dict().items()}
    opt = torch.optim.AdamW(tiny_model.parameters(), lr=1e-2)
    actor = StepContext("actor", tiny_model, opt, MicroBatching(size=2), grad_clip=1.0)
    logs, _ = ppo_update(data, _settings(limit), actor=actor, critic=None, iteration=0)
    moved = any(not torch.equal(v, tiny_model.state_dict()[k]) for k, v in start.items())
    if limit is None:
        assert moved and "actor/step_kl" not in logs
    else:  # any change at all exceeds 1e-12: undone
        assert not moved and logs["actor/step_kl"] > 1e-12 and math.isfinite(logs["actor/step_kl"])


@pytest.mark.parametrize("value", [0.0, -0.1, math.inf, math.nan])
def test_max_step_kl_domain(value):
    with pytest.raises(ConfigError, match=r"--model\.optim\.max_step_kl"):
        OptimSettings(max_step_kl=value)
    assert (
        OptimSettings(max_step_kl=None).max_step_kl is None
        and OptimSettings(max_step_kl=0.01).max_step_kl == 0.01
    )


def test_steps_undone_by_the_trust_region_stop_the_run_with_their_own_advice():
    guard = SkipGuard(max_consecutive=2)
    guard.record("actor", False, "step KL 2.9 > --model.optim.max_step_kl 0.01 (restored)")
    with pytest.raises(
        TrainingStopped,
        match=r"2 actor optimizer steps in a row were skipped \(step KL 3.1 > "
        r"--model.optim.max_step_kl 0.01 \(restored\)\); every step was undone: a smaller "
        r"--model.optim.actor_lr takes smaller steps, a larger --model.optim.max_step_kl allows larger ones",
    ):
        guard.record("actor", False, "step KL 3.1 > --model.optim.max_step_kl 0.01 (restored)")
