"""The CLI's memory preflight (``--memory_plan``, ``--gpu_memory_gb``): the memory plan
(:func:`ragen_lightning.models.memory.plan`) of a parsed configuration, read through the module's
settings groups and the estimator table (which says whether a critic is built)."""

from __future__ import annotations

from dataclasses import asdict, is_dataclass
from typing import Any

from ragen_lightning.data.settings import DataSettings
from ragen_lightning.errors import ConfigError
from ragen_lightning.models.memory import (
    DTYPE_BYTES,
    GIB,
    MemoryPlan,
    architecture,
    plan,
)
from ragen_lightning.rollout.settings import EngineSettings, VLLMSettings
from ragen_lightning.starpo.estimators import get_estimator
from ragen_lightning.starpo.settings import GROUPS, ModuleSettings


def activation_bytes(precision: Any, dtype: str) -> int:
    text = str(precision or "")
    if "16" in text:
        return 2
    return DTYPE_BYTES[dtype]


def _as_dict(value: Any) -> dict[str, Any]:
    if value is None:
        return {}
    if is_dataclass(value) and not isinstance(value, type):
        return asdict(value)
    return value.as_dict() if hasattr(value, "as_dict") else dict(value)


def rollout_engine(model: dict[str, Any], engine: EngineSettings) -> str:
    """``--data.engine.name`` resolved as the fit resolves it
    (:func:`ragen_lightning.rollout.engines.resolve_engine`: ``auto`` is vLLM when installed and the
    actor is not 4-bit, i.e. not a QLoRA ``nf4`` base)."""
    from ragen_lightning.rollout.engines import resolve_engine

    lora = _as_dict(model.get("lora"))
    return resolve_engine(engine.name, quantized=lora.get("quantization", "none") == "nf4")


def device_memory_gib() -> float | None:
    """Total memory of this machine's CUDA device 0 in GiB, or None without one."""
    import torch

    if not torch.cuda.is_available():
        return None
    return torch.cuda.get_device_properties(0).total_memory / GIB


def _vllm_memory(vllm: VLLMSettings, gpu_gib: float | None) -> tuple[dict[str, Any], str]:
    """``--data.engine.vllm``'s memory settings, the GPU memory its fraction is taken of
    (``--gpu_memory_gb``, else this machine's CUDA device) and a line saying which."""
    source = "--gpu_memory_gb"
    if gpu_gib is None:
        gpu_gib, source = device_memory_gib(), "this machine's CUDA device 0 (no --gpu_memory_gb)"
    if gpu_gib is None:
        raise ConfigError(
            "the memory plan of the vLLM engine needs the GPU's memory: pass --gpu_memory_gb (no CUDA "
            "device here to read it from), or --data.engine.name hf"
        )
    note = (
        f"vLLM reservation = --data.engine.vllm.gpu_memory_utilization "
        f"{vllm.gpu_memory_utilization:g} x {gpu_gib:g} GiB from {source}; "
        f"sleep_level {vllm.sleep_level}"
    )
    return {
        "gpu_memory_utilization": float(vllm.gpu_memory_utilization),
        "gpu_gib": gpu_gib,
        "sleep_level": int(vllm.sleep_level),
    }, note


def plan_from_config(
    model: dict[str, Any],
    data: dict[str, Any],
    trainer: dict[str, Any],
    gpu_gib: float | None = None,
) -> MemoryPlan:
    """The plan of a parsed CLI configuration (``config.model``, ``config.data``, ``config.trainer``
    as dicts)."""
    lora = model.get("lora")
    if lora is not None and not isinstance(lora, dict):
        lora = asdict(lora)
    groups = {name: _as_dict(model.get(name)) for name in GROUPS}
    optim = groups["optim"]  # (the factories stay config dicts: the plan reads their class paths)
    s = ModuleSettings.build(
        **{**groups, "optim": {k: v for k, v in optim.items() if not k.endswith("_optimizer")}}
    )
    optimizers = [
        _as_dict(optim.get(k)).get("class_path", "")
        for k in ("actor_optimizer", "critic_optimizer")
    ]
    d = DataSettings.build(**_as_dict(data))
    engine = rollout_engine(model, d.engine)
    vllm, note = (
        ({"gpu_gib": gpu_gib}, None) if engine != "vllm" else _vllm_memory(d.engine.vllm, gpu_gib)
    )
    max_len = d.episode.max_model_len
    rows = s.update.micro_batch_size
    # a micro-batch holds the budget, or one longer row alone
    if s.update.micro_batch_tokens is not None:
        rows = -(-max(s.update.micro_batch_tokens, max_len) // max_len)
    result = plan(
        architecture(model.get("model", "tiny")),
        dtype=model.get("dtype", "float32"),
        activation_bytes=activation_bytes(trainer.get("precision"), model.get("dtype", "float32")),
        micro_batch_size=rows,
        max_model_len=max_len,
        logits_chunk_size=s.update.logits_chunk_size,
        activation_checkpointing=s.update.activation_checkpointing,
        with_critic=get_estimator(s.advantage.estimator).critic,
        with_reference=s.uses_reference,
        lora=lora,
        engine=engine,
        max_batch_size=d.engine.max_batch_size,
        optimizer_8bit=bool(optimizers[0]) and all("8bit" in o for o in optimizers if o),
        mixed_precision="mixed" in str(trainer.get("precision") or ""),
        async_rollouts=bool(d.training.async_level),
        **vllm,
    )
    if note:
        result.notes.append(note)
    return result


def check_memory(config: Any, *, print_plan: bool, refuse: bool = True) -> MemoryPlan:
    """The CLI's memory preflight on a parsed configuration (``--memory_plan``,
    ``--gpu_memory_gb``).

    Prints the plan and exits with status 0 when ``print_plan``; otherwise (``refuse``) raises
    :class:`ConfigError` naming ``--gpu_memory_gb`` when the estimated peak exceeds it.
    """
    gpu = config.get("gpu_memory_gb")
    if gpu is not None and gpu <= 0:
        raise ConfigError(f"--gpu_memory_gb must be > 0, got {gpu}")
    result = plan_from_config(
        _as_dict(config.get("model")),
        _as_dict(config.get("data")),
        # the same peak as --memory_plan's
        _as_dict(config.get("trainer")),
        gpu_gib=gpu,
    )
    if refuse and gpu is not None and not result.fits(gpu):
        if print_plan:
            print(result.table(gpu))
        overlap = (
            "; --data.training.async_level 0: the engine's rollout memory then leaves the "
            "update phase"
            if result.engine_async
            else ""
        )
        raise ConfigError(
            f"--gpu_memory_gb {gpu:g}: the estimated peak {result.peak / GIB:.1f} GiB "
            "does not fit (see --memory_plan true); lower "
            "--model.update.micro_batch_size / --data.episode.max_model_len, set "
            "--model.update.activation_checkpointing true or "
            "--model.update.logits_chunk_size, lower "
            "--data.engine.vllm.gpu_memory_utilization (vLLM) or "
            "--data.engine.max_batch_size (HF engine), or use LoRA/QLoRA "
            f"(configs/lora.yaml, configs/qlora.yaml){overlap}; docs/memory.md"
        )
    if print_plan:
        print(result.table(gpu))
        raise SystemExit(0)
    return result
