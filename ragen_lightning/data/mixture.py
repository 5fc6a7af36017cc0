"""Environment mixtures: several environments in one training batch and validation on its own list.

``--data.env.mixture`` is a list of entries ``{env_id, env_kwargs, num_groups, tag, episode}``:
every entry contributes ``num_groups`` groups of ``--data.training.group_size`` rollouts to each
iteration's batch. ``--data.validation.suite`` is the same kind of list for validation (groups of
``--data.validation.group_size``). An entry is the evaluation suite's
:class:`~ragen_lightning.data.suite.SuiteEntry` with its count written ``num_groups``; an entry
without one takes ``--data.training.num_groups`` (training) or ``--data.validation.num_groups``
(validation), and ``episode`` overrides single episode settings for that env (a one-turn bandit
beside a multi-turn grid). Without ``--data.validation.suite`` validation runs every training entry
with ``--data.validation.num_groups`` groups. The single-env flags (``--data.env.id``,
``--data.env.kwargs``, ``--data.training.num_groups``) are a mixture of one entry with the seeds of
before (below); ``--data.env.id`` and ``--data.env.kwargs`` cannot be combined with
``--data.env.mixture``, which names the envs itself.

Batch layout: the entries' groups follow each other in list order (global group ids ``offset_e +
g``, members contiguous), so the reward-variance filter and the per-group normalisation see whole
groups as before. Each entry has its own :class:`~ragen_lightning.rollout.runner.RolloutRunner` (its
env, kwargs and episode settings); with several processes the concatenated list of groups is split
into equal contiguous shares (:func:`run_parts`), so a rank may run the end of one entry and the
start of the next, and the total number of groups must divide by the number of rollout ranks. Rows
of different entries may differ in length: the batch pads them.

Seeds per tag: an entry's episodes depend on its own tag and the run's seeds only, never on the
other entries (adding, removing or reordering entries leaves every other entry's episodes
unchanged). Iteration ``n`` of the training entry tagged ``t`` resets its groups with
``episode_seeds(train_seed, num_groups, "train/<t>/<n>")`` (distinct 32-bit seeds, never one of the
validation seeds of the same tag); validation entry ``t`` always uses ``episode_seeds(val_seed,
num_groups, "val/<t>")`` (:func:`~ragen_lightning.rollout.seeds.episode_seeds`, the warm start's and
the evaluation's seed streams). Generation seeds are per tag too (:func:`generation_seed`). The
single-env flags keep RAGEN's linear stream (``train_seed + n * num_groups + g``, validation
``val_seed + g``).

Metric names: besides the aggregate ``train/*`` and ``val/*`` over all entries' episodes (pooled, so
weighted by episode counts), every rollout statistic is logged per entry as ``train/<tag>/<name>``
and ``val/<tag>/<name>`` (``success``, ``return``, ``score``, ``format_error_rate``, ``pass@k``,
...). Tags are sanitised for metric keys: every run of characters other than ASCII letters, digits,
``_``, ``-`` and ``.`` becomes one ``_`` (a tag defaults to the env id, so ``ragen/Bandit-v0`` logs
as ``train/ragen_Bandit-v0/success``); two tags of one list that sanitise to the same name are
refused.
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from ragen_lightning.data.batching import rollout_metrics
from ragen_lightning.data.suite import SuiteEntry, as_entry
from ragen_lightning.errors import ConfigError
from ragen_lightning.parallel import group_share
from ragen_lightning.rollout.engine import SamplingParams
from ragen_lightning.rollout.runner import RolloutRunner
from ragen_lightning.rollout.seeds import episode_seeds
from ragen_lightning.rollout.settings import EpisodeSettings
from ragen_lightning.types import Trajectory

if TYPE_CHECKING:
    from ragen_lightning.data.settings import DataSettings

DEFAULT_ENV_ID = "ragen/SimpleSokoban-v0"  # --data.env.id when neither it nor a mixture is given
TRAIN_FLAG, VAL_FLAG = "--data.env.mixture", "--data.validation.suite"
_UNSAFE = re.compile(r"[^A-Za-z0-9_.\-]+")


def metric_name(tag: str) -> str:
    """``tag`` as it appears in metric keys (module docstring: runs of other characters become
    ``_``)."""
    return _UNSAFE.sub("_", tag)


def parse_entries(values: Any, flag: str, default_groups: int) -> list[SuiteEntry]:
    """The entries of ``--data.env.mixture`` / ``--data.validation.suite`` (``flag``); errors name
    the flag and the entry."""
    if not isinstance(values, (list, tuple)) or not values:
        raise ConfigError(
            f"{flag} must be a non-empty list of entries {{env_id, env_kwargs, num_groups, tag, "
            f"episode}}, got {values!r}"
        )
    entries = [
        as_entry(v, f"{flag}[{i}]", count="num_groups", default_count=default_groups)
        for i, v in enumerate(values)
    ]
    names: dict[str, int] = {}
    for i, e in enumerate(entries):
        name = metric_name(e.tag)
        if name in names:
            j = names[name]
            same = (
                "share the tag"
                if entries[j].tag == e.tag
                else "have tags that give the same metric name"
            )
            raise ConfigError(
                f"{flag}[{j}] and {flag}[{i}] {same} {name!r}: give each entry its own tag"
            )
        names[name] = i
    return entries


def is_mixture(s: DataSettings) -> bool:
    """Training from ``--data.env.mixture`` (per-tag seeds and metrics) rather than the single
    env."""
    return s.env.mixture is not None


def train_entries(s: DataSettings) -> list[SuiteEntry]:
    """The training entries: ``--data.env.mixture``, else one entry of ``--data.env.id`` /
    ``kwargs``."""
    if not is_mixture(s):
        return [SuiteEntry(s.env.id or DEFAULT_ENV_ID, s.env.kwargs, s.training.num_groups)]
    return parse_entries(s.env.mixture, TRAIN_FLAG, s.training.num_groups)


def val_entries(s: DataSettings) -> list[SuiteEntry]:
    """The validation entries: ``--data.validation.suite``, else the training entries with
    ``--data.validation.num_groups``."""
    if s.validation.suite is not None:
        return parse_entries(s.validation.suite, VAL_FLAG, s.validation.num_groups)
    return [replace(e, num_episodes=s.validation.num_groups) for e in train_entries(s)]


def check_entry_episode(entry: SuiteEntry, base: EpisodeSettings, where: str) -> EpisodeSettings:
    """``entry``'s episode settings; an entry may not raise ``max_model_len`` above the run's (the
    engine is sized for it)."""
    try:
        episode = entry.episode_settings(base)
    except ConfigError as e:
        raise ConfigError(f"{where}: {e}") from None
    if episode.max_model_len > base.max_model_len:
        raise ConfigError(
            f"{where} ({entry.tag!r}): episode.max_model_len {episode.max_model_len} exceeds "
            f"--data.episode.max_model_len {base.max_model_len}, which sizes the engine"
        )
    return episode


def train_seeds(
    entry: SuiteEntry, train_seed: int, iteration: int, exclude: Sequence[int] = ()
) -> list[int]:
    """Reset seeds of training entry ``entry`` at ``iteration`` (module docstring); ``exclude``: its
    tag's validation seeds. A seed listed there is skipped and the draw goes on, so the others never
    change."""
    return episode_seeds(train_seed, entry.num_groups, f"train/{entry.tag}/{iteration}", exclude)


def val_seeds(entry: SuiteEntry, val_seed: int) -> list[int]:
    """The fixed reset seeds of validation entry ``entry``."""
    return episode_seeds(val_seed, entry.num_groups, f"val/{entry.tag}")


def generation_seed(base: int, tag: str) -> int:
    """The base of an entry's per-request generation seeds: the rollout's ``base`` mixed with the
    tag, so entries never share sampling noise and an entry's draws do not depend on the others."""
    state = np.random.SeedSequence([base % 2**63, zlib.crc32(tag.encode())]).generate_state(
        1, dtype=np.uint64
    )
    return int(state[0])


@dataclass
class Part:
    """One entry's share of a rollout: its runner, reset seeds (all of the entry's groups), sampling
    parameters, generation seed base and tag (empty for a single-env rollout)."""

    runner: RolloutRunner
    seeds: list[int]
    params: SamplingParams
    seed: int
    tag: str = ""


def run_parts(
    parts: Sequence[Part], group_size: int, dp_rank: int = 0, dp_size: int = 1
) -> list[Trajectory]:
    """This rollout rank's trajectories of the concatenated groups of ``parts``, renumbered to
    global group ids.

    Rank ``dp_rank`` of ``dp_size`` runs the contiguous share
    :func:`~ragen_lightning.parallel.group_share` of all groups; within a part the runner sees the
    part's own group ids (its generation seeds are those of the part run alone), then ``group_id``
    and ``env_index`` are shifted by the groups of the parts before it and ``tag`` is set.
    """
    share = group_share(sum(len(p.seeds) for p in parts), dp_size, dp_rank)
    out: list[Trajectory] = []
    offset = 0
    for part in parts:
        lo, hi = max(share.start - offset, 0), min(share.stop - offset, len(part.seeds))
        # nothing of this entry on this rank: its runner's timing is this rollout's (none)
        if lo >= hi:
            part.runner.timing = {k: 0.0 for k in part.runner.timing}
        else:
            for t in part.runner.run(
                part.seeds[lo:hi], group_size, part.params, seed=part.seed, first_group=lo
            ):
                member = t.env_index - t.group_id * group_size
                t.group_id += offset
                t.env_index = t.group_id * group_size + member
                t.tag = part.tag
                out.append(t)
        offset += len(part.seeds)
    return out


def tag_metrics(
    trajectories: Sequence[Trajectory], group_size: int, prefix: str
) -> dict[str, float]:
    """``<prefix>/<tag>/<name>``: :func:`~ragen_lightning.data.batching.rollout_metrics` of each
    tag's episodes."""
    by_tag: dict[str, list[Trajectory]] = {}
    for t in trajectories:
        by_tag.setdefault(t.tag, []).append(t)
    return {
        f"{prefix}/{metric_name(tag)}/{k}": v
        for tag, ts in by_tag.items()
        for k, v in rollout_metrics(ts, group_size).items()
    }
