"""The ``--data.*`` settings' checks: value domains (:data:`DATA_DOMAINS`), impossible combinations, env ids and
kwargs, engines, and what the number of processes requires. Run when the data module is built and by the command
line's preflight before anything starts."""

from __future__ import annotations

from typing import Any

from ragen_lightning.data.mixture import (
    check_entry_episode,
    is_mixture,
    train_entries,
    val_entries,
)
from ragen_lightning.errors import ConfigError, Domain, check_domains
from ragen_lightning.parallel import rollout_rank
from ragen_lightning.rollout.branching import BRANCH_FOLLOW
from ragen_lightning.rollout.engines import ENGINES
from ragen_lightning.rollout.runner import UnknownEnvError, make_env
from ragen_lightning.rollout.settings import as_episode
from ragen_lightning.rollout.vllm_engine import require_vllm

_COUNT = Domain(low=1, integer=True)
_SEED = Domain(low=0, integer=True)  # numpy and gymnasium take non-negative seeds only
MAX_TEMPERATURE = 2.0
# The allowed values of every numeric ``--data.*`` setting (the nested groups check their own fields).
DATA_DOMAINS: dict[str, Domain] = {
    "num_groups": _COUNT, "group_size": _COUNT, "num_iterations": _COUNT, "val_num_groups": _COUNT,
    "val_group_size": _COUNT, "max_batch_size": _COUNT,
    # 0 = greedy; vLLM's sampler takes at most 2 (and a flatter distribution samples noise)
    "temperature": Domain(0, MAX_TEMPERATURE), "val_temperature": Domain(0, MAX_TEMPERATURE),
    "top_p": Domain(0, 1, low_open=True), "top_k": Domain(low=1, integer=True, special=(-1,)),
    "empty_stop_steps": Domain(low=0, integer=True), "train_seed": _SEED, "val_seed": _SEED, "branches": _COUNT,
    # 1: one rollout in flight; more would need a bounded buffer of several (and older weights), not built
    "async_level": Domain(0, 1, integer=True),
}


def check_async_level(hp: dict[str, Any]) -> None:
    """Refuse, naming the flag, an ``--data.async_level`` that cannot run: above 1, or beside a vLLM engine that
    spans several ranks (its generation runs collectives, which the rollout worker would run beside the update's;
    the cross-rank gather of the trajectories stays on the training thread, so one engine per rank is fine)."""
    level = hp.get("async_level", 0)
    if isinstance(level, int) and level > 1:
        raise ConfigError(f"--data.async_level {level}: only 1 (one rollout in flight, one update old) is built; more "
                          "needs a bounded buffer of rollouts sampled with several older weights")
    tp = rollout_tensor_parallel(hp)
    if level and tp > 1:
        raise ConfigError(f"--data.async_level 1 with --data.vllm.tensor_parallel_size {tp}: one engine spans {tp} "
                          "ranks and its collectives would run on the rollout worker beside the update's; use one "
                          "engine per rank (tensor_parallel_size 1) or --data.async_level 0")


def check_rollout_settings(hp: dict[str, Any]) -> None:
    """Raise :class:`ConfigError` naming the flag for the first ``--data.*`` value outside its domain
    (:data:`DATA_DOMAINS`), impossible combination, bad mixture entry, unknown env id, env that its kwargs cannot build
    (a missing data file included) or engine that is not installed. ``hp``: the data module's arguments (the nested
    groups ``episode``, ``filter`` and ``vllm`` check themselves when built)."""
    check_async_level(hp)
    check_domains("--data.", hp, DATA_DOMAINS)
    if hp.get("reward_placement") == "turn" and hp.get("norm_method", "identity") != "identity":
        raise ConfigError("--data.norm_method must be 'identity' with --data.reward_placement turn")
    engine, episode = hp.get("engine", "hf"), as_episode(hp.get("episode"))
    if hp.get("branches", 1) > 1 and (hp.get("reward_placement") != "turn" or episode.context_window == "full"):
        raise ConfigError("--data.branches > 1 needs --data.reward_placement turn and a windowed "
                          "--data.episode.context_window (limited or single_turn): each branch is a one-turn sample "
                          "scored by its own turn reward")
    filt = hp.get("filter")
    over = getattr(filt, "over", None) or (filt.get("over") if isinstance(filt, dict) else None)
    if over == "states" and hp.get("branches", 1) < 2:
        raise ConfigError("--data.filter.over states selects among the responses to each visited state: it needs "
                          "--data.branches > 1 (else use over: groups)")
    if hp.get("branch_follow", "first") not in BRANCH_FOLLOW:
        raise ConfigError(f"--data.branch_follow must be 'first' or 'best', got {hp['branch_follow']!r}")
    if hp.get("branch_follow", "first") == "best" and hp.get("branches", 1) == 1:
        raise ConfigError("--data.branch_follow best needs --data.branches > 1: it picks among the responses "
                          "sampled for one state")
    lists = [(train_entries(hp), "--data.mixture" if is_mixture(hp) else "")]
    if hp.get("val_suite") is not None:  # else validation runs the training entries
        lists.append((val_entries(hp), "--data.val_suite"))
    for entries, flag in lists:
        for i, entry in enumerate(entries):
            where = f"{flag}[{i}]." if flag else "--data."
            check_entry_episode(entry, episode, where[:-1])
            try:  # an unknown id or bad env kwargs fail here, naming the flag, not in the first rollout
                env = make_env(entry.env_id, entry.env_kwargs)
                branchable = bool(getattr(env.unwrapped, "branchable", False))
                env.close()
            except UnknownEnvError as e:
                raise ConfigError(f"{where}env_id: {e}") from None
            except (TypeError, ValueError, OSError, ImportError) as e:  # OSError: a data file named there is missing
                raise ConfigError(f"{where}env_kwargs for {entry.env_id}: {e}") from None
            if hp.get("branches", 1) > 1 and not branchable and flag != "--data.val_suite":
                raise ConfigError(f"--data.branches {hp['branches']}: {entry.env_id} does not declare branchable = "
                                  "True (its state must be an in-process object that copy.deepcopy duplicates)")
    if engine not in ENGINES:
        raise ConfigError(f"--data.engine must be one of {', '.join(ENGINES)}, got {engine!r}")
    if engine == "vllm":
        require_vllm()


def rollout_tensor_parallel(hp: dict[str, Any]) -> int:
    """Ranks per vLLM engine: ``--data.vllm.tensor_parallel_size`` unless ``--data.engine hf`` (1)."""
    vllm = hp.get("vllm")
    tp = vllm.get("tensor_parallel_size", 1) if isinstance(vllm, dict) else getattr(vllm, "tensor_parallel_size", 1)
    return 1 if hp.get("engine", "hf") == "hf" else int(tp)


def check_world_size(hp: dict[str, Any], size: int) -> None:
    """``--data.vllm.tensor_parallel_size`` (k, vLLM engines only) must divide the number of processes ``size``, and
    the groups of a training and of a validation rollout (``--data.num_groups`` and ``--data.val_num_groups``; with
    ``--data.mixture`` / ``--data.val_suite`` the sum over the entries) the number of rollout groups ``size / k``."""
    tp = rollout_tensor_parallel(hp)
    dp = rollout_rank(0, size, tp)[1]
    where = f"processes ({size}): every rank" if tp == 1 else \
        f"tensor-parallel vLLM engines ({size} processes / --data.vllm.tensor_parallel_size {tp}): every engine"
    rollouts = {"training": ("--data.num_groups", hp["num_groups"], is_mixture(hp), train_entries),
                "validation": ("--data.val_num_groups", hp["val_num_groups"],
                               is_mixture(hp) or hp.get("val_suite") is not None, val_entries)}
    for kind, (flag, groups, entries_given, entries) in rollouts.items():
        if entries_given:
            groups, flag = sum(e.num_groups for e in entries(hp)), f"the {kind} entries' num_groups summed"
        if groups % dp:
            raise ConfigError(f"{flag} ({groups}) must be divisible by the number of {where} runs whole env groups")
