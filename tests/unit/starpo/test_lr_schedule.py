"""LRSchedule: warm-up per optimizer step times a cosine decay per iteration, applied at each
iteration's start."""

from __future__ import annotations

import math

import pytest
import torch

from ragen_lightning.starpo.optim import LRSchedule, build_optimizers, scheduler_of, start_iteration


def test_multiplier_by_hand():
    decay = LRSchedule(decay_iterations=4)
    # held at 10 %
    assert [decay(0) for decay.iteration in (0, 2, 4, 9)] == pytest.approx([1.0, 0.55, 0.1, 0.1])
    decay.iteration = 1  # 0.1 + 0.9 * (1 + cos(pi / 4)) / 2
    assert decay(7) == pytest.approx(0.1 + 0.45 * (1 + math.cos(math.pi / 4)))
    both = LRSchedule(warmup_steps=4, decay_iterations=4, iteration=2)
    assert [both(k) for k in (0, 1, 3, 10)] == pytest.approx([0.25 * 0.55, 0.5 * 0.55, 0.55, 0.55])
    assert LRSchedule(warmup_steps=2)(0) == 0.5 and not LRSchedule().active


def test_start_iteration_applies_the_decay_before_the_first_step():
    actor, critic = [torch.nn.Parameter(torch.zeros(2))], [torch.nn.Parameter(torch.zeros(2))]
    opts, scheds = build_optimizers(
        actor,
        critic,
        actor_factory=None,
        critic_factory=None,
        actor_lr=1e-3,
        critic_lr=2e-3,
        weight_decay=0.0,
        with_critic=True,
        schedule=LRSchedule(warmup_steps=2, decay_iterations=4),
    )
    # warm-up step 0, iteration 0
    assert [o.param_groups[0]["lr"] for o in opts] == pytest.approx([0.5e-3, 1e-3])
    opts[0].step()
    scheduler_of(scheds, opts[0]).step()  # the actor's step 1: warm-up done; not the critic's
    assert [o.param_groups[0]["lr"] for o in opts] == pytest.approx([1e-3, 1e-3])
    start_iteration(scheds, 2)  # cosine at 2 of 4: 0.55
    assert [o.param_groups[0]["lr"] for o in opts] == pytest.approx([0.55e-3, 0.5 * 0.55 * 2e-3])
    assert scheds[0].get_last_lr() == pytest.approx([0.55e-3])
    # a resumed run: the scheduler's state carries its step count; the iteration is set again at the
    # next start
    fresh_opts, fresh = build_optimizers(
        actor,
        critic,
        actor_factory=None,
        critic_factory=None,
        actor_lr=1e-3,
        critic_lr=2e-3,
        weight_decay=0.0,
        with_critic=True,
        schedule=LRSchedule(warmup_steps=2, decay_iterations=4),
    )
    fresh[0].load_state_dict(scheds[0].state_dict())
    start_iteration(fresh, 3)
    assert fresh_opts[0].param_groups[0]["lr"] == pytest.approx(
        1e-3 * (0.1 + 0.45 * (1 + math.cos(3 * math.pi / 4)))
    )


def test_no_schedule_builds_no_scheduler():
    opts = build_optimizers(
        [torch.nn.Parameter(torch.zeros(1))],
        [],
        actor_factory=None,
        critic_factory=None,
        actor_lr=1e-3,
        critic_lr=1e-3,
        weight_decay=0.0,
        with_critic=False,
        schedule=LRSchedule(),
    )
    assert isinstance(opts, list) and opts[0].param_groups[0]["lr"] == 1e-3
    start_iteration(None, 5)  # no scheduler: nothing to do
