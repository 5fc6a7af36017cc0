"""Advantage estimators and post-advantage modifiers for StarPO (RAGEN's core_algos).

Shapes: token tensors are ``[B, T]`` (B trajectories x T loss positions), per-trajectory tensors
``[B]``. Masks are 0/1 (bool or float): 1 on trained (assistant) tokens, 0 on environment / template
/ padding tokens.

Equations
- GAE (Schulman et al. 2016), masked as veRL v0.6.1 does it. Backwards over t with ``nv = lg = 0``:
  ``δ_t = r_t + γ·nv − V_t``, ``g_t = δ_t + γλ·lg``, ``nv ← m_t·V_t + (1−m_t)·nv``, ``lg ← m_t·g_t +
  (1−m_t)·lg``, ``A_t = lg``, ``returns = A + V``. Positions with mask 0 are bridged: the value and
  the running advantage of the next trained token carry across them, so a multi-turn trajectory is
  one MDP over its trained tokens. A reward placed on a mask-0 position is dropped (its δ is never
  accumulated): put rewards on trained positions.
- Chained rows (:func:`chain_rows`): the trained positions of several rows (the turn samples of one
  episode in the windowed context modes) packed into one row in order, so either GAE runs over the
  whole episode; a turn's last token then bootstraps from the value of the next turn's first trained
  token. RAGEN has no equivalent: its turn-level modes give every turn sample the episode score.
- Turn-level ("bi-level") GAE, RAGEN's core_algos: a high-level GAE over turn ends with
  ``high_level_gamma`` produces a per-turn target ``R̃ = Â + V`` at each turn end, then a
  token-level GAE inside each turn bootstraps to it.
- GRPO (Shao et al. 2024) ``A_i = (s_i − μ_g)/(σ_g + eps)`` with unbiased σ; Dr.GRPO (Liu et al.
  2025) ``s_i − μ_g``; BRPO: the same normalisation over the whole batch; ARPO: raw scores (RAGEN v1
  README estimators).

Departures from RAGEN (each one a fix)
- Turn-level GAE takes the turn-end positions explicitly (``turn_ends``) instead of guessing them
  from non-zero rewards, so a turn with reward 0 is still a turn, and a trailing zero reward no
  longer indexes past the end. A trained position after the last turn end bootstraps with value 0,
  like plain GAE. Mask-0 positions get the bridged values of plain GAE (RAGEN leaves 0 there);
  losses never read them.
- GRPO: a group of size 1 gets advantage 0 (RAGEN: μ=0, σ=1, so A = s, a signal not relative to
  anything). Group statistics are computed after subtracting a member of the group, so identical
  rewards give exactly 0 (the float32 mean of eight copies of 0.3 is 1 ulp off: deviations and σ of
  ~3e-8 give advantages of ~0.03).
- The KL-in-reward path is a plain function here; RAGEN's call crashes on veRL 0.6.1 (unsupported
  kwarg).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Literal

import torch

from .losses import KLKind, as_bool_mask, kl_penalty, masked_mean, masked_whiten

__all__ = [
    "FilterLossScaling",
    "adaptive_kl_coef",
    "apply_kl_in_reward",
    "arpo",
    "broadcast_to_tokens",
    "brpo",
    "chain_rows",
    "drgrpo",
    "filter_loss_scaling",
    "gae",
    "group_centre",
    "group_std",
    "grpo",
    "length_weight",
    "masked_whiten",
    "rft_advantages",
    "soft_advantage_reweight",
    "turn_ends_from_mask",
    "turn_level_gae",
    "zero_task_advantage",
]


def _float_dtype(*tensors: torch.Tensor) -> torch.dtype:
    """The common floating dtype of the inputs, at least float32 (recurrences in bf16 lose too
    much)."""
    dtype = torch.float32
    for t in tensors:
        if t.is_floating_point():
            dtype = torch.promote_types(dtype, t.dtype)
    return dtype


# --------------------------------------------------------------------------------------------------
# GAE
# --------------------------------------------------------------------------------------------------


def gae(
    rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float, lam: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Masked GAE (veRL 0.6.1's GAE), unwhitened: ``(advantages [B,T], returns [B,T])``.

    Args:
        rewards: ``[B, T]`` token rewards (RAGEN puts the trajectory reward on the last trained position).
        values: ``[B, T]`` critic values ``V_t``.
        mask: ``[B, T]`` loss mask; mask-0 positions are bridged over.
        gamma: discount γ.
        lam: GAE λ.

    Whiten afterwards with ``masked_whiten(advantages, mask)`` (statistics over the whole batch).
    """
    return _backward_gae(rewards, values, mask, gamma, lam, reset=None)


def _backward_gae(
    rewards: torch.Tensor,
    values: torch.Tensor,
    mask: torch.Tensor,
    gamma: float,
    lam: float,
    reset: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """veRL 0.6.1's GAE recurrence; where ``reset[:, t]`` the carried value and advantage restart
    from 0 at t."""
    dtype = _float_dtype(rewards, values)
    r, v = rewards.to(dtype), values.to(dtype)
    m = as_bool_mask(mask).to(dtype)
    batch, horizon = r.shape
    next_value = torch.zeros(batch, dtype=dtype, device=r.device)
    last_adv = torch.zeros(batch, dtype=dtype, device=r.device)
    advantages = torch.empty_like(r)
    for t in range(horizon - 1, -1, -1):
        if reset is not None:
            keep = (~reset[:, t]).to(dtype)
            next_value, last_adv = next_value * keep, last_adv * keep
        delta = r[:, t] + gamma * next_value - v[:, t]
        adv_t = delta + gamma * lam * last_adv
        next_value = m[:, t] * v[:, t] + (1 - m[:, t]) * next_value
        last_adv = m[:, t] * adv_t + (1 - m[:, t]) * last_adv
        advantages[:, t] = last_adv
    return advantages, advantages + v


def chain_rows(
    chain: torch.Tensor, mask: torch.Tensor, *tensors: torch.Tensor
) -> tuple[torch.Tensor, list[torch.Tensor], Callable[[torch.Tensor], torch.Tensor]]:
    """Pack the trained positions of the rows sharing a ``chain`` id into one row per chain.

    Args:
        chain: ``[B]`` chain id of each row (an episode id); a chain's rows are taken in row order.
        mask: ``[B, T]`` loss mask; only its trained positions are packed (in row order, then column
        order). tensors: ``[B, T]`` tensors to pack alike (rewards, values, turn ends...).

    Returns ``(packed_mask [E, L], packed tensors [E, L], unpack)``: E chains in order of first
    appearance, L the longest chain's trained positions; ``unpack(x [E, L])`` puts a packed result
    back at the trained positions of a ``[B, T]`` tensor (0 elsewhere).
    """
    m = as_bool_mask(mask)
    if chain.shape != m.shape[:1]:
        raise ValueError(
            f"chain must have one id per row ({m.shape[0]}), got shape {tuple(chain.shape)}"
        )
    slots: dict[int, int] = {}
    slot_of_row = torch.tensor(
        [slots.setdefault(int(c), len(slots)) for c in chain.tolist()],
        dtype=torch.long,
        device=m.device,
    )
    # row-major: a row's positions are contiguous, in column order
    rows, cols = m.nonzero(as_tuple=True)
    # chains in order; inside one, rows in row order
    key, order = torch.sort(slot_of_row[rows], stable=True)
    rows, cols = rows[order], cols[order]
    counts = torch.bincount(key, minlength=len(slots))
    within = torch.arange(len(key), device=m.device) - (torch.cumsum(counts, 0) - counts)[key]
    shape = (len(slots), int(counts.max()) if len(key) else 1)

    def pack(x: torch.Tensor) -> torch.Tensor:
        out = torch.zeros(shape, dtype=x.dtype, device=x.device)
        out[key, within] = x[rows, cols]
        return out

    def unpack(y: torch.Tensor) -> torch.Tensor:
        out = torch.zeros(m.shape, dtype=y.dtype, device=y.device)
        out[rows, cols] = y[key, within]
        return out

    return pack(m), [pack(t) for t in tensors], unpack


def turn_ends_from_mask(mask: torch.Tensor) -> torch.Tensor:
    """``[B, T]`` bool: the last trained position of every contiguous run of 1s in ``mask``.

    Each assistant turn is one contiguous run of trained tokens followed by environment tokens (mask
    0), so this recovers the turn ends without looking at rewards.
    """
    m = as_bool_mask(mask)
    after = torch.zeros_like(m)
    after[:, :-1] = m[:, 1:]
    return m & ~after


def _turn_end_tensor(
    turn_ends: torch.Tensor | Sequence[torch.Tensor], like: torch.Tensor
) -> torch.Tensor:
    if isinstance(turn_ends, torch.Tensor) and turn_ends.shape == like.shape:
        return as_bool_mask(turn_ends).to(like.device)
    if isinstance(turn_ends, torch.Tensor) and turn_ends.dim() != 1:
        raise ValueError(
            f"turn_ends must be a [B, T] mask of shape {tuple(like.shape)} or B index tensors, "
            f"got shape {tuple(turn_ends.shape)}"
        )
    if len(turn_ends) != like.shape[0]:
        raise ValueError(f"turn_ends has {len(turn_ends)} rows, expected {like.shape[0]}")
    ends = torch.zeros(like.shape, dtype=torch.bool, device=like.device)
    for row, positions in enumerate(turn_ends):
        ends[row, torch.as_tensor(positions, dtype=torch.long, device=like.device)] = True
    return ends


def turn_level_gae(
    rewards: torch.Tensor,
    values: torch.Tensor,
    mask: torch.Tensor,
    turn_ends: torch.Tensor | Sequence[torch.Tensor],
    gamma: float,
    lam: float,
    high_level_gamma: float = 0.95,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Turn-level (bi-level) GAE (RAGEN's core_algos), unwhitened: ``(advantages [B,T], returns
    [B,T])``.

    Args:
        rewards: ``[B, T]``; each turn's reward sits on that turn's end position (zero rewards are fine).
        values: ``[B, T]``. mask: ``[B, T]`` loss mask. turn_ends: which trained positions end a
        turn: a ``[B, T]`` bool/0-1 tensor, or one LongTensor of positions
            per row. ``turn_ends_from_mask(mask)`` gives the usual choice. Every turn end must be a trained position.
        gamma, lam: token-level discount and λ (λ is also the high-level λ, as in RAGEN).
        high_level_gamma: discount between turns γ_h.

    High level, backwards over the turn ends p_k of a row: ``δ_k = r_{p_k} + γ_h·V_{p_{k+1}} −
    V_{p_k}`` (0 after the last), ``Â_k = δ_k + γ_h·λ·Â_{k+1}``, ``R̃_{p_k} = Â_k + V_{p_k}``. Low
    level: the §4.3 recurrence on rewards R̃ (original rewards off the turn ends), with the carried
    value and advantage reset to 0 at each turn end. So ``A_{p_k} = Â_k`` and ``returns_{p_k} =
    R̃_{p_k}``. With a single turn ending at the last trained position this is exactly ``gae``.
    """
    ends = _turn_end_tensor(turn_ends, rewards)
    if bool((ends & ~as_bool_mask(mask)).any()):
        raise ValueError(
            "turn_ends marks a position whose mask is 0; turn ends must be trained positions"
        )
    dtype = _float_dtype(rewards, values)
    r, v = rewards.to(dtype), values.to(dtype)
    batch, horizon = r.shape
    targets = r.clone()
    next_turn_value = torch.zeros(batch, dtype=dtype, device=r.device)
    turn_adv = torch.zeros(batch, dtype=dtype, device=r.device)
    for t in range(horizon - 1, -1, -1):
        is_end = ends[:, t]
        delta = r[:, t] + high_level_gamma * next_turn_value - v[:, t]
        new_adv = delta + high_level_gamma * lam * turn_adv
        turn_adv = torch.where(is_end, new_adv, turn_adv)
        next_turn_value = torch.where(is_end, v[:, t], next_turn_value)
        targets[:, t] = torch.where(is_end, new_adv + v[:, t], targets[:, t])
    return _backward_gae(targets, v, mask, gamma, lam, reset=ends)


# --------------------------------------------------------------------------------------------------
# Outcome (critic-free) estimators
# --------------------------------------------------------------------------------------------------


def group_centre(
    scores: torch.Tensor, group_index: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per sample: ``(s_i − μ_g, σ_g)`` with unbiased σ (0 for groups of size 1); exact for constant
    groups.

    The one per-sample (group-index) centring and in-group std: GRPO, ``group_std`` and the score
    normalisation of ``data.batching.normalize_scores`` use it. ``filtering.in_group_std`` is its
    ``[G, N]`` matrix counterpart (rows of one group each; numerically it may differ in the last
    float bit, so the two are not swapped)."""
    if scores.dim() != 1 or group_index.shape != scores.shape:
        raise ValueError(
            f"scores and group_index must both be [B]; got {tuple(scores.shape)} and "
            f"{tuple(group_index.shape)}"
        )
    dtype = _float_dtype(scores)
    s = scores.to(dtype)
    unique_ids, inverse = torch.unique(group_index, return_inverse=True)
    num_groups = unique_ids.numel()
    zeros = torch.zeros(num_groups, dtype=dtype, device=s.device)
    # Shift by the group's maximum: statistics are shift-invariant and constant groups become exact
    # zeros.
    ref = zeros.scatter_reduce(0, inverse, s.detach(), reduce="amax", include_self=False)
    shifted = s - ref[inverse]
    count = zeros.index_add(0, inverse, torch.ones_like(s))
    mean = zeros.index_add(0, inverse, shifted) / count
    centred = shifted - mean[inverse]
    dof = count - 1
    var = zeros.index_add(0, inverse, centred**2) / torch.where(dof > 0, dof, torch.ones_like(dof))
    return centred, var.sqrt()[inverse]


def group_std(scores: torch.Tensor, group_index: torch.Tensor) -> torch.Tensor:
    """``[B]``: the unbiased std of each sample's group (0 for a group of size 1)."""
    return group_centre(scores, group_index)[1]


def grpo(
    scores: torch.Tensor, group_index: torch.Tensor, *, norm_by_std: bool = True, eps: float = 1e-6
) -> torch.Tensor:
    """GRPO outcome advantages ``[B]``: ``(s_i − μ_g)/(σ_g + eps)``, or ``s_i − μ_g`` when
    ``norm_by_std=False``.

    Args:
        scores: ``[B]`` trajectory scores (the sum of the token rewards).
        group_index: ``[B]`` integer group id of each trajectory (any ids; samples of a group need
        not be adjacent). norm_by_std: divide by the unbiased in-group std (False = Dr.GRPO). eps:
        added to σ.

    A zero-variance group and a group of size 1 both give 0 (see the module docstring). For
    turn-level batches (one row per turn) pass one score per episode and broadcast the result back
    to its turns.
    """
    centred, std = group_centre(scores, group_index)
    return centred / (std + eps) if norm_by_std else centred


def drgrpo(scores: torch.Tensor, group_index: torch.Tensor, *, eps: float = 1e-6) -> torch.Tensor:
    """Dr.GRPO: ``s_i − μ_g`` (no std normalisation)."""
    return grpo(scores, group_index, norm_by_std=False, eps=eps)


def brpo(
    scores: torch.Tensor, group_index: torch.Tensor | None = None, *, eps: float = 1e-6
) -> torch.Tensor:
    """Batch-normalised outcome advantage: ``(s_i − μ)/(σ + eps)`` over the whole batch
    (``group_index`` unused)."""
    return grpo(scores, torch.zeros_like(scores, dtype=torch.long), norm_by_std=True, eps=eps)


def arpo(
    scores: torch.Tensor, group_index: torch.Tensor | None = None, *, eps: float = 1e-6
) -> torch.Tensor:
    """Raw outcome advantage: ``A_i = s_i`` (no baseline, no normalisation)."""
    return scores.to(_float_dtype(scores)).clone()


def broadcast_to_tokens(advantages: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``A_{i,t} = A_i·m_{i,t}``: ``[B]`` -> ``[B, T]`` (0 off the mask)."""
    m = as_bool_mask(mask)
    return torch.where(
        m, advantages[:, None], torch.zeros((), dtype=advantages.dtype, device=advantages.device)
    )


# --------------------------------------------------------------------------------------------------
# Post-advantage modifiers (RAGEN's core_algos; applied in the order listed there)
# --------------------------------------------------------------------------------------------------


def _per_row(weight: torch.Tensor, advantages: torch.Tensor) -> torch.Tensor:
    """A ``[B]`` weight shaped to multiply ``[B]`` or ``[B, T]`` advantages."""
    return weight.reshape(weight.shape + (1,) * (advantages.dim() - 1))


def soft_advantage_reweight(
    advantages: torch.Tensor, group_std: torch.Tensor, eps: float = 1e-6
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """``A ← A·w``, ``w = σ_g / (max σ + eps)`` per sample (``group_std`` is ``[B]``, e.g. from
    ``group_std``).

    Groups with more reward spread keep more of their advantage. Metrics are over samples.
    """
    weight = group_std / (group_std.max() + eps) if group_std.numel() else group_std
    metrics = {
        "soft_reweight_min": weight.min().detach() if weight.numel() else torch.tensor(0.0),
        "soft_reweight_max": weight.max().detach() if weight.numel() else torch.tensor(0.0),
        "soft_reweight_mean": weight.mean().detach() if weight.numel() else torch.tensor(0.0),
    }
    return advantages * _per_row(weight.to(advantages.dtype), advantages), metrics


FilterLossScaling = Literal["none", "linear", "sqrt"]
_FILTER_SCALES: dict[str, Callable[[float], float]] = {
    "none": lambda ratio: 1.0,
    "linear": lambda ratio: ratio,
    "sqrt": lambda ratio: ratio**0.5,
}


def filter_loss_scaling(
    advantages: torch.Tensor, kept_ratio: float, mode: FilterLossScaling = "none"
) -> torch.Tensor:
    """Scale advantages by the fraction of groups the filter kept: ``none`` 1, ``linear`` ρ,
    ``sqrt`` √ρ."""
    try:
        scale = _FILTER_SCALES[mode]
    except KeyError:
        raise ValueError(f"mode must be one of {sorted(_FILTER_SCALES)}, got {mode!r}") from None
    if not 0.0 <= float(kept_ratio) <= 1.0:
        raise ValueError(f"kept_ratio must be in [0, 1], got {kept_ratio}")
    return advantages * scale(float(kept_ratio))


def length_weight(advantages: torch.Tensor, mask: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """``A_i ← A_i / ((L_i + eps) / mean_j L_j)`` with ``L_i`` the trained-token count of row i.

    ``advantages`` is ``[B]`` or ``[B, T]``. Rows with no trained token are left unchanged (RAGEN
    would multiply them by mean L / 1e-6; they contribute nothing to the loss either way), and an
    all-empty batch is unchanged.
    """
    lengths = as_bool_mask(mask).to(advantages.dtype).sum(-1)
    mean_length = lengths.mean()
    factor = (lengths + eps) / torch.where(
        mean_length > 0, mean_length, torch.ones_like(mean_length)
    )
    factor = torch.where(lengths > 0, factor, torch.ones_like(factor))
    return advantages / _per_row(factor, advantages)


def zero_task_advantage(advantages: torch.Tensor) -> torch.Tensor:
    """All zeros (ablation: train on the entropy / KL terms only)."""
    return torch.zeros_like(advantages)


# --------------------------------------------------------------------------------------------------
# KL in the reward (veRL's core_algos, ``use_kl_in_reward``)
# --------------------------------------------------------------------------------------------------


def apply_kl_in_reward(
    rewards: torch.Tensor,
    old_logprobs: torch.Tensor,
    ref_logprobs: torch.Tensor,
    mask: torch.Tensor,
    kl_coef: float,
    kind: KLKind = "k1",
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """``r_t ← r_t − β·KL_t·m_t`` with ``KL_t = kl_penalty(old_logprobs, ref_logprobs, kind)``.

    Metrics: ``kl`` (the mean over rows of each row's masked mean KL, the value the adaptive
    controller reads) and ``kl_coef`` β, both detached.
    """
    kl = kl_penalty(old_logprobs, ref_logprobs, kind)
    m = as_bool_mask(mask)
    shaped = rewards - kl_coef * torch.where(
        m, kl, torch.zeros((), dtype=kl.dtype, device=kl.device)
    )
    metrics = {
        "kl": masked_mean(kl, m, dim=-1).mean().detach(),
        "kl_coef": torch.tensor(float(kl_coef)),
    }
    return shaped, metrics


def adaptive_kl_coef(
    kl_coef: float, current_kl: float, n_steps: int, *, target_kl: float, horizon: float
) -> float:
    """Adaptive KL controller (Ziegler et al. 2019): ``β ← β·(1 + clip(KL/target − 1,
    ±0.2)·n/horizon)``."""
    error = min(max(float(current_kl) / target_kl - 1.0, -0.2), 0.2)
    return float(kl_coef) * (1.0 + error * n_steps / horizon)


def share_by_state(
    adv: torch.Tensor, mask: torch.Tensor, state_index: torch.Tensor
) -> torch.Tensor:
    """``adv`` with each row divided by the number of rows of its state that train anything (a
    non-zero advantage on a trained token): the kept responses of one state share one unit of
    weight. With ``rft`` on branching rollouts, a state whose K responses were all kept then counts
    as much as one where a single response was, so the update is a supervised step on a good answer
    of every state where one was found, not weighted by how often the policy already finds it (the
    plain sum weights states by that rate and starves the hard ones).

    Args:
        adv: ``[B, T]`` advantages.
        mask: ``[B, T]`` loss mask.
        state_index: ``[B]`` state id of each row (rows answering the same prompt share it).
    """
    trains = ((adv != 0) & as_bool_mask(mask)).any(dim=-1).to(adv.dtype)
    _, inverse = torch.unique(state_index, return_inverse=True)
    count = torch.zeros(
        int(inverse.max()) + 1 if inverse.numel() else 0, dtype=adv.dtype, device=adv.device
    )
    count.index_add_(0, inverse, trains)
    return adv / count[inverse].clamp(min=1.0).unsqueeze(-1)


def rft_advantages(
    rewards: torch.Tensor, mask: torch.Tensor, turn_ends: torch.Tensor, threshold: float
) -> torch.Tensor:
    """Rejection-sampling fine-tuning (RFT / expert iteration): advantage 1 on every trained token
    of a turn whose reward exceeds ``threshold``, 0 elsewhere; no baseline, no normalisation. At
    ratio 1 the PPO loss of a kept token is then the supervised loss on it, so an update is a
    supervised step on the model's own samples that the env scored above the threshold, and a sample
    below it is never pushed down.

    Args:
        rewards: ``[B, T]``; each turn's reward on its end position (an episode score: on the last trained token).
        mask: ``[B, T]`` loss mask.
        turn_ends: ``[B, T]`` bool; the positions that end a turn (trained positions).
        threshold: a turn is kept when its reward is strictly greater.

    A token belongs to the turn whose end is the first turn end at or after it in its row.
    """
    ends = turn_ends.bool() & as_bool_mask(mask)
    owner = torch.zeros(rewards.shape[0], dtype=rewards.dtype, device=rewards.device)
    kept = torch.zeros_like(rewards)
    # the reward of the next turn end, carried backwards
    for t in range(rewards.shape[1] - 1, -1, -1):
        owner = torch.where(ends[:, t], rewards[:, t], owner)
        kept[:, t] = (owner > threshold).to(rewards.dtype)
    return kept * mask.to(rewards.dtype)
