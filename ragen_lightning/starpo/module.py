"""StarPOModule: actor, critic (GAE only) and reference (KL only); one ``training_step`` is one StarPO iteration.

The iteration (SPEC section 0, DESIGN section 3), top to bottom in :meth:`StarPOModule.training_step`:

1. pull the filtered rollout batch the data module generated with the current actor;
2. score it under ``no_grad``: ``old_logprobs`` (+ token entropy), ``ref_logprobs`` if a KL term is on, critic
   ``values`` if the estimator is GAE;
3. advantages: token rewards (optionally minus ``beta * KL``) -> GAE / turn-level GAE and whitening, or a GRPO-family
   outcome estimator -> the post-advantage modifiers (soft reweight, filter-loss scaling, length weight, zero-task);
4. ``ppo_epochs`` x mini-batches: critic then actor, each accumulated over micro-batches with the mini-batch's
   normaliser (so the gradient does not depend on the micro-batch size), clipped per network and stepped; a
   non-finite loss or grad norm skips that step and is counted;
5. log.

During and after each iteration ``last_rollout`` (its :class:`RolloutBatch`, kept trajectories included; empty when
the filter kept nothing) and ``last_logs`` (the values logged for it) hold that iteration's data for callbacks
(``callbacks/``), which read them in ``on_train_batch_end``.

Manual optimisation with one optimizer per network; ``trainer.global_step`` therefore counts optimizer steps, and the
run length is set in iterations by ``--data.num_iterations``.

Data parallel (DDP, FSDP2 via :class:`~ragen_lightning.parallel.FSDP2Strategy`, FSDP1): every rank holds the same
global batch; scoring passes and each mini-batch's rows are split evenly across ranks (an inert zero-mask row pads
short shares), losses keep the global normaliser times the world size (DDP/FSDP average gradients), so one step
equals the single-process step (:mod:`ragen_lightning.parallel`; the update loop itself is
:mod:`ragen_lightning.starpo.update`).
"""

from __future__ import annotations

import copy
import dataclasses
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
from ragen_lightning.algos.losses import (
    AggMode,
    KLKind,
    actor_loss,
    agg_normalizer,
    aggregate,
    tis_weights,
    value_loss,
)
from ragen_lightning.algos.masked import masked_mean
from ragen_lightning.errors import ConfigError
from ragen_lightning.models import lora as lora_mod
from ragen_lightning.models.build import build_networks
from ragen_lightning.parallel import all_reduce_, shard_model, world
from ragen_lightning.rollout.engines import GatheredWeightsEngine, build_engine
from ragen_lightning.starpo.advantages import starpo_advantages
from ragen_lightning.starpo.early_stop import (
    LowValidationSuccess,
    RewardVarianceCollapse,
)
from ragen_lightning.starpo.scoring import actor_outputs, critic_values, trimmed
from ragen_lightning.starpo.update import (
    accumulate,
    mini_batches,
    score_sharded,
    with_inert_row,
)
from ragen_lightning.types import RolloutBatch

AdvEstimator = Literal["gae", "grpo", "drgrpo", "brpo", "arpo"]


class StarPOModule(L.LightningModule):
    """StarPO / StarPO-S: PPO with a critic or GRPO-family estimators over whole multi-turn trajectories.

    Args:
        model: actor model: ``"tiny"`` (the embedded model) or a HF folder / hub id.
        critic_model: critic base model (defaults to ``model``); only built for ``adv_estimator: gae``.
        dtype: parameter dtype (``float32`` on CPU; ``bfloat16`` on GPUs).
        warm_start: supervised warm start from the env's solver before RL (``true`` for defaults, or a dict of
            ``ragen_lightning.sft.warm_start`` arguments such as ``steps``); cached, so it runs once per setting.
        adv_estimator: ``gae`` (PPO, needs the critic) | ``grpo`` | ``drgrpo`` | ``brpo`` | ``arpo``.
        gamma: token-level discount.
        lam: GAE lambda.
        turn_level_gae: bi-level GAE over turn ends (GAE only) with ``high_level_gamma`` between turns.
        high_level_gamma: discount between turns for ``turn_level_gae``.
        ppo_epochs: passes over each rollout batch.
        mini_batch_size: samples per optimizer step.
        micro_batch_size: samples per forward/backward (gradient accumulation inside a mini-batch).
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
        actor_lr: actor learning rate (AdamW) when ``actor_optimizer`` is not given.
        critic_lr: critic learning rate (AdamW) when ``critic_optimizer`` is not given.
        weight_decay: AdamW weight decay.
        actor_optimizer: optimizer factory for the actor (overrides ``actor_lr``).
        critic_optimizer: optimizer factory for the critic (overrides ``critic_lr``).
        grad_clip: max global grad norm per network (0 disables clipping).
        lr_warmup_steps: linear learning-rate warm-up over each network's first N optimizer steps (step ``k`` uses
            ``lr * min(1, (k + 1) / N)``; 0 = off). Adam's first steps move every weight by about ``lr`` whatever
            the gradient's size, which can break a small model's answer format at the learning rates RL needs.
        logprob_micro_batch_size: micro-batch size of the no-grad scoring passes (defaults to ``micro_batch_size``).
        logits_chunk_size: rows per chunk when computing log-probs/entropy from logits (bounds memory).
        temperature: the rollouts' sampling temperature (linked from ``--data.temperature``): log-probs and entropy
            are computed from ``logits / temperature``, the distribution the tokens were sampled from.
        rv_collapse_window: early stop (RAGEN): baseline = mean in-group reward std of the first N trained
            iterations; stop when the last N are all below ``rv_collapse_ratio`` x baseline (0 disables).
        rv_collapse_ratio: the collapse threshold as a fraction of the baseline.
        low_val_success_patience: early stop after this many consecutive validations with success below
            ``low_val_success_threshold`` (0 disables).
        low_val_success_threshold: the validation success counted as "low".
        export_dir: if set, save the trained actor there as a HF folder when fit ends (under LoRA: the adapter in
            peft format, plus merged weights in ``<dir>/merged`` with ``lora.export_merged``).
        activation_checkpointing: recompute each transformer block in backward instead of storing its activations
            (actor and critic): far less activation memory for about one more forward pass of compute.
        lora: LoRA / QLoRA settings (:class:`~ragen_lightning.models.lora.LoraSettings`: ``rank``, ``alpha``, ``dropout``,
            ``target_modules``, ``quantization: none | nf4``, ``shared_base``, ``export_merged``); ``null`` trains
            all weights. Under LoRA only adapters (and the critic's value head) train and the KL reference is the
            actor with its adapters disabled (no copy). Raise the learning rates ~x10 (configs/lora.yaml).
        tis_cap: truncated importance sampling against the rollout engine's distribution (off when null): each
            token's policy-gradient term is weighted by ``min(exp(old_logprobs - engine_logprobs), tis_cap)``.
            Useful with ``--data.engine vllm`` (e.g. 2.0); needs ``--data.temperature 1``.
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
        actor_lr: float = 1e-6,
        critic_lr: float = 1e-5,
        weight_decay: float = 0.01,
        actor_optimizer: OptimizerCallable | None = None,
        critic_optimizer: OptimizerCallable | None = None,
        grad_clip: float = 1.0,
        lr_warmup_steps: int = 0,
        logprob_micro_batch_size: int | None = None,
        logits_chunk_size: int | None = None,
        temperature: float = 1.0,
        rv_collapse_window: int = 10,
        rv_collapse_ratio: float = 0.1,
        low_val_success_patience: int = 5,
        low_val_success_threshold: float = 0.01,
        export_dir: str | None = None,
        tis_cap: float | None = None,
        activation_checkpointing: bool = False,
        lora: lora_mod.LoraSettings | None = None,
    ):
        super().__init__()
        if micro_batch_size < 1 or mini_batch_size < 1 or ppo_epochs < 1:
            raise ConfigError("--model.micro_batch_size, --model.mini_batch_size and --model.ppo_epochs must be >= 1")
        if micro_batch_size > mini_batch_size:
            raise ConfigError(f"--model.micro_batch_size ({micro_batch_size}) must be <= --model.mini_batch_size "
                             f"({mini_batch_size})")
        if turn_level_gae and adv_estimator != "gae":
            raise ConfigError("--model.turn_level_gae needs --model.adv_estimator gae")
        if (soft_advantage_reweight or length_weight) and adv_estimator == "gae":
            raise ConfigError("--model.soft_advantage_reweight / --model.length_weight apply to GRPO-family estimators")
        if tis_cap is not None and (tis_cap <= 0 or temperature != 1.0):
            raise ConfigError("--model.tis_cap must be > 0 and needs --data.temperature 1 (engine log-probs are the "
                              f"raw model's), got tis_cap={tis_cap}, temperature={temperature}")
        if lr_warmup_steps < 0:
            raise ConfigError(f"--model.lr_warmup_steps must be >= 0, got {lr_warmup_steps}")
        if use_kl_loss and kl_coef == 0:
            raise ConfigError("--model.use_kl_loss needs --model.kl_coef > 0")
        self._lora = lora_mod.as_settings(lora)
        if self._lora is not None and self._lora.shared_base and critic_model is not None:
            raise ConfigError("--model.lora.shared_base uses the actor's model for the critic: unset --model.critic_model")
        self.save_hyperparameters(ignore=["actor_optimizer", "critic_optimizer"])
        if self._lora is not None:  # a plain dict in checkpoints and hparams.yaml
            self.hparams["lora"] = dataclasses.asdict(self._lora)
            self.strict_loading = False  # LoRA checkpoints hold the trainable weights only (checked on load)
        self.automatic_optimization = False
        self._actor_opt_factory, self._critic_opt_factory = actor_optimizer, critic_optimizer
        self.actor: torch.nn.Module | None = None
        self.critic: torch.nn.Module | None = None
        self._reference: list[torch.nn.Module] = []  # kept out of state_dict: it is rebuilt from the model folder
        self._rollout_actor: list[torch.nn.Module] = []  # FSDP2: an unsharded copy the engine generates with
        self._pad_row = -1  # data parallel: index of the inert row that pads short per-rank shares
        self.tokenizer = None
        self.skipped_steps = 0
        self._force_scoring_pass = False  # tests: always run the separate old-log-prob pass
        self.rv_collapse = RewardVarianceCollapse(rv_collapse_window, rv_collapse_ratio)
        self.low_val_success = LowValidationSuccess(low_val_success_patience, low_val_success_threshold)
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
        dm = getattr(self.trainer, "datamodule", None) if self._trainer is not None else None
        self.check_data(dm)
        self._model_path = self._resolve_actor_path(dm)

    def check_data(self, dm) -> None:
        """Combinations of module and data settings that cannot work (the CLI checks them before anything runs)."""
        hp = getattr(dm, "hparams", None)
        if hp is not None and self.hparams.adv_estimator in ("grpo", "drgrpo") and hp.group_size < 2:
            raise ConfigError(f"--data.group_size must be >= 2 for --model.adv_estimator {self.hparams.adv_estimator}")

    def _resolve_actor_path(self, dm) -> str:
        ws = self.hparams.warm_start
        if not ws:
            return models.resolve_model_path(self.hparams.model)
        if dm is None:
            raise ConfigError("--model.warm_start needs the RolloutDataModule (it names the env to learn from)")
        from ragen_lightning.sft.warm_start import warm_start

        hp = dm.hparams
        kwargs = dict(ws) if isinstance(ws, dict) else {}
        # demonstrations in exactly the rollouts' format: the data module's episode settings, unless the warm start
        # names its own (``warm_start: {episode: {...}}`` overrides single fields)
        episode = getattr(dm, "episode", None)
        if isinstance(kwargs.get("episode"), dict) and episode is not None:
            kwargs["episode"] = dataclasses.replace(episode, **kwargs["episode"])
        kwargs.setdefault("episode", episode)
        return str(warm_start(self.hparams.model, hp.env_id, hp.env_kwargs, **kwargs))

    def configure_model(self) -> None:
        if self.actor is not None:
            return
        path = getattr(self, "_model_path", None) or models.resolve_model_path(self.hparams.model)
        self.tokenizer = models.load_tokenizer(path)
        nets = build_networks(path, self.hparams.critic_model, self.hparams.dtype, self._lora,
                              with_critic=self.uses_critic, with_reference=self.uses_reference,
                              activation_checkpointing=self.hparams.activation_checkpointing)
        self.actor, self.critic = nets.actor, nets.critic
        self._reference = [nets.reference] if nets.reference is not None else []
        if self._device_mesh is not None:  # FSDP2 (ModelParallelStrategy): shard per transformer block
            if self._lora is not None:
                raise ConfigError("--model.lora is not supported with FSDP2 (configs/fsdp.yaml) yet: use DDP "
                                  "(configs/ddp.yaml); adapters are small enough to replicate")
            self._rollout_actor = [copy.deepcopy(self.actor).eval().requires_grad_(False)]
            mesh = self._device_mesh["data_parallel"]
            bf16 = self.trainer.strategy.root_device.type == "cuda"
            for net in (self.actor, self.critic, self.reference):
                if net is not None:
                    shard_model(net, mesh, mixed_precision=bf16)

    def on_fit_start(self) -> None:
        if self.reference is not None:
            self.reference.to(self.device)
        self._check_data()

    def on_validation_start(self) -> None:
        self._check_data()

    def _check_data(self) -> None:
        dm = getattr(self.trainer, "datamodule", None)
        if dm is not None and hasattr(dm, "check_prompt_budget") and not getattr(self, "_data_checked", False):
            dm.check_prompt_budget()
            self._data_checked = True

    def make_engine(self, max_batch_size: int = 128, engine: str = "hf", vllm=None, max_model_len: int = 4096,
                    seed: int = 0):
        """The rollout engine for this module's actor (:func:`ragen_lightning.rollout.engines.build_engine`)."""
        rollout_actor = self._rollout_actor[0].to(self.device) if self._rollout_actor else None
        path = getattr(self, "_model_path", None) or models.resolve_model_path(self.hparams.model)
        return build_engine(self.actor, self.tokenizer, model_path=path, rollout_actor=rollout_actor, engine=engine,
                            vllm=vllm, max_batch_size=max_batch_size, max_model_len=max_model_len, seed=seed)

    def configure_optimizers(self):
        hp = self.hparams

        def build(factory, params, lr):
            return factory(params) if factory is not None else torch.optim.AdamW(params, lr=lr,
                                                                                weight_decay=hp.weight_decay)

        actor_params, critic_params = lora_mod.optimizer_parameters(self.actor, self.critic)
        opts = [build(self._actor_opt_factory, actor_params, hp.actor_lr)]
        if self.critic is not None:
            opts.append(build(self._critic_opt_factory, critic_params, hp.critic_lr))
        if hp.lr_warmup_steps > 0:  # stepped by _accumulate after each optimizer step (manual optimisation)
            warm = hp.lr_warmup_steps
            return opts, [torch.optim.lr_scheduler.LambdaLR(o, lambda k: min(1.0, (k + 1) / warm)) for o in opts]
        return opts

    # -- the iteration --------------------------------------------------------------------------------------------
    def training_step(self, dataloader_iter) -> None:
        # 1. the rollout batch, generated with the current weights (pulled here, never pre-fetched)
        batch, _, _ = next(dataloader_iter)
        logs = dict(batch.metrics)
        self.last_rollout, self.last_logs = batch, logs  # for callbacks; logs fills up below
        if len(batch) == 0:
            self._log(logs)
            return None
        batch = batch.to(self.device)
        hp = self.hparams
        t0 = time.perf_counter()
        ids, att = batch.input_ids, batch.attention_mask
        mask = batch.loss_mask[:, 1:].bool()  # target axis
        micro = hp.logprob_micro_batch_size or hp.micro_batch_size
        # 2. scoring passes (no grad). With one epoch over one mini-batch the update's own forward pass runs on the
        #    rollout weights, so it supplies old_logprobs (ratio 1) and the separate actor pass is skipped.
        on_policy = (hp.ppo_epochs == 1 and len(batch) <= hp.mini_batch_size and hp.kl_in_reward_coef == 0
                     and not self._force_scoring_pass)
        old_logprobs = entropy = None
        if not on_policy:
            old_logprobs, entropy = score_sharded(self.actor, ids, att, micro, kind="actor", with_entropy=True,
                                                  temperature=hp.temperature, chunk_size=hp.logits_chunk_size)
        ref_logprobs = None
        if self.reference is not None:
            ref_logprobs, _ = score_sharded(self.reference, ids, att, micro, kind="actor",
                                            temperature=hp.temperature, chunk_size=hp.logits_chunk_size)
        values = score_sharded(self.critic, ids, att, micro, kind="critic")[0] if self.critic is not None else None
        # 3. advantages
        advantages, returns, adv_logs = self._advantages(batch, mask, old_logprobs, ref_logprobs, values)
        logs.update(adv_logs)
        # 4. updates
        data = dict(ids=ids, att=att, mask=mask, old_logprobs=old_logprobs, ref_logprobs=ref_logprobs,
                    advantages=advantages, returns=returns, values=values,
                    engine_logprobs=batch.engine_logprobs[:, 1:],
                    seen_logprobs=torch.zeros_like(mask, dtype=torch.float32),
                    seen_entropy=torch.zeros_like(mask, dtype=torch.float32))
        self._pad_row = len(batch)
        if world()[1] > 1:
            data = with_inert_row(data)  # row len(batch) pads short per-rank shares of a mini-batch
        step_logs: dict[str, list[float]] = {}
        iteration = batch.metrics.get("iteration", self.global_step)
        for epoch in range(hp.ppo_epochs):
            for mb, rows in mini_batches(len(batch), hp.mini_batch_size, shuffle=hp.shuffle, epoch=epoch,
                                         iteration=iteration, device=self.device):
                if self.critic is not None:
                    self._merge(step_logs, self._critic_step(data, mb, rows))
                self._merge(step_logs, self._actor_step(data, mb, rows, first_pass=epoch == 0))
        logs.update({k: sum(v) / len(v) for k, v in step_logs.items()})
        if old_logprobs is None:  # entropy and log-probs came from the update's forward pass (each rank: its rows)
            B = len(batch)
            old_logprobs = all_reduce_(data["seen_logprobs"][:B].contiguous())
            entropy = all_reduce_(data["seen_entropy"][:B].contiguous())
        logs["actor/entropy"] = float(masked_mean(entropy, mask))
        logs["rollout/engine_logprob_abs_diff"] = float(masked_mean((batch.engine_logprobs[:, 1:] - old_logprobs).abs(),
                                                                    mask))
        logs["train/skipped_steps"] = float(self.skipped_steps)
        logs["timing_s/update"] = time.perf_counter() - t0
        if self.rv_collapse.update(logs.get("rollout/in_group_reward_std", 0.0)):
            logs["early_stopped/reward_variance_collapse"] = 1.0
            self._stop(f"in-group reward std stayed below {hp.rv_collapse_ratio} x its baseline "
                       f"({self.rv_collapse.baseline:.4g}) for {hp.rv_collapse_window} iterations")
        # 5. log
        self._log(logs)
        return None

    def _advantages(self, batch: RolloutBatch, mask, old_logprobs, ref_logprobs, values):
        hp = self.hparams
        return starpo_advantages(
            batch, mask, old_logprobs=old_logprobs, ref_logprobs=ref_logprobs, values=values,
            estimator=hp.adv_estimator, gamma=hp.gamma, lam=hp.lam, turn_level_gae=hp.turn_level_gae,
            high_level_gamma=hp.high_level_gamma, kl_in_reward_coef=hp.kl_in_reward_coef, kl_kind=hp.kl_kind,
            soft_advantage_reweight=hp.soft_advantage_reweight, filter_loss_scaling=hp.filter_loss_scaling,
            length_weight=hp.length_weight, zero_task_advantage=hp.zero_task_advantage,
        )

    def _optimizers(self):
        opts = self.optimizers()
        return opts if isinstance(opts, list) else [opts]

    def _accumulate(self, opt, rows, loss_fn) -> dict[str, float]:
        """One optimizer step of ``opt``'s network over ``rows`` (:func:`ragen_lightning.starpo.update.accumulate`)."""
        out, stepped = accumulate(self, opt, rows, loss_fn, micro_batch_size=self.hparams.micro_batch_size,
                                  max_norm=self.hparams.grad_clip, pad_row=self._pad_row, on_step=self._step_scheduler)
        self.skipped_steps += not stepped
        return out

    def _step_scheduler(self, opt) -> None:
        """Advance the learning-rate warm-up of ``opt``'s network (one scheduler step per optimizer step)."""
        if self.hparams.lr_warmup_steps <= 0:
            return
        scheds = self.lr_schedulers()
        inner = getattr(opt, "optimizer", opt)  # Lightning wraps optimizers in LightningOptimizer
        for sched in scheds if isinstance(scheds, list) else [scheds]:
            if sched.optimizer is inner:
                sched.step()

    def _actor_step(self, d, mb, rows, first_pass: bool = True) -> dict[str, float]:
        """One actor optimizer step on mini-batch ``mb`` (global rows); this rank computes ``rows``."""
        hp = self.hparams
        horizon = d["mask"].shape[1]
        norm = agg_normalizer(d["mask"][mb], hp.loss_agg_mode, horizon=horizon)

        def loss_fn(micro):
            L = trimmed(d["att"], micro)
            need_entropy = hp.entropy_coeff != 0 or (first_pass and d["old_logprobs"] is None)
            lp, ent = actor_outputs(self.actor, d["ids"][micro, :L], d["att"][micro, :L], with_entropy=need_entropy,
                                    temperature=hp.temperature, chunk_size=hp.logits_chunk_size)
            cut = lambda x: None if x is None else x[micro, : L - 1]  # noqa: E731
            if first_pass and d["old_logprobs"] is None:
                d["seen_logprobs"][micro, : L - 1] = lp.detach().float()
                d["seen_entropy"][micro, : L - 1] = ent.detach().float()
            old = cut(d["old_logprobs"]) if d["old_logprobs"] is not None else lp.detach()
            is_w = tis_weights(old, cut(d["engine_logprobs"]), hp.tis_cap) if hp.tis_cap is not None else None
            return actor_loss(lp, old, cut(d["advantages"]), cut(d["mask"]),
                              entropy=ent if hp.entropy_coeff != 0 else None,
                              ref_logprobs=cut(d["ref_logprobs"]) if hp.use_kl_loss else None,
                              entropy_coeff=hp.entropy_coeff, kl_coef=hp.kl_coef if hp.use_kl_loss else 0.0,
                              kl_kind=hp.kl_kind, clip_low=hp.clip_low, clip_high=hp.clip_high,
                              dual_clip=hp.dual_clip, agg=hp.loss_agg_mode, normalizer=norm, horizon=horizon,
                              is_weights=is_w)

        out = self._accumulate(self._optimizers()[0], rows, loss_fn)
        return {f"actor/{k}": v for k, v in out.items()}

    def _critic_step(self, d, mb, rows) -> dict[str, float]:
        norm = agg_normalizer(d["mask"][mb], "token-mean")

        def loss_fn(micro):
            L = trimmed(d["att"], micro)
            v = critic_values(self.critic, d["ids"][micro, :L], d["att"][micro, :L])
            loss, metrics = value_loss(v, d["values"][micro, : L - 1], d["returns"][micro, : L - 1],
                                       d["mask"][micro, : L - 1], clip_range=self.hparams.value_clip,
                                       agg="token-mean", normalizer=norm)
            metrics = dict(metrics, vf_loss=loss.detach(),
                           vpred_mean=aggregate(v.detach(), d["mask"][micro, : L - 1], normalizer=norm))
            return loss, metrics

        out = self._accumulate(self._optimizers()[1], rows, loss_fn)
        return {f"critic/{k}": v for k, v in out.items()}

    @staticmethod
    def _merge(acc: dict[str, list[float]], new: dict[str, float]) -> None:
        for k, v in new.items():
            acc.setdefault(k, []).append(v)

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
            self.log("val_success", metrics["val/success"], prog_bar=True, on_epoch=True, batch_size=1,
                     sync_dist=True)
            if not self.trainer.sanity_checking and self.trainer.state.fn == "fit" and \
                    self.low_val_success.update(metrics["val/success"]):
                self._stop(f"validation success below {self.hparams.low_val_success_threshold} for "
                           f"{self.hparams.low_val_success_patience} validations in a row")

    def _stop(self, reason: str) -> None:
        rank_zero_warn(f"early stop: {reason}")
        self.trainer.should_stop = True

    # -- checkpoints and export -----------------------------------------------------------------------------------
    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        checkpoint["starpo"] = {"skipped_steps": self.skipped_steps,
                                "model_path": str(getattr(self, "_model_path", self.hparams.model)),
                                "rv_collapse": self.rv_collapse.state_dict(),
                                "low_val_success": self.low_val_success.state_dict()}
        if self._lora is not None:
            checkpoint["state_dict"] = lora_mod.trainable_state(self, checkpoint["state_dict"])

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        state = checkpoint.get("starpo", {})
        if self._lora is not None and self.actor is not None:
            lora_mod.check_trainable_state(self, checkpoint["state_dict"])
        self.skipped_steps = int(state.get("skipped_steps", 0))
        self.rv_collapse.load_state_dict(state.get("rv_collapse", {}))
        self.low_val_success.load_state_dict(state.get("low_val_success", {}))

    def export_actor(self, path: str | Path) -> Path:
        """Save the actor and tokenizer as a HF folder (loadable without this package); under LoRA the adapter in
        peft format (``PeftModel.from_pretrained(base, path)``) and, with ``lora.export_merged``, full weights in
        ``path/merged``.

        Under FSDP2 every rank must call it (the full weights are gathered from the shards); rank 0 writes.
        """
        path = Path(path)
        if self._lora is not None:
            return lora_mod.export_adapter(self.actor, self.tokenizer, path, dtype=models.torch_dtype(self.hparams.dtype),
                                           base_path=str(getattr(self, "_model_path", None)
                                                         or models.resolve_model_path(self.hparams.model)),
                                           merged=self._lora.export_merged)
        actor = self.actor
        if self._rollout_actor:
            engine = GatheredWeightsEngine(self.actor, self._rollout_actor[0], [0], 0)
            engine.sync_weights()  # collective
            actor = engine.model
            if world()[0] != 0:
                return path
        actor.save_pretrained(path)
        self.tokenizer.save_pretrained(path)
        return path

    def on_fit_end(self) -> None:
        if self.hparams.export_dir and (self.trainer.is_global_zero or self._rollout_actor):
            self.export_actor(self.hparams.export_dir)

