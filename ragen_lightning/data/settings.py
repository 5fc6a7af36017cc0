"""The data module's settings, in typed groups: ``--data.<group>.<name>`` on the command line,
nested in YAML.

Each group is a frozen dataclass that checks its own values when built (one line naming the flag);
what spans groups is checked once, in :func:`~ragen_lightning.data.checks.check_combinations`. The
episode, engine and filter groups live beside the code that uses them
(:mod:`ragen_lightning.rollout.settings`, :mod:`ragen_lightning.data.sampler`). :data:`RENAMED` maps
the flat ``--data.*`` flags of earlier versions to their new spelling: the command line answers an
old flag with one line naming it (:func:`renamed_flag_error`).

    data:
      env: {id: ragen/Bandit-v0, kwargs: {expert_policy: balanced}}
      training: {num_iterations: 48, num_groups: 8, group_size: 8}
      sampling: {temperature: 1.0}
      validation: {num_groups: 128, temperature: 0.5}
      engine: {name: auto}
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, fields
from typing import Any, get_args

from ragen_lightning.data.batching import NormGrouping, NormMethod, RewardPlacement
from ragen_lightning.data.sampler import FilterConfig
from ragen_lightning.errors import ConfigError, Domain, check_domains
from ragen_lightning.rollout.branching import BranchFollow
from ragen_lightning.rollout.settings import (
    ENGINE_PREFIX,
    EngineSettings,
    EpisodeSettings,
    VLLMSettings,
    as_episode,
    as_settings,
)

MAX_TEMPERATURE = 2.0  # vLLM's sampler takes at most 2 (and a flatter distribution samples noise)
_COUNT = Domain(low=1, integer=True)
_SEED = Domain(low=0, integer=True)  # numpy and gymnasium take non-negative seeds only
_TEMPERATURE = Domain(0, MAX_TEMPERATURE)  # 0 = greedy


def _choice(flag: str, value: Any, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ConfigError(f"{flag} must be one of {', '.join(map(repr, choices))}, got {value!r}")


@dataclass(frozen=True)
class EnvSettings:
    """What the rollouts play (``--data.env.*``; ``evaluate`` and ``warm_start`` take the same).

    Args:
        id: gymnasium id of the task (``import envs`` registers ``ragen/*``; ``module:id`` also
            works); unset: ``ragen/SimpleSokoban-v0``, or the envs of ``mixture``.
        kwargs: keyword arguments of the env.
        mixture: several training envs in one batch: a list of entries ``{env_id, env_kwargs,
            num_groups, tag, episode}`` (:mod:`ragen_lightning.data.mixture`: seeds per tag,
            ``train/<tag>/*`` metrics); replaces ``id`` and ``kwargs``, which must then be unset.
    """

    id: str | None = None
    kwargs: dict[str, Any] | None = None
    mixture: list[dict[str, Any]] | None = None

    def __post_init__(self) -> None:
        if self.id is not None and (not isinstance(self.id, str) or not self.id):
            raise ConfigError(f"--data.env.id must be a non-empty string, got {self.id!r}")
        if self.kwargs is not None and not isinstance(self.kwargs, dict):
            raise ConfigError(f"--data.env.kwargs must be a mapping, got {self.kwargs!r}")
        if self.mixture is not None:
            given = [f"--data.env.{k}" for k in ("id", "kwargs") if getattr(self, k) is not None]
            if given:
                raise ConfigError(
                    f"{' and '.join(given)} {'conflict' if len(given) > 1 else 'conflicts'} "
                    "with --data.env.mixture, whose entries name the training envs (env_id, "
                    f"env_kwargs): leave {' and '.join(given)} unset"
                )


@dataclass(frozen=True)
class TrainingSettings:
    """The training rollouts of a run (``--data.training.*``).

    Args:
        num_iterations: StarPO iterations (rollout + update) of a fit; the one place that sets the
            run length.
        num_groups: env groups per iteration (each group shares one initial state); with several
            processes it must be divisible by their number. With ``--data.env.mixture``: the groups
            of an entry that names none.
        group_size: rollouts per group.
        seed: first training reset seed (iteration ``n`` resets group ``g`` with ``seed + n *
            num_groups + g``).
        empty_stop_steps: stop after this many consecutive iterations whose filter kept nothing (0 =
            never).
        async_level: 0: every rollout is generated with the weights it trains (on-policy); 1:
            iteration ``k + 1``'s rollout is generated on a worker thread, with the weights
            iteration ``k``'s update starts from, while that update runs
            (:mod:`ragen_lightning.data.ahead`; needs ``--model.loss.tis_cap``).
    """

    num_iterations: int = 200
    num_groups: int = 8
    group_size: int = 16
    seed: int = 10000
    empty_stop_steps: int = 5
    async_level: int = 0

    def __post_init__(self) -> None:
        if isinstance(self.async_level, int) and self.async_level > 1:
            raise ConfigError(
                f"--data.training.async_level {self.async_level}: only 1 (one rollout in flight, "
                "one update old) is built; more needs a bounded buffer of rollouts sampled with "
                "several older weights"
            )
        check_domains(
            "--data.training.",
            self,
            {
                "num_iterations": _COUNT,
                "num_groups": _COUNT,
                "group_size": _COUNT,
                "seed": _SEED,
                "empty_stop_steps": Domain(low=0, integer=True),
                "async_level": Domain(0, 1, integer=True),
            },
        )


@dataclass(frozen=True)
class SamplingSettings:
    """How the training rollouts sample (``--data.sampling.*``); the update's log-probs use the same
    temperature.

    Args:
        temperature: sampling temperature, in [0, 2] (vLLM's range).
        top_p: nucleus sampling mass.
        top_k: top-k (-1 = off).
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1

    def __post_init__(self) -> None:
        check_domains(
            "--data.sampling.",
            self,
            {
                "temperature": _TEMPERATURE,
                "top_p": Domain(0, 1, low_open=True),
                "top_k": Domain(low=1, integer=True, special=(-1,)),
            },
        )


@dataclass(frozen=True)
class ValidationSettings:
    """The fixed validation rollout (``--data.validation.*``): the same seeds every time,
    unfiltered.

    Args:
        num_groups: validation episodes (groups of ``group_size``); divisible by the number of
            processes. With a mixture or ``suite``: the groups of each entry that names none.
        group_size: rollouts per initial state (pass@k uses it).
        temperature: sampling temperature (0 = greedy; at most 2).
        seed: first reset seed (group ``g`` resets with ``seed + g``).
        suite: validation entries (keys of ``--data.env.mixture``'s; ``num_groups`` groups of
            ``group_size``), logged as ``val/<tag>/*`` and pooled as ``val/*``; unset: the training
            env(s).
    """

    num_groups: int = 64
    group_size: int = 1
    temperature: float = 0.5
    seed: int = 123
    suite: list[dict[str, Any]] | None = None

    def __post_init__(self) -> None:
        check_domains(
            "--data.validation.",
            self,
            {
                "num_groups": _COUNT,
                "group_size": _COUNT,
                "temperature": _TEMPERATURE,
                "seed": _SEED,
            },
        )


@dataclass(frozen=True)
class RewardSettings:
    """Where rewards land and how scores are normalised (``--data.rewards.*``).

    Args:
        placement: ``last`` (episode score on the last sampled token) or ``turn`` (each turn's
            reward at its end).
        norm_grouping: score normalisation groups: ``state`` (per group), ``env`` (all episodes of
            one mixture entry; RAGEN's ``inductive``) or ``batch``.
        norm_method: ``identity`` | ``mean`` | ``mean_std`` | ``asym_clip``; ``identity`` with
            ``placement: turn``.
    """

    placement: RewardPlacement = "last"
    norm_grouping: NormGrouping = "state"
    norm_method: NormMethod = "identity"

    def __post_init__(self) -> None:
        _choice("--data.rewards.placement", self.placement, get_args(RewardPlacement))
        _choice("--data.rewards.norm_grouping", self.norm_grouping, get_args(NormGrouping))
        _choice("--data.rewards.norm_method", self.norm_method, get_args(NormMethod))
        if self.placement == "turn" and self.norm_method != "identity":
            raise ConfigError(
                "--data.rewards.norm_method must be 'identity' with --data.rewards.placement turn"
            )


@dataclass(frozen=True)
class BranchingSettings:
    """Several responses per visited state (``--data.branching.*``; ``RolloutRunner``, "Branching").

    Args:
        branches: training responses sampled per turn: the episode continues with one; each other
            one runs that turn on a copy of the env and is an extra one-turn sample scored by its
            own turn reward. > 1 needs ``--data.rewards.placement turn``, a windowed
            ``episode.context_window``, an env with ``branchable = True`` and an estimator that
            scores samples by turn reward. Validation never branches.
        follow: the response a branching episode continues with: ``first`` (the policy's plain play)
            or ``best`` (the best-scored, first on ties: training success then measures that search,
            not the policy).
    """

    branches: int = 1
    follow: BranchFollow = "first"

    def __post_init__(self) -> None:
        _COUNT.check("--data.branching.branches", self.branches)
        _choice("--data.branching.follow", self.follow, get_args(BranchFollow))
        if self.follow == "best" and self.branches == 1:
            raise ConfigError(
                "--data.branching.follow best needs --data.branching.branches > 1: it picks among "
                "the responses sampled for one state"
            )


# The groups of ``RolloutDataModule(...)`` (its parameters, in order) but the filter's, which its
# own module owns.
GROUPS: dict[str, type] = {
    "env": EnvSettings,
    "training": TrainingSettings,
    "episode": EpisodeSettings,
    "sampling": SamplingSettings,
    "validation": ValidationSettings,
    "rewards": RewardSettings,
    "branching": BranchingSettings,
    "engine": EngineSettings,
}


def as_group(name: str, value: Any) -> Any:
    """``value`` (an instance, a mapping or None) as the settings group ``--data.<name>``."""
    if name == "episode":
        return as_episode(value)
    return as_settings(GROUPS[name], value, f"--data.{name}")


@dataclass(frozen=True)
class DataSettings:
    """Every group of a :class:`~ragen_lightning.data.datamodule.RolloutDataModule`, checked
    together when built (:func:`check_combinations`). ``filter`` is the rollout filter's group
    (:mod:`ragen_lightning.data.sampler`)."""

    env: EnvSettings = EnvSettings()
    training: TrainingSettings = TrainingSettings()
    episode: EpisodeSettings = EpisodeSettings()
    sampling: SamplingSettings = SamplingSettings()
    validation: ValidationSettings = ValidationSettings()
    rewards: RewardSettings = RewardSettings()
    branching: BranchingSettings = BranchingSettings()
    filter: FilterConfig = field(default_factory=FilterConfig)  # (not frozen yet: a factory)
    engine: EngineSettings = EngineSettings()

    def __post_init__(self) -> None:
        check_combinations(self)

    @classmethod
    def build(cls, **groups: Any) -> DataSettings:
        """From groups given as dataclasses, mappings (parsed YAML, a checkpoint's hyperparameters)
        or None."""
        known = {f.name for f in fields(cls)}
        if unknown := sorted(set(groups) - known):
            raise ConfigError(
                renamed_flag_error(f"data.{unknown[0]}")
                or f"--data.{unknown[0]} is not a setting; the groups are "
                f"{', '.join(sorted(known))}"
            )
        values = {name: as_group(name, groups.get(name)) for name in GROUPS}
        filt = groups.get("filter")
        values["filter"] = (
            filt
            if isinstance(filt, FilterConfig)
            else FilterConfig(**(filt.as_dict() if hasattr(filt, "as_dict") else filt or {}))
        )
        return cls(**values)


def check_combinations(s: DataSettings) -> None:
    """The ``--data.*`` settings that cannot work together (each group checked its own values
    already); one line naming the flags."""
    if s.branching.branches > 1 and (
        s.rewards.placement != "turn" or s.episode.context_window == "full"
    ):
        raise ConfigError(
            "--data.branching.branches > 1 needs --data.rewards.placement turn and a windowed "
            "--data.episode.context_window (limited or single_turn): each branch is a one-turn "
            "sample scored by its own turn reward"
        )
    if getattr(s.filter, "over", "groups") == "states" and s.branching.branches < 2:
        raise ConfigError(
            "--data.filter.over states selects among the responses to each visited state: it needs "
            "--data.branching.branches > 1 (else use over: groups)"
        )
    tp = s.engine.tensor_parallel_size
    if s.training.async_level and tp > 1:
        raise ConfigError(
            f"--data.training.async_level 1 with --data.engine.vllm.tensor_parallel_size {tp}: "
            f"one engine spans {tp} ranks and its collectives would run on the rollout worker "
            "beside the update's; use one engine per rank (tensor_parallel_size 1) or "
            "async_level 0"
        )


# -- the flat flags of earlier versions
# ---------------------------------------------------------------------------
RENAMED: dict[str, str] = {
    "env_id": "env.id",
    "env_kwargs": "env.kwargs",
    "mixture": "env.mixture",
    "num_iterations": "training.num_iterations",
    "num_groups": "training.num_groups",
    "group_size": "training.group_size",
    "train_seed": "training.seed",
    "empty_stop_steps": "training.empty_stop_steps",
    "async_level": "training.async_level",
    "temperature": "sampling.temperature",
    "top_p": "sampling.top_p",
    "top_k": "sampling.top_k",
    "val_num_groups": "validation.num_groups",
    "val_group_size": "validation.group_size",
    "val_temperature": "validation.temperature",
    "val_seed": "validation.seed",
    "val_suite": "validation.suite",
    "reward_placement": "rewards.placement",
    "norm_grouping": "rewards.norm_grouping",
    "norm_method": "rewards.norm_method",
    "branches": "branching.branches",
    "branch_follow": "branching.follow",
    "max_batch_size": "engine.max_batch_size",
    "vllm": "engine.vllm",
}
_VLLM_FIELDS = tuple(f.name for f in fields(VLLMSettings))


def renamed_flag_error(message: str) -> str | None:
    """The one-line error for a parse error about a ``--data.*`` flag of earlier versions
    (``--data.env_id was
    renamed: use --data.env.id``; ``--data.engine vllm`` -> ``--data.engine.name vllm``), else
    None."""
    for path in re.findall(r"(?<!\w)data\.([\w.]+)", message):
        head, _, rest = path.partition(".")
        if head in RENAMED and (not rest or head == "vllm" and rest.split(".")[0] in _VLLM_FIELDS):
            old, new = f"--data.{path}", f"--data.{RENAMED[head]}" + (f".{rest}" if rest else "")
            return f"{old} was renamed: use {new}"
    if re.search(r"data\.engine\b(?!\.)", message) and re.search(r"\b(hf|vllm|auto)\b", message):
        return (
            f"--data.engine takes a group now: use {ENGINE_PREFIX}name "
            "(e.g. --data.engine.name vllm)"
        )
    return None
