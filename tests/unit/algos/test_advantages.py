"""Advantage estimators and modifiers against hand-computed numbers (RAGEN's core_algos.py, veRL
v0.6.1)."""

from __future__ import annotations

import math

import pytest
import torch

from ragen_lightning.algos.advantages import (
    adaptive_kl_coef,
    apply_kl_in_reward,
    arpo,
    broadcast_to_tokens,
    brpo,
    chain_rows,
    drgrpo,
    filter_loss_scaling,
    gae,
    group_std,
    grpo,
    length_weight,
    masked_whiten,
    soft_advantage_reweight,
    turn_ends_from_mask,
    turn_level_gae,
    zero_task_advantage,
)
from ragen_lightning.algos.losses import masked_mean, masked_sum, masked_var
from tests.unit.algos.helpers import close

T = torch.tensor


# ------------------------------------------------------------------------------------------------ masked helpers


def test_masked_reductions_ignore_masked_nan_and_handle_empty_masks():
    x = T([[1.0, float("nan")], [3.0, float("inf")]])
    m = T([[1, 0], [1, 0]])
    # selected: 1 and 3 -> sum 4, mean 2, unbiased var ((1-2)^2 + (3-2)^2) / 1 = 2
    close(masked_sum(x, m), 4.0)
    close(masked_mean(x, m), 2.0)
    close(masked_var(x, m), 2.0)
    close(masked_mean(x, m, dim=-1), [1.0, 3.0])
    zero = torch.zeros_like(m)
    for value in (masked_sum(x, zero), masked_mean(x, zero), masked_var(x, zero)):
        assert value.item() == 0.0
    # one selected element: unbiased variance undefined -> 0, not NaN
    assert masked_var(T([5.0, 7.0]), T([1, 0])).item() == 0.0


def test_masked_whiten_hand_values():
    x = T([2.0, 4.0, 6.0, 0.0])
    m = T([1, 1, 1, 0])
    # mean 4, unbiased var (4 + 0 + 4) / 2 = 4, std 2; applied to every position: (0 - 4)/2 = -2 for
    # the masked one
    close(masked_whiten(x, m), [-1.0, 0.0, 1.0, -2.0], atol=1e-6)
    # scale only: whitened + mean = [3, 4, 5, 2]
    close(masked_whiten(x, m, shift_mean=False), [3.0, 4.0, 5.0, 2.0], atol=1e-6)


def test_masked_whiten_degenerate_masks_and_constant_input():
    assert torch.isfinite(masked_whiten(T([1.0, 2.0]), T([0, 0]))).all()
    # one trained token: var 0 -> (x - 5)/sqrt(1e-8): 0 on the token itself, finite elsewhere
    out = masked_whiten(T([5.0, 7.0]), T([1, 0]))
    assert out[0].item() == 0.0 and torch.isfinite(out).all()
    # constant 0.3 (float32 mean of 8 copies is 1 ulp off): still exactly 0
    assert torch.equal(masked_whiten(torch.full((8,), 0.3), torch.ones(8)), torch.zeros(8))


# ------------------------------------------------------------------------------------------------ GAE


def test_gae_terminal_reward_gamma_lambda_one():
    # gamma = lam = 1, reward R = 1 on the last token: A_t = R - V_t, returns_t = R (veRL's masked
    # GAE)
    rewards = T([[0.0, 0.0, 0.0, 1.0]])
    values = T([[0.1, 0.2, 0.3, 0.4]])
    adv, ret = gae(rewards, values, torch.ones(1, 4), gamma=1.0, lam=1.0)
    close(adv, [[0.9, 0.8, 0.7, 0.6]])
    close(ret, [[1.0, 1.0, 1.0, 1.0]])


def test_gae_discounted_hand_values():
    # gamma = lam = 0.5, r = [0, 0, 1], V = 0.5 everywhere
    # t=2: delta = 1 - .5 = .5                    A = .5
    # t=1: delta = 0 + .5*.5 - .5 = -.25          A = -.25 + .25*.5 = -.125
    # t=0: delta = -.25                           A = -.25 + .25*(-.125) = -.28125
    adv, ret = gae(T([[0.0, 0.0, 1.0]]), T([[0.5, 0.5, 0.5]]), torch.ones(1, 3), gamma=0.5, lam=0.5)
    close(adv, [[-0.28125, -0.125, 0.5]])
    close(ret, [[0.21875, 0.375, 1.0]])


def test_gae_bridges_masked_positions_in_the_middle():
    # Two assistant turns [0,1] and [4,5] with env tokens [2,3] (mask 0). gamma = .5, lam = 1.
    # Rewards 9 on the env tokens are dropped (their delta is never accumulated).
    # t=5: delta = 1 - 4 = -3                        A5 = -3          nv = 4, lg = -3
    # t=4: delta = 0 + .5*4 - 3 = -1                 A4 = -1 + .5*(-3) = -2.5   nv = 3, lg = -2.5
    # t=3, t=2 (mask 0): carried                     A3 = A2 = -2.5   nv = 3
    # t=1: delta = .5 + .5*3 - 2 = 0  (next value bridged to V4 = 3)   A1 = 0 + .5*(-2.5) = -1.25
    # t=0: delta = 0 + .5*2 - 1 = 0                  A0 = .5*(-1.25) = -.625
    rewards = T([[0.0, 0.5, 9.0, 9.0, 0.0, 1.0]])
    values = T([[1.0, 2.0, 7.0, 7.0, 3.0, 4.0]])
    mask = T([[1, 1, 0, 0, 1, 1]])
    adv, ret = gae(rewards, values, mask, gamma=0.5, lam=1.0)
    close(adv, [[-0.625, -1.25, -2.5, -2.5, -2.5, -3.0]])
    close(ret, [[0.375, 0.75, 4.5, 4.5, 0.5, 1.0]])


def test_gae_with_masked_gaps_equals_gae_on_the_trained_tokens_only():
    gen = torch.Generator().manual_seed(0)
    rewards, values = torch.randn(3, 9, generator=gen), torch.randn(3, 9, generator=gen)
    mask = torch.rand(3, 9, generator=gen) > 0.4
    rewards = rewards * mask  # rewards only on trained tokens
    adv, ret = gae(rewards, values, mask, gamma=0.9, lam=0.8)
    for row in range(3):
        keep = mask[row]
        sub_adv, sub_ret = gae(
            rewards[row, keep][None],
            values[row, keep][None],
            torch.ones(1, int(keep.sum())),
            gamma=0.9,
            lam=0.8,
        )
        close(adv[row, keep], sub_adv[0], atol=1e-5)
        close(ret[row, keep], sub_ret[0], atol=1e-5)


def test_gae_trailing_padding_and_all_zero_mask():
    # mask [1, 1, 0], r = [0, 1, 0], V = [.5, .5, 9], gamma = lam = 1 t=2 pad: nothing carried, A2 =
    # 0; t=1: A = 1 - .5 = .5; t=0: delta = 0 + .5 - .5 = 0, A0 = 0 + .5 = .5 returns = A + V = [1,
    # 1, 9] (the pad's return is never trained on)
    adv, ret = gae(T([[0.0, 1.0, 0.0]]), T([[0.5, 0.5, 9.0]]), T([[1, 1, 0]]), 1.0, 1.0)
    close(adv, [[0.5, 0.5, 0.0]])
    close(ret, [[1.0, 1.0, 9.0]])
    # all-zero mask: nothing accumulates, A = 0, returns = V, no NaN
    values = T([[0.3, 0.7]])
    adv, ret = gae(T([[1.0, 1.0]]), values, torch.zeros(1, 2), 1.0, 1.0)
    close(adv, [[0.0, 0.0]])
    close(ret, values)
    assert torch.isfinite(masked_whiten(adv, torch.zeros(1, 2))).all()


def test_gae_bf16_inputs_compute_in_float32():
    bf16 = torch.bfloat16
    adv, _ = gae(
        T([[0.0, 1.0]], dtype=bf16), T([[0.5, 0.5]], dtype=bf16), torch.ones(1, 2), 1.0, 1.0
    )
    assert adv.dtype == torch.float32


# ------------------------------------------------------------------------------------------------ turn-level GAE


def test_chain_rows_packs_trained_positions_of_each_chain_in_row_order():
    # rows 0 and 2 are one chain (an episode's two turn samples), row 1 another;
    # chains are numbered by first appearance, a chain's rows taken in row order, then column order
    mask = T([[0, 1, 1, 0], [1, 0, 0, 0], [0, 0, 1, 1]])
    x = T([[9.0, 1.0, 2.0, 9.0], [5.0, 9.0, 9.0, 9.0], [9.0, 9.0, 3.0, 4.0]])
    packed_mask, (px,), unpack = chain_rows(T([7, 3, 7]), mask, x)
    assert packed_mask.tolist() == [[True, True, True, True], [True, False, False, False]]
    assert px.tolist() == [[1.0, 2.0, 3.0, 4.0], [5.0, 0.0, 0.0, 0.0]]
    # unpack puts a packed result back on the trained positions, 0 elsewhere
    assert unpack(px * 10).tolist() == [[0, 10, 20, 0], [50, 0, 0, 0], [0, 0, 30, 40]]
    with pytest.raises(ValueError, match="one id per row"):
        chain_rows(T([0, 1]), mask, x)


def test_gae_over_chained_turn_samples_equals_gae_over_the_whole_episode():
    # One episode of two turns as one row (full context) and as two turn samples (windowed context):
    # chained, the samples get the advantages and returns of the full row, so turn 1's return holds
    # turn 2's reward. gamma = lam = 1: turn 1 (V = .5, .5, reward -0.1), turn 2 (V = 2, 3, reward
    # 10): A = R_to_go - V: [9.9 - .5, 9.9 - .5, 10 - 2, 10 - 3]
    full_r, full_v = T([[0.0, -0.1, 0.0, 0.0, 10.0]]), T([[0.5, 0.5, 7.0, 2.0, 3.0]])
    full_m = T([[1, 1, 0, 1, 1]])
    adv_full, ret_full = gae(full_r, full_v, full_m, 1.0, 1.0)
    rows_r, rows_v = T([[0.0, 0.0, -0.1], [0.0, 0.0, 10.0]]), T([[9.0, 0.5, 0.5], [9.0, 2.0, 3.0]])
    rows_m = T([[0, 1, 1], [0, 1, 1]])
    packed_mask, (r, v), unpack = chain_rows(T([0, 0]), rows_m, rows_r, rows_v)
    adv, ret = (unpack(t) for t in gae(r, v, packed_mask, 1.0, 1.0))
    close(adv, [[0.0, 9.4, 9.4], [0.0, 8.0, 7.0]])
    close(adv[rows_m.bool()], adv_full[full_m.bool()])
    close(ret[rows_m.bool()], ret_full[full_m.bool()])
    # unchained, turn 1 sees only its own -0.1: the later reward never reaches it
    adv_rows, _ = gae(rows_r, rows_v, rows_m, 1.0, 1.0)
    close(adv_rows[0, 1:], [-0.6, -0.6])


def test_turn_ends_from_mask():
    mask = T([[1, 1, 0, 1, 1], [0, 1, 1, 0, 0], [0, 0, 0, 0, 0]])
    expected = T([[0, 1, 0, 0, 1], [0, 0, 1, 0, 0], [0, 0, 0, 0, 0]]).bool()
    assert torch.equal(turn_ends_from_mask(mask), expected)


def test_turn_level_gae_two_turns_with_a_zero_turn_reward():
    # Turns [0,1] and [3,4] (env token 2), turn ends 1 and 4; turn 1 has reward 0 (RAGEN would not
    # see that turn). gamma = lam = 1, high_level_gamma = .5; V = [.5, .4, 0, .6, .8]
    # high level, turn end 4: delta = 1 + 0 - .8 = .2                     Â = .2       R̃4 = 1.0
    #             turn end 1: delta = 0 + .5*V4 - .4 = 0                  Â = 0 + .5*1*.2 = .1   R̃1 = .5
    # low level:  t=4 (end, reset): A = R̃4 - .8 = .2
    #             t=3: delta = 0 + .8 - .6 = .2          A = .2 + .2 = .4
    #             t=2 (mask 0): carried                 A = .4
    #             t=1 (end, reset): A = R̃1 - .4 = .1
    #             t=0: delta = 0 + .4 - .5 = -.1         A = -.1 + .1 = 0
    # returns = A + V = [.5, .5, .4, 1.0, 1.0]
    rewards = T([[0.0, 0.0, 0.0, 0.0, 1.0]])
    values = T([[0.5, 0.4, 0.0, 0.6, 0.8]])
    mask = T([[1, 1, 0, 1, 1]])
    ends = turn_ends_from_mask(mask)
    adv, ret = turn_level_gae(rewards, values, mask, ends, gamma=1.0, lam=1.0, high_level_gamma=0.5)
    close(adv, [[0.0, 0.1, 0.4, 0.4, 0.2]])
    close(ret, [[0.5, 0.5, 0.4, 1.0, 1.0]])
    # the same turn ends given as index tensors per row
    adv2, ret2 = turn_level_gae(rewards, values, mask, [T([1, 4])], 1.0, 1.0, 0.5)
    assert torch.equal(adv, adv2) and torch.equal(ret, ret2)


def test_turn_level_gae_with_one_turn_equals_plain_gae():
    gen = torch.Generator().manual_seed(1)
    rewards, values = torch.randn(4, 10, generator=gen), torch.randn(4, 10, generator=gen)
    mask = torch.rand(4, 10, generator=gen) > 0.3
    mask[:, 0] = True
    last = torch.zeros_like(mask)
    for row in range(4):
        last[row, mask[row].nonzero().max()] = True  # the only turn ends at the last trained token
    for gamma, lam, hg in [(1.0, 1.0, 0.95), (0.9, 0.7, 0.5)]:
        adv_turn, ret_turn = turn_level_gae(rewards, values, mask, last, gamma, lam, hg)
        adv, ret = gae(rewards, values, mask, gamma, lam)
        close(adv_turn, adv, atol=1e-5)
        close(ret_turn, ret, atol=1e-5)


def test_turn_level_gae_trained_tokens_after_the_last_turn_end_bootstrap_zero():
    # mask [1,1,1], only position 1 is a turn end; gamma = lam = hg = 1, V = .5, r = [0, 0, 1] high:
    # end 1: delta = 0 + 0 - .5 = -.5 -> R̃1 = 0 low: t=2: A = 1 - .5 = .5; t=1 (reset): A = 0 - .5
    # = -.5; t=0: delta = 0 + .5 - .5 = 0, A = -.5
    adv, _ = turn_level_gae(
        T([[0.0, 0.0, 1.0]]), T([[0.5, 0.5, 0.5]]), torch.ones(1, 3), [T([1])], 1.0, 1.0, 1.0
    )
    close(adv, [[-0.5, -0.5, 0.5]])


def test_turn_level_gae_rejects_turn_end_off_the_mask():
    with pytest.raises(ValueError, match="mask is 0"):
        turn_level_gae(
            torch.zeros(1, 3), torch.zeros(1, 3), T([[1, 0, 1]]), [T([1])], 1.0, 1.0, 0.95
        )
    with pytest.raises(ValueError, match="rows"):
        turn_level_gae(
            torch.zeros(2, 3), torch.zeros(2, 3), torch.ones(2, 3), [T([1])], 1.0, 1.0, 0.95
        )


# ------------------------------------------------------------------------------------------------ outcome estimators


def test_grpo_hand_values_with_zero_variance_and_singleton_groups():
    scores = T([1.0, 2.0, 3.0, 5.0, 5.0, 7.0])
    groups = T([0, 0, 0, 1, 1, 2])
    # group 0: mean 2, unbiased std sqrt((1 + 0 + 1)/2) = 1 -> (s - 2)/(1 + 1e-6)
    # group 1: zero variance -> 0; group 2: size 1 -> 0 (not NaN, not the raw score)
    d = 1.0 / (1.0 + 1e-6)
    close(grpo(scores, groups), [-d, 0.0, d, 0.0, 0.0, 0.0])
    # Dr.GRPO: s - mean only
    close(grpo(scores, groups, norm_by_std=False), [-1.0, 0.0, 1.0, 0.0, 0.0, 0.0])
    close(drgrpo(scores, groups), [-1.0, 0.0, 1.0, 0.0, 0.0, 0.0])
    close(group_std(scores, groups), [1.0, 1.0, 1.0, 0.0, 0.0, 0.0])


def test_grpo_identical_rewards_give_exact_zeros():
    for value, size in [(0.3, 8), (0.1, 11), (-2.7, 5)]:
        scores = torch.full((3 * size,), value)
        groups = torch.arange(3).repeat_interleave(size)
        assert torch.equal(grpo(scores, groups), torch.zeros(3 * size))
        assert torch.equal(drgrpo(scores, groups), torch.zeros(3 * size))
        assert torch.equal(brpo(scores), torch.zeros(3 * size))


def test_grpo_non_contiguous_group_ids():
    # group 7: [1, 3] mean 2, std sqrt(2); group 3: [10, 20] mean 15, std sqrt(50) -> all
    # +-1/sqrt(2)
    r = 1.0 / math.sqrt(2.0)
    close(grpo(T([1.0, 10.0, 3.0, 20.0]), T([7, 3, 7, 3])), [-r, -r, r, r], atol=1e-5)


def test_brpo_arpo_and_the_group_outcome_signature():
    scores = T([1.0, 2.0, 3.0, 6.0])
    groups = T([0, 0, 1, 1])
    # batch mean 3, unbiased var (4 + 1 + 0 + 9)/3 = 14/3, std 2.1602469
    std = math.sqrt(14.0 / 3.0)
    expected_brpo = [-2 / std, -1 / std, 0.0, 3 / std]
    close(brpo(scores), expected_brpo, atol=1e-5)
    close(arpo(scores), scores)
    # the estimator registry calls each one as fn(scores, group_index): the batch-wide ones ignore
    # the groups
    close(brpo(scores, groups), expected_brpo, atol=1e-5)
    close(arpo(scores, groups), scores)
    # groups: [1,2] -> -+0.7071, [3,6] -> -+0.7071
    r = 1.0 / math.sqrt(2.0)
    close(grpo(scores, groups), [-r, r, -r, r], atol=1e-5)
    close(drgrpo(scores, groups), [-0.5, 0.5, -1.5, 1.5])


def test_registry_names_the_group_outcome_estimators_and_refuses_an_unknown_one():
    from ragen_lightning.errors import ConfigError
    from ragen_lightning.starpo.estimators import estimators_where, get_estimator

    assert set(estimators_where(outcome=True)) >= {"grpo", "drgrpo", "brpo", "arpo"}
    assert [get_estimator(n).groups for n in ("grpo", "drgrpo", "brpo", "arpo")] == [
        True,
        True,
        False,
        False,
    ]
    with pytest.raises(
        ConfigError, match="--model.advantage.estimator must be one of .*got 'reinforce'"
    ):
        get_estimator("reinforce")


def test_broadcast_to_tokens():
    # A_{i,t} = A_i * m_{i,t}
    out = broadcast_to_tokens(T([2.0, -1.0]), T([[1, 1, 0], [0, 1, 1]]))
    close(out, [[2.0, 2.0, 0.0], [0.0, -1.0, -1.0]])


# ------------------------------------------------------------------------------------------------ modifiers


def test_soft_advantage_reweight():
    # w = sigma / (max sigma + 1e-6) = [.5, .5, 1, 0] / (1 + 1e-6)
    adv = T([1.0, 1.0, 1.0, 1.0])
    out, metrics = soft_advantage_reweight(adv, T([0.5, 0.5, 1.0, 0.0]))
    w = 1.0 / (1.0 + 1e-6)
    close(out, [0.5 * w, 0.5 * w, w, 0.0])
    close(metrics["soft_reweight_min"], 0.0)
    close(metrics["soft_reweight_max"], w)
    close(metrics["soft_reweight_mean"], 0.5 * w)
    # token-level advantages are scaled row-wise
    tok, _ = soft_advantage_reweight(torch.ones(2, 3), T([1.0, 0.0]))
    close(tok, [[w, w, w], [0.0, 0.0, 0.0]])


def test_filter_loss_scaling_modes():
    # kept ratio .25: none x1, linear x.25, sqrt x.5
    adv = T([2.0, -4.0])
    close(filter_loss_scaling(adv, 0.25, "none"), [2.0, -4.0])
    close(filter_loss_scaling(adv, 0.25, "linear"), [0.5, -1.0])
    close(filter_loss_scaling(adv, 0.25, "sqrt"), [1.0, -2.0])
    with pytest.raises(ValueError, match="mode"):
        filter_loss_scaling(adv, 0.25, "log")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="kept_ratio"):
        filter_loss_scaling(adv, 1.5, "linear")


def test_length_weight():
    # lengths [1, 3], mean 2: A / ((L + 1e-6)/2) -> [1/(1.000001/2), 1/(3.000001/2)] = [~2, ~0.6667]
    mask = T([[1, 0, 0], [1, 1, 1]])
    close(length_weight(T([1.0, 1.0]), mask), [2.0 / 1.000001, 2.0 / 3.000001])
    close(length_weight(torch.ones(2, 3), mask)[:, 0], [2.0 / 1.000001, 2.0 / 3.000001])
    # an empty row is left unchanged (lengths [0, 2], mean 1: row 1 -> 1/((2 + 1e-6)/1))
    close(length_weight(T([3.0, 1.0]), T([[0, 0], [1, 1]])), [3.0, 1.0 / 2.000001])
    close(length_weight(T([3.0]), T([[0, 0]])), [3.0])


def test_zero_task_advantage():
    assert torch.equal(zero_task_advantage(T([[1.0, -2.0]])), torch.zeros(1, 2))


def test_kl_in_reward_and_adaptive_controller():
    # k1 KL = old - ref = [-1 - (-1.5), -2 - (-2)] = [.5, 0]; r - .1*KL*m = [0 - .05, 1 - 0]
    rewards = T([[0.0, 1.0, 0.0]])
    old = T([[-1.0, -2.0, -9.0]])
    ref = T([[-1.5, -2.0, 0.0]])
    shaped, metrics = apply_kl_in_reward(rewards, old, ref, T([[1, 1, 0]]), kl_coef=0.1, kind="k1")
    close(shaped, [[-0.05, 1.0, 0.0]])
    close(metrics["kl"], 0.25)  # row mean (.5 + 0)/2
    # two rows: row means .25 and 1.0 (one token) -> mean over rows .625 (a token mean would give
    # .5)
    _, metrics = apply_kl_in_reward(
        torch.zeros(2, 2),
        T([[-1.0, -2.0], [0.0, 0.0]]),
        T([[-1.5, -2.0], [-1.0, 0.0]]),
        T([[1, 1], [1, 0]]),
        kl_coef=0.1,
    )
    close(metrics["kl"], 0.625)
    # beta .1, KL .2, target .1: error clip(2 - 1, +-.2) = .2; n/horizon = 64/10000 -> .1 * (1 +
    # .2*.0064) = .100128
    assert adaptive_kl_coef(0.1, 0.2, 64, target_kl=0.1, horizon=10000) == pytest.approx(0.100128)
    assert adaptive_kl_coef(0.1, 0.0, 64, target_kl=0.1, horizon=10000) == pytest.approx(
        0.1 * (1 - 0.2 * 0.0064)
    )
