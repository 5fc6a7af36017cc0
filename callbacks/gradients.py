"""GradientAnalysis (RAGEN's gradient_reporter): gradient norms of the policy, entropy and KL terms,
bucketed by group reward std.

RAGEN-2's SNR argument says low-reward-variance groups carry a weak task gradient while the
regularisers (entropy, KL) keep theirs. This callback measures it: every ``every_n`` iterations (and
at iteration 1) it takes the iteration's kept batch, recomputes old log-probs / reference log-probs
/ values and the advantages exactly as the module does (``scoring.score_batch``,
``starpo.estimators.starpo_advantages``), splits the groups into buckets by their reward std and,
per bucket and per component, backpropagates that component alone over micro-batches (the update's:
``micro_batch_size`` rows, or ``micro_batch_tokens`` padded tokens, longest rows first; the norm
does not depend on the split, the memory does) and records the global grad norm of the actor. No
optimizer step is taken and the gradients are cleared afterwards.

Components (the same aggregation as the actor loss, ``algos.losses``): ``task`` = PPO policy loss
(``pg_loss``), ``entropy`` = ``-entropy_coeff * agg(H)`` (when ``entropy_coeff != 0``), ``kl`` =
``kl_coef * agg(KL)`` (when ``use_kl_loss``). Buckets: ``quantile`` sorts groups by reward std
ascending into ``min(num_buckets, #groups)`` buckets of ``#groups // nb`` groups, the remainder
going to the last (``bucket_1`` = lowest std); ``fixed_rv`` uses std intervals [0,1), [1,2), ...,
[4,5), [5,inf); ``all`` is every kept group.

Logged per bucket ``b``: ``grad_norm/{b}/{component}``, ``grad_norm/{b}/per_sample/{component}`` (/
samples), ``grad_norm/{b}/per_token/{component}`` (/ trained tokens),
``grad_norm/{b}/loss/{policy|entropy|kl}``, ``grad_norm/{b}/sample_count``,
``grad_norm/{b}/reward_std_{mean,min,max}``.

Departure from RAGEN: measured after the iteration's update (at the new weights, on the same batch;
RAGEN runs it between the critic and the actor update), since callbacks observe finished iterations.
Single-process only: under a multi-rank strategy it warns once and does nothing (a backward outside
the DDP wrapper would desynchronise ranks).
"""

from __future__ import annotations

import warnings
from typing import Any, Literal

import torch
from lightning.pytorch.callbacks import Callback

from callbacks._common import advance, log_values, on_schedule
from ragen_lightning.algos.losses import (
    agg_normalizer,
    aggregate,
    kl_penalty,
    ppo_policy_loss,
)
from ragen_lightning.errors import ConfigError
from ragen_lightning.metrics.functional import within_group_reward_std
from ragen_lightning.starpo.estimators import starpo_advantages
from ragen_lightning.starpo.scoring import (
    ForwardSettings,
    actor_outputs,
    by_length,
    plan_micro_batches,
    score_batch,
    trimmed,
)

BucketMode = Literal["quantile", "fixed_rv"]


def group_buckets(
    group_ids: list[int], stds: list[float], mode: BucketMode, num_buckets: int
) -> dict[str, list[int]]:
    """Bucket name -> group ids (see the module docstring); empty fixed buckets are left out;
    ``all`` always."""
    order = sorted(range(len(group_ids)), key=lambda i: (stds[i], i))
    out: dict[str, list[int]] = {}
    if mode == "quantile":
        nb = min(num_buckets, len(order))
        size = len(order) // nb if nb else 0
        for b in range(nb):
            chunk = order[b * size :] if b == nb - 1 else order[b * size : (b + 1) * size]
            out[f"bucket_{b + 1}"] = [group_ids[i] for i in chunk]
    else:
        for lo in range(6):
            hi = lo + 1 if lo < 5 else float("inf")
            members = [group_ids[i] for i in order if lo <= stds[i] < hi]
            if members:
                out[f"rv_{lo}_{hi}"] = members
    out["all"] = [group_ids[i] for i in order]
    return out


def _component_loss(
    component: str,
    loss_s: Any,
    lp: torch.Tensor,
    ent: torch.Tensor | None,
    aligned: dict[str, torch.Tensor],
    agg: dict[str, Any],
) -> torch.Tensor:
    """The loss of one component on one micro-batch, aggregated as the actor loss is (``agg``: the
    normalizer and horizon of the whole bucket): ``task`` the PPO policy loss, ``entropy``
    ``-entropy_coeff * agg(H)``, ``kl`` ``kl_coef * agg(KL)``. ``aligned`` holds the micro-batch's
    ``old``, ``adv`` and ``mask`` (and ``ref`` for ``kl``) aligned with ``lp``."""
    mask = aligned["mask"]
    if component == "task":
        loss, _ = ppo_policy_loss(
            lp,
            aligned["old"],
            aligned["adv"],
            mask,
            clip_low=loss_s.clip_low,
            clip_high=loss_s.clip_high,
            dual_clip=loss_s.dual_clip,
            agg_mode=loss_s.agg_mode,
            **agg,
        )
        return loss
    if component == "entropy":
        return -loss_s.entropy_coeff * aggregate(ent, mask, loss_s.agg_mode, **agg)
    if component == "kl":
        return loss_s.kl_coef * aggregate(
            kl_penalty(lp, aligned["ref"], loss_s.kl_kind), mask, loss_s.agg_mode, **agg
        )
    raise ValueError(f"unknown gradient component {component!r}")


def _grad_norm(module: torch.nn.Module) -> float:
    """The global L2 norm of ``module``'s parameter gradients (0.0 when none has one)."""
    grads = [p.grad for p in module.parameters() if p.grad is not None]
    if not grads:
        return 0.0
    return float(
        torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))
    )


class GradientAnalysis(Callback):
    """Per-bucket gradient norms of the actor loss terms, without an optimizer step (module
    docstring).

    Args:
        every_n: analyse at iteration 1 and every ``every_n`` iterations.
        bucket_mode: ``quantile`` (by rank of group reward std) or ``fixed_rv`` (by std value).
        num_buckets: buckets in ``quantile`` mode.
    """

    def __init__(
        self, every_n: int = 50, bucket_mode: BucketMode = "quantile", num_buckets: int = 3
    ):
        if every_n < 1 or num_buckets < 1:
            raise ConfigError("GradientAnalysis every_n and num_buckets must be >= 1")
        if bucket_mode not in ("quantile", "fixed_rv"):
            raise ConfigError(
                f"GradientAnalysis bucket_mode must be quantile|fixed_rv, got {bucket_mode!r}"
            )
        self.every_n, self.bucket_mode, self.num_buckets = every_n, bucket_mode, num_buckets
        self.iterations = 0
        self.analysed: list[int] = []
        self._warned = False

    @torch.no_grad()
    def _prepare(self, pl_module: Any, batch: Any) -> dict[str, Any]:
        s = pl_module.settings
        batch = batch.to(pl_module.device)
        ids, att = batch.input_ids, batch.attention_mask
        mask = batch.loss_mask[:, 1:].bool()
        micro = s.update.scoring_micro_batch_size
        forward = ForwardSettings(s.temperature, s.update.logits_chunk_size)
        old, _ = score_batch(pl_module.actor, ids, att, micro, kind="actor", forward=forward)
        ref = None
        if pl_module.reference is not None:
            ref, _ = score_batch(
                pl_module.reference, ids, att, micro, kind="actor", forward=forward
            )
        values = (
            score_batch(pl_module.critic, ids, att, micro, kind="critic")[0]
            if pl_module.critic is not None
            else None
        )
        advantages, _, _ = starpo_advantages(
            batch, mask, old_logprobs=old, ref_logprobs=ref, values=values, settings=s.advantage
        )
        return {
            "batch": batch,
            "ids": ids,
            "att": att,
            "mask": mask,
            "old": old,
            "ref": ref,
            "adv": advantages,
        }

    def _component_norm(
        self, pl_module: Any, d: dict[str, Any], rows: torch.Tensor, component: str
    ) -> tuple[float, float]:
        """Backward ``component`` over the micro-batches of ``rows``; returns (grad norm, loss
        value)."""
        s = pl_module.settings
        actor = pl_module.actor
        actor.zero_grad(set_to_none=True)
        horizon = d["mask"].shape[1]
        norm = agg_normalizer(d["mask"][rows], s.loss.agg_mode, horizon=horizon)
        total = 0.0
        lengths = d["att"].sum(-1)
        for micro in plan_micro_batches(
            by_length(rows, lengths),
            lengths,
            s.update.micro_batch_size,
            s.update.micro_batch_tokens,
        ):
            L = trimmed(d["att"], micro)
            with torch.enable_grad():
                lp, ent = actor_outputs(
                    actor,
                    d["ids"][micro, :L],
                    d["att"][micro, :L],
                    ForwardSettings(s.temperature, s.update.logits_chunk_size),
                    with_entropy=component == "entropy",
                )
                # the rows' tensors aligned with the log-probs (one position shorter)
                aligned = {k: d[k][micro, : L - 1] for k in ("old", "adv", "mask")}
                if component == "kl":
                    aligned["ref"] = d["ref"][micro, : L - 1]
                loss = _component_loss(
                    component, s.loss, lp, ent, aligned, {"normalizer": norm, "horizon": horizon}
                )
                loss.backward()
            total += float(loss.detach())
        gnorm = _grad_norm(actor)
        actor.zero_grad(set_to_none=True)
        return gnorm, total

    def analyse(self, pl_module: Any, batch: Any) -> dict[str, float]:
        """The logged ``grad_norm/*`` values of one kept batch (no optimizer step; gradients cleared
        after)."""
        d = self._prepare(pl_module, batch)
        group_index = d["batch"].group_index.cpu()
        groups = sorted(set(group_index.tolist()))
        scores = {g: d["batch"].scores.cpu()[group_index == g] for g in groups}
        stds = [float(within_group_reward_std(scores[g][None, :])[0]) for g in groups]
        std_of = dict(zip(groups, stds))
        loss = pl_module.loss
        components = (
            ["task"]
            + (["entropy"] if loss.entropy_coeff != 0 else [])
            + (["kl"] if loss.kl_coef > 0 else [])
        )
        loss_name = {"task": "policy", "entropy": "entropy", "kl": "kl"}
        out: dict[str, float] = {}
        for name, members in group_buckets(
            groups, stds, self.bucket_mode, self.num_buckets
        ).items():
            rows = (
                torch.nonzero(torch.isin(group_index, torch.tensor(members)))
                .flatten()
                .to(d["ids"].device)
            )
            tokens = float(d["mask"][rows].sum())
            out[f"grad_norm/{name}/sample_count"] = float(rows.numel())
            member_stds = torch.tensor([std_of[g] for g in members])
            out[f"grad_norm/{name}/reward_std_mean"] = float(member_stds.mean())
            out[f"grad_norm/{name}/reward_std_min"] = float(member_stds.min())
            out[f"grad_norm/{name}/reward_std_max"] = float(member_stds.max())
            for c in components:
                gnorm, loss = self._component_norm(pl_module, d, rows, c)
                out[f"grad_norm/{name}/{c}"] = gnorm
                out[f"grad_norm/{name}/per_sample/{c}"] = gnorm / max(rows.numel(), 1)
                out[f"grad_norm/{name}/per_token/{c}"] = gnorm / max(tokens, 1.0)
                out[f"grad_norm/{name}/loss/{loss_name[c]}"] = loss
        return out

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        step = advance(self, pl_module)
        if step is None:
            return
        rollout, _, iteration = step
        if len(rollout) == 0 or not on_schedule(iteration, self.every_n):
            return
        if trainer.world_size > 1:
            if not self._warned:
                warnings.warn(
                    "GradientAnalysis runs on a single process only; skipped", stacklevel=2
                )
                self._warned = True
            return
        log_values(trainer, self.analyse(pl_module, rollout))
        self.analysed.append(iteration)

    def state_dict(self) -> dict[str, Any]:
        return {"iterations": self.iterations, "analysed": list(self.analysed)}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.iterations = int(state_dict.get("iterations", 0))
        self.analysed = [int(i) for i in state_dict.get("analysed", [])]
