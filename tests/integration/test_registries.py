"""A user's own advantage estimator and filter strategy: one function and one registration line each, from outside
the library, then one training iteration with each (the tables of DESIGN section 5)."""

from __future__ import annotations

import pytest
import torch

from ragen_lightning.algos import advantages as A
from ragen_lightning.algos.filtering import FILTER_STRATEGIES, register_filter
from ragen_lightning.data.sampler import FilterSettings
from ragen_lightning.errors import ConfigError
from ragen_lightning.starpo.estimators import ESTIMATORS, register_estimator
from tests.integration.test_module import (
    Recorder,
    ScriptedStarPO,
    changed,
    data,
    params,
    trainer,
)

pytestmark = pytest.mark.slow
calls: list[int] = []


def every_token_one(batch, rewards, mask, values, settings):
    """A toy estimator: advantage 1 on every trained token (a supervised step on every sample)."""
    calls.append(len(batch))
    adv = A.broadcast_to_tokens(torch.ones(len(batch)), mask)
    return adv, adv, {"train/toy_rows": float(len(batch))}


def last_group_only(scores, value, **_):
    """A toy strategy: keep the last candidate group, whatever the scores."""
    return torch.tensor([scores.numel() - 1])


@pytest.fixture
def toy_registrations():
    register_estimator("every_token_one", every_token_one)
    register_filter("last_group_only", last_group_only)
    yield
    ESTIMATORS.pop("every_token_one")
    FILTER_STRATEGIES.pop("last_group_only")


def test_a_registered_estimator_trains_one_iteration(tmp_path, tiny_path, toy_registrations):
    calls.clear()
    module = ScriptedStarPO(model=str(tiny_path), advantage={"estimator": "every_token_one"},
                            update={"mini_batch_size": 8, "micro_batch_size": 4}, optim={"actor_lr": 1e-3})
    assert module.critic is None and not module.uses_critic  # it did not ask for one
    rec = Recorder()
    t = trainer(tmp_path, [rec])
    t.strategy.connect(module)
    module.configure_model()
    before = params(module.actor)
    t.fit(module, data())
    m = rec.rows[-1]
    assert calls == [8] and m["train/toy_rows"] == 8.0  # 2 groups x 4, called once (no critic: no second pass)
    assert m["train/advantage_mean"] == 1.0 and m["train/return_mean"] == 1.0
    assert t.global_step == 1 and changed(before, module.actor)  # one actor step, no critic step


def test_a_registered_filter_trains_one_iteration(tmp_path, tiny_path, toy_registrations):
    flt = FilterSettings(strategy="last_group_only", value=1.0)
    assert not flt.keeps_everything  # no keeps_all rule registered: the strategy always runs
    module = ScriptedStarPO(model=str(tiny_path), advantage={"estimator": "grpo"},
                            update={"mini_batch_size": 8, "micro_batch_size": 4})
    rec = Recorder()
    t = trainer(tmp_path, [rec])
    t.fit(module, data(filter=flt))
    m = rec.rows[-1]
    assert m["rollout/filter_kept_count"] == 1.0 and m["rollout/filter_kept_ratio"] == 0.5
    assert m["train/batch_size"] == 4.0  # the last group's 4 members only
    assert t.global_step == 1


def test_unregistered_names_are_one_line_errors_listing_the_registered_ones():
    with pytest.raises(ConfigError, match=r"--model.advantage.estimator must be one of gae, grpo.*got 'nope'"):
        ScriptedStarPO(advantage={"estimator": "nope"})
    with pytest.raises(ConfigError, match=r"--data.filter.strategy must be one of top_p, top_k.*got 'nope'"):
        FilterSettings(strategy="nope")
