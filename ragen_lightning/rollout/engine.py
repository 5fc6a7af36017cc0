"""Generation engines: token ids in, sampled token ids and their log-probs out.

:class:`GenerationEngine` is the protocol the rollout runner talks to; :class:`HFEngine` implements it with a plain
KV-cached decode loop over a transformers causal LM (the actor itself, so its weights are always in sync). The vLLM
engine (``vllm_engine.py``) implements the same protocol.

Why a hand-written decode loop instead of ``model.generate``: every request gets its own ``torch.Generator``
seeded from the request seed, so a request samples the same tokens whatever else is in the batch (reproducible
rollouts that do not depend on batch composition), and the returned log-probs are those of the raw model
distribution (temperature 1, no top-k/top-p), which is what the trainer's ``old_logprobs`` recomputation is compared
with.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol, Sequence

import torch


@dataclass(frozen=True)
class SamplingParams:
    """How to sample one assistant turn.

    Args:
        temperature: softmax temperature; 0 means greedy.
        top_p: nucleus sampling mass (1.0 = off).
        top_k: keep the k most likely tokens (0 or -1 = off).
        max_new_tokens: per-turn response length cap.
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    max_new_tokens: int = 100

    def __post_init__(self):
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")


@dataclass
class Generation:
    """One request's output.

    Attributes:
        token_ids: sampled ids, including the stop token when one was sampled.
        logprobs: raw-model log-prob of each sampled id (temperature 1, before top-k/top-p).
        finish_reason: ``"stop"`` (a stop token was sampled) or ``"length"`` (hit ``max_new_tokens``).
    """

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: Literal["stop", "length"]


class GenerationEngine(Protocol):
    """What the rollout runner needs from an engine."""

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams,
                 seeds: Sequence[int] | None = None) -> list[Generation]:
        """Sample one continuation per prompt (token ids in, token ids out)."""
        ...

    def sync_weights(self) -> dict[str, float] | None:
        """Make the engine generate with the actor's current weights (called before every rollout); may return
        metrics (``rollout/sync_s``, probe differences, ...)."""
        ...


def check_requests(prompts: Sequence[Sequence[int]], seeds: Sequence[int] | None) -> None:
    """The request checks every engine runs: one seed per prompt, no empty prompt."""
    if seeds is not None and len(seeds) != len(prompts):
        raise ValueError(f"got {len(seeds)} seeds for {len(prompts)} prompts")
    if any(len(p) == 0 for p in prompts):
        raise ValueError("every prompt needs at least one token")


def process_logits(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Temperature, top-k and top-p applied to ``logits`` [B, V]; filtered entries become -inf."""
    logits = logits / params.temperature
    if params.top_k is not None and params.top_k > 0 and params.top_k < logits.shape[-1]:
        kth = torch.topk(logits, params.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        probs = torch.softmax(sorted_logits, dim=-1)
        # drop a token when the mass of the tokens ranked above it already reaches top_p (the top token always stays)
        drop_sorted = (torch.cumsum(probs, dim=-1) - probs) >= params.top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


class HFEngine:
    """KV-cached batched sampling with a transformers causal LM.

    Args:
        model: the causal LM (usually the actor itself; generation runs under ``no_grad`` in eval mode and
            restores the training mode afterwards).
        stop_token_ids: ids that end a turn (the tokenizer's end-of-turn token).
        pad_token_id: id used for left padding.
        max_batch_size: requests decoded together at most (bounds memory).
    """

    def __init__(self, model: torch.nn.Module, stop_token_ids: Sequence[int], pad_token_id: int,
                 max_batch_size: int = 128):
        if not stop_token_ids:
            raise ValueError("stop_token_ids must name at least one end-of-turn token")
        self.model = model
        self.stop_token_ids = list(stop_token_ids)
        self.pad_token_id = pad_token_id
        self.max_batch_size = max_batch_size

    def sync_weights(self) -> None:  # the engine samples with the actor's own parameters
        return None

    @torch.no_grad()
    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams,
                 seeds: Sequence[int] | None = None) -> list[Generation]:
        check_requests(prompts, seeds)
        was_training = self.model.training
        self.model.eval()
        try:
            out: list[Generation] = []
            for start in range(0, len(prompts), self.max_batch_size):
                chunk = prompts[start:start + self.max_batch_size]
                chunk_seeds = None if seeds is None else seeds[start:start + self.max_batch_size]
                out.extend(self._generate_batch(chunk, params, chunk_seeds))
            return out
        finally:
            self.model.train(was_training)

    def _generate_batch(self, prompts, params: SamplingParams, seeds) -> list[Generation]:
        device = next(self.model.parameters()).device
        B, L = len(prompts), max(len(p) for p in prompts)
        input_ids = torch.full((B, L), self.pad_token_id, dtype=torch.long, device=device)
        attention = torch.zeros((B, L), dtype=torch.long, device=device)
        for i, p in enumerate(prompts):  # left padding: the last prompt token of every row sits at column L-1
            input_ids[i, L - len(p):] = torch.as_tensor(list(p), dtype=torch.long)
            attention[i, L - len(p):] = 1
        generators = None
        if seeds is not None and params.temperature > 0:
            generators = [torch.Generator(device=device).manual_seed(int(s) % (2**63)) for s in seeds]
        stop = torch.tensor(self.stop_token_ids, device=device)

        position = (attention.cumsum(-1) - 1).clamp(min=0)
        out = self.model(input_ids=input_ids, attention_mask=attention, position_ids=position, use_cache=True)
        past, next_pos = out.past_key_values, position[:, -1] + 1
        tokens = torch.zeros((B, params.max_new_tokens), dtype=torch.long, device=device)
        logprobs = torch.zeros((B, params.max_new_tokens), device=device)
        done = torch.zeros(B, dtype=torch.bool, device=device)
        lengths = torch.full((B,), params.max_new_tokens, dtype=torch.long, device=device)
        for step in range(params.max_new_tokens):
            logits = out.logits[:, -1, :].float()
            token = self._sample(logits, params, generators)
            token = torch.where(done, torch.full_like(token, self.pad_token_id), token)
            tokens[:, step] = token
            logprobs[:, step] = torch.log_softmax(logits, dim=-1).gather(-1, token[:, None]).squeeze(-1)
            just_stopped = ~done & torch.isin(token, stop)
            lengths = torch.where(just_stopped, torch.full_like(lengths, step + 1), lengths)
            done |= just_stopped
            if bool(done.all()) or step + 1 == params.max_new_tokens:
                break
            attention = torch.cat([attention, (~done).long()[:, None]], dim=1)
            out = self.model(input_ids=token[:, None], attention_mask=attention, position_ids=next_pos[:, None],
                             past_key_values=past, use_cache=True)
            past, next_pos = out.past_key_values, next_pos + 1
        results = []
        for i in range(B):
            n = int(lengths[i])
            ids = tokens[i, :n].tolist()
            stopped = bool(n > 0 and ids[-1] in self.stop_token_ids)
            results.append(Generation(ids, logprobs[i, :n].tolist(), "stop" if stopped else "length"))
        return results

    @staticmethod
    def _sample(logits: torch.Tensor, params: SamplingParams, generators) -> torch.Tensor:
        if params.temperature == 0:
            return logits.argmax(dim=-1)
        probs = torch.softmax(process_logits(logits, params), dim=-1)
        if generators is None:
            return torch.multinomial(probs, 1).squeeze(-1)
        return torch.stack([torch.multinomial(probs[i], 1, generator=g)[0] for i, g in enumerate(generators)])
