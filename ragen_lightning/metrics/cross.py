"""The cross log-prob matrix of RAGEN-2's mutual-information proxy, by teacher forcing (RAGEN's
collapse_metrics).

From a rollout's trajectories (token-in/token-out conversations, ``rollout/tokens.py``) this builds
prompt/reasoning pairs and scores every reasoning under every prompt with the actor:

* X (a prompt): the conversation's token ids up to and including the ``<think>`` generation prefix
  of a turn, i.e. ``conversation.input_ids[:start]`` of the turn's span (for turn 1: system + first
  user message + ``<think>``; for a later turn in ``full`` context mode: the whole history up to
  that turn).
* Z (a reasoning): the sampled ids strictly between that ``<think>`` and the first ``</think>`` of
  the response (both tags excluded). A response without ``</think>``, or with nothing before it, has
  no reasoning: that turn is invalid and excluded (counted in ``num_excluded``). Unlike RAGEN, which
  re-tokenises the decoded text, Z is the sampled ids themselves (the tokens whose probabilities the
  model actually produced).

Sampling (:func:`first_turn_pairs`, :func:`trajectory_pairs`):

* first-turn: rows = the valid first turns (all, or ``num_samples`` drawn without replacement);
  columns = one per group (its first member's X; members of a group share the reset seed, so they
  saw the same prompt);
* trajectory-uniform: ``num_samples`` draws with replacement, a trajectory uniformly, then one of
  its valid turns uniformly; every draw is its own column (N = #draws) with its own row.

Columns with identical X ids get the same ``prompt_signature`` (retrieval counts them as the same
prompt).

:func:`score_pairs` teacher-forces ``[x_j | z_m]`` for all (m, j) under ``no_grad`` in micro-batches and returns
``ℓ_sum[m, j] = Σ_t log p(z_{m,t} | x_j, z_{m,<t})`` and ``ℓ[m, j] = ℓ_sum / |z_m|`` (at temperature
1 unless told otherwise), plus the wall time. The cost is M·N forward passes of ``|x| + |z|``
tokens, hence ``compute_freq`` and ``num_samples`` in the callback that calls it. Imports torch only
(no lightning).
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from ragen_lightning.algos.logits import logprobs_from_logits

from .functional import mutual_information

__all__ = [
    "CrossPairs",
    "CrossScores",
    "ReasoningFinder",
    "TurnText",
    "first_turn_pairs",
    "mi_diagnostics",
    "score_pairs",
    "thinking_flags",
    "trajectory_pairs",
    "trajectory_turns",
]


@dataclass
class TurnText:
    """One assistant turn of a trajectory: its prompt ids and its reasoning ids (None when the turn
    has none)."""

    trajectory: int  # index in the trajectory list
    group_id: int
    turn: int  # 0-based, in order of the trained turns
    prompt: list[int]
    reasoning: list[int] | None


@dataclass
class CrossPairs:
    """Rows (reasonings) and columns (prompts) of one cross log-prob matrix.

    Attributes:
        prompts: the column prompts X_j (token ids ending with the ``<think>`` prefix).  # N lists
        reasonings: the row reasonings Z_m (token ids, tags excluded).  # M lists
        prompt_index: the true column of each row.  # [M]
        prompt_signature: columns with identical prompt ids share an id.  # [N]
        num_turns: turns considered (valid or not).
        num_excluded: considered turns without a reasoning (excluded from the rows).
    """

    prompts: list[list[int]] = field(default_factory=list)
    reasonings: list[list[int]] = field(default_factory=list)
    prompt_index: torch.Tensor = field(default_factory=lambda: torch.zeros(0, dtype=torch.long))
    prompt_signature: torch.Tensor = field(default_factory=lambda: torch.zeros(0, dtype=torch.long))
    num_turns: int = 0
    num_excluded: int = 0


@dataclass
class CrossScores:
    """``token_mean`` and ``seq_sum`` ``[M, N]`` cross log-prob matrices and the scoring wall time
    in seconds."""

    token_mean: torch.Tensor
    seq_sum: torch.Tensor
    wall_s: float


class ReasoningFinder:
    """Finds the reasoning ids of a sampled response: everything before the first ``</think>``.

    A tokenizer whose ``</think>`` is one id (the embedded tiny model, Qwen3) is matched by id.
    Otherwise the response is decoded token by token and the tokens that end before the tag's first
    character are the reasoning (a token that straddles the tag is dropped).

    Args:
        tokenizer: the actor's tokenizer.
        close_tag: the closing reasoning tag.
    """

    def __init__(self, tokenizer: Any, close_tag: str = "</think>"):
        self.tokenizer, self.close_tag = tokenizer, close_tag
        ids = list(tokenizer.encode(close_tag, add_special_tokens=False))
        self.close_id = ids[0] if len(ids) == 1 else None

    def __call__(self, sampled: Sequence[int]) -> list[int] | None:
        sampled = list(sampled)
        if self.close_id is not None:
            if self.close_id not in sampled:
                return None
            z = sampled[: sampled.index(self.close_id)]
        else:
            pieces = [self.tokenizer.decode([i], skip_special_tokens=False) for i in sampled]
            where = "".join(pieces).find(self.close_tag)
            if where < 0:
                return None
            end, z = 0, []
            for i, piece in zip(sampled, pieces):
                end += len(piece)
                if end > where:
                    break
                z.append(i)
        return z or None


def trajectory_turns(trajectories: Sequence[Any], finder: ReasoningFinder) -> list[list[TurnText]]:
    """The trained turns of every trajectory, in order (each sample's ``turn_spans``; ``full`` mode
    has one sample holding every turn, the windowed modes one sample per turn)."""
    out = []
    for t_index, traj in enumerate(trajectories):
        turns = []
        for sample in traj.samples:
            conv = sample.conversation
            for start, end in conv.turn_spans:
                turns.append(
                    TurnText(
                        t_index,
                        int(traj.group_id),
                        len(turns),
                        list(conv.input_ids[:start]),
                        finder(conv.input_ids[start:end]),
                    )
                )
        out.append(turns)
    return out


def thinking_flags(turns: list[list[TurnText]]) -> torch.Tensor:
    """``[all turns]`` bool: the turn has a non-empty reasoning (the definition behind the
    valid-thinking rate, ``functional.valid_thinking_rate``); turns in trajectory order."""
    return torch.tensor([t.reasoning is not None for ts in turns for t in ts], dtype=torch.bool)


def _signatures(prompts: list[list[int]]) -> torch.Tensor:
    ids: dict[tuple[int, ...], int] = {}
    return torch.tensor([ids.setdefault(tuple(p), len(ids)) for p in prompts], dtype=torch.long)


def first_turn_pairs(
    turns: list[list[TurnText]],
    num_samples: int | None = None,
    generator: torch.Generator | None = None,
) -> CrossPairs:
    """First-turn pairs: rows = valid first turns (``num_samples`` of them drawn without replacement
    if fewer than all), columns = one prompt per group (its first member's)."""
    firsts = [ts[0] for ts in turns if ts]
    columns: dict[int, int] = {}
    prompts: list[list[int]] = []
    for t in firsts:  # group order of first appearance; representative = first member
        if t.group_id not in columns:
            columns[t.group_id] = len(prompts)
            prompts.append(t.prompt)
    valid = [t for t in firsts if t.reasoning is not None]
    if num_samples is not None and num_samples < len(valid):
        pick = torch.randperm(len(valid), generator=generator)[:num_samples].sort().values
        valid = [valid[i] for i in pick.tolist()]
    return CrossPairs(
        prompts=prompts,
        reasonings=[t.reasoning for t in valid],
        prompt_index=torch.tensor([columns[t.group_id] for t in valid], dtype=torch.long),
        prompt_signature=_signatures(prompts),
        num_turns=len(firsts),
        num_excluded=sum(t.reasoning is None for t in firsts),
    )


def trajectory_pairs(
    turns: list[list[TurnText]], num_samples: int, generator: torch.Generator | None = None
) -> CrossPairs:
    """Trajectory-uniform pairs: ``num_samples`` draws with replacement of a trajectory (uniform
    over those with a valid turn), then one of its valid turns (uniform); draw i is row i and column
    i."""
    all_turns = [t for ts in turns for t in ts]
    valid = [[t for t in ts if t.reasoning is not None] for ts in turns]
    valid = [v for v in valid if v]
    pairs = CrossPairs(
        num_turns=len(all_turns), num_excluded=sum(t.reasoning is None for t in all_turns)
    )
    if not valid or num_samples < 1:
        return pairs
    traj = torch.randint(len(valid), (num_samples,), generator=generator).tolist()
    u = torch.rand(num_samples, generator=generator).tolist()
    draws = [valid[m][min(int(x * len(valid[m])), len(valid[m]) - 1)] for m, x in zip(traj, u)]
    pairs.prompts = [d.prompt for d in draws]
    pairs.reasonings = [d.reasoning for d in draws]
    pairs.prompt_index = torch.arange(len(draws))
    pairs.prompt_signature = _signatures(pairs.prompts)
    return pairs


@torch.no_grad()
def score_pairs(
    actor: nn.Module,
    pairs: CrossPairs,
    micro_batch_size: int,
    *,
    pad_token_id: int = 0,
    temperature: float = 1.0,
    device: torch.device | str | None = None,
    prefix_cache: bool = True,
) -> CrossScores:
    """Teacher-force ``[x_j | z_m]`` for every row m and column j; see the module docstring.

    Args:
        actor: a causal LM (``actor(input_ids=..., attention_mask=...).logits``); run in eval mode, restored after.
        pairs: rows and columns. micro_batch_size: sequences per forward pass. pad_token_id: id of
        the right padding (masked out, so its value does not matter). temperature: log-probs of
        ``logits / temperature``. device: where to run (default: the actor's parameters' device).
        prefix_cache: run each prompt once and score the reasonings from its KV cache (prompts are
        usually far
            longer than reasonings, so this is several times faster); ``False`` runs every ``[x_j | z_m]`` whole.
            Both give the same matrix up to float rounding (a test checks it).
    """
    t0 = time.perf_counter()
    m, n = len(pairs.reasonings), len(pairs.prompts)
    seq_sum = torch.zeros(m, n, dtype=torch.float32)
    lengths = torch.tensor([len(z) for z in pairs.reasonings], dtype=torch.float32)
    if m and n:
        if micro_batch_size < 1:
            raise ValueError(f"micro_batch_size must be >= 1, got {micro_batch_size}")
        device = device or next(actor.parameters()).device
        was_training = actor.training
        actor.eval()
        try:
            score = _score_cached if prefix_cache else _score_whole
            score(actor, pairs, micro_batch_size, pad_token_id, temperature, device, seq_sum)
        finally:
            actor.train(was_training)
    token_mean = seq_sum / lengths.clamp(min=1)[:, None]
    return CrossScores(token_mean=token_mean, seq_sum=seq_sum, wall_s=time.perf_counter() - t0)


def _right_padded(seqs: list[list[int]], pad_token_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_token_id, dtype=torch.long)
    att = torch.zeros((len(seqs), width), dtype=torch.long)
    for r, s in enumerate(seqs):
        ids[r, : len(s)] = torch.tensor(s)
        att[r, : len(s)] = 1
    return ids, att


def _score_whole(actor, pairs, micro, pad_token_id, temperature, device, seq_sum) -> None:
    jobs = [(i, j) for j in range(len(pairs.prompts)) for i in range(len(pairs.reasonings))]
    for start in range(0, len(jobs), micro):
        chunk = jobs[start : start + micro]
        ids, att = _right_padded(
            [pairs.prompts[j] + pairs.reasonings[i] for i, j in chunk], pad_token_id
        )
        # target axis: token t+1 from t
        target = torch.zeros((len(chunk), ids.shape[1] - 1), dtype=torch.bool)
        for r, (i, j) in enumerate(chunk):
            x = len(pairs.prompts[j])
            target[r, x - 1 : x - 1 + len(pairs.reasonings[i])] = True
        ids, att = ids.to(device), att.to(device)
        logits = actor(input_ids=ids, attention_mask=att).logits[:, :-1].float() / temperature
        lp = logprobs_from_logits(logits, ids[:, 1:]).cpu()  # [b, width - 1]
        sums = torch.where(target, lp, torch.zeros_like(lp)).sum(-1)
        for r, (i, j) in enumerate(chunk):
            seq_sum[i, j] = sums[r]


def _score_cached(actor, pairs, micro, pad_token_id, temperature, device, seq_sum) -> None:
    import copy

    for j, x in enumerate(pairs.prompts):
        out = actor(input_ids=torch.tensor([x], device=device), use_cache=True)
        # [V]: p(z_0 | x)
        first = torch.log_softmax(out.logits[0, -1].float() / temperature, dim=-1).cpu()
        for start in range(0, len(pairs.reasonings), micro):
            rows = list(range(start, min(start + micro, len(pairs.reasonings))))
            z_ids, z_att = _right_padded([pairs.reasonings[i] for i in rows], pad_token_id)
            cache = copy.deepcopy(out.past_key_values)
            cache.batch_repeat_interleave(len(rows))
            att = torch.cat([torch.ones((len(rows), len(x)), dtype=torch.long), z_att], dim=1)
            logits = (
                actor(
                    input_ids=z_ids.to(device),
                    attention_mask=att.to(device),
                    past_key_values=cache,
                    use_cache=True,
                )
                .logits[:, :-1]
                .float()
                / temperature
            )
            # p(z_t | x, z_<t), t >= 1
            rest = logprobs_from_logits(logits, z_ids[:, 1:].to(device)).cpu()
            sums = first[z_ids[:, 0]] + (rest * z_att[:, 1:]).sum(-1)
            for r, i in enumerate(rows):
                seq_sum[i, j] = sums[r]


def mi_diagnostics(
    pairs: CrossPairs,
    scores: CrossScores,
    prefix: str,
    ema_state: dict[str, torch.Tensor] | None = None,
    ema_decay: float = 0.9,
    std_eps: float = 1e-3,
) -> dict[str, float]:
    """The logged MI family of one matrix (both variants) as floats under ``prefix`` (e.g.
    ``collapse/first_turn``).

    Keys: every key of ``functional.mutual_information`` for the token-mean variant, the sum
    variant's with a ``_seq`` suffix (``mi_seq``, ``conditional_entropy_seq``...), plus
    ``num_turns``, ``num_valid``, ``valid_rate``, ``num_excluded`` and ``time_s``. ``ema_state`` (a
    dict the caller keeps per prefix) carries the EMA of the marginal std from call to call and is
    updated in place.
    """
    ema_state = {} if ema_state is None else ema_state
    out: dict[str, float] = {}
    if len(pairs.reasonings) and len(pairs.prompts):
        for variant, matrix in (("", scores.token_mean), ("_seq", scores.seq_sum)):
            values = mutual_information(
                matrix,
                pairs.prompt_index,
                prompt_signature=pairs.prompt_signature,
                std_eps=std_eps,
                marginal_std_ema=ema_state.get(variant),
                ema_decay=ema_decay,
            )
            ema_state[variant] = values["marginal_std_ema"]
            for k, v in values.items():
                if variant and k.startswith("retrieval"):
                    # retrieval by the sum ranks long reasonings differently; RAGEN logs the mean's
                    # only
                    continue
                out[f"{prefix}/{k}{variant}"] = float(v)
    valid = pairs.num_turns - pairs.num_excluded
    out[f"{prefix}/num_turns"] = float(pairs.num_turns)
    out[f"{prefix}/num_valid"] = float(valid)
    out[f"{prefix}/num_excluded"] = float(pairs.num_excluded)
    out[f"{prefix}/valid_rate"] = valid / pairs.num_turns if pairs.num_turns else 0.0
    out[f"{prefix}/time_s"] = scores.wall_s
    return {k: v for k, v in out.items() if math.isfinite(v)}
