"""Cached supervised warm start of a model on expert demonstrations, and a rollout evaluation of the result.

A random network cannot find the ``<think>...</think><answer>...</answer>`` format by chance, so before RL the tiny
preset is fine-tuned for a few hundred optimizer steps on the environments' own solver demonstrations (RAGEN v1
shipped the same SFT step, on BFS trajectories). :func:`warm_start` returns the folder of the warm-started copy:

* cached under ``tiny.cache_root()/warm-<key>``, the key hashing every argument, the base model folder's name (the
  tiny model's folder name hashes its own spec and corpus, so a rebuilt tiny model gets a new warm start) and the
  source of the experts and of the env's module (a changed expert or level generator gets a new warm start);
* written to a temporary folder and renamed into place, so a crash never leaves a half-written model behind and two
  processes racing on the same key end with the same folder;
* deterministic for a seed: fixed demonstration seeds, seeded initialisation order and batch order.

The loop is plain PyTorch (no Trainer start-up cost) but its loss is :func:`~ragen_lightning.sft.module.
causal_lm_sft_loss`, the function :class:`~ragen_lightning.sft.module.SFTModule` trains with.

Run ``python -m ragen_lightning.sft.warm_start --env ragen/SimpleSokoban-v0`` to warm-start and print the
format-valid and success rates of the base and warm-started models on held-out seeds.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Sequence

import torch

from ragen_lightning import models
from ragen_lightning.errors import ConfigError, Domain, check_domains
from ragen_lightning.parallel.threads import backward_in_order, torch_threads_set
from ragen_lightning.rollout.seeds import episode_seeds
from ragen_lightning.rollout.settings import (
    EpisodeSettings,
    add_episode_arguments,
    as_episode,
    episode_from_args,
)
from ragen_lightning.sft.experts import reading_clauses, require_expert
from ragen_lightning.sft.module import (
    Demonstration,
    LRSchedule,
    build_demonstrations,
    causal_lm_sft_loss,
    collate,
    lr_factor,
    save_model,
)
from ragen_lightning.sft.progress import Progress, note

# Bump when the training recipe changes in a way the arguments do not show.
# 2: the shared-prefix SFT forward (same loss; gradients equal to float rounding, so other bits).
# 3: shuffled batches instead of length-grouped ones (see shuffled_batches).
_WARM_VERSION = 3
META_FILE = "warm_start.json"
DEFAULT_STEPS = 150  # for an env that gives no ``warm_start_steps`` hint


def _env_class(env_id: str, env_kwargs: dict[str, Any] | None) -> type:
    from ragen_lightning.rollout.runner import make_env

    env = make_env(env_id, env_kwargs)
    try:
        return type(env.unwrapped)
    finally:
        env.close()


def default_steps(env_id: str, env_kwargs: dict[str, Any] | None = None) -> int:
    """Optimizer steps of a warm start when none are given: the env's own ``warm_start_steps`` hint, else 150."""
    return int(getattr(_env_class(env_id, env_kwargs), "warm_start_steps", DEFAULT_STEPS))


def demonstration_kwargs(env_id: str, env_kwargs: dict[str, Any] | None) -> dict[str, Any]:
    """``env_kwargs`` less the env's ``reward_only_kwargs`` (reward settings such as Sokoban's ``distance_reward``:
    they change no observation and no expert action, so the same demonstrations and the same cached warm start
    serve every value)."""
    kwargs = dict(env_kwargs or {})
    if not kwargs:
        return kwargs
    reward_only = set(getattr(_env_class(env_id, env_kwargs), "reward_only_kwargs", ()))
    return {k: v for k, v in kwargs.items() if k not in reward_only}


def code_fingerprint(env_id: str, env_kwargs: dict[str, Any] | None = None) -> str:
    """Hash of the source files that decide the demonstrations: the expert engine, the modules of the env class and
    its own base classes (the expert policy is an env method) and the modules of their package those use. Editing any of them (a better expert, a changed
    level generator) must not reuse a warm start built from the old demonstrations.

    Read once per env class and process: the code this process runs is the code it imported, so a source file
    edited during a run (its validation, then its fit, each look the warm start up) does not send it to rebuild."""
    return _class_fingerprint(_env_class(env_id, env_kwargs))


@functools.cache
def _class_fingerprint(env_class: type) -> str:
    import inspect

    from ragen_lightning.sft import experts

    owners = [c for c in env_class.__mro__ if c.__module__.split(".")[0] not in ("builtins", "gymnasium", "typing")]
    modules = dict.fromkeys(inspect.getmodule(c) or c for c in owners)
    h = hashlib.sha256()
    for obj in (experts, *modules, *_package_helpers([m for m in modules if inspect.ismodule(m)])):
        try:
            h.update(Path(inspect.getfile(obj)).read_bytes())
        except (TypeError, OSError):  # built-in or source not on disk: the class name is the best we have
            h.update(getattr(obj, "__qualname__", repr(obj)).encode())
    return h.hexdigest()[:16]


def _package_helpers(roots: list[Any]) -> list[Any]:
    """The modules of the env's own package that ``roots`` use, transitively (the level generator, the board
    renderer or the reward an env module imports from a sibling), sorted by name; ``roots`` themselves left out."""
    import inspect

    seen = {m.__name__: m for m in roots}
    todo = list(roots)
    while todo:
        module = todo.pop()
        package = module.__name__.split(".")[0]
        for value in list(vars(module).values()):
            used = value if inspect.ismodule(value) else inspect.getmodule(value)
            name = getattr(used, "__name__", "")
            if used is not None and name.split(".")[0] == package and name not in seen:
                seen[name] = used
                todo.append(used)
    own = {m.__name__ for m in roots}
    return [seen[name] for name in sorted(seen) if name not in own]


def warm_start_key(model: str, base_path: str | Path, args: dict[str, Any], code: str = "") -> str:
    """The cache key: every argument, the base model folder's name, the demonstration code's fingerprint and the
    recipe version."""
    payload = {"model": model, "base": Path(base_path).name, "args": args, "code": code, "version": _WARM_VERSION}
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()[:16]


def shuffled_batches(count: int, batch_size: int, generator: torch.Generator) -> list[list[int]]:
    """One epoch of batches of a seeded random permutation of ``range(count)``.

    Not grouped by length: a demonstration's length follows its target (a FrozenLake reading clause ``goal is
    above of me;`` is shorter than ``goal is below and right of me;``, a bandit answer's length is its arm's name), so
    length-grouped batches each hold one target, and the model learned that batch's answer instead of the map (a
    reading clause stayed at the prior, 0.12 exact, after 500 grouped steps; docs/learning.md, "Reading first").
    """
    order = torch.randperm(count, generator=generator).tolist()
    return [order[k:k + batch_size] for k in range(0, count, batch_size)]


def sft_backward(model: torch.nn.Module, examples: Sequence[Demonstration], pad_token_id: int,
                 threads: int = 1) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Backward of the batch's token-mean SFT loss; returns ``(loss, metrics)`` detached.

    With ``threads`` > 1 the examples (longest first, dealt in turn so the parts are about equally long) form that
    many parts, each collated, run and backpropagated on its own thread with its loss weighted by its share of the
    trained tokens, the parts' gradients added in order
    (:func:`~ragen_lightning.parallel.threads.backward_in_order`): the summed gradient is the whole batch's to float
    rounding, and the same bit for bit on every run."""
    if threads <= 1 or len(examples) < 2:
        loss, metrics = causal_lm_sft_loss(model, collate(examples, pad_token_id))
        loss.backward()
        return loss.detach(), metrics
    ordered = sorted(examples, key=lambda e: -len(e.input_ids))
    parts = [ordered[k::threads] for k in range(min(threads, len(ordered)))]
    counts = [sum(sum(e.loss_mask[1:]) for e in part) for part in parts]
    total = max(sum(counts), 1)

    def run(k: int) -> tuple[torch.Tensor, tuple[torch.Tensor, dict[str, torch.Tensor]]]:
        loss, metrics = causal_lm_sft_loss(model, collate(parts[k], pad_token_id))
        share = counts[k] / total
        return loss * share, (loss.detach() * share,
                              {name: v * share for name, v in metrics.items() if name != "sft/num_tokens"})

    done = backward_in_order(run, range(len(parts)), threads, model.parameters())
    metrics = {name: sum(m[name] for _, m in done) for name in done[0][1]}
    metrics["sft/num_tokens"] = torch.tensor(float(sum(counts)))
    return sum(loss for loss, _ in done), metrics


def train_sft(model: torch.nn.Module, demos: Sequence[Demonstration], pad_token_id: int, *, steps: int, lr: float,
              batch_size: int, weight_decay: float = 0.0, warmup_steps: int = 10, lr_schedule: LRSchedule = "cosine",
              max_grad_norm: float = 1.0, seed: int = 0, log_every: int = 0,
              reading_demos: Sequence[Demonstration] = (), reading_steps: int = 0, threads: int = 1,
              progress: Progress | None = None) -> list[float]:
    """``steps`` AdamW steps of the SFT loss (:func:`shuffled_batches`, seeded order): the first ``reading_steps`` on
    ``reading_demos``, the rest on ``demos``, under one learning-rate schedule; returns the loss of every step.
    ``threads`` > 1 splits each batch into that many parts computed at once on CPU threads (:func:`sft_backward`).
    ``progress`` is told every step and its loss (the caller closes it)."""
    if not demos or (reading_steps and not reading_demos):
        raise ValueError("no demonstrations to train on")
    generator = torch.Generator().manual_seed(seed)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: lr_factor(step, warmup_steps, steps, lr_schedule)
    )
    queue: list[list[int]] = []
    losses: list[float] = []
    model.train()
    start = time.perf_counter()
    for step in range(steps):
        source = reading_demos if step < reading_steps else demos
        if not queue or step == reading_steps:
            queue = shuffled_batches(len(source), batch_size, generator)[::-1]  # pop() takes them in order
        loss, metrics = sft_backward(model, [source[i] for i in queue.pop()], pad_token_id, threads)
        if max_grad_norm > 0:
            torch.nn.utils.clip_grad_norm_(params, max_grad_norm)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(float(loss.detach()))
        if progress is not None:
            progress.update(step + 1, loss=losses[-1])
        if log_every and (step + 1) % log_every == 0:
            print(f"step {step + 1}/{steps} loss {losses[-1]:.4f} acc {float(metrics['sft/token_accuracy']):.3f} "
                  f"({time.perf_counter() - start:.1f}s)", flush=True)
    model.eval()
    return losses


def warm_start(model: str = "tiny", env_id: str = "ragen/SimpleSokoban-v0", env_kwargs: dict[str, Any] | None = None,
               *, steps: int | None = None, num_episodes: int = 512, lr: float = 3e-3, batch_size: int = 4,
               weight_decay: float = 0.0, warmup_steps: int = 10, lr_schedule: LRSchedule = "cosine", seed: int = 0,
               reading_steps: int = 0, episode: EpisodeSettings | dict[str, Any] | None = None,
               only_successful: bool = False, dtype: str = "float32", cache_dir: str | Path | None = None,
               torch_threads: int | None = 1, threads: int = 1, verbose: bool = False,
               more_envs: Sequence[tuple[str, dict[str, Any] | None, EpisodeSettings | None]] = ()) -> Path:
    """The folder of ``model`` fine-tuned on expert demonstrations of ``env_id`` (built once, then cached).

    Args:
        model: ``"tiny"``, a local Hugging Face folder or a hub id (the base model).
        env_id: registered gymnasium id of the demonstrations' env (``import envs`` registers the project's).
        env_kwargs: keyword arguments of the env.
        steps: optimizer steps; None: :func:`default_steps` (150; 500 for the bandit).
        num_episodes: expert episodes (training seeds ``episode_seeds(seed, num_episodes, "train")``).
        lr: AdamW learning rate (peak; linear warm-up, then ``lr_schedule``). 3e-3 suits the ~1M-parameter tiny
            model; use ~1e-5..1e-4 for real LLMs.
        batch_size: sequences per step.
        weight_decay: AdamW weight decay.
        warmup_steps: linear warm-up steps.
        lr_schedule: ``constant`` or ``cosine`` (to 10 % of ``lr``).
        seed: seeds the demonstration seeds, the batch order and torch's RNG during training.
        reading_steps: the first ``reading_steps`` of the ``steps`` train only the reasoning's reading clause of
            every expert turn (:func:`~ragen_lightning.sft.experts.reading_clauses`: up to its first ``;``, e.g.
            ``goal is below and right of me;``), the rest the whole response. The embedded model learns to read a
            grid this way and not from whole responses (docs/learning.md, "Reading first"); 0 (default) is off.
        episode: episode settings of the demonstrations (use the RL run's ``--data.episode`` so the formats match;
            the expert proposes ``max_actions_per_turn`` actions per turn). A mapping overrides single defaults.
            Every field but ``format_penalty`` (which does not change a demonstration) is part of the cache key.
        only_successful: train only on episodes the env marked successful.
        dtype: parameter dtype while training and in the saved folder.
        cache_dir: where warm-started folders live (default ``tiny.cache_root()``).
        torch_threads: CPU threads while building (restored afterwards; None keeps torch's setting). The tiny
            model trains fastest with 1: per-op threading overhead dominates it, and two threads stall badly when
            another process holds a core (measured 1.25 s vs 3.2-5.9 s per step). Not part of the cache key.
        threads: parts of each batch trained at once on CPU threads, one op thread each (:func:`sft_backward`;
            2 on a 2-core machine). The gradient is the same to float rounding: not part of the cache key.
        verbose: also print the loss and token accuracy every 25 steps (the progress line, on stderr, is always on).
        more_envs: further ``(env_id, env_kwargs, episode)`` whose demonstrations join ``env_id``'s (an environment
            mixture, ``--data.env.mixture``): ``num_episodes`` expert episodes of each env, in its own episode settings
            (None: ``episode``), trained on as one shuffled set; ``steps`` None takes the largest of the envs' hints.
            Empty (default): the key is the single env's of before.

    Returns:
        the folder (``save_pretrained`` model + tokenizer + ``warm_start.json`` with the arguments, demo statistics,
        losses and wall time).
    """
    require_expert(env_id, env_kwargs)  # one line naming the env class, before anything is built
    episode = as_episode(episode)
    more = [(i, k, as_episode(e) if e is not None else episode) for i, k, e in more_envs]
    steps = _checked_steps(env_id, env_kwargs, more, steps, num_episodes, batch_size, reading_steps)
    recipe = {"steps": steps, "num_episodes": num_episodes, "lr": lr, "batch_size": batch_size,
              "weight_decay": weight_decay, "warmup_steps": warmup_steps, "lr_schedule": lr_schedule, "seed": seed,
              "only_successful": only_successful, "dtype": dtype}
    args, code = _key_args(env_id, env_kwargs, episode, more, recipe, reading_steps)
    final, root, base = _cache_folder(model, cache_dir, args, code)
    if _cached(final):
        return final
    with torch_threads_set(torch_threads):
        return _build(final, root, base, args, episode, verbose, threads, more)


Sources = Sequence[tuple[str, dict[str, Any] | None, EpisodeSettings]]  # (env_id, env_kwargs, episode) of a mixture


def _checked_steps(env_id: str, env_kwargs: dict[str, Any] | None, more: Sources, steps: int | None,
                   num_episodes: int, batch_size: int, reading_steps: int) -> int:
    """``steps`` (None: the largest of the envs' hints), once every env has an expert and the counts are valid."""
    for more_id, more_kwargs, _ in more:
        require_expert(more_id, more_kwargs)
    if steps is None:
        steps = max(default_steps(i, k) for i, k in [(env_id, env_kwargs)] + [(i, k) for i, k, _ in more])
    if steps < 1 or num_episodes < 1 or batch_size < 1:
        raise ValueError(f"steps, num_episodes and batch_size must be >= 1, got {steps}, {num_episodes}, {batch_size}")
    if not 0 <= reading_steps < steps:
        raise ConfigError(f"--model.warm_start.reading_steps must be >= 0 and below steps ({steps}), got {reading_steps}")
    return steps


def _key_args(env_id: str, env_kwargs: dict[str, Any] | None, episode: EpisodeSettings, more: Sources,
              recipe: dict[str, Any], reading_steps: int) -> tuple[dict[str, Any], str]:
    """``(args, code)``: what the cache key hashes (also recorded in ``warm_start.json``) and the demonstration code's
    fingerprint. ``recipe``: steps to dtype, in the signature's order."""
    # the key hashes the same flat names as before EpisodeSettings existed, so existing caches keep their keys
    args = dict(env_id=env_id, **recipe, env_kwargs=demonstration_kwargs(env_id, env_kwargs),
                **episode.demonstration_fields())
    if reading_steps:  # only when on: warm starts built before the option keep their keys
        args["reading_steps"] = reading_steps
    code = code_fingerprint(env_id, env_kwargs)
    if more:  # only for a mixture: single-env warm starts keep their keys
        args["more_envs"] = [dict(env_id=i, env_kwargs=demonstration_kwargs(i, k), **e.demonstration_fields())
                             for i, k, e in more]
        code += "".join(code_fingerprint(i, k) for i, k, _ in more)
    return args, code


def _cache_folder(model: str, cache_dir: str | Path | None, args: dict[str, Any], code: str) -> tuple[Path, Path, str]:
    """``(folder, cache root, base model folder)`` of a warm start."""
    from ragen_lightning.models.tiny import cache_root

    base = models.resolve_model_path(model)
    root = Path(cache_dir) if cache_dir is not None else cache_root()
    return root / f"warm-{warm_start_key(model, base, args, code)}", root, base


def _cached(folder: Path) -> bool:
    """Whether the warm start ``folder`` is built (then one line says it was found)."""
    found = (folder / META_FILE).is_file()
    if found:
        note(f"warm start: found in the cache, {folder}")
    return found


def _build(final: Path, root: Path, base: str, args: dict[str, Any], episode: EpisodeSettings,
           verbose: bool, threads: int = 1, more: Sequence[tuple[str, dict | None, EpisodeSettings]] = ()) -> Path:
    started = time.perf_counter()
    env_id, seed, only_successful = args["env_id"], args["seed"], args["only_successful"]
    num_episodes, dtype = args["num_episodes"], args["dtype"]
    tokenizer = models.load_tokenizer(base)
    demos: list[Demonstration] = []
    stats: dict[str, Any] = {}  # one env: its statistics; a mixture: those of each env, by position
    sources = [(env_id, args["env_kwargs"], episode)] + [(i, demonstration_kwargs(i, k), e) for i, k, e in more]
    note(f"warm start: {final.name} is not in the cache; building it (solver demonstrations, then {args['steps']} "
         "SFT steps)")
    shown = Progress("warm start: demonstrations", num_episodes * len(sources), unit="episode")
    for n, (source_id, source_kwargs, source_episode) in enumerate(sources):
        env_demos, env_stats = build_demonstrations(source_id, tokenizer, episode_seeds(seed, num_episodes, "train"),
                                                    env_kwargs=source_kwargs, episode=source_episode,
                                                    only_successful=only_successful, progress=shown)
        if not env_demos:
            raise ValueError(f"no demonstrations for {source_id}: {env_stats}")
        demos += env_demos
        if more:
            stats[f"env{n}"] = {"env_id": source_id, **env_stats}
        else:
            stats = env_stats
    shown.close()
    with torch.random.fork_rng(devices=[]), Progress("warm start", args["steps"]) as shown:
        torch.manual_seed(seed)
        net = models.load_causal_lm(base, dtype)
        reading_steps = args.get("reading_steps", 0)
        losses = train_sft(net, demos, tokenizer.pad_token_id, steps=args["steps"], lr=args["lr"],
                           batch_size=args["batch_size"], weight_decay=args["weight_decay"],
                           warmup_steps=args["warmup_steps"], lr_schedule=args["lr_schedule"], seed=seed,
                           log_every=25 if verbose else 0, reading_steps=reading_steps, threads=threads,
                           reading_demos=reading_clauses(demos, tokenizer) if reading_steps else (), progress=shown)

    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".warm-", dir=root))
    try:
        save_model(net, tokenizer, tmp)
        meta = {"base_model": str(base), "args": args, "demo_stats": stats, "losses": losses,
                "wall_s": time.perf_counter() - started, "version": _WARM_VERSION}
        (tmp / META_FILE).write_text(json.dumps(meta, indent=1, default=str))
        try:
            os.replace(tmp, final)
        except OSError:  # another process finished the same key first; its folder is equivalent
            if not (final / META_FILE).is_file():
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    note(f"warm start: saved {final} ({time.perf_counter() - started:.0f} s)")
    return final


# ``--model.warm_start: {...}`` keys: the arguments of :func:`warm_start` that the module does not supply itself
_SETTING_DOMAINS = {
    "steps": Domain(low=1, integer=True, none=True), "num_episodes": Domain(low=1, integer=True),
    "lr": Domain(low=0, low_open=True), "batch_size": Domain(low=1, integer=True), "weight_decay": Domain(low=0),
    "warmup_steps": Domain(low=0, integer=True), "seed": Domain(low=0, integer=True),
    "reading_steps": Domain(low=0, integer=True),
    "torch_threads": Domain(low=1, integer=True, none=True), "threads": Domain(low=1, integer=True),
}
_SETTING_OTHERS = {"lr_schedule", "episode", "only_successful", "dtype", "cache_dir", "verbose"}


def check_warm_start_setting(setting: Any) -> None:
    """Raise :class:`ConfigError` for a ``--model.warm_start`` value that :func:`warm_started_path` would fail on
    after the run started: an unknown key, a value outside its domain, an unknown ``lr_schedule``."""
    if not isinstance(setting, dict):
        return
    allowed = sorted({*_SETTING_DOMAINS, *_SETTING_OTHERS})
    unknown = sorted(set(setting) - set(allowed))
    if unknown:
        raise ConfigError(f"--model.warm_start: unknown key {unknown[0]!r} (allowed: {', '.join(allowed)})")
    check_domains("--model.warm_start.", setting, _SETTING_DOMAINS)
    if setting.get("lr_schedule", "cosine") not in ("constant", "cosine"):
        raise ConfigError(f"--model.warm_start.lr_schedule must be 'constant' or 'cosine', got {setting['lr_schedule']!r}")
    if isinstance(setting.get("episode"), dict):
        as_episode(setting["episode"])
    steps, reading = setting.get("steps"), setting.get("reading_steps", 0)
    if isinstance(steps, int) and isinstance(reading, int) and reading >= steps:
        raise ConfigError(f"--model.warm_start.reading_steps must be below steps ({steps}), got {reading}")


def warm_started_path(model: str, setting: bool | dict[str, Any], datamodule) -> str:
    """The actor's folder for a fit: ``model`` resolved, or (``--model.warm_start`` on) the cached warm start on the
    data module's env, with demonstrations in exactly the rollouts' format: the data module's episode settings,
    unless the setting names its own (``warm_start: {episode: {...}}`` overrides single fields)."""
    if not setting:
        return models.resolve_model_path(model)
    if datamodule is None:
        raise ConfigError("--model.warm_start needs the RolloutDataModule (it names the env to learn from)")
    kwargs = dict(setting) if isinstance(setting, dict) else {}
    episode = getattr(datamodule, "episode", None)
    if isinstance(kwargs.get("episode"), dict) and episode is not None:
        kwargs["episode"] = dataclasses.replace(episode, **kwargs["episode"])
    kwargs.setdefault("episode", episode)
    base = as_episode(kwargs["episode"])
    # the data module's training entries (a mixture: demonstrations of every one, each in its episode settings)
    entries = getattr(datamodule, "train_entries", None)
    if not entries:
        env = datamodule.settings.env
        return str(warm_start(model, env.id, env.kwargs, **kwargs))
    first, rest = entries[0], entries[1:]
    kwargs["episode"] = first.episode_settings(base)
    more = [(e.env_id, e.env_kwargs, e.episode_settings(base)) for e in rest]
    return str(warm_start(model, first.env_id, first.env_kwargs, **kwargs, more_envs=more))


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
) -> dict[str, float]:
    """Roll out ``model`` with the HF engine on held-out seeds (``episode_seeds(seed, n, "eval")``) under the
    ``episode`` settings (use the RL run's).

    Returns ``format_valid_rate`` (turns with a well-formed answer whose actions were all valid, i.e. no format
    penalty), ``success_rate``, ``mean_return`` (env reward) and ``mean_turns``.
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
    engine = HFEngine(net, [tokenizer.eos_token_id], tokenizer.pad_token_id)
    runner = RolloutRunner(env_id, env_kwargs, ChatTokens(tokenizer, enable_think=episode.enable_think), engine,
                           episode)
    seeds = episode_seeds(seed, num_episodes, "eval", exclude=exclude_seeds)
    params = SamplingParams(temperature=temperature, max_new_tokens=episode.max_new_tokens)
    try:
        trajs = runner.run(seeds, 1, params, seed=seed)
    finally:
        runner.close()
    turns = sum(t.num_turns for t in trajs)
    return {
        "format_valid_rate": 1.0 - sum(t.num_format_errors for t in trajs) / max(turns, 1),
        "success_rate": sum(t.success for t in trajs) / len(trajs),
        "mean_return": sum(t.env_return for t in trajs) / len(trajs),
        "mean_turns": turns / len(trajs),
    }


def _default(name: str) -> Any:
    import inspect

    return inspect.signature(warm_start).parameters[name].default


def _parser():
    import argparse

    parser = argparse.ArgumentParser(prog="python -m ragen_lightning.sft.warm_start",
                                     description="Warm-start a model on expert demonstrations and evaluate it.")
    parser.add_argument("--env", default="ragen/SimpleSokoban-v0", help="env id")
    parser.add_argument("--env-kwargs", default="{}", help="env keyword arguments as JSON")
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--num-episodes", type=int, default=None)
    parser.add_argument("--lr", type=float, default=None)
    parser.add_argument("--batch-size", type=int, default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--eval-episodes", type=int, default=64)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--no-base", action="store_true", help="skip evaluating the base model")
    parser.add_argument("--cache-dir", default=None)
    parser.add_argument("--torch-threads", type=int, default=1, help="CPU threads (1 is fastest for the tiny model)")
    parser.add_argument("--threads", type=int, default=1, help="parts of a batch trained at once (one per core)")
    parser.add_argument("--import", dest="modules", action="append", default=None,
                        help="module registering the env ids (default: the installed env packages, the "
                        "ragen_lightning.envs entry points)")
    add_episode_arguments(parser)  # the demonstrations' and the evaluations' episodes
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Warm-start, printing the evaluation of the base and the warm-started model; a bad setting is one line on
    stderr and exit status 2."""
    from ragen_lightning.rollout.env_packages import import_env_packages

    a = _parser().parse_args(argv)
    torch.set_num_threads(a.torch_threads)
    try:
        try:
            import_env_packages(a.modules)
        except ImportError as e:
            raise ConfigError(f"--import: {e}") from None
        episode = episode_from_args(a)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    env_kwargs = json.loads(a.env_kwargs)
    overrides = {k: v for k, v in dict(steps=a.steps, num_episodes=a.num_episodes, lr=a.lr,
                                      batch_size=a.batch_size).items() if v is not None}
    # held-out levels: the evaluation seeds never include a demonstration's seed
    demo_seeds = episode_seeds(a.seed, overrides.get("num_episodes", _default("num_episodes")), "train")
    evaluate = dict(num_episodes=a.eval_episodes, temperature=a.temperature, seed=a.seed, exclude_seeds=demo_seeds,
                    episode=episode)

    if not a.no_base:
        t = time.perf_counter()
        print("base", a.model, evaluate_policy(a.model, a.env, env_kwargs, **evaluate),
              f"({time.perf_counter() - t:.1f}s)", flush=True)
    t = time.perf_counter()
    path = warm_start(a.model, a.env, env_kwargs, seed=a.seed, cache_dir=a.cache_dir, verbose=True, episode=episode,
                      threads=a.threads, **overrides)
    meta = json.loads((path / META_FILE).read_text())
    print(f"warm start: {path} ({time.perf_counter() - t:.1f}s; trained in {meta['wall_s']:.1f}s, "
          f"loss {meta['losses'][0]:.3f} -> {meta['losses'][-1]:.3f}; demos {meta['demo_stats']})", flush=True)
    t = time.perf_counter()
    print("warm", evaluate_policy(path, a.env, env_kwargs, **evaluate), f"({time.perf_counter() - t:.1f}s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
