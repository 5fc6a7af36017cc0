"""Building the rollout engine for a training run, and the engine that samples from a sharded actor.

:func:`build_engine` is the one place that chooses between the HF engine (samples with the actor itself), the
:class:`GatheredWeightsEngine` (FSDP2: a full copy refreshed from the shards before every rollout) and the colocated
vLLM engine (``vllm`` is imported only when chosen; under FSDP2 each rank's engine receives the full
weights gathered from the shards one tensor at a time,
:meth:`~ragen_lightning.rollout.vllm_engine.VLLMEngine.sync_weights`).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence

import torch

from ragen_lightning.errors import ConfigError
from ragen_lightning.parallel.ranks import full_tensor, is_sharded
from ragen_lightning.rollout.engine import GenerationEngine, HFEngine
from ragen_lightning.rollout.settings import ENGINES
from ragen_lightning.rollout.vllm_engine import vllm_installed


def is_quantized(model: torch.nn.Module) -> bool:
    """Whether ``model`` holds bitsandbytes 4-bit layers (a QLoRA base, which vLLM cannot load)."""
    return any(type(m).__name__ == "Linear4bit" for m in model.modules())


def resolve_engine(engine: str, *, quantized: bool = False) -> str:
    """``hf`` or ``vllm`` for a ``--data.engine.name`` value: ``auto`` is ``vllm`` when vLLM is
    installed and the actor is not 4-bit (QLoRA: vLLM does not take nf4 weights), else ``hf``.
    Sharding does not change the choice: under FSDP2 the vLLM engine holds one full copy of the
    weights, as the HF engine's unsharded copy does, and is the faster sampler."""
    if engine not in ENGINES:
        raise ConfigError(f"--data.engine.name must be one of {', '.join(ENGINES)}, got {engine!r}")
    if engine == "auto":
        return "vllm" if vllm_installed() and not quantized else "hf"
    return engine


def build_engine(
    actor: torch.nn.Module,
    tokenizer,
    *,
    model_path: str,
    rollout_actor: torch.nn.Module | None = None,
    engine: str = "hf",
    vllm=None,
    max_batch_size: int = 128,
    max_model_len: int = 4096,
    seed: int = 0,
) -> GenerationEngine:
    """The rollout engine: ``hf`` samples with ``actor``'s own weights (under FSDP2, with the
    unsharded ``rollout_actor`` synced to them); ``vllm`` is a colocated vLLM engine loaded from
    ``model_path`` and synced from the actor before every rollout (``VLLMSettings`` ``vllm``; a
    sharded actor's weights are gathered and streamed into it); ``auto``: :func:`resolve_engine`.

    Raises:
        ValueError: the HF engine for an FSDP2-sharded actor without its unsharded ``rollout_actor``.
    """
    engine = resolve_engine(engine, quantized=actor is not None and is_quantized(actor))
    # the groups were split for k-rank engines
    if engine == "hf" and getattr(vllm, "tensor_parallel_size", 1) > 1:
        raise ConfigError(
            "--data.engine.vllm.tensor_parallel_size > 1 needs the vLLM engine; --data.engine.name auto chose hf "
            "(a 4-bit actor or no vLLM installed): set tensor_parallel_size 1"
        )
    stop, pad = [tokenizer.eos_token_id], tokenizer.pad_token_id
    if engine == "hf":
        if rollout_actor is not None:
            return GatheredWeightsEngine(
                actor, rollout_actor, stop, pad, max_batch_size, tokenizer=tokenizer
            )
        # generating on the shards would hang (forwards are collective)
        if actor is not None and is_sharded(actor):
            raise ValueError(
                "the HF engine needs rollout_actor (an unsharded copy) for an FSDP2-sharded actor"
            )
        return HFEngine(actor, stop, pad, max_batch_size, tokenizer=tokenizer)
    from ragen_lightning.rollout.vllm_engine import VLLMEngine

    return VLLMEngine(
        actor,
        model_path,
        stop,
        pad,
        vllm,
        max_model_len=max_model_len,
        max_batch_size=max_batch_size,
        seed=seed,
    )


def snapshot_engine(engine: GenerationEngine) -> GenerationEngine:
    """An engine that samples from weights of its own, which only ``sync_weights`` changes
    (one-step-off-policy rollouts generate while the update changes the actor): ``engine`` itself
    when it holds such a copy already (vLLM, the unsharded copy of an FSDP2 actor), else the HF
    engine over a frozen copy of its model (as much memory again as the actor's weights)."""
    if type(engine) is not HFEngine:
        return engine
    try:
        copy_ = copy.deepcopy(engine.model).eval().requires_grad_(False)
    # e.g. a quantized layer that does not deep-copy
    except (TypeError, RuntimeError, NotImplementedError) as e:
        raise ConfigError(
            f"--data.training.async_level 1 samples from a copy of the actor with the HF engine, and this actor "
            f"cannot be copied ({type(e).__name__}: {e}): use --data.training.async_level 0"
        ) from None
    return GatheredWeightsEngine(
        engine.model,
        copy_,
        engine.stop_token_ids,
        engine.pad_token_id,
        engine.max_batch_size,
        tokenizer=engine.tokenizer,
    )


class GatheredWeightsEngine(HFEngine):
    """HF generation from an unsharded copy of a sharded actor; ``sync_weights`` copies the full
    weights in.

    Under FSDP2 every forward of the sharded actor is a collective, and ranks generate different
    numbers of tokens, so rollouts must not run on the shards. ``sync_weights`` is itself collective
    (it gathers each parameter): the data module calls it on every rank at the start of every
    rollout.

    Args:
        sharded: the training actor (FSDP2-sharded).
        copy: a same-architecture, unsharded model on this rank's device. stop_token_ids,
        pad_token_id, max_batch_size, tokenizer: as
        :class:`~ragen_lightning.rollout.engine.HFEngine`.
    """

    def __init__(
        self,
        sharded: torch.nn.Module,
        copy: torch.nn.Module,
        stop_token_ids: Sequence[int],
        pad_token_id: int,
        max_batch_size: int = 128,
        tokenizer=None,
    ):
        super().__init__(copy, stop_token_ids, pad_token_id, max_batch_size, tokenizer=tokenizer)
        self.sharded = sharded

    @torch.no_grad()
    def sync_weights(self) -> None:
        """Copy the sharded actor's weights in, each gathered in turn; under LoRA only the trainable
        ones (adapters): the frozen, possibly 4-bit, base the copy holds is what the shards hold."""
        self.clear_cache()  # cached keys/values belong to the old weights
        params = list(self.sharded.named_parameters())
        if any(not p.requires_grad for _, p in params):  # a frozen base: the copy already holds it
            target, items = (
                dict(self.model.named_parameters()),
                [(n, p) for n, p in params if p.requires_grad],
            )
        else:
            target, items = self.model.state_dict(), self.sharded.state_dict().items()
        for name, value in items:
            target[name].data.copy_(full_tensor(value.detach()))
