"""Actor, critic and tokenizer loading.

``"tiny"`` names the embedded tiny model (built and cached on first use, see
:mod:`ragen_lightning.models.tiny`); any other name is a local folder or hub id loaded with
transformers' auto classes. The critic is the same backbone with a scalar value head (RAGEN: a token
classifier with one label), so PPO's values come from a model of the actor's size and tokenizer.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

from ragen_lightning.errors import ConfigError
from ragen_lightning.models.tiny import spec_from_name, tiny_model_path

TINY = "tiny"
_DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
}


def resolve_model_path(name_or_path: str | Path) -> str:
    """``"tiny"`` or a named variant such as ``"tiny:cells"``
    (:func:`~ragen_lightning.models.tiny.spec_from_name`) -> the cached tiny model folder; anything
    else unchanged."""
    if is_tiny(name_or_path):
        return str(tiny_model_path(spec_from_name(name_or_path)))
    return name_or_path


def is_tiny(name_or_path: str | Path) -> bool:
    """Whether ``name_or_path`` names the embedded model (``"tiny"`` or ``"tiny:<options>"``)."""
    return isinstance(name_or_path, str) and (
        name_or_path == TINY or name_or_path.startswith(TINY + ":")
    )


def torch_dtype(name: str) -> torch.dtype:
    try:
        return _DTYPES[name]
    except KeyError:
        raise ValueError(f"dtype must be one of {sorted(_DTYPES)}, got {name!r}") from None


DTYPES = tuple(_DTYPES)


def check_model_name(flag: str, name: str, *, cached: bool = False) -> None:
    """Raise :class:`ConfigError` naming ``flag`` unless ``name`` can be loaded without a surprise:
    ``"tiny"`` (or a valid variant such as ``"tiny:cells"``), a folder holding a ``config.json``, or
    a hub id ``org/name``, which with ``cached`` and ``HF_HUB_OFFLINE=1`` (the CLI's default) must
    already be in the Hugging Face cache (parsing a config or planning memory needs no download; a
    run does)."""
    import os

    if is_tiny(name):
        try:
            spec_from_name(name)
        except ValueError as e:
            raise ConfigError(f"{flag}: {e}") from None
        return
    path = Path(name).expanduser()
    if path.exists():
        if not (path / "config.json").is_file():
            raise ConfigError(
                f"{flag} {name!r}: no config.json there (not a Hugging Face model folder)"
            )
        return
    if name.count("/") != 1 or name.startswith((".", "/", "~")):
        raise ConfigError(f"{flag} {name!r}: no such folder, and not 'tiny' or a hub id 'org/name'")
    if cached and os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes", "on"):
        from huggingface_hub import try_to_load_from_cache

        if not isinstance(try_to_load_from_cache(name, "config.json"), str):
            raise ConfigError(
                f"{flag} {name!r} is not in the Hugging Face cache and HF_HUB_OFFLINE=1: download it "
                f"first (hf download {name}) or run with HF_HUB_OFFLINE=0"
            )


def check_dtype(flag: str, name: str) -> None:
    if name not in _DTYPES:
        raise ConfigError(f"{flag} must be one of {', '.join(_DTYPES)}, got {name!r}")


def _check_exists(path: str) -> None:
    """A path-looking name that does not exist is a config error, not a hub lookup."""
    if Path(path).expanduser().exists():
        return
    is_hub_id = path.count("/") == 1 and not path.startswith((".", "/", "~"))
    if not is_hub_id:
        raise FileNotFoundError(
            f"model {path!r} is neither 'tiny', an existing folder nor a hub id 'org/name'"
        )


def load_tokenizer(name_or_path: str):
    from transformers import AutoTokenizer

    path = resolve_model_path(name_or_path)
    _check_exists(path)
    tok = AutoTokenizer.from_pretrained(path)
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return tok


def _quantized(quantization_config) -> dict:
    # bitsandbytes quantizes while loading onto the device named here; the trainer later moves the
    # module as usual
    if quantization_config is None:
        return {}
    device = torch.cuda.current_device() if torch.cuda.is_available() else "cpu"
    return {"quantization_config": quantization_config, "device_map": {"": device}}


def load_causal_lm(
    name_or_path: str, dtype: str = "float32", quantization_config=None
) -> nn.Module:
    """The actor: a causal LM in ``dtype`` (its linear layers in 4 bits with a bitsandbytes
    ``quantization_config``)."""
    from transformers import AutoModelForCausalLM

    path = resolve_model_path(name_or_path)
    _check_exists(path)
    return AutoModelForCausalLM.from_pretrained(
        path, dtype=torch_dtype(dtype), **_quantized(quantization_config)
    )


class ValueModel(nn.Module):
    """A causal LM backbone with a scalar value head: ``values[b, t]`` estimates the return after
    token ``t``.

    The head is zero-initialised so the first values are exactly 0 (advantages start as plain
    returns).
    """

    def __init__(self, backbone: nn.Module, hidden_size: int):
        super().__init__()
        self.backbone = backbone
        self.value_head = nn.Linear(hidden_size, 1)
        nn.init.zeros_(self.value_head.weight)
        nn.init.zeros_(self.value_head.bias)

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, **cache_kwargs
    ) -> torch.Tensor:
        """Values ``[B, T]``; ``cache_kwargs`` (``past_key_values``, ``use_cache``) go to the
        backbone."""
        hidden = self.backbone(
            input_ids=input_ids, attention_mask=attention_mask, **cache_kwargs
        ).last_hidden_state  # [B, T, H]
        return self.value_head(hidden.to(self.value_head.weight.dtype)).squeeze(-1)  # [B, T]


def load_critic(
    name_or_path: str,
    dtype: str = "float32",
    quantization_config=None,
    adapt: Callable[[nn.Module], nn.Module] | None = None,
) -> ValueModel:
    """The critic: the base model without its LM head, plus a value head.

    ``adapt`` wraps the backbone before the head is attached (LoRA: a frozen, possibly 4-bit
    backbone under an adapter, :func:`ragen_lightning.models.build.build_lora_models`); the value
    head always trains in full.
    """
    from transformers import AutoModel

    path = resolve_model_path(name_or_path)
    _check_exists(path)
    backbone = AutoModel.from_pretrained(
        path, dtype=torch_dtype(dtype), **_quantized(quantization_config)
    )
    if adapt is not None:
        backbone = adapt(backbone)
    head = ValueModel(backbone, backbone.config.hidden_size)
    head.value_head.to(torch_dtype(dtype))
    return head


def enable_activation_checkpointing(net: nn.Module) -> None:
    """Recompute each transformer block in backward instead of keeping its activations (the first HF
    model found inside ``net``: the causal LM of a ``PeftModel``, the backbone of a
    :class:`ValueModel`). A block recomputed in backward sees the packed segments of its forward
    (:func:`~ragen_lightning.models.packing.checkpoint_contexts`)."""
    from transformers import PreTrainedModel

    from ragen_lightning.models.packing import checkpoint_contexts

    for m in net.modules():
        if isinstance(m, PreTrainedModel) and m.supports_gradient_checkpointing:
            m.gradient_checkpointing_enable(
                gradient_checkpointing_kwargs={  # 5.19-safe names
                    "use_reentrant": False,
                    "context_fn": checkpoint_contexts,
                }
            )
            return
