"""The settings of a StarPO run, in typed groups: ``--model.<group>.<name>`` on the command line,
nested in YAML like ``data.episode`` (``model: {advantage: {estimator: grpo}, loss: {clip_high:
0.28}}``).

Each group is a frozen dataclass that checks its own values when it is built
(:class:`~ragen_lightning.errors.ConfigError` naming the flag), so a bad value fails while the
command line is parsed, before anything is built. A group given as a plain dict (a checkpoint's
hyperparameters, a test) is turned into its dataclass by :func:`as_group`, which names an unknown
key. Combinations across groups (or with the data module's settings) are checked in :mod:`.checks`.

:data:`RENAMED` maps every flat ``--model.*`` flag of earlier versions to its place in a group: the command line
answers an old flag with one line naming the new spelling (:func:`renamed_flag_error`).
"""

from __future__ import annotations

import dataclasses
import functools
import re
import warnings
from dataclasses import dataclass
from typing import Any, TypeVar

from lightning.pytorch.cli import OptimizerCallable

from ragen_lightning.algos.advantages import FilterLossScaling
from ragen_lightning.algos.losses import KLKind, PolicyLossSettings
from ragen_lightning.errors import ConfigError, Domain, check_domains
from ragen_lightning.starpo.estimators import (
    DEFAULT_ESTIMATOR,
    ESTIMATORS,
    GAEOptions,
    OutcomeOptions,
    RFTOptions,
    get_estimator,
)
from ragen_lightning.starpo.scoring import ForwardSettings, MicroBatching
from ragen_lightning.types import RolloutBatch

_POSITIVE = Domain(low=0, low_open=True)
_NON_NEGATIVE = Domain(low=0)
_COUNT = Domain(low=1, integer=True)
_OPTIONAL_COUNT = Domain(low=1, integer=True, none=True)
_STEPS = Domain(low=0, integer=True)
# Bounds past which a value is a typo, not a setting (the fields' docs say why).
MIN_GRAD_CLIP = 1e-6
MAX_LR = 1.0
_RATE = Domain(0, MAX_LR, low_open=True)


@dataclass(frozen=True)
class AdvantageSettings:
    """How rewards become advantages (``--model.advantage.*``).

    Args:
        estimator: a registered advantage estimator (:mod:`ragen_lightning.registry`): ``gae``
            (PPO, with a critic), ``grpo``, ``drgrpo``, ``brpo``, ``arpo``, ``rft``,
            ``state_baseline``, ``state_grpo``, a ``package.module:name`` or an installed
            ``ragen_lightning.estimators`` entry point.
        options: the estimator's own options (its options dataclass's fields; null: its defaults),
            e.g. ``{threshold: 1.5}`` for ``rft``, ``{lam: 0.95}`` for ``gae`` (docs/settings.md).
        kl_in_reward_coef: if > 0, subtract ``coef * KL(old || reference)`` from the token rewards.
        kl_in_reward_kind: the KL estimator of that penalty (``k1``/``kl``, ``abs``, ``k2``/``mse``,
            ``k3``/``low_var_kl``).
        filter_loss_scaling: scale advantages by the filter's kept ratio: ``none`` | ``linear`` |
        ``sqrt``. length_weight: divide group-outcome advantages by relative response length.
        zero_task_advantage: zero the task advantage (entropy/KL-only ablation). floor: clamp
        advantages from below after normalisation (null: off; 0: learn from successes only).
    """

    estimator: str = DEFAULT_ESTIMATOR
    options: dict[str, Any] | None = None
    kl_in_reward_coef: float = 0.0
    kl_in_reward_kind: KLKind = "k1"
    filter_loss_scaling: FilterLossScaling = "none"
    length_weight: bool = False
    zero_task_advantage: bool = False
    floor: float | None = None

    def __post_init__(self):
        check_domains(
            "--model.advantage.",
            self,
            {"kl_in_reward_coef": _NON_NEGATIVE, "floor": Domain(high=0, none=True)},
        )  # a floor above 0 would reward every sample
        options = get_estimator(self.estimator).make_options(self.options)  # checks name, options
        if self.options is not None:  # None when not given: a parser's default fits every estimator
            object.__setattr__(self, "options", options)

    @functools.cached_property
    def estimator_options(self) -> Any:
        """The estimator's options, its defaults filled in (None for one without options)."""
        return get_estimator(self.estimator).make_options(self.options)


@dataclass(frozen=True)
class CriticSettings:
    """The critic, built only for an estimator that needs one (``--model.critic.*``).

    Args:
        model: the critic's base model (null: the actor's).
        value_clip: value clipping range of the critic's loss. in_background: the critic's steps of
        an iteration run on a worker thread during the next rollout (one
            process; same math; critic metrics logged one iteration late; :mod:`.background`).
    """

    model: str | None = None
    value_clip: float = 0.5
    in_background: bool = False

    def __post_init__(self):
        _POSITIVE.check("--model.critic.value_clip", self.value_clip)


@dataclass(frozen=True)
class OptimSettings:
    """The optimizers and what guards their steps (``--model.optim.*``).

    Args:
        actor_lr: actor learning rate (AdamW) when ``actor_optimizer`` is not given; in (0, 1]: an AdamW step moves
            every weight by about the rate, so above 1 a step moves weights past their own scale
            (typical: 1e-6-1e-3).
        critic_lr: critic learning rate (AdamW) when ``critic_optimizer`` is not given; in (0, 1]
        likewise. weight_decay: AdamW weight decay. grad_clip: max global grad norm per network (0
        disables clipping); else at least 1e-6: a smaller bound
            scales every step to almost nothing, so training silently stops (typical values 0.5-1).
        warmup_steps: linear warm-up over each network's first N steps (0: off; Adam's first steps
        can break a format). decay_iterations: cosine decay of both rates to 10 % over the first N
        iterations, then held (0: constant). max_step_kl: undo an actor step whose KL on its own
        rows exceeds this (null: off; ``ppo.step_kl``). max_consecutive_skips: stop after N skipped
        steps of one network in a row (non-finite, or over
            ``max_step_kl``); 0: never.
        actor_optimizer: optimizer factory for the actor (overrides ``actor_lr``), e.g.
        ``torch.optim.SGD``. critic_optimizer: optimizer factory for the critic (overrides
        ``critic_lr``).
    """

    actor_lr: float = 1e-6
    critic_lr: float = 1e-5
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    warmup_steps: int = 0
    decay_iterations: int = 0
    max_step_kl: float | None = None
    max_consecutive_skips: int = 5
    actor_optimizer: OptimizerCallable | None = None
    critic_optimizer: OptimizerCallable | None = None

    def __post_init__(self):
        check_domains(
            "--model.optim.",
            self,
            {
                "actor_lr": _RATE,
                "critic_lr": _RATE,
                "weight_decay": _NON_NEGATIVE,
                "grad_clip": Domain(low=MIN_GRAD_CLIP, special=(0,)),  # 0 turns clipping off
                "warmup_steps": _STEPS,
                "decay_iterations": _STEPS,
                "max_consecutive_skips": _STEPS,
                "max_step_kl": Domain(low=0, low_open=True, none=True),
            },
        )
        for name in ("actor_optimizer", "critic_optimizer"):
            # a checkpoint's hyperparameters name the factory: not code
            if isinstance(getattr(self, name), str):
                warnings.warn(
                    f"--model.optim.{name} {getattr(self, name)} from saved hyperparameters cannot be "
                    "rebuilt; AdamW with the saved learning rate is used unless you pass it again",
                    stacklevel=3,
                )
                object.__setattr__(self, name, None)

    def as_hparams(self) -> dict[str, Any]:
        """The settings as saved with a checkpoint: the optimizer factories by class path (they are
        code)."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        for name in ("actor_optimizer", "critic_optimizer"):
            out[name] = _factory_name(out[name])
        return out


@dataclass(frozen=True)
class UpdateSettings:
    """How a rollout batch is split into optimizer steps and forward passes (``--model.update.*``).

    Args:
        ppo_epochs: passes over each rollout batch.
        mini_batch_size: samples per optimizer step. micro_batch_size: samples per forward/backward
        (gradient accumulation inside a mini-batch). shuffle: shuffle samples before splitting into
        mini-batches (seeded by the iteration). micro_batch_threads: micro-batches run at once on
        CPU threads (one process, ``*-true`` precision). logprob_micro_batch_size: micro-batch size
        of the no-grad scoring passes (null: ``micro_batch_size``). logits_chunk_size: rows per
        chunk when computing log-probs/entropy from logits (bounds memory).
        activation_checkpointing: recompute each transformer block in backward (less memory, one
        more forward). micro_batch_tokens: form micro-batches by this token budget instead of
        ``micro_batch_size`` rows (rows
            sorted by length fill each up to the budget: padded rows x longest row, or packed the sum of lengths;
            the scoring passes too). Bounds activation memory by tokens, not rows; null: by rows.
        pack: run each micro-batch's rows as one sequence without padding (attention inside each
        row; exact).
    """

    ppo_epochs: int = 1
    mini_batch_size: int = 32
    micro_batch_size: int = 4
    shuffle: bool = False
    micro_batch_threads: int = 1
    logprob_micro_batch_size: int | None = None
    logits_chunk_size: int | None = None
    activation_checkpointing: bool = False
    micro_batch_tokens: int | None = None
    pack: bool = False

    def __post_init__(self):
        check_domains(
            "--model.update.",
            self,
            {
                "ppo_epochs": _COUNT,
                "mini_batch_size": _COUNT,
                "micro_batch_size": _COUNT,
                "micro_batch_threads": _COUNT,
                "logprob_micro_batch_size": _OPTIONAL_COUNT,
                "logits_chunk_size": _OPTIONAL_COUNT,
                "micro_batch_tokens": _OPTIONAL_COUNT,
            },
        )

        if self.micro_batch_size > self.mini_batch_size:
            raise ConfigError(
                f"--model.update.micro_batch_size ({self.micro_batch_size}) must be <= "
                f"--model.update.mini_batch_size ({self.mini_batch_size})"
            )

    @property
    def scoring_micro_batch_size(self) -> int:
        return self.logprob_micro_batch_size or self.micro_batch_size

    @property
    def micro_batching(self) -> MicroBatching:
        """How an optimizer step's rows split into micro-batches."""
        return MicroBatching(
            self.micro_batch_size, self.micro_batch_tokens, self.pack, self.micro_batch_threads
        )


G = TypeVar("G")
GROUPS: dict[str, type] = {
    "advantage": AdvantageSettings,
    "loss": PolicyLossSettings,
    "critic": CriticSettings,
    "optim": OptimSettings,
    "update": UpdateSettings,
}


def as_group(cls: type[G], value: G | dict[str, Any] | None, flag: str) -> G:
    """``value`` as the settings dataclass ``cls``: an instance as is, a dict (hyperparameters,
    YAML) field by field (an unknown key is a :class:`ConfigError` naming ``flag.<key>`` and the
    known ones), None: the defaults."""
    if value is None:
        return cls()
    if isinstance(value, cls):
        return value
    if not isinstance(value, dict):
        raise ConfigError(f"{flag} must be a mapping of its settings, got {value!r}")
    names = [f.name for f in dataclasses.fields(cls)]
    unknown = [k for k in value if k not in names]
    if unknown:
        raise ConfigError(f"{flag}.{unknown[0]} is not a setting; {flag} has: {', '.join(names)}")
    return cls(**value)


def _factory_name(factory: Any) -> str | None:
    """An optimizer factory as text for the hyperparameters: ``torch.optim.SGD(lr=0.3, ...)``."""
    if factory is None:
        return None
    target = getattr(factory, "func", factory)
    args = getattr(factory, "args", ())
    cls = next((a for a in args if isinstance(a, type)), target)
    name = f"{getattr(cls, '__module__', '')}.{getattr(cls, '__qualname__', repr(cls))}"
    keywords = ", ".join(f"{k}={v!r}" for k, v in sorted(getattr(factory, "keywords", {}).items()))
    return f"{name}({keywords})"


# -- the flat flags of earlier versions ------------------------------------------------------------
_SAME_NAME = {group: [f.name for f in dataclasses.fields(cls)] for group, cls in GROUPS.items()}
RENAMED: dict[str, str] = {
    **{name: f"{group}.{name}" for group, names in _SAME_NAME.items() for name in names},
    "adv_estimator": "advantage.estimator",
    "advantage_floor": "advantage.floor",
    "loss_agg_mode": "loss.agg_mode",
    "critic_model": "critic.model",
    "critic_in_background": "critic.in_background",
    "lr_warmup_steps": "optim.warmup_steps",
    "lr_decay_iterations": "optim.decay_iterations",
    "use_kl_loss": "loss.kl_coef",
}
for _name in ("model", "value_clip", "options"):  # a flat flag of this name meant another group's
    RENAMED.pop(_name, None)
RENAMED["value_clip"] = "critic.value_clip"
# --model.advantage.<old> -> (its name among the options, the options dataclass that holds it)
MOVED_TO_OPTIONS: dict[str, tuple[str, type]] = {
    "gamma": ("gamma", GAEOptions),
    "lam": ("lam", GAEOptions),
    "turn_level_gae": ("turn_level", GAEOptions),
    "high_level_gamma": ("high_level_gamma", GAEOptions),
    "rft_threshold": ("threshold", RFTOptions),
    "rft_per_state": ("per_state", RFTOptions),
    "soft_reweight": ("soft_reweight", OutcomeOptions),
}
RENAMED.update({old: f"advantage.options.{new}" for old, (new, _) in MOVED_TO_OPTIONS.items()})
RENAMED["soft_advantage_reweight"] = RENAMED["soft_reweight"]
_NOTES = {
    "use_kl_loss": " (a KL loss is on when its coefficient is > 0)",
    "kl_kind": " (the KL-in-reward penalty has its own: --model.advantage.kl_in_reward_kind)",
}


def _moved_note(old: str) -> str:
    owners = [e.name for e in ESTIMATORS.values() if e.options is MOVED_TO_OPTIONS[old][1]]
    return f" (an option of --model.advantage.estimator {' / '.join(owners)})"


def renamed_flag_error(message: str) -> str | None:
    """The one-line error for a parse error that is about a flat ``--model.<name>`` flag of earlier
    versions (``--model.adv_estimator was renamed: use --model.advantage.estimator``) or about a
    ``--model.advantage.*`` setting that became an estimator's option, else None."""
    given = re.findall(r"(?:model\.|')advantage\.(\w+)", message)
    if "model.advantage" in message:
        given += re.findall(r"Option '(\w+)' is not accepted", message)
    for old in given:
        if old in MOVED_TO_OPTIONS:
            return (
                f"--model.advantage.{old} was renamed: use --model.{RENAMED[old]}{_moved_note(old)}"
            )
    for name in re.findall(r"model\.(\w+)", message):
        if name in RENAMED and "." not in name:
            note = _moved_note(name) if name in MOVED_TO_OPTIONS else _NOTES.get(name, "")
            return f"--model.{name} was renamed: use --model.{RENAMED[name]}{note}"
    return None


@dataclass(frozen=True)
class ModuleSettings:
    """Every settings group of a :class:`~ragen_lightning.starpo.module.StarPOModule`, plus the
    rollouts' sampling temperature (``--data.sampling.temperature``, which the trained log-probs are
    computed at)."""

    advantage: AdvantageSettings = AdvantageSettings()
    loss: PolicyLossSettings = PolicyLossSettings()
    critic: CriticSettings = CriticSettings()
    optim: OptimSettings = OptimSettings()
    update: UpdateSettings = UpdateSettings()
    temperature: float = 1.0

    @classmethod
    def build(cls, temperature: float = 1.0, **groups: Any) -> ModuleSettings:
        """From groups given as dataclasses, dicts (parsed YAML, hyperparameters) or None
        (defaults)."""
        unknown = sorted(set(groups) - set(GROUPS))
        if unknown:
            raise ConfigError(
                f"--model.{unknown[0]} is not a settings group; the groups are {', '.join(GROUPS)}"
            )
        return cls(
            **{
                name: as_group(kind, groups.get(name), f"--model.{name}")
                for name, kind in GROUPS.items()
            },
            temperature=temperature,
        )

    @property
    def forward(self) -> ForwardSettings:
        """How the update's forward passes run: at the rollouts' temperature, the common prefix once
        unless activation checkpointing recomputes blocks (they would append to the cache twice)."""
        u = self.update
        return ForwardSettings(
            self.temperature,
            u.logits_chunk_size,
            share_prefix=not u.activation_checkpointing,
            pack=u.pack,
        )

    @property
    def uses_reference(self) -> bool:
        """A KL term (loss or reward penalty) needs the reference model."""
        return self.loss.kl_coef > 0 or self.advantage.kl_in_reward_coef > 0


def scores_in_update(s: ModuleSettings, batch: RolloutBatch) -> bool:
    """Whether the update's own forward passes supply the old log-probs and values (one epoch over
    one mini-batch runs them on the rollout weights: ratio 1), so the separate no-grad passes are
    skipped. Not with a KL-in-reward penalty (the advantages need old log-probs first) or chained
    GAE (returns need all rows)."""
    return (
        s.update.ppo_epochs == 1
        and len(batch) <= s.update.mini_batch_size
        and s.advantage.kl_in_reward_coef == 0
        and not batch.chains_turns
    )


def checkpoint_hparams(s: ModuleSettings, early_stop: Any, lora: Any) -> dict[str, Any]:
    """The settings groups as a checkpoint's hyperparameters hold them: plain dicts, the early stops
    and the LoRA settings (None: off) too, the optimizer factories by class path
    (:meth:`OptimSettings.as_hparams`)."""
    groups = (
        ("advantage", s.advantage),
        ("loss", s.loss),
        ("critic", s.critic),
        ("update", s.update),
        ("early_stop", early_stop),
    )
    hparams = {name: dataclasses.asdict(group) for name, group in groups}
    hparams["optim"] = s.optim.as_hparams()
    hparams["lora"] = dataclasses.asdict(lora) if lora is not None else None
    return hparams
