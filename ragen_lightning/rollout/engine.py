"""Generation engines: token ids in, sampled token ids and their log-probs out.

:class:`GenerationEngine` is the protocol the rollout runner talks to; :class:`HFEngine` implements it with a plain
KV-cached decode loop over a transformers causal LM (the actor itself, so its weights are always in
sync). The vLLM engine (``vllm_engine.py``) implements the same protocol.

Why a hand-written decode loop instead of ``model.generate``: every request gets its own
``torch.Generator`` seeded from the request seed, so a request samples the same tokens whatever else
is in the batch (reproducible rollouts that do not depend on batch composition), and the returned
log-probs are those of the raw model distribution (temperature 1, no top-k/top-p), which is what the
trainer's ``old_logprobs`` recomputation is compared with.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import torch


@dataclass(frozen=True)
class SamplingParams:
    """How to sample one assistant turn.

    Args:
        temperature: softmax temperature; 0 means greedy.
        top_p: nucleus sampling mass (1.0 = off). top_k: keep the k most likely tokens (0 or -1 =
        off). max_new_tokens: per-turn response length cap. stop: stop strings (e.g.
        ``("</answer>",)``): generation ends with the sampled token that completes one in
            the decoded response, and that token (all of it, even when the string ends inside it) stays in the
            response, so the ids trained are the ids sampled; ``finish_reason`` is then ``"stop"``.
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    max_new_tokens: int = 100
    stop: tuple[str, ...] = ()

    def __post_init__(self):
        if isinstance(self.stop, str) or not all(isinstance(s, str) and s for s in self.stop):
            raise ValueError(f"stop must be a sequence of non-empty strings, got {self.stop!r}")
        object.__setattr__(self, "stop", tuple(self.stop))
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
        finish_reason: ``"stop"`` (a stop token was sampled or a stop string completed) or
        ``"length"`` (hit
            ``max_new_tokens``).
    """

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: Literal["stop", "length"]


class GenerationEngine(Protocol):
    """What the rollout runner needs from an engine."""

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        params: SamplingParams,
        seeds: Sequence[int] | None = None,
    ) -> list[Generation]:
        """Sample one continuation per prompt (token ids in, token ids out)."""
        ...

    def sync_weights(self) -> dict[str, float] | None:
        """Make the engine generate with the actor's current weights (called before every rollout);
        may return metrics (``rollout/sync_s``, probe differences, ...)."""
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
        # drop a token when the mass of the tokens ranked above it already reaches top_p (the top
        # token always stays)
        drop_sorted = (torch.cumsum(probs, dim=-1) - probs) >= params.top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


@dataclass
class _CachedPrefix:
    """Keys/values of one finished request: ``ids`` (its prompt + sampled ids but the last one,
    which was never fed back) at unpadded positions ``0 .. len(ids) - 1``; per layer ``[kv_heads,
    len(ids), head_dim]``."""

    ids: list[int]
    keys: list[torch.Tensor]
    values: list[torch.Tensor]


@dataclass
class _Sampled:
    """What a decode batch sampled, per request (original row): ids and their raw-model log-probs
    ``[B, max_new_tokens]``, and the ids kept (``max_new_tokens`` unless a stop ended the request
    sooner)."""

    tokens: torch.Tensor
    logprobs: torch.Tensor
    lengths: torch.Tensor

    @classmethod
    def empty(cls, batch: int, steps: int, device: torch.device) -> _Sampled:
        """Room for ``steps`` (the sampling cap) ids per request; every length at the cap until a
        stop."""
        return cls(
            tokens=torch.zeros((batch, steps), dtype=torch.long, device=device),
            # fp32 whatever the default dtype (bf16-true precision sets it to bf16 around the
            # training step)
            logprobs=torch.zeros((batch, steps), dtype=torch.float32, device=device),
            lengths=torch.full((batch,), steps, dtype=torch.long, device=device),
        )

    def record(
        self, rows: torch.Tensor, step: int, token: torch.Tensor, logits: torch.Tensor
    ) -> None:
        """Store the ids ``token`` the live ``rows`` sampled at ``step`` from fp32 ``logits``, with
        their log-probs."""
        self.tokens[rows, step] = token
        self.logprobs[rows, step] = (
            torch.log_softmax(logits, dim=-1).gather(-1, token[:, None]).squeeze(-1)
        )


class HFEngine:
    """KV-cached batched sampling with a transformers causal LM.

    Two savings over a plain decode loop, neither of which changes what a request samples:

    * **Prefix reuse across turns.** Multi-turn conversations are append-only: turn ``k + 1``'s
      prompt is turn ``k``'s prompt + sampled ids + the next user message. Every finished request
      leaves its keys/values behind (at unpadded positions, so they do not depend on the batch they
      were computed in); a later request whose prompt starts with a cached sequence prefills only
      the rest. Entries are dropped when a request extends them, when the weights change (parameter
      version counters, checked every call), by :meth:`clear_cache` (the rollout runner calls it at
      the start and end of every rollout) and oldest-first beyond ``prefix_cache_tokens``.
    * **Finished rows leave the batch.** A row that sampled a stop token is removed from the decode
      batch (and the leading all-padding columns with it), so late steps decode only live rows.

    Stop strings (``SamplingParams.stop``) are matched on the decoded text of each row's last few
    sampled tokens after every step (only when the new token can end one), the way vLLM's
    detokenizer matches them; they need the ``tokenizer``.

    Args:
        model: the causal LM (usually the actor itself; generation runs under ``no_grad`` in eval mode and
            restores the training mode afterwards).
        stop_token_ids: ids that end a turn (the tokenizer's end-of-turn token). pad_token_id: id
        used for left padding. max_batch_size: requests decoded together at most (bounds memory).
        prefix_cache_tokens: tokens of keys/values kept for prefix reuse at most (0 turns reuse
        off). tokenizer: decodes sampled ids for stop strings (None: requests with stop strings are
        refused).
    """

    def __init__(
        self,
        model: torch.nn.Module,
        stop_token_ids: Sequence[int],
        pad_token_id: int,
        max_batch_size: int = 128,
        prefix_cache_tokens: int = 1 << 18,
        tokenizer: Any = None,
    ):
        if not stop_token_ids:
            raise ValueError("stop_token_ids must name at least one end-of-turn token")
        if prefix_cache_tokens < 0:
            raise ValueError(f"prefix_cache_tokens must be >= 0, got {prefix_cache_tokens}")
        self.model = model
        self.stop_token_ids = list(stop_token_ids)
        self.pad_token_id = pad_token_id
        self.max_batch_size = max_batch_size
        self.prefix_cache_tokens = prefix_cache_tokens
        self.tokenizer = tokenizer
        # stop strings -> token id -> can it end one
        self._may_end: dict[tuple[str, ...], dict[int, bool]] = {}
        self._cache: OrderedDict[int, _CachedPrefix] = OrderedDict()
        self._cache_key = 0
        self._weights_stamp: tuple | None = None
        # running totals: prompt tokens prefilled / reused from the cache, sampled tokens, decode
        # row-steps run
        self.stats = {
            "prefill_tokens": 0,
            "reused_tokens": 0,
            "sampled_tokens": 0,
            "decode_row_steps": 0,
        }

    def sync_weights(self) -> None:  # the engine samples with the actor's own parameters
        self.clear_cache()

    # -- prefix cache ------------------------------------------------------------------------------
    def clear_cache(self) -> None:
        """Forget every cached prefix (keys/values are only valid for the weights that computed
        them)."""
        self._cache.clear()

    @property
    def cached_tokens(self) -> int:
        return sum(len(e.ids) for e in self._cache.values())

    def _stamp(self) -> tuple:
        # in-place updates (optimizer steps, load_state_dict, copy_) bump a tensor's version counter
        return tuple((id(p), p._version) for p in self.model.parameters())

    def _lookup(self, prompt: list[int]) -> tuple[int | None, int]:
        """``(key, reused)`` of the longest cached sequence that is a prefix of ``prompt`` (at least
        one prompt token is always left to prefill, for the next-token logits)."""
        best, reused = None, 0
        for key, entry in self._cache.items():
            n = len(entry.ids)
            if n > reused and n <= len(prompt) and prompt[:n] == entry.ids:
                best, reused = key, n
        return best, min(reused, len(prompt) - 1)

    def _store(self, ids: list[int], keys: list[torch.Tensor], values: list[torch.Tensor]) -> None:
        if not ids or len(ids) > self.prefix_cache_tokens:
            return
        total = self.cached_tokens + len(ids)
        while self._cache and total > self.prefix_cache_tokens:
            total -= len(self._cache.popitem(last=False)[1].ids)
        self._cache[self._cache_key] = _CachedPrefix(ids, keys, values)
        self._cache_key += 1

    # -- generation --------------------------------------------------------------------------------
    @torch.no_grad()
    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        params: SamplingParams,
        seeds: Sequence[int] | None = None,
    ) -> list[Generation]:
        check_requests(prompts, seeds)
        if params.stop and self.tokenizer is None:
            raise ValueError(
                "stop strings need the engine's tokenizer: build HFEngine with tokenizer="
            )
        was_training = self.model.training
        self.model.eval()
        try:
            if self.prefix_cache_tokens:
                stamp = self._stamp()
                if stamp != self._weights_stamp:
                    self.clear_cache()
                    self._weights_stamp = stamp
            out: list[Generation] = []
            for start in range(0, len(prompts), self.max_batch_size):
                chunk = [list(p) for p in prompts[start : start + self.max_batch_size]]
                chunk_seeds = None if seeds is None else seeds[start : start + self.max_batch_size]
                out.extend(self._generate_batch(chunk, params, chunk_seeds))
            return out
        finally:
            self.model.train(was_training)

    def _prefill_inputs(self, prompts: list[list[int]], device):
        """Cache, ids, attention and positions of the prefill, laid out per row as ``[pad | cached
        prefix | pad | uncached suffix]`` (the cached keys already carry their RoPE positions)."""
        from transformers import DynamicCache

        found = [self._lookup(p) if self.prefix_cache_tokens else (None, 0) for p in prompts]
        entries = [self._cache[k] if k is not None else None for k, _ in found]
        reused = [r for _, r in found]
        suffix = [p[r:] for p, r in zip(prompts, reused)]
        B, P, S = len(prompts), max(reused), max(len(s) for s in suffix)
        input_ids = torch.full((B, S), self.pad_token_id, dtype=torch.long, device=device)
        attention = torch.zeros((B, P + S), dtype=torch.long, device=device)
        position = torch.zeros((B, S), dtype=torch.long, device=device)
        for i, (s, r) in enumerate(zip(suffix, reused)):
            input_ids[i, S - len(s) :] = torch.as_tensor(s, dtype=torch.long)
            attention[i, P - r : P] = 1
            attention[i, P + S - len(s) :] = 1
            position[i, S - len(s) :] = torch.arange(r, r + len(s))
        cache = DynamicCache()
        if P > 0:
            ref = next(e for e in entries if e is not None)
            for layer in range(len(ref.keys)):
                for name in ("keys", "values"):
                    like = getattr(ref, name)[layer]  # [kv_heads, n, head_dim]
                    padded = like.new_zeros((B, like.shape[0], P, like.shape[2]))
                    for i, (e, r) in enumerate(zip(entries, reused)):
                        if e is not None and r > 0:
                            padded[i, :, P - r :] = getattr(e, name)[layer][:, :r]
                    if name == "keys":
                        keys = padded
                cache.update(keys, padded, layer)
        # the conversation moves on: its new entry replaces it
        for key in {k for k, _ in found if k is not None}:
            del self._cache[key]
        self.stats["prefill_tokens"] += sum(len(s) for s in suffix)
        self.stats["reused_tokens"] += sum(reused)
        return cache, input_ids, attention, position

    def _generate_batch(
        self, prompts: list[list[int]], params: SamplingParams, seeds
    ) -> list[Generation]:
        device = next(self.model.parameters()).device
        B = len(prompts)
        cache, input_ids, attention, position = self._prefill_inputs(prompts, device)
        generators = None
        if seeds is not None and params.temperature > 0:
            generators = [
                torch.Generator(device=device).manual_seed(int(s) % (2**63)) for s in seeds
            ]
        stop = torch.tensor(self.stop_token_ids, device=device)

        out = self.model(
            input_ids=input_ids,
            attention_mask=attention,
            position_ids=position,
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=1,
        )
        cache, next_pos = out.past_key_values, position[:, -1] + 1
        # sliding-window masks count columns, which the padded layout of reused prefixes would shift
        reusable = self.prefix_cache_tokens > 0 and not getattr(
            getattr(self.model, "config", None), "use_sliding_window", False
        )
        sampled = _Sampled.empty(B, params.max_new_tokens, device)
        rows = torch.arange(B, device=device)  # original index of each live row of the decode batch
        for step in range(params.max_new_tokens):
            logits = out.logits[:, -1, :].float()
            token = self._sample(logits, params, generators)
            sampled.record(rows, step, token, logits)
            self.stats["decode_row_steps"] += len(rows)
            finished = torch.isin(token, stop)
            if params.stop:
                finished |= self._stop_string_hits(sampled.tokens, rows, token, step, params.stop)
            sampled.lengths[rows[finished]] = step + 1
            if step + 1 == params.max_new_tokens:
                finished[:] = True
            if reusable:
                self._store_finished(
                    prompts, sampled.tokens, rows, finished, attention, cache, step
                )
            if bool(finished.all()):
                break
            # drop finished rows, then columns that are padding in every live row
            if bool(finished.any()):
                keep = (~finished).nonzero().flatten()
                rows, token, next_pos = rows[keep], token[keep], next_pos[keep]
                if generators is not None:
                    generators = [generators[j] for j in keep.tolist()]
                attention = _keep_rows(cache, attention, keep)
            attention = torch.cat([attention, torch.ones_like(attention[:, :1])], dim=1)
            out = self.model(
                input_ids=token[:, None],
                attention_mask=attention,
                position_ids=next_pos[:, None],
                past_key_values=cache,
                use_cache=True,
            )
            cache, next_pos = out.past_key_values, next_pos + 1
        return self._generations(sampled, params)

    def _store_finished(
        self,
        prompts: list[list[int]],
        tokens: torch.Tensor,
        rows: torch.Tensor,
        finished: torch.Tensor,
        attention: torch.Tensor,
        cache: Any,
        step: int,
    ) -> None:
        """Leave each finished live row's keys/values in the prefix cache: those of its prompt +
        ``tokens[:step]`` (the token just sampled was never fed), taken at its non-padding
        columns."""
        for j in finished.nonzero().flatten().tolist():
            real = attention[j].bool()
            i = int(rows[j])
            self._store(
                prompts[i] + tokens[i, :step].tolist(),
                [layer.keys[j][:, real] for layer in cache.layers],
                [layer.values[j][:, real] for layer in cache.layers],
            )

    def _generations(self, sampled: _Sampled, params: SamplingParams) -> list[Generation]:
        """Each request's kept ids and log-probs, ``"stop"`` when they end with a stop token or a
        stop string."""
        results = []
        for i in range(len(sampled.lengths)):
            n = int(sampled.lengths[i])
            ids = sampled.tokens[i, :n].tolist()
            stopped = bool(n > 0 and ids[-1] in self.stop_token_ids) or bool(
                params.stop and n > 0 and self._has_stop(ids, params.stop)
            )
            results.append(
                Generation(ids, sampled.logprobs[i, :n].tolist(), "stop" if stopped else "length")
            )
        self.stats["sampled_tokens"] += int(sampled.lengths.sum())
        return results

    def _stop_string_hits(
        self,
        tokens: torch.Tensor,
        rows: torch.Tensor,
        token: torch.Tensor,
        step: int,
        strings: tuple[str, ...],
    ) -> torch.Tensor:
        """[live rows] True where the token just sampled completes a stop string. Only the last few
        tokens are decoded: a string of b UTF-8 bytes spans at most b tokens, and an earlier
        occurrence would have stopped the row already."""
        hits = torch.zeros(len(rows), dtype=torch.bool, device=token.device)
        may_end = self._may_end.setdefault(strings, {})
        window = max(len(s.encode("utf-8")) for s in strings) + 1
        for j, (i, t) in enumerate(zip(rows.tolist(), token.tolist())):
            # can this token's text hold the end of a stop string (or a partial character)?
            if t not in may_end:
                piece = self.tokenizer.decode([t], skip_special_tokens=False)
                may_end[t] = "\ufffd" in piece or any(s[-1] in piece for s in strings)
            if may_end[t]:
                hits[j] = self._has_stop(
                    tokens[i, max(0, step + 1 - window) : step + 1].tolist(), strings
                )
        return hits

    def _has_stop(self, ids: list[int], strings: tuple[str, ...]) -> bool:
        text = self.tokenizer.decode(ids, skip_special_tokens=False)
        return any(s in text for s in strings)

    @staticmethod
    def _sample(logits: torch.Tensor, params: SamplingParams, generators) -> torch.Tensor:
        if params.temperature == 0:
            return logits.argmax(dim=-1)
        probs = torch.softmax(process_logits(logits, params), dim=-1)
        if generators is None:
            return torch.multinomial(probs, 1).squeeze(-1)
        return torch.stack(
            [torch.multinomial(probs[i], 1, generator=g)[0] for i, g in enumerate(generators)]
        )


def _keep_rows(cache: Any, attention: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """Cut the decode batch's ``cache`` (in place) and ``attention`` to the live rows ``keep``, then
    to the columns from the first one that is not padding in every kept row; returns the cut
    attention mask."""
    attention = attention[keep]
    first = int(attention.any(0).long().argmax())
    for layer in cache.layers:
        layer.keys, layer.values = layer.keys[keep, :, first:], layer.values[keep, :, first:]
    return attention[:, first:]
