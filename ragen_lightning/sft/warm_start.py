"""Cached supervised warm start of a model on expert demonstrations, and a rollout evaluation of the
result.

A random network cannot find the ``<think>...</think><answer>...</answer>`` format by chance, so
before RL the tiny preset is fine-tuned for a few hundred optimizer steps on the environments' own
solver demonstrations (RAGEN v1 shipped the same SFT step, on BFS trajectories). :func:`warm_start`
returns the folder of the warm-started copy:

* cached under ``tiny.cache_root()/warm-<key>``, the key hashing every argument, the base model
  folder's name (the tiny model's folder name hashes its own spec and corpus, so a rebuilt tiny
  model gets a new warm start) and the source of the experts and of the env's module (a changed
  expert or level generator gets a new warm start);
* written to a temporary folder and renamed into place, so a crash never leaves a half-written model
  behind and two processes racing on the same key end with the same folder;
* deterministic for a seed: fixed demonstration seeds, seeded initialisation order and batch order.

The loop (:func:`~ragen_lightning.sft.training.train_sft`) is plain PyTorch, with the loss
:class:`~ragen_lightning.sft.module.SFTModule` trains with.

Run ``python main.py warm_start --config configs/<task>.yaml`` (the fit's env, episode and
``--model.warm_start`` recipe) or ``python main.py warm_start --data.env.id ragen/SimpleSokoban-v0``
to warm-start and print the format-valid and success rates of the base and warm-started models on
held-out seeds.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ragen_lightning import models
from ragen_lightning.errors import ConfigError, Domain, check_domains
from ragen_lightning.parallel.threads import torch_threads_set
from ragen_lightning.rollout.seeds import episode_seeds
from ragen_lightning.rollout.settings import EpisodeSettings, as_episode, as_settings
from ragen_lightning.sft.evaluation import evaluate_policy
from ragen_lightning.sft.experts import reading_clauses, require_expert
from ragen_lightning.sft.fingerprint import (
    WARM_VERSION,
    code_fingerprint,
    default_steps,
    demonstration_kwargs,
    warm_start_key,
)
from ragen_lightning.sft.module import Demonstration, LRSchedule, build_demonstrations, save_model
from ragen_lightning.sft.progress import Progress, note
from ragen_lightning.sft.training import train_sft

META_FILE = "warm_start.json"


@dataclass(frozen=True)
class WarmStartSettings:
    """The supervised warm start's recipe (``--model.warm_start.*``; ``python main.py warm_start``
    takes the same). Every field but ``cache_dir``, ``torch_threads``, ``threads`` and ``verbose``
    is part of the cache key.

    Args:
        steps: optimizer steps; null: :func:`default_steps` (the env's hint, else 150; the largest
            of a mixture's).
        num_episodes: expert episodes per env (training seeds ``episode_seeds(seed, num_episodes,
            "train")``).
        lr: AdamW learning rate (peak; linear warm-up, then ``lr_schedule``). 3e-3 suits the
        ~1M-parameter tiny
            model; use ~1e-5..1e-4 for real LLMs.
        batch_size: sequences per step.
        weight_decay: AdamW weight decay.
        warmup_steps: linear warm-up steps.
        lr_schedule: ``constant`` or ``cosine`` (to 10 % of ``lr``).
        seed: seeds the demonstration seeds, the batch order and torch's RNG during training.
        reading_steps: the first ``reading_steps`` train only the reasoning's reading clause of
            every expert turn (:func:`~ragen_lightning.sft.experts.reading_clauses`;
            docs/learning.md, "Reading first"); 0: off.
        only_successful: train only on episodes the env marked successful.
        expert_noise: an imperfect expert: the probability that it lapses on a turn, every action of
            the turn then drawn uniformly from the env's action names (and named so in the
            reasoning; :func:`~ragen_lightning.sft.experts.lapse`). 0: the env's expert as it is.
            Discrete-action envs only; the demonstrations' success rate is logged as
            ``demo/expert_success_rate``.
        dtype: parameter dtype while training and in the saved folder.
        episode: episode settings of the demonstrations that differ from the run's
            ``--data.episode`` (keys of ``EpisodeSettings``); unset: exactly the rollouts' format.
        cache_dir: where warm-started folders live (default ``tiny.cache_root()``).
        torch_threads: CPU threads while building (restored afterwards; null keeps torch's setting);
            1 is fastest for the tiny model.
        threads: parts of each batch trained at once on CPU threads, one op thread each
            (:func:`~ragen_lightning.sft.training.sft_backward`); the gradient is the same to float
            rounding.
        verbose: also print the loss and token accuracy every 25 steps (the progress line is always
            on).
    """

    steps: int | None = None
    num_episodes: int = 512
    lr: float = 3e-3
    batch_size: int = 4
    weight_decay: float = 0.0
    warmup_steps: int = 10
    lr_schedule: LRSchedule = "cosine"
    seed: int = 0
    reading_steps: int = 0
    only_successful: bool = False
    expert_noise: float = 0.0
    dtype: str = "float32"
    episode: dict[str, Any] | None = None
    cache_dir: str | None = None
    torch_threads: int | None = 1
    threads: int = 1
    verbose: bool = False

    def __post_init__(self) -> None:
        check_domains(FLAG, self, _DOMAINS)
        if self.lr_schedule not in ("constant", "cosine"):
            raise ConfigError(
                f"{FLAG}lr_schedule must be 'constant' or 'cosine', got {self.lr_schedule!r}"
            )
        if self.steps is not None and self.reading_steps >= self.steps:
            raise ConfigError(
                f"{FLAG}reading_steps must be below steps ({self.steps}), got {self.reading_steps}"
            )
        if self.episode is not None:
            if not isinstance(self.episode, dict):
                raise ConfigError(
                    f"{FLAG}episode must be a mapping of episode settings, got {self.episode!r}"
                )
            as_episode(self.episode)

    def recipe(self, steps: int) -> dict[str, Any]:
        """What the cache key hashes of the recipe (the names and order of before the group: same
        keys)."""
        return {
            "steps": steps,
            "num_episodes": self.num_episodes,
            "lr": self.lr,
            "batch_size": self.batch_size,
            "weight_decay": self.weight_decay,
            "warmup_steps": self.warmup_steps,
            "lr_schedule": self.lr_schedule,
            "seed": self.seed,
            "only_successful": self.only_successful,
            "dtype": self.dtype,
        }


FLAG = "--model.warm_start."
_DOMAINS = {
    "steps": Domain(low=1, integer=True, none=True),
    "num_episodes": Domain(low=1, integer=True),
    "lr": Domain(low=0, low_open=True),
    "batch_size": Domain(low=1, integer=True),
    "weight_decay": Domain(low=0),
    "warmup_steps": Domain(low=0, integer=True),
    "seed": Domain(low=0, integer=True),
    "reading_steps": Domain(low=0, integer=True),
    "expert_noise": Domain(low=0, high=1),
    "torch_threads": Domain(low=1, integer=True, none=True),
    "threads": Domain(low=1, integer=True),
}


# ``--model.warm_start`` as configs and checkpoints hold it
WarmStartValue = WarmStartSettings | bool | dict[str, Any] | None


def as_warm_start(value: WarmStartValue) -> WarmStartSettings | None:
    """``--model.warm_start`` as settings: None when off (``false``/null), the defaults for
    ``true``."""
    if value is None or value is False:
        return None
    if value is True:
        return WarmStartSettings()
    return as_settings(WarmStartSettings, value, FLAG[:-1])


def warm_start_hparams(value: WarmStartValue) -> dict[str, Any] | bool:
    """``--model.warm_start`` as saved with a checkpoint: plain values (a weights-only load takes no
    objects), the fields off their defaults only, so checkpoints of before the group compare
    equal."""
    settings = as_warm_start(value)
    if settings is None:
        return False
    default = WarmStartSettings()
    changed = {
        f.name: getattr(settings, f.name)
        for f in dataclasses.fields(settings)
        if getattr(settings, f.name) != getattr(default, f.name)
    }
    return changed or True


def warm_start(
    model: str = "tiny",
    env_id: str = "ragen/SimpleSokoban-v0",
    env_kwargs: dict[str, Any] | None = None,
    settings: WarmStartSettings | None = None,
    *,
    episode: EpisodeSettings | dict[str, Any] | None = None,
    more_envs: Sequence[tuple[str, dict[str, Any] | None, EpisodeSettings | None]] = (),
) -> Path:
    """The folder of ``model`` fine-tuned on expert demonstrations of ``env_id`` (built once, then
    cached).

    Args:
        model: ``"tiny"``, a local Hugging Face folder or a hub id (the base model).
        env_id: registered gymnasium id of the demonstrations' env (``import envs`` registers the
            project's).
        env_kwargs: keyword arguments of the env.
        settings: the recipe (:class:`WarmStartSettings`; None: the defaults).
        episode: episode settings of the demonstrations (use the RL run's ``--data.episode`` so the
            formats match), then ``settings.episode`` over them. Every field but ``format_penalty``
            is part of the cache key.
        more_envs: further ``(env_id, env_kwargs, episode)`` whose demonstrations join ``env_id``'s
        (an environment
            mixture, ``--data.env.mixture``): ``num_episodes`` expert episodes of each env, in its
            own episode settings (None: ``episode``), trained on as one shuffled set. Empty: the key
            is the single env's.

    Returns:
        the folder (``save_pretrained`` model + tokenizer + ``warm_start.json`` with the arguments, demo statistics,
        losses and wall time).
    """
    s, episode, more, args, code = _prepared(env_id, env_kwargs, settings, episode, more_envs)
    final, root, base = _cache_folder(model, s.cache_dir, args, code)
    if _cached(final):
        return final
    with torch_threads_set(s.torch_threads):
        return _build(final, root, base, args, episode, s.verbose, s.threads, more)


# (env_id, env_kwargs, episode) of a mixture
Sources = Sequence[tuple[str, dict[str, Any] | None, EpisodeSettings]]


def _prepared(
    env_id: str,
    env_kwargs: dict[str, Any] | None,
    settings: WarmStartSettings | None,
    episode: EpisodeSettings | dict[str, Any] | None,
    more_envs: Sequence[tuple[str, dict[str, Any] | None, EpisodeSettings | None]],
) -> tuple[WarmStartSettings, EpisodeSettings, Sources, dict[str, Any], str]:
    """``warm_start``'s arguments checked and resolved: ``(settings, episode, more, args, code)``
    with ``args, code`` what the cache key hashes."""
    s = settings if settings is not None else WarmStartSettings()
    require_expert(env_id, env_kwargs)  # one line naming the env class, before anything is built
    episode = as_episode(episode)
    if s.episode:
        episode = dataclasses.replace(episode, **s.episode)
    more = [(i, k, as_episode(e) if e is not None else episode) for i, k, e in more_envs]
    steps = _checked_steps(env_id, env_kwargs, more, s.steps, s.reading_steps)
    args, code = _key_args(env_id, env_kwargs, episode, more, s.recipe(steps), s.reading_steps)
    if s.expert_noise:  # only when on: warm starts built before the option keep their keys
        args["expert_noise"] = s.expert_noise
    return s, episode, more, args, code


@dataclass(frozen=True)
class SupervisedSet:
    """What a warm start trains on (:func:`supervised_set`): the base model folder, its tokenizer,
    the demonstrations, their reading clauses (empty without ``reading_steps``), the demonstration
    statistics and the recipe's resolved arguments (``args["steps"]``, ``args["seed"]``, ...)."""

    base: str
    tokenizer: Any
    demos: list[Demonstration]
    reading_demos: list[Demonstration]
    stats: dict[str, Any]
    args: dict[str, Any]


def supervised_set(
    model: str,
    env_id: str,
    env_kwargs: dict[str, Any] | None = None,
    settings: WarmStartSettings | None = None,
    *,
    episode: EpisodeSettings | dict[str, Any] | None = None,
) -> SupervisedSet:
    """The demonstrations :func:`warm_start` with the same arguments trains on, without training or
    caching anything: for supervised loops of one's own (``benchmarks/rl_vs_sft.py`` trains to a
    plateau measured on held-out levels)."""
    _, episode, more, args, _ = _prepared(env_id, env_kwargs, settings, episode, ())
    base = str(models.resolve_model_path(model))
    tokenizer = models.load_tokenizer(base)
    sources = [(env_id, args["env_kwargs"], episode)]
    demos, stats = _demonstrations(sources, tokenizer, args, mixture=False)
    reading = reading_clauses(demos, tokenizer) if args.get("reading_steps") else []
    return SupervisedSet(base, tokenizer, demos, reading, stats, args)


def _checked_steps(
    env_id: str,
    env_kwargs: dict[str, Any] | None,
    more: Sources,
    steps: int | None,
    reading_steps: int,
) -> int:
    """``steps`` (None: the largest of the envs' hints), once every env has an expert and the
    reading steps fit."""
    for more_id, more_kwargs, _ in more:
        require_expert(more_id, more_kwargs)
    if steps is None:
        steps = max(
            default_steps(i, k) for i, k in [(env_id, env_kwargs)] + [(i, k) for i, k, _ in more]
        )
    if not 0 <= reading_steps < steps:
        raise ConfigError(
            f"{FLAG}reading_steps must be >= 0 and below steps ({steps}), got {reading_steps}"
        )
    return steps


def _key_args(
    env_id: str,
    env_kwargs: dict[str, Any] | None,
    episode: EpisodeSettings,
    more: Sources,
    recipe: dict[str, Any],
    reading_steps: int,
) -> tuple[dict[str, Any], str]:
    """``(args, code)``: what the cache key hashes (also recorded in ``warm_start.json``) and the
    demonstration code's fingerprint. ``recipe``: steps to dtype, in the signature's order."""
    # the key hashes the same flat names as before EpisodeSettings existed, so existing caches keep
    # their keys
    args = dict(
        env_id=env_id,
        **recipe,
        env_kwargs=demonstration_kwargs(env_id, env_kwargs),
        **episode.demonstration_fields(),
    )
    if reading_steps:  # only when on: warm starts built before the option keep their keys
        args["reading_steps"] = reading_steps
    code = code_fingerprint(env_id, env_kwargs)
    if more:  # only for a mixture: single-env warm starts keep their keys
        args["more_envs"] = [
            dict(env_id=i, env_kwargs=demonstration_kwargs(i, k), **e.demonstration_fields())
            for i, k, e in more
        ]
        code += "".join(code_fingerprint(i, k) for i, k, _ in more)
    return args, code


def _cache_folder(
    model: str, cache_dir: str | Path | None, args: dict[str, Any], code: str
) -> tuple[Path, Path, str]:
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


def _build(
    final: Path,
    root: Path,
    base: str,
    args: dict[str, Any],
    episode: EpisodeSettings,
    verbose: bool,
    threads: int = 1,
    more: Sequence[tuple[str, dict | None, EpisodeSettings]] = (),
) -> Path:
    started = time.perf_counter()
    seed, dtype = args["seed"], args["dtype"]
    tokenizer = models.load_tokenizer(base)
    sources = [(args["env_id"], args["env_kwargs"], episode)] + [
        (i, demonstration_kwargs(i, k), e) for i, k, e in more
    ]
    note(
        f"warm start: {final.name} is not in the cache; building it (solver demonstrations, then {args['steps']} "
        "SFT steps)"
    )
    demos, stats = _demonstrations(sources, tokenizer, args, mixture=bool(more))
    with torch.random.fork_rng(devices=[]), Progress("warm start", args["steps"]) as shown:
        torch.manual_seed(seed)
        net = models.load_causal_lm(base, dtype)
        reading_steps = args.get("reading_steps", 0)
        losses = train_sft(
            net,
            demos,
            tokenizer.pad_token_id,
            steps=args["steps"],
            lr=args["lr"],
            batch_size=args["batch_size"],
            weight_decay=args["weight_decay"],
            warmup_steps=args["warmup_steps"],
            lr_schedule=args["lr_schedule"],
            seed=seed,
            log_every=25 if verbose else 0,
            reading_steps=reading_steps,
            threads=threads,
            reading_demos=reading_clauses(demos, tokenizer) if reading_steps else (),
            progress=shown,
        )
    meta = {"base_model": str(base), "args": args, "demo_stats": stats, "losses": losses}
    _save(net, tokenizer, meta, final, root, started)
    note(f"warm start: saved {final} ({time.perf_counter() - started:.0f} s)")
    return final


def _demonstrations(
    sources: Sources, tokenizer: Any, args: dict[str, Any], *, mixture: bool
) -> tuple[list[Demonstration], dict[str, Any]]:
    """``args["num_episodes"]`` expert episodes of each ``(env_id, env_kwargs, episode)`` of
    ``sources`` as demonstrations, and their statistics: one env's, or for a ``mixture`` those of
    each env by position (``env<n>``)."""
    seed, num_episodes = args["seed"], args["num_episodes"]
    demos: list[Demonstration] = []
    stats: dict[str, Any] = {}
    shown = Progress("warm start: demonstrations", num_episodes * len(sources), unit="episode")
    for n, (source_id, source_kwargs, source_episode) in enumerate(sources):
        env_demos, env_stats = build_demonstrations(
            source_id,
            tokenizer,
            episode_seeds(seed, num_episodes, "train"),
            env_kwargs=source_kwargs,
            episode=source_episode,
            only_successful=args["only_successful"],
            progress=shown,
            expert_noise=args.get("expert_noise", 0.0),
        )
        if not env_demos:
            raise ValueError(f"no demonstrations for {source_id}: {env_stats}")
        demos += env_demos
        if mixture:
            stats[f"env{n}"] = {"env_id": source_id, **env_stats}
        else:
            stats = env_stats
    shown.close()
    return demos, stats


def _save(
    net: torch.nn.Module,
    tokenizer: Any,
    meta: dict[str, Any],
    final: Path,
    root: Path,
    started: float,
) -> None:
    """Save the warm-started model and ``warm_start.json`` (``meta``, the wall time since
    ``started``, the recipe version) in a temporary folder under ``root``, then rename it to
    ``final``: a crash leaves no half-written folder, and when another process finished the same
    key first its equivalent folder stays."""
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".warm-", dir=root))
    try:
        save_model(net, tokenizer, tmp)
        meta = {**meta, "wall_s": time.perf_counter() - started, "version": WARM_VERSION}
        (tmp / META_FILE).write_text(json.dumps(meta, indent=1, default=str))
        try:
            os.replace(tmp, final)
        except OSError:  # another process finished the same key first; its folder is equivalent
            if not (final / META_FILE).is_file():
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def warm_started_path(model: str, setting: WarmStartValue, datamodule) -> str:
    """The actor's folder for a fit: ``model`` resolved, or (``--model.warm_start`` on) the cached
    warm start on the data module's training envs, with demonstrations in exactly the rollouts'
    format: the data module's episode settings (each mixture entry's own), ``warm_start.episode``
    over them."""
    settings = as_warm_start(setting)
    if settings is None:
        return models.resolve_model_path(model)
    if datamodule is None:
        raise ConfigError(
            "--model.warm_start needs the RolloutDataModule (it names the env to learn from)"
        )
    base = datamodule.episode
    if settings.episode:
        base = dataclasses.replace(base, **settings.episode)
    # applied: each entry's own episode settings go over it, as in the rollouts
    settings = dataclasses.replace(settings, episode=None)
    first, *rest = datamodule.train_entries
    more = [(e.env_id, e.env_kwargs, e.episode_settings(base)) for e in rest]
    return str(
        warm_start(
            model,
            first.env_id,
            first.env_kwargs,
            settings,
            episode=first.episode_settings(base),
            more_envs=more,
        )
    )


# the flags of the argparse command line of before -> their spelling now
RENAMED = {
    "--env": "--data.env.id",
    "--env-kwargs": "--data.env.kwargs",
    "--model": "--model.model",
    "--steps": f"{FLAG}steps",
    "--num-episodes": f"{FLAG}num_episodes",
    "--lr": f"{FLAG}lr",
    "--batch-size": f"{FLAG}batch_size",
    "--seed": f"{FLAG}seed",
    "--cache-dir": f"{FLAG}cache_dir",
    "--torch-threads": f"{FLAG}torch_threads",
    "--threads": f"{FLAG}threads",
    "--eval-episodes": "--eval_episodes",
    "--temperature": "--eval_temperature",
    "--no-base": "--skip_base true",
    "--import": "--imports",
}


def parser() -> Any:
    """``python main.py warm_start``: the shared groups (:mod:`ragen_lightning.data.shared_flags`),
    the recipe ``--model.warm_start.*`` and the evaluation's own flags."""
    from ragen_lightning.data.shared_flags import side_parser

    p = side_parser(
        "python main.py warm_start",
        "Warm-start a model on expert demonstrations of "
        "the env and evaluate the base and the warm-started model on held-out seeds.",
    )
    p.add_argument(
        "--model.warm_start",
        type=WarmStartSettings | bool,
        default=True,
        help="the recipe (WarmStartSettings); a fit's config gives its own",
    )
    p.add_argument(
        "--eval_episodes", type=int, default=64, help="held-out episodes of each evaluation"
    )
    p.add_argument(
        "--eval_temperature",
        type=float,
        default=1.0,
        help="sampling temperature of the evaluations",
    )
    p.add_argument("--skip_base", type=bool, default=False, help="skip evaluating the base model")
    return p


def run(argv: Sequence[str]) -> int:
    """Warm-start as ``argv`` says (:func:`parser`), printing the evaluation of the base and the
    warm-started model on seeds the demonstrations never used; raises :class:`ConfigError` for a bad
    setting."""
    from ragen_lightning.data.shared_flags import parse
    from ragen_lightning.rollout.env_packages import import_env_packages

    c = parse(parser(), argv)
    settings = as_warm_start(c.model.warm_start) or WarmStartSettings()
    try:
        import_env_packages([c.imports] if isinstance(c.imports, str) else c.imports)
    except ImportError as e:
        raise ConfigError(f"--imports: {e}") from None
    if c.data.env.mixture is not None:
        raise ConfigError(
            "python main.py warm_start takes one env (--data.env.id): a fit warm-starts a mixture"
        )
    env_id, env_kwargs = c.data.env.id or "ragen/SimpleSokoban-v0", c.data.env.kwargs
    episode = c.data.episode
    if settings.episode:
        episode = dataclasses.replace(episode, **settings.episode)
    if threads := c.torch_threads or settings.torch_threads:
        torch.set_num_threads(threads)
    # held-out levels: the evaluation seeds never include a demonstration's seed
    demo_seeds = episode_seeds(settings.seed, settings.num_episodes, "train")
    evaluate = dict(
        num_episodes=c.eval_episodes,
        temperature=c.eval_temperature,
        seed=settings.seed,
        exclude_seeds=demo_seeds,
        episode=episode,
        max_batch_size=c.data.engine.max_batch_size,
    )
    model = c.model.model
    if not c.skip_base:
        t = time.perf_counter()
        print(
            "base",
            model,
            evaluate_policy(model, env_id, env_kwargs, **evaluate),
            f"({time.perf_counter() - t:.1f}s)",
            flush=True,
        )
    t = time.perf_counter()
    recipe = dataclasses.replace(settings, verbose=True, episode=None)
    path = warm_start(model, env_id, env_kwargs, recipe, episode=episode)
    meta = json.loads((path / META_FILE).read_text())
    print(
        f"warm start: {path} ({time.perf_counter() - t:.1f}s; trained in {meta['wall_s']:.1f}s, "
        f"loss {meta['losses'][0]:.3f} -> {meta['losses'][-1]:.3f}; demos {meta['demo_stats']})",
        flush=True,
    )
    t = time.perf_counter()
    warm = evaluate_policy(path, env_id, env_kwargs, **evaluate)
    print("warm", warm, f"({time.perf_counter() - t:.1f}s)")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``python main.py warm_start`` (``python -m ragen_lightning.sft.warm_start`` is its alias): a
    bad setting is one line on stderr and exit status 2."""
    from ragen_lightning.data.shared_flags import run_command

    return run_command("warm_start", run, argv, RENAMED)


if __name__ == "__main__":
    sys.exit(main())
