"""TorchMetrics for collapse diagnostics (SPEC §6.1-6.2): token entropy, the mutual-information family and retrieval
of a cross log-prob matrix, and the valid-thinking rate.

States are float64 sums and counts with ``dist_reduce_fx="sum"`` (exact across ranks, ``merge_state`` works). The
equations live in ``functional.py``; the classes only accumulate them.

Reading the four regimes (SPEC §6.2), with H = ``conditional_entropy`` and I = ``mi``:
high H, high I = diverse reasoning (healthy); low H, high I = compressed reasoning (fine); high H, low I = template
collapse (the reasoning no longer depends on the input, invisible to entropy alone); low H, low I = low-entropy
collapse.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from ragen_lightning.algos.masked import as_bool_mask, masked_sum

from .functional import DEFAULT_TOPK, mi_row_terms, retrieval
from .rollout import RatioMetric, SumStateMetric, _ratio

__all__ = ["MutualInformation", "TokenEntropy", "ValidThinkingRate"]


class TokenEntropy(SumStateMetric):
    """Token-mean entropy ``Σ H_t·m_t / Σ m_t`` of the policy over trained tokens (``actor/entropy``).

    ``update(entropy [B, T], mask [B, T])`` with ``entropy`` from ``functional.token_entropy``. Healthy: slow decline.
    A sharp drop together with in-group reward std falling towards 0 is the echo-trap warning; a stable entropy does
    NOT rule out template collapse (check ``MutualInformation``).
    """

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self._add_sum_state("entropy_sum")
        self._add_sum_state("tokens")

    def update(self, entropy: torch.Tensor, mask: torch.Tensor) -> None:
        m = torch.broadcast_to(as_bool_mask(mask), entropy.shape)
        self._add("entropy_sum", masked_sum(entropy.to(torch.float64), m))
        self._add("tokens", m.sum())

    def compute(self) -> torch.Tensor:
        return _ratio(self.entropy_sum, self.tokens)


class MutualInformation(SumStateMetric):
    """MI family and retrieval accumulated over the rows of every cross log-prob matrix seen.

    ``update(cross_logprobs [M, N], prompt_index [M], prompt_signature [N] | None)``: each call's matrix is computed
    by the caller (teacher forcing); the per-row matched ``a_m = ℓ[m, col_m]`` and marginal
    ``b_m = logsumexp_j ℓ[m, j] − log N`` (N of that call) are summed, so every value of ``compute`` is the mean over
    ALL rows of all updates (and ranks), not a mean of per-call means:

    - ``mi = mean(a) − mean(b)``; ``mi_upper_bound`` = row-weighted mean of log N;
      ``conditional_entropy = −mean(a)`` (H(Z|X)); ``marginal_entropy = −mean(b)`` (H(Z));
    - ``marginal_std = sqrt(mean(b²) − mean(b)²)`` (population std over all rows; from float64 sums, so a constant b
      gives ~1e-8 rather than exactly 0); ``mi_zscore = mean((a − b)/(marginal_std + std_eps))``, which equals
      ``mi / (marginal_std + std_eps)`` because the std is shared by all rows;
    - ``retrieval_accuracy(@k)`` = hits / rows (ties -> lower column, identical prompts equivalent via signatures);
      ``retrieval_chance_level`` = mean over rows of ``count(sig(true_m))/N``; ``retrieval_chance_level@k`` =
      row-weighted mean over calls of ``min(1, chance_call·k_eff)`` (the SPEC value for a single call; splitting
      one matrix's rows over calls changes it only where the clip at 1 binds);
      ``retrieval_above_chance(@k)`` = accuracy − chance.

    Healthy: ``mi`` well above 0 (up to log N) and retrieval well above chance. ``mi`` and retrieval falling to
    0 / chance while ``conditional_entropy`` stays high = template collapse. Use one instance per variant (per-token
    mean, per-sequence sum) and per sampling label. The EMA z-score is stateful across steps, not across rows: use
    ``functional.mutual_information(..., marginal_std_ema=...)`` for it.
    """

    def __init__(
        self, topk: Sequence[int] = DEFAULT_TOPK, std_eps: float = 1e-3, **kwargs
    ) -> None:
        super().__init__(**kwargs)
        if any(k < 1 for k in topk):
            raise ValueError(f"topk entries must be >= 1, got {tuple(topk)}")
        self.topk = (
            1,
            *sorted({int(k) for k in topk} - {1}),
        )  # k = 1 always: retrieval_accuracy
        self.std_eps = std_eps
        for name in (
            "matched_sum",
            "marginal_sum",
            "marginal_sq_sum",
            "rows",
            "log_n_sum",
        ):
            self._add_sum_state(name)
        self._add_sum_state("hits", (len(self.topk),))
        self._add_sum_state("chance_k_sum", (len(self.topk),))

    def update(
        self,
        cross_logprobs: torch.Tensor,
        prompt_index: torch.Tensor,
        prompt_signature: torch.Tensor | None = None,
    ) -> None:
        m, n = cross_logprobs.shape if cross_logprobs.dim() == 2 else (0, 0)
        with torch.no_grad():
            matched, marginal = mi_row_terms(cross_logprobs.detach(), prompt_index)
            if m == 0:
                return
            a, b = matched.to(torch.float64), marginal.to(torch.float64)
            self._add("matched_sum", a.sum())
            self._add("marginal_sum", b.sum())
            self._add("marginal_sq_sum", (b * b).sum())
            self._add("rows", float(m))
            self._add("log_n_sum", m * math.log(n))
            hits, chance, k_eff = retrieval(
                cross_logprobs.detach(), prompt_index, prompt_signature, self.topk
            )
            chance = chance.to(torch.float64)
            self._add(
                "hits",
                torch.stack([hits[k].to(torch.float64).sum() for k in self.topk]),
            )
            chance_mean = chance.mean()
            self._add(
                "chance_k_sum",
                torch.stack(
                    [m * (chance_mean * k_eff[k]).clamp(max=1.0) for k in self.topk]
                ),
            )

    def compute(self) -> dict[str, torch.Tensor]:
        rows = self.rows
        a_mean, b_mean = (
            _ratio(self.matched_sum, rows).double(),
            _ratio(self.marginal_sum, rows).double(),
        )
        b_var = (_ratio(self.marginal_sq_sum, rows).double() - b_mean * b_mean).clamp(
            min=0
        )
        sigma = b_var.sqrt()
        mi = a_mean - b_mean
        out = {
            "mi": mi,
            "mi_upper_bound": _ratio(self.log_n_sum, rows),
            "matched_log_prob_mean": a_mean,
            "marginal_log_prob_mean": b_mean,
            "conditional_entropy": -a_mean,
            "marginal_entropy": -b_mean,
            "marginal_std": sigma,
            "mi_zscore": mi / (sigma + self.std_eps),
        }
        for i, k in enumerate(self.topk):
            suffix = "" if k == 1 else f"@{k}"
            acc = _ratio(self.hits[i], rows)
            level = _ratio(self.chance_k_sum[i], rows)
            out[f"retrieval_accuracy{suffix}"] = acc
            out[f"retrieval_chance_level{suffix}"] = level
            out[f"retrieval_above_chance{suffix}"] = acc - level
        return {key: v.float() for key, v in out.items()}


class ValidThinkingRate(RatioMetric):
    """``Σ valid turns / Σ turns with a response`` (SPEC §6.1 ``collapse/valid_thinking_rate``).

    A turn is valid when its ``<think>…</think>`` block is non-empty. ``update(valid_flags)`` or
    ``update(num_valid, num_turns)``. Healthy: near 1; falling means the model drops its reasoning (MI cannot be
    measured on those turns, and they often precede low-entropy collapse).
    """
