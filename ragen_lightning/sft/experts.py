"""Expert demonstrations: the environments' own experts answer in the exact text and token format of
RL rollouts.

An :class:`ExpertEngine` is a :class:`~ragen_lightning.rollout.engine.GenerationEngine` that ignores
the prompt and answers from the env state (the runner hands it ``env.unwrapped`` of every request
because it sets ``needs_envs = True``). Demonstrations are therefore produced by the real
:class:`~ragen_lightning.rollout.runner.RolloutRunner`: same system prompt, turn blocks, reward feedback, context
window and token ids as an RL rollout, with loss mask 1 exactly on the expert's response tokens
(RAGEN v1 shipped a supervised step on solver trajectories; it rendered them through its own text
pipeline, here they are token-exact).

The expert policy belongs to the env: its optional method ``expert_turn(max_actions) -> (reasoning,
actions)`` (documented on ``envs.base.TextEnv``), reached duck-typed through ``env.unwrapped``; this
library keeps no table of env names. An env without one fails at configuration time
(:func:`require_expert`) with a :class:`ConfigError`.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

from ragen_lightning.errors import ConfigError
from ragen_lightning.rollout import prompting, tool_calls
from ragen_lightning.rollout.engine import Generation, SamplingParams
from ragen_lightning.rollout.settings import EpisodeSettings

__all__ = [
    "ExpertEngine",
    "ExpertTurn",
    "collect_demonstrations",
    "expert_actions",
    "expert_turn",
    "lapse",
    "reading_clause_end",
    "reading_clauses",
    "render_response",
    "require_expert",
    "turn_spans",
]

EXPERT_METHOD = "expert_turn"
# The grid envs' experts reason "<what the observation shows>; <what I do>" ("goal is below and
# right of me; I go Down, Right"): the clause up to this character is the reading of the
# observation.
READING_END = ";"


@dataclass(frozen=True)
class ExpertTurn:
    """One expert answer.

    Attributes:
        reasoning: the text placed between ``<think>`` and ``</think>`` (dropped when thinking is off).
        actions: action words (discrete envs, ``env.action_names`` spelling) or answer strings
        (free-text envs).
    """

    reasoning: str
    actions: tuple[str, ...]


def missing_expert_message(env_class: type) -> str:
    return (
        f"--model.warm_start needs an expert: {env_class.__name__} has no {EXPERT_METHOD}(max_actions) method; "
        'see README "Add your own environment"'
    )


def require_expert(env_id: str, env_kwargs: dict[str, Any] | None = None) -> None:
    """Raise :class:`ConfigError` (one line, naming the env class) when the env of ``env_id`` has no
    expert."""
    from ragen_lightning.rollout.runner import make_env

    env = make_env(env_id, env_kwargs)
    try:
        if not callable(getattr(env.unwrapped, EXPERT_METHOD, None)):
            raise ConfigError(missing_expert_message(type(env.unwrapped)))
    finally:
        env.close()


def expert_turn(env: Any, max_actions: int = 2) -> ExpertTurn:
    """The expert's reasoning and actions for the env's current state (``env`` or its wrapper)."""
    if max_actions < 1:
        raise ValueError(f"max_actions must be >= 1, got {max_actions}")
    core = getattr(env, "unwrapped", env)
    method = getattr(core, EXPERT_METHOD, None)
    if not callable(method):
        raise ConfigError(missing_expert_message(type(core)))
    reasoning, actions = method(max_actions)
    actions = tuple(str(a) for a in actions)
    if not actions:
        raise RuntimeError(f"the expert of {type(core).__name__} proposed no action")
    return ExpertTurn(str(reasoning), actions[:max_actions])


def expert_actions(env: Any, max_actions: int = 2) -> list[str]:
    """The expert's next action words (discrete envs) or answer strings (free-text envs)."""
    return list(expert_turn(env, max_actions).actions)


def lapse(turn: ExpertTurn, env: Any, rng: random.Random, noise: float) -> ExpertTurn:
    """An imperfect expert's turn: with probability ``noise`` every action of ``turn`` is replaced by
    one drawn uniformly from ``env.action_names`` (the expert lapses for the turn), else ``turn``.

    A reasoning that ends with the action list (``"...; I go Down, Right"``) names the drawn actions
    instead, so the demonstration's reasoning and answer agree; the reading of the observation
    before it stays the expert's. Only envs with a discrete action set can lapse."""
    if noise <= 0 or rng.random() >= noise:
        return turn
    names = list(getattr(env, "action_names", None) or ())
    if not names:
        raise ConfigError(
            f"--model.warm_start.expert_noise needs an env with discrete actions (action_names); "
            f"{type(env).__name__} has none"
        )
    actions = tuple(rng.choice(names) for _ in turn.actions)
    said = ", ".join(turn.actions)
    reasoning = turn.reasoning
    if reasoning.endswith(said):
        reasoning = reasoning[: len(reasoning) - len(said)] + ", ".join(actions)
    return replace(turn, reasoning=reasoning, actions=actions)


def render_response(
    turn: ExpertTurn, enable_think: bool = True, tools: Sequence[Any] | None = None
) -> str:
    """The assistant text AFTER the generation prefix: ``"reasoning</think><answer>A || B</answer>"`` (thinking on)
    or ``"A || B</answer>"`` (off); with ``tools`` (the tool-call format) one call block per action instead,
    ``"reasoning</think>\n<tool_call>\n{...}\n</tool_call>"``."""
    if tools:
        calls = "\n".join(tool_calls.action_as_call(a, tools) for a in turn.actions)
        return turn.reasoning + prompting.THINK_CLOSE + "\n" + calls if enable_think else calls
    answer = f" {prompting.ACTION_SEP} ".join(turn.actions) + prompting.ANSWER_CLOSE
    if enable_think:
        return turn.reasoning + prompting.THINK_CLOSE + prompting.ANSWER_OPEN + answer
    return answer


class ExpertEngine:
    """A generation engine whose "samples" are the experts' answers, token for token.

    Args:
        tokenizer: the tokenizer of the model to be trained (the response is encoded without special tokens and
            closed with its eos id, like a sampled turn that stopped).
        episode: the runner's episode settings: ``enable_think`` True answers
        ``reasoning</think><answer>...`` (the
            runner's prefix is ``<think>``), False ``...</answer>`` after an ``<answer>`` prefix; the expert proposes
            ``max_actions_per_turn`` actions at most.
        noise: the probability that the expert lapses on a turn (:func:`lapse`): an imperfect
            expert, drawn from the turn's request seed (so an episode's lapses depend on its
            rollout seed and position alone, not on how the episodes are batched).
    """

    needs_envs = True  # the runner passes env.unwrapped of each request as ``envs``

    def __init__(self, tokenizer: Any, episode: EpisodeSettings | None = None, noise: float = 0.0):
        if not 0.0 <= noise <= 1.0:
            raise ValueError(f"expert noise must be in [0, 1], got {noise}")
        episode = episode if episode is not None else EpisodeSettings()
        if tokenizer.eos_token_id is None:
            raise ValueError("the tokenizer has no eos token to end an expert turn with")
        self.tokenizer = tokenizer
        self.enable_think = episode.enable_think
        self.max_actions_per_turn = episode.max_actions_per_turn
        self.tool_calls = episode.action_format == "tool_call"
        self.num_truncated = 0  # answers longer than max_new_tokens (cut, finish_reason "length")
        self.noise = noise

    def sync_weights(self) -> None:
        return None

    def _encode_after_prefix(self, text: str) -> list[int]:
        """The ids of ``text`` as the turn's response, so that prefix + response re-renders to the
        same ids.

        The prompt ends with the generation prefix's own ids (``<think>``), and the response is
        appended to them. Where the tokenizer merges the prefix's last character with the text's
        first (Qwen2.5's BPE, in which ``<think>`` is plain text, reads ``<think>I`` as ``<th``
        ``ink`` ``>I``), the demonstration would teach a split that re-rendering the conversation
        never produces; the text then starts with a space (``<think> I``, the spacing the prompt's
        format line shows), which every byte-level BPE splits from ``>``. Tokenizers that hold the
        tags as single tokens (the embedded model's) never merge: their demonstrations are
        unchanged.
        """
        encode = partial(self.tokenizer.encode, add_special_tokens=False)
        prefix = prompting.generation_prefix(self.enable_think, self.tool_calls)
        head = list(encode(prefix))
        if prefix and text and list(encode(prefix + text))[: len(head)] != head:
            text = " " + text
        return list(encode(text))

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        params: SamplingParams,
        seeds: Sequence[int] | None = None,
        envs: Sequence[Any] | None = None,
    ) -> list[Generation]:
        if envs is None or len(envs) != len(prompts):
            raise ValueError(
                "ExpertEngine answers from the env state: call it through RolloutRunner (which passes envs=...) or "
                f"pass one env per prompt (got {None if envs is None else len(envs)} envs for {len(prompts)} prompts)"
            )
        if self.noise and (seeds is None or len(seeds) != len(envs)):
            raise ValueError("an imperfect expert (noise > 0) needs one request seed per env")
        out = []
        for k, env in enumerate(envs):
            tools = env.prompt_spec().tools if self.tool_calls else None
            turn = expert_turn(env, self.max_actions_per_turn)
            if self.noise:
                turn = lapse(turn, env, random.Random(seeds[k]), self.noise)
            text = render_response(turn, self.enable_think, tools)
            ids = self._encode_after_prefix(text) + [self.tokenizer.eos_token_id]
            finish = "stop"
            if len(ids) > params.max_new_tokens:
                ids, finish = ids[: params.max_new_tokens], "length"
                self.num_truncated += 1
            out.append(Generation(ids, [0.0] * len(ids), finish))
        return out


def collect_demonstrations(
    env_id: str,
    tokenizer: Any,
    seeds: Sequence[int],
    *,
    env_kwargs: dict[str, Any] | None = None,
    episode: EpisodeSettings | None = None,
    noise: float = 0.0,
    first: int = 0,
):
    """Run one expert episode per seed through the real :class:`RolloutRunner`; returns its
    trajectories. ``noise``: an imperfect expert (:class:`ExpertEngine`); ``first``: the position
    of ``seeds[0]`` in the whole demonstration set (the episodes' request seeds, and so their
    lapses, are those of one run over the whole set).

    Each ``Trajectory.samples[i].conversation`` holds the exact prompt/turn token ids an RL rollout
    with the same ``episode`` settings would have and loss mask 1 on the expert's tokens.
    """
    from ragen_lightning.rollout.runner import RolloutRunner
    from ragen_lightning.rollout.tokens import ChatTokens

    episode = episode if episode is not None else EpisodeSettings()
    require_expert(env_id, env_kwargs)
    runner = RolloutRunner(
        env_id,
        env_kwargs,
        ChatTokens(tokenizer, enable_think=episode.enable_think),
        ExpertEngine(tokenizer, episode, noise),
        episode,
    )
    try:
        params = SamplingParams(temperature=0.0, max_new_tokens=episode.max_new_tokens)
        return runner.run(list(seeds), 1, params, first_group=first)
    finally:
        runner.close()


def turn_spans(mask: Sequence[int]) -> list[tuple[int, int]]:
    """``(start, end)`` of every run of 1s in a loss mask: one expert turn each."""
    spans, j = [], 0
    while j < len(mask):
        if mask[j]:
            end = j
            while end < len(mask) and mask[end]:
                end += 1
            spans.append((j, end))
            j = end
        else:
            j += 1
    return spans


def reading_clause_end(ids: Sequence[int], start: int, end: int, tokenizer: Any) -> int:
    """End (exclusive) of the reading clause of the expert response ``ids[start:end]``: just after
    the first token holding :data:`READING_END`; ``end`` when there is none (the whole response is
    then the clause)."""
    for j in range(start, end):
        if READING_END in tokenizer.decode([ids[j]]):
            return j + 1
    return end


def reading_clauses(demos: Sequence[Any], tokenizer: Any) -> list[Any]:
    """``demos`` with the loss mask of every expert turn cut to its reading clause
    (:func:`reading_clause_end`) and each sequence ending after its last trained token: the targets
    of a warm start's reading phase.

    Why: behind a chat prompt of a few hundred tokens the embedded 4-layer model learns to name
    where the goal lies (FrozenLake) when trained on that clause alone (0.78 exact on held-out maps
    after 500 steps of 32) but not when the same steps train the whole response (0.18, the prior),
    whose moves and answer follow from the clause under teacher forcing (docs/learning.md, "Reading
    first").
    """
    out = []
    for d in demos:
        ids, mask = d.input_ids, list(d.loss_mask)
        for start, end in turn_spans(mask):
            cut = reading_clause_end(ids, start, end, tokenizer)
            mask[cut:end] = [0] * (end - cut)
        last = max(i for i, m in enumerate(mask) if m) + 1
        out.append(type(d)(tuple(ids[:last]), tuple(mask[:last])))  # a Demonstration (sft.module)
    return out
