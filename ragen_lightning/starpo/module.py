"""StarPOModule: actor, critic (GAE only) and reference (KL only); one ``training_step`` is one StarPO iteration.

:meth:`StarPOModule.training_step` reads top to bottom as the numbered steps of DESIGN section 3: rollout batch ->
no-grad scoring -> advantages (:mod:`.advantages`) -> ``ppo_epochs`` x mini-batches of critic then actor steps
(:mod:`.update`, losses in :mod:`.steps`) -> logs; ``last_rollout`` / ``last_logs``: batch and logs, for callbacks.
Manual optimisation, one optimizer per network: ``trainer.global_step`` counts optimizer steps, the run length is
``--data.num_iterations``. Data parallel: every rank holds the global batch, the update splits its rows (``parallel``).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import time
from pathlib import Path
from typing import Any, Literal

import lightning as L
import torch
from lightning.pytorch.cli import OptimizerCallable
from lightning.pytorch.utilities import rank_zero_warn

from ragen_lightning import models
from ragen_lightning.algos import advantages as A
from ragen_lightning.algos.losses import AggMode, KLKind
from ragen_lightning.algos.masked import masked_mean
from ragen_lightning.models import lora as lora_mod
from ragen_lightning.models.build import build_networks
from ragen_lightning.parallel import checkpointing, shard_networks
from ragen_lightning.rollout.engines import build_engine, is_quantized, resolve_engine
from ragen_lightning.sft.warm_start import warm_started_path
from ragen_lightning.starpo.advantages import ADVANTAGE_SETTINGS, ROW_ESTIMATORS, advantages_for, kept_rows
from ragen_lightning.starpo.background import BackgroundSteps
from ragen_lightning.starpo.checks import check_data_settings, check_module_settings
from ragen_lightning.starpo.early_stop import EarlyStops, EarlyStopSettings
from ragen_lightning.starpo.export import export_actor
from ragen_lightning.starpo.optim import LRSchedule, SkipGuard, build_optimizers, start_iteration
from ragen_lightning.starpo.steps import PolicyLossSettings, ppo_update
from ragen_lightning.starpo.update import network_step, score_sharded
from ragen_lightning.types import RolloutBatch, UpdateBatch

AdvEstimator = Literal["gae", "grpo", "drgrpo", "brpo", "arpo", "rft", "state_baseline", "state_grpo"]


class StarPOModule(L.LightningModule):
    """StarPO / StarPO-S: PPO with a critic or GRPO-family estimators over whole multi-turn trajectories.

    Args:
        model: actor model: ``"tiny"`` (the embedded model) or a HF folder / hub id.
        critic_model: critic base model (defaults to ``model``); only built for ``adv_estimator: gae``.
        dtype: parameter dtype (``float32`` on CPU; ``bfloat16`` on GPUs).
        warm_start: supervised warm start from the env's expert before RL (``true``, or a dict of
            ``ragen_lightning.sft.warm_start`` arguments such as ``steps``); cached per setting.
        adv_estimator: ``gae`` (PPO, critic) | ``grpo`` | ``drgrpo`` | ``brpo`` | ``arpo`` | ``rft`` | ``state_[baseline|grpo]``.
        gamma: token-level discount.
        lam: GAE lambda.
        turn_level_gae: bi-level GAE over turn ends (GAE only) with ``high_level_gamma`` between turns.
        high_level_gamma: discount between turns for ``turn_level_gae``.
        ppo_epochs: passes over each rollout batch.
        mini_batch_size: samples per optimizer step.
        micro_batch_size: samples per forward/backward (gradient accumulation inside a mini-batch).
        micro_batch_threads: micro-batches run at once on CPU threads (one process, ``*-true`` precision; ``parallel.threads``).
        critic_in_background: the critic's steps of an iteration run on a worker thread during the next rollout (one
            process; same math; critic metrics logged one iteration late; :mod:`.background`).
        shuffle: shuffle samples before splitting into mini-batches (seeded by the iteration).
        clip_low: PPO ratio floor ``1 - clip_low``.
        clip_high: PPO ratio ceiling ``1 + clip_high`` (clip-higher: 0.28 > 0.2).
        dual_clip: dual-clip constant for negative advantages (``null`` disables it).
        value_clip: critic value clipping range.
        loss_agg_mode: ``token-mean`` | ``seq-mean-token-mean`` | ``seq-mean-token-sum`` | ``seq-mean-token-sum-norm``.
        entropy_coeff: entropy bonus coefficient.
        use_kl_loss: add ``kl_coef * KL(actor || reference)`` to the actor loss.
        kl_coef: KL loss coefficient.
        kl_kind: KL estimator (``k1``/``kl``, ``abs``, ``k2``/``mse``, ``k3``/``low_var_kl``, and ``+`` variants).
        kl_in_reward_coef: if > 0, subtract ``coef * KL(old || reference)`` from the token rewards.
        soft_advantage_reweight: scale GRPO advantages by group reward std / max std.
        filter_loss_scaling: scale advantages by the filter's kept ratio: ``none`` | ``linear`` | ``sqrt``.
        length_weight: divide GRPO advantages by relative response length.
        zero_task_advantage: zero the task advantage (entropy/KL-only ablation).
        advantage_floor: clamp advantages from below after normalisation (null: off; 0: learn from successes only).
        rft_threshold: ``rft`` (rejection-sampling fine-tuning): advantage 1 on turns / episodes scored above it, else 0.
        rft_per_state: ``rft`` with ``--data.branches``: the kept responses of one state share one unit of weight.
        actor_lr: actor learning rate (AdamW) when ``actor_optimizer`` is not given.
        critic_lr: critic learning rate (AdamW) when ``critic_optimizer`` is not given.
        weight_decay: AdamW weight decay.
        actor_optimizer: optimizer factory for the actor (overrides ``actor_lr``).
        critic_optimizer: optimizer factory for the critic (overrides ``critic_lr``).
        grad_clip: max global grad norm per network (0 disables clipping).
        lr_warmup_steps: linear lr warm-up over each network's first N steps (0: off; Adam's first steps can break a format).
        lr_decay_iterations: cosine decay of both rates to 10 % over the first N iterations, then held (0: constant).
        max_step_kl: undo an actor step whose KL on its own rows exceeds this (null: off; ``steps.step_kl``).
        logprob_micro_batch_size: micro-batch size of the no-grad scoring passes (defaults to ``micro_batch_size``).
        logits_chunk_size: rows per chunk when computing log-probs/entropy from logits (bounds memory).
        temperature: the rollouts' sampling temperature (linked from ``--data.temperature``); log-probs: logits / T.
        early_stop: RAGEN's early stops (:class:`~ragen_lightning.starpo.early_stop.EarlyStopSettings`:
            ``rv_collapse_window``, ``rv_collapse_ratio``, ``low_val_success_patience``, ``low_val_success_threshold``).
        export_dir: save the trained actor there as a HF folder when fit ends (under LoRA: the peft adapter).
        activation_checkpointing: recompute each transformer block in backward (less memory, one more forward).
        lora: LoRA / QLoRA (``models.lora.LoraSettings``; null: all weights train); the KL reference is adapters-off.
        tis_cap: truncated importance sampling (null: off): token weights ``min(exp(old - engine log-probs), tis_cap)``; T = 1.
        max_consecutive_skips: stop after N skipped steps of one network in a row (non-finite, or over max_step_kl); 0: never.
    """

    def __init__(
        self,
        model: str = "tiny",
        critic_model: str | None = None,
        dtype: str = "float32",
        warm_start: bool | dict[str, Any] = False,
        adv_estimator: AdvEstimator = "gae",
        gamma: float = 1.0,
        lam: float = 1.0,
        turn_level_gae: bool = False,
        high_level_gamma: float = 0.95,
        ppo_epochs: int = 1,
        mini_batch_size: int = 32,
        micro_batch_size: int = 4,
        micro_batch_threads: int = 1,
        critic_in_background: bool = False,
        shuffle: bool = False,
        clip_low: float = 0.2,
        clip_high: float = 0.28,
        dual_clip: float | None = 3.0,
        value_clip: float = 0.5,
        loss_agg_mode: AggMode = "token-mean",
        entropy_coeff: float = 0.001,
        use_kl_loss: bool = False,
        kl_coef: float = 0.0,
        kl_kind: KLKind = "k1",
        kl_in_reward_coef: float = 0.0,
        soft_advantage_reweight: bool = False,
        filter_loss_scaling: A.FilterLossScaling = "none",
        length_weight: bool = False,
        zero_task_advantage: bool = False,
        advantage_floor: float | None = None,
        rft_threshold: float = 0.0,
        rft_per_state: bool = False,
        actor_lr: float = 1e-6,
        critic_lr: float = 1e-5,
        weight_decay: float = 0.01,
        actor_optimizer: OptimizerCallable | None = None,
        critic_optimizer: OptimizerCallable | None = None,
        grad_clip: float = 1.0,
        lr_warmup_steps: int = 0,
        lr_decay_iterations: int = 0,
        max_step_kl: float | None = None,
        logprob_micro_batch_size: int | None = None,
        logits_chunk_size: int | None = None,
        temperature: float = 1.0,
        early_stop: EarlyStopSettings | None = None,
        export_dir: str | None = None,
        tis_cap: float | None = None,
        activation_checkpointing: bool = False,
        lora: lora_mod.LoraSettings | None = None,
        max_consecutive_skips: int = 5,
    ):
        super().__init__()
        self._lora = lora_mod.as_settings(lora)
        stops = EarlyStopSettings(**early_stop) if isinstance(early_stop, dict) else early_stop or EarlyStopSettings()
        self.save_hyperparameters(ignore=["actor_optimizer", "critic_optimizer"])
        check_module_settings(self.hparams, self._lora)
        self._policy_loss = PolicyLossSettings.from_hparams(self.hparams)
        if self._lora is not None:  # a plain dict in checkpoints and hparams.yaml
            self.hparams["lora"] = dataclasses.asdict(self._lora)
            self.strict_loading = False  # LoRA checkpoints hold the trainable weights only (checked on load)
        self.hparams["early_stop"] = dataclasses.asdict(stops)
        self.automatic_optimization = False
        self._actor_opt_factory, self._critic_opt_factory = actor_optimizer, critic_optimizer
        self.actor: torch.nn.Module | None = None
        self.critic: torch.nn.Module | None = None  # GAE only
        self._reference: list[torch.nn.Module] = []  # kept out of state_dict: it is rebuilt from the model folder
        self._rollout_actor: list[torch.nn.Module] = []  # FSDP2 + HF engine: an unsharded copy to generate with
        self.tokenizer, self.skips, self._background = None, SkipGuard(max_consecutive_skips), BackgroundSteps(self)
        self._force_scoring_pass = False  # tests: always run the separate old-log-prob and value passes
        self.early_stops, self._pad_row = EarlyStops(stops), -1  # _pad_row: data parallel, the inert padding row
        self.last_rollout: RolloutBatch | None = None  # the last trained iteration's batch (.trajectories included)
        self.last_logs: dict[str, float] = {}  # and its logged values; callbacks read both in on_train_batch_end

    # -- models ---------------------------------------------------------------------------------------------------
    @property
    def uses_critic(self) -> bool:
        return self.hparams.adv_estimator == "gae"

    @property
    def uses_reference(self) -> bool:
        return self.hparams.use_kl_loss or self.hparams.kl_in_reward_coef > 0

    @property
    def reference(self) -> torch.nn.Module | None:
        return self._reference[0] if self._reference else None

    def setup(self, stage: str) -> None:
        if self._trainer is not None:  # atomic writes, digest checked on load (before the trainer restores one)
            checkpointing.install(self.trainer)
        dm = getattr(self.trainer, "datamodule", None) if self._trainer is not None else None
        check_data_settings(self.hparams, getattr(dm, "hparams", None))  # the CLI checked them before anything ran
        self._model_path = warm_started_path(self.hparams.model, self.hparams.warm_start, dm)

    def _actor_path(self) -> str:
        """The actor's folder: the warm-started one once ``setup`` ran, else ``--model.model`` resolved."""
        return getattr(self, "_model_path", None) or models.resolve_model_path(self.hparams.model)

    def configure_model(self) -> None:
        if self.actor is not None:
            return
        path = self._actor_path()
        self.tokenizer = models.load_tokenizer(path)
        nets = build_networks(path, self.hparams.critic_model, self.hparams.dtype, self._lora,
                              with_critic=self.uses_critic, with_reference=self.uses_reference,
                              activation_checkpointing=self.hparams.activation_checkpointing)
        self.actor, self.critic, self._reference = nets.actor, nets.critic, [nets.reference] if nets.reference else []
        if self._device_mesh is not None:  # FSDP2 (ModelParallelStrategy): shard per transformer block
            engine = resolve_engine(getattr(self.trainer.datamodule, "hparams", {}).get("engine", "hf"),
                                    quantized=is_quantized(self.actor))  # auto: QLoRA samples with HF
            self._rollout_actor = shard_networks([self.actor, self.critic, self.reference], self._device_mesh, lora=(
                self._lora), cuda=self.trainer.strategy.root_device.type == "cuda", rollout_copy=engine == "hf")

    def on_fit_start(self) -> None:
        if self.reference is not None:
            self.reference.to(self.device)
        self.on_validation_start()

    def on_validation_start(self) -> None:  # the first prompt must fit (the CLI checks it too, before launch)
        dm = getattr(self.trainer, "datamodule", None)
        if dm is not None and hasattr(dm, "check_prompt_budget") and not getattr(self, "_data_checked", False):
            dm.check_prompt_budget()
            self._data_checked = True

    def make_engine(self, max_batch_size: int = 128, engine: str = "hf", vllm=None, max_model_len: int = 4096,
                    seed: int = 0):
        """The rollout engine for this module's actor (:func:`ragen_lightning.rollout.engines.build_engine`)."""
        rollout_actor = self._rollout_actor[0].to(self.device) if self._rollout_actor else None
        return build_engine(self.actor, self.tokenizer, model_path=self._actor_path(), rollout_actor=rollout_actor,
                            engine=engine, vllm=vllm, max_batch_size=max_batch_size, max_model_len=max_model_len, seed=seed)

    def configure_optimizers(self):
        hp = self.hparams
        actor_params, critic_params = lora_mod.optimizer_parameters(self.actor, self.critic)
        return build_optimizers(actor_params, critic_params, actor_factory=self._actor_opt_factory,
                                critic_factory=self._critic_opt_factory, actor_lr=hp.actor_lr, critic_lr=hp.critic_lr,
                                weight_decay=hp.weight_decay, with_critic=self.critic is not None,
                                schedule=LRSchedule(hp.lr_warmup_steps, hp.lr_decay_iterations))

    # -- the iteration --------------------------------------------------------------------------------------------
    def training_step(self, dataloader_iter) -> None:
        # 1. the rollout batch, generated with the current weights (pulled here, never pre-fetched)
        batch, _, _ = next(dataloader_iter)
        logs = {**self._background.join(), **batch.metrics}  # the critic's steps of the last iteration (in background)
        self.last_rollout, self.last_logs = batch, logs  # for callbacks; logs fills up below
        batch, hp, t0 = batch.to(self.device), self.hparams, time.perf_counter()
        start_iteration(self.lr_schedulers(), iteration := batch.metrics.get("iteration", self.global_step))  # lr decay
        if hp.adv_estimator in ROW_ESTIMATORS:  # only rows with an advantage train (the others' are 0 everywhere)
            batch, logs["train/kept_rows"] = kept_rows(batch, {k: hp[k] for k in ADVANTAGE_SETTINGS})
        if len(batch) == 0:
            return self._log(logs)
        ids, att, mask = batch.input_ids, batch.attention_mask, batch.loss_mask[:, 1:].bool()  # mask: target axis
        # 2. scoring passes (no grad). With one epoch over one mini-batch the update's own forward pass runs on the
        #    rollout weights, so it supplies old_logprobs (ratio 1) and the separate actor pass is skipped.
        on_policy = (hp.ppo_epochs == 1 and len(batch) <= hp.mini_batch_size and hp.kl_in_reward_coef == 0
                     and not self._force_scoring_pass and not batch.chains_turns)  # chained GAE: returns need all rows
        old_logprobs = entropy = ref_logprobs = values = None
        background = self._background.active()  # None: the critic steps in sequence (several processes, ...)
        if not on_policy:
            old_logprobs, entropy = self._score(self.actor, ids, att, mask, with_entropy=True)
        if self.reference is not None:
            ref_logprobs, _ = self._score(self.reference, ids, att, mask)
        if self.critic is not None and (not on_policy or background):  # else from the critic step's own forward
            values, _ = self._score(self.critic, ids, att, mask, kind="critic")
        # 3. advantages (on-policy with a critic: inside step 4, from the values of the critic step)
        adv_of = advantages_for(batch, mask, old_logprobs, ref_logprobs, {k: hp[k] for k in ADVANTAGE_SETTINGS})
        critic_first = self.critic is not None and values is None
        advantages, returns, adv_logs = (None, None, {}) if critic_first else adv_of(values, None)
        logs.update(adv_logs)
        # 4. updates: ppo_epochs x mini-batches, critic then actor
        data = UpdateBatch(ids, att, mask, advantages, batch.engine_logprobs[:, 1:], old_logprobs=old_logprobs,
                           ref_logprobs=ref_logprobs, values=values, returns=returns)
        self._pad_row = len(batch)  # data parallel: the inert row that pads short per-rank shares
        step_logs, seen = ppo_update(data, self.actor, self.critic, policy_loss=self._policy_loss,
                                     value_clip=hp.value_clip, ppo_epochs=hp.ppo_epochs,
                                     mini_batch_size=hp.mini_batch_size, shuffle=hp.shuffle, background=background,
                                     step=functools.partial(network_step, self), advantages_of=adv_of, iteration=iteration)
        logs.update(step_logs)
        old_logprobs, entropy = seen if old_logprobs is None else (old_logprobs, entropy)  # seen: update's pass
        logs["actor/entropy"] = float(masked_mean(entropy, mask))
        logs["rollout/engine_logprob_abs_diff"] = float(masked_mean((data.engine_logprobs - old_logprobs).abs(), mask))
        logs.update({"train/skipped_steps": float(self.skips.total), "timing_s/update": time.perf_counter() - t0})
        if reason := self.early_stops.after_iteration(logs.get("rollout/in_group_reward_std", 0.0)):
            logs["early_stopped/reward_variance_collapse"] = 1.0
            self._stop(reason)
        # 5. log
        return self._log(logs)

    def _score(self, net, ids, att, mask, *, kind: str = "actor", with_entropy: bool = False):
        hp = self.hparams  # (a critic pass ignores temperature, chunking and the mask)
        return score_sharded(net, ids, att, hp.logprob_micro_batch_size or hp.micro_batch_size, kind=kind,
                             with_entropy=with_entropy, temperature=hp.temperature, chunk_size=hp.logits_chunk_size,
                             loss_mask=mask, threads=hp.micro_batch_threads)

    def _optimizers(self):
        return opts if isinstance(opts := self.optimizers(), list) else [opts]

    def _log(self, logs: dict[str, float]) -> None:
        logs = {k: float(v) for k, v in logs.items() if v is not None and math.isfinite(float(v))}
        self.log_dict(logs, on_step=True, on_epoch=False, batch_size=1)
        for key, name in (("train/success", "success"), ("train/score", "score")):
            if key in logs:
                self.log(name, logs[key], prog_bar=True, on_step=True, on_epoch=False, batch_size=1)

    # -- validation -----------------------------------------------------------------------------------------------
    def validation_step(self, batch: RolloutBatch, batch_idx: int) -> None:
        metrics = {k: float(v) for k, v in batch.metrics.items()}
        # computed from the trajectories of every rank, so identical on all; sync_dist only averages equal values
        self.log_dict(metrics, on_step=False, on_epoch=True, batch_size=1, sync_dist=True)
        if "val/success" in metrics:
            self.log("val_success", metrics["val/success"], prog_bar=True, on_epoch=True, batch_size=1, sync_dist=True)
            if not self.trainer.sanity_checking and self.trainer.state.fn == "fit" and \
                    (reason := self.early_stops.after_validation(metrics["val/success"])):
                self._stop(reason)

    def _stop(self, reason: str) -> None:
        rank_zero_warn(f"early stop: {reason}")
        self.trainer.should_stop = True

    # -- checkpoints and export -----------------------------------------------------------------------------------
    def state_dict(self, *args, **kwargs):
        self._background.wait()  # a checkpoint holds the critic after the steps it is taking in the background
        state = super().state_dict(*args, **kwargs)  # LoRA: trainable weights only, on any strategy (base: rebuilt)
        return lora_mod.trainable_state(self, state) if self._lora is not None else state

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        checkpoint["starpo"] = {**self.skips.state_dict(), **self.early_stops.state_dict(),
                                "model_path": str(getattr(self, "_model_path", self.hparams.model))}

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        if self._lora is not None and self.actor is not None and "state_dict" in checkpoint:  # (FSDP2: loaded already)
            lora_mod.check_trainable_state(self, checkpoint["state_dict"])
        for part in (self.skips, self.early_stops):  # their counters (skips in a row, collapse windows)
            part.load_state_dict(checkpoint.get("starpo", {}))

    def export_actor(self, path: str | Path) -> Path:
        """Save the actor as a HF folder (:func:`.export.export_actor`; under FSDP2 every rank calls it)."""
        return export_actor(self.actor, self.tokenizer, path, lora=self._lora, dtype=self.hparams.dtype,
                            base_path=self._actor_path(), rollout_actor=(self._rollout_actor or [None])[0])

    def on_fit_end(self) -> None:
        self._background.close()
        if self.hparams.export_dir and (self.trainer.is_global_zero or self._device_mesh is not None):
            self.export_actor(self.hparams.export_dir)

