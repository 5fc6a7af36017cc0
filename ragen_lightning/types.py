"""Typed containers passed between rollout, filtering and the update.

Token tensors of a :class:`RolloutBatch` are right-padded ``[B, T]``. Per-token training quantities
live on the *target* axis: position ``t`` of ``loss_mask``, ``rewards``, ``engine_logprobs`` and
``turn_ends`` describes token ``input_ids[:, t]``, whose log-prob the model computes from the logits
at ``t - 1``. Position 0 is never a target.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import torch


@dataclass
class Conversation:
    """One episode's token stream.

    Attributes:
        input_ids: every token id of the conversation so far.
        loss_mask: 1 exactly on sampled tokens, 0 on system/user/template/prefix tokens.  # [T]
        sampled_logprobs: the engine's log-prob of each sampled token, 0.0 elsewhere.  # [T]
        turn_spans: ``(start, end)`` of each assistant turn's sampled tokens in ``input_ids``.
        messages: the chat messages (assistant content = generation prefix + decoded sampled text).
        ended_with_eos: whether the last assistant turn ended with the end-of-turn token.
    """

    input_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    sampled_logprobs: list[float] = field(default_factory=list)
    turn_spans: list[tuple[int, int]] = field(default_factory=list)
    messages: list[dict[str, str]] = field(default_factory=list)
    ended_with_eos: bool = True

    def __len__(self) -> int:
        return len(self.input_ids)

    def extend(
        self, ids: Sequence[int], *, sampled: bool, logprobs: Sequence[float] | None = None
    ) -> None:
        ids = list(ids)
        if logprobs is not None and len(logprobs) != len(ids):
            raise ValueError(f"got {len(logprobs)} logprobs for {len(ids)} sampled tokens")
        self.input_ids.extend(ids)
        self.loss_mask.extend([1 if sampled else 0] * len(ids))
        self.sampled_logprobs.extend(list(logprobs) if logprobs is not None else [0.0] * len(ids))


@dataclass
class Sample:
    """One training sequence cut from an episode (a whole episode in ``full`` context mode, one turn
    otherwise).

    Attributes:
        conversation: the exact token stream, loss mask on the sampled tokens of this sample's trained turns.
        turn_rewards: reward assigned to each trained turn, in order (one per trained assistant
        span). turn: the episode turn this sample answers (windowed context modes; the K responses
        of a branching turn share
            it, so they answer the same state); None for a whole-episode sample (``full`` context mode).
    """

    conversation: Conversation
    turn_rewards: list[float]
    turn: int | None = None


@dataclass
class Trajectory:
    """One episode of one env.

    Attributes:
        env_index: index of the env in the rollout (``group_id * group_size + member``).
        group_id: the group (all members share the reset seed). seed: the reset seed. samples:
        training sequences of this episode. turn_rewards: summed env reward of each turn. penalty:
        summed format penalty (negative or 0). success: the env reported success at the end.
        terminated: the env ended the episode. truncated: the episode was cut (action budget, turn
        limit without termination, or context length). context_truncated: the episode ended because
        the next turn would not fit ``max_model_len``. num_actions: env actions executed. num_turns:
        assistant turns generated. num_format_errors: turns charged a format penalty.
        response_tokens: sampled tokens over all turns. info: numeric env info values averaged over
        turns, each turn's value its last action's (RAGEN's
            ``turn_info``; ``action_is_effective`` etc. stay rates in [0, 1] with several actions per turn).
        turn_info: one record per generated turn: ``actions`` (the action words executed),
        ``format_ok`` (the
            answer matched the tag format), ``penalty`` (format penalty charged), ``reward`` (summed env reward) and
            ``info`` (numeric env info of the turn's last step); what evaluation reports and exports
            show.
        trainable: False when the engine returned text, not sampled token ids with their log-probs
        (an API model):
            the ids are a re-encoding of that text, and the training batch refuses such a trajectory.
        env_error: why the env failed (an exception or a timeout in a reset or step, ``"<where>:
        <type>: <message>"``),
            which ended the episode; None when it did not. The turn in which it failed is not in the trajectory.
        tag: the environment-mixture entry the episode belongs to (``--data.env.mixture`` /
        ``--data.validation.suite``: per-tag
            metrics, reward normalisation by env); empty for a single-env rollout.
    """

    env_index: int
    group_id: int
    seed: int
    samples: list[Sample] = field(default_factory=list)
    turn_rewards: list[float] = field(default_factory=list)
    penalty: float = 0.0
    success: bool = False
    terminated: bool = False
    truncated: bool = False
    context_truncated: bool = False
    num_actions: int = 0
    num_turns: int = 0
    num_format_errors: int = 0
    response_tokens: int = 0
    info: dict[str, float] = field(default_factory=dict)
    turn_info: list[dict] = field(default_factory=list)
    trainable: bool = True
    env_error: str | None = None
    tag: str = ""

    @property
    def env_return(self) -> float:
        """Sum of env rewards (no format penalty)."""
        return float(sum(self.turn_rewards))

    @property
    def score(self) -> float:
        """The episode's training score: env return plus format penalty."""
        return self.env_return + self.penalty


@dataclass
class RolloutBatch:
    """A padded training batch built from kept trajectories.

    Attributes:
        input_ids: token ids, right-padded.  # [B, T]
        attention_mask: 1 on real tokens.  # [B, T]
        loss_mask: 1 on sampled tokens (target axis).  # [B, T]
        rewards: token-level rewards on the target axis (episode score on the last sampled token, or per turn).  # [B, T]
        turn_ends: True on the last sampled token of each trained turn.  # [B, T]
        engine_logprobs: the engine's log-prob of each sampled token, 0 elsewhere.  # [B, T]
        scores: the episode score of each sample (after reward normalisation).  # [B]
        group_index: group id of each sample.  # [B]
        episode_index: episode (trajectory) id of each sample; several samples share it in turn-level modes.  # [B]
        state_index: id of the state each sample answers: the responses of one branching turn share
        it, every other
            sample has its own (None: every sample its own).  # [B]
        per_turn_rewards: ``rewards`` hold each turn's own reward (``reward_placement: turn``), not
        the episode score;
            GAE then runs over an episode's samples as one sequence (:attr:`chains_turns`).
        metrics: rollout and filter statistics to log (floats). trajectories: the trajectories the
        samples came from (for viewers and diagnostics; not moved to devices).
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    loss_mask: torch.Tensor
    rewards: torch.Tensor
    turn_ends: torch.Tensor
    engine_logprobs: torch.Tensor
    scores: torch.Tensor
    group_index: torch.Tensor
    episode_index: torch.Tensor
    per_turn_rewards: bool = False
    metrics: dict[str, float] = field(default_factory=dict)
    trajectories: list[Trajectory] = field(default_factory=list)
    state_index: torch.Tensor | None = None

    _TENSORS = (
        "input_ids",
        "attention_mask",
        "loss_mask",
        "rewards",
        "turn_ends",
        "engine_logprobs",
        "scores",
        "group_index",
        "episode_index",
    )

    def __len__(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def chains_turns(self) -> bool:
        """Per-turn rewards on several samples of one episode (windowed context modes): an earlier
        turn's return must include the later turns' rewards, so GAE chains the episode's samples in
        turn order."""
        return self.per_turn_rewards and int(self.episode_index.unique().numel()) < len(self)

    def _tensors(self) -> list[str]:
        return [*self._TENSORS, *(["state_index"] if self.state_index is not None else [])]

    def to(self, device: torch.device | str) -> RolloutBatch:
        return replace(self, **{k: getattr(self, k).to(device) for k in self._tensors()})

    def select(self, index: torch.Tensor | slice) -> RolloutBatch:
        """Rows ``index`` of every tensor (metrics and trajectories are shared)."""
        return replace(self, **{k: getattr(self, k)[index] for k in self._tensors()})


@dataclass
class UpdateBatch:
    """What the mini-batch update reads: the kept rows' tokens plus the per-token training
    quantities of step 2-3.

    Token tensors are ``[B, T]``; the rest live on the target axis ``[B, T - 1]`` (position ``j``
    describes token ``input_ids[:, j + 1]``). Optional fields are None when the run does not compute
    them.

    Attributes:
        input_ids: token ids, right-padded.  # [B, T]
        attention_mask: 1 on real tokens.  # [B, T]
        loss_mask: True on sampled tokens.  # [B, T - 1] bool
        advantages: per-token advantages.  # [B, T - 1]
        engine_logprobs: the rollout engine's log-probs of the sampled tokens.  # [B, T - 1]
        old_logprobs: the actor's log-probs at rollout time; None when the update's first forward
        supplies them
            (on-policy: one epoch over one mini-batch).  # [B, T - 1]
        ref_logprobs: the reference's log-probs (KL loss only).  # [B, T - 1]
        values: the critic's values at rollout time (GAE only).  # [B, T - 1]
        returns: value targets (GAE only).  # [B, T - 1]
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    loss_mask: torch.Tensor
    advantages: torch.Tensor
    engine_logprobs: torch.Tensor
    old_logprobs: torch.Tensor | None = None
    ref_logprobs: torch.Tensor | None = None
    values: torch.Tensor | None = None
    returns: torch.Tensor | None = None

    def __len__(self) -> int:
        return int(self.input_ids.shape[0])

    def _fields(self) -> dict[str, torch.Tensor | None]:
        return {f: getattr(self, f) for f in self.__dataclass_fields__}

    def with_inert_row(self) -> UpdateBatch:
        """This batch plus one row that trains nothing: row 0's tokens with an all-zero loss mask
        and zero advantages/returns. It pads a rank's share of a mini-batch so every rank runs the
        same micro-batches."""
        out = {}
        for name, v in self._fields().items():
            if v is not None:
                row = (
                    v[:1].clone()
                    if name in ("input_ids", "attention_mask")
                    else torch.zeros_like(v[:1])
                )
                v = torch.cat([v, row])
            out[name] = v
        return UpdateBatch(**out)

    def rows(self, index: torch.Tensor) -> UpdateBatch:
        """Rows ``index``, cut to the longest of them (``L`` tokens, at least 2 so there is one
        target)."""
        length = max(int(self.attention_mask[index].sum(-1).max()), 2)
        out = {}
        for name, v in self._fields().items():
            if v is not None:
                v = (
                    v[index, :length]
                    if name in ("input_ids", "attention_mask")
                    else v[index, : length - 1]
                )
            out[name] = v
        return UpdateBatch(**out)
