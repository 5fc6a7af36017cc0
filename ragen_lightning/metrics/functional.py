"""Pure statistics of rollouts and collapse diagnostics (RAGEN-2; RAGEN's rollout_filter): token
entropy, within-group reward std, pass@k, the valid-thinking rate, the mutual-information family of
a cross log-prob matrix and prompt retrieval.

One home per statistic: the data module, the TorchMetrics classes and the callbacks all call these
functions (the in-group std itself lives in ``algos.filtering.in_group_std`` because the rollout
filter, below this package, needs it).

Imports torch, the standard library and ``ragen_lightning.algos`` only (no lightning, no
torchmetrics, no vllm; a test checks this). Every function returns 0-dim tensors; empty inputs give
0, never NaN.

Cross log-prob matrix
    ``cross_logprobs`` is ``[M, N]``: row m is a sampled reasoning z_m (the text between ``<think>`` and
    ``</think>``), column j a prompt x_j, entry ``log p(z_m | x_j)`` teacher-forced under the actor.
    Two variants (``cross_logprob_matrices``): the per-sequence sum ``Σ_t log p(z_t | x_j, z_<t)``
    and the per-token mean (the sum divided by ``|z_m|``). ``prompt_index[m]`` is the column of the
    prompt z_m was generated from.

Equations (the InfoNCE-style estimator of RAGEN-2)
    matched   ``a_m = ℓ[m, prompt_index[m]]``            (log p(z|x), x the true prompt)
    marginal  ``b_m = logsumexp_j ℓ[m, j] − log N``       (log of the mixture ``1/N Σ_j p(z|x_j)``)
    ``mi = mean(a) − mean(b)`` ∈ [−∞, log N] (``mi_upper_bound = log N``: each ``a_m − b_m ≤ log
    N``) ``conditional_entropy = −mean(a)`` (estimate of H(Z|X)); ``marginal_entropy = −mean(b)``
    (estimate of H(Z), RAGEN's ``reasoning_entropy_est``); ``marginal_std`` = population std of b;
    ``mi_zscore = mean((a − b) / (std(b) + std_eps))``; with an EMA of the std (``ema_update``, init
    = first value, ``σ_ema ← d·σ_ema + (1 − d)·σ``): ``mi_zscore_ema = mean((a − b) / (σ_ema +
    std_eps))``.

Retrieval
    ``pred_m = argmax_j ℓ[m, j]``. Columns whose prompts are identical token lists are equivalent: they carry the same
    ``prompt_signature`` id, and a row counts as retrieved when ``sig(pred_m) ==
    sig(prompt_index[m])``. ``retrieval_accuracy@k``: the true signature is among the signatures of
    the top ``k_eff = min(k, min(8, N))`` columns. Chance: ``chance = mean_m(count_j(sig_j ==
    sig(true_m)) / N)`` (1/N without signatures), ``chance@k = min(1, chance·k_eff)``,
    ``above_chance(@k) = accuracy(@k) − chance(@k)``. Ties are broken towards the LOWER column index
    (``torch.argmax`` returns the first maximum; the top-k uses a stable descending sort), so a
    template-collapsed matrix (every row constant across columns) predicts column 0 for every row:
    its accuracy is the share of rows whose true prompt is column 0's (or equivalent to it), which
    is the chance level when every column is the true prompt of equally many rows.

Regimes (RAGEN-2): high conditional entropy and high MI = diverse reasoning; low entropy, high MI =
compressed reasoning; high entropy, low MI = template collapse (invisible to entropy alone); low
entropy, low MI = low-entropy collapse. Falling within-group reward std (with falling entropy) is
the echo-trap early warning.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from ragen_lightning.algos.filtering import in_group_std
from ragen_lightning.algos.logits import entropy_from_logits
from ragen_lightning.algos.losses import masked_mean, masked_sum, masked_var

__all__ = [
    "DEFAULT_TOPK",
    "MAX_TOPK",
    "cross_logprob_matrices",
    "ema_update",
    "mean_token_entropy",
    "mi_row_terms",
    "mutual_information",
    "pass_at_k",
    "retrieval",
    "token_entropy",
    "valid_thinking_rate",
    "within_group_reward_std",
]

DEFAULT_TOPK: tuple[int, ...] = (1, 2, 4, 8)
MAX_TOPK = 8  # k_eff = min(k, min(MAX_TOPK, N)), as RAGEN


# --------------------------------------------------------------------------------------------------
# Entropy and reward spread
# --------------------------------------------------------------------------------------------------


def token_entropy(logits: torch.Tensor, chunk_size: int | None = None) -> torch.Tensor:
    """``[..., V]`` logits -> ``[...]`` per-token entropy (``algos.logits.entropy_from_logits``)."""
    return entropy_from_logits(logits, chunk_size=chunk_size)


def mean_token_entropy(entropy: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of ``entropy [B, T]`` over the positions with ``mask [B, T]`` = 1 (token mean); 0 for an
    empty mask."""
    return masked_mean(entropy, mask)


def within_group_reward_std(rewards: torch.Tensor) -> torch.Tensor:
    """``[G, N]`` trajectory rewards -> ``[G]`` unbiased in-group std (RAGEN's rollout_filter
    ``in_group_reward_std``).

    0 for ``N = 1`` (RAGEN gives NaN) and exactly 0 for identical rewards (a member is subtracted
    first).
    """
    if rewards.dim() != 2:
        raise ValueError(
            f"rewards must be [num_groups, group_size], got shape {tuple(rewards.shape)}"
        )
    return in_group_std(rewards if rewards.is_floating_point() else rewards.float())


def pass_at_k(num_success: torch.Tensor, group_size: int | torch.Tensor, k: int) -> torch.Tensor:
    """Unbiased pass@k of each group (Chen et al. 2021): ``1 − C(n − c, k) / C(n, k)``, ``n =
    group_size``.

    ``num_success`` ``[G]`` successes c per group; ``group_size`` an int or a ``[G]`` tensor of
    group sizes. ``k`` larger than ``n`` is clipped to ``n`` (pass@n: any success). Computed with
    ``lgamma`` in float64; a group with no success gives exactly 0 and ``n − c < k`` gives exactly
    1, so pass@n is exactly the share of groups with a success.
    """
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    c = num_success.to(torch.float64)
    nf = torch.as_tensor(group_size, dtype=torch.float64, device=c.device).expand_as(c)
    kf = torch.clamp(nf, max=float(k))
    lg = torch.lgamma
    free = nf - c  # failures
    ok = free >= kf
    safe_free = torch.where(ok, free, kf)
    # log [C(n−c, k) / C(n, k)] = [lgΓ(n−c+1) − lgΓ(n+1)] + [lgΓ(n−k+1) − lgΓ(n−c−k+1)]; each
    # bracket is 0 when c = 0
    log_ratio = (lg(safe_free + 1) - lg(nf + 1)) + (lg(nf - kf + 1) - lg(safe_free - kf + 1))
    return torch.where(ok, 1.0 - torch.exp(log_ratio), torch.ones_like(c))


def valid_thinking_rate(valid: torch.Tensor) -> torch.Tensor:
    """``[turns]`` bool (the turn has a non-empty ``<think>…</think>``, ``cross.thinking_flags``) ->
    0-dim float64 share of valid turns (RAGEN's collapse_metrics ``collapse/valid_thinking_rate``);
    0 with no turn."""
    v = valid.to(torch.float64)
    return v.sum() / v.numel() if v.numel() else v.new_zeros(())


# --------------------------------------------------------------------------------------------------
# Mutual information
# --------------------------------------------------------------------------------------------------


def cross_logprob_matrices(
    token_logprobs: torch.Tensor, response_mask: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Token log-probs of each reasoning under each prompt -> ``(token_mean [M, N], seq_sum [M,
    N])``.

    Args:
        token_logprobs: ``[M, N, T]`` ``log p(z_{m,t} | x_j, z_{m,<t})``; padding may hold anything (even NaN).
        response_mask: ``[M, T]`` 1 on the tokens of z_m (the same for every column). A row with no
        token gives 0.
    """
    mask = response_mask[:, None, :]  # [M, 1, T]
    seq_sum = masked_sum(token_logprobs, mask, dim=-1)  # [M, N]
    return masked_mean(token_logprobs, mask, dim=-1), seq_sum


def mi_row_terms(
    cross_logprobs: torch.Tensor, prompt_index: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``[M, N]`` and ``[M]`` -> ``(matched a [M], marginal b [M])``: ``a_m = ℓ[m, col_m]``,
    ``b_m = logsumexp_j ℓ[m, j] − log N``."""
    _check(cross_logprobs, prompt_index)
    ell = cross_logprobs if cross_logprobs.is_floating_point() else cross_logprobs.float()
    n = ell.shape[1]
    matched = ell.gather(1, prompt_index.long()[:, None]).squeeze(1)
    if n == 0:
        return matched, ell.new_zeros(ell.shape[0])
    # log(1/N Σ_j exp ℓ) as max + log(mean exp(ℓ − max)) rather than logsumexp − log N: a row
    # constant across columns then gives b = a exactly (mean of ones is 1), so a template-collapsed
    # matrix has mi = 0, not ±1e-7.
    row_max = ell.max(dim=1).values
    row_max = torch.where(torch.isfinite(row_max), row_max, torch.zeros_like(row_max))
    marginal = row_max + torch.log(torch.exp(ell - row_max[:, None]).mean(dim=1))
    return matched, marginal


def ema_update(state: torch.Tensor | None, value: torch.Tensor, decay: float = 0.9) -> torch.Tensor:
    """``state ← decay·state + (1 − decay)·value``; ``None`` (no history yet) starts at ``value``.

    The caller keeps the state (one per label, e.g. first-turn / trajectory, token / seq) and passes
    it back in.
    """
    value = value.detach()
    return value.clone() if state is None else decay * state + (1.0 - decay) * value


def _population_std(x: torch.Tensor) -> torch.Tensor:
    # masked_var subtracts a member first: a constant b gives exactly 0; empty or one row gives 0.
    return masked_var(x, torch.ones_like(x, dtype=torch.bool), unbiased=False).sqrt()


def retrieval(
    cross_logprobs: torch.Tensor,
    prompt_index: torch.Tensor,
    prompt_signature: torch.Tensor | None = None,
    topk: Sequence[int] = DEFAULT_TOPK,
) -> tuple[dict[int, torch.Tensor], torch.Tensor, dict[int, int]]:
    """Per-row retrieval hits and chance.

    Returns ``(hits, chance, k_eff)``: ``hits[k]`` ``[M]`` bool, the true prompt's signature is
    among the top ``k_eff[k]`` columns (ties -> lower column first); ``chance`` ``[M]`` =
    ``count(sig == sig(true_m)) / N``.
    """
    _check(cross_logprobs, prompt_index)
    m, n = cross_logprobs.shape
    device = cross_logprobs.device
    sig = (
        torch.arange(n, device=device)
        if prompt_signature is None
        else prompt_signature.to(device).long()
    )
    if sig.shape != (n,):
        raise ValueError(f"prompt_signature must be [N] = [{n}], got {tuple(sig.shape)}")
    true_sig = sig[prompt_index.long()]  # [M]
    same = sig[None, :] == true_sig[:, None]  # [M, N] column j equivalent to row m's prompt
    chance = same.sum(1).to(torch.float32) / max(n, 1)
    if any(k < 1 for k in topk):
        raise ValueError(f"topk entries must be >= 1, got {tuple(topk)}")
    k_eff = {k: min(int(k), MAX_TOPK, n) for k in topk}
    k_max = max(k_eff.values(), default=0)
    if m == 0 or n == 0:
        return (
            {k: torch.zeros(m, dtype=torch.bool, device=device) for k in topk},
            chance,
            k_eff,
        )
    # Stable descending sort: among equal log-probs the lower column index ranks first (torch.topk
    # makes no promise).
    order = torch.sort(cross_logprobs, dim=1, descending=True, stable=True).indices[
        :, :k_max
    ]  # [M, k_max]
    hit_at_rank = same.gather(1, order)  # [M, k_max]
    hits = {k: hit_at_rank[:, : k_eff[k]].any(1) for k in topk}
    return hits, chance, k_eff


def _key(name: str, k: int) -> str:
    return name if k == 1 else f"{name}@{k}"


def mutual_information(
    cross_logprobs: torch.Tensor,
    prompt_index: torch.Tensor,
    *,
    prompt_signature: torch.Tensor | None = None,
    topk: Sequence[int] = DEFAULT_TOPK,
    std_eps: float = 1e-3,
    marginal_std_ema: torch.Tensor | None = None,
    ema_decay: float = 0.9,
) -> dict[str, torch.Tensor]:
    """MI family and retrieval of one cross log-prob matrix (see the module docstring for the
    equations).

    Args:
        cross_logprobs: ``[M, N]`` ``log p(z_m | x_j)`` (per-token mean or per-sequence sum: call once per variant).
        prompt_index: ``[M]`` long, the true column of each row. prompt_signature: ``[N]`` ids;
        columns with equal ids hold identical prompts and count as the same prompt in
            retrieval and chance. ``None``: every column distinct.
        topk: retrieval cut-offs; ``k = 1`` (always added) gives ``retrieval_accuracy``, others
            ``retrieval_accuracy@k``, with ``k_eff = min(k, min(8, N))``.
        std_eps: added to the std in the z-scores. marginal_std_ema: the EMA state from the previous
        call for this label (``None`` on the first call). ema_decay: EMA decay ``d`` in ``σ_ema ←
        d·σ_ema + (1 − d)·σ``.

    Returns a dict of detached 0-dim float tensors: ``mi``, ``mi_upper_bound`` (log N),
    ``matched_log_prob_mean``, ``marginal_log_prob_mean``, ``conditional_entropy``,
    ``marginal_entropy``, ``marginal_std``, ``mi_zscore``, ``marginal_std_ema`` (the new state: pass
    it back next call), ``mi_zscore_ema``, ``retrieval_accuracy(@k)``,
    ``retrieval_chance_level(@k)``, ``retrieval_above_chance(@k)``, ``num_rows``, ``num_columns``.
    With no rows every value is 0 and the EMA state is returned unchanged (0 if there was none).
    """
    with torch.no_grad():
        matched, marginal = mi_row_terms(cross_logprobs, prompt_index)
        m, n = cross_logprobs.shape
        zero = matched.new_zeros(())
        out = _mi_family(matched, marginal, n, std_eps, marginal_std_ema, ema_decay)
        out.update(_retrieval_rates(cross_logprobs, prompt_index, prompt_signature, topk, zero))
        out["num_rows"] = zero + m
        out["num_columns"] = zero + n
        return out


def _mi_family(
    matched: torch.Tensor,
    marginal: torch.Tensor,
    n: int,
    std_eps: float,
    marginal_std_ema: torch.Tensor | None,
    ema_decay: float,
) -> dict[str, torch.Tensor]:
    """``mutual_information``'s MI, entropy, std and z-score keys from the row terms ``a``
    (``matched``) and ``b`` (``marginal``) of ``n`` columns; with no rows every value is 0 and the
    EMA state is kept."""
    m = matched.shape[0]
    zero = matched.new_zeros(())
    out: dict[str, torch.Tensor] = {}
    a_mean, b_mean = matched.mean() if m else zero, marginal.mean() if m else zero
    sigma = _population_std(marginal)
    diff = matched - marginal  # [M]
    out["mi"] = a_mean - b_mean
    out["mi_upper_bound"] = zero + (math.log(n) if n > 0 else 0.0)
    out["matched_log_prob_mean"] = a_mean
    out["marginal_log_prob_mean"] = b_mean
    out["conditional_entropy"] = -a_mean
    out["marginal_entropy"] = -b_mean
    out["marginal_std"] = sigma
    out["mi_zscore"] = (diff / (sigma + std_eps)).mean() if m else zero
    if m:
        ema = ema_update(marginal_std_ema, sigma, ema_decay).to(sigma)
        out["mi_zscore_ema"] = (diff / (ema + std_eps)).mean()
    else:
        ema = zero if marginal_std_ema is None else marginal_std_ema.detach().clone()
        out["mi_zscore_ema"] = zero
    out["marginal_std_ema"] = ema
    return out


def _retrieval_rates(
    cross_logprobs: torch.Tensor,
    prompt_index: torch.Tensor,
    prompt_signature: torch.Tensor | None,
    topk: Sequence[int],
    zero: torch.Tensor,
) -> dict[str, torch.Tensor]:
    """``mutual_information``'s ``retrieval_accuracy(@k)``, ``retrieval_chance_level(@k)`` and
    ``retrieval_above_chance(@k)`` (0 with no rows), as 0-dim tensors like ``zero``."""
    m = cross_logprobs.shape[0]
    out: dict[str, torch.Tensor] = {}
    # k = 1 always: retrieval_accuracy is a public key
    topk = (1, *sorted({int(k) for k in topk} - {1}))
    hits, chance, k_eff = retrieval(cross_logprobs, prompt_index, prompt_signature, topk)
    chance_mean = chance.mean().to(zero) if m else zero
    for k in topk:
        acc = hits[k].to(zero.dtype).mean() if m else zero
        level = (chance_mean * k_eff[k]).clamp(max=1.0)
        out[_key("retrieval_accuracy", k)] = acc
        out[_key("retrieval_chance_level", k)] = level
        out[_key("retrieval_above_chance", k)] = acc - level
    return out


def _check(cross_logprobs: torch.Tensor, prompt_index: torch.Tensor) -> None:
    if cross_logprobs.dim() != 2:
        raise ValueError(f"cross_logprobs must be [M, N], got shape {tuple(cross_logprobs.shape)}")
    if prompt_index.shape != cross_logprobs.shape[:1]:
        raise ValueError(
            f"prompt_index must be [M] = [{cross_logprobs.shape[0]}], got {tuple(prompt_index.shape)}"
        )
    if prompt_index.numel() and (
        int(prompt_index.min()) < 0 or int(prompt_index.max()) >= cross_logprobs.shape[1]
    ):
        raise ValueError(f"prompt_index must lie in [0, {cross_logprobs.shape[1]})")
