"""Losses, aggregation, entropy and KL estimators against hand-computed numbers (veRL v0.6.1, as
RAGEN runs it)."""

from __future__ import annotations

import inspect
import math

import pytest
import torch

from ragen_lightning.algos.losses import (
    AGG_MODES,
    KL_KINDS,
    PolicyLossSettings,
    actor_loss,
    agg_normalizer,
    aggregate,
    kl_penalty,
    ppo_policy_loss,
    tis_weights,
    value_loss,
)
from tests.unit.algos.helpers import close

T = torch.tensor


# ------------------------------------------------------------------------------------------------ aggregation

VALUES = T([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [7.0, 8.0, 9.0]])
MASK = T([[1, 1, 0], [1, 0, 0], [0, 0, 0]])  # row 2 is empty


@pytest.mark.parametrize(
    ("mode", "expected", "normalizer"),
    [
        # trained values: row 0 -> 1, 2; row 1 -> 4; row 2 -> none
        ("token-mean", 7.0 / 3.0, 3.0),  # (1 + 2 + 4) / 3 tokens
        ("seq-mean-token-mean", 2.75, 2.0),  # ((1 + 2)/2 + 4/1) / 2 non-empty rows
        ("seq-mean-token-sum", 7.0 / 3.0, 3.0),  # (3 + 4 + 0) / 3 rows (all rows, as veRL)
        ("seq-mean-token-sum-norm", 7.0 / 9.0, 9.0),  # 7 / (3 rows * horizon 3)
    ],
)
def test_aggregate_hand_values(mode, expected, normalizer):
    close(aggregate(VALUES, MASK, mode), expected)
    close(agg_normalizer(MASK, mode), normalizer)


def test_aggregate_norm_horizon_and_bad_mode():
    # fixed horizon 7: 7 / (3 * 7)
    close(aggregate(VALUES, MASK, "seq-mean-token-sum-norm", horizon=7), 1.0 / 3.0)
    close(agg_normalizer(MASK, "seq-mean-token-sum-norm", horizon=7), 21.0)
    with pytest.raises(ValueError, match="agg_mode must be one of"):
        aggregate(VALUES, MASK, "token-sum")  # type: ignore[arg-type]


def test_aggregate_all_zero_mask_and_masked_nan():
    poisoned = VALUES.clone()
    poisoned[2] = float("nan")  # the empty row may hold anything
    poisoned[0, 2] = float("inf")
    for mode in AGG_MODES:
        assert aggregate(VALUES, torch.zeros(3, 3), mode).item() == 0.0
        assert torch.isfinite(aggregate(poisoned, MASK, mode))


def _micro_batch_rows():
    gen = torch.Generator().manual_seed(3)
    B, L = 4, 6
    mask = torch.zeros(B, L)
    for row, length in enumerate([6, 2, 0, 4]):  # different lengths and one empty row
        mask[row, :length] = 1
    mask[0, 2] = 0  # an env token in the middle of row 0
    logprobs = (torch.randn(B, L, generator=gen) * 0.2 - 1.0).requires_grad_(True)
    old = logprobs.detach() + torch.randn(B, L, generator=gen) * 0.3
    adv = torch.randn(B, L, generator=gen)
    return logprobs, old, adv, mask


@pytest.mark.parametrize("mode", AGG_MODES)
def test_one_micro_batch_of_four_equals_four_of_one(mode):
    logprobs, old, adv, mask = _micro_batch_rows()
    horizon = mask.shape[1]
    whole, _ = ppo_policy_loss(logprobs, old, adv, mask, agg_mode=mode, horizon=horizon)
    (grad_whole,) = torch.autograd.grad(whole, logprobs)

    normalizer = agg_normalizer(mask, mode, horizon=horizon)
    total = torch.zeros(())
    for row in range(4):
        # each micro-batch is also trimmed to its own padded length: the result must not depend on
        # it
        width = max(int(mask[row].nonzero().max()) + 1 if mask[row].any() else 1, 1)
        part, _ = ppo_policy_loss(
            logprobs[row : row + 1, :width], old[row : row + 1, :width], adv[row : row + 1, :width],
            mask[row : row + 1, :width], agg_mode=mode, normalizer=normalizer,
        )  # fmt: skip
        total = total + part
    (grad_micro,) = torch.autograd.grad(total, logprobs)
    close(total, whole.detach(), atol=1e-6)
    close(grad_micro, grad_whole, atol=1e-7)

    # two micro-batches of two, too
    halves = sum(
        ppo_policy_loss(logprobs[s], old[s], adv[s], mask[s], agg_mode=mode, normalizer=normalizer)[
            0
        ]
        for s in (slice(0, 2), slice(2, 4))
    )
    close(halves.detach(), whole.detach(), atol=1e-6)


def test_per_micro_batch_normalisation_would_differ():
    # The test above is sensitive: veRL-style token-mean (each micro-batch its own mean, then /
    # number of micro-batches) gives a different number for rows of different lengths.
    logprobs, old, adv, mask = _micro_batch_rows()
    whole, _ = ppo_policy_loss(logprobs, old, adv, mask)
    rows = [slice(r, r + 1) for r in range(4)]
    naive = sum(ppo_policy_loss(logprobs[s], old[s], adv[s], mask[s])[0] for s in rows) / 4
    assert not torch.isclose(naive, whole, atol=1e-4)


# ------------------------------------------------------------------------------------------------ PPO policy loss


def _ppo_case():
    # old log-probs 0, so ratio = exp(logprobs) = [1.1, 1.5, 0.5, 4.0]
    ratio = T([[1.1, 1.5, 0.5, 4.0]])
    return ratio.log(), torch.zeros(1, 4), T([[1.0, 1.0, -1.0, -1.0]]), torch.ones(1, 4)


def test_ppo_policy_loss_hand_values():
    # clip range [0.8, 1.28], dual clip 3:
    # tok0 A=+1 r=1.1: L1 = -1.1, L2 = -1.1                        -> -1.1
    # tok1 A=+1 r=1.5: L1 = -1.5, L2 = -1.28, max = -1.28          -> -1.28  (clipped: L2 > L1)
    # tok2 A=-1 r=0.5: L1 = 0.5,  L2 = 0.8,   max = 0.8; min(.8, 3) -> 0.8  (clipped)
    # tok3 A=-1 r=4.0: L1 = 4,    L2 = 1.28,  max = 4;   min(4, 3)  -> 3    (dual clip)
    # token-mean = (-1.1 - 1.28 + 0.8 + 3) / 4 = 0.355
    logprobs, old, adv, mask = _ppo_case()
    loss, metrics = ppo_policy_loss(logprobs, old, adv, mask)
    close(loss, 0.355, atol=1e-6)
    close(metrics["pg_clipfrac"], 0.5)
    close(metrics["pg_clipfrac_lower"], 0.25)
    # ppo_kl = mean(old - new) = -(ln 1.1 + ln 1.5 + ln .5 + ln 4)/4 = -1.1939225/4
    close(metrics["ppo_kl"], -1.1939225 / 4, atol=1e-6)
    close(metrics["ratio_mean"], 7.1 / 4)
    assert all(not v.requires_grad for v in metrics.values())


def test_ppo_policy_loss_public_signature():
    params = inspect.signature(ppo_policy_loss).parameters
    assert list(params)[:4] == ["logprobs", "old_logprobs", "advantages", "mask"]
    defaults = {
        name: p.default for name, p in params.items() if p.kind is inspect.Parameter.KEYWORD_ONLY
    }
    assert defaults["clip_low"] == 0.2 and defaults["clip_high"] == 0.28
    assert defaults["dual_clip"] == 3.0 and defaults["agg_mode"] == "token-mean"


def test_ppo_policy_loss_all_zero_mask():
    logprobs, old, adv, _ = _ppo_case()
    loss, metrics = ppo_policy_loss(logprobs.requires_grad_(), old, adv, torch.zeros(1, 4))
    assert loss.item() == 0.0
    assert all(torch.isfinite(v) for v in metrics.values())
    loss.backward()
    assert torch.equal(logprobs.grad, torch.zeros(1, 4))


def _per_token_losses(logprobs, old, adv, **kwargs):
    """Each token's loss on its own (a 1-token batch)."""
    return torch.stack([
        ppo_policy_loss(logprobs[:, t : t + 1], old[:, t : t + 1], adv[:, t : t + 1], torch.ones(1, 1), **kwargs)[0]
        for t in range(logprobs.shape[1])
    ])  # fmt: skip


def test_clip_higher_changes_only_positive_advantages_with_ratio_between_the_two_ceilings():
    # ratio 1.25 with A=+1: the symmetric clip (0.2/0.2) caps it at 1.2 -> -1.2; clip-higher
    # (0.2/0.28) -> -1.25. Unchanged: A=+1 r=1.1 (inside both ranges) -> -1.1; A=+1 r=0.5: max(-0.5,
    # -0.8) = -0.5 (the floor is the same); A<0 at any ratio: max(|A| r, |A| clip(r)) = |A| r is not
    # clipped from above: r=1.25 -> 1.25, r=4 -> dual clip 3. (A=+1 with r > 1.28 would change too,
    # -1.2 vs -1.28: that is the point of clip-higher, not a side effect.)
    ratio = T([[1.25, 1.1, 0.5, 1.25, 4.0]])
    adv = T([[1.0, 1.0, 1.0, -1.0, -1.0]])
    old = torch.zeros(1, 5)
    sym = _per_token_losses(ratio.log(), old, adv, clip_low=0.2, clip_high=0.2)
    higher = _per_token_losses(ratio.log(), old, adv, clip_low=0.2, clip_high=0.28)
    close(sym, [-1.2, -1.1, -0.5, 1.25, 3.0])
    close(higher, [-1.25, -1.1, -0.5, 1.25, 3.0])
    # the clipped token gets no gradient under the symmetric clip, the full ratio gradient under
    # clip-higher: d(-A r)/d logp = -A r = -1.25
    lp = ratio.log()[:, :1].clone().requires_grad_(True)
    for clip_high, expected_grad in [(0.2, 0.0), (0.28, -1.25)]:
        loss, _ = ppo_policy_loss(lp, old[:, :1], adv[:, :1], torch.ones(1, 1), clip_high=clip_high)
        (g,) = torch.autograd.grad(loss, lp)
        close(g, [[expected_grad]], atol=1e-6)


def test_dual_clip_changes_only_negative_advantages_with_ratio_above_c():
    # tok0 A=-1 r=4 (> c=3): capped at 3 with dual clip, 4 without. tok1 A=-1 r=2 (< c): 2 either
    # way. tok2 A=+1 r=4: -1.28 either way. tok3 A=-1 r=0.5: 0.8 either way.
    ratio = T([[4.0, 2.0, 4.0, 0.5]])
    adv = T([[-1.0, -1.0, 1.0, -1.0]])
    old = torch.zeros(1, 4)
    on = _per_token_losses(ratio.log(), old, adv, dual_clip=3.0)
    off = _per_token_losses(ratio.log(), old, adv, dual_clip=None)
    close(on, [3.0, 2.0, -1.28, 0.8])
    close(off, [4.0, 2.0, -1.28, 0.8])
    # the capped token has no gradient (the cap -A*c does not depend on the policy)
    lp = ratio.log()[:, :1].clone().requires_grad_(True)
    (g,) = torch.autograd.grad(ppo_policy_loss(lp, old[:, :1], adv[:, :1], torch.ones(1, 1))[0], lp)
    assert g.item() == 0.0
    with pytest.raises(ValueError, match="dual_clip"):
        ppo_policy_loss(lp, old[:, :1], adv[:, :1], torch.ones(1, 1), dual_clip=1.0)


# ------------------------------------------------------------------------------------------------ actor objective


def _loss(**changes) -> PolicyLossSettings:
    """``ppo_policy_loss``'s defaults (clip 0.2 / 0.28, dual clip 3, token-mean), no entropy."""
    return PolicyLossSettings(**{"entropy_coeff": 0.0, **changes})


def test_entropy_coefficient_changes_total_but_not_pg_loss_or_policy_gradient():
    logprobs, old, adv, mask = _ppo_case()
    logprobs = logprobs.clone().requires_grad_(True)
    entropy = T([[1.0, 2.0, 3.0, 4.0]])  # token-mean 2.5
    base, m0 = actor_loss(logprobs, old, adv, mask, _loss(), entropy=entropy)
    bonus, m1 = actor_loss(logprobs, old, adv, mask, _loss(entropy_coeff=0.01), entropy=entropy)
    # total = pg_loss - 0.01 * 2.5 = 0.355 - 0.025
    close(base, 0.355)
    close(bonus, 0.330)
    close(m0["pg_loss"], m1["pg_loss"])
    close(m1["entropy_loss"], 2.5)
    (g0,) = torch.autograd.grad(base, logprobs)
    (g1,) = torch.autograd.grad(bonus, logprobs)
    close(g0, g1)
    with pytest.raises(ValueError, match="entropy"):
        actor_loss(logprobs, old, adv, mask, _loss(entropy_coeff=0.01))


@pytest.mark.parametrize("kind", KL_KINDS)
def test_each_kl_estimator_adds_coef_times_its_aggregate_and_nothing_else(kind):
    logprobs, old, adv, mask = _ppo_case()
    ref = logprobs.detach() - 0.5  # logp - ref = 0.5 on every token
    pg, _ = ppo_policy_loss(logprobs, old, adv, mask)
    no_kl, m0 = actor_loss(logprobs, old, adv, mask, _loss(kl_kind=kind), ref_logprobs=ref)
    with_kl, m1 = actor_loss(
        logprobs, old, adv, mask, _loss(kl_coef=0.1, kl_kind=kind), ref_logprobs=ref
    )
    # per token: k1/abs = 0.5, k2 = 0.125, k3 = exp(-0.5) + 0.5 - 1 = 0.1065307 (token-mean of a
    # constant)
    base = kind.rstrip("+")
    expected_kl = {"k1": 0.5, "kl": 0.5, "abs": 0.5, "k2": 0.125, "mse": 0.125,
                   "k3": 0.1065307, "low_var_kl": 0.1065307}[base]  # fmt: skip
    close(no_kl, pg)
    close(m1["kl_loss"], expected_kl)
    close(with_kl, pg + 0.1 * expected_kl)
    close(m0["pg_loss"], m1["pg_loss"])


def test_kl_coef_needs_reference():
    logprobs, old, adv, mask = _ppo_case()
    with pytest.raises(ValueError, match="ref_logprobs"):
        actor_loss(logprobs, old, adv, mask, _loss(kl_coef=0.1))


# ------------------------------------------------------------------------------------------------ KL estimators


def test_kl_estimators_hand_values_and_gradients():
    # token 0: logp -1, ref -1.5 (logp - ref = .5); token 1: logp -2, ref -1 (logp - ref = -1)
    ref = T([-1.5, -1.0])
    cases = {
        # value, d/dlogp
        "k1": ([0.5, -1.0], [1.0, 1.0]),
        "abs": ([0.5, 1.0], [1.0, -1.0]),
        "k2": ([0.125, 0.5], [0.5, -1.0]),  # 1/2 (x)^2 -> x
        # k3 = e^d - d - 1 with d = ref - logp = [-.5, 1]: [.6065307 + .5 - 1, e - 2]; grad 1 - e^d
        "k3": ([0.1065307, math.e - 2.0], [1.0 - math.exp(-0.5), 1.0 - math.e]),
    }
    aliases = {"kl": "k1", "mse": "k2", "low_var_kl": "k3"}
    for kind in KL_KINDS:
        base = kind.rstrip("+")
        value, grad = cases[aliases.get(base, base)]
        logp = T([-1.0, -2.0], requires_grad=True)
        out = kl_penalty(logp, ref, kind)
        close(out.detach(), value, atol=1e-6)
        (g,) = torch.autograd.grad(out.sum(), logp)
        # straight-through '+': forward of the estimator, gradient of k2 (= logp - ref)
        close(g, [0.5, -1.0] if kind.endswith("+") else grad, atol=1e-6)


def test_kl_clamps_and_unknown_kind():
    # k3: d = ref - logp clamped to +-20, the estimate clamped to +-10
    out = kl_penalty(T([0.0, -30.0]), T([-30.0, 0.0]), "k3")
    close(out, [10.0, 10.0])
    with pytest.raises(ValueError, match="low_var_kl"):
        kl_penalty(T([0.0]), T([0.0]), "low-var-kl")  # type: ignore[arg-type]


# ------------------------------------------------------------------------------------------------ value loss


def test_value_loss_hand_values():
    # clip 0.5:
    # tok0 v=1.0 old=0.8 R=1.5: v_clip = 1.0; (v-R)^2 = .25, (vc-R)^2 = .25 -> .5*.25 = .125   (not clipped)
    # tok1 v=2.0 old=1.0 R=1.0: v_clip = 1.5; 1 vs .25 -> .5*1 = .5                            (not clipped)
    # tok2 v=2.0 old=1.0 R=3.0: v_clip = 1.5; 1 vs 2.25 -> .5*2.25 = 1.125                     (clipped)
    # token-mean = 1.75/3; vf_clipfrac = 1/3
    v, old, ret = T([[1.0, 2.0, 2.0]]), T([[0.8, 1.0, 1.0]]), T([[1.5, 1.0, 3.0]])
    loss, metrics = value_loss(v, old, ret, torch.ones(1, 3))
    close(loss, 1.75 / 3)
    close(metrics["vf_clipfrac"], 1.0 / 3.0)
    close(metrics["vpred_mean"], 5.0 / 3.0)
    # no clipping: .5 * (.25 + 1 + 1)/3 = .375
    close(value_loss(v, old, ret, torch.ones(1, 3), clip_range=None)[0], 0.375)
    # all-zero mask
    loss, metrics = value_loss(v, old, ret, torch.zeros(1, 3))
    assert loss.item() == 0.0 and all(torch.isfinite(x) for x in metrics.values())


# ------------------------------------------------------------------------------------------------ TIS


def test_tis_weights_truncate_the_trainer_engine_ratio():
    # exp(old - engine): exp(ln 1.5) = 1.5; exp(ln 0.25) = 0.25; exp(ln 4) = 4 -> min(4, 2) = 2;
    # exp(0) = 1
    old = T([[math.log(1.5), math.log(0.25), math.log(4.0), -0.3]])
    engine = torch.zeros(1, 4)
    engine[0, 3] = -0.3
    close(tis_weights(old, engine, cap=2.0), [[1.5, 0.25, 2.0, 1.0]], atol=1e-6)
    with pytest.raises(ValueError, match="cap"):
        tis_weights(old, engine, cap=0.0)


def test_actor_loss_is_weights_scale_the_policy_gradient_term_only():
    # _ppo_case per-token losses (see test_ppo_policy_loss_hand_values): [-1.1, -1.28, 0.8, 3.0]
    # weights [2, 1, 0.5, 0] -> [-2.2, -1.28, 0.4, 0] -> token-mean = -3.08 / 4 = -0.77
    # entropy term unchanged: H = 1 everywhere, coeff 0.1 -> loss = -0.77 - 0.1 = -0.87
    logprobs, old, adv, mask = _ppo_case()
    w = T([[2.0, 1.0, 0.5, 0.0]])
    lp = logprobs.clone().requires_grad_(True)
    bonus = _loss(entropy_coeff=0.1)
    loss, metrics = actor_loss(lp, old, adv, mask, bonus, entropy=torch.ones(1, 4), is_weights=w)
    close(loss, -0.87, atol=1e-6)
    close(metrics["is_weight_mean"], 3.5 / 4)
    plain, _ = actor_loss(logprobs, old, adv, mask, bonus, entropy=torch.ones(1, 4))
    close(plain, 0.355 - 0.1, atol=1e-6)  # no weights = weights of one
    ones, _ = actor_loss(
        logprobs, old, adv, mask, bonus, entropy=torch.ones(1, 4), is_weights=torch.ones(1, 4)
    )
    close(ones, plain, atol=0)
    # gradient of token 0 (unclipped, A=+1, r=1.1): d(-w A r)/dlogp / 4 = -2 * 1.1 / 4 = -0.55; the
    # weight is a constant: no gradient flows into it
    loss.backward()
    close(lp.grad[0, 0], -0.55, atol=1e-6)
