"""Non-finite values never reach the weights: a step with a non-finite loss, gradient norm, learning
rate or result is not applied (weights and optimizer state exactly as before), counted, and too many
in a row stop the run; training at temperature 0 is refused (log-probs of logits / 0)."""

from __future__ import annotations

import math

import pytest
import torch

from ragen_lightning.errors import ConfigError, TrainingStopped
from ragen_lightning.starpo.module import StarPOModule
from ragen_lightning.starpo.optim import (
    MicroOutput,
    SkipGuard,
    StepContext,
    accumulate,
    guarded_step,
    learning_rate_problem,
    local_numel,
)
from ragen_lightning.starpo.scoring import MicroBatching

X = torch.tensor([[1.0, 1.0]])


def _linear(w=(1.0, 2.0)) -> torch.nn.Linear:
    net = torch.nn.Linear(2, 1, bias=False)
    with torch.no_grad():
        net.weight.copy_(torch.tensor([w]))
    return net


def _step(net, opt, loss_scale=1.0):
    # loss = scale * (w . x): the gradient is scale * x = [scale, scale]
    ctx = StepContext("actor", net, opt, MicroBatching(size=1))
    return accumulate(ctx, torch.arange(1), lambda rows: MicroOutput(loss_scale * net(X).sum()))


def test_inf_learning_rate_skips_the_step_and_leaves_everything_as_it_was():
    net = _linear()
    opt = torch.optim.AdamW(net.parameters(), lr=math.inf)
    result = _step(net, opt)
    assert not result.stepped and result.skip_reason == "non-finite learning rate (inf)"
    # AdamW never initialised its state
    assert net.weight.tolist() == [[1.0, 2.0]] and len(opt.state) == 0
    # the gradient itself was fine
    assert result.metrics["grad_norm"] == pytest.approx(math.sqrt(2))


def test_overflowing_step_is_rolled_back_weights_and_optimizer_state():
    net = _linear()
    opt = torch.optim.SGD(net.parameters(), lr=1e38, momentum=0.9)
    # gradient [4, 4]: 1 - 1e38 * 4 = -4e38, beyond float32's 3.4e38: -inf in both weights
    result = _step(net, opt, loss_scale=4.0)
    assert (
        not result.stepped and result.skip_reason == "non-finite weights after the step (restored)"
    )
    # no momentum buffer left behind
    assert net.weight.tolist() == [[1.0, 2.0]] and len(opt.state) == 0
    # the next step with a sane lr starts from scratch: buffer = grad = [1, 1], w = [1, 2] - 0.5 *
    # [1, 1]
    opt.param_groups[0]["lr"] = 0.5
    assert _step(net, opt).stepped
    assert net.weight.tolist() == [[0.5, 1.5]]
    assert opt.state[net.weight]["momentum_buffer"].tolist() == [[1.0, 1.0]]
    # (had the skipped step's buffer survived: buffer 0.9 * 1 + 1 = 1.9, w = [0.05, 1.05])


def test_rollback_restores_existing_optimizer_state_exactly():
    net = _linear()
    opt = torch.optim.SGD(net.parameters(), lr=0.5, momentum=0.9)
    assert _step(net, opt).stepped  # w = [0.5, 1.5], buffer [1, 1]
    # torch refuses -lr as a float32 alpha after updating the buffer
    opt.param_groups[0]["lr"] = 1e39
    result = _step(net, opt)
    assert result.skip_reason == (
        "optimizer step overflowed (value cannot be converted to type float without overflow)"
    )
    assert net.weight.tolist() == [[0.5, 1.5]]
    # not 0.9 * 1 + 1 = 1.9
    assert opt.state[net.weight]["momentum_buffer"].tolist() == [[1.0, 1.0]]


def test_non_finite_loss_and_gradient_are_skipped_with_their_reason():
    net = _linear((1.0, -1.0))
    opt = torch.optim.SGD(net.parameters(), lr=0.5)
    assert _step(net, opt, loss_scale=math.nan).skip_reason == "non-finite loss"
    # loss 3e38 * (1 - 1) = 0 and gradient [3e38, 3e38] are finite, the norm sqrt(2) * 3e38 = 4.2e38
    # overflows
    big = _step(net, opt, loss_scale=3e38)
    assert big.skip_reason == "non-finite gradient norm"
    assert net.weight.tolist() == [[1.0, -1.0]]


def test_guarded_step_applies_a_finite_step():
    net = _linear()
    opt = torch.optim.SGD(net.parameters(), lr=0.25)
    net(X).sum().backward()
    assert learning_rate_problem(opt) is None
    assert guarded_step(opt, list(net.parameters())) is None
    assert net.weight.tolist() == [[0.75, 1.75]]


def test_above_the_snapshot_limit_a_non_finite_result_stops_the_run():
    """No host copy for a large network: the checks before the step still skip an inf learning rate,
    and a finite but absurd one that overflows the weights stops the run instead of being undone."""
    net = _linear()
    opt = torch.optim.SGD(net.parameters(), lr=math.inf)
    net(X).sum().backward()  # gradient [1, 1]
    assert (
        guarded_step(opt, list(net.parameters()), snapshot_limit=0)
        == "non-finite learning rate (inf)"
    )
    assert net.weight.tolist() == [[1.0, 2.0]]
    opt.param_groups[0]["lr"] = 3e38
    net.weight.data.fill_(-3e38)  # -3e38 - 3e38 * 1 is -inf in float32
    with pytest.raises(TrainingStopped, match="^an optimizer step produced non-finite weights"):
        guarded_step(opt, list(net.parameters()), snapshot_limit=0)
    assert local_numel(opt) == 2  # the weight [1, 2]


def test_skip_guard_counts_and_stops_after_n_in_a_row_per_network():
    guard = SkipGuard(max_consecutive=3)
    guard.record("critic", False, "non-finite learning rate (inf)")
    guard.record("actor", True)  # the actor stepping does not reset the critic's count
    guard.record("critic", False, "non-finite learning rate (inf)")
    assert guard.total == 2 and guard.in_a_row == {"critic": 2, "actor": 0}
    with pytest.raises(TrainingStopped) as info:
        guard.record("critic", False, "non-finite learning rate (inf)")
    assert str(info.value) == (
        "3 critic optimizer steps in a row were skipped (non-finite learning rate (inf)); nothing non-finite reached "
        "the weights. Check --model.optim.critic_lr (or --model.optim.critic_optimizer), --model.optim.grad_clip and "
        "--data.sampling.temperature; --model.optim.max_consecutive_skips sets this limit"
    )
    guard = SkipGuard(max_consecutive=2)
    for stepped in (False, True, False, True, False):  # never two in a row
        guard.record("actor", stepped, "non-finite loss")
    assert guard.total == 3 and guard.in_a_row == {"actor": 1}
    never = SkipGuard(max_consecutive=0)
    for _ in range(50):
        never.record("actor", False, "non-finite loss")
    assert never.total == 50


def test_skip_guard_state_survives_a_checkpoint():
    guard = SkipGuard(max_consecutive=2)
    guard.record("critic", False, "x")
    restored = SkipGuard(max_consecutive=2)
    restored.load_state_dict(guard.state_dict())
    assert guard.state_dict() == {"skipped_steps": 1, "skips_in_a_row": {"critic": 1}}
    with pytest.raises(TrainingStopped, match="^2 critic optimizer steps in a row"):
        restored.record("critic", False, "x")


@pytest.mark.parametrize("temperature", [0.0, -1.0, math.nan, math.inf])
def test_training_temperature_must_be_positive_and_finite(temperature):
    with pytest.raises(ConfigError) as info:
        StarPOModule(temperature=temperature)
    message = str(info.value)
    assert message.startswith(
        f"--data.sampling.temperature must be a number > 0 for training rollouts, got {temperature}"
    )
    assert "--data.validation.temperature 0" in message and "\n" not in message


@pytest.mark.parametrize("value", [-1, 1.5, True])
def test_max_consecutive_skips_domain(value):
    with pytest.raises(
        ConfigError, match=r"^--model\.optim\.max_consecutive_skips must be an integer >= 0, got "
    ):
        StarPOModule(optim={"max_consecutive_skips": value})
