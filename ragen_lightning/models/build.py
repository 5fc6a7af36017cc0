"""Building the networks of a StarPO run: actor, critic (GAE only) and reference (KL only), full or
LoRA/QLoRA.

One function decides what exists: :func:`build_networks`. Full fine-tuning loads the actor and
critic from their folders and copies the actor for the reference; under LoRA
(:func:`build_lora_models`) the bases are frozen (optionally nf4), the adapters train, and the
reference is the actor with its adapters disabled (no copy).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

from torch import nn

from ragen_lightning.models.loading import (
    enable_activation_checkpointing,
    load_causal_lm,
    load_critic,
    torch_dtype,
)
from ragen_lightning.models.lora import (
    AdaptersDisabled,
    LoraSettings,
    SharedBaseCritic,
    add_adapter,
    add_shared_adapters,
)


@dataclass
class Networks:
    """The trained networks and the frozen reference.

    Attributes:
        actor: the policy (a causal LM, or a ``PeftModel`` under LoRA).
        critic: the value model, None without GAE.
        reference: the KL reference, None without a KL term.
    """

    actor: nn.Module
    critic: nn.Module | None
    reference: nn.Module | None


def build_networks(
    path: str,
    critic_path: str | None,
    dtype: str,
    lora: LoraSettings | None,
    *,
    with_critic: bool,
    with_reference: bool,
    activation_checkpointing: bool = False,
) -> Networks:
    """Actor, critic and reference for one run, in training mode (the reference frozen, in eval
    mode)."""
    if lora is not None:
        actor, critic, reference = build_lora_models(
            path, critic_path, dtype, lora, with_critic=with_critic, with_reference=with_reference
        )
    else:
        actor = load_causal_lm(path, dtype).train()  # from_pretrained returns eval mode
        critic = load_critic(critic_path or path, dtype).train() if with_critic else None
        reference = copy.deepcopy(actor).eval().requires_grad_(False) if with_reference else None
    if activation_checkpointing:
        for net in (actor, critic):
            if net is not None:
                enable_activation_checkpointing(net)
    return Networks(actor, critic, reference)


def build_lora_models(
    path: str,
    critic_path: str | None,
    dtype: str,
    settings: LoraSettings,
    *,
    with_critic: bool,
    with_reference: bool,
):
    """``(actor, critic | None, reference | None)`` under LoRA: frozen (optionally nf4) bases with
    adapters.

    Separate bases: the actor is a causal LM with adapter ``default``; the critic its own backbone
    with an adapter and a value head. ``shared_base``: one causal LM with adapters ``actor`` and
    ``critic``, the critic a
    :class:`SharedBaseCritic` over it. The reference (KL only) is :class:`AdaptersDisabled` in both cases.
    """
    qconfig = settings.quantization_config(torch_dtype(dtype))
    base = keep_4bit_trainable(load_causal_lm(path, dtype, qconfig))
    critic = None
    # without a critic (GRPO family) there is nothing to share
    if settings.shared_base and with_critic:
        actor = add_shared_adapters(base, settings)
        critic = SharedBaseCritic(actor, base.config.hidden_size, torch_dtype(dtype))
    else:
        actor = add_adapter(base, settings, "CAUSAL_LM")
        if with_critic:
            critic = load_critic(
                critic_path or path,
                dtype,
                qconfig,
                adapt=lambda backbone: add_adapter(
                    keep_4bit_trainable(backbone), settings, task_type=None
                ),
            )
    reference = AdaptersDisabled(actor) if with_reference else None
    return actor.train(), critic.train() if critic is not None else None, reference


def keep_4bit_trainable(model: nn.Module) -> nn.Module:
    """Stop bitsandbytes from repacking 4-bit weights for CPU inference. On CPUs with AVX512-BF16
    (bitsandbytes 0.50) the first eval-mode, no-grad forward of a ``Linear4bit`` (our rollouts and
    scoring passes) converts its weights to an inference-only layout for good, after which a
    training forward fails with "a view of a leaf Variable that requires grad is being used in an
    in-place operation"; the flag below is the one it checks."""
    for module in model.modules():
        if hasattr(module, "support_avx512bf16_for_cpu"):
            module.support_avx512bf16_for_cpu = False
    return model
