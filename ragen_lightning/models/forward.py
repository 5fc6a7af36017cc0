"""Teacher-forced forwards of causal decoders that are exact and cheaper than the plain call.

* :func:`causal_only`: right-padded rows need no padding mask (a real token attends only to earlier,
  real positions), so attention can take its causal fast path.
* :func:`shared_prefix` / :func:`run_on_shared_prefix`: rows that start with the same tokens (every
  conversation of an env opens with the same system prompt; a group's members share their first
  observation too) run that prefix once, batch 1, and its key/value cache is repeated across the
  rows. The outputs after the prefix are the same function of the weights (equal to float rounding),
  and the prefix's gradient is the sum of every row's.

Used by the RL update's passes (:mod:`ragen_lightning.starpo.scoring`) and the supervised loss
(:func:`ragen_lightning.sft.module.causal_lm_sft_loss`).
"""

from __future__ import annotations

import torch


def causal_only(attention_mask: torch.Tensor | None) -> torch.Tensor | None:
    """``None`` when every row of ``attention_mask`` [b, t] is right-padded (ones, then zeros),
    where causal attention alone gives the same outputs on real tokens; otherwise the mask itself
    (e.g. left padding)."""
    if attention_mask is None or attention_mask.shape[1] < 2:
        return None
    if bool((attention_mask[:, 1:] <= attention_mask[:, :-1]).all()):
        return None
    return attention_mask


MIN_SHARED = 16  # shorter common prefixes are not worth the extra (batch 1) forward call


def can_share(model: torch.nn.Module) -> bool:
    """Whether ``model`` may run a prefix and then the rest as two calls before one backward: not
    when it (or a part of it) is FSDP-sharded, whose per-forward unshard/reshard bookkeeping expects
    one forward per backward (FSDP2 frees the prefix call's gathered weights, and its backward then
    reads empty storage). Checked on every call (a walk over the modules, microseconds per layer):
    sharding is applied in place after the networks are built."""
    sharded = ("FSDPModule", "FullyShardedDataParallel")
    return not any(c.__name__ in sharded for m in model.modules() for c in type(m).__mro__)


def shared_prefix(
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    limit: int,
    model: torch.nn.Module | None = None,
) -> int:
    """How many leading tokens every row of ``input_ids`` [b, t] has in common, capped at ``limit``
    (the first target column anything is read from, so no output is needed inside the prefix); 0
    when that is under
    :data:`MIN_SHARED`, for a single row, for rows that are not right-padded (the prefix must be real tokens
    in every row), or when ``model`` is given and may not run it separately (:func:`can_share`)."""
    b = input_ids.shape[0]
    if b < 2 or limit < MIN_SHARED or causal_only(attention_mask) is not None:
        return 0
    if model is not None and not can_share(model):
        return 0
    n = min(int(attention_mask.sum(-1).min()), limit)
    if n < MIN_SHARED:
        return 0
    same = (input_ids[:, :n] == input_ids[:1, :n]).all(0)
    length = n if bool(same.all()) else int((~same).nonzero()[0])
    return length if length >= MIN_SHARED else 0


def run_on_shared_prefix(forward, input_ids: torch.Tensor, prefix: int, **kwargs):
    """``forward(input_ids=input_ids[:, prefix:], past_key_values=<cache>, **kwargs)`` where the
    cache holds the keys and values of ``input_ids[0, :prefix]`` (common to every row), computed
    once and repeated per row. Gradients flow through the cache into the prefix's single forward
    (summed over rows)."""
    from transformers import DynamicCache

    cache = DynamicCache()
    forward(
        input_ids=input_ids[:1, :prefix],
        past_key_values=cache,
        use_cache=True,
        **({"logits_to_keep": 1} if "logits_to_keep" in kwargs else {}),
    )
    cache.batch_repeat_interleave(input_ids.shape[0])
    return forward(input_ids=input_ids[:, prefix:], past_key_values=cache, use_cache=True, **kwargs)
