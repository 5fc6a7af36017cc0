"""StarPOModule: actor, critic (an estimator's that needs one) and reference (KL terms only); one
``training_step`` is one StarPO iteration. Its settings come in typed groups (:mod:`.settings`).

:meth:`StarPOModule.training_step` reads top to bottom as the numbered steps of DESIGN section 3:
rollout batch -> no-grad scoring (:func:`.scoring.scoring_passes`) -> advantages
(:mod:`.estimators`) -> ``ppo_epochs`` x mini-batches of critic then actor steps (the loop and
losses in :mod:`.ppo`, each optimizer step in :mod:`.optim`) -> logs; ``last_rollout`` /
``last_logs``: batch and logs, for callbacks. Manual optimisation, one optimizer per network:
``trainer.global_step`` counts optimizer steps, the run length is
``--data.training.num_iterations``. Data parallel: every rank holds the global batch, the update
splits its rows (``parallel``).
"""

from __future__ import annotations

import dataclasses
import math
import time
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.utilities import rank_zero_warn

from ragen_lightning import models
from ragen_lightning.algos.losses import masked_mean
from ragen_lightning.models import lora as lora_mod
from ragen_lightning.models.build import build_networks
from ragen_lightning.parallel import checkpointing, shard_networks
from ragen_lightning.rollout.engines import build_engine, is_quantized, resolve_engine
from ragen_lightning.sft.warm_start import WarmStartSettings, warm_start_hparams, warm_started_path
from ragen_lightning.starpo.background import BackgroundSteps
from ragen_lightning.starpo.checks import check_data_settings, check_module_settings
from ragen_lightning.starpo.early_stop import EarlyStops, EarlyStopSettings
from ragen_lightning.starpo.estimators import advantages_for, get_estimator, kept_rows
from ragen_lightning.starpo.export import export_actor
from ragen_lightning.starpo.optim import (
    LRSchedule,
    SkipGuard,
    StepContext,
    build_optimizers,
    fsdp1_root,
    scheduler_of,
    start_iteration,
)
from ragen_lightning.starpo.ppo import ppo_update
from ragen_lightning.starpo.scoring import scoring_passes
from ragen_lightning.starpo.settings import (
    GROUPS,
    AdvantageSettings,
    CriticSettings,
    ModuleSettings,
    OptimSettings,
    PolicyLossSettings,
    UpdateSettings,
    as_group,
    checkpoint_hparams,
    scores_in_update,
)
from ragen_lightning.types import RolloutBatch, UpdateBatch


class StarPOModule(L.LightningModule):
    """StarPO / StarPO-S: PPO with a critic or GRPO-family estimators over whole multi-turn
    trajectories.

    Args:
        model: actor model: ``"tiny"`` (the embedded model) or a HF folder / hub id.
        dtype: parameter dtype (``float32`` on CPU; ``bfloat16`` on GPUs).
        warm_start: supervised warm start from the env's expert before RL (``true``, or its recipe,
            ``WarmStartSettings``: ``{steps: 1000, threads: 2}``); cached per setting.
        advantage: how rewards become advantages: the estimator and its settings
        (``AdvantageSettings``). loss: the actor's PPO loss: clipping, aggregation, entropy and KL
        terms (``PolicyLossSettings``). critic: the critic, built for an estimator that needs one
        (``CriticSettings``). optim: learning rates, optimizers, schedule and step guards
        (``OptimSettings``). update: epochs, mini- and micro-batches, threads and memory savers of
        the update (``UpdateSettings``). lora: LoRA / QLoRA (``models.lora.LoraSettings``; null: all
        weights train); the KL reference is adapters-off. early_stop: RAGEN's early stops
        (:class:`~ragen_lightning.starpo.early_stop.EarlyStopSettings`). export_dir: save the
        trained actor there as a HF folder when fit ends (under LoRA: the peft adapter).
        temperature: the rollouts' sampling temperature (linked from
        ``--data.sampling.temperature``); log-probs: logits / T.
    """

    def __init__(
        self,
        model: str = "tiny",
        dtype: str = "float32",
        warm_start: WarmStartSettings | bool = False,
        advantage: AdvantageSettings = AdvantageSettings(),  # noqa: B008 (frozen)
        loss: PolicyLossSettings = PolicyLossSettings(),  # noqa: B008 (frozen)
        critic: CriticSettings = CriticSettings(),  # noqa: B008 (frozen)
        optim: OptimSettings = OptimSettings(),  # noqa: B008 (frozen)
        update: UpdateSettings = UpdateSettings(),  # noqa: B008 (frozen)
        lora: lora_mod.LoraSettings | None = None,
        early_stop: EarlyStopSettings = EarlyStopSettings(),  # noqa: B008 (frozen)
        export_dir: str | None = None,
        temperature: float = 1.0,
    ):
        super().__init__()
        self._lora = lora_mod.as_settings(lora)
        self.settings = ModuleSettings.build(
            temperature, advantage=advantage, loss=loss, critic=critic, optim=optim, update=update
        )
        stops = as_group(EarlyStopSettings, early_stop, "--model.early_stop")
        check_module_settings(self.settings, self._lora)
        self.save_hyperparameters(ignore=[*GROUPS, "lora", "early_stop"])
        # plain dicts in checkpoints
        self.hparams.update(checkpoint_hparams(self.settings, stops, self._lora))
        self.hparams["warm_start"] = warm_start_hparams(warm_start)
        if self._lora is not None:
            # LoRA checkpoints hold the trainable weights only (checked on load)
            self.strict_loading = False
        self.automatic_optimization = False
        self.actor: torch.nn.Module | None = None
        self.critic: torch.nn.Module | None = None  # an estimator with a critic only
        # kept out of state_dict: it is rebuilt from the model folder
        self._reference: list[torch.nn.Module] = []
        # FSDP2 + HF engine: an unsharded copy to generate with
        self._rollout_actor: list[torch.nn.Module] = []
        self.tokenizer, self.skips = None, SkipGuard(self.settings.optim.max_consecutive_skips)
        self._background = BackgroundSteps(self)
        self.early_stops = EarlyStops(stops)
        # the last trained iteration's batch (.trajectories included)
        self.last_rollout: RolloutBatch | None = None
        # and its logged values; callbacks read both in on_train_batch_end
        self.last_logs: dict[str, float] = {}
        self.rollouts = None  # the data module this policy serves (set in setup)
        # the actor's folder: --model.model, warm-started in setup when asked
        self.model_path: str | None = None

    # -- settings that callbacks may change during a run -------------------------------------------
    @property
    def advantage(self) -> AdvantageSettings:
        return self.settings.advantage

    @property
    def loss(self) -> PolicyLossSettings:
        return self.settings.loss

    def set_entropy_coeff(self, value: float) -> None:
        """Change the entropy bonus from the next step on (``callbacks.CollapseMonitor``'s
        ``adjust_entropy``)."""
        loss = dataclasses.replace(self.loss, entropy_coeff=float(value))
        self.settings = dataclasses.replace(self.settings, loss=loss)
        self.hparams["loss"] = dataclasses.asdict(loss)

    # -- models ------------------------------------------------------------------------------------
    @property
    def uses_critic(self) -> bool:
        return get_estimator(self.advantage.estimator).critic

    @property
    def uses_reference(self) -> bool:
        return self.settings.uses_reference

    @property
    def reference(self) -> torch.nn.Module | None:
        return self._reference[0] if self._reference else None

    def setup(self, stage: str) -> None:
        checkpointing.install(self.trainer)  # atomic writes, digest checked on load
        # The one link between the policy (this module: actor, tokenizer, engine) and the rollouts
        # (the data module): Lightning hands both to the trainer, so it is found there once and
        # kept; the data module gets the policy explicitly (RolloutDataModule.connect) and never
        # looks for it.
        self.rollouts = getattr(self.trainer, "datamodule", None)
        if hasattr(self.rollouts, "connect"):
            self.rollouts.connect(self)
        # the CLI checked them already
        check_data_settings(
            self.advantage,
            getattr(self.rollouts, "settings", None),
            tis_cap=self.settings.loss.tis_cap,
        )
        self.model_path = warm_started_path(
            self.hparams.model, self.hparams.warm_start, self.rollouts
        )

    def _actor_path(self) -> str:
        """The actor's folder: the warm-started one once ``setup`` ran, else ``--model.model``
        resolved."""
        return self.model_path or models.resolve_model_path(self.hparams.model)

    def configure_model(self) -> None:
        if self.actor is not None:
            return
        path = self._actor_path()
        self.tokenizer = models.load_tokenizer(path)
        nets = build_networks(
            path,
            self.settings.critic.model,
            self.hparams.dtype,
            self._lora,
            with_critic=self.uses_critic,
            with_reference=self.uses_reference,
            activation_checkpointing=self.settings.update.activation_checkpointing,
        )
        self.actor, self.critic, self._reference = (
            nets.actor,
            nets.critic,
            [nets.reference] if nets.reference else [],
        )
        if self.device_mesh is not None:  # FSDP2 (ModelParallelStrategy): shard per block
            data = getattr(self.rollouts, "settings", None)  # the data module's settings groups
            engine = resolve_engine(
                data.engine.name if data is not None else "hf",
                # auto: QLoRA samples with HF
                quantized=is_quantized(self.actor),
            )
            cuda = self.trainer.strategy.root_device.type == "cuda"
            self._rollout_actor = shard_networks(
                [self.actor, self.critic, self.reference],
                self.device_mesh,
                lora=self._lora,
                cuda=cuda,
                rollout_copy=engine == "hf",
            )

    def on_fit_start(self) -> None:
        if self.reference is not None:
            self.reference.to(self.device)

    def make_engine(
        self,
        max_batch_size: int = 128,
        engine: str = "hf",
        vllm=None,
        max_model_len: int = 4096,
        seed: int = 0,
    ):
        """The rollout engine for this module's actor
        (:func:`ragen_lightning.rollout.engines.build_engine`)."""
        rollout_actor = self._rollout_actor[0].to(self.device) if self._rollout_actor else None
        return build_engine(
            self.actor,
            self.tokenizer,
            model_path=self._actor_path(),
            rollout_actor=rollout_actor,
            engine=engine,
            vllm=vllm,
            max_batch_size=max_batch_size,
            max_model_len=max_model_len,
            seed=seed,
        )

    def configure_optimizers(self):
        o = self.settings.optim
        actor_params, critic_params = lora_mod.optimizer_parameters(self.actor, self.critic)
        return build_optimizers(
            actor_params,
            critic_params,
            actor_factory=o.actor_optimizer,
            critic_factory=o.critic_optimizer,
            actor_lr=o.actor_lr,
            critic_lr=o.critic_lr,
            weight_decay=o.weight_decay,
            with_critic=self.critic is not None,
            schedule=LRSchedule(o.warmup_steps, o.decay_iterations),
        )

    # -- the iteration -----------------------------------------------------------------------------
    def training_step(self, dataloader_iter) -> None:
        # 1. the rollout batch, generated with the current weights (pulled here, never pre-fetched)
        batch, _, _ = next(dataloader_iter)
        # the critic's steps of the last iteration (in background)
        logs = {**self._background.join(), **batch.metrics}
        self.last_rollout, self.last_logs = batch, logs  # for callbacks; logs fills up below
        batch, s, t0 = batch.to(self.device), self.settings, time.perf_counter()
        # lr decay
        start_iteration(
            self.lr_schedulers(), iteration := batch.metrics.get("iteration", self.global_step)
        )
        # only rows with an advantage train (others' are 0)
        if get_estimator(s.advantage.estimator).sparse_rows:
            batch, logs["train/kept_rows"] = kept_rows(batch, s.advantage)
        if len(batch) == 0:
            return self._log(logs)
        # 2. scoring passes (no grad). With one epoch over one mini-batch the update's own forward
        #    pass runs on the rollout weights, so it supplies old_logprobs (ratio 1) and the
        #    separate actor pass is skipped.
        # None: the critic steps in sequence (several processes, ...)
        background = self._background.active()
        on_policy = scores_in_update(s, batch)
        data, entropy = scoring_passes(
            batch,
            s,
            actor=None if on_policy else self.actor,
            reference=self.reference,
            # else the values come from the critic step's own forward
            critic=self.critic if not on_policy or background else None,
        )
        # 3. advantages (on-policy with a critic: inside step 4, from the values of the critic step)
        adv_of = advantages_for(
            batch, data.loss_mask, data.old_logprobs, data.ref_logprobs, s.advantage
        )
        if self.critic is None or data.values is not None:
            advantages, returns, adv_logs = adv_of(data.values, None)
            logs.update(adv_logs)
            data = dataclasses.replace(data, advantages=advantages, returns=returns)
        # 4. updates: ppo_epochs x mini-batches, critic then actor
        critic = self._step_context("critic", len(batch)) if self.critic is not None else None
        actor = self._step_context("actor", len(batch))
        step_logs, seen = ppo_update(
            data,
            s,
            actor=actor,
            critic=critic,
            iteration=iteration,
            advantages_of=adv_of,
            background=background,
        )
        logs.update(step_logs)
        self._after_update(logs, data, seen, entropy, t0)
        # 5. log
        return self._log(logs)

    def _step_context(self, network: str, pad_row: int) -> StepContext:
        """What an optimizer step of ``network`` needs, from this module and its trainer
        (``pad_row``: data parallel, the inert row that pads short per-rank shares)."""
        s, opt, trainer = self.settings, self.network_optimizer(network), self.trainer
        return StepContext(
            network,
            getattr(self, network),
            opt,
            s.update.micro_batching,
            s.optim.grad_clip,
            self.skips,
            scheduler_of(self.lr_schedulers(), opt),
            self.manual_backward,
            pad_row,
            fsdp1_root(trainer.strategy),
            trainer.precision,
            self.device,
        )

    def network_optimizer(self, network: str):
        """The optimizer of ``"actor"`` or ``"critic"`` (Lightning's wrapper)."""
        opts = opts if isinstance(opts := self.optimizers(), list) else [opts]
        return opts[0 if network == "actor" else 1]

    def _after_update(self, logs: dict, data: UpdateBatch, seen, entropy, t0: float) -> None:
        """Step 4's logs, into ``logs``: the actor's entropy and the gap between its old log-probs
        and the engine's (on-policy both from the update's first pass, ``seen``), skipped steps and
        the update's time since ``t0``; then RAGEN's early stop on a collapsed reward variance."""
        old_logprobs, entropy = seen if data.old_logprobs is None else (data.old_logprobs, entropy)
        mask = data.loss_mask
        logs["actor/entropy"] = float(masked_mean(entropy, mask))
        logs["rollout/engine_logprob_abs_diff"] = float(
            masked_mean((data.engine_logprobs - old_logprobs).abs(), mask)
        )
        logs["train/skipped_steps"] = float(self.skips.total)
        logs["timing_s/update"] = time.perf_counter() - t0
        if reason := self.early_stops.after_iteration(logs.get("rollout/in_group_reward_std", 0.0)):
            logs["early_stopped/reward_variance_collapse"] = 1.0
            self._stop(reason)

    def _log(self, logs: dict[str, float]) -> None:
        logs = {k: float(v) for k, v in logs.items() if v is not None and math.isfinite(float(v))}
        self.log_dict(logs, on_step=True, on_epoch=False, batch_size=1)
        for key, name in (("train/success", "success"), ("train/score", "score")):
            if key in logs:
                self.log(name, logs[key], prog_bar=True, on_step=True, on_epoch=False, batch_size=1)

    # -- validation --------------------------------------------------------------------------------
    def on_validation_model_zero_grad(self) -> None:
        # Lightning zeroes every gradient and switches the networks to eval mode before validating:
        # a critic step still running in the background would lose the gradients it had accumulated
        # so far (and run its forward in eval mode), at a point that depends on thread timing. Its
        # steps finish first, so a run is the same whatever the timing, and the same as a run
        # resumed from the checkpoint taken after this validation.
        self._background.wait()
        super().on_validation_model_zero_grad()

    def validation_step(self, batch: RolloutBatch, batch_idx: int) -> None:
        metrics = {k: float(v) for k, v in batch.metrics.items()}
        # computed from the trajectories of every rank, so identical on all; sync_dist only averages
        # equal values
        self.log_dict(metrics, on_step=False, on_epoch=True, batch_size=1, sync_dist=True)
        if "val/success" in metrics:
            self.log(
                "val_success",
                metrics["val/success"],
                prog_bar=True,
                on_epoch=True,
                batch_size=1,
                sync_dist=True,
            )
            if (
                not self.trainer.sanity_checking
                and self.trainer.state.fn == "fit"
                and (reason := self.early_stops.after_validation(metrics["val/success"]))
            ):
                self._stop(reason)

    def _stop(self, reason: str) -> None:
        rank_zero_warn(f"early stop: {reason}")
        self.trainer.should_stop = True

    # -- checkpoints and export --------------------------------------------------------------------
    def state_dict(self, *args, **kwargs):
        # a checkpoint holds the critic after the steps it is taking in the background
        self._background.wait()
        # LoRA: trainable weights only, on any strategy (base: rebuilt)
        state = super().state_dict(*args, **kwargs)
        return lora_mod.trainable_state(self, state) if self._lora is not None else state

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        checkpoint["starpo"] = {
            **self.skips.state_dict(),
            **self.early_stops.state_dict(),
            "model_path": str(self.model_path or self.hparams.model),
            "background_logs": self._background.state_dict(),
        }

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        # (FSDP2: loaded already)
        if self._lora is not None and self.actor is not None and "state_dict" in checkpoint:
            lora_mod.check_trainable_state(self, checkpoint["state_dict"])
        # a critic run resumed with a critic-free estimator
        if self.critic is None and checkpointing.drop_critic_state(checkpoint):
            rank_zero_warn(
                f"the checkpoint's critic is not used with --model.advantage.estimator "
                f"{self.advantage.estimator}: its weights and optimizer state are dropped"
            )
        # their counters (skips in a row, collapse windows)
        for part in (self.skips, self.early_stops):
            part.load_state_dict(checkpoint.get("starpo", {}))
        self._background.load_state_dict(checkpoint.get("starpo", {}).get("background_logs", {}))

    def export_actor(self, path: str | Path) -> Path:
        """Save the actor as a HF folder (:func:`.export.export_actor`; under FSDP2 every rank calls
        it)."""
        return export_actor(
            self.actor,
            self.tokenizer,
            path,
            lora=self._lora,
            dtype=self.hparams.dtype,
            base_path=self._actor_path(),
            rollout_actor=(self._rollout_actor or [None])[0],
        )

    def on_fit_end(self) -> None:
        self._background.close()
        sharded = self.device_mesh is not None  # FSDP2: every rank calls the export
        if self.hparams.export_dir and (self.trainer.is_global_zero or sharded):
            self.export_actor(self.hparams.export_dir)
