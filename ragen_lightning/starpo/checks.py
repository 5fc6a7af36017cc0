"""Combinations of ``--model.*`` settings that cannot work, refused before anything is built (one line each)."""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any

from ragen_lightning.errors import ConfigError, Domain, check_domains

# branching rollouts' estimators that score a response against the other responses to its state
STATE_ESTIMATORS = ("state_baseline", "state_grpo")

_UNIT = Domain(0, 1)
_POSITIVE = Domain(low=0, low_open=True)
_NON_NEGATIVE = Domain(low=0)
_COUNT = Domain(low=1, integer=True)
# The allowed values of every numeric ``--model.*`` setting (the choices of the Literal ones are jsonargparse's).
MODULE_DOMAINS: dict[str, Domain] = {
    "gamma": _UNIT, "lam": _UNIT, "high_level_gamma": _UNIT,
    "ppo_epochs": _COUNT, "mini_batch_size": _COUNT, "micro_batch_size": _COUNT, "micro_batch_threads": _COUNT,
    "clip_low": Domain(0, 1, high_open=True),  # the ratio floor 1 - clip_low must stay > 0
    "clip_high": _NON_NEGATIVE,
    "dual_clip": Domain(low=1, low_open=True, none=True),  # the dual-clip bound c * A (A < 0) needs c > 1
    "value_clip": _POSITIVE,
    "entropy_coeff": _NON_NEGATIVE, "kl_coef": _NON_NEGATIVE, "kl_in_reward_coef": _NON_NEGATIVE,
    "actor_lr": _POSITIVE, "critic_lr": _POSITIVE, "weight_decay": _NON_NEGATIVE,
    "grad_clip": _NON_NEGATIVE,  # 0 turns clipping off
    "lr_warmup_steps": Domain(low=0, integer=True), "lr_decay_iterations": Domain(low=0, integer=True),
    "logprob_micro_batch_size": Domain(low=1, integer=True, none=True),
    "logits_chunk_size": Domain(low=1, integer=True, none=True),
    "tis_cap": Domain(low=0, low_open=True, none=True),
    "max_step_kl": Domain(low=0, low_open=True, none=True),
    "advantage_floor": Domain(high=0, none=True),  # a floor above 0 would reward every sample
}


def check_module_settings(hp: Mapping[str, Any], lora) -> None:
    """Raise :class:`ConfigError` naming the flag for the first value outside its domain (:data:`MODULE_DOMAINS`)
    or impossible combination of the module's hyperparameters ``hp`` (``lora``: the parsed
    :class:`~ragen_lightning.models.lora.LoraSettings` or None)."""
    check_domains("--model.", hp, MODULE_DOMAINS)
    micro, mini, estimator, tis_cap = hp["micro_batch_size"], hp["mini_batch_size"], hp["adv_estimator"], hp["tis_cap"]
    if micro > mini:
        raise ConfigError(f"--model.micro_batch_size ({micro}) must be <= --model.mini_batch_size ({mini})")
    if hp["turn_level_gae"] and estimator != "gae":
        raise ConfigError("--model.turn_level_gae needs --model.adv_estimator gae")
    if (hp["soft_advantage_reweight"] or hp["length_weight"]) and estimator in ("gae", "rft"):
        raise ConfigError("--model.soft_advantage_reweight / --model.length_weight apply to GRPO-family estimators")
    if hp.get("rft_per_state") and estimator != "rft":
        raise ConfigError("--model.rft_per_state needs --model.adv_estimator rft")
    if not hp["temperature"] > 0 or hp["temperature"] == float("inf"):  # NaN fails the first test
        raise ConfigError(f"--data.temperature must be a number > 0 for training rollouts, got {hp['temperature']}: "
                          "the trained log-probs are those of logits / temperature (0 divides by zero); greedy "
                          "decoding is for validation: --data.val_temperature 0")
    skips = hp["max_consecutive_skips"]
    if isinstance(skips, bool) or not isinstance(skips, int) or skips < 0:
        raise ConfigError(f"--model.max_consecutive_skips must be an int >= 0 (0: never stop), got {skips!r}")
    if tis_cap is not None and hp["temperature"] != 1.0:
        raise ConfigError("--model.tis_cap needs --data.temperature 1 (engine log-probs are the raw model's), "
                          f"got temperature={hp['temperature']}")
    if hp["use_kl_loss"] and hp["kl_coef"] == 0:
        raise ConfigError("--model.use_kl_loss needs --model.kl_coef > 0")
    if hp["use_kl_loss"] and hp["kl_kind"] in ("k1", "kl"):
        warnings.warn("--model.use_kl_loss with --model.kl_kind k1: as a loss on sampled tokens its gradient is zero in "
                      "expectation, so it pulls nothing towards the reference; --model.kl_kind low_var_kl (k3) does",
                      stacklevel=2)
    if lora is not None and lora.shared_base and hp["critic_model"] is not None:
        raise ConfigError("--model.lora.shared_base uses the actor's model for the critic: unset --model.critic_model")


def check_data_settings(hp: Mapping[str, Any], data_hp: Mapping[str, Any] | None) -> None:
    """Combinations of the module's and the data module's settings that cannot work."""
    if data_hp is not None and hp["adv_estimator"] in ("grpo", "drgrpo") and data_hp["group_size"] < 2:
        raise ConfigError(f"--data.group_size must be >= 2 for --model.adv_estimator {hp['adv_estimator']}")
    if data_hp is not None and hp.get("rft_per_state") and data_hp.get("branches", 1) == 1:
        warnings.warn("--model.rft_per_state has no effect without --data.branches > 1 (every state then has one "
                      "response)", stacklevel=2)
    estimator, branches = hp["adv_estimator"], (data_hp or {}).get("branches", 1)
    if data_hp is not None and branches > 1 and estimator not in ("rft", *STATE_ESTIMATORS):
        raise ConfigError(f"--data.branches {branches} needs --model.adv_estimator rft, state_baseline or state_grpo "
                          "(the estimators that score every sample by its own turn reward; GAE chains an episode's "
                          "samples and the GRPO family reads the episode score)")
    placement = (data_hp or {}).get("reward_placement")
    if data_hp is not None and estimator in STATE_ESTIMATORS and (branches < 2 or placement != "turn"):
        raise ConfigError(f"--model.adv_estimator {estimator} compares the K responses of each visited state by their "
                          "turn rewards: it needs --data.branches >= 2 and --data.reward_placement turn (got branches "
                          f"{branches}, reward_placement {placement!r})")


def check_threads_precision(threads: int, precision: Any) -> None:
    """``--model.micro_batch_threads > 1`` calls autograd directly from worker threads, outside Lightning's precision
    plugin: a mixed precision (autocast is thread-local, and 16-bit needs loss scaling) would silently train in fp32
    without scaling there, so it is refused."""
    name = str(precision if precision is not None else "32-true")
    if threads > 1 and ("mixed" in name or name in ("16", "bf16")):
        raise ConfigError(f"--model.micro_batch_threads {threads} runs backward outside Lightning's precision plugin, "
                          f"which --trainer.precision {name} needs: use a '*-true' precision or micro_batch_threads 1")
