"""Masked reductions, then the policy / value losses, KL estimators and loss aggregation built on them
for StarPO (veRL's core_algos); token entropy and log-probs from logits are in
:mod:`ragen_lightning.algos.logits`. The masked reductions are shared with the advantage math and
the metrics, which import them from here: one file holds all the token arithmetic of an update.

Shapes: token tensors ``[B, T]``; ``mask`` is the 0/1 loss mask. Losses return ``(loss, metrics)``;
metrics are detached 0-dim tensors (no host sync per micro-batch).

Equations
- PPO clipped surrogate (Schulman et al. 2017) with asymmetric clip ("clip-higher", DAPO, Yu et al.
  2025) and dual clip (Ye et al. 2020): ``ρ = exp(clamp(logp − logp_old, ±20))``, ``L1 = −A·ρ``,
  ``L2 = −A·clip(ρ, 1−ε_low, 1+ε_high)``, ``Lc = max(L1, L2)``, and for ``A < 0``: ``L = min(Lc,
  −A·c)``.
- Clipped value loss: ``½·max((v−R)², (clip(v, v_old ± ε_v)−R)²)``.
- KL estimators (Schulman 2020, "Approximating KL divergence"): k1 ``logp − logp_ref``, abs
  ``|k1|``, k2 ``½(logp − logp_ref)²``, k3 ``exp(d) − d − 1`` with ``d = logp_ref − logp``; ``+``
  variants are straight-through (value of the estimator, gradient of k2).

Loss aggregation, and the departure from RAGEN / veRL
    Every mode is ``numerator(micro-batch) / normalizer(mini-batch)`` where the numerator is a sum over rows, so the
    micro-batch losses of one mini-batch, each computed with the mini-batch's ``agg_normalizer``,
    add up to the mini-batch loss exactly, and so do the gradients, however the mini-batch is split.
    veRL normalises every micro-batch by its own statistics and then divides by the number of
    micro-batches, so its ``token-mean`` is a mean of per-micro-batch means (with the default
    micro-batch of 1: a per-sequence mean) and changes with the micro-batch size. Definitions (``m``
    the mask of the whole mini-batch, B its rows):

    ===========================  ==================================  ==========================
    mode                         numerator (sum over rows i)         normalizer
    ===========================  ==================================  ==========================
    ``token-mean``               ``Σ_t l·m``                         ``Σ m`` (trained tokens)
    ``seq-mean-token-mean``      ``Σ_t l·m / Σ_t m`` (0 if empty)    rows with ``Σ_t m > 0``
    ``seq-mean-token-sum``       ``Σ_t l·m``                         B (all rows, as veRL)
    ``seq-mean-token-sum-norm``  ``Σ_t l·m``                         ``B · horizon``
    ===========================  ==================================  ==========================

    ``seq-mean-token-sum-norm`` (Dr.GRPO's constant normaliser): veRL divides the micro-batch token
    sum by ``mask.shape[-1]``, the padded length of that micro-batch, which changes with padding and
    micro-batch size. Here the divisor is ``B · horizon`` with ``horizon`` a fixed length passed in
    (the maximum response length); it defaults to the mask's width of the tensor given to
    ``agg_normalizer``. With micro-batches of one sequence and ``horizon = T`` this is veRL's value.
    An all-zero mask gives a normaliser of 0, which is replaced by 1: the loss is 0, never NaN. Data
    parallel (gradients averaged over W ranks): pass the all-reduced (summed) normaliser divided by
    W, and the averaged gradient is the gradient of the global mini-batch loss.

Masked reductions
    A ``mask`` is a 0/1 tensor (bool or float) broadcastable to the values; positions with mask 0
    never influence a result, even when they hold NaN or inf (they are selected away with
    ``torch.where``, not multiplied by 0, so neither the value nor the gradient picks up ``0 * inf =
    nan``). Every reduction over an all-zero mask returns 0, never NaN. Statistics are shift-invariant
    and computed after subtracting a reference value taken from the data itself (the first selected
    element), so a constant input gives a variance of exactly 0 in float32. Plain ``torch.std`` of
    eight copies of 0.3 is 3e-8, which would let a zero-variance group slip past a ``|std| <= 1e-10``
    test.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch

from ragen_lightning.errors import Domain, check_domains

__all__ = [
    "AGG_MODES",
    "KL_KINDS",
    "AggMode",
    "KLKind",
    "PolicyLossSettings",
    "actor_loss",
    "as_bool_mask",
    "agg_normalizer",
    "aggregate",
    "kl_penalty",
    "masked_mean",
    "masked_sum",
    "masked_var",
    "masked_whiten",
    "ppo_policy_loss",
    "safe_count",
    "tis_weights",
    "value_loss",
]

Normalizer = float | int | torch.Tensor | None

# --------------------------------------------------------------------------------------------------
# Masked reductions
# --------------------------------------------------------------------------------------------------


def as_bool_mask(mask: torch.Tensor) -> torch.Tensor:
    """A 0/1 mask as a bool tensor (non-zero = selected)."""
    return mask if mask.dtype == torch.bool else mask != 0


def safe_count(count: torch.Tensor) -> torch.Tensor:
    """``count`` with zeros replaced by 1, for use as a denominator whose numerator is then 0 as
    well."""
    return torch.where(count > 0, count, torch.ones_like(count))


def masked_sum(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Σ values over the selected positions (over ``dim``, or everything when ``dim`` is None)."""
    selected = torch.where(
        as_bool_mask(mask), values, torch.zeros((), dtype=values.dtype, device=values.device)
    )
    return selected.sum() if dim is None else selected.sum(dim)


def _count(values: torch.Tensor, mask: torch.Tensor, dim: int | None) -> torch.Tensor:
    m = torch.broadcast_to(as_bool_mask(mask), values.shape).to(values.dtype)
    return m.sum() if dim is None else m.sum(dim)


def masked_mean(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean over the selected positions; 0 where nothing is selected."""
    return masked_sum(values, mask, dim) / safe_count(_count(values, mask, dim))


def _reference(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The first selected element (0 if none), detached: the shift that makes constant inputs exact.

    No host sync: the element is gathered at ``argmax(mask)`` and replaced by 0 when nothing is
    selected.
    """
    flat_mask = torch.broadcast_to(as_bool_mask(mask), values.shape).reshape(-1)
    if flat_mask.numel() == 0:
        return torch.zeros((), dtype=values.dtype, device=values.device)
    idx = flat_mask.to(torch.uint8).argmax()
    first = values.detach().reshape(-1)[idx]
    return torch.where(flat_mask[idx], first, torch.zeros_like(first))


def masked_var(values: torch.Tensor, mask: torch.Tensor, unbiased: bool = True) -> torch.Tensor:
    """Variance of all selected positions together (Bessel-corrected by default).

    Returns 0 when fewer than two positions are selected (unbiased) or none (biased), instead of
    NaN/inf.
    """
    shifted = values - _reference(values, mask)
    mean = masked_mean(shifted, mask)
    sq_sum = masked_sum((shifted - mean) ** 2, mask)
    count = _count(values, mask, None)
    denom = count - 1 if unbiased else count
    return sq_sum / safe_count(denom) * (denom > 0)


def masked_whiten(
    values: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True, eps: float = 1e-8
) -> torch.Tensor:
    """``(x − μ) / sqrt(σ² + eps)`` with μ, σ² the masked mean and unbiased masked variance over the
    whole tensor.

    Like the reference, the transform is applied to every position (statistics come from the
    selected ones only); with ``shift_mean=False`` the mean is added back (scale only). An all-zero
    or single-token mask gives σ² = 0 and no NaN.
    """
    shifted = values - _reference(values, mask)
    centred = shifted - masked_mean(shifted, mask)  # exactly 0 for a constant input
    whitened = centred * torch.rsqrt(masked_var(values, mask, unbiased=True) + eps)
    return whitened if shift_mean else whitened + masked_mean(values, mask)


# --------------------------------------------------------------------------------------------------
# Aggregation
# --------------------------------------------------------------------------------------------------

AggMode = Literal[
    "token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"
]


def _rows(mask: torch.Tensor) -> torch.Tensor:
    return torch.tensor(float(mask.shape[0]), device=mask.device)


def _token_count(mask: torch.Tensor, horizon: int | None) -> torch.Tensor:
    return mask.sum().to(torch.float32)


def _nonempty_rows(mask: torch.Tensor, horizon: int | None) -> torch.Tensor:
    return (mask.sum(-1) > 0).sum().to(torch.float32)


def _all_rows(mask: torch.Tensor, horizon: int | None) -> torch.Tensor:
    return _rows(mask)


def _rows_times_horizon(mask: torch.Tensor, horizon: int | None) -> torch.Tensor:
    return _rows(mask) * float(mask.shape[-1] if horizon is None else horizon)


def _sum_numerator(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return masked_sum(values, mask)


def _seq_mean_numerator(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    per_row = masked_sum(values, mask, dim=-1) / safe_count(mask.sum(-1).to(values.dtype))
    return per_row.sum()


_AGG: dict[str, tuple[Callable[..., torch.Tensor], Callable[..., torch.Tensor]]] = {
    "token-mean": (_sum_numerator, _token_count),
    "seq-mean-token-mean": (_seq_mean_numerator, _nonempty_rows),
    "seq-mean-token-sum": (_sum_numerator, _all_rows),
    "seq-mean-token-sum-norm": (_sum_numerator, _rows_times_horizon),
}
AGG_MODES: tuple[str, ...] = tuple(_AGG)


def _agg_fns(agg_mode: str) -> tuple[Callable[..., torch.Tensor], Callable[..., torch.Tensor]]:
    try:
        return _AGG[agg_mode]
    except KeyError:
        raise ValueError(f"agg_mode must be one of {list(AGG_MODES)}, got {agg_mode!r}") from None


def agg_normalizer(
    mask: torch.Tensor, agg_mode: AggMode, *, horizon: int | None = None
) -> torch.Tensor:
    """The denominator of ``agg_mode`` for the mini-batch whose ``[B, T]`` mask is given (see the
    module docstring).

    Compute it once per mini-batch and pass it as ``normalizer=`` to every micro-batch's loss.
    ``horizon`` only matters for ``seq-mean-token-sum-norm`` (default: ``mask.shape[-1]``).
    """
    return _agg_fns(agg_mode)[1](as_bool_mask(mask), horizon)


def aggregate(
    values: torch.Tensor,
    mask: torch.Tensor,
    agg_mode: AggMode = "token-mean",
    *,
    normalizer: Normalizer = None,
    horizon: int | None = None,
) -> torch.Tensor:
    """Reduce ``[B, T]`` per-token ``values`` to a scalar per ``agg_mode``.

    Args:
        values: ``[B, T]`` per-token losses.
        mask: ``[B, T]`` loss mask of these rows.
        agg_mode: one of ``AGG_MODES``.
        normalizer: the mini-batch's ``agg_normalizer``; None = these rows are the whole mini-batch.
        horizon: for ``seq-mean-token-sum-norm`` when ``normalizer`` is None.
    """
    numerator_fn, normalizer_fn = _agg_fns(agg_mode)
    m = as_bool_mask(mask)
    numerator = numerator_fn(values, m)
    denom = normalizer_fn(m, horizon) if normalizer is None else normalizer
    denom = torch.as_tensor(denom, dtype=numerator.dtype, device=numerator.device)
    return numerator / safe_count(denom)


# --------------------------------------------------------------------------------------------------
# Policy and value losses
# --------------------------------------------------------------------------------------------------


def ppo_policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.28,
    dual_clip: float | None = 3.0,
    agg_mode: AggMode = "token-mean",
    normalizer: Normalizer = None,
    horizon: int | None = None,
    is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """PPO clipped policy loss with clip-higher and dual clip (veRL's core_algos).

    Args:
        logprobs: ``[B, T]`` log-probs of the sampled tokens under the current policy (with grad).
        old_logprobs: ``[B, T]`` log-probs under the rollout policy. advantages: ``[B, T]``. mask:
        ``[B, T]`` loss mask. clip_low: ε_low, ratio floor ``1 − ε_low``. clip_high: ε_high, ratio
        ceiling ``1 + ε_high``. dual_clip: c > 1; for negative advantages the loss is capped at
        ``−A·c``. None disables it. agg_mode: aggregation mode; normalizer / horizon: see
        ``aggregate``. is_weights: ``[B, T]`` importance weights (no grad) multiplying each token's
        clipped loss, e.g.
            :func:`tis_weights` to correct for the rollout engine's sampling distribution; None = all ones.

    Metrics (masked means over these rows): ``pg_clipfrac`` (L2 > L1), ``pg_clipfrac_lower`` (dual
    clip active), ``ppo_kl`` (mean of ``old − new``), ``ratio_mean``; ``is_weight_mean`` when
    ``is_weights`` is given.
    """
    if clip_low < 0 or clip_high < 0:
        raise ValueError(f"clip_low and clip_high must be >= 0, got {clip_low}, {clip_high}")
    if dual_clip is not None and dual_clip <= 1.0:
        raise ValueError(f"dual_clip must be > 1 (or None to disable), got {dual_clip}")
    m = as_bool_mask(mask)
    log_ratio = logprobs - old_logprobs
    ratio = torch.exp(torch.clamp(log_ratio, -20.0, 20.0))
    loss_unclipped = -advantages * ratio
    loss_clipped = -advantages * torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
    loss_ppo = torch.maximum(loss_unclipped, loss_clipped)
    per_token = loss_ppo
    dual_active = torch.zeros_like(m)
    if dual_clip is not None:
        loss_dual = -advantages * dual_clip
        negative = advantages < 0
        per_token = torch.where(negative, torch.minimum(loss_ppo, loss_dual), loss_ppo)
        dual_active = (loss_ppo > loss_dual) & negative
    if is_weights is not None:
        per_token = per_token * is_weights.detach()
    loss = aggregate(per_token, m, agg_mode, normalizer=normalizer, horizon=horizon)
    metrics = {
        "pg_clipfrac": masked_mean((loss_clipped > loss_unclipped).float(), m).detach(),
        "pg_clipfrac_lower": masked_mean(dual_active.float(), m).detach(),
        "ppo_kl": masked_mean(-log_ratio, m).detach(),
        "ratio_mean": masked_mean(ratio, m).detach(),
    }
    if is_weights is not None:
        metrics["is_weight_mean"] = masked_mean(is_weights.detach(), m)
    return loss, metrics


def tis_weights(
    old_logprobs: torch.Tensor, engine_logprobs: torch.Tensor, cap: float
) -> torch.Tensor:
    """Truncated importance sampling weights ``min(exp(old_logprobs − engine_logprobs), cap)``,
    detached.

    The rollout engine (e.g. vLLM) samples from a slightly different distribution than the
    trainer's; weighting each token's policy-gradient term by trainer/engine probability, truncated
    at ``cap``, corrects for it with bounded variance (Yao et al. 2025, "Your efficient RL framework
    secretly brings you off-policy RL training").

    Args:
        old_logprobs: ``[B, T]`` the trainer's log-probs of the sampled tokens under the rollout weights.
        engine_logprobs: ``[B, T]`` the engine's log-probs of the same tokens.
        cap: the truncation constant (> 0).
    """
    if cap <= 0:
        raise ValueError(f"the TIS cap must be > 0, got {cap}")
    log_w = (old_logprobs - engine_logprobs).detach().clamp(max=math.log(cap))
    return torch.exp(log_w)


def value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_range: float | None = 0.5,
    agg_mode: AggMode = "token-mean",
    normalizer: Normalizer = None,
    horizon: int | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Clipped value loss (veRL): ``agg(½·max((v−R)², (v_clip−R)²))``, ``v_clip = clip(v, v_old ±
    clip_range)``.

    ``clip_range=None`` gives the plain ``½(v−R)²``. RAGEN always uses ``token-mean``. Metrics:
    ``vf_clipfrac`` (clipped branch strictly larger), ``vpred_mean``.
    """
    m = as_bool_mask(mask)
    loss_unclipped = (values - returns) ** 2
    if clip_range is None:
        per_token, clipped_frac = 0.5 * loss_unclipped, torch.zeros((), device=values.device)
    else:
        v_clip = old_values + torch.clamp(values - old_values, -clip_range, clip_range)
        loss_clipped = (v_clip - returns) ** 2
        per_token = 0.5 * torch.maximum(loss_unclipped, loss_clipped)
        clipped_frac = masked_mean((loss_clipped > loss_unclipped).float(), m)
    loss = aggregate(per_token, m, agg_mode, normalizer=normalizer, horizon=horizon)
    return loss, {
        "vf_clipfrac": clipped_frac.detach(),
        "vpred_mean": masked_mean(values, m).detach(),
    }


# --------------------------------------------------------------------------------------------------
# KL estimators
# --------------------------------------------------------------------------------------------------


def _k1(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    return logprobs - ref_logprobs


def _abs(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    return (logprobs - ref_logprobs).abs()


def _k2(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    return 0.5 * (logprobs - ref_logprobs) ** 2


def _k3(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    d = torch.clamp(ref_logprobs - logprobs, -20.0, 20.0)
    return torch.clamp(torch.exp(d) - d - 1.0, -10.0, 10.0)


_KL_BASE: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "k1": _k1,
    "kl": _k1,
    "abs": _abs,
    "k2": _k2,
    "mse": _k2,
    "k3": _k3,
    "low_var_kl": _k3,
}
KL_KINDS: tuple[str, ...] = tuple(_KL_BASE) + tuple(f"{name}+" for name in _KL_BASE)
KLKind = Literal[
    "k1", "kl", "abs", "k2", "mse", "k3", "low_var_kl",
    "k1+", "kl+", "abs+", "k2+", "mse+", "k3+", "low_var_kl+",
]  # fmt: skip


def kl_penalty(
    logprobs: torch.Tensor, ref_logprobs: torch.Tensor, kind: KLKind = "k1"
) -> torch.Tensor:
    """Per-token KL estimate of the current policy from the reference (veRL's core_algos names and
    clamps).

    ``kind`` with a trailing ``+`` is straight-through: the forward value is the named estimator
    exactly, the gradient is that of k2 (``logp − logp_ref``), which is unbiased for the KL
    gradient.
    """
    straight_through = kind.endswith("+")
    base = _KL_BASE.get(kind[:-1] if straight_through else kind)
    if base is None:
        raise ValueError(f"kind must be one of {list(KL_KINDS)}, got {kind!r}")
    value = base(logprobs, ref_logprobs)
    if not straight_through:
        return value
    k2 = _k2(logprobs, ref_logprobs)
    return value.detach() + (k2 - k2.detach())


# --------------------------------------------------------------------------------------------------
# The actor objective
# --------------------------------------------------------------------------------------------------

# Bounds past which a value is a typo, not a setting (the fields' docs say why).
MAX_CLIP_HIGH = 10.0
MAX_ENTROPY_COEFF = 1.0


@dataclass(frozen=True)
class PolicyLossSettings:
    """The actor's PPO loss (``--model.loss.*``); :func:`actor_loss` reads every field but
    ``tis_cap``, which weights the tokens (:func:`tis_weights`).

    Args:
        clip_low: PPO ratio floor ``1 - clip_low``.
        clip_high: PPO ratio ceiling ``1 + clip_high`` (clip-higher: 0.28 > 0.2); at most 10: a
            ceiling of an 11-fold probability ratio never binds, so a larger value is a typo.
        dual_clip: dual-clip constant for negative advantages (``null`` disables it).
        agg_mode: ``token-mean`` | ``seq-mean-token-mean`` | ``seq-mean-token-sum`` |
            ``seq-mean-token-sum-norm``.
        entropy_coeff: entropy bonus coefficient, in [0, 1]: at 1 the bonus already weighs as much
            as the policy loss (typical: 0.001-0.01); above that the loss only maximises entropy.
        kl_coef: coefficient of a ``KL(actor || reference)`` loss term (0: off, no reference model
            is built).
        kl_kind: the KL loss's estimator (``k1``/``kl``, ``abs``, ``k2``/``mse``,
            ``k3``/``low_var_kl``, ``+`` variants).
        tis_cap: truncated importance sampling (null: off): token weights
            ``min(exp(old - engine log-probs), tis_cap)``; needs ``--data.sampling.temperature 1``.
    """

    clip_low: float = 0.2
    clip_high: float = 0.28
    dual_clip: float | None = 3.0
    agg_mode: AggMode = "token-mean"
    entropy_coeff: float = 0.001
    kl_coef: float = 0.0
    kl_kind: KLKind = "k1"
    tis_cap: float | None = None

    def __post_init__(self):
        check_domains(
            "--model.loss.",
            self,
            {
                "clip_low": Domain(
                    0, 1, high_open=True
                ),  # the ratio floor 1 - clip_low must stay > 0
                "clip_high": Domain(0, MAX_CLIP_HIGH),
                "dual_clip": Domain(low=1, low_open=True, none=True),  # bound c * A (A < 0): c > 1
                "entropy_coeff": Domain(0, MAX_ENTROPY_COEFF),
                "kl_coef": Domain(low=0),
                "tis_cap": Domain(low=0, low_open=True, none=True),
            },
        )


def actor_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    loss: PolicyLossSettings,
    *,
    entropy: torch.Tensor | None = None,
    ref_logprobs: torch.Tensor | None = None,
    normalizer: Normalizer = None,
    horizon: int | None = None,
    is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """``pg_loss − entropy_coeff·agg(H) + kl_coef·agg(KL)`` (veRL's core_algos), every term
    aggregated by ``loss.agg_mode``; clipping and coefficients from ``loss``.

    Args:
        entropy: ``[B, T]`` token entropies (``algos.logits.entropy_from_logits``), needed when
            ``loss.entropy_coeff != 0``; the entropy term is added when it is given.
        ref_logprobs: ``[B, T]`` reference log-probs, needed when ``loss.kl_coef != 0``; the KL
            term (estimator ``loss.kl_kind``, :func:`kl_penalty`) is added when they are given.
        is_weights: per-token importance weights of the policy-gradient term only (``tis_weights``).
        normalizer, horizon: as in ``aggregate``.

    Metrics: those of ``ppo_policy_loss`` plus ``pg_loss``, ``entropy_loss`` and ``kl_loss`` (each
    this micro-batch's share of the mini-batch value: they add up over micro-batches) when the term
    is given.
    """
    if loss.entropy_coeff != 0.0 and entropy is None:
        raise ValueError("entropy_coeff != 0 needs the token entropy (entropy=...)")
    if loss.kl_coef != 0.0 and ref_logprobs is None:
        raise ValueError("kl_coef != 0 needs the reference log-probs (ref_logprobs=...)")
    agg = {"agg_mode": loss.agg_mode, "normalizer": normalizer, "horizon": horizon}
    pg_loss, metrics = ppo_policy_loss(
        logprobs, old_logprobs, advantages, mask,
        clip_low=loss.clip_low, clip_high=loss.clip_high, dual_clip=loss.dual_clip,
        is_weights=is_weights, **agg,
    )  # fmt: skip
    total = pg_loss
    metrics["pg_loss"] = pg_loss.detach()
    if entropy is not None:
        entropy_loss = aggregate(entropy, mask, **agg)
        total = total - loss.entropy_coeff * entropy_loss
        metrics["entropy_loss"] = entropy_loss.detach()
    if ref_logprobs is not None:
        kl_loss = aggregate(kl_penalty(logprobs, ref_logprobs, loss.kl_kind), mask, **agg)
        total = total + loss.kl_coef * kl_loss
        metrics["kl_loss"] = kl_loss.detach()
    return total, metrics
