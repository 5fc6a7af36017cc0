"""From trajectories to a padded :class:`~ragen_lightning.types.RolloutBatch`, plus rollout
statistics.

Reward placement (RAGEN's ``use_turn_scores``):

* ``last`` (default): each sample's episode score (env return + format penalty, after normalisation)
  sits on its last sampled token; every other token reward is 0.
* ``turn``: each trained turn's own reward (env reward of the turn + its format penalty) sits on
  that turn's last sampled token. Unlike RAGEN this keeps the format penalty; score normalisation is
  not defined per turn, so it must be ``identity`` in this mode. In the windowed context modes (one
  sample per turn) GAE then runs over an episode's samples as one sequence, so a turn's return holds
  its own and every later turn's reward, as in ``full`` mode (RAGEN's turn-level modes put the whole
  episode score on every turn sample: ``last``).

Score normalisation (RAGEN's ctx_manager ``reward_normalization``) by group (``state``: samples of
one group; ``env``: every episode of one environment-mixture entry, the trajectories' ``tag``,
RAGEN's ``inductive``; ``batch``: all samples) with ``identity`` | ``mean`` | ``mean_std`` |
``asym_clip``; applied only when some group has more than one member (a validation batch of
singletons is left alone). One score per episode is normalised, whatever the grouping.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import torch

from ragen_lightning.algos.advantages import group_centre
from ragen_lightning.metrics.functional import pass_at_k
from ragen_lightning.types import RolloutBatch, Sample, Trajectory

RewardPlacement = Literal["last", "turn"]
NormGrouping = Literal["state", "env", "batch"]
NormMethod = Literal["identity", "mean", "mean_std", "asym_clip"]


def normalize_scores(
    scores: torch.Tensor,
    group_index: torch.Tensor,
    grouping: NormGrouping = "state",
    method: NormMethod = "identity",
    eps: float = 1e-6,
    env_index: torch.Tensor | None = None,
) -> torch.Tensor:
    """Per-group score normalisation; ``mean_std`` gives zeros for a group whose std is <= eps.
    ``env_index`` ``[B]``: each score's environment (mixture entry) id, the groups of
    ``grouping="env"``."""
    if method not in ("identity", "mean", "mean_std", "asym_clip"):
        raise ValueError(
            f"reward normalisation method must be identity|mean|mean_std|asym_clip, got {method!r}"
        )
    if grouping not in ("state", "env", "batch"):
        raise ValueError(f"reward normalisation grouping must be state|env|batch, got {grouping!r}")
    if grouping == "env" and env_index is None:
        raise ValueError("reward normalisation by env needs each score's env_index")
    if method == "identity":
        return scores
    keys = {"state": group_index, "env": env_index, "batch": torch.zeros_like(group_index)}[
        grouping
    ]
    if int(torch.bincount(keys).max()) <= 1:
        return scores
    centred, std = group_centre(scores, keys)
    if method == "mean":
        return centred.to(scores.dtype)
    z = torch.where(std <= eps, torch.zeros_like(centred), centred / (std + eps))
    return (z.clamp(-1.0, 3.0) if method == "asym_clip" else z).to(scores.dtype)


def build_batch(
    trajectories: Sequence[Trajectory],
    *,
    pad_token_id: int,
    reward_placement: RewardPlacement = "last",
    norm_grouping: NormGrouping = "state",
    norm_method: NormMethod = "identity",
    metrics: dict[str, float] | None = None,
) -> RolloutBatch:
    """Pad every training sample of ``trajectories`` into one batch (episodes in order, samples in
    turn order).

    Raises:
        ValueError: a trajectory is not trainable (a text-in/text-out engine such as an API model produced it: its
            ids re-encode returned text and carry no sampled log-probs, so no policy-gradient step
            can use them).
    """
    _check_trainable(trajectories)
    if reward_placement not in ("last", "turn"):
        raise ValueError(f"reward_placement must be 'last' or 'turn', got {reward_placement!r}")
    if reward_placement == "turn" and norm_method != "identity":
        raise ValueError(
            "reward normalisation is per episode score; with reward_placement='turn' use 'identity'"
        )
    rows = [(e, t, s) for e, t in enumerate(trajectories) for s in t.samples]
    group_index = torch.tensor([t.group_id for _, t, _ in rows], dtype=torch.long)
    episode_index = torch.tensor([e for e, _, _ in rows], dtype=torch.long)
    scores = _episode_scores(rows, group_index, episode_index, norm_grouping, norm_method)
    tokens = _pad_rows(rows, scores, pad_token_id, reward_placement)
    return RolloutBatch(
        **vars(tokens),
        scores=scores,
        group_index=group_index,
        episode_index=episode_index,
        per_turn_rewards=reward_placement == "turn",
        metrics=dict(metrics or {}),
        trajectories=list(trajectories),
        state_index=_state_index(rows),
    )


# (episode index, its trajectory, one of its training samples)
_Row = tuple[int, Trajectory, Sample]


def _check_trainable(trajectories: Sequence[Trajectory]) -> None:
    """Refuse trajectories no policy-gradient step can use (``build_batch``'s Raises)."""
    if untrainable := [t for t in trajectories if not t.trainable]:
        raise ValueError(
            f"{len(untrainable)} of {len(trajectories)} trajectories (first: env {untrainable[0].env_index}, seed "
            f"{untrainable[0].seed}) come from a text-in/text-out engine (an API model): their token ids re-encode "
            "the returned text and have no sampled log-probs, so they cannot be trained on; use them for evaluation "
            "only (python -m ragen_lightning.evaluate)"
        )


def _episode_scores(
    rows: Sequence[_Row],
    group_index: torch.Tensor,
    episode_index: torch.Tensor,
    grouping: NormGrouping,
    method: NormMethod,
) -> torch.Tensor:
    """``[B]`` each row's episode score, normalised with one score per episode (turn-level modes
    repeat an episode over several samples, which must not weigh it more in its group's
    statistics)."""
    raw = torch.tensor([t.score for _, t, _ in rows], dtype=torch.float32)
    first_row = {int(e): i for i, e in reversed(list(enumerate(episode_index.tolist())))}
    ep_rows = torch.tensor(sorted(first_row.values()), dtype=torch.long)
    # mixture entries
    env_ids = {tag: i for i, tag in enumerate(dict.fromkeys(t.tag for _, t, _ in rows))}
    env_index = torch.tensor([env_ids[t.tag] for _, t, _ in rows], dtype=torch.long)
    ep_norm = normalize_scores(
        raw[ep_rows], group_index[ep_rows], grouping, method, env_index=env_index[ep_rows]
    )
    by_episode = {
        int(episode_index[r]): float(v) for r, v in zip(ep_rows.tolist(), ep_norm.tolist())
    }
    return torch.tensor([by_episode[int(e)] for e in episode_index.tolist()], dtype=torch.float32)


def _state_index(rows: Sequence[_Row]) -> torch.Tensor:
    """``[B]`` state ids: a branching turn's responses answer one state, (episode, turn); every
    other sample is its own state."""
    states = [
        (e, s.turn) if s.turn is not None else (e, "row", i) for i, (e, _, s) in enumerate(rows)
    ]
    state_ids = {key: i for i, key in enumerate(dict.fromkeys(states))}
    return torch.tensor([state_ids[key] for key in states], dtype=torch.long)


@dataclass
class _TokenTensors:
    """The ``[B, T]`` per-token tensors of a batch, right-padded (named as the :class:`RolloutBatch`
    fields)."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    loss_mask: torch.Tensor
    engine_logprobs: torch.Tensor
    rewards: torch.Tensor
    turn_ends: torch.Tensor


def _pad_rows(
    rows: Sequence[_Row], scores: torch.Tensor, pad_token_id: int, reward_placement: RewardPlacement
) -> _TokenTensors:
    """Each row's conversation padded to the longest, with its rewards on its trained turns' last
    tokens (module docstring)."""
    B = len(rows)
    T = max((len(s.conversation) for _, _, s in rows), default=1)
    out = _TokenTensors(
        input_ids=torch.full((B, T), pad_token_id, dtype=torch.long),
        attention_mask=torch.zeros((B, T), dtype=torch.long),
        loss_mask=torch.zeros((B, T), dtype=torch.long),
        engine_logprobs=torch.zeros((B, T)),
        rewards=torch.zeros((B, T)),
        turn_ends=torch.zeros((B, T), dtype=torch.bool),
    )
    for i, (_, _, sample) in enumerate(rows):
        conv = sample.conversation
        n = len(conv)
        out.input_ids[i, :n] = torch.tensor(conv.input_ids, dtype=torch.long)
        out.attention_mask[i, :n] = 1
        out.loss_mask[i, :n] = torch.tensor(conv.loss_mask, dtype=torch.long)
        out.engine_logprobs[i, :n] = torch.tensor(conv.sampled_logprobs)
        if not conv.turn_spans:
            continue
        ends = [end - 1 for _, end in conv.turn_spans]
        out.turn_ends[i, ends] = True
        if reward_placement == "last":
            out.rewards[i, ends[-1]] = scores[i]
        else:
            if len(sample.turn_rewards) != len(ends):
                raise ValueError(
                    f"sample has {len(ends)} trained turns but {len(sample.turn_rewards)} turn rewards"
                )
            out.rewards[i, ends] = torch.tensor(sample.turn_rewards, dtype=torch.float32)
    return out


def trajectory_matrix(
    trajectories: Sequence[Trajectory], group_size: int, field: str
) -> torch.Tensor:
    """``[G, N]`` matrix of a per-trajectory quantity (``score``, ``env_return``,
    ``response_tokens``...)."""
    values = [float(getattr(t, field)) for t in trajectories]
    if len(values) % group_size:
        raise ValueError(f"{len(values)} trajectories do not form groups of {group_size}")
    return torch.tensor(values, dtype=torch.float32).view(-1, group_size)


def sampled_entropy(t: Trajectory) -> float:
    """Mean negative log-prob of the sampled tokens: an unbiased estimate of the per-token entropy
    at T=1."""
    total, count = 0.0, 0
    for s in t.samples:
        c = s.conversation
        for lp, m in zip(c.sampled_logprobs, c.loss_mask):
            if m:
                total, count = total - lp, count + 1
    return total / count if count else 0.0


def rollout_metrics(trajectories: Sequence[Trajectory], group_size: int) -> dict[str, float]:
    """Episode statistics of a rollout (before filtering): success, returns, lengths, format errors,
    pass@k."""
    n = len(trajectories)
    if n == 0:
        return {}
    turns = sum(t.num_turns for t in trajectories)
    out = {
        "success": sum(t.success for t in trajectories) / n,
        "return": sum(t.env_return for t in trajectories) / n,
        "score": sum(t.score for t in trajectories) / n,
        "num_turns": turns / n,
        "num_actions": sum(t.num_actions for t in trajectories) / n,
        "format_error_rate": sum(t.num_format_errors for t in trajectories) / max(turns, 1),
        "response_length": sum(t.response_tokens for t in trajectories) / max(turns, 1),
        "context_truncated": sum(t.context_truncated for t in trajectories) / n,
        # episodes an env exception or timeout ended (a count: any is worth a look; the runner
        # logged each)
        "env_errors": float(sum(t.env_error is not None for t in trajectories)),
    }
    groups: dict[int, list[bool]] = defaultdict(list)
    for t in trajectories:
        groups[t.group_id].append(bool(t.success))
    successes = torch.tensor([sum(v) for v in groups.values()])
    sizes = torch.tensor([len(v) for v in groups.values()])
    out[f"pass@{group_size}"] = float(pass_at_k(successes, sizes, group_size).mean())
    info_keys = sorted({k for t in trajectories for k in t.info})
    for k in info_keys:
        out[k] = sum(t.info.get(k, 0.0) for t in trajectories) / n
    return out
