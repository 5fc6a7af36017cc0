"""The supervised warm start's training loop: plain PyTorch (no Trainer start-up cost), with the
loss :class:`~ragen_lightning.sft.module.SFTModule` trains with
(:func:`~ragen_lightning.sft.module.causal_lm_sft_loss`): seeded shuffled batches, AdamW under one
learning-rate schedule, and each batch's backward optionally split over CPU threads."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import torch

from ragen_lightning.parallel.threads import backward_in_order
from ragen_lightning.sft.module import (
    Demonstration,
    LRSchedule,
    causal_lm_sft_loss,
    collate,
    lr_factor,
)
from ragen_lightning.sft.progress import Progress


def shuffled_batches(count: int, batch_size: int, generator: torch.Generator) -> list[list[int]]:
    """One epoch of batches of a seeded random permutation of ``range(count)``.

    Not grouped by length: a demonstration's length follows its target (a FrozenLake reading clause
    ``goal is above of me;`` is shorter than ``goal is below and right of me;``, a bandit answer's
    length is its arm's name), so length-grouped batches each hold one target, and the model learned
    that batch's answer instead of the map (a reading clause stayed at the prior, 0.12 exact, after
    500 grouped steps; docs/learning.md, "Reading first").
    """
    order = torch.randperm(count, generator=generator).tolist()
    return [order[k : k + batch_size] for k in range(0, count, batch_size)]


def sft_backward(
    model: torch.nn.Module, examples: Sequence[Demonstration], pad_token_id: int, threads: int = 1
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Backward of the batch's token-mean SFT loss; returns ``(loss, metrics)`` detached.

    With ``threads`` > 1 the examples (longest first, dealt in turn so the parts are about equally
    long) form that many parts, each collated, run and backpropagated on its own thread with its
    loss weighted by its share of the trained tokens, the parts' gradients added in order
    (:func:`~ragen_lightning.parallel.threads.backward_in_order`): the summed gradient is the whole
    batch's to float rounding, and the same bit for bit on every run."""
    if threads <= 1 or len(examples) < 2:
        loss, metrics = causal_lm_sft_loss(model, collate(examples, pad_token_id))
        loss.backward()
        return loss.detach(), metrics
    ordered = sorted(examples, key=lambda e: -len(e.input_ids))
    parts = [ordered[k::threads] for k in range(min(threads, len(ordered)))]
    counts = [sum(sum(e.loss_mask[1:]) for e in part) for part in parts]
    total = max(sum(counts), 1)

    def run(k: int) -> tuple[torch.Tensor, tuple[torch.Tensor, dict[str, torch.Tensor]]]:
        loss, metrics = causal_lm_sft_loss(model, collate(parts[k], pad_token_id))
        share = counts[k] / total
        return loss * share, (
            loss.detach() * share,
            {name: v * share for name, v in metrics.items() if name != "sft/num_tokens"},
        )

    done = backward_in_order(run, range(len(parts)), threads, model.parameters())
    metrics = {name: sum(m[name] for _, m in done) for name in done[0][1]}
    metrics["sft/num_tokens"] = torch.tensor(float(sum(counts)))
    return sum(loss for loss, _ in done), metrics


def train_sft(
    model: torch.nn.Module,
    demos: Sequence[Demonstration],
    pad_token_id: int,
    *,
    steps: int,
    lr: float,
    batch_size: int,
    weight_decay: float = 0.0,
    warmup_steps: int = 10,
    lr_schedule: LRSchedule = "cosine",
    max_grad_norm: float = 1.0,
    seed: int = 0,
    log_every: int = 0,
    reading_demos: Sequence[Demonstration] = (),
    reading_steps: int = 0,
    threads: int = 1,
    progress: Progress | None = None,
    on_step: Callable[[int, float], bool] | None = None,
    optimizer: torch.optim.Optimizer | None = None,
) -> list[float]:
    """``steps`` AdamW steps of the SFT loss (:func:`shuffled_batches`, seeded order): the first
    ``reading_steps`` on ``reading_demos``, the rest on ``demos``, under one learning-rate schedule;
    returns the loss of every step. ``threads`` > 1 splits each batch into that many parts computed
    at once on CPU threads (:func:`sft_backward`). ``progress`` is told every step and its loss (the
    caller closes it). ``on_step(step, loss)`` runs after every optimizer step (``step`` counts from
    1; the model is in train mode, and an ``on_step`` that evaluates must leave it so); it returns
    True to stop there, before ``steps``. ``optimizer``: the optimizer over the model's trainable
    parameters to step (the caller keeps it, to save or continue its state; its learning rate is
    then the schedule's peak); None: a fresh AdamW at ``lr`` and ``weight_decay``."""
    if not demos or (reading_steps and not reading_demos):
        raise ValueError("no demonstrations to train on")
    generator = torch.Generator().manual_seed(seed)
    params = [p for p in model.parameters() if p.requires_grad]
    if optimizer is None:
        optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: lr_factor(step, warmup_steps, steps, lr_schedule)
    )
    queue: list[list[int]] = []
    losses: list[float] = []
    model.train()
    start = time.perf_counter()
    for step in range(steps):
        source = reading_demos if step < reading_steps else demos
        if not queue or step == reading_steps:
            # pop() takes them in order
            queue = shuffled_batches(len(source), batch_size, generator)[::-1]
        loss, metrics = sft_backward(model, [source[i] for i in queue.pop()], pad_token_id, threads)
        if max_grad_norm > 0:
            torch.nn.utils.clip_grad_norm_(params, max_grad_norm)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(float(loss.detach()))
        if progress is not None:
            progress.update(step + 1, loss=losses[-1])
        if log_every and (step + 1) % log_every == 0:
            print(
                f"step {step + 1}/{steps} loss {losses[-1]:.4f} acc {float(metrics['sft/token_accuracy']):.3f} "
                f"({time.perf_counter() - start:.1f}s)",
                flush=True,
            )
        if on_step is not None and on_step(step + 1, losses[-1]):
            break
    model.eval()
    return losses
