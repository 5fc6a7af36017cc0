"""GPU validation kit: the 24 GB recipes on real-size random-weight models, planned vs measured
memory, speed, MFU.

    python benchmarks/gpu_kit.py                                   # a CUDA machine: every configs/recipes/24gb-*
    python benchmarks/gpu_kit.py --recipes 24gb-qwen2.5-0.5b-full --iterations 3 --budget-s 300
    --out gpu.md
    python benchmarks/gpu_kit.py --device cpu --preset tiny --iterations 1     # the dry run (the test suite's)

Needs no hub access. For every recipe (``configs/recipes/24gb-*.yaml``) it

1. builds the recipe's architecture (:data:`ragen_lightning.models.memory.PUBLISHED`: Qwen2.5-0.5B /
   1.5B / 3B / 7B) with random weights into a local folder (cached under
   ``$RAGEN_LIGHTNING_CACHE/gpu_kit``), with the embedded tiny model's tokenizer (ids it does not
   know decode to nothing: a random model's text is noise anyway). The ``tiny`` preset builds small
   stand-ins of the same shape family instead, for a CPU dry run;
2. runs the project's own command line in a fresh process: the command the recipe's comment shows
   (its task config and any algorithm flag it names, e.g. the 1.5B full recipe's
   ``--model.advantage.estimator grpo``), i.e. ``main.py fit --config <task> --config <recipe>
   [--config configs/fsdp.yaml when several GPUs] --config <kit overlay> [flags]`` (``--task``
   replaces the task config) (the overlay points ``--model.model`` at the folder, sets
   ``--data.training.num_iterations``, the HF engine, a filter that keeps every group, a CSV logger
   and the :class:`callbacks.RolloutThroughput` and :class:`callbacks.PeakMemory` callbacks), after
   asking the same command for its memory plan (``--memory_plan true``);
3. reads the logged metrics and writes a markdown table (``--out``): planned peak vs the measured
   allocator peak, reserved peak and device memory in use; rollout and update tokens/s; MFU.

Each recipe runs under a time budget (``--budget-s``): the process is stopped there and the
iterations it logged are still reported; a recipe that fails (out of memory, a refused setting,
bitsandbytes missing) is a row saying why, and the next recipe runs.

MFU (model FLOPs utilisation, per device, rank 0's figures): the update counts 6 x N FLOPs per
trained token for a fully trained network and 4 x N for a LoRA/QLoRA one (forward + input gradients
through the frozen base; the adapters' own FLOPs are negligible), for the actor and, with GAE, the
critic; the rollout counts 2 x N per generated token (prompt prefill not counted: a lower bound). N
= the matrix-multiply parameters (the input embedding lookup excluded; a tied LM head counted once).
Not counted: attention's sequence-length term, activation-checkpointing recomputation, the no-grad
scoring passes. Peaks assumed (dense bf16 tensor cores, TFLOP/s per device) are in
:data:`PEAK_TFLOPS`; ``--peak-tflops`` overrides, and an unknown device gets no MFU.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import dataclasses
import hashlib
import io
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
# Run as a script, sys.path[0] is benchmarks/, whose envs.py would shadow the project's ``envs``
# package: the repository root (the library, envs, callbacks) goes first even when it is on the path
# already (PYTHONPATH, no install).
sys.path[:] = [str(ROOT)] + [p for p in sys.path if p != str(ROOT)]

from ragen_lightning.models.memory import PUBLISHED, Architecture  # torch-free

RECIPES = ROOT / "configs" / "recipes"
GIB = 1024**3

# Dense bf16 tensor-core peaks (vendor data sheets, without sparsity), matched in order against
# torch.cuda.get_device_name(): the first entry whose words all occur in the name wins.
PEAK_TFLOPS: list[tuple[tuple[str, ...], float]] = [
    (("H100", "PCIe"), 756.0),
    (("H100", "NVL"), 835.0),
    (("H100",), 989.4),  # SXM ("NVIDIA H100 80GB HBM3")
    (("H200",), 989.4),
    (("GH200",), 989.4),
    (("A100",), 312.0),
    (("L40S",), 362.0),
    (("L4",), 121.0),
]

# Small stand-ins for the dry run: the published shapes' family (GQA, tied embeddings except 7B), a
# few layers.
_TINY = {
    "Qwen/Qwen2.5-0.5B-Instruct": (2, 64, 128, 4, 2),
    "Qwen/Qwen2.5-1.5B-Instruct": (2, 96, 192, 6, 2),
    "Qwen/Qwen2.5-3B-Instruct": (3, 64, 160, 4, 2),
    "Qwen/Qwen2.5-7B-Instruct": (2, 112, 256, 4, 2),
}
TINY_SHAPES: dict[str, dict[str, Any]] = {
    name: dict(
        zip(("num_layers", "hidden_size", "intermediate_size", "num_heads", "num_kv_heads"), shape)
    )
    for name, shape in _TINY.items()
}


def peak_tflops(device_name: str) -> float | None:
    """The assumed dense bf16 peak of a device by name (:data:`PEAK_TFLOPS`), None when unknown."""
    for words, tflops in PEAK_TFLOPS:
        if all(re.search(rf"\b{re.escape(w)}\b", device_name) for w in words):
            return tflops
    return None


# -- recipes ---------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Recipe:
    name: str
    path: Path
    model: str
    mode: str  # full | LoRA | QLoRA
    with_critic: bool
    needs_bitsandbytes: bool
    task: Path | None = None  # the task config of the command in the recipe's comment
    flags: tuple[str, ...] = ()  # the flags that command adds


def recipe_command(path: Path) -> tuple[Path, tuple[str, ...]]:
    """The task config and the extra flags of the command a recipe's comment shows (its first ``python main.py fit``
    line, ``\\``-continued lines joined); the recipe is its second ``--config``."""
    import shlex

    text = path.read_text().replace("\\\n#", " ")
    line = next((ln for ln in text.splitlines() if "python main.py fit" in ln), None)
    if line is None:
        raise SystemExit(
            f"{path}: its comment shows no 'python main.py fit --config <task> --config <recipe>' command"
        )
    words = shlex.split(line.split("python main.py fit", 1)[1])
    configs = [words[i + 1] for i, w in enumerate(words[:-1]) if w == "--config"]
    if len(configs) < 2:
        raise SystemExit(
            f"{path}: its command must be 'python main.py fit --config <task> --config <recipe>'"
        )
    flags = [
        w for i, w in enumerate(words) if w != "--config" and (i == 0 or words[i - 1] != "--config")
    ]
    return ROOT / configs[0], tuple(flags)


def load_recipe(path: Path) -> Recipe:
    # imported here: it imports torch, which the kit's parent process needs only to read a recipe
    from ragen_lightning.starpo.estimators import get_estimator

    config = yaml.safe_load(path.read_text())
    model = config.get("model") or {}
    lora = model.get("lora")
    quant = (lora or {}).get("quantization", "none")
    mode = "full" if lora is None else ("QLoRA" if quant not in (None, "none") else "LoRA")
    optim = model.get("optim") or {}
    class_paths = [
        str((optim.get(k) or {}).get("class_path", ""))
        for k in ("actor_optimizer", "critic_optimizer")
    ]
    task, flags = recipe_command(path)
    task_model = yaml.safe_load(task.read_text()).get("model") or {}
    estimator = (task_model.get("advantage") or {}).get("estimator", "gae")  # the module's default
    if "--model.advantage.estimator" in flags:
        estimator = flags[flags.index("--model.advantage.estimator") + 1]
    return Recipe(
        name=path.stem,
        path=path,
        model=model.get("model", "tiny"),
        mode=mode,
        with_critic=get_estimator(estimator).critic,
        needs_bitsandbytes=mode == "QLoRA"
        or any(p.startswith("bitsandbytes") for p in class_paths),
        task=task,
        flags=flags,
    )


def find_recipes(names: list[str] | None) -> list[Recipe]:
    """The ``24gb-*`` recipes, or those named (file stem or path); an unknown name is an error
    naming it."""
    available = {p.stem: p for p in sorted(RECIPES.glob("24gb-*.yaml"))}
    if not names:
        return [load_recipe(p) for p in available.values()]
    chosen = []
    for name in names:
        path = (
            Path(name)
            if Path(name).is_file()
            else available.get(Path(name).name.removesuffix(".yaml"))
        )
        if path is None:
            raise SystemExit(
                f"--recipes {name!r}: no such recipe; available: {', '.join(available)}"
            )
        chosen.append(load_recipe(path))
    return chosen


# -- random-weight models --------------------------------------------------------------------------
def kit_architecture(recipe: Recipe, preset: str, tokenizer_len: int) -> Architecture:
    """The recipe's published architecture (``gpu`` preset) or its small stand-in (``tiny``; the
    vocabulary twice the tokenizer's, so ids the tokenizer does not know are sampled as on the real
    vocabulary)."""
    published = PUBLISHED.get(recipe.model)
    if published is None:
        raise SystemExit(
            f"{recipe.name}: model {recipe.model!r} is not in the memory plan's table {sorted(PUBLISHED)}"
        )
    if preset == "gpu":
        return published
    return Architecture(
        **TINY_SHAPES[recipe.model],
        vocab_size=2 * tokenizer_len,
        tie_word_embeddings=published.tie_word_embeddings,
    )


def qwen2_config(arch: Architecture, tokenizer, dtype: str) -> dict[str, Any]:
    return {
        "vocab_size": arch.vocab_size,
        "hidden_size": arch.hidden_size,
        "intermediate_size": arch.intermediate_size,
        "num_hidden_layers": arch.num_layers,
        "num_attention_heads": arch.num_heads,
        "num_key_value_heads": arch.num_kv_heads,
        "tie_word_embeddings": arch.tie_word_embeddings,
        "max_position_embeddings": 32768,
        "rope_theta": 1000000.0,
        "rms_norm_eps": 1e-6,
        "use_sliding_window": False,
        "eos_token_id": tokenizer.eos_token_id,
        "pad_token_id": tokenizer.pad_token_id,
        "bos_token_id": None,
        "dtype": dtype,
    }


def model_folder(arch: Architecture, dtype: str, cache: Path) -> Path:
    key = hashlib.sha256(
        json.dumps([dataclasses.asdict(arch), dtype], sort_keys=True).encode()
    ).hexdigest()[:12]
    return cache / f"qwen2-h{arch.hidden_size}-l{arch.num_layers}-v{arch.vocab_size}-{dtype}-{key}"


def build_random_model(
    arch: Architecture, folder: Path, dtype: str, device: str, seed: int = 0
) -> Path:
    """A Qwen2 folder (config, random weights, the tiny tokenizer) at ``folder``; built once,
    written atomically."""
    if (folder / "config.json").is_file() and (folder / "tokenizer_config.json").is_file():
        return folder
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, Qwen2Config

    from ragen_lightning.models.loading import resolve_model_path, torch_dtype

    tokenizer = AutoTokenizer.from_pretrained(resolve_model_path("tiny"))
    config = Qwen2Config(**qwen2_config(arch, tokenizer, dtype))
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".building-", dir=folder.parent))
    try:
        torch.manual_seed(seed)
        with torch.device(device):
            model = AutoModelForCausalLM.from_config(config, dtype=torch_dtype(dtype))
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        del model
        os.replace(tmp, folder)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return folder


def tokenizer_len() -> int:
    from transformers import AutoTokenizer

    from ragen_lightning.models.loading import resolve_model_path

    return len(AutoTokenizer.from_pretrained(resolve_model_path("tiny")))


# -- FLOPs -----------------------------------------------------------------------------------------
def matmul_params(arch: Architecture, network: str) -> int:
    """Parameters that take part in matrix multiplies: the actor (a causal LM) without its input
    embedding lookup (a tied LM head is the same matrix, counted once), the critic's backbone
    without it plus the value head."""
    if network == "actor":
        return arch.causal_lm_params() - (
            0 if arch.tie_word_embeddings else arch.embedding_params()
        )
    return arch.backbone_params() - arch.embedding_params() + arch.hidden_size + 1


def update_flops_per_token(arch: Architecture, mode: str, with_critic: bool) -> float:
    """6 N per trained token for a fully trained network, 4 N under LoRA/QLoRA (no weight gradients
    of the base)."""
    per = 6 if mode == "full" else 4
    nets = ["actor", "critic"] if with_critic else ["actor"]
    return float(sum(per * matmul_params(arch, n) for n in nets))


def rollout_flops_per_token(arch: Architecture) -> float:
    return 2.0 * matmul_params(arch, "actor")


# -- one recipe ------------------------------------------------------------------------------------
def overlay(recipe: Recipe, args, folder: Path, run_dir: Path) -> dict[str, Any]:
    """The kit's settings on top of the task config and the recipe."""
    training: dict[str, Any] = {"num_iterations": args.iterations}
    data: dict[str, Any] = {
        "training": training,
        "engine": {"name": "hf"},
        "filter": {"strategy": "top_p", "value": 1.0, "include_zero": True},
    }
    trainer: dict[str, Any] = {
        "accelerator": "gpu" if args.device == "cuda" else "cpu",
        "devices": args.devices,
        "max_epochs": 1,
        "num_sanity_val_steps": 0,
        "limit_val_batches": 0,
        "enable_checkpointing": False,
        "log_every_n_steps": 1,
        "default_root_dir": str(run_dir),
        "logger": [
            {
                "class_path": "lightning.pytorch.loggers.CSVLogger",
                "init_args": {
                    "save_dir": str(run_dir),
                    "name": "csv",
                    "flush_logs_every_n_steps": 1,
                },
            }
        ],
        "callbacks": [
            {"class_path": "callbacks.RolloutThroughput"},
            {"class_path": "callbacks.PeakMemory"},
        ],
    }
    model: dict[str, Any] = {"model": str(folder), "warm_start": False}
    config: dict[str, Any] = {
        "seed_everything": 0,
        "trainer": trainer,
        "model": model,
        "data": data,
    }
    # seconds on a CPU: few short episodes, fp32 (bf16 is slow on most CPUs)
    if args.preset == "tiny":
        config["torch_threads"] = 1
        trainer["precision"] = "32-true"
        model["dtype"] = "float32"
        training.update(num_groups=2, group_size=2)
        data.update(
            engine={"name": "hf", "max_batch_size": 4},
            episode={"max_turns": 1, "max_new_tokens": 8, "max_model_len": 2048},
        )
    episode = data.setdefault("episode", {})
    for key, flag in (("num_groups", "num_groups"), ("group_size", "group_size")):
        if getattr(args, flag) is not None:
            training[key] = getattr(args, flag)
    for key in ("max_turns", "max_new_tokens"):
        if getattr(args, key) is not None:
            episode[key] = getattr(args, key)
    return config


def cli_args(recipe: Recipe, args, overlay_path: Path) -> list[str]:
    configs = [args.task or str(recipe.task), str(recipe.path)]
    if args.devices > 1:
        configs.append(str(ROOT / "configs" / "fsdp.yaml"))
    configs.append(str(overlay_path))
    return ["fit", *(x for c in configs for x in ("--config", c)), *recipe.flags]


PEAK_LINE = re.compile(r"^PEAK .*?([0-9.]+) GiB", re.MULTILINE)


def worker(spec_path: str) -> int:
    """Runs in the recipe's own process: the memory plan, then the fit, through the project's
    command line. Writes ``result.json`` (rank 0) with the planned peak, the device and any
    error."""
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")  # as main.py does, before torch loads
    spec = json.loads(Path(spec_path).read_text())
    import envs  # noqa: F401  (registers the ragen/* ids, as main.py does)
    from ragen_lightning.cli import main
    from ragen_lightning.errors import ConfigError

    rank = int(os.environ.get("RANK", os.environ.get("LOCAL_RANK", "0")))
    result: dict[str, Any] = {"planned_gib": None, "error": None}
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            main([*spec["args"], "--memory_plan", "true"])
    except SystemExit:
        pass
    except ConfigError as e:  # does not fit --gpu_memory_gb: the plan was printed first
        result["plan_error"] = str(e)
    plan_text = out.getvalue()
    if match := PEAK_LINE.search(plan_text):
        result["planned_gib"] = float(match.group(1))
    result["plan"] = plan_text
    import torch

    if rank == 0:  # (another rank asking about device 0 would put a CUDA context of its own there)
        if torch.cuda.is_available() and spec["device"] == "cuda":
            result["device_name"] = torch.cuda.get_device_name(0)
            result["device_total_gib"] = torch.cuda.mem_get_info(0)[1] / GIB
        else:
            result["device_name"] = "cpu"
        # a run stopped by the budget keeps these
        Path(spec["result"]).write_text(json.dumps(result, indent=1))
    t0 = time.perf_counter()
    try:
        main(spec["args"])
    except BaseException as e:  # noqa: BLE001  (out of memory, a refused setting: the kit's row says which)
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        result["error"] = f"{type(e).__name__}: {first}"[:300]
    result["fit_s"] = time.perf_counter() - t0
    if rank == 0:
        Path(spec["result"]).write_text(json.dumps(result, indent=1))
    return 0 if result["error"] is None else 1


def read_metrics(run_dir: Path) -> list[dict[str, float]]:
    """Per-iteration values (rows of ``csv/version_*/metrics.csv`` merged by step) that the kit
    reports."""
    found = sorted(run_dir.glob("csv/version_*/metrics.csv"))
    if not found:
        return []
    by_step: dict[str, dict[str, float]] = {}
    with open(found[-1]) as f:
        for row in csv.DictReader(f):
            keep = {
                k: float(v)
                for k, v in row.items()
                if v not in ("", None) and k.split("/")[0] in ("throughput", "memory", "timing_s")
            }
            if keep:
                by_step.setdefault(row.get("step", ""), {}).update(keep)
    return [r for r in by_step.values() if "throughput/iteration_s" in r]


@dataclasses.dataclass
class Row:
    recipe: str
    model: str
    mode: str
    devices: int
    status: str = "ok"
    planned_gib: float | None = None
    peak_allocated_gib: float | None = None
    peak_reserved_gib: float | None = None
    device_used_gib: float | None = None
    device_total_gib: float | None = None
    peak_rss_gib: float | None = None
    rollout_tokens_per_s: float | None = None
    update_tokens_per_s: float | None = None
    rollout_mfu: float | None = None
    update_mfu: float | None = None
    iterations: int = 0
    wall_s: float = 0.0
    device_name: str = ""  # as the recipe's process saw it (the kit itself never initialises CUDA)


def summarize(
    row: Row, its: list[dict[str, float]], arch: Architecture, recipe: Recipe, peak: float | None
) -> Row:
    """Peaks: the max over iterations. Speeds: the mean over iterations after the first (start-up:
    allocator warm-up, kernel selection), over all when there is one."""
    row.iterations = len(its)
    if not its:
        return row
    for key in (
        "peak_allocated_gib",
        "peak_reserved_gib",
        "device_used_gib",
        "device_total_gib",
        "peak_rss_gib",
    ):
        values = [it[f"memory/{key}"] for it in its if f"memory/{key}" in it]
        if values:
            setattr(row, key, max(values))
    kept = its[1:] if len(its) > 1 else its

    def mean(key: str) -> float | None:
        values = [it[key] for it in kept if key in it]
        return sum(values) / len(values) if values else None

    row.rollout_tokens_per_s = mean("throughput/rollout_tokens_per_s")
    row.update_tokens_per_s = mean("throughput/update_tokens_per_s")
    if peak:
        if row.rollout_tokens_per_s is not None:
            row.rollout_mfu = (
                row.rollout_tokens_per_s * rollout_flops_per_token(arch) / (peak * 1e12)
            )
        if row.update_tokens_per_s is not None:
            flops = update_flops_per_token(arch, recipe.mode, recipe.with_critic)
            row.update_mfu = row.update_tokens_per_s * flops / (peak * 1e12)
    return row


def stop(proc: subprocess.Popen) -> None:
    """Stop the recipe's process group (the fit and any ranks Lightning launched), politely
    first."""
    for sig, wait in ((signal.SIGTERM, 15), (signal.SIGKILL, 15)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        try:
            proc.wait(wait)
            return
        except subprocess.TimeoutExpired:
            continue


def run_recipe(recipe: Recipe, args, run_root: Path, cache: Path, tok_len: int) -> Row:
    arch = kit_architecture(recipe, args.preset, tok_len)
    label = recipe.model.split("/")[-1] + (" arch" if args.preset == "gpu" else " stand-in")
    row = Row(
        recipe.name, label, recipe.mode + (" + FSDP2" if args.devices > 1 else ""), args.devices
    )
    if recipe.needs_bitsandbytes and not _has("bitsandbytes"):
        row.status = "skipped: needs bitsandbytes (pip install bitsandbytes)"
        return row
    t0 = time.perf_counter()
    dtype = "float32" if args.preset == "tiny" else "bfloat16"
    folder = model_folder(arch, dtype, cache)
    try:
        if args.device == "cuda":  # a process of its own: the kit itself never holds a CUDA context
            _python(
                ["--build", json.dumps([dataclasses.asdict(arch), str(folder), dtype])],
                args.budget_s,
            )
        else:
            build_random_model(arch, folder, dtype, "cpu")
    except Exception as e:  # noqa: BLE001  (one recipe's failure is its row, not the kit's end)
        row.status = f"failed to build the model: {type(e).__name__}: {e}"[:300]
        return row
    run_dir = run_root / recipe.name
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    overlay_path = run_dir / "kit_overlay.yaml"
    overlay_path.write_text(yaml.safe_dump(overlay(recipe, args, folder, run_dir), sort_keys=False))
    spec = {
        "args": cli_args(recipe, args, overlay_path),
        "device": args.device,
        "result": str(run_dir / "result.json"),
    }
    (run_dir / "spec.json").write_text(json.dumps(spec, indent=1))
    log = run_dir / "log.txt"
    env = dict(os.environ, WANDB_MODE="offline", HF_HUB_OFFLINE="1", PYTHONUNBUFFERED="1")
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), "--worker", str(run_dir / "spec.json")],
            cwd=run_dir,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
        try:
            proc.wait(timeout=max(1.0, args.budget_s - (time.perf_counter() - t0)))
            timed_out = False
        except subprocess.TimeoutExpired:
            stop(proc)
            timed_out = True
    row.wall_s = time.perf_counter() - t0
    result = (
        json.loads((run_dir / "result.json").read_text())
        if (run_dir / "result.json").is_file()
        else {}
    )
    row.planned_gib = result.get("planned_gib")
    if row.planned_gib is None and (plan := _plan_from_log(log)) is not None:
        row.planned_gib = plan
    row.device_name = result.get("device_name", "")
    peak = args.peak_tflops or (peak_tflops(row.device_name) if args.device == "cuda" else None)
    summarize(row, read_metrics(run_dir), arch, recipe, peak)
    if timed_out:
        row.status = f"time budget: stopped after {args.budget_s:.0f} s"
    elif result.get("error"):
        row.status = "failed: " + result["error"]
    elif proc.returncode != 0:
        row.status = f"failed: exit {proc.returncode}: {_last_line(log)}"
    elif row.iterations < args.iterations:
        row.status = f"incomplete: {row.iterations} of {args.iterations} iterations logged"
    return row


def _has(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


def _python(argv: list[str], timeout: float) -> None:
    proc = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), *argv],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(
            (proc.stderr or proc.stdout).strip().splitlines()[-1]
            if (proc.stderr or proc.stdout)
            else f"exit {proc.returncode}"
        )


def _plan_from_log(log: Path) -> float | None:
    match = PEAK_LINE.search(log.read_text(errors="replace")) if log.is_file() else None
    return float(match.group(1)) if match else None


def _last_line(log: Path) -> str:
    lines = (
        [x.strip() for x in log.read_text(errors="replace").splitlines() if x.strip()]
        if log.is_file()
        else []
    )
    return lines[-1][:200] if lines else "no output"


# -- the table -------------------------------------------------------------------------------------
def _fmt(value: float | None, spec: str = ".2f") -> str:
    return (
        "-"
        if value is None or (isinstance(value, float) and math.isnan(value))
        else format(value, spec)
    )


def markdown(rows: list[Row], header: dict[str, str], cpu: bool) -> str:
    lines = [f"- {k}: {v}" for k, v in header.items()]
    if cpu:
        cols = [
            "recipe",
            "model",
            "mode",
            "devices",
            "status",
            "planned peak GiB (GPU plan)",
            "measured peak RSS GiB (CPU process)",
            "rollout tok/s",
            "update tok/s",
            "iterations",
            "wall s",
        ]
    else:
        cols = [
            "recipe",
            "model",
            "mode",
            "devices",
            "status",
            "planned peak GiB",
            "peak allocated GiB",
            "peak reserved GiB",
            "device used / total GiB",
            "allocated / planned",
            "rollout tok/s",
            "update tok/s",
            "MFU rollout",
            "MFU update",
            "iterations",
            "wall s",
        ]
    lines += ["", "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        common = [
            r.recipe,
            r.model,
            r.mode,
            str(r.devices),
            r.status.replace("|", "/"),
            _fmt(r.planned_gib),
        ]
        speeds = [_fmt(r.rollout_tokens_per_s, ".1f"), _fmt(r.update_tokens_per_s, ".1f")]
        if cpu:
            cells = [
                *common,
                _fmt(r.peak_rss_gib),
                *speeds,
                str(r.iterations),
                _fmt(r.wall_s, ".0f"),
            ]
        else:
            ratio = (
                r.peak_allocated_gib / r.planned_gib
                if r.peak_allocated_gib and r.planned_gib
                else None
            )
            used = (
                f"{_fmt(r.device_used_gib)} / {_fmt(r.device_total_gib)}"
                if r.device_total_gib
                else "-"
            )
            mfu = [
                _fmt(r.rollout_mfu * 100, ".2f") + " %" if r.rollout_mfu is not None else "-",
                _fmt(r.update_mfu * 100, ".1f") + " %" if r.update_mfu is not None else "-",
            ]
            cells = [
                *common,
                _fmt(r.peak_allocated_gib),
                _fmt(r.peak_reserved_gib),
                used,
                _fmt(ratio),
                *speeds,
                *mfu,
                str(r.iterations),
                _fmt(r.wall_s, ".0f"),
            ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def parse_args(argv: list[str] | None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    p.add_argument(
        "--preset",
        choices=["gpu", "tiny"],
        default="gpu",
        help="gpu: the recipes' real architectures; tiny: small stand-ins (the CPU dry run)",
    )
    p.add_argument(
        "--recipes",
        nargs="+",
        default=None,
        help="recipe names (default: every configs/recipes/24gb-*)",
    )
    p.add_argument(
        "--task",
        default=None,
        help="the task config under the recipe (default: the one of the command in the recipe's comment)",
    )
    p.add_argument(
        "--iterations",
        type=int,
        default=3,
        help="StarPO iterations per recipe (the first is warm-up)",
    )
    p.add_argument(
        "--budget-s",
        type=float,
        default=600.0,
        help="wall-clock budget per recipe, model build included",
    )
    p.add_argument(
        "--devices",
        type=int,
        default=None,
        help="GPUs (default: all visible; >1 adds configs/fsdp.yaml)",
    )
    p.add_argument(
        "--num-groups",
        type=int,
        default=None,
        help="override the recipe's --data.training.num_groups",
    )
    p.add_argument(
        "--group-size",
        type=int,
        default=None,
        help="override the recipe's --data.training.group_size",
    )
    p.add_argument("--max-turns", type=int, default=None, help="override --data.episode.max_turns")
    p.add_argument(
        "--max-new-tokens", type=int, default=None, help="override --data.episode.max_new_tokens"
    )
    p.add_argument(
        "--peak-tflops",
        type=float,
        default=None,
        help="the device's peak for MFU (default: by name)",
    )
    p.add_argument(
        "--out", default=None, help="markdown file to write (default: <run-dir>/gpu_kit.md)"
    )
    p.add_argument(
        "--run-dir", default=None, help="per-recipe logs, configs and metrics (default: a temp dir)"
    )
    p.add_argument(
        "--cache-dir",
        default=None,
        help="random-weight model folders (default: the project's cache)",
    )
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    p.add_argument("--build", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.iterations < 1:
        p.error(f"--iterations must be >= 1, got {args.iterations}")
    if args.budget_s <= 0:
        p.error(f"--budget-s must be > 0, got {args.budget_s}")
    return args


def main(argv: list[str] | None = None) -> list[Row]:
    args = parse_args(argv)
    if args.worker:
        raise SystemExit(worker(args.worker))
    if args.build:
        arch, folder, dtype = json.loads(args.build)
        build_random_model(Architecture(**arch), Path(folder), dtype, "cuda")
        return []
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit(
            "--device cuda: no CUDA device here; the CPU dry run is --device cpu --preset tiny"
        )
    if args.device == "cpu" and args.preset == "gpu":
        raise SystemExit(
            "--device cpu needs --preset tiny (the real architectures take minutes per step on a CPU)"
        )
    visible = torch.cuda.device_count() if args.device == "cuda" else 1
    args.devices = args.devices or visible
    if args.devices < 1 or args.devices > visible:
        raise SystemExit(f"--devices {args.devices}: {visible} {args.device} device(s) visible")
    recipes = find_recipes(args.recipes)
    from ragen_lightning.models.tiny import cache_root

    cache = Path(args.cache_dir) if args.cache_dir else cache_root() / "gpu_kit"
    run_root = Path(args.run_dir or tempfile.mkdtemp(prefix="gpu-kit-"))
    run_root.mkdir(parents=True, exist_ok=True)
    tok_len = tokenizer_len()
    rows = []
    for recipe in recipes:
        print(f"[gpu_kit] {recipe.name} ...", flush=True)
        rows.append(run_recipe(recipe, args, run_root, cache, tok_len))
        print(f"[gpu_kit] {recipe.name}: {rows[-1].status} ({rows[-1].wall_s:.0f} s)", flush=True)
    device_name = next((r.device_name for r in rows if r.device_name), args.device)
    peak = args.peak_tflops or (peak_tflops(device_name) if args.device == "cuda" else None)
    header = {
        "device": f"{device_name} x {args.devices}"
        + (" (FSDP2, configs/fsdp.yaml)" if args.devices > 1 else ""),
        "torch": torch.__version__,
        "preset": f"{args.preset}, {args.iterations} iteration(s) per recipe (speeds: mean after the first), "
        f"task {Path(args.task).name if args.task else 'of each recipe command'}, HF engine, filter keeps every group, budget {args.budget_s:.0f} s",
        "peak assumed for MFU": (
            f"{peak:g} TFLOP/s dense bf16 per device"
            if peak
            else "unknown device: no MFU (pass --peak-tflops)"
        ),
        "FLOPs counted": "update 6 N per trained token per fully trained network (actor; critic with GAE), 4 N "
        "under LoRA/QLoRA; rollout 2 N per generated token; N = matmul parameters; no attention "
        "term, no recomputation, no scoring passes",
        "memory": (
            "peak RSS of the CPU process (not comparable with the GPU plan)"
            if args.device == "cpu"
            else "per iteration, rank 0: torch.cuda.max_memory_allocated / max_memory_reserved; device used = "
            "total - free (torch.cuda.mem_get_info) at the iteration's end; planned = --memory_plan's PEAK "
            "(one GPU, 1 GiB overhead included)"
        ),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }
    table = markdown(rows, header, cpu=args.device == "cpu")
    out = Path(args.out) if args.out else run_root / "gpu_kit.md"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(table)
    (run_root / "gpu_kit.json").write_text(
        json.dumps([dataclasses.asdict(r) for r in rows], indent=1)
    )
    print(table)
    print(f"[gpu_kit] table: {out}; per-recipe logs: {run_root}")
    return rows


if __name__ == "__main__":
    main()
