"""Padding-free teacher-forced forwards: the rows of a micro-batch packed into one sequence.

A right-padded micro-batch ``[b, L]`` spends ``b * L - sum(len)`` token positions on padding,
forward and backward. Packed, its real tokens run as one row ``[1, N]`` with position ids restarting
in every row, and each attention layer attends inside a row only: :func:`run_packed` sets the packed
segments in a context variable that the attention function registered here (:data:`IMPLEMENTATION`)
reads, and runs causal SDPA once per segment. Every other call of a model set to that implementation
(generation, the padded passes, another thread) runs the plain SDPA path unchanged, so a model can
keep it for good (:func:`use_packed_attention`).

Shared prefixes pack once: rows next to each other that start with the same tokens (an env's system
prompt, a group's first observation; :func:`by_tokens` puts them together) form a group whose common
prefix is one segment, and each row's remaining tokens attend to it before their own. Unlike the
padded pass's shared prefix (:func:`~ragen_lightning.models.forward.run_on_shared_prefix`, one
prefix common to the whole micro-batch, run as a separate call into a key/value cache), a
micro-batch may hold several groups, and it is one forward call (so sharded networks share prefixes
too).

Exact: a row's tokens see the same keys at the same positions as in the padded call, so log-probs,
values and gradients agree with it to float rounding, a prefix's gradient being the sum of its rows'
(``tests/unit/starpo/test_packing.py``).

Why not Hugging Face's own packed path (``position_ids`` restarting, no attention mask): under SDPA
it builds a ``[1, 1, N, N]`` block-diagonal mask and attends over all ``N`` positions, ``b`` times
the attention work of the padded batch; flash-attention's varlen kernels avoid that on CUDA but are
not available on CPU, and neither lets rows share a prefix. The loop here costs one SDPA call per
segment and layer.
"""

from __future__ import annotations

import contextlib
import contextvars
from dataclasses import dataclass

import torch

IMPLEMENTATION = "ragen_packed_sdpa"
SUPPORTED = ("sdpa", IMPLEMENTATION)  # attention implementations a packed forward can run on

# (prefix start, prefix length, start, length) of the segments of the packed forward running on this
# thread
_SEGMENTS: contextvars.ContextVar[tuple[tuple[int, int, int, int], ...] | None] = (
    contextvars.ContextVar("ragen_packed_segments", default=None)
)


def _packed_attention(
    module,
    query,
    key,
    value,
    attention_mask,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs,
):
    """SDPA inside each packed segment (``query`` [1, H, N, d], ``key``/``value`` [1, H_kv, N, d]),
    a row's segment attending to its group's prefix first; the plain SDPA path outside a packed
    forward."""
    from transformers.integrations.sdpa_attention import (
        repeat_kv,
        sdpa_attention_forward,
    )

    segments = _SEGMENTS.get()
    if segments is None:
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    groups = getattr(module, "num_key_value_groups", 1)
    if groups > 1:
        key, value = repeat_kv(key, groups), repeat_kv(value, groups)
    sdpa = torch.nn.functional.scaled_dot_product_attention
    outs = []
    for prefix_at, p, start, n in segments:
        q, k, v = (t[:, :, start : start + n] for t in (query, key, value))
        if p:
            k = torch.cat([key[:, :, prefix_at : prefix_at + p], k], 2)
            v = torch.cat([value[:, :, prefix_at : prefix_at + p], v], 2)
            mask = torch.ones(n, p + n, dtype=torch.bool, device=query.device).tril(p)
            outs.append(sdpa(q, k, v, attn_mask=mask, dropout_p=dropout, scale=scaling))
        else:
            outs.append(sdpa(q, k, v, is_causal=n > 1, dropout_p=dropout, scale=scaling))
    return torch.cat(outs, 2).transpose(1, 2).contiguous(), None


def checkpoint_contexts():
    """``context_fn`` for non-reentrant activation checkpointing (``torch.utils.checkpoint``): a
    block recomputed in backward (on autograd's thread, where no packed forward is running) runs
    with the packed segments of the forward it recomputes, so it attends exactly as that forward
    did."""
    segments = _SEGMENTS.get()

    @contextlib.contextmanager
    def recompute():
        token = _SEGMENTS.set(segments)
        try:
            yield
        finally:
            _SEGMENTS.reset(token)

    return contextlib.nullcontext(), recompute()


def _packed_mask(*args, **kwargs):
    """No mask inside a packed forward (the attention above is causal per row); SDPA's mask
    otherwise."""
    from transformers.masking_utils import sdpa_mask

    return None if _SEGMENTS.get() is not None else sdpa_mask(*args, **kwargs)


def _register() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(IMPLEMENTATION, _packed_attention)
    AttentionMaskInterface.register(IMPLEMENTATION, _packed_mask)


def _configs(model: torch.nn.Module) -> list:
    """The Hugging Face configs of the models inside ``model`` (a PEFT wrapper, a value model's
    backbone)."""
    from transformers import PreTrainedModel

    seen, out = set(), []
    for m in model.modules():
        if isinstance(m, PreTrainedModel) and id(m.config) not in seen:
            seen.add(id(m.config))
            out.append(m.config)
    return out


def attention_of(model: torch.nn.Module) -> str | None:
    """The attention implementation of the first Hugging Face model inside ``model`` (None when
    there is none)."""
    configs = _configs(model)
    return configs[0]._attn_implementation if configs else None


def use_packed_attention(model: torch.nn.Module) -> None:
    """Switch every SDPA model inside ``model`` to :data:`IMPLEMENTATION` (idempotent; the same
    outputs outside a packed forward). Raises ``ValueError`` naming the implementation for anything
    else: the per-row loop needs SDPA."""
    _register()
    for config in _configs(model):
        name = config._attn_implementation
        if name not in SUPPORTED:
            raise ValueError(
                f"--model.update.pack needs the 'sdpa' attention implementation; the model runs {name!r}"
            )
        config._attn_implementation = IMPLEMENTATION


@dataclass(frozen=True)
class Packing:
    """The packed row of a micro-batch and where each of its tokens comes from.

    Rows that start with the same tokens form a group whose common prefix is packed once, followed
    by each row's remaining tokens; a row's tokens attend to its group's prefix and to their own
    earlier tokens.

    Attributes:
        input_ids: the packed tokens.  # [1, N]
        position_ids: each token's position in its own row.  # [1, N]
        rows: the row of each packed token; -1 for a group's prefix (shared by its rows).  # [N]
        cols: the column of each packed token in its row.  # [N]
        segments: ``(prefix start, prefix length, start, length)`` of every stretch that attends as
        one row (a
            group's prefix: ``(0, 0, start, p)``), in packed positions.
        shared: tokens run once instead of once per row (the prefixes' savings).
    """

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    rows: torch.Tensor
    cols: torch.Tensor
    segments: tuple[tuple[int, int, int, int], ...]
    shared: int = 0

    @property
    def owned(self) -> torch.Tensor:
        """Packed positions that belong to one row (not a shared prefix)."""  # [K]
        return (self.rows >= 0).nonzero().squeeze(1)


def common_prefix(a: torch.Tensor, b: torch.Tensor) -> int:
    """Length of the common start of the token rows ``a`` and ``b``."""
    n = min(a.numel(), b.numel())
    differ = (a[:n] != b[:n]).nonzero()
    return int(differ[0]) if len(differ) else n


def prefix_groups(
    input_ids: torch.Tensor, lengths: list[int], limit: int, min_shared: int
) -> list[tuple[list[int], int]]:
    """Consecutive rows that share at least ``min_shared`` leading tokens (at most ``limit``), as
    ``(rows, prefix length)``; a row sharing too little with the group before it starts a new one
    (prefix 0 when alone). Rows in lexicographic order (:func:`by_tokens`) put every shared prefix
    together."""
    groups: list[tuple[list[int], int]] = []
    for r, n in enumerate(lengths):
        if groups:
            members, p = groups[-1]
            first = members[0]
            shared = min(
                p if len(members) > 1 else limit,
                limit,
                common_prefix(input_ids[first, : lengths[first]], input_ids[r, :n]),
            )
            if shared >= min_shared:
                groups[-1] = (members + [r], shared)
                continue
        groups.append(([r], 0))
    return groups


def by_tokens(rows: torch.Tensor, input_ids: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """``rows`` in lexicographic order of their tokens (ties in order): rows that start alike end up
    next to each other, so a micro-batch of consecutive rows packs each common prefix once
    (:func:`pack`)."""
    keys = [tuple(input_ids[r, :n].tolist()) for r, n in zip(rows.tolist(), lengths[rows].tolist())]
    order = sorted(range(len(keys)), key=keys.__getitem__)
    return rows[torch.tensor(order, dtype=torch.long, device=rows.device)]


def pack(
    input_ids: torch.Tensor, attention_mask: torch.Tensor, limit: int = 0, min_shared: int = 16
) -> Packing:
    """The real tokens of the right-padded rows ``input_ids`` [b, L], row after row; rows next to
    each other that share at least ``min_shared`` leading tokens (``limit`` at most; 0: no sharing)
    pack that prefix once (:func:`prefix_groups`). Raises ``ValueError`` for rows that are not
    right-padded or all padding."""
    real = attention_mask.bool()
    if real.shape[1] > 1 and bool((real[:, 1:] & ~real[:, :-1]).any()):
        raise ValueError("packing needs right-padded rows (ones, then zeros in attention_mask)")
    lengths = real.sum(-1).tolist()
    if sum(lengths) == 0:
        raise ValueError("nothing to pack: every row is padding")
    groups = (
        prefix_groups(input_ids, lengths, limit, min_shared)
        if limit >= min_shared
        else [([r], 0) for r in range(len(lengths))]
    )
    pieces, segments, at, shared = [], [], 0, 0  # pieces: (tokens, row or -1, first column)
    for members, p in groups:
        prefix_at = at
        if p:
            pieces.append((input_ids[members[0], :p], -1, 0))
            segments.append((0, 0, at, p))
            at += p
            shared += p * (len(members) - 1)
        for r in members:
            n = lengths[r] - p
            if n > 0:  # (a row that is all prefix adds nothing)
                pieces.append((input_ids[r, p : lengths[r]], r, p))
                segments.append((prefix_at if p else 0, p, at, n))
                at += n
    device = input_ids.device
    ids = torch.cat([t for t, _, _ in pieces])
    rows = torch.cat([torch.full((len(t),), r, device=device) for t, r, _ in pieces])
    cols = torch.cat([torch.arange(c, c + len(t), device=device) for t, _, c in pieces])
    return Packing(ids[None], cols[None].clone(), rows, cols, tuple(segments), shared)


def run_packed(model, packing: Packing, **kwargs):
    """``model(packed row, **kwargs)`` (the model set to :data:`IMPLEMENTATION`: attention inside
    each segment and from a row to its group's prefix). Outputs are on the packed axis ``[1, N,
    ...]``: :func:`unpack` scatters per-token values back to the rows. One forward call, so it suits
    sharded networks too."""
    token = _SEGMENTS.set(packing.segments)
    try:
        return model(input_ids=packing.input_ids, position_ids=packing.position_ids, **kwargs)
    finally:
        _SEGMENTS.reset(token)


def unpack(
    values: torch.Tensor, packing: Packing, shape: tuple[int, int], index: torch.Tensor
) -> torch.Tensor:
    """Packed per-token ``values`` [K] of the row-owned packed positions ``index`` as a zero-filled
    ``shape`` [b, L] tensor at their rows and columns (differentiable)."""
    return values.new_zeros(shape).index_put((packing.rows[index], packing.cols[index]), values)
