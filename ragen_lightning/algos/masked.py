"""Masked reductions shared by the advantage and loss math.

A ``mask`` is a 0/1 tensor (bool or float) broadcastable to the values; positions with mask 0 never
influence a result, even when they hold NaN or inf (they are selected away with ``torch.where``, not
multiplied by 0, so neither the value nor the gradient picks up ``0 * inf = nan``). Every reduction
over an all-zero mask returns 0, never NaN.

Statistics are shift-invariant and computed after subtracting a reference value taken from the data
itself (the first selected element), so a constant input gives a variance of exactly 0 in float32.
Plain ``torch.std`` of eight copies of 0.3 is 3e-8, which would let a zero-variance group slip past
a ``|std| <= 1e-10`` test.
"""

from __future__ import annotations

import torch

__all__ = ["as_bool_mask", "masked_mean", "masked_sum", "masked_var", "masked_whiten", "safe_count"]


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
