"""GradientAnalysis buckets and norms, RolloutThroughput arithmetic, RolloutStatistics values."""

from __future__ import annotations

import math

import pytest
import torch

from callbacks import GradientAnalysis, RolloutStatistics
from callbacks.gradients import group_buckets
from callbacks.throughput import throughput_values
from ragen_lightning.data.batching import build_batch
from ragen_lightning.rollout.tokens import ChatTokens
from ragen_lightning.starpo.module import StarPOModule
from ragen_lightning.types import Sample, Trajectory


def test_group_buckets_quantile_and_fixed():
    # stds of groups 10..14: sorted ascending -> 11 (0.0), 13 (0.5), 10 (1.5), 14 (2.0), 12 (7.0)
    ids, stds = [10, 11, 12, 13, 14], [1.5, 0.0, 7.0, 0.5, 2.0]
    q = group_buckets(ids, stds, "quantile", 2)  # 5 // 2 = 2 per bucket, the remainder to the last
    assert q == {"bucket_1": [11, 13], "bucket_2": [10, 14, 12], "all": [11, 13, 10, 14, 12]}
    assert group_buckets(ids, stds, "quantile", 9)["bucket_5"] == [12]  # nb = min(9, 5)
    f = group_buckets(ids, stds, "fixed_rv", 3)
    assert f == {
        "rv_0_1": [11, 13],
        "rv_1_2": [10],
        "rv_2_3": [14],
        "rv_5_inf": [12],
        "all": [11, 13, 10, 14, 12],
    }


def _traj(chat, group_id, member, reward, body):
    conv = chat.start("You're a helpful assistant.", f"State:\n#{group_id}#\n")
    chat.add_response(conv, chat.encode(body) + [chat.eos_id], None)
    return Trajectory(
        env_index=group_id * 2 + member,
        group_id=group_id,
        seed=group_id,
        turn_rewards=[reward],
        num_turns=1,
        samples=[Sample(conv, [reward])],
        success=reward > 0.5,
    )


@pytest.fixture()
def grpo_module(tiny_path, tiny_tokenizer):
    torch.manual_seed(0)
    module = StarPOModule(
        model=str(tiny_path),
        advantage={"estimator": "grpo"},
        loss={"entropy_coeff": 0.01},
        update={"micro_batch_size": 2, "mini_batch_size": 8},
    )
    module.configure_model()
    chat = ChatTokens(tiny_tokenizer)
    # group 0: identical rewards (std 0 -> GRPO advantage 0); group 1: rewards 0 / 1 (std 0.707)
    trajs = [
        _traj(chat, 0, 0, 1.0, "a.</think><answer>Up</answer>"),
        _traj(chat, 0, 1, 1.0, "b b.</think>"),
        _traj(chat, 1, 0, 0.0, "c.</think><answer>Up</answer>"),
        _traj(chat, 1, 1, 1.0, "d</think>"),
    ]
    return module, build_batch(trajs, pad_token_id=tiny_tokenizer.pad_token_id)


def test_gradient_analysis_zero_variance_bucket_has_no_task_gradient(grpo_module):
    module, batch = grpo_module
    before = {k: v.clone() for k, v in module.actor.state_dict().items()}
    out = GradientAnalysis(num_buckets=2).analyse(module, batch)
    # bucket_1 = group 0 (std 0): every GRPO advantage is 0, so the policy loss has exactly zero
    # gradient
    assert (
        out["grad_norm/bucket_1/task"] == 0.0 and out["grad_norm/bucket_1/reward_std_mean"] == 0.0
    )
    assert out["grad_norm/bucket_2/task"] > 0.0
    # std of [0, 1], unbiased
    assert out["grad_norm/bucket_2/reward_std_mean"] == pytest.approx(math.sqrt(0.5))
    # the entropy term pulls on every bucket; per-sample = norm / 2 samples
    assert out["grad_norm/bucket_1/entropy"] > 0.0
    assert out["grad_norm/bucket_1/per_sample/entropy"] == pytest.approx(
        out["grad_norm/bucket_1/entropy"] / 2
    )
    # no KL term configured
    assert out["grad_norm/all/sample_count"] == 4.0 and "grad_norm/all/kl" not in out
    # no optimizer step, gradients cleared
    assert all(torch.equal(v, before[k]) for k, v in module.actor.state_dict().items())
    assert all(p.grad is None for p in module.actor.parameters())


def test_gradient_analysis_entropy_component_follows_the_flag(grpo_module):
    module, batch = grpo_module
    module.set_entropy_coeff(0.0)
    out = GradientAnalysis(num_buckets=2).analyse(module, batch)
    assert not any(k.endswith("/entropy") for k in out) and "grad_norm/all/task" in out


def test_gradient_analysis_takes_the_updates_micro_batches(grpo_module, tiny_path, monkeypatch):
    from callbacks import gradients

    module, batch = grpo_module
    seen: list[int] = []
    real = gradients.actor_outputs

    def recording(actor, ids, *args, **kwargs):
        seen.append(ids.shape[0])
        return real(actor, ids, *args, **kwargs)

    monkeypatch.setattr(gradients, "actor_outputs", recording)
    by_rows = GradientAnalysis(num_buckets=2).analyse(module, batch)
    # buckets of 2, 2 and 4 rows (bucket_1, bucket_2, all) x 2 components (task, entropy), 2 rows a
    # micro-batch
    assert seen == [2] * (1 + 1 + 2) * 2
    # a token budget below every row's length: one row per micro-batch, as the update would run them
    torch.manual_seed(0)
    budget = StarPOModule(
        model=str(tiny_path),
        advantage={"estimator": "grpo"},
        loss={"entropy_coeff": 0.01},
        update={"micro_batch_size": 2, "mini_batch_size": 8, "micro_batch_tokens": 4},
    )
    budget.configure_model()
    budget.actor.load_state_dict(module.actor.state_dict())
    seen.clear()
    by_tokens = GradientAnalysis(num_buckets=2).analyse(budget, batch)
    assert seen == [1] * (2 + 2 + 4) * 2
    assert by_tokens.keys() == by_rows.keys()
    for key, value in by_rows.items():  # the split changes the memory, not the norms
        assert by_tokens[key] == pytest.approx(value, rel=1e-5, abs=1e-7), key


def test_throughput_values_by_hand():
    logs = {
        "rollout/generated_tokens": 600.0,
        "timing_s/rollout": 3.0,
        "timing_s/rollout_generate": 2.0,
        "timing_s/rollout_env": 0.5,
        "timing_s/update": 4.0,
    }
    out = throughput_values(logs, trained_tokens=2000.0, iteration_s=8.0)
    # 600 / 2
    assert out == {
        "throughput/iteration_s": 8.0,
        "throughput/generate_tokens_per_s": 300.0,
        # 2000 / 4
        "throughput/rollout_tokens_per_s": 200.0,
        "throughput/update_tokens_per_s": 500.0,
        # 3 / 8, 4 / 8
        "throughput/rollout_fraction": 0.375,
        "throughput/update_fraction": 0.5,
        # 1 - 7 / 8
        "throughput/env_fraction": 0.0625,
        "throughput/other_fraction": 0.125,
    }
    assert throughput_values({}, 0.0, 1.0)["throughput/other_fraction"] == 1.0


def test_rollout_statistics_by_hand(tiny_tokenizer):
    chat = ChatTokens(tiny_tokenizer)
    trajs = [
        _traj(chat, 0, 0, 1.0, "a b.</think><answer>Up</answer>"),
        _traj(chat, 0, 1, 0.0, "no close tag"),
        _traj(chat, 1, 0, 0.0, "c.</think>"),
        _traj(chat, 1, 1, 0.0, "</think>"),
    ]
    out = RolloutStatistics(ks=(1, 2)).values(trajs, 2, tiny_tokenizer)
    # successes per group [1, 0] of 2: pass@1 = (1/2 + 0) / 2 = 0.25, pass@2 = (1 + 0) / 2 = 0.5
    assert out["stats/pass@1"] == pytest.approx(0.25) and out["stats/pass@2"] == pytest.approx(0.5)
    # reasoning tokens: "a b." + 0 + "c." + 0 over 4 trajectories; valid turns 2 of 4
    expected = (len(chat.encode("a b.")) + len(chat.encode("c."))) / 4
    assert (
        out["stats/think_tokens_mean"] == pytest.approx(expected)
        and out["stats/valid_thinking_rate"] == 0.5
    )
