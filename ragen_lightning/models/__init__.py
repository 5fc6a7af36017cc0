"""Models: loading from a name or folder (:mod:`.loading`), the embedded tiny model (:mod:`.tiny`),
Qwen2.5's tokenizer built offline (:mod:`.qwen`), LoRA/QLoRA (:mod:`.lora`), building
actor/critic/reference (:mod:`.build`) and the GPU memory plan (:mod:`.memory`)."""

from ragen_lightning.models.loading import (
    TINY,
    ValueModel,
    enable_activation_checkpointing,
    load_causal_lm,
    load_critic,
    load_tokenizer,
    resolve_model_path,
    torch_dtype,
)

__all__ = [
    "TINY",
    "ValueModel",
    "enable_activation_checkpointing",
    "load_causal_lm",
    "load_critic",
    "load_tokenizer",
    "resolve_model_path",
    "torch_dtype",
]
