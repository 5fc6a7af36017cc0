"""Token entropy and log-probs from logits, chunked over rows so the ``[rows, V]`` temporaries stay
bounded.

- Entropy of the softmax of logits: ``H = logsumexp(z) − Σ softmax(z)·z``, computed on ``z − max z``
  in at least float32 (``-inf`` entries, i.e. a masked vocabulary, contribute 0, never NaN).
- Log-prob of a label: ``z[label] − logsumexp(z)``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

__all__ = ["entropy_from_logits", "logprobs_from_logits"]


def _chunked_rows(
    fn: Callable[..., torch.Tensor],
    logits: torch.Tensor,
    chunk_size: int | None,
    *extra: torch.Tensor,
) -> torch.Tensor:
    """``fn(rows [R, V], *extra_rows [R]) -> [R]`` over the flattened leading dims, ``chunk_size``
    rows at a time."""
    lead = logits.shape[:-1]
    rows = logits.reshape(-1, logits.shape[-1])
    flat_extra = [e.reshape(-1) for e in extra]
    if chunk_size is None or chunk_size >= rows.shape[0]:
        return fn(rows, *flat_extra).reshape(lead)
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1 or None, got {chunk_size}")
    parts = [
        fn(rows[i : i + chunk_size], *(e[i : i + chunk_size] for e in flat_extra))
        for i in range(0, rows.shape[0], chunk_size)
    ]
    return torch.cat(parts).reshape(lead)


def _upcast(z: torch.Tensor) -> torch.Tensor:
    return z.float() if z.dtype in (torch.float16, torch.bfloat16) else z


def _entropy_rows(z: torch.Tensor) -> torch.Tensor:
    z = _upcast(z)
    z = z - z.max(dim=-1, keepdim=True).values.detach()  # shift-invariant; keeps lse and p·z small
    lse = torch.logsumexp(z, dim=-1)
    p = torch.softmax(z, dim=-1)
    # -inf logits (masked vocabulary) have p = 0; zero them before the product, or 0·(−inf) = NaN in
    # the value and in the gradient.
    finite_z = torch.where(torch.isneginf(z), torch.zeros((), dtype=z.dtype, device=z.device), z)
    return lse - (p * finite_z).sum(-1)


def entropy_from_logits(logits: torch.Tensor, chunk_size: int | None = None) -> torch.Tensor:
    """``[..., V]`` logits -> ``[...]`` entropy of their softmax, ``logsumexp(z) − Σ softmax(z)·z``.

    Computed on ``z − max z`` in at least float32, so logits of ±1e4 and ``-inf`` entries are fine
    (every row needs one finite logit). ``chunk_size`` rows (of the flattened leading dims) are
    processed at a time, bounding the ``[rows, V]`` temporaries.
    """
    return _chunked_rows(_entropy_rows, logits, chunk_size)


def _logprob_rows(z: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    z = _upcast(z)
    return z.gather(-1, labels[:, None]).squeeze(-1) - torch.logsumexp(z, dim=-1)


def logprobs_from_logits(
    logits: torch.Tensor, labels: torch.Tensor, chunk_size: int | None = None
) -> torch.Tensor:
    """``log softmax(logits)[label]``: ``[..., V]`` and ``[...]`` -> ``[...]``, chunked like
    ``entropy_from_logits``."""
    return _chunked_rows(_logprob_rows, logits, chunk_size, labels)
