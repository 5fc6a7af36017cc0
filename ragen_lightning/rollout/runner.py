"""Multi-turn episodes over groups of envs: prompt -> generate -> parse -> act, token-in/token-out.

``num_groups x group_size`` envs run in lock-step; every member of a group is reset with the group's
seed, so a group is ``group_size`` samples of the same initial state (what GRPO baselines and the
reward-variance filter compare). Envs that declare ``transition_seeded = True`` (random transitions:
Bandit's reward draw, FrozenLake's slips) also get ``options={"transition_seed":
transition_seed(group seed, member)}``, so each member draws its own transitions (RAGEN's
per-instance randomness) while sharing the initial state; the env's ``shared_transitions`` kwarg
opts out. Each turn, every live episode gets one generation request; actions are executed up to the
episode's remaining action budget, stopping when the env ends the episode.

Context modes (RAGEN's ``context_window_mode``; a turn's prompt is built in :mod:`.turn_prompts`):

* ``full``: the prompt is the whole conversation so far; one training sample per episode, every turn
  trained.
* ``limited``: the prompt keeps the system message and the last ``window_turns`` turns; one sample
  per turn with only that turn trained (earlier turns in the window are replayed from their sampled
  ids with loss mask 0).
* ``single_turn``: one user message per turn summarising the history (state/action/reward of the
  last ``window_turns - 1`` turns) plus the current state; one sample per turn.

``max_model_len`` is a hard limit: when the next turn's prompt plus ``max_new_tokens`` would not
fit, the episode ends (``context_truncated``) and nothing already built is cut, so masks never shift
(RAGEN drops old messages and can flip its parity-based masks).

Slow and remote envs (``EpisodeSettings.max_workers``, ``step_timeout_s``): the resets of a rollout
and the env steps of a turn run on a bounded pool of worker threads
(:class:`~ragen_lightning.rollout.env_pool.WorkerPool`), one call per episode at a time (an
episode's actions stay in order: the k-th actions of every episode run together, then the (k+1)-th),
and their results are applied in episode order, so a rollout is the same whatever the pool size. A
reset or step that raises or runs past ``step_timeout_s`` ends THAT episode:
``Trajectory.env_error`` records it, one warning names the env, seed and error, and the rollout goes
on. The turn in which the env failed is dropped whole (its reward is unknown): the trajectory keeps
the turns before it, token-exact and trainable, like an episode cut by the turn limit
(``truncated``); an env that failed at reset or in its first turn leaves a trajectory with no
training sample (score 0, counted by the ``env_errors`` metric). A timed-out env is abandoned with
its worker thread (a thread cannot be killed) and a fresh env takes its place at the next reset.

Branching (``branches`` K > 1, training rollouts in the windowed modes): every turn of an episode
samples K responses to the same prompt. The episode continues with the first, exactly the response
the unbranched rollout samples (its generation seed is unchanged); each other one is executed for
that turn alone on a deep copy of the env in the same state and becomes an extra one-turn training
sample of the episode, scored by its own turn reward. So each visited state is answered K times, and
a per-turn estimator (``adv_estimator: rft``) learns from the best answers the policy finds in the
states it reaches, the hard ones included. Envs opt in with ``branchable = True`` (in-process state
that ``copy.deepcopy`` duplicates; a remote env cannot be copied). With ``branch_follow="best"``
every response of the turn runs on a copy and the episode continues with the best-scored one (turn
reward plus format penalty; the first on ties, so a turn whose answers all score alike continues as
unbranched): the episode then follows the best path the policy's own samples find, and reaches the
later, still solvable states of a level that a policy making one mistake in K never sees. The chosen
response runs again on the env itself (a deep copy carries the env's random state, so that run
repeats the copy's); the training episode is then a search, not the policy's plain play, so its
success is not the policy's (validation never branches).
"""

from __future__ import annotations

import copy
import logging
import time
from collections.abc import Sequence
from dataclasses import replace
from functools import partial
from typing import Any

import gymnasium as gym
import numpy as np

from ragen_lightning.errors import ConfigError
from ragen_lightning.rollout import branching, prompting, tool_calls, turn_prompts
from ragen_lightning.rollout.engine import GenerationEngine, SamplingParams
from ragen_lightning.rollout.env_pool import Outcome, WorkerPool
from ragen_lightning.rollout.episodes import (
    Episode,
    Turn,
    checked_step,
    conversation_mark,
    cut_back,
)
from ragen_lightning.rollout.settings import ContextWindow, EpisodeSettings  # noqa: F401 (re-export)
from ragen_lightning.rollout.tokens import ChatTokens
from ragen_lightning.types import Conversation, Sample, Trajectory

log = logging.getLogger(__name__)


class UnknownEnvError(ValueError):
    """No gymnasium registration for the env id."""


def make_env(env_id: str, env_kwargs: dict[str, Any] | None = None) -> gym.Env:
    """``gymnasium.make`` with a clear error for ids nobody registered."""
    try:
        return gym.make(env_id, disable_env_checker=True, **(env_kwargs or {}))
    except (gym.error.NameNotFound, gym.error.NamespaceNotFound, gym.error.VersionNotFound) as e:
        raise UnknownEnvError(
            f"unknown env id {env_id!r}: import the package that registers it first (the project's envs register "
            f"on `import envs`) or write it as 'module:id', e.g. 'envs:ragen/Sokoban-v0' ({e})"
        ) from None


def request_seed(base: int, env_index: int, turn: int, branch: int = 0) -> int:
    """A generation seed for (rollout, env, turn[, branch]), independent of batch composition;
    branch 0 is the episode's own response."""
    key = [base % 2**63, env_index, turn] + ([branch] if branch else [])
    return int(np.random.SeedSequence(key).generate_state(1, dtype=np.uint64)[0])


def transition_seed(group_seed: int, member: int) -> int:
    """The transition seed of member ``member`` of the group reset with ``group_seed``
    (reproducible, and independent of batch composition and data-parallel rank)."""
    return int(
        np.random.SeedSequence([group_seed % 2**63, member, 0x7EED]).generate_state(
            1, dtype=np.uint64
        )[0]
    )


class RolloutRunner:
    """Runs groups of multi-turn episodes with a generation engine.

    Args:
        env_id: a registered gymnasium id (e.g. ``ragen/Sokoban-v0``).
        env_kwargs: keyword arguments for ``gymnasium.make``. chat: the token-in/token-out
        conversation builder (tokenizer + chat template). engine: the generation engine. episode:
        the episode settings (turns, action budgets, context mode, limits, answer format); default
            :class:`EpisodeSettings`. The sampling cap of a turn is the ``SamplingParams`` passed to :meth:`run`.
        max_response_tokens: the response length announced in the prompt (defaults to the sampling
        cap). branches: responses sampled per turn (module docstring, "Branching"); > 1 needs a
        windowed context mode and
            an env with ``branchable = True``.
        branch_follow: the response a branching episode continues with: ``first`` (the one the
        unbranched rollout
            samples) or ``best`` (the best-scored of the K; module docstring).
    """

    def __init__(
        self,
        env_id: str,
        env_kwargs: dict[str, Any] | None,
        chat: ChatTokens,
        engine: GenerationEngine,
        episode: EpisodeSettings | None = None,
        *,
        max_response_tokens: int | None = None,
        branches: int = 1,
        branch_follow: branching.BranchFollow = "first",
    ):
        self.env_id, self.env_kwargs = env_id, dict(env_kwargs or {})
        self.chat, self.engine = chat, engine
        self.episode = episode if episode is not None else EpisodeSettings()
        self.max_response_tokens = max_response_tokens
        self._envs: list[gym.Env | None] = []
        self._pool: WorkerPool | None = None
        self.timing = {"generate": 0.0, "env": 0.0}  # seconds spent in the last run()
        # fail now, with the id in the message, not mid-rollout
        probe = make_env(env_id, self.env_kwargs)
        branchable = bool(getattr(probe.unwrapped, "branchable", False))
        try:
            self.tools = self._offered_tools(probe, engine)
        finally:
            probe.close()
        if self.tools:
            self.chat = chat.with_tools(tool_calls.tool_schemas(self.tools))
        if isinstance(branches, bool) or not isinstance(branches, int) or branches < 1:
            raise ValueError(f"branches must be an int >= 1, got {branches!r}")
        if branches > 1 and self.episode.context_window == "full":
            raise ValueError(
                "branches > 1 needs a windowed context (context_window limited or single_turn): a "
                "branch is a one-turn sample"
            )
        if branches > 1 and not branchable:
            raise ValueError(
                f"branches > 1: {env_id} does not declare branchable = True (its state must be an "
                "in-process object that copy.deepcopy duplicates)"
            )
        if branch_follow not in branching.BRANCH_FOLLOW:
            raise ValueError(f"branch_follow must be 'first' or 'best', got {branch_follow!r}")
        self.branches, self.branch_follow = branches, branch_follow

    def _offered_tools(self, probe: gym.Env, engine: GenerationEngine) -> tuple:
        """The env's tools under the tool-call action format (empty in the text format); one-line
        errors where the format cannot work."""
        if self.episode.action_format != "tool_call":
            return ()
        tools = tuple(getattr(probe.unwrapped.prompt_spec(), "tools", ()) or ())
        if not tools:
            raise ConfigError(
                f"--data.episode.action_format tool_call: {self.env_id} declares no tools "
                "(PromptSpec.tools); use the text format for it"
            )
        if getattr(engine, "needs_messages", False):
            raise ConfigError(
                "--data.episode.action_format tool_call: the API engine sends chat messages without "
                "the tools; use the text format with it"
            )
        return tools

    # -- env pool ----------------------------------------------------------------------------------
    def _env(self, i: int) -> gym.Env:
        while len(self._envs) <= i:
            self._envs.append(None)
        env = self._envs[i]
        if env is None:  # new, or its predecessor was abandoned after a timeout
            env = self._envs[i] = make_env(self.env_id, self.env_kwargs)
        return env

    def _workers(self) -> WorkerPool:
        if self._pool is None:
            self._pool = WorkerPool(
                self.episode.max_workers,
                self.episode.step_timeout_s,
                name=f"env-worker[{self.env_id}]",
            )
        return self._pool

    def close(self) -> None:
        for env in self._envs:
            if env is not None:
                env.close()
        self._envs.clear()
        if self._pool is not None:
            self._pool.close()
            self._pool = None

    # -- rollout -----------------------------------------------------------------------------------
    def first_prompt_length(self, seed: int) -> int:
        """Tokens of the first prompt of an episode reset with ``seed`` (to check the context budget
        up front)."""
        ep = self._reset(0, 0, seed, member=0)
        announce = self.max_response_tokens or self.episode.max_new_tokens
        user = turn_prompts.user_message(ep, 1, announce, self.episode, tools=bool(self.tools))
        return len(self.chat.start(ep.system, user))

    def run(
        self,
        group_seeds: Sequence[int],
        group_size: int,
        params: SamplingParams,
        seed: int = 0,
        first_group: int = 0,
    ) -> list[Trajectory]:
        """Run one episode per env: ``len(group_seeds)`` groups of ``group_size`` members.

        Args:
            group_seeds: the reset seed of each group.
            group_size: members per group. params: sampling parameters of every turn. seed: base of
            the per-request generation seeds (same seed => same rollout). first_group: global id of
            the first group (a data-parallel rank runs a slice of the groups; ids, env
                indices and so generation seeds stay those of the single-process rollout).
        """
        if group_size < 1:
            raise ValueError(f"group_size must be >= 1, got {group_size}")
        self.timing = {"generate": 0.0, "env": 0.0}
        # the episode's stop strings end every turn, besides any the caller passes
        if self.episode.stop:
            params = replace(params, stop=tuple(dict.fromkeys(params.stop + self.episode.stop)))
        # engines that keep per-conversation state (HFEngine's prefix cache) hold it for one rollout
        # only
        clear_cache = getattr(self.engine, "clear_cache", lambda: None)
        clear_cache()
        t0 = time.perf_counter()
        episodes = self._reset_all(group_seeds, group_size, first_group)
        self.timing["env"] += time.perf_counter() - t0
        announce = self.max_response_tokens or params.max_new_tokens
        for turn in range(1, self.episode.max_turns + 1):
            fitting = self._open_turn(
                [ep for ep in episodes if not ep.done], turn, announce, params.max_new_tokens
            )
            if not fitting:
                break
            for (ep, _), out in zip(fitting, self._responses(fitting, turn, params, seed)):
                self._respond(ep, out.token_ids, out.logprobs)
            t0 = time.perf_counter()
            self._execute([ep for ep, _ in fitting])
            self.timing["env"] += time.perf_counter() - t0
            for ep, _ in fitting:
                self._close_turn(ep)
        for ep in episodes:
            if not ep.done:  # turn limit reached while the env was still running
                ep.traj.truncated = True
                self._finish(ep)
        clear_cache()
        return [ep.traj for ep in episodes]

    def _open_turn(
        self, live: list[Episode], turn: int, announce: int, response_cap: int
    ) -> list[tuple[Episode, list[int]]]:
        """``(episode, prompt ids)`` of each live episode that plays ``turn`` (its :class:`Turn`
        opened). An episode whose prompt plus a ``response_cap``-token response exceeds
        ``max_model_len`` ends instead (``context_truncated``); at turn 1 that is an error: the
        limit leaves no room for any episode."""
        fitting = []
        for ep in live:
            user = turn_prompts.user_message(
                ep, turn, announce, self.episode, tools=bool(self.tools)
            )
            mark = conversation_mark(ep.conv) if self.episode.context_window == "full" else None
            prompt = turn_prompts.prompt_ids(ep, user, response_cap, self.episode, self.chat)
            if prompt is None:
                if turn == 1:
                    need = len(self.chat.start(ep.system, user))
                    raise ValueError(
                        f"max_model_len={self.episode.max_model_len} is too small for the first prompt "
                        f"of {self.env_id} ({need} prompt tokens + max_new_tokens={response_cap})"
                    )
                ep.traj.context_truncated = ep.traj.truncated = True
                self._finish(ep)
                continue
            ep.turns.append(Turn(user=user, state=ep.obs, mark=mark))
            fitting.append((ep, prompt))
        return fitting

    def _responses(
        self, fitting: list[tuple[Episode, list[int]]], turn: int, params: SamplingParams, seed: int
    ) -> list[Any]:
        """The generation each episode of ``fitting`` plays this turn: its own sample or, when
        branching, the one it follows (``_branch``, which plays the others on copies of the env)."""
        K = self.branches
        seeds = [
            request_seed(seed, ep.traj.env_index, turn, k) for ep, _ in fitting for k in range(K)
        ]
        # scripted/expert engines (demonstrations, oracles) answer from the env state instead of the
        # prompt
        extra = (
            {"envs": [ep.env.unwrapped for ep, _ in fitting for _ in range(K)]}
            if getattr(self.engine, "needs_envs", False)
            else {}
        )
        # text-in/text-out engines (API models) get the chat
        if getattr(self.engine, "needs_messages", False):
            extra["messages"] = [list(ep.conv.messages) for ep, _ in fitting for _ in range(K)]
        t0 = time.perf_counter()
        outs = self.engine.generate(
            [p for _, p in fitting for _ in range(K)], params, seeds, **extra
        )
        self.timing["generate"] += time.perf_counter() - t0
        # the other responses, each for one turn on a copy of the env, before the episode moves on
        if K > 1:
            t0 = time.perf_counter()
            outs = [
                self._branch(ep, outs[i * K : (i + 1) * K]) for i, (ep, _) in enumerate(fitting)
            ]
            self.timing["env"] += time.perf_counter() - t0
        return outs

    def _reset(
        self, env_index: int, group_id: int, seed: int, member: int, slot: int | None = None
    ) -> Episode:
        slot = env_index if slot is None else slot
        env = self._env(slot)
        return self._episode(
            env, slot, env_index, group_id, seed, *self._reset_env(env, seed, member)
        )

    def _reset_all(
        self, group_seeds: Sequence[int], group_size: int, first_group: int
    ) -> list[Episode]:
        """Reset every env of the rollout (on the worker pool); an env whose reset fails gives a
        finished episode that records the error."""
        jobs = [
            ((first_group + g) * group_size + m, first_group + g, int(s), m, g * group_size + m)
            for g, s in enumerate(group_seeds)
            for m in range(group_size)
        ]
        envs = [self._env(slot) for *_, slot in jobs]
        outcomes = self._workers().map(
            [
                partial(self._reset_env, env, seed, member)
                for env, (_, _, seed, member, _) in zip(envs, jobs)
            ]
        )
        episodes = []
        for env, (index, group, seed, _, slot), outcome in zip(envs, jobs, outcomes):
            obs, system = outcome.value if outcome.ok else ("", "")
            ep = self._episode(env, slot, index, group, seed, obs, system)
            if not outcome.ok:
                self._fail(ep, "reset", outcome)
                ep.done = True
            episodes.append(ep)
        return episodes

    def _reset_env(self, env: gym.Env, seed: int, member: int) -> tuple[str, str]:
        """Reset ``env`` (the member's transition seed for transition-seeded envs); its observation
        and the system prompt built from its ``prompt_spec()`` (runs on a worker: a remote env's
        calls are round trips)."""
        options = (
            {"transition_seed": transition_seed(seed, member)}
            if getattr(env.unwrapped, "transition_seeded", False)
            else None
        )
        obs, _info = env.reset(seed=seed, options=options)
        spec = env.unwrapped.prompt_spec()
        return str(obs), prompting.system_prompt(
            spec, self.episode.max_actions_per_episode, bool(self.tools)
        )

    def _episode(
        self,
        env: gym.Env,
        slot: int,
        env_index: int,
        group_id: int,
        seed: int,
        obs: str,
        system: str,
    ) -> Episode:
        traj = Trajectory(
            env_index=env_index,
            group_id=group_id,
            seed=seed,
            trainable=getattr(self.engine, "trainable", True),
        )
        return Episode(
            traj=traj,
            env=env,
            system=system,
            obs=obs,
            slot=slot,
            actions_left=self.episode.max_actions_per_episode,
        )

    def _fail(self, ep: Episode, where: str, outcome: Outcome) -> None:
        """Record an env's exception or timeout on its episode (the caller ends the episode) and log
        it once."""
        error = outcome.error
        ep.traj.env_error = f"{where}: {type(error).__name__}: {error}"
        log.warning(
            "env %s failed at %s of the episode with seed %d (env index %d): %s: %s; the episode ends here "
            "(turns before the failing one are kept), the rollout goes on",
            self.env_id,
            where,
            ep.traj.seed,
            ep.traj.env_index,
            type(error).__name__,
            error,
        )
        if outcome.timed_out and 0 <= ep.slot < len(self._envs) and self._envs[ep.slot] is ep.env:
            self._envs[ep.slot] = None  # a worker may still be inside it: never touch it again

    def _respond(self, ep: Episode, sampled: list[int], logprobs: list[float]) -> None:
        """Append the turn's sampled ids to the conversation and parse them into the actions to
        execute."""
        current = ep.turns[-1]
        current.sampled, current.logprobs = list(sampled), list(logprobs)
        text = self.chat.add_response(ep.conv, sampled, logprobs)
        current.response = self.chat.prefix + text
        current.names = tuple(getattr(ep.env.unwrapped, "action_names", ()) or ())
        current.plan, current.penalty, current.format_ok = self._parse(
            text, current.names, ep.actions_left
        )

    def _parse(
        self, text: str, names: tuple[str, ...], actions_left: int
    ) -> tuple[list[Any], float, bool]:
        """``(actions to execute, format penalty, format ok)`` of a response's text."""
        if self.tools:
            parsed = tool_calls.parse_tool_calls(
                text,
                self.tools,
                prefix=self.chat.prefix,
                enable_think=self.episode.enable_think,
                max_actions_per_turn=self.episode.max_actions_per_turn,
            )
        else:
            parsed = prompting.parse_response(
                text,
                enable_think=self.episode.enable_think,
                max_actions_per_turn=self.episode.max_actions_per_turn,
            )
        usable = [a for a in parsed.actions if a is not None]  # tool calls: None is an invalid call
        valid = [a for a in prompting.map_actions(usable, names) if a is not None and a != ""]
        penalty = prompting.turn_format_penalty(
            len(valid), len(parsed.actions), self.episode.format_penalty
        )
        return valid[:actions_left], penalty, parsed.format_ok

    def _branch(self, ep: Episode, outs: list) -> Any:
        """The K responses of a branching turn (``ep.conv`` is still the bare prompt): returns the
        one the episode continues with (``branch_follow``); each other one runs for this turn on a
        deep copy of the env and is added to the episode as a one-turn sample scored by its own turn
        reward. A copy whose step raises drops that response only (logged); the episode itself is
        not affected."""
        best = self.branch_follow == "best"
        tried = [self._try_branch(ep, out) for out in (outs if best else outs[1:])]
        pick = branching.followed([None if t is None else t[1] for t in tried], self.branch_follow)
        for j, result in enumerate(tried):
            if result is not None and (not best or j != pick):
                ep.traj.samples.append(Sample(result[0], [result[1]], turn=len(ep.turns)))
        return outs[pick]

    def _try_branch(self, ep: Episode, out: Any) -> tuple[Conversation, float] | None:
        """``out`` played for this turn on a deep copy of the env: its one-turn conversation and
        score (turn reward plus format penalty), or None when the copy's step raised (logged)."""
        conv = copy.deepcopy(ep.conv)
        plan, penalty, _ = self._parse(
            self.chat.add_response(conv, out.token_ids, out.logprobs),
            tuple(getattr(ep.env.unwrapped, "action_names", ()) or ()),
            ep.actions_left,
        )
        try:
            return conv, branching.play_on_copy(ep.env, plan, checked_step) + penalty
        except Exception as e:  # noqa: BLE001  (a failing copy costs one extra sample, never the episode)
            log.warning(
                "env %s: a branch of the episode with seed %d failed (%s: %s); that response is dropped",
                self.env_id,
                ep.traj.seed,
                type(e).__name__,
                e,
            )
            return None

    def _execute(self, episodes: list[Episode]) -> None:
        """Run the planned actions of this turn: the k-th action of every episode that is still
        running together on the worker pool, for k = 0, 1, ...; results are applied in episode
        order."""
        pool = self._workers()
        k = 0
        while True:
            batch = [
                ep
                for ep in episodes
                if ep.traj.env_error is None
                and not ep.turns[-1].terminated
                and not ep.turns[-1].truncated
                and k < len(ep.turns[-1].plan)
            ]
            if not batch:
                return
            outcomes = pool.map(
                [partial(checked_step, ep.env, ep.turns[-1].plan[k]) for ep in batch]
            )
            for ep, outcome in zip(batch, outcomes):
                if outcome.ok:
                    self._record_step(ep, ep.turns[-1].plan[k], *outcome.value)
                else:
                    self._fail(ep, f"turn {len(ep.turns)}, action {k + 1}", outcome)
            k += 1

    def _record_step(
        self,
        ep: Episode,
        action: Any,
        obs: str,
        reward: float,
        terminated: bool,
        truncated: bool,
        info: dict[str, Any],
    ) -> None:
        current = ep.turns[-1]
        ep.obs = obs
        current.reward += reward
        ep.actions_left -= 1
        current.success = bool(info.get("success", False))
        names = current.names
        current.executed.append(names[action] if names and isinstance(action, int) else str(action))
        current.observations.append(str(obs))
        current.step_info = {
            k: float(v) for k, v in info.items() if isinstance(v, (int, float, bool, np.number))
        }
        current.terminated, current.truncated = terminated, truncated

    def _close_turn(self, ep: Episode) -> None:
        """Add the turn to the trajectory and end the episode when the env ended it or the action
        budget is spent; after an env error, drop the turn and end the episode (see the module
        docstring)."""
        current = ep.turns[-1]
        traj = ep.traj
        if traj.env_error is not None:
            ep.turns.pop()
            if self.episode.context_window == "full":
                ep.conv = cut_back(ep.conv, current.mark)
            traj.truncated = True
            self._finish(ep)
            return
        traj.num_turns += 1
        traj.response_tokens += len(current.sampled)
        if current.penalty:
            traj.penalty += current.penalty
            traj.num_format_errors += 1
        traj.num_actions += len(current.executed)
        if current.success is not None:
            traj.success = current.success
        for k, v in current.step_info.items():  # a rate stays a rate with several actions per turn
            if k != "success":
                ep.info_sums[k] = ep.info_sums.get(k, 0.0) + v
        traj.turn_rewards.append(current.reward)
        traj.turn_info.append(
            {
                "actions": current.executed,
                "format_ok": current.format_ok,
                "penalty": current.penalty,
                "reward": current.reward,
                "info": current.step_info,
            }
        )
        ep.warn_invalid = not current.plan
        if self.episode.context_window != "full":
            traj.samples.append(
                Sample(ep.conv, [current.reward + current.penalty], turn=len(ep.turns))
            )
        if current.terminated or current.truncated:
            traj.terminated, traj.truncated = current.terminated, current.truncated
            self._finish(ep)
        elif ep.actions_left <= 0:
            traj.truncated = True
            self._finish(ep)

    def _finish(self, ep: Episode) -> None:
        if ep.done:
            return
        ep.done = True
        if self.episode.context_window == "full" and ep.conv is not None and ep.conv.turn_spans:
            ep.traj.samples.append(Sample(ep.conv, [t.reward + t.penalty for t in ep.turns]))
        turns = max(ep.traj.num_turns, 1)
        ep.traj.info = {k: v / turns for k, v in ep.info_sums.items()}
        ep.traj.success = ep.traj.success and ep.traj.terminated
