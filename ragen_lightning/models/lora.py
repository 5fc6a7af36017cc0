"""LoRA / QLoRA for the actor and the critic, the reference as "actor with adapters disabled",
adapter export.

LoRA (Hu et al. 2021) trains a low-rank update ``W + (alpha / r) * B A`` of chosen linear layers and
freezes the base; QLoRA (Dettmers et al. 2023) stores the frozen base in 4-bit NormalFloat
(bitsandbytes ``nf4``) and trains the same adapters on top. Here both come from ``peft``; what this
module adds:

- one settings object (:class:`LoraSettings`, ``--model.lora``) that configures actor and critic
  alike;
- the KL reference is a *view* of the actor with its adapters switched off
  (:class:`AdaptersDisabled`), never a second copy: with LoRA the base weights are frozen, so
  "adapters off" is exactly the initial policy;
- optionally (``shared_base``) ONE frozen base carries two named adapters, ``actor`` and ``critic``,
  plus the critic's value head (:class:`SharedBaseCritic`): PPO with a critic at about one model's
  weight memory;
- export of the adapter in peft's own format, and optionally merged full HF weights.

Departure from RAGEN v1 (which applies LoRA to the actor and critic through verl): the same recipe
(rank 64, alpha 64, ``all-linear``, learning rates x10 of full fine-tuning) but the base is never
duplicated for the reference.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch
from torch import nn

from ragen_lightning.errors import ConfigError, Domain

ACTOR, CRITIC = "actor", "critic"
# peft's name; saved at the top of the export folder (other names go to subfolders)
DEFAULT_ADAPTER = "default"


@dataclass
class LoraSettings:
    """LoRA / QLoRA of the actor and critic (``--model.lora``; ``null`` = full fine-tuning).

    Learning rates: adapters need larger steps than full fine-tuning; RAGEN v1's recipe is rank 64,
    alpha 64, ``all-linear`` with ``--model.optim.actor_lr`` / ``--model.optim.critic_lr`` x10
    (configs/lora.yaml: 1e-5 / 1e-4).

    Args:
        rank: LoRA rank ``r`` of every adapted layer.
        alpha: LoRA scaling numerator: the update is ``(alpha / rank) * B A``. dropout: dropout on
        the adapters' input. target_modules: ``all-linear`` (every linear layer of the transformer
        blocks, not the LM head) or a list of
            module names such as ``[q_proj, k_proj, v_proj, o_proj]``.
        quantization: ``none`` (base in ``--model.dtype``) or ``nf4`` (QLoRA: bitsandbytes 4-bit
        NormalFloat base,
            computed in ``--model.dtype``; needs ``pip install bitsandbytes``).
        double_quant: with ``nf4``, also quantize the quantization constants (~0.4 bits/param less).
        shared_base: actor and critic share ONE frozen base as two adapters (``actor``, ``critic``)
        plus the critic's
            fully trained value head; the critic then uses the actor's model (``--model.critic.model`` must be unset).
        export_merged: when exporting (``--model.export_dir``) also write merged full HF weights to
        ``<dir>/merged``.
    """

    rank: int = 64
    alpha: float = 64.0
    dropout: float = 0.0
    target_modules: str | list[str] = "all-linear"
    quantization: Literal["none", "nf4"] = "none"
    double_quant: bool = True
    shared_base: bool = False
    export_merged: bool = False

    def check(self) -> None:
        """Raise :class:`ConfigError` naming the flag of the first bad value."""
        Domain(low=1, integer=True).check("--model.lora.rank", self.rank)
        Domain(low=0, low_open=True).check("--model.lora.alpha", self.alpha)
        Domain(0, 1, high_open=True).check("--model.lora.dropout", self.dropout)
        if isinstance(self.target_modules, str) and self.target_modules != "all-linear":
            raise ConfigError(
                "--model.lora.target_modules must be 'all-linear' or a list of module names, "
                f"got {self.target_modules!r}"
            )
        if isinstance(self.target_modules, list) and not self.target_modules:
            raise ConfigError("--model.lora.target_modules must not be empty")
        if self.quantization not in ("none", "nf4"):
            raise ConfigError(
                f"--model.lora.quantization must be 'none' or 'nf4', got {self.quantization!r}"
            )

    def peft_config(self, task_type: str | None):
        from peft import LoraConfig

        targets = (
            self.target_modules
            if isinstance(self.target_modules, str)
            else list(self.target_modules)
        )
        return LoraConfig(
            r=self.rank,
            lora_alpha=self.alpha,
            lora_dropout=self.dropout,
            target_modules=targets,
            bias="none",
            task_type=task_type,
        )

    def quantization_config(self, dtype: torch.dtype):
        """transformers' ``BitsAndBytesConfig`` for ``nf4`` (``None`` for ``none``)."""
        if self.quantization == "none":
            return None
        try:
            import bitsandbytes  # noqa: F401
        except ImportError:
            raise ConfigError(
                "--model.lora.quantization nf4 needs bitsandbytes: pip install bitsandbytes "
                "(or the project's dev extra)"
            ) from None
        from transformers import BitsAndBytesConfig

        return BitsAndBytesConfig(
            load_in_4bit=True,
            bnb_4bit_quant_type="nf4",
            bnb_4bit_compute_dtype=dtype,
            bnb_4bit_use_double_quant=self.double_quant,
        )


def as_settings(value: LoraSettings | dict | None) -> LoraSettings | None:
    """Hyper-parameters may hold the settings as a dict (checkpoints, Python callers): normalise and
    check."""
    if value is None:
        return None
    settings = value if isinstance(value, LoraSettings) else LoraSettings(**dict(value))
    settings.check()
    return settings


def add_adapter(
    model: nn.Module, settings: LoraSettings, task_type: str | None, adapter: str = DEFAULT_ADAPTER
):
    """Wrap ``model`` in a ``PeftModel`` with one adapter (base frozen, adapter trainable)."""
    from peft import get_peft_model

    return get_peft_model(model, settings.peft_config(task_type), adapter_name=adapter)


def trainable_parameters(model: nn.Module) -> list[nn.Parameter]:
    """Parameters an optimizer should hold: ``requires_grad`` ones (adapters and value head under
    LoRA)."""
    return [p for p in model.parameters() if p.requires_grad]


class AdaptersDisabled(nn.Module):
    """The reference policy as a view of a LoRA actor: the same module called with its adapters
    switched off.

    With a frozen base this is exactly the initial policy, at no memory cost. The actor is held in a
    list so that it is not registered twice (no duplicate state_dict entries, ``.to``/``.eval`` here
    leave it alone).
    """

    def __init__(self, actor: nn.Module):
        super().__init__()
        self._actor = [actor]

    def forward(self, *args, **kwargs):
        actor = self._actor[0]
        with actor.disable_adapter():
            return actor(*args, **kwargs)


class SharedBaseCritic(nn.Module):
    """The critic of a shared base: the actor's ``PeftModel`` run with its ``critic`` adapter, plus
    a value head.

    Only the value head is registered here; the adapter weights live in the actor (saved once in
    checkpoints). Every forward selects its adapter first and leaves it active: the critic's here,
    the actor's in a forward pre-hook on the causal LM (which ``generate`` goes through too), so a
    backward that recomputes checkpointed blocks recomputes them with the adapter of its own
    forward. The gradient of a backward reaches only the adapter that was active in its forward, so
    the actor and critic optimizers update disjoint parameter sets.
    """

    def __init__(self, peft_model: nn.Module, hidden_size: int, dtype: torch.dtype):
        super().__init__()
        self._peft = [peft_model]
        self.value_head = nn.Linear(hidden_size, 1, dtype=dtype)
        nn.init.zeros_(self.value_head.weight)
        nn.init.zeros_(self.value_head.bias)

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, **cache_kwargs
    ) -> torch.Tensor:
        peft = self._peft[0]
        # stays active until the actor's next forward (its backward may recompute blocks)
        use_adapter(peft, CRITIC)
        # the backbone inside the causal LM (LoRA layers injected): no LM-head logits are computed
        backbone = peft.get_base_model().base_model
        hidden = backbone(
            input_ids=input_ids, attention_mask=attention_mask, **cache_kwargs
        ).last_hidden_state
        return self.value_head(hidden.to(self.value_head.weight.dtype)).squeeze(-1)  # [B, T]

    def trainable_parameters(self) -> list[nn.Parameter]:
        """The critic adapter's weights plus the value head (disjoint from the actor adapter's)."""
        peft = self._peft[0]
        adapter = [p for n, p in peft.named_parameters() if f".{CRITIC}." in n and "lora_" in n]
        return adapter + list(self.value_head.parameters())


def use_adapter(peft_model: nn.Module, adapter: str) -> None:
    """Make ``adapter`` the active one without freezing the other.

    peft's ``set_adapter`` also sets ``requires_grad=False`` on inactive adapters; switching back to
    the actor right after the critic's forward would then drop the critic adapter's gradients in the
    following backward. An inactive adapter takes no part in a forward, so leaving it trainable
    gives it no gradient anyway.
    """
    if peft_model.active_adapter != adapter:
        peft_model.set_adapter(adapter)
        _unfreeze_adapters(peft_model)


def _unfreeze_adapters(peft_model: nn.Module) -> None:
    for n, p in peft_model.named_parameters():
        if "lora_" in n:
            p.requires_grad_(True)


def actor_adapter_parameters(peft_model: nn.Module, adapter: str) -> list[nn.Parameter]:
    """The LoRA weights of one named adapter."""
    return [p for n, p in peft_model.named_parameters() if f".{adapter}." in n and "lora_" in n]


def add_shared_adapters(model: nn.Module, settings: LoraSettings):
    """One frozen causal LM with two adapters: ``actor`` (active by default) and ``critic``."""
    peft = add_adapter(model, settings, "CAUSAL_LM", adapter=ACTOR)
    peft.add_adapter(CRITIC, settings.peft_config("CAUSAL_LM"))
    # add_adapter leaves the new adapter frozen: both train, each in its own forward
    _unfreeze_adapters(peft)
    peft.get_base_model().register_forward_pre_hook(lambda module, args: use_adapter(peft, ACTOR))
    return peft


def optimizer_parameters(actor: nn.Module, critic: nn.Module | None) -> tuple[list, list]:
    """Disjoint trainable parameter lists of the actor and the critic (all parameters under full
    fine-tuning)."""
    if isinstance(critic, SharedBaseCritic):
        return actor_adapter_parameters(actor, ACTOR), critic.trainable_parameters()
    return trainable_parameters(actor), trainable_parameters(critic) if critic is not None else []


def trainable_state(module: nn.Module, state_dict: dict) -> dict:
    """Only the trainable entries of a module's ``state_dict`` (adapters, value heads): a LoRA
    checkpoint does not carry the frozen base, which is rebuilt from the model folder (4-bit bases
    could not be loaded back anyway)."""
    keep = {n for n, p in module.named_parameters() if p.requires_grad}
    return {k: v for k, v in state_dict.items() if k in keep}


def check_trainable_state(module: nn.Module, state_dict: dict) -> None:
    """A LoRA checkpoint must hold every trainable weight of the module it is loaded into (the load
    itself is not strict, since the frozen base is absent by design)."""
    missing = [n for n, p in module.named_parameters() if p.requires_grad and n not in state_dict]
    if missing:
        raise ConfigError(
            f"--ckpt_path: the checkpoint lacks {len(missing)} trainable LoRA weights of this "
            f"configuration (first: {missing[0]}); were --model.lora settings changed?"
        )


def export_adapter(
    actor: nn.Module,
    tokenizer,
    path: str | Path,
    *,
    base_path: str,
    dtype: torch.dtype,
    merged: bool,
) -> Path:
    """Write the actor's adapter in peft format to ``path`` (``PeftModel.from_pretrained(base,
    path)`` loads it), and with ``merged`` also full HF weights (base in ``dtype`` + adapter,
    merged) to ``path/merged``.

    The merged weights are built from a fresh full-precision load of the base, never from the
    (possibly 4-bit) training copy, so merging a QLoRA adapter does not round the update into nf4.
    Under FSDP2 every rank must call it: the adapter's tensors are gathered from their shards one at
    a time (they are small: only rank 0 keeps them) and rank 0 alone writes.
    """
    from ragen_lightning.parallel.ranks import stream_full_tensors, world

    path = Path(path)
    names = list(actor.peft_config)
    adapter = ACTOR if ACTOR in names else names[0]
    rank = world()[0]
    adapter_tensors = (
        (n, p) for n, p in actor.named_parameters() if "lora_" in n or p.requires_grad
    )
    state = {
        n: v.cpu().clone() if rank == 0 else None for n, v in stream_full_tensors(adapter_tensors)
    }
    if rank != 0:
        return path
    # as "default" at the top, whatever its name in training
    _save_adapter(actor, adapter, state, path)
    tokenizer.save_pretrained(path)
    if merged:
        from peft import PeftModel
        from transformers import AutoModelForCausalLM

        base = AutoModelForCausalLM.from_pretrained(base_path, dtype=dtype)
        full = PeftModel.from_pretrained(base, path).merge_and_unload()
        full.save_pretrained(path / "merged")
        tokenizer.save_pretrained(path / "merged")
    return path


def _save_adapter(actor: nn.Module, adapter: str, full_state: dict, path: Path) -> None:
    """peft's adapter folder (``adapter_config.json``, ``adapter_model.safetensors``) from the full
    values of the actor's adapter tensors (``full_state``: parameter name -> tensor)."""
    import copy

    from peft.utils import get_peft_model_state_dict
    from safetensors.torch import save_file

    config = copy.deepcopy(actor.peft_config[adapter])
    config.inference_mode = True
    config.save_pretrained(path)
    state = get_peft_model_state_dict(actor, state_dict=full_state, adapter_name=adapter)
    save_file(
        {k: v.detach().cpu().contiguous() for k, v in state.items()},
        str(path / "adapter_model.safetensors"),
    )
