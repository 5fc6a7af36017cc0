"""Combinations of settings that cannot work, refused before anything is built (one line each); each
settings group checks its own values (:mod:`.settings`)."""

from __future__ import annotations

import warnings
from typing import Any

from ragen_lightning.data.settings import DataSettings
from ragen_lightning.errors import ConfigError
from ragen_lightning.starpo.estimators import RFTOptions, estimators_where, get_estimator
from ragen_lightning.starpo.settings import AdvantageSettings, ModuleSettings


def check_module_settings(s: ModuleSettings, lora) -> None:
    """Raise :class:`ConfigError` naming the flag for the first combination of the module's settings
    groups that cannot work (each group checked its own values when it was built; ``lora``: the
    parsed
    :class:`~ragen_lightning.models.lora.LoraSettings` or None)."""
    adv, loss, estimator = s.advantage, s.loss, get_estimator(s.advantage.estimator)
    if adv.length_weight and not estimator.outcome:
        raise ConfigError(
            "--model.advantage.length_weight applies to the group-outcome estimators "
            f"({', '.join(estimators_where(outcome=True))}), not {estimator.name}"
        )
    if not s.temperature > 0 or s.temperature == float("inf"):  # NaN fails the first test
        raise ConfigError(
            f"--data.sampling.temperature must be a number > 0 for training rollouts, got {s.temperature}: "
            "the trained log-probs are those of logits / temperature (0 divides by zero); greedy "
            "decoding is for validation: --data.validation.temperature 0"
        )
    if loss.tis_cap is not None and s.temperature != 1.0:
        raise ConfigError(
            "--model.loss.tis_cap needs --data.sampling.temperature 1 (engine log-probs are the raw model's), "
            f"got temperature={s.temperature}"
        )
    if loss.kl_coef > 0 and loss.kl_kind in ("k1", "kl"):
        warnings.warn(
            "--model.loss.kl_coef > 0 with --model.loss.kl_kind k1: as a loss on sampled tokens its gradient "
            "is zero in expectation, so it pulls nothing towards the reference; --model.loss.kl_kind "
            "low_var_kl (k3) does",
            stacklevel=2,
        )
    if lora is not None and lora.shared_base and s.critic.model is not None:
        raise ConfigError(
            "--model.lora.shared_base uses the actor's model for the critic: unset --model.critic.model"
        )


def check_data_settings(
    adv: AdvantageSettings, data: DataSettings | None, tis_cap: float | None = None
) -> None:
    """Combinations of the advantage settings (and ``--model.loss.tis_cap``) and the data module's
    settings that cannot work."""
    if data is None:
        return
    if data.training.async_level and tis_cap is None:
        raise ConfigError(
            "--data.training.async_level 1 trains on rollouts sampled one update earlier: set "
            "--model.loss.tis_cap (e.g. 2.0), the cap of the importance weight that corrects the update "
            "with the rollout's own log-probs"
        )
    estimator, branches = get_estimator(adv.estimator), data.branching.branches
    flag = f"--model.advantage.estimator {estimator.name}"
    if estimator.groups and data.training.group_size < 2:
        raise ConfigError(f"--data.training.group_size must be >= 2 for {flag}")
    rft = adv.estimator_options
    if isinstance(rft, RFTOptions) and rft.per_state and branches == 1:
        warnings.warn(
            "--model.advantage.options.per_state has no effect without "
            "--data.branching.branches > 1 (every state then has one response)",
            stacklevel=2,
        )
    if branches > 1 and not estimator.per_sample:
        raise ConfigError(
            f"--data.branching.branches {branches} needs an estimator that scores every sample by its "
            f"own turn reward ({', '.join(estimators_where(per_sample=True))}), not {estimator.name}: "
            "GAE chains an episode's samples and the group-outcome estimators read the episode score"
        )
    placement = data.rewards.placement
    if estimator.branching and (branches < 2 or placement != "turn"):
        raise ConfigError(
            f"{flag} compares the K responses of each visited state by their turn rewards: it needs "
            f"--data.branching.branches >= 2 and --data.rewards.placement turn (got branches "
            f"{branches}, placement {placement!r})"
        )


def check_threads_precision(threads: int, precision: Any) -> None:
    """``--model.update.micro_batch_threads > 1`` calls autograd directly from worker threads,
    outside Lightning's precision plugin: a mixed precision (autocast is thread-local, and 16-bit
    needs loss scaling) would silently train in fp32 without scaling there, so it is refused."""
    name = str(precision if precision is not None else "32-true")
    if threads > 1 and ("mixed" in name or name in ("16", "bf16")):
        raise ConfigError(
            f"--model.update.micro_batch_threads {threads} runs backward outside Lightning's precision plugin, "
            f"which --trainer.precision {name} needs: use a '*-true' precision or micro_batch_threads 1"
        )
