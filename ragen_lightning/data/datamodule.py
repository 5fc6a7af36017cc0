"""RolloutDataModule: one filtered rollout batch per StarPO iteration, generated with the current
actor.

The training stream is an ``IterableDataset`` (``num_workers=0``, ``batch_size=None``) that yields
exactly ``num_iterations`` batches; the module pulls each one itself
(``training_step(dataloader_iter)``), so Lightning never pre-fetches a rollout generated with stale
weights. Iteration ``n`` resets group ``g`` with seed ``train_seed + n * num_groups + g`` (RAGEN:
``10000 + 8n + g``); validation always uses seeds ``val_seed + g``. ``state_dict`` stores the
iteration and the empty-filter streak, so a resumed run continues the same seed stream. Environment
mixtures (``--data.env.mixture``: several envs in one batch; ``--data.validation.suite``: validation
on its own list; per-tag seeds and ``train/<tag>/*``, ``val/<tag>/*`` metrics) are described in
:mod:`ragen_lightning.data.mixture`.

With several processes (DDP / FSDP) each rank rolls out its share of whole groups with its own
engine and the trajectories are all-gathered before filtering, so selection, batch and metrics equal
the single-process ones on every rank (:mod:`ragen_lightning.parallel`); the module then splits the
update rows evenly across ranks.
"""

from __future__ import annotations

import functools
import time
import warnings
from collections.abc import Iterator
from dataclasses import asdict, fields, replace
from typing import Any, Protocol

import lightning as L
from torch.utils.data import DataLoader, IterableDataset

from ragen_lightning.data.ahead import STALENESS, OneStepAhead
from ragen_lightning.data.batching import build_batch, rollout_metrics
from ragen_lightning.data.checks import check_envs, check_world_size
from ragen_lightning.data.mixture import (
    Part,
    generation_seed,
    is_mixture,
    run_parts,
    tag_metrics,
    train_entries,
    train_seeds,
    val_entries,
    val_seeds,
)
from ragen_lightning.data.sampler import FilterConfig, filter_groups, filter_states
from ragen_lightning.data.settings import (
    BranchingSettings,
    DataSettings,
    EnvSettings,
    RewardSettings,
    SamplingSettings,
    TrainingSettings,
    ValidationSettings,
)
from ragen_lightning.data.suite import SuiteEntry
from ragen_lightning.errors import ConfigError
from ragen_lightning.parallel import (
    concat_ranks,
    gather_objects,
    rollout_rank,
    tp_leaders,
    world,
)
from ragen_lightning.rollout.branching import BranchFollow
from ragen_lightning.rollout.engine import SamplingParams
from ragen_lightning.rollout.engines import snapshot_engine
from ragen_lightning.rollout.runner import RolloutRunner
from ragen_lightning.rollout.settings import EngineSettings, EpisodeSettings
from ragen_lightning.rollout.tokens import ChatTokens
from ragen_lightning.types import RolloutBatch


class RolloutPolicy(Protocol):
    """What the data module needs of the policy it rolls out (``StarPOModule`` is one): its
    tokenizer and an engine that samples with its current weights (``engine.sync_weights()`` before
    every rollout)."""

    tokenizer: Any

    def make_engine(self, max_batch_size: int = 128, **engine_settings: Any) -> Any: ...


class _Stream(IterableDataset):
    """Yields ``produce()`` until ``remaining()`` is 0. Its length is the run's total number of
    batches, fixed when the loader is built: Lightning reads it to count the epoch, and a run
    resumed mid-epoch counts the batches done before the checkpoint too (with the remaining count a
    second resume found the epoch already finished)."""

    def __init__(self, produce, remaining, total: int):
        self.produce, self.remaining = produce, remaining
        self.total = max(total, 0)

    def __len__(self) -> int:
        return self.total

    def __iter__(self) -> Iterator[RolloutBatch]:
        while self.remaining() > 0:
            yield self.produce()


class _ResumableLoader(DataLoader):
    """The training loader: its state is the data module's (the iteration count the stream resumes
    from), so Lightning knows a mid-run checkpoint resumes it exactly (else it warns "your
    dataloader is not resumable" on every mid-run resume). The data module's own ``state_dict`` in
    the checkpoint restores the same values."""

    def __init__(self, datamodule: RolloutDataModule, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.datamodule = datamodule

    def state_dict(self) -> dict[str, Any]:
        # read after the rollout in flight finished (it may change the count); the data module's own
        # state holds it
        return {k: v for k, v in self.datamodule.state_dict().items() if k != "ahead"}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if "iteration" in state_dict:
            self.datamodule.load_state_dict(state_dict)


class RolloutDataModule(L.LightningDataModule):
    """Streams multi-turn rollouts of ``num_groups x group_size`` envs, filtered by within-group
    reward variance.

    Every argument is a settings group, ``--data.<group>.<name>`` on the command line (each group's
    fields are documented on its class, :mod:`ragen_lightning.data.settings`).

    Args:
        env: what the rollouts play (``EnvSettings``: ``id``, ``kwargs`` or a ``mixture`` of several
            envs).
        training: the training rollouts (``TrainingSettings``: ``num_iterations``, ``num_groups``,
            ``group_size``, ``seed``, ``empty_stop_steps``, ``async_level``).
        episode: the episode settings (``EpisodeSettings``: turns, action budgets,
        ``max_new_tokens``, context
            window, ``max_model_len``, thinking, format penalty); the warm start's demonstrations use the same ones.
        sampling: the training rollouts' sampling (``SamplingSettings``: ``temperature``, ``top_p``,
            ``top_k``).
        validation: the fixed validation rollout (``ValidationSettings``: ``num_groups``,
            ``group_size``, ``temperature``, ``seed``, ``suite``).
        rewards: reward placement and score normalisation (``RewardSettings``).
        branching: several responses per visited state (``BranchingSettings``: ``branches``,
            ``follow``).
        filter: the rollout filter (default keeps everything; StarPO-S: ``top_p`` 0.9 with
        ``include_zero: false``). engine: the rollout engine (``EngineSettings``: ``name`` hf / vllm
        / auto,
            ``max_batch_size``, ``vllm``).
    """

    def __init__(
        self,
        env: EnvSettings = EnvSettings(),
        training: TrainingSettings = TrainingSettings(),
        episode: EpisodeSettings = EpisodeSettings(),
        sampling: SamplingSettings = SamplingSettings(),
        validation: ValidationSettings = ValidationSettings(),
        rewards: RewardSettings = RewardSettings(),
        branching: BranchingSettings = BranchingSettings(),
        filter: FilterConfig | None = None,
        engine: EngineSettings = EngineSettings(),
    ):
        super().__init__()
        self.settings = s = DataSettings.build(
            env=env,
            training=training,
            episode=episode,
            sampling=sampling,
            validation=validation,
            rewards=rewards,
            branching=branching,
            filter=filter,
            engine=engine,
        )
        check_envs(s)
        self.save_hyperparameters({f.name: asdict(getattr(s, f.name)) for f in fields(s)})
        self.episode, self.filter = s.episode, s.filter
        new_tokens = s.episode.max_new_tokens
        sampling = s.sampling
        self.train_params = SamplingParams(
            sampling.temperature, sampling.top_p, sampling.top_k, new_tokens
        )
        self.val_params = SamplingParams(s.validation.temperature, 1.0, -1, new_tokens)
        self.train_entries: list[SuiteEntry] = train_entries(s)
        self.val_entries: list[SuiteEntry] = val_entries(s)
        self.iteration = 0
        self.consecutive_empty = 0
        self._runners: list[RolloutRunner] = []
        self.engine = None  # the rollout engine, built at the first rollout (``settings.engine``)
        self.policy: RolloutPolicy | None = None  # connect()
        self._val_runners: list[RolloutRunner] = []
        # the engine of the training rollouts: self.engine, or its snapshot (async)
        self._train_engine = None
        self._ahead = OneStepAhead() if s.training.async_level else None

    # -- wiring ------------------------------------------------------------------------------------
    def setup(self, stage: str) -> None:
        # the module builds its models in configure_model, after this hook: runners are created on
        # first use
        self.check_world_size(self.trainer.world_size if self.trainer is not None else 1)

    def check_world_size(self, size: int) -> None:
        """Every rank runs whole env groups: ``num_groups`` and ``val_num_groups`` must divide by
        the process count (the CLI's preflight checks it before anything starts; ``setup`` again on
        every rank)."""
        check_world_size(self.settings, size)

    @property
    def mixture(self) -> bool:
        """Training from ``--data.env.mixture``: per-tag seeds, generation seeds and
        ``train/<tag>/*`` metrics."""
        return is_mixture(self.settings)

    @property
    def tagged_validation(self) -> bool:
        """Validation on entries with per-tag seeds and ``val/<tag>/*`` metrics (a mixture or
        ``--data.validation.suite``)."""
        return self.mixture or self.settings.validation.suite is not None

    def connect(self, policy: RolloutPolicy) -> None:
        """The policy whose rollouts this module streams (``StarPOModule.setup`` connects itself):
        its tokenizer and its engine (``policy.make_engine``) are read at the first rollout, after
        the policy built its models."""
        self.policy = policy

    def _ensure_runners(self) -> None:
        if self._runners:
            return
        if self.policy is None:
            raise RuntimeError(
                "RolloutDataModule has no policy to roll out: connect(module) first (StarPOModule.setup "
                "connects itself to the trainer's data module)"
            )
        s = self.settings
        chat = ChatTokens(self.policy.tokenizer, enable_think=self.episode.enable_think)
        extra = (
            {}
            if s.engine.name == "hf"
            else {
                "engine": s.engine.name,
                "vllm": s.engine.vllm,
                "max_model_len": self.episode.max_model_len,
                "seed": s.training.seed,
            }
        )
        engine = self.policy.make_engine(max_batch_size=s.engine.max_batch_size, **extra)
        self.engine = engine
        self._train_engine = snapshot_engine(engine) if self._ahead is not None else engine
        self.chat = chat
        self._runners = self._make_runners(
            self.train_entries, chat, self._train_engine, s.branching.branches, s.branching.follow
        )
        self._val_runners = self._make_runners(self.val_entries, chat, engine)
        # the first prompt must fit (the CLI checked it too)
        self._check_budget(self._runners, self._val_runners)

    def _make_runners(
        self,
        entries: list[SuiteEntry],
        chat: ChatTokens,
        engine: Any,
        branches: int = 1,
        branch_follow: BranchFollow = "first",
    ) -> list[RolloutRunner]:
        """One runner per entry with the entry's episode settings (its own ``ChatTokens`` when it
        turns thinking on or off)."""
        runners = []
        for entry in entries:
            episode = entry.episode_settings(self.episode)
            own = (
                chat
                if episode.enable_think == chat.enable_think
                else ChatTokens(chat.tokenizer, enable_think=episode.enable_think)
            )
            runners.append(
                RolloutRunner(
                    entry.env_id,
                    entry.env_kwargs,
                    own,
                    engine,
                    episode,
                    branches=branches,
                    branch_follow=branch_follow,
                )
            )
        return runners

    def teardown(self, stage: str) -> None:
        """Close the envs and the engine (a vLLM engine holds its KV cache until closed); a later
        stage in the same process (``validate`` after ``fit``) builds them again."""
        if self._ahead is not None:
            self._ahead.close()
        for runner in self._runners + self._val_runners:
            runner.close()
        if (close := getattr(self.engine, "close", None)) is not None:
            close()
        self._runners, self._val_runners, self.engine, self._train_engine = [], [], None, None

    def train_dataloader(self) -> DataLoader:
        total = self.settings.training.num_iterations
        stream = _Stream(self._next_train_batch, lambda: total - self.iteration, total=total)
        return _ResumableLoader(
            self, stream, batch_size=None, num_workers=0, collate_fn=lambda b: b
        )

    def val_dataloader(self) -> DataLoader:
        return DataLoader(
            _OneShot(self.validation_batch), batch_size=None, num_workers=0, collate_fn=lambda b: b
        )

    # -- rollouts ----------------------------------------------------------------------------------
    def group_seeds(self, iteration: int) -> list[int]:
        """The reset seed of every group of ``iteration``, entries in order
        (:meth:`entry_seeds`)."""
        return [s for seeds in self.entry_seeds(iteration) for s in seeds]

    def entry_seeds(self, iteration: int) -> list[list[int]]:
        """Each training entry's reset seeds at ``iteration``: single env ``train_seed + iteration *
        num_groups + g``; a mixture entry its tag's stream, held out from the tag's validation seeds
        (module ``mixture``)."""
        seed, groups = self.settings.training.seed, self.settings.training.num_groups
        if not self.mixture:
            return [[seed + iteration * groups + g for g in range(groups)]]
        held_out = dict(zip((e.tag for e in self.val_entries), self.val_entry_seeds()))
        return [
            train_seeds(e, seed, iteration, held_out.get(e.tag, ())) for e in self.train_entries
        ]

    def val_entry_seeds(self) -> list[list[int]]:
        """Each validation entry's fixed reset seeds: ``val_seed + g`` for the single env, else its
        tag's."""
        val = self.settings.validation
        if not self.tagged_validation:
            return [[val.seed + g for g in range(val.num_groups)]]
        return [val_seeds(e, val.seed) for e in self.val_entries]

    def _next_train_batch(self) -> RolloutBatch:
        """Iteration ``self.iteration``'s batch: generated now, or (``async_level`` 1) taken from
        the worker that generated it during the last update, the next one then launched with the
        weights this update starts from."""
        batch = self._ahead.take(self.iteration) if self._ahead is not None else None
        if batch is None:
            batch = self.train_batch(self.iteration)
        self.iteration += 1
        if self._ahead is not None and self.iteration < self.settings.training.num_iterations:
            self._ensure_runners()  # (a resumed run's first batch came from its checkpoint)
            # on this thread, before the update changes the weights
            sync = self._sync_engine(self._train_engine)
            self._ahead.launch(
                self.iteration,
                functools.partial(self._generate, self.iteration),
                functools.partial(self._finish, self.iteration, sync),
            )
        return batch

    def train_batch(self, iteration: int) -> RolloutBatch:
        """Rollout of ``iteration`` (the current actor), filtered and padded."""
        self._ensure_runners()
        sync = self._sync_engine(self._train_engine)
        return self._finish(iteration, sync, self._generate(iteration))

    def _generate(self, iteration: int) -> tuple[list[Part], list, dict[str, float]]:
        """This rank's share of iteration ``iteration``'s rollout with the engine as synced:
        ``(parts, its trajectories, timing_s/rollout* metrics)``. No collective: it may run on the
        async worker."""
        training = self.settings.training
        t0 = time.perf_counter()
        parts = self._parts(
            self._runners,
            self.train_entries,
            self.entry_seeds(iteration),
            self.train_params,
            (training.seed << 20) + iteration,
            self.mixture,
        )
        local = self._run_local(parts, training.group_size)
        timing = {"timing_s/rollout": time.perf_counter() - t0}
        self._engine_sleep()
        for runner in self._runners:  # generate, env
            for k, v in runner.timing.items():
                timing[f"timing_s/rollout_{k}"] = timing.get(f"timing_s/rollout_{k}", 0.0) + v
        return parts, local, timing

    def _finish(self, iteration: int, sync: dict[str, float], generated: tuple) -> RolloutBatch:
        """Every rank's trajectories of :meth:`_generate`'s ``generated`` (a collective: on the
        training thread), filtered and padded into the batch, with its metrics (``sync``: the engine
        sync's)."""
        training, rewards = self.settings.training, self.settings.rewards
        group_size = training.group_size
        parts, local, timing = generated
        trajectories = self._gather(local)
        metrics = {f"train/{k}": v for k, v in rollout_metrics(trajectories, group_size).items()}
        if self.mixture:
            metrics.update(tag_metrics(trajectories, group_size, "train"))
        metrics.update(sync)
        metrics["rollout/token_drift_rate"] = self._drift_rate(trajectories, parts)
        metrics[STALENESS] = 0.0  # generated with the weights it trains (OneStepAhead.take sets 1)
        by_states = self.filter.over == "states"
        if by_states:  # the states are known once the batch is built (below)
            kept, filter_stats = trajectories, {}
        else:
            kept, _, filter_stats = filter_groups(trajectories, group_size, self.filter)
        batch = build_batch(
            kept,
            pad_token_id=self.chat.tokenizer.pad_token_id,
            reward_placement=rewards.placement,
            norm_grouping=rewards.norm_grouping,
            norm_method=rewards.norm_method,
            metrics=metrics,
        )
        if by_states:
            batch, filter_stats = filter_states(batch, self.filter)
        metrics.update(filter_stats)
        if len(batch):
            self.consecutive_empty = 0
        else:
            self.consecutive_empty += 1
            warnings.warn(
                f"rollout filter kept no group at iteration {iteration}: skipping the update "
                f"({self.consecutive_empty} in a row)",
                stacklevel=2,
            )
            stop = training.empty_stop_steps
            if stop > 0 and self.consecutive_empty >= stop and self.trainer is not None:
                warnings.warn(
                    f"stopping: {self.consecutive_empty} consecutive empty filter results "
                    f"(--data.training.empty_stop_steps={stop})",
                    stacklevel=2,
                )
                self.trainer.should_stop = True
        metrics["rollout/empty_after_filter"] = float(not len(batch))
        metrics["rollout/consecutive_empty_after_filter_steps"] = float(self.consecutive_empty)
        metrics.update(timing)
        metrics["rollout/generated_tokens"] = float(sum(t.response_tokens for t in trajectories))
        metrics["iteration"] = float(iteration)
        batch.metrics.update(metrics)
        batch.metrics["train/batch_size"] = float(len(batch))
        return batch

    @staticmethod
    def _parts(
        runners: list[RolloutRunner],
        entries: list[SuiteEntry],
        seeds: list[list[int]],
        params: SamplingParams,
        base: int,
        tagged: bool,
    ) -> list[Part]:
        """One part per entry: its runner and seeds, the sampling cap of its episode settings, and
        (``tagged``) its tag and own generation seeds; untagged, the single env's part is exactly
        the rollout of before."""
        return [
            Part(
                r,
                s,
                replace(params, max_new_tokens=r.episode.max_new_tokens),
                generation_seed(base, e.tag) if tagged else base,
                e.tag if tagged else "",
            )
            for r, e, s in zip(runners, entries, seeds)
        ]

    def _run_local(self, parts: list[Part], group_size: int) -> list:
        """This rank's share of the groups (the caller has synced the engine: a collective for
        sharded actors, which every rank runs before every rollout). A tensor-parallel vLLM engine
        spans ``k`` ranks: they run the same share (same prompts and seeds, one engine)."""
        rank, size = world()
        dp_rank, dp_size = rollout_rank(rank, size, getattr(self.engine, "tensor_parallel_size", 1))
        return run_parts(parts, group_size, dp_rank, dp_size)

    def _gather(self, local: list) -> list:
        """Every rank's :meth:`_run_local` trajectories in global group order (a collective; one
        copy per tensor-parallel group)."""
        size = world()[1]
        tp = getattr(self.engine, "tensor_parallel_size", 1)
        return local if size == 1 else concat_ranks(tp_leaders(gather_objects(local), tp))

    def validation_batch(self) -> RolloutBatch:
        """The fixed validation rollout (:meth:`val_entry_seeds`), unfiltered; per-tag metrics for
        entries (after the training rollout in flight, which may share the engine, has finished)."""
        if self._ahead is not None:
            self._ahead.wait()
        self._ensure_runners()
        val = self.settings.validation
        sync = self._sync_engine()
        parts = self._parts(
            self._val_runners,
            self.val_entries,
            self.val_entry_seeds(),
            self.val_params,
            val.seed,
            self.tagged_validation,
        )
        trajectories = self._gather(self._run_local(parts, val.group_size))
        self._engine_sleep()
        metrics = {f"val/{k}": v for k, v in rollout_metrics(trajectories, val.group_size).items()}
        if self.tagged_validation:
            metrics.update(tag_metrics(trajectories, val.group_size, "val"))
        metrics.update({k.replace("rollout/", "val/", 1): v for k, v in sync.items()})
        return build_batch(
            trajectories, pad_token_id=self.chat.tokenizer.pad_token_id, metrics=metrics
        )

    def check_prompt_budget(self, tokenizer: Any = None) -> None:
        """Fail before training when the first prompt of an entry (training and validation) plus a
        full response cannot fit ``max_model_len``.

        With ``tokenizer`` it runs stand-alone (the CLI calls it before anything is written);
        otherwise it uses the module's tokenizer through the rollout runners.
        """
        if tokenizer is None:
            self._ensure_runners()  # checks the budget with the policy's tokenizer
            return
        chat = ChatTokens(tokenizer, enable_think=self.episode.enable_think)
        train, val = (
            self._make_runners(self.train_entries, chat, None),
            self._make_runners(self.val_entries, chat, None),
        )
        try:
            self._check_budget(train, val)
        finally:
            for runner in train + val:
                runner.close()

    def _check_budget(self, train: list[RolloutRunner], val: list[RolloutRunner]) -> None:
        firsts = [s[0] for s in self.entry_seeds(0)] + [s[0] for s in self.val_entry_seeds()]
        for runner, seed in zip(train + val, firsts):
            ep = runner.episode
            need = runner.first_prompt_length(seed) + ep.max_new_tokens
            if need > ep.max_model_len:
                raise ConfigError(
                    f"--data.episode.max_model_len={ep.max_model_len} is too small for the first prompt of "
                    f"{runner.env_id}: it needs {need} tokens (prompt + --data.episode.max_new_tokens="
                    f"{ep.max_new_tokens})"
                )

    def _sync_engine(self, engine: Any = None) -> dict[str, float]:
        """Bring ``engine``'s (default: the validation engine's) weights up to the actor's before a
        rollout; its stats (sync time, probe) as metrics."""
        return dict((engine or self.engine).sync_weights() or {})

    def _engine_sleep(self) -> None:
        """Let an engine that holds its own weights free its memory for the update (vLLM sleep
        mode)."""
        sleep = getattr(self.engine, "sleep", None)
        if sleep is not None:
            sleep()

    @staticmethod
    def _drift_rate(trajectories, parts: list[Part]) -> float:
        # an entry may have its own (thinking on or off)
        chats = {p.tag: p.runner.chat for p in parts}
        samples = [(chats[t.tag], s.conversation) for t in trajectories for s in t.samples]
        if not samples:
            return 0.0
        return sum(chat.drift(c) for chat, c in samples) / len(samples)

    # -- resume ------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The iteration to resume from, and (``async_level`` 1) the rollout in flight, waited for:
        its weights are gone once the update ran, so a resumed run trains on this very batch."""
        # first: the rollout may count
        ahead = self._ahead.state() if self._ahead is not None else None
        # an empty filter result
        out = {"iteration": self.iteration, "consecutive_empty": self.consecutive_empty}
        return out if ahead is None else {**out, "ahead": ahead}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.iteration = int(state_dict["iteration"])
        if "consecutive_empty" in state_dict:  # (the loader's own state holds the iteration only)
            self.consecutive_empty = int(state_dict["consecutive_empty"])
        if self._ahead is not None and "ahead" in state_dict:
            self._ahead.restore(state_dict["ahead"])


class _OneShot(IterableDataset):
    def __init__(self, produce):
        self.produce = produce

    def __iter__(self):
        yield self.produce()
