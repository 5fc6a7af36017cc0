"""Memory plan: an estimate of one GPU's peak memory for a training configuration, checked before
launch.

The trainer's memory has a static part that lives through the whole iteration and phase parts: an
iteration first rolls out, then scores and updates, and the peak is the larger of the two phases:

    static  = weights (actor + critic + reference copy) + grads + AdamW states
            + autocast copies (16-bit mixed precision over fp32 trainable weights)
    rollout = static + engine (HF: its KV cache; vLLM: its reservation) + runtime overhead
    update  = static + update activations + logits + vLLM while asleep + runtime overhead
    peak    = max(rollout, update)

- weights: parameters x bytes per parameter of ``--model.dtype``; ``nf4`` stores the transformer
  blocks' linear weights in 4 bits plus block constants (64 weights per block: a 4-byte absmax, or
  with double quantization an 8-bit one plus a 4-byte constant per 256 blocks), everything else
  (embeddings, norms, LM head) stays in ``dtype``.
- grads and AdamW's two moments: for *trainable* parameters only, in their dtype (LoRA adapters are
  fp32: peft up-casts 16-bit adapters).
- autocast copies: under 16-bit *mixed* precision autocast keeps a 16-bit copy of every fp32
  trainable leaf weight it casts for a matrix multiply (blocks' linear layers, the LM head, LoRA
  adapters) until its outermost region exits, and the whole training step (rollout, scoring, critic
  and actor updates) runs inside one region: 2 bytes per such weight, live through the iteration.
  Measured on an H100 (docs/gpu.md), where a plan without this term sat below the 1.5B recipe's
  allocator peak.
- activations: per token and layer the tensors a Qwen2 block keeps for backward, counted as ``10 H +
  3 kv_dim + 4 I`` elements (norm inputs/outputs, q/k/v, attention output, residuals; the MLP's
  gate, up, SiLU and product), in the activation dtype (2 bytes under 16-bit precision, else 4), at
  ``micro_batch_size x max_model_len`` tokens. With activation checkpointing only each block's input
  ``H`` is kept, plus one block recomputed.
- logits: ``micro_batch x max_model_len x vocab`` in the activation dtype twice (logits and the
  temperature-scaled copy) plus fp32 log-softmax work (value and gradient, 3 buffers) over
  ``logits_chunk_size`` rows (all rows if unset).
- HF engine: the KV cache ``2 x layers x kv_dim`` per token at ``max_batch_size x max_model_len``
  tokens, held during the rollout only.
- vLLM engine (colocated): its reservation ``gpu_memory_utilization x GPU memory`` (its weights, KV
  cache and workspace) during the rollout; during the update it holds all of it at ``sleep_level``
  0, nothing at 1 (weights offloaded to CPU, KV cache dropped) or 2 (both dropped).
- one-step-off-policy rollouts (``--data.training.async_level 1``): the next rollout is generated
  during the update, so the engine's rollout memory (vLLM's whole reservation, whatever the sleep
  level; the HF engine's KV cache) counts in the update phase too, and the HF engine samples from a
  frozen copy of the actor (its weights again, static).

An estimate, not a measurement: allocator fragmentation and library workspaces are covered by
``overhead_gib``. Architectures come from a local folder's ``config.json`` or from :data:`PUBLISHED`
(no download needed).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ragen_lightning.errors import ConfigError

GIB = 1024**3
DTYPE_BYTES = {"float32": 4, "fp32": 4, "bfloat16": 2, "bf16": 2, "float16": 2, "fp16": 2}
NF4_BLOCK = 64  # bitsandbytes' 4-bit block size (weights per absmax constant)
LINEAR_NAMES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass(frozen=True)
class Architecture:
    """The shape of a Qwen2-family decoder (q/k/v with bias, SwiGLU MLP, RMSNorm)."""

    num_layers: int
    hidden_size: int
    intermediate_size: int
    num_heads: int
    num_kv_heads: int
    vocab_size: int
    tie_word_embeddings: bool
    head_dim: int | None = None

    @property
    def kv_dim(self) -> int:
        return self.num_kv_heads * (self.head_dim or self.hidden_size // self.num_heads)

    @property
    def q_dim(self) -> int:
        return self.num_heads * (self.head_dim or self.hidden_size // self.num_heads)

    def linear_shapes(self) -> dict[str, tuple[int, int]]:
        """``name -> (in_features, out_features)`` of one block's linear layers."""
        H, I, kv, q = self.hidden_size, self.intermediate_size, self.kv_dim, self.q_dim  # noqa: E741
        return {
            "q_proj": (H, q),
            "k_proj": (H, kv),
            "v_proj": (H, kv),
            "o_proj": (q, H),
            "gate_proj": (H, I),
            "up_proj": (H, I),
            "down_proj": (I, H),
        }

    def block_linear_weights(self) -> int:
        """Weights (no biases) of all blocks' linear layers: what 4-bit quantization compresses."""
        return self.num_layers * sum(i * o for i, o in self.linear_shapes().values())

    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size

    def backbone_params(self) -> int:
        """Embeddings + blocks + final norm (no LM head): the critic's backbone."""
        H = self.hidden_size
        biases = self.q_dim + 2 * self.kv_dim  # q/k/v biases
        norms = 2 * H
        return (
            self.embedding_params()
            + self.block_linear_weights()
            + self.num_layers * (biases + norms)
            + H
        )

    def causal_lm_params(self) -> int:
        """Backbone + LM head (shared with the embeddings when tied)."""
        return self.backbone_params() + (0 if self.tie_word_embeddings else self.embedding_params())

    def lora_params(self, rank: int, target_modules: str | Sequence[str] = "all-linear") -> int:
        """``rank x (in + out)`` per adapted linear layer and block (``all-linear`` = every block
        linear)."""
        names = (
            LINEAR_NAMES
            if target_modules == "all-linear"
            else [n for n in LINEAR_NAMES if n in target_modules]
        )
        shapes = self.linear_shapes()
        return self.num_layers * sum(rank * (shapes[n][0] + shapes[n][1]) for n in names)


# Published configs (config.json on the Hugging Face hub, Qwen/Qwen2.5-*-Instruct; the base models
# share them): https://huggingface.co/Qwen/Qwen2.5-{0.5B,1.5B,3B,7B}-Instruct/blob/main/config.json
PUBLISHED: dict[str, Architecture] = {
    "Qwen/Qwen2.5-0.5B-Instruct": Architecture(24, 896, 4864, 14, 2, 151936, True),
    "Qwen/Qwen2.5-1.5B-Instruct": Architecture(28, 1536, 8960, 12, 2, 151936, True),
    "Qwen/Qwen2.5-3B-Instruct": Architecture(36, 2048, 11008, 16, 2, 151936, True),
    "Qwen/Qwen2.5-7B-Instruct": Architecture(28, 3584, 18944, 28, 4, 152064, False),
}


def architecture_from_config(config: dict[str, Any]) -> Architecture:
    """An :class:`Architecture` from a ``config.json`` dictionary."""
    return Architecture(
        num_layers=config["num_hidden_layers"],
        hidden_size=config["hidden_size"],
        intermediate_size=config["intermediate_size"],
        num_heads=config["num_attention_heads"],
        num_kv_heads=config.get("num_key_value_heads") or config["num_attention_heads"],
        vocab_size=config["vocab_size"],
        tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
        head_dim=config.get("head_dim"),
    )


def architecture(model: str) -> Architecture:
    """The architecture of ``--model.model``: a published Qwen2.5 name (``-Instruct`` optional),
    ``tiny`` or a local folder with ``config.json``."""
    for name, arch in PUBLISHED.items():
        if model in (name, name.removesuffix("-Instruct")):
            return arch
    from ragen_lightning.models.loading import (
        resolve_model_path,  # lazy: keeps the plan free of torch
    )

    path = Path(resolve_model_path(model)).expanduser()
    if (path / "config.json").is_file():
        return architecture_from_config(json.loads((path / "config.json").read_text()))
    raise ConfigError(
        f"--model.model {model!r}: no config.json there and not one of the published architectures "
        f"{sorted(PUBLISHED)}; the memory plan cannot size it"
    )


@dataclass
class MemoryPlan:
    """Estimated bytes per component and the peak; :meth:`table` renders it."""

    weights: dict[str, int]
    grads: int
    optimizer: int
    activations: int
    logits: int
    engine_kv_cache: int
    engine_reserved: int
    overhead: int
    notes: list[str] = field(default_factory=list)
    autocast_copies: int = 0
    engine: str = "hf"
    # what vLLM keeps on the GPU during the update (its whole reservation at sleep_level 0)
    engine_asleep: int = 0
    # what the engine holds besides during the update when it generates then (async_level 1)
    engine_async: int = 0

    @property
    def rollout(self) -> int:
        """The rollout phase: the training state plus the engine's KV cache (HF) or reservation
        (vLLM)."""
        return self.static + self.engine_kv_cache + self.engine_reserved + self.overhead

    @property
    def update(self) -> int:
        """The scoring and update phase: the training state, one micro-batch's activations and
        logits, what a vLLM engine keeps while asleep, and (async) what the engine generating beside
        the update holds."""
        return (
            self.static
            + self.activations
            + self.logits
            + self.engine_asleep
            + self.engine_async
            + self.overhead
        )

    @property
    def static(self) -> int:
        return sum(self.weights.values()) + self.grads + self.optimizer + self.autocast_copies

    @property
    def peak(self) -> int:
        return max(self.rollout, self.update)

    def fits(self, gpu_gib: float) -> bool:
        return self.peak <= gpu_gib * GIB

    def table(self, gpu_gib: float | None = None) -> str:
        rows = [(f"weights: {k}", v) for k, v in self.weights.items()]
        rows += [("grads (trainable)", self.grads), ("AdamW states (trainable)", self.optimizer)]
        if self.autocast_copies:
            rows.append(("autocast 16-bit copies (fp32 trainable)", self.autocast_copies))
        rows += [
            ("update activations (micro-batch)", self.activations),
            ("logits + log-softmax", self.logits),
            ("HF engine KV cache (rollout)", self.engine_kv_cache),
            ("vLLM reservation (rollout)", self.engine_reserved),
            ("vLLM while asleep (update)", self.engine_asleep),
        ]
        if self.engine_async:
            rows.append(("engine generating during the update (async)", self.engine_async))
        rows += [
            ("runtime overhead", self.overhead),
            ("phase rollout (static + engine + overhead)", self.rollout),
            ("phase update (static + update + vLLM asleep + overhead)", self.update),
            ("PEAK (max over the phases)", self.peak),
        ]
        lines = [f"{name:<56} {b / GIB:8.2f} GiB" for name, b in rows]
        if gpu_gib is not None:
            verdict = "fits" if self.fits(gpu_gib) else "DOES NOT FIT"
            lines.append(f"{'GPU memory':<56} {gpu_gib:8.2f} GiB  -> {verdict}")
        return "\n".join(
            [f"memory plan (estimate, per GPU; rollout engine: {self.engine})", *lines, *self.notes]
        )


def _nf4_bytes(n: int, double_quant: bool) -> float:
    per_block = 1 + 4 / 256 if double_quant else 4  # absmax bytes per block of 64 weights
    return n * 0.5 + n / NF4_BLOCK * per_block


def plan(
    arch: Architecture,
    *,
    dtype: str = "float32",
    activation_bytes: int = 2,
    micro_batch_size: int = 1,
    max_model_len: int = 2048,
    logits_chunk_size: int | None = None,
    activation_checkpointing: bool = False,
    with_critic: bool = True,
    with_reference: bool = False,
    lora: dict[str, Any] | None = None,
    engine: str = "hf",
    max_batch_size: int = 128,
    gpu_memory_utilization: float = 0.0,
    gpu_gib: float | None = None,
    overhead_gib: float = 1.0,
    optimizer_8bit: bool = False,
    mixed_precision: bool = False,
    sleep_level: int = 1,
    async_rollouts: bool = False,
) -> MemoryPlan:
    """Estimate one GPU's peak memory (see the module docstring for every term).

    Args:
        arch: the model's architecture (actor and critic alike).
        dtype: parameter dtype (``--model.dtype``). activation_bytes: bytes per activation element:
        2 under 16-bit (mixed) precision, 4 in fp32. micro_batch_size: samples per forward/backward.
        max_model_len: tokens per sample at most (prompt + responses over all turns).
        logits_chunk_size: rows per log-softmax chunk (``None``: all rows at once).
        activation_checkpointing: keep only block inputs and recompute blocks in backward.
        with_critic: a critic (GAE) is trained. with_reference: a KL reference is scored (a full
        copy without LoRA; free with LoRA). lora: ``--model.lora`` as a dict (``rank``,
        ``target_modules``, ``quantization``, ``double_quant``,
            ``shared_base``) or ``None`` for full fine-tuning.
        engine: ``hf`` (KV cache in the trainer's memory during rollouts) or ``vllm`` (reserves a
        fraction); a
            resolved engine (``auto`` is resolved by the caller, as the fit resolves it).
        max_batch_size: sequences the HF engine decodes together. gpu_memory_utilization: vLLM's
        reserved fraction of ``gpu_gib``. gpu_gib: the GPU's memory (needed for a vLLM reservation).
        overhead_gib: CUDA context, allocator fragmentation, library workspaces. optimizer_8bit: an
        8-bit AdamW (bitsandbytes ``AdamW8bit``): one byte per moment for full fine-tuning.
        mixed_precision: 16-bit mixed precision (``bf16-mixed`` / ``16-mixed``): autocast caches
        16-bit copies of
            the fp32 trainable weights it casts.
        sleep_level: vLLM's ``--data.engine.vllm.sleep_level``: 0 keeps its reservation through the
        update, 1 and 2 free it. async_rollouts: ``--data.training.async_level 1``: the engine
        generates during the update (and the HF engine from a
            frozen copy of the actor).
    """
    pbytes = DTYPE_BYTES[dtype]
    if lora is None:
        model = _full_fine_tuning(arch, pbytes, with_critic, with_reference, optimizer_8bit)
    else:
        model = _lora_fine_tuning(arch, pbytes, lora, with_critic, with_reference)
    activations, logits = _update_bytes(
        arch,
        activation_bytes,
        micro_batch_size,
        max_model_len,
        logits_chunk_size,
        activation_checkpointing,
    )
    kv_cache, reserved = _engine_bytes(
        arch,
        engine,
        activation_bytes,
        max_batch_size,
        max_model_len,
        gpu_memory_utilization,
        gpu_gib,
    )
    notes = list(model.notes)
    if engine == "vllm":
        vllm_weights = arch.causal_lm_params() * activation_bytes
        if reserved < vllm_weights:
            notes.append(
                f"vLLM's reservation {reserved / GIB:.2f} GiB is below its own weights "
                f"({vllm_weights / GIB:.2f} GiB): raise --data.engine.vllm.gpu_memory_utilization"
            )
    # LoRA adapters are fp32 whatever the dtype; full fine-tuning casts only fp32 weights
    copies = 2 * model.cast if mixed_precision and (lora is not None or pbytes == 4) else 0
    asleep = reserved if sleep_level == 0 else 0
    during_update = (reserved - asleep + kv_cache) if async_rollouts else 0
    if async_rollouts and engine == "hf":  # the frozen copy it samples from
        model.weights["actor copy (async HF engine)"] = model.actor
    return MemoryPlan(
        weights={k: int(v) for k, v in model.weights.items()},
        grads=int(model.grads),
        optimizer=int(model.optimizer),
        activations=int(activations),
        logits=int(logits),
        engine_kv_cache=int(kv_cache),
        engine_reserved=reserved,
        overhead=int(overhead_gib * GIB),
        notes=notes,
        autocast_copies=int(copies),
        engine=engine,
        engine_asleep=asleep,
        engine_async=int(during_update),
    )


@dataclass
class _ModelBytes:
    """The static part of a plan's models: bytes of the weights per component, of the trainable
    parameters' grads and of their AdamW states; ``cast`` counts the fp32 trainable weights autocast
    casts (parameters, not bytes); ``actor``: bytes of the actor model itself (what a deep copy of
    it holds: its base and the adapters on it)."""

    weights: dict[str, int]
    grads: int
    optimizer: int
    cast: int
    actor: int
    notes: list[str] = field(default_factory=list)


def _full_fine_tuning(
    arch: Architecture, pbytes: int, with_critic: bool, with_reference: bool, optimizer_8bit: bool
) -> _ModelBytes:
    """Every parameter of the actor (and critic) trained, in ``pbytes`` bytes each."""
    lm, backbone = arch.causal_lm_params(), arch.backbone_params()
    weights: dict[str, int] = {}
    weights["actor"] = lm * pbytes
    trainable = lm + (backbone + arch.hidden_size + 1 if with_critic else 0)
    if with_critic:
        weights["critic"] = (backbone + arch.hidden_size + 1) * pbytes
    if with_reference:
        weights["reference (copy)"] = lm * pbytes
    grads, opt = trainable * pbytes, 2 * trainable * (1 if optimizer_8bit else pbytes)
    # matmul weights autocast casts: blocks' linear layers and the LM head (tied or not), the
    # critic's blocks
    cast = arch.block_linear_weights() + arch.embedding_params()
    cast += arch.block_linear_weights() + arch.hidden_size if with_critic else 0
    return _ModelBytes(weights, grads, opt, cast, weights["actor"])


def _lora_fine_tuning(
    arch: Architecture, pbytes: int, lora: dict[str, Any], with_critic: bool, with_reference: bool
) -> _ModelBytes:
    """fp32 LoRA adapters (and the critic's value head) trained on frozen bases, 4-bit ones under
    ``nf4``."""
    lm, backbone = arch.causal_lm_params(), arch.backbone_params()
    notes: list[str] = []
    weights: dict[str, int] = {}
    quant = lora.get("quantization", "none") == "nf4"
    linear = arch.block_linear_weights()

    def frozen(n_params: int) -> int:
        if not quant:
            return n_params * pbytes
        return int(
            _nf4_bytes(linear, lora.get("double_quant", True)) + (n_params - linear) * pbytes
        )

    adapter = arch.lora_params(int(lora.get("rank", 64)), lora.get("target_modules", "all-linear"))
    n_adapters = 2 if with_critic else 1
    shared = bool(lora.get("shared_base")) and with_critic
    base = weights["actor base (frozen" + (", nf4)" if quant else ")")] = frozen(lm)
    if with_critic and not shared:
        weights["critic base (frozen" + (", nf4)" if quant else ")")] = frozen(backbone)
    weights["LoRA adapters (fp32)"] = n_adapters * adapter * 4
    if with_critic:
        weights["value head"] = (arch.hidden_size + 1) * pbytes
    trainable_bytes = n_adapters * adapter * 4 + (
        (arch.hidden_size + 1) * pbytes if with_critic else 0
    )
    grads, opt = trainable_bytes, 2 * trainable_bytes
    cast = n_adapters * adapter  # fp32 adapters; the 16-bit (or nf4) bases are frozen, never cached
    if with_reference:
        notes.append("reference = actor with adapters disabled: no extra weights")
    if shared:
        notes.append("shared base: actor and critic are two adapters on one frozen model")
    # a shared base carries the critic's adapter too
    actor = base + (n_adapters if shared else 1) * adapter * 4
    return _ModelBytes(weights, grads, opt, cast, actor, notes)


def _update_bytes(
    arch: Architecture,
    activation_bytes: int,
    micro_batch_size: int,
    seq_len: int,
    logits_chunk_size: int | None,
    activation_checkpointing: bool,
) -> tuple[int, int]:
    """``(activations, logits)``: what one micro-batch of ``seq_len``-token samples keeps for
    backward, blocks and LM head apart."""
    H, I, kv = arch.hidden_size, arch.intermediate_size, arch.kv_dim  # noqa: E741 (the papers' I)
    tokens = micro_batch_size * seq_len
    per_layer = tokens * (10 * H + 3 * kv + 4 * I) * activation_bytes
    if activation_checkpointing:
        activations = arch.num_layers * tokens * H * activation_bytes + per_layer
    else:
        activations = arch.num_layers * per_layer
    rows = tokens if logits_chunk_size is None else min(tokens, logits_chunk_size)
    logits = 2 * tokens * arch.vocab_size * activation_bytes + 3 * rows * arch.vocab_size * 4
    return activations, logits


def _engine_bytes(
    arch: Architecture,
    engine: str,
    activation_bytes: int,
    max_batch_size: int,
    seq_len: int,
    gpu_memory_utilization: float,
    gpu_gib: float | None,
) -> tuple[int, int]:
    """``(kv_cache, reserved)``: the HF engine's KV cache of ``max_batch_size`` ``seq_len``-token
    sequences in the trainer's memory, or vLLM's reservation."""
    if engine not in ("hf", "vllm"):
        raise ConfigError(
            f"the memory plan needs a resolved rollout engine ('hf' or 'vllm'), got {engine!r}"
        )
    # keys and values of every layer
    per_token = 2 * arch.num_layers * arch.kv_dim * activation_bytes
    kv_cache = per_token * max_batch_size * seq_len if engine == "hf" else 0
    reserved = 0
    if engine == "vllm":
        if gpu_gib is None:
            raise ConfigError(
                "the memory plan of a vLLM engine needs the GPU's memory (--gpu_memory_gb)"
            )
        reserved = int(gpu_memory_utilization * gpu_gib * GIB)
    return kv_cache, reserved
