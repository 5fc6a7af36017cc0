"""The command line's preflight: every setting checked right after parsing, before anything is
written or launched.

A bad value fails here with one line naming the flag and its allowed values
(:class:`~ragen_lightning.errors. ConfigError`; the CLI prints it and exits with 2), never after the
run's folders, logs or ``config.yaml`` exist or its processes started. The checks are the owners'
own (each setting's domain is declared where the setting is:
:data:`~ragen_lightning.starpo.checks.MODULE_DOMAINS`, :mod:`ragen_lightning.data.settings`, the
settings dataclasses' ``__post_init__``); this module only runs them on the parsed configuration,
plus what only the command line knows: model and data paths, strategy refusals, writable output
folders, a reachable wandb server.

Checks that need the tokenizer (the first prompt must fit ``max_model_len``) run in the CLI's
``before_fit``, still before anything is written.
"""

from __future__ import annotations

import os
import re
import sys
import tempfile
import threading
from dataclasses import fields
from pathlib import Path
from typing import Any

from ragen_lightning.data.checks import check_envs, check_world_size
from ragen_lightning.data.datamodule import RolloutDataModule
from ragen_lightning.data.mixture import train_entries
from ragen_lightning.data.settings import DataSettings
from ragen_lightning.errors import ConfigError, Domain
from ragen_lightning.models import lora as lora_mod
from ragen_lightning.models.loading import (
    check_dtype,
    check_model_name,
    load_tokenizer,
    resolve_model_path,
)
from ragen_lightning.parallel import check_strategy
from ragen_lightning.sft.experts import require_expert
from ragen_lightning.sft.warm_start import as_warm_start
from ragen_lightning.starpo.checks import (
    check_data_settings,
    check_module_settings,
    check_threads_precision,
)
from ragen_lightning.starpo.early_stop import EarlyStopSettings
from ragen_lightning.starpo.settings import GROUPS, ModuleSettings, as_group

SEED_DOMAIN = Domain(0, 2**32 - 1, integer=True, none=True)  # Lightning's (numpy's) seed range
# how long the wandb server may take to answer an HTTP request before the run logs offline
WANDB_TIMEOUT_S = 3.0


def _plain(value: Any) -> Any:
    """A jsonargparse Namespace (or anything with ``as_dict``) as nested plain dicts."""
    return value.as_dict() if hasattr(value, "as_dict") else value


def check_settings(config: Any, run: bool = True) -> None:
    """Every ``--model.*``, ``--data.*`` and top-level setting of a parsed configuration (a
    jsonargparse Namespace or a dict with ``model`` / ``data`` / ``trainer`` groups) against its
    domain and the combinations that cannot work; raises :class:`ConfigError` naming the first bad
    flag. ``run=False`` (only parsing) skips what depends on this machine's hardware (FSDP1 needs
    CUDA)."""
    get = config.get
    Domain(low=1, integer=True, none=True).check("--torch_threads", get("torch_threads"))
    Domain(low=0, low_open=True, none=True).check("--gpu_memory_gb", get("gpu_memory_gb"))
    if not isinstance(seed := get("seed_everything"), bool):  # true: a random seed, false: none
        SEED_DOMAIN.check("--seed_everything", seed)
    model, data, trainer = (
        _plain(get("model")) or {},
        _plain(get("data")) or {},
        _plain(get("trainer")) or {},
    )
    check_strategy(
        trainer.get("strategy"), trainer.get("accelerator"), lora=model.get("lora"), hardware=run
    )
    settings = data_settings(data) if data else None
    if settings is not None:
        check_envs(settings)
    if model:
        check_model_name("--model.model", model["model"])
        module = module_settings(model, data)
        if module.critic.model is not None:
            check_model_name("--model.critic.model", module.critic.model)
        check_dtype("--model.dtype", model["dtype"])
        as_warm_start(model.get("warm_start"))
        as_group(EarlyStopSettings, model.get("early_stop"), "--model.early_stop")
        check_module_settings(module, lora_mod.as_settings(model.get("lora")))
        check_optimizer_factories(model.get("optim") or {})
        check_threads_precision(module.update.micro_batch_threads, trainer.get("precision"))
        check_data_settings(module.advantage, settings, tis_cap=module.loss.tis_cap)
    if settings is not None and (size := world_size(trainer)) is not None:
        check_world_size(settings, size)


def data_settings(data: dict[str, Any]) -> DataSettings:
    """The groups of a parsed ``data`` section (plain dicts), each checked as it is built, then
    together."""
    return DataSettings.build(**data)


def module_settings(model: dict[str, Any], data: dict[str, Any]) -> ModuleSettings:
    """The settings groups of a parsed ``model`` section (plain dicts), each checked as it is
    built."""
    temperature = (data.get("sampling") or {}).get("temperature", 1.0)
    return ModuleSettings.build(temperature, **{name: model.get(name) for name in GROUPS})


def check_optimizer_factories(optim: dict[str, Any]) -> None:
    """Build ``--model.optim.actor_optimizer`` / ``critic_optimizer`` (given as ``{class_path,
    init_args}`` or a callable) on one dummy parameter, so a bad argument (``lr: -1.0``) is one line
    naming the flag now, not a traceback when the module configures its optimizers after the run's
    folders exist."""
    import importlib

    import torch

    for name in ("actor_optimizer", "critic_optimizer"):
        factory, flag = optim.get(name), f"--model.optim.{name}"
        # a checkpoint's saved name: not rebuilt (OptimSettings)
        if factory is None or isinstance(factory, str):
            continue
        params = [torch.nn.Parameter(torch.zeros(1))]
        try:
            if isinstance(factory, dict):
                module, _, cls = str(factory.get("class_path", "")).rpartition(".")
                flag += f" {factory.get('class_path')}"
                getattr(importlib.import_module(module), cls)(
                    params, **(factory.get("init_args") or {})
                )
            else:
                factory(params)
        except Exception as e:  # noqa: BLE001  (the optimizer's own check: "Invalid learning rate: -1.0")
            first = (str(e).strip().splitlines() or [type(e).__name__])[0]
            raise ConfigError(f"{flag}: {first}") from None


def world_size(trainer: dict[str, Any]) -> int | None:
    """The number of processes ``--trainer.devices`` x ``--trainer.num_nodes`` start, when the
    config says it (None for ``auto`` / ``-1``, which Lightning resolves from the hardware; the data
    module checks again then)."""
    devices, nodes = trainer.get("devices", "auto"), trainer.get("num_nodes", 1)
    if isinstance(devices, str) and devices.strip().isdigit():
        devices = int(devices)
    elif isinstance(devices, str) and "," in devices:
        devices = [d for d in devices.split(",") if d.strip()]
    if isinstance(devices, (list, tuple)):
        devices = len(devices)
    if (
        isinstance(devices, bool)
        or not isinstance(devices, int)
        or devices < 1
        or not isinstance(nodes, int)
    ):
        return None
    return devices * max(nodes, 1)


def check_models_loadable(config: Any) -> None:
    """Before a run (not a parse or a memory plan): hub ids must be in the Hugging Face cache when
    offline."""
    model = _plain(config.get("model")) or {}
    names = {
        "--model.model": model.get("model"),
        "--model.critic.model": (model.get("critic") or {}).get("model"),
    }
    for flag, name in names.items():
        if name is not None:
            check_model_name(flag, name, cached=True)


def check_run(config: Any) -> None:
    """What a run needs beyond valid settings, checked with the tokenizer before anything is built:
    loadable models, an expert for the warm start's env, and a first prompt (plus a full response)
    that fits ``max_model_len``."""
    check_models_loadable(config)
    model, data = _plain(config.get("model")) or {}, _plain(config.get("data")) or {}
    if not (model and data):
        return
    settings = data_settings(data)
    # an env without an expert fails here, not after the tiny model is built
    if model.get("warm_start"):
        for entry in train_entries(settings):  # every entry of a mixture gives demonstrations
            require_expert(entry.env_id, entry.env_kwargs)
    dm = RolloutDataModule(**{f.name: getattr(settings, f.name) for f in fields(settings)})
    episodes = [dm.episode, *(e.episode_settings(dm.episode) for e in dm.train_entries)]
    check_context_length("--model.model", model["model"], episodes)
    dm.check_prompt_budget(load_tokenizer(model["model"]))


def model_positions(name: str) -> int | None:
    """The longest sequence model ``name`` takes, from its config (``max_position_embeddings`` times
    a RoPE scaling factor, as vLLM derives it); None when the config does not say or cannot be
    read."""
    from transformers import AutoConfig

    try:
        cfg = AutoConfig.from_pretrained(resolve_model_path(name))
    except Exception:  # noqa: BLE001  (an unreadable config is the model loader's error to report, not this check's)
        return None
    cfg = getattr(cfg, "text_config", None) or cfg  # a multimodal config nests the language model's
    positions = getattr(cfg, "max_position_embeddings", None)
    if not isinstance(positions, int):
        return None
    factor = (getattr(cfg, "rope_scaling", None) or {}).get("factor") or 1
    return int(positions * max(float(factor), 1.0))


def check_context_length(flag: str, name: str, episodes: list[Any]) -> None:
    """``--data.episode.max_model_len`` (of every episode setting a run uses) within model
    ``name``'s positions: vLLM refuses a longer one with a multi-line validation error after the
    run's folders exist."""
    limit = model_positions(name)
    longest = max((e.max_model_len for e in episodes if e is not None), default=0)
    if limit is not None and longest > limit:
        raise ConfigError(
            f"--data.episode.max_model_len {longest} exceeds the {limit} positions of {flag} {name} "
            "(its config's max_position_embeddings)"
        )


# -- output folders --------------------------------------------------------------------------------
def output_dirs(config: Any) -> dict[str, str]:
    """Folders the run will write to, by the flag that sets each: the trainer's root, every logger's
    ``save_dir``, every callback's ``dirpath`` and ``--model.export_dir``."""
    trainer = _plain(config.get("trainer")) or {}
    dirs = {"--trainer.default_root_dir": trainer.get("default_root_dir") or os.getcwd()}
    for group in ("logger", "callbacks"):
        entries = trainer.get(group)
        for i, entry in enumerate(entries if isinstance(entries, list) else [entries]):
            if not isinstance(entry, dict):
                continue
            args = entry.get("init_args") or {}
            name = str(entry.get("class_path", "")).split(".")[-1]
            for key in ("save_dir", "dirpath", "root_dir"):
                if args.get(key):
                    dirs[f"--trainer.{group}[{i}] ({name}) {key}"] = str(args[key])
    export = (_plain(config.get("model")) or {}).get("export_dir")
    if export:
        dirs["--model.export_dir"] = str(export)
    return dirs


def check_writable(flag: str, path: str | os.PathLike) -> None:
    """Raise :class:`ConfigError` unless ``path`` is a folder this process can create files in, or
    can be created: a temporary folder is made and removed in its nearest existing ancestor, so
    nothing is left behind."""
    target = Path(path).expanduser().absolute()
    existing = target
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise ConfigError(f"{flag} {str(path)!r}: {existing} is a file, not a folder")
    try:
        tempfile.TemporaryDirectory(dir=existing).cleanup()
    except OSError as e:
        raise ConfigError(
            f"{flag} {str(path)!r}: cannot write in {existing} ({e.strerror or e})"
        ) from None


def check_output_dirs(config: Any) -> None:
    for flag, path in output_dirs(config).items():
        check_writable(flag, path)


# -- wandb -----------------------------------------------------------------------------------------
def unreachable(url: str, timeout: float = WANDB_TIMEOUT_S) -> str | None:
    """Why ``url`` gives no HTTP answer within ``timeout`` seconds (None: it answers, with any
    status). A server that accepts the connection but never answers counts as unreachable, as does
    one that refuses it; the request runs in a helper thread, so a hanging DNS lookup or TLS
    handshake also counts as a timeout."""
    import urllib.error
    import urllib.request

    outcome: list[str | None] = []

    def ask() -> None:
        try:
            urllib.request.urlopen(
                urllib.request.Request(url, method="HEAD"), timeout=timeout
            ).close()
            outcome.append(None)
        except urllib.error.HTTPError:  # an HTTP status (401, 404, ...): the server answers
            outcome.append(None)
        except (OSError, ValueError) as e:  # URLError wraps refusals, timeouts, DNS failures
            reason = getattr(e, "reason", e)
            outcome.append(
                getattr(reason, "strerror", None) or str(reason) or type(reason).__name__
            )

    worker = threading.Thread(target=ask, daemon=True)
    worker.start()
    worker.join(timeout + 0.5)
    return outcome[0] if outcome else f"no answer within {timeout:g} s"


def _online_wandb_loggers(config: Any) -> list[Any]:
    """The WandbLogger entries of ``--trainer.logger`` that would log online (as the config's own
    objects)."""
    if os.environ.get("WANDB_MODE", "").lower() in (
        "offline",
        "disabled",
        "dryrun",
    ) or os.environ.get("WANDB_DISABLED", "").lower() in ("1", "true"):
        return []
    trainer = config.get("trainer")
    loggers = trainer.get("logger") if trainer is not None else None
    found = []
    for entry in loggers if isinstance(loggers, list) else [loggers]:
        if str(_get(entry, "class_path") or "").split(".")[-1] != "WandbLogger":
            continue
        args = _get(entry, "init_args")
        if not (_get(args, "offline") or _get(args, "mode") in ("offline", "disabled")):
            found.append(args)
    return found


def _get(obj: Any, key: str) -> Any:
    if obj is None:
        return None
    return obj.get(key) if hasattr(obj, "get") else getattr(obj, key, None)


def wandb_offline_fallback(config: Any, timeout: float = WANDB_TIMEOUT_S) -> str | None:
    """An online WandbLogger whose server cannot be reached within ``timeout`` seconds is switched
    to offline mode in ``config`` (wandb would otherwise block for minutes and then fail the run);
    returns the one-line warning to print, or None when nothing changed."""
    loggers = _online_wandb_loggers(config)
    if not loggers:
        return None
    url = os.environ.get("WANDB_BASE_URL") or "https://api.wandb.ai"
    reason = unreachable(url, timeout)
    if reason is None:
        return None
    for args in loggers:
        args["offline"] = True
    return (
        f"warning: wandb server {url} unreachable ({reason}): logging offline instead; upload later with "
        "`wandb sync <save_dir>/wandb/offline-run-*`"
    )


# -- the command line's parse errors ---------------------------------------------------------------
def parse_error_line(message: str) -> str:
    """jsonargparse's multi-line parse error as one line naming the flag: ``Parser key
    "data.num_groups": Expected a <class 'int'>. Got value: many`` -> ``--data.training.num_groups:
    expected int, got 'many'``."""
    text = re.sub(r"<class '(?:[\w]+\.)*(\w+)'>", r"\1", message)
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    flag = ""
    if lines and (m := re.match(r'^Parser key "([^"]+)":\s*(.*)$', lines[0])):
        flag, lines = f"--{m.group(1)}", ([m.group(2)] if m.group(2) else []) + lines[1:]
    noise = (
        "Does not validate against any of the Union subtypes",
        "Subtypes:",
        "Errors:",
        "Given value type:",
        "- Expected a NoneType",
        "Expected a NoneType",
    )
    given = next(
        (line.split(":", 1)[1].strip() for line in lines if line.startswith("Given value:")), None
    )
    reasons = [
        line.lstrip("- ").strip()
        for line in lines
        if not line.startswith(noise) and not line.startswith("Given value:")
    ]
    reasons = [
        r for r in reasons if r and not r.startswith("Problem with given class_path")
    ] or reasons
    detail = "; ".join(dict.fromkeys(reasons)) or "invalid value"
    detail = re.sub(r"Expected a (\w+)\. Got value: (.*)", r"expected \1, got \2", detail)
    if given is not None and "got" not in detail:
        detail += f" (got {given})"
    line = f"{flag}: {detail}" if flag else detail
    return line[0].lower() + line[1:] if line[:1].isupper() and not flag else line


_REMOVED_FLAGS = {
    "optimizer": "--model.optim.actor_optimizer (and --model.optim.critic_optimizer)",
    "lr_scheduler": "--model.optim.warmup_steps and --model.optim.decay_iterations",
}


def removed_flag_error(message: str) -> str | None:
    """The one-line error for LightningCLI's generic ``--optimizer`` / ``--lr_scheduler`` flags,
    which this command line does not have (the module builds its own optimizers and schedules),
    naming the flags that do it; else None."""
    for name, instead in _REMOVED_FLAGS.items():
        if re.search(rf"(?<![\w.])--{name}\b", message):
            return f"--{name} is not a flag of this command line: use {instead}"
    return None


def warn(line: str) -> None:
    print(line, file=sys.stderr, flush=True)
