"""Evaluate a policy on a suite of environments: ``python main.py evaluate`` (alias ``python -m
ragen_lightning.evaluate``).

    python main.py evaluate --config configs/bandit.yaml --ckpt outputs/bandit/checkpoints/last.ckpt
    python main.py evaluate --model.model outputs/bandit/export --suite suite.yaml \\
        --out outputs/eval/bandit
    python main.py evaluate --api.model gpt-4o-mini --suite suite.yaml --out outputs/eval/gpt4o-mini
    python main.py evaluate --api.model local --api.base_url http://127.0.0.1:8000/v1 \\
        --data.env.id ragen/FrozenLake-v0 --num_episodes 64

The policy is a Lightning checkpoint of a fit (``--ckpt``: the actor as trained, LoRA included), an
OpenAI-compatible endpoint (``--api.model``, :class:`~ragen_lightning.rollout.api_engine.APIEngine`;
the key is read from ``$OPENAI_API_KEY`` or ``--api.key_env``), else the Hugging Face folder
``--model.model`` (a fit's ``--model.export_dir``, ``tiny``, a cached hub id). A checkpoint is
loaded weights only (tensors and plain values, as ``fit`` / ``validate --ckpt_path`` load it): a
file that would run pickled code is refused in one line, before anything is written. The env,
episode and engine settings are ``fit``'s (``--data.env.*``, ``--data.episode.*``,
``--data.engine.max_batch_size``; a fit's ``--config`` gives them). The suite is a YAML file
(``--suite``, :mod:`ragen_lightning.data.suite`) and/or ``--entry`` flags; with neither,
``--data.validation.suite`` (a config's held-out validation entries), else ``--data.env.mixture``,
else ``--data.env.id``, each entry with its ``num_groups`` seeds or ``--num_episodes``; an entry's
``episode`` goes over ``--data.episode``.

Every entry runs two passes over the same held-out reset seeds ``episode_seeds(--eval.seed,
num_episodes, "eval")`` (the stream ``benchmarks/learning.py`` evaluates on; validation and training
use their own): ``greedy`` (temperature 0, one episode per seed) and ``sampled``
(``--eval.temperature``, ``--eval.samples`` episodes per seed, seeded generation: the same command
gives the same episodes). Episodes run through the rollout runner, exactly as in training and
validation.

Outputs in ``--out``: ``trajectories.jsonl`` (every episode, the chat in OpenAI's messages format plus rewards and
per-turn records, :mod:`ragen_lightning.rollout.records`), ``report.md`` and ``report.csv`` (per entry and pass:
success, env return, turns, format-valid turn rate and pass@k, each with a 95 % interval) and ``run.json`` (the
settings). Intervals are taken over seeds (the episodes of one seed share a level and are not independent) and stay
inside the values' range: Wilson's score interval for the metrics in [0, 1] (success, format-valid, pass@k; exact
for 0/1 values, conservative for fractions), a percentile bootstrap of the mean for return and turns (2000
resamples of the seeds, seed 0: the same records give the same interval); ``report.md`` says so in its header. The
JSONL is append-only,
written a chunk of seeds at a time in whole lines; a re-run with the same settings skips the episodes it holds (keyed
by tag, pass, seed and sample) and completes only the missing ones; a run with other settings is refused.
"""

from __future__ import annotations

import csv
import io
import json
import os
import sys
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from ragen_lightning.data.settings import EnvSettings, ValidationSettings
from ragen_lightning.data.suite import SuiteEntry, as_entry, check_suite, load_suite
from ragen_lightning.errors import ConfigError
from ragen_lightning.metrics.functional import pass_at_k
from ragen_lightning.metrics.intervals import BOOTSTRAP_RESAMPLES, BOOTSTRAP_SEED, interval
from ragen_lightning.rollout.api_engine import APIError
from ragen_lightning.rollout.engine import GenerationEngine, SamplingParams
from ragen_lightning.rollout.env_packages import import_env_packages
from ragen_lightning.rollout.records import append_jsonl, episode_record, read_jsonl
from ragen_lightning.rollout.runner import RolloutRunner
from ragen_lightning.rollout.seeds import episode_seeds
from ragen_lightning.rollout.settings import EpisodeSettings
from ragen_lightning.rollout.tokens import ChatTokens

PASSES = ("greedy", "sampled")
# per-seed values in [0, 1]: Wilson's interval
UNIT_METRICS = ("success", "format_valid", "pass_at_k")


@dataclass(frozen=True)
class EvalSettings:
    """What the episodes of one evaluation are (``--eval.*``; stored in ``run.json``: a resumed run
    must have the same).

    Args:
        passes: ``greedy`` (temperature 0, one episode per seed) and/or ``sampled``.
        seed: seed stream of the reset seeds and of the sampled generation.
        temperature: temperature of the sampled pass (> 0: greedy is its own pass).
        top_p: nucleus mass of the sampled pass.
        samples: sampled episodes per seed (pass@k uses k = samples).
    """

    passes: tuple[str, ...] = PASSES
    seed: int = 0
    temperature: float = 1.0
    top_p: float = 1.0
    samples: int = 4

    def __post_init__(self) -> None:
        if not self.passes or set(self.passes) - set(PASSES):
            raise ConfigError(
                f"--eval.passes must name some of {', '.join(PASSES)}, got {list(self.passes)}"
            )
        if self.samples < 1 or self.seed < 0:
            raise ConfigError(
                f"--eval.samples must be >= 1 and --eval.seed >= 0, got {self.samples}, {self.seed}"
            )
        if not self.temperature > 0 or not 0 < self.top_p <= 1:
            raise ConfigError(
                f"--eval.temperature must be > 0 (greedy is its own pass) and "
                f"--eval.top_p in (0, 1], got {self.temperature}, {self.top_p}"
            )

    def samples_per_seed(self, name: str) -> int:
        """Episodes per seed of pass ``name`` (greedy runs one: its episodes would be identical)."""
        return 1 if name == "greedy" else self.samples

    def pass_params(self, name: str, episode: EpisodeSettings) -> SamplingParams:
        """The sampling parameters of pass ``name`` (the response length is the episode's)."""
        if name == "greedy":
            return SamplingParams(temperature=0.0, max_new_tokens=episode.max_new_tokens)
        return SamplingParams(self.temperature, self.top_p, -1, episode.max_new_tokens)


def eval_seeds(seed: int, count: int) -> list[int]:
    """The held-out reset seeds of an entry (the warm start's and learning benchmark's ``"eval"``
    stream)."""
    return episode_seeds(seed, count, "eval")


def _runs(indices: list[int], size: int) -> list[list[int]]:
    """``indices`` (sorted) cut into runs of consecutive values of at most ``size``."""
    out: list[list[int]] = []
    for i in indices:
        if out and out[-1][-1] == i - 1 and len(out[-1]) < size:
            out[-1].append(i)
        else:
            out.append([i])
    return out


def _plan(
    suite: Sequence[SuiteEntry],
    settings: EvalSettings,
    episode: EpisodeSettings,
    done: set[tuple],
) -> list[tuple]:
    """``(entry, its episode settings, pass name, sampling params, samples per seed, seeds, todo)``
    of every entry and pass of ``suite``: ``todo`` the positions of the seeds with a sample not in
    ``done`` (``(tag, pass, seed, sample)`` of the records already written)."""
    plan = []
    for entry in suite:
        ep = entry.episode_settings(episode)
        seeds = eval_seeds(settings.seed, entry.num_episodes)
        for name in settings.passes:
            params, k = settings.pass_params(name, ep), settings.samples_per_seed(name)
            todo = [
                i
                for i, s in enumerate(seeds)
                if any((entry.tag, name, s, m) not in done for m in range(k))
            ]
            plan.append((entry, ep, name, params, k, seeds, todo))
    return plan


def run_suite(
    engine: GenerationEngine,
    chat: ChatTokens,
    suite: Sequence[SuiteEntry],
    settings: EvalSettings,
    episode: EpisodeSettings,
    jsonl: str | Path,
    *,
    chunk_seeds: int = 32,
    progress: bool = True,
) -> int:
    """Run every episode of ``suite`` that ``jsonl`` does not hold yet, appending its record;
    returns how many ran.

    A chunk of up to ``chunk_seeds`` consecutive seeds is one ``RolloutRunner.run`` call, with
    ``first_group`` its position in the seed list: generation seeds depend on the seed's position,
    not on the chunking, so a resumed run samples exactly what an uninterrupted one would have.
    """
    from ragen_lightning.sft.progress import Progress

    done = {
        (r.get("tag"), r.get("pass"), r.get("seed"), r.get("sample")) for r in read_jsonl(jsonl)
    }
    plan = _plan(suite, settings, episode, done)
    total = sum(
        e.num_episodes * settings.samples_per_seed(n) for e in suite for n in settings.passes
    )
    remaining = sum(len(todo) * k for *_, k, _, todo in plan)
    ran = 0
    with Progress(
        "evaluate",
        total,
        unit="episode",
        initial=total - remaining,
        enabled=None if progress else False,
    ) as bar:
        for entry, ep, name, params, k, seeds, todo in plan:
            if not todo:
                continue
            runner = RolloutRunner(entry.env_id, entry.env_kwargs, chat, engine, ep)
            try:
                for chunk in _runs(todo, chunk_seeds):
                    trajs = runner.run(
                        [seeds[i] for i in chunk],
                        k,
                        params,
                        seed=settings.seed,
                        first_group=chunk[0],
                    )
                    records = [
                        episode_record(
                            t,
                            tag=entry.tag,
                            env_id=entry.env_id,
                            env_kwargs=entry.env_kwargs,
                            **{"pass": name},
                            sample=t.env_index % k,
                        )
                        for t in trajs
                    ]
                    records = [
                        r for r in records if (r["tag"], name, r["seed"], r["sample"]) not in done
                    ]
                    append_jsonl(jsonl, records)
                    ran += len(records)
                    bar.update(bar.done + len(records), entry=f"{entry.tag} {name}")
            finally:
                runner.close()
    return ran


def summarize(
    records: Sequence[dict[str, Any]], suite: Sequence[SuiteEntry], settings: EvalSettings
) -> list[dict]:
    """One row per entry and pass: episode and seed counts, then value / lo / hi of success, env
    return, turns, format-valid turn rate and pass@k (k = episodes per seed; pass@1 is the success
    rate)."""
    rows = []
    for entry in suite:
        for name in settings.passes:
            k = settings.samples_per_seed(name)
            by_seed: dict[int, list[dict]] = defaultdict(list)
            for r in records:
                if r.get("tag") == entry.tag and r.get("pass") == name:
                    by_seed[r["seed"]].append(r)
            eps = [r for rs in by_seed.values() for r in rs]
            row: dict[str, Any] = {
                "tag": entry.tag,
                "env_id": entry.env_id,
                "pass": name,
                "episodes": len(eps),
                "seeds": len(by_seed),
                "k": k,
            }

            seeds = list(by_seed.values())
            per_seed = {
                "success": [sum(r["success"] for r in rs) / len(rs) for rs in seeds],
                "return": [sum(r["env_return"] for r in rs) / len(rs) for rs in seeds],
                "turns": [sum(r["num_turns"] for r in rs) / len(rs) for rs in seeds],
                "format_valid": [
                    1 - sum(r["num_format_errors"] for r in rs) / t
                    for rs in seeds
                    if (t := sum(r["num_turns"] for r in rs)) > 0
                ],
                "pass_at_k": [
                    float(
                        pass_at_k(torch.tensor([float(sum(r["success"] for r in rs))]), len(rs), k)
                    )
                    for rs in seeds
                ],
            }
            for metric, values in per_seed.items():
                row[metric], row[f"{metric}_lo"], row[f"{metric}_hi"] = interval(
                    values, unit=metric in UNIT_METRICS
                )
            rows.append(row)
    return rows


METRICS = ("success", "return", "turns", "format_valid", "pass_at_k")
INTERVALS = (
    f"95 % intervals over seeds: Wilson's score interval for success, format-valid and pass@k (values in "
    f"[0, 1]); percentile bootstrap of the mean for return and turns ({BOOTSTRAP_RESAMPLES} resamples of the "
    f"seeds, seed {BOOTSTRAP_SEED}). Both stay inside the values' range."
)


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def write_report(rows: list[dict], out_dir: Path, title: str) -> tuple[Path, Path]:
    """``report.csv`` (every column) and ``report.md`` (value [lo, hi] per metric), each replaced
    atomically."""
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(rows[0]), lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    csv_path, md_path = out_dir / "report.csv", out_dir / "report.md"
    _atomic_write(csv_path, buf.getvalue())
    head = ["tag", "pass", "episodes", "success", "return", "turns", "format-valid", "pass@k"]
    lines = [
        f"# {title}",
        "",
        INTERVALS,
        "",
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
    ]
    for r in rows:
        cells = [
            f"{r[m]:.3f} [{r[m + '_lo']:.3f}, {r[m + '_hi']:.3f}]" if r["episodes"] else "-"
            for m in METRICS
        ]
        cells[-1] = f"pass@{r['k']} {cells[-1]}"
        lines.append("| " + " | ".join([r["tag"], r["pass"], str(r["episodes"]), *cells]) + " |")
    _atomic_write(md_path, "\n".join(lines) + "\n")
    return csv_path, md_path


# -- the policy ------------------------------------------------------------------------------------
def load_checkpoint_actor(path: str | Path) -> tuple[torch.nn.Module, Any]:
    """``(actor, tokenizer)`` of a fit's Lightning checkpoint: the module is rebuilt from the
    checkpoint's own settings on the folder it trained from (the warm start, recorded in the
    checkpoint), then its weights loaded (a LoRA checkpoint holds the adapters, over that folder's
    base)."""
    import inspect

    from ragen_lightning.parallel import checkpointing
    from ragen_lightning.starpo.module import StarPOModule

    # weights only, as fit / validate --ckpt_path load: an untrusted file's pickled code is never
    # run
    try:
        ckpt = checkpointing.load_verified(path, map_location="cpu", weights_only=True)
    except checkpointing.CheckpointError as e:
        if "Weights only load failed" in str(e):
            raise ConfigError(
                f"--ckpt {path}: refused: it holds pickled objects other than tensors and plain values, "
                "and loading them could run code from the file (fit and validate --ckpt_path refuse "
                "it too)"
            ) from None
        raise ConfigError(str(e).replace("--ckpt_path", "--ckpt", 1)) from None
    if "state_dict" not in ckpt or "hyper_parameters" not in ckpt:
        raise ConfigError(
            f"--ckpt {path}: not a checkpoint of a ragen_lightning fit (no state_dict / hyper_parameters)"
        )
    accepted = set(inspect.signature(StarPOModule.__init__).parameters)
    module = StarPOModule(**{k: v for k, v in ckpt["hyper_parameters"].items() if k in accepted})
    base = ckpt.get("starpo", {}).get("model_path")
    if base is not None and not Path(base).exists() and not base.startswith("tiny"):
        raise ConfigError(
            f"--ckpt {path}: the folder the run trained from ({base}) is gone; rebuild it (the fit's "
            "warm start is cached under RAGEN_LIGHTNING_CACHE) or evaluate an exported folder (--model)"
        )
    module.model_path = base
    module.configure_model()
    module.load_state_dict(ckpt["state_dict"], strict=module.strict_loading)
    return module.actor, module.tokenizer


@dataclass(frozen=True)
class APISettings:
    """An OpenAI-compatible endpoint as the policy (``--api.*``,
    :class:`~ragen_lightning.rollout.api_engine.APIEngine`).

    Args:
        model: the model's name at the endpoint (unset: the policy is ``--ckpt`` or
            ``--model.model``).
        base_url: the endpoint's API root.
        key_env: environment variable holding the API key.
        max_concurrency: API requests in flight at most.
        max_retries: retries of an API request (429, 5xx, timeouts, unusable HTTP 200 bodies).
        timeout_s: API request timeout.
        tokenizer: a local tokenizer for the conversation budget.
    """

    model: str | None = None
    base_url: str = "https://api.openai.com/v1"
    key_env: str = "OPENAI_API_KEY"
    max_concurrency: int = 8
    max_retries: int = 5
    timeout_s: float = 60.0
    tokenizer: str = "tiny"


def build_policy(c: Any, episode: EpisodeSettings) -> tuple[GenerationEngine, ChatTokens, str]:
    """The engine, the conversation builder and a description of the policy the flags name:
    ``--api.model``, else ``--ckpt``, else ``--model.model``."""
    from ragen_lightning import models
    from ragen_lightning.rollout.api_engine import APIEngine
    from ragen_lightning.rollout.engine import HFEngine

    api: APISettings = c.api
    if api.model and c.ckpt:
        raise ConfigError("give one policy: --ckpt FILE, --api.model NAME or --model.model FOLDER")
    if api.model:
        tokenizer = models.load_tokenizer(api.tokenizer)
        chat = ChatTokens(tokenizer, enable_think=episode.enable_think)
        engine = APIEngine(
            api.model,
            tokenizer,
            base_url=api.base_url,
            api_key_env=api.key_env,
            max_concurrency=api.max_concurrency,
            max_retries=api.max_retries,
            timeout_s=api.timeout_s,
            prefix=chat.prefix,
        )
        return engine, chat, f"{api.model} at {api.base_url}"
    if c.ckpt:
        actor, tokenizer = load_checkpoint_actor(c.ckpt)
    else:
        name = c.model.model
        actor, tokenizer = models.load_causal_lm(name, c.model.dtype), models.load_tokenizer(name)
    device = c.device or ("cuda" if torch.cuda.is_available() else "cpu")
    actor.to(device).eval()
    engine = HFEngine(
        actor,
        [tokenizer.eos_token_id],
        tokenizer.pad_token_id,
        max_batch_size=c.data.engine.max_batch_size,
    )
    chat = ChatTokens(tokenizer, enable_think=episode.enable_think)
    return engine, chat, str(c.ckpt or c.model.model)


# -- command line ----------------------------------------------------------------------------------
def read_suite(c: Any) -> list[SuiteEntry]:
    """The suite: ``--suite``, ``--entry``, else the data settings' validation suite, mixture or
    env."""
    suite = load_suite(c.suite) if c.suite else []
    entries = c.entry if isinstance(c.entry, list) else [c.entry] if c.entry is not None else []
    suite += [as_entry(e, f"--entry {e!r}") for e in entries]
    if not suite:
        suite = config_suite(c.data.env, c.data.validation, c.num_episodes)
    return check_suite(suite)


def config_suite(
    env: EnvSettings, validation: ValidationSettings, num_episodes: int
) -> list[SuiteEntry]:
    """What a training config evaluates on without ``--suite``: its ``validation.suite`` (the
    held-out entries its validation runs), else its ``env.mixture``, else its ``env.id``. An entry's
    ``num_groups`` becomes its number of evaluation seeds; entries without one (and the single env)
    get ``num_episodes``."""
    lists = (("--data.validation.suite", validation.suite), ("--data.env.mixture", env.mixture))
    for flag, entries in lists:
        if entries:
            return [
                as_entry(e, f"{flag}[{i}]", count="num_groups", default_count=num_episodes)
                for i, e in enumerate(entries)
            ]
    if env.id:
        return [SuiteEntry(env.id, env.kwargs, num_episodes)]
    return []


def check_run_file(out_dir: Path, run: dict[str, Any]) -> str:
    """The text of ``run.json`` (written by the caller once every input is checked): ``run`` on the
    first run; later runs into the same folder must match it (entries may be added, an entry's
    settings may not change)."""
    path = out_dir / "run.json"
    run = json.loads(json.dumps(run))  # as read back (tuples are lists)
    if path.exists():
        old = json.loads(path.read_text())
        diffs = [k for k in ("policy", "episode", "settings") if old.get(k) != run[k]]
        entries = {e["tag"]: e for e in old.get("suite", [])}
        diffs += [
            f"suite entry {e['tag']!r}"
            for e in run["suite"]
            if e["tag"] in entries and entries[e["tag"]] != e
        ]
        if diffs:
            raise ConfigError(
                f"--out {out_dir} holds a run with other settings ({', '.join(diffs)} differ, see "
                "run.json): use another --out folder"
            )
        run = {
            **run,
            "suite": list(entries.values()) + [e for e in run["suite"] if e["tag"] not in entries],
        }
    return json.dumps(run, indent=2) + "\n"


# the flags of the argparse command line of before -> their spelling now
RENAMED = {
    "--model": "--model.model",
    "--dtype": "--model.dtype",
    "--api-model": "--api.model",
    "--base-url": "--api.base_url",
    "--api-key-env": "--api.key_env",
    "--max-concurrency": "--api.max_concurrency",
    "--max-retries": "--api.max_retries",
    "--timeout-s": "--api.timeout_s",
    "--tokenizer": "--api.tokenizer",
    "--num-episodes": "--num_episodes",
    "--passes": "--eval.passes",
    "--seed": "--eval.seed",
    "--temperature": "--eval.temperature",
    "--top-p": "--eval.top_p",
    "--samples": "--eval.samples",
    "--chunk-seeds": "--chunk_seeds",
    "--max-batch-size": "--data.engine.max_batch_size",
    "--torch-threads": "--torch_threads",
    "--import": "--imports",
    "--no-progress": "--progress false",
}


def parser() -> Any:
    """``python main.py evaluate``: the shared groups (:mod:`ragen_lightning.data.shared_flags`) and
    its own."""
    from ragen_lightning.data.shared_flags import side_parser

    p = side_parser("python main.py evaluate", __doc__.split("\n\n")[0], validation=True)
    p.add_argument(
        "--ckpt", type=str | None, default=None, help="a fit's Lightning checkpoint (.ckpt)"
    )
    p.add_argument(
        "--model.dtype", type=str, default="float32", help="--model.model: weights dtype"
    )
    p.add_class_arguments(APISettings, "api", help="an OpenAI-compatible endpoint as the policy")
    p.add_class_arguments(
        EvalSettings, "eval", help="the passes, seeds and sampling of the evaluation"
    )
    p.add_argument(
        "--suite", type=str | None, default=None, help="suite YAML (ragen_lightning/data/suite.py)"
    )
    p.add_argument(
        "--entry",
        type=dict | list[dict] | None,
        default=None,
        help="suite entries as YAML, e.g. '{env_id: ragen/Bandit-v0}' (several: --entry+ each)",
    )
    p.add_argument(
        "--num_episodes",
        type=int,
        default=64,
        help="episodes per entry taken from the data settings (entries naming "
        "num_groups keep theirs)",
    )
    p.add_argument("--chunk_seeds", type=int, default=32, help="seeds run (and written) together")
    p.add_argument("--out", type=str, default="outputs/eval", help="output folder")
    p.add_argument(
        "--device", type=str | None, default=None, help="cpu or cuda (default: cuda when available)"
    )
    p.add_argument("--progress", type=bool, default=True, help="a progress line on stderr")
    return p


def run(argv: Sequence[str]) -> int:
    """Evaluate as ``argv`` says (:func:`parser`); raises :class:`ConfigError` for a bad setting."""
    from ragen_lightning.data.shared_flags import parse

    c = parse(parser(), argv)
    if c.torch_threads:
        torch.set_num_threads(c.torch_threads)
    try:
        import_env_packages([c.imports] if isinstance(c.imports, str) else c.imports)
    except ImportError as e:
        raise ConfigError(f"--imports: {e}") from None
    if c.chunk_seeds < 1:
        raise ConfigError(f"--chunk_seeds must be >= 1, got {c.chunk_seeds}")
    settings, episode, suite = c.eval, c.data.episode, read_suite(c)
    out = Path(c.out)
    policy = {
        "ckpt": c.ckpt,
        "model": None if c.ckpt or c.api.model else c.model.model,
        "api_model": c.api.model,
        "base_url": c.api.base_url if c.api.model else None,
    }
    run_text = check_run_file(
        out,
        {
            "policy": policy,
            "episode": asdict(episode),
            "settings": asdict(settings),
            "suite": [asdict(e) for e in suite],
        },
    )
    # a checkpoint is checked here: nothing is written before
    engine, chat, what = build_policy(c, episode)
    try:
        out.mkdir(parents=True, exist_ok=True)
        _atomic_write(out / "run.json", run_text)
        run_suite(
            engine,
            chat,
            suite,
            settings,
            episode,
            out / "trajectories.jsonl",
            chunk_seeds=c.chunk_seeds,
            progress=c.progress,
        )
    # the endpoint failed for good; what ran so far is in the JSONL, a re-run goes on
    except APIError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    finally:
        getattr(engine, "close", lambda: None)()
    rows = summarize(read_jsonl(out / "trajectories.jsonl"), suite, settings)
    _, md = write_report(rows, out, f"Evaluation of {what}")
    print(md.read_text())
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``python main.py evaluate`` (``python -m ragen_lightning.evaluate`` is its alias): a bad
    setting is one line on stderr and exit status 2."""
    from ragen_lightning.data.shared_flags import run_command

    try:
        return run_command("evaluate", run, argv, RENAMED)
    except FileNotFoundError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
