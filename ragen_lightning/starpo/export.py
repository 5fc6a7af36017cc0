"""Saving the trained actor as a Hugging Face folder (full weights, or a LoRA adapter in peft
format)."""

from __future__ import annotations

import time
from pathlib import Path

import torch

from ragen_lightning.models import load_causal_lm, torch_dtype
from ragen_lightning.models import lora as lora_mod
from ragen_lightning.parallel import world
from ragen_lightning.parallel.ranks import is_sharded, stream_full_tensors
from ragen_lightning.rollout.engines import GatheredWeightsEngine
from ragen_lightning.sft.progress import note


def export_actor(
    actor: torch.nn.Module,
    tokenizer,
    path: str | Path,
    *,
    lora: lora_mod.LoraSettings | None,
    dtype: str,
    base_path: str,
    rollout_actor: torch.nn.Module | None = None,
) -> Path:
    """Save ``actor`` and ``tokenizer`` at ``path`` (loadable without this package). Under LoRA: the
    adapter in peft format (``PeftModel.from_pretrained(base, path)``) and, with
    ``lora.export_merged``, full weights in ``path/merged``. Under FSDP2 every rank must call it:
    the full weights are gathered from the shards into ``rollout_actor`` (the HF engine's unsharded
    copy; with the vLLM engine, which keeps none, one tensor at a time into a copy that rank 0 alone
    loads from ``base_path`` on the CPU) and rank 0 writes. Rank 0 prints a line before and after (a
    large model takes minutes)."""
    note(f"export: saving the actor to {path}")
    started = time.monotonic()
    out = _export(
        actor,
        tokenizer,
        Path(path),
        lora=lora,
        dtype=dtype,
        base_path=base_path,
        rollout_actor=rollout_actor,
    )
    note(f"export: saved {out} ({time.monotonic() - started:.0f} s)")
    return out


def _export(
    actor: torch.nn.Module,
    tokenizer,
    path: Path,
    *,
    lora: lora_mod.LoraSettings | None,
    dtype: str,
    base_path: str,
    rollout_actor: torch.nn.Module | None,
) -> Path:
    if lora is not None:
        return lora_mod.export_adapter(
            actor,
            tokenizer,
            path,
            dtype=torch_dtype(dtype),
            base_path=base_path,
            merged=lora.export_merged,
        )
    if rollout_actor is None and is_sharded(actor):
        return _export_streamed(actor, tokenizer, path, dtype=dtype, base_path=base_path)
    if rollout_actor is not None:
        engine = GatheredWeightsEngine(actor, rollout_actor, [0], 0)
        engine.sync_weights()  # collective
        actor = engine.model
        if world()[0] != 0:
            return path
    actor.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def _export_streamed(
    actor: torch.nn.Module, tokenizer, path: Path, *, dtype: str, base_path: str
) -> Path:
    """Gather the sharded ``actor`` tensor by tensor on every rank (collective); rank 0 copies each
    into a CPU model loaded from ``base_path`` and writes it. No other rank, and no accelerator,
    holds a second full copy."""
    target = load_causal_lm(base_path, dtype) if world()[0] == 0 else None
    state = target.state_dict() if target is not None else {}
    for name, value in stream_full_tensors(actor.state_dict().items()):
        if target is not None:
            state[name].copy_(value)
    if target is None:
        return path
    target.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path
