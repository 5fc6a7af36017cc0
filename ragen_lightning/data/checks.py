"""The ``--data.*`` checks that need more than the settings: env ids and kwargs (each env is built
once), an installed engine, and what the number of processes requires. Run when the data module is
built and by the command line's preflight before anything starts; the settings' own checks are in
:mod:`ragen_lightning.data.settings`."""

from __future__ import annotations

from ragen_lightning.data.mixture import (
    TRAIN_FLAG,
    VAL_FLAG,
    check_entry_episode,
    is_mixture,
    train_entries,
    val_entries,
)
from ragen_lightning.data.settings import DataSettings
from ragen_lightning.errors import ConfigError
from ragen_lightning.parallel import rollout_rank
from ragen_lightning.rollout.runner import UnknownEnvError, make_env
from ragen_lightning.rollout.vllm_engine import require_vllm


def check_envs(s: DataSettings) -> None:
    """Raise :class:`ConfigError` naming the flag for a bad mixture entry, an unknown env id, an env
    that its kwargs cannot build (a missing data file included), a non-branchable env with
    ``--data.branching.branches > 1`` or an engine that is not installed."""
    lists = [(train_entries(s), TRAIN_FLAG if is_mixture(s) else "")]
    if s.validation.suite is not None:  # else validation runs the training entries
        lists.append((val_entries(s), VAL_FLAG))
    branches = s.branching.branches
    for entries, flag in lists:
        for i, entry in enumerate(entries):
            where = f"{flag}[{i}]." if flag else "--data.env."
            check_entry_episode(entry, s.episode, where[:-1])
            # an unknown id or bad env kwargs fail here, naming the flag, not in the first rollout
            try:
                env = make_env(entry.env_id, entry.env_kwargs)
                branchable = bool(getattr(env.unwrapped, "branchable", False))
                env.close()
            except UnknownEnvError as e:
                raise ConfigError(f"{where}{'env_id' if flag else 'id'}: {e}") from None
            except (
                TypeError,
                ValueError,
                OSError,
                ImportError,
            ) as e:  # OSError: a data file is missing
                raise ConfigError(
                    f"{where}{'env_kwargs' if flag else 'kwargs'} for {entry.env_id}: {e}"
                ) from None
            if branches > 1 and not branchable and flag != VAL_FLAG:
                raise ConfigError(
                    f"--data.branching.branches {branches}: {entry.env_id} does not declare "
                    "branchable = True (its state must be an in-process object that copy.deepcopy "
                    "duplicates)"
                )
    if s.engine.name == "vllm":
        require_vllm()


def check_world_size(s: DataSettings, size: int) -> None:
    """``--data.engine.vllm.tensor_parallel_size`` (k, vLLM engines only) must divide the number of
    processes ``size``, and the groups of a training and of a validation rollout
    (``--data.training.num_groups`` and ``--data.validation.num_groups``; with a mixture or a suite
    the sum over the entries) the number of rollout groups ``size / k``."""
    tp = s.engine.tensor_parallel_size
    dp = rollout_rank(0, size, tp)[1]
    where = (
        f"processes ({size}): every rank"
        if tp == 1
        else f"tensor-parallel vLLM engines ({size} processes / "
        f"--data.engine.vllm.tensor_parallel_size {tp}): every engine"
    )
    rollouts = {
        "training": (
            "--data.training.num_groups",
            s.training.num_groups,
            is_mixture(s),
            train_entries,
        ),
        "validation": (
            "--data.validation.num_groups",
            s.validation.num_groups,
            is_mixture(s) or s.validation.suite is not None,
            val_entries,
        ),
    }
    for kind, (flag, groups, entries_given, entries) in rollouts.items():
        if entries_given:
            groups, flag = (
                sum(e.num_groups for e in entries(s)),
                f"the {kind} entries' num_groups summed",
            )
        if groups % dp:
            raise ConfigError(
                f"{flag} ({groups}) must be divisible by the number of {where} runs whole env "
                "groups"
            )
