"""Held-out rollouts of a model with the HF engine: the warm start's before/after report and the
learning benchmark's evaluation (``python main.py evaluate`` is the full evaluation: suites, passes,
intervals)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from ragen_lightning import models
from ragen_lightning.rollout.seeds import episode_seeds
from ragen_lightning.rollout.settings import EpisodeSettings, as_episode


def evaluate_policy(
    model: str | Path | torch.nn.Module,
    env_id: str,
    env_kwargs: dict[str, Any] | None = None,
    *,
    tokenizer: Any = None,
    num_episodes: int = 64,
    seed: int = 0,
    exclude_seeds: Sequence[int] = (),
    temperature: float = 1.0,
    episode: EpisodeSettings | dict[str, Any] | None = None,
    max_batch_size: int = 128,
    per_episode: bool = False,
) -> dict[str, Any]:
    """Roll out ``model`` with the HF engine on held-out seeds (``episode_seeds(seed, n, "eval")``)
    under the ``episode`` settings (use the RL run's).

    Returns ``format_valid_rate`` (turns with a well-formed answer whose actions were all valid,
    i.e. no format penalty), ``success_rate``, ``mean_return`` (env reward) and ``mean_turns``;
    with ``per_episode`` also ``seeds`` and ``successes`` (0/1 per episode, in seed order), for
    paired comparisons of policies on the same levels.
    """
    from ragen_lightning.rollout.engine import HFEngine, SamplingParams
    from ragen_lightning.rollout.runner import RolloutRunner
    from ragen_lightning.rollout.tokens import ChatTokens

    if isinstance(model, torch.nn.Module):
        if tokenizer is None:
            raise ValueError("pass the tokenizer along with a model object")
        net = model
    else:
        tokenizer = tokenizer or models.load_tokenizer(str(model))
        net = models.load_causal_lm(str(model))
    episode = as_episode(episode)
    engine = HFEngine(
        net, [tokenizer.eos_token_id], tokenizer.pad_token_id, max_batch_size=max_batch_size
    )
    runner = RolloutRunner(
        env_id,
        env_kwargs,
        ChatTokens(tokenizer, enable_think=episode.enable_think),
        engine,
        episode,
    )
    seeds = episode_seeds(seed, num_episodes, "eval", exclude=exclude_seeds)
    params = SamplingParams(temperature=temperature, max_new_tokens=episode.max_new_tokens)
    try:
        trajs = runner.run(seeds, 1, params, seed=seed)
    finally:
        runner.close()
    turns = sum(t.num_turns for t in trajs)
    out: dict[str, Any] = {
        "format_valid_rate": 1.0 - sum(t.num_format_errors for t in trajs) / max(turns, 1),
        "success_rate": sum(t.success for t in trajs) / len(trajs),
        "mean_return": sum(t.env_return for t in trajs) / len(trajs),
        "mean_turns": turns / len(trajs),
    }
    if per_episode:
        out["seeds"] = [int(s) for s in seeds]
        out["successes"] = [int(bool(t.success)) for t in trajs]
    return out
