"""One-step-off-policy rollouts: the one-batch buffer, its checkpoint form and the settings it
refuses."""

from __future__ import annotations

import threading

import pytest
import torch

from ragen_lightning.data.ahead import (
    STALENESS,
    OneStepAhead,
    batch_from_state,
    batch_state,
)
from ragen_lightning.data.checks import check_world_size
from ragen_lightning.data.settings import DataSettings, TrainingSettings
from ragen_lightning.errors import ConfigError
from ragen_lightning.starpo.checks import check_data_settings
from ragen_lightning.starpo.settings import AdvantageSettings
from ragen_lightning.types import RolloutBatch


def batch(value: float) -> RolloutBatch:
    t = torch.full((2, 3), value)
    return RolloutBatch(
        t.long(),
        torch.ones(2, 3, dtype=torch.long),
        t.long(),
        t,
        t.bool(),
        t,
        t[:, 0],
        torch.tensor([0, 0]),
        torch.tensor([0, 1]),
        per_turn_rewards=True,
        metrics={"train/score": value, STALENESS: 0.0},
        state_index=torch.tensor([5, 6]),
    )


def test_the_launched_batch_is_taken_for_its_iteration_only_and_marked_one_update_old():
    ahead, started = OneStepAhead(), threading.Event()

    def produce():
        started.set()
        return batch(1.0)

    ahead.launch(4, produce)
    with pytest.raises(RuntimeError, match="iteration 4"):  # one in flight at most
        ahead.launch(5, produce)
    assert started.wait(10)
    assert ahead.take(3) is None  # another iteration's batch stays
    got = ahead.take(4)
    assert got.metrics == {"train/score": 1.0, STALENESS: 1.0}
    assert ahead.take(4) is None  # taken once
    ahead.close()


def test_the_batch_is_finished_on_the_thread_that_takes_or_stores_it_and_once():
    ahead, threads, finished = OneStepAhead(), {}, []

    def produce():
        threads["produce"] = threading.get_ident()
        return 3.0

    def finish(value):
        threads["finish"] = threading.get_ident()
        finished.append(value)
        return batch(value)

    ahead.launch(0, produce, finish)
    assert ahead.take(0).metrics["train/score"] == 3.0
    # the gather runs in step with the ranks
    assert threads["finish"] == threading.get_ident() != threads["produce"]
    ahead.launch(1, produce, finish)
    state = ahead.state()  # a checkpoint finishes it ...
    assert ahead.take(1).metrics["train/score"] == 3.0 and finished == [3.0, 3.0]  # ... once
    assert state["batch"]["metrics"]["train/score"] == 3.0
    ahead.close()


def test_a_rollout_error_is_raised_where_the_batch_is_taken():
    ahead = OneStepAhead()
    ahead.launch(0, lambda: (_ for _ in ()).throw(ValueError("env crashed")))
    ahead.wait()  # waiting does not raise: taking does
    with pytest.raises(ValueError, match="env crashed"):
        ahead.take(0)
    ahead.close()


def test_the_checkpoint_form_holds_the_batch_without_trajectories_and_restores_it():
    ahead = OneStepAhead()
    ahead.launch(7, lambda: batch(2.0))
    state = ahead.state()  # waits for the worker
    assert state["iteration"] == 7 and set(state["batch"]) == {
        *RolloutBatch._TENSORS,
        "state_index",
        "metrics",
        "per_turn_rewards",
    }
    restored = OneStepAhead()
    restored.restore(state)
    got, want = restored.take(7), batch(2.0)
    for k in want._tensors():
        assert torch.equal(getattr(got, k), getattr(want, k)), k
    assert got.per_turn_rewards and got.trajectories == [] and got.metrics[STALENESS] == 1.0
    plain = batch_from_state(
        batch_state(RolloutBatch(*[getattr(want, k) for k in RolloutBatch._TENSORS]))
    )
    assert plain.state_index is None and not plain.per_turn_rewards
    ahead.close()


def test_settings_async_cannot_run_with():
    with pytest.raises(
        ConfigError, match=r"^--data.training.async_level 2: only 1 \(one rollout in flight"
    ):
        TrainingSettings(async_level=2)
    s = DataSettings.build(
        training={"async_level": 1, "num_groups": 2, "group_size": 4},
        validation={"num_groups": 2},
        engine={"name": "hf"},
    )
    # several processes: each rank's rollout on its worker, the gather on the main thread
    check_world_size(s, 2)
    with pytest.raises(
        ConfigError,
        match=r"^--data.training.async_level 1 with --data.engine.vllm."
        r"tensor_parallel_size 2: one engine spans 2 ranks .* or async_level 0$",
    ):
        DataSettings.build(
            training={"async_level": 1},
            engine={"name": "vllm", "vllm": {"tensor_parallel_size": 2}},
        )
    with pytest.raises(
        ConfigError,
        match=r"^--data.training.async_level 1 trains on rollouts sampled one update "
        r"earlier: set --model.loss.tis_cap",
    ):
        check_data_settings(AdvantageSettings(estimator="grpo"), s, tis_cap=None)
    check_data_settings(AdvantageSettings(estimator="grpo"), s, tis_cap=2.0)


def test_the_hf_engine_samples_from_a_copy_refreshed_by_sync_and_an_uncopyable_actor_is_refused():
    from ragen_lightning.rollout.engine import HFEngine
    from ragen_lightning.rollout.engines import snapshot_engine

    actor = torch.nn.Linear(2, 2)
    engine = snapshot_engine(HFEngine(actor, [0], 0))
    assert engine.model is not actor and not any(p.requires_grad for p in engine.model.parameters())
    with torch.no_grad():
        # the update moves the actor: the copy keeps the old weights until a sync
        actor.weight.add_(1.0)
    assert not torch.equal(engine.model.weight, actor.weight)
    engine.sync_weights()
    assert torch.equal(engine.model.weight, actor.weight)
    other = object()
    # an engine with weights of its own (vLLM) is used as it is
    assert snapshot_engine(other) is other

    class Quantized(torch.nn.Linear):
        def __deepcopy__(self, memo):
            raise TypeError("cannot pickle 'Params4bit'")

    with pytest.raises(
        ConfigError,
        match=r"^--data.training.async_level 1 samples from a copy of the actor .* \(TypeError: "
        r"cannot pickle 'Params4bit'\): use --data.training.async_level 0$",
    ):
        snapshot_engine(HFEngine(Quantized(2, 2), [0], 0))
