"""The settings the side commands share with ``fit``, under the same keys, so each has one spelling
everywhere.

``python main.py evaluate`` and ``python main.py warm_start`` are jsonargparse parsers over the same
dataclasses as ``fit``'s data module: ``--data.env.*``, ``--data.episode.*``, ``--data.engine.*``
(the generation batch is ``--data.engine.max_batch_size``), and ``--model.model``. A fit's config
file feeds them
too: ``--config`` keeps the sections the command has and leaves out the rest (trainer, the module's
training groups, ...). A flag of the argparse command lines of before answers with its new spelling
(:func:`old_flag_error`).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ragen_lightning.data.settings import EnvSettings, ValidationSettings
from ragen_lightning.errors import ConfigError
from ragen_lightning.rollout.settings import EngineSettings, EpisodeSettings

SHARED_GROUPS: dict[str, type] = {
    "env": EnvSettings,
    "episode": EpisodeSettings,
    "engine": EngineSettings,
}


def side_parser(prog: str, description: str, *, validation: bool = False) -> Any:
    """A parser with ``--config`` and the groups every command shares: ``--data.env``,
    ``--data.episode``, ``--data.engine`` (and ``--data.validation``, whose ``suite`` an evaluation
    runs), ``--model.model``, ``--torch_threads`` and ``--imports``."""
    from jsonargparse import ActionConfigFile, ArgumentParser

    p = ArgumentParser(prog=prog, description=description, exit_on_error=False)
    p.add_argument(
        "--config",
        action=ActionConfigFile,
        help="a config file, e.g. a fit's configs/<task>.yaml (only the sections this command has)",
    )
    groups = {**SHARED_GROUPS, **({"validation": ValidationSettings} if validation else {})}
    for name, cls in groups.items():
        p.add_class_arguments(cls, f"data.{name}", help=(cls.__doc__ or "").split("\n")[0])
    p.add_argument(
        "--model.model",
        type=str,
        default="tiny",
        help="the model: 'tiny', a Hugging Face folder (a fit's --model.export_dir) or a cached "
        "hub id",
    )
    p.add_argument(
        "--torch_threads",
        type=int | None,
        default=None,
        help="CPU threads for torch (null: default)",
    )
    p.add_argument(
        "--imports",
        type=str | list[str] | None,
        default=None,
        help="modules registering env ids (default: the installed env packages, the "
        "ragen_lightning.envs entry points)",
    )
    return p


def _known(defaults: Any, config: Any) -> Any:
    """``config`` (a parsed YAML mapping) less the keys ``defaults`` (a parser's Namespace) does not
    have."""
    if not isinstance(config, dict) or not hasattr(defaults, "keys"):
        return config
    out = {}
    for key, value in config.items():
        if key in defaults and key != "config":
            inner = defaults[key]
            out[key] = (
                _known(inner, value)
                if hasattr(inner, "keys") and isinstance(value, dict)
                else value
            )
    return out


def filtered_configs(parser: Any, argv: Sequence[str]) -> list[str]:
    """``argv`` with every ``--config FILE`` replaced by the file's sections that ``parser`` has (a
    fit's config holds the trainer and the module's training groups too)."""
    import yaml

    defaults, out, i = parser.get_defaults(), [], 0
    argv = list(argv)
    while i < len(argv):
        arg = argv[i]
        name, eq, value = arg.partition("=")
        if name == "--config" and (eq or i + 1 < len(argv)):
            if not eq:
                i, value = i + 1, argv[i + 1]
            path = Path(value)
            if path.is_file():
                try:
                    data = yaml.safe_load(path.read_text()) or {}
                except yaml.YAMLError as e:
                    raise ConfigError(
                        f"--config {path}: not valid YAML ({str(e).splitlines()[0]})"
                    ) from None
                value = yaml.safe_dump(_known(defaults, data)) if isinstance(data, dict) else value
            out += ["--config", value]
        else:
            out.append(arg)
        i += 1
    return out


def old_flag_error(argv: Sequence[str], renamed: dict[str, str], command: str) -> str | None:
    """The one-line error for the first flag of ``argv`` that ``renamed`` maps to a new spelling
    (``--env`` -> ``--data.env.id``; ``--episode.<name>`` -> ``--data.episode.<name>``), else
    None."""
    for arg in argv:
        name = arg.partition("=")[0]
        if name.startswith("--episode"):
            return f"{name} was renamed: use --data.{name[2:]} (python main.py {command})"
        if name in renamed:
            return f"{name} was renamed: use {renamed[name]} (python main.py {command})"
    return None


def run_command(
    command: str,
    run: Callable[[list[str]], int],
    argv: Sequence[str] | None,
    renamed: dict[str, str],
) -> int:
    """Run ``run(argv)``; an old flag or a :class:`ConfigError` is one line on stderr and exit
    status 2."""
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        if line := old_flag_error(argv, renamed, command):
            raise ConfigError(line)
        return run(argv)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


def parse(parser: Any, argv: Sequence[str]) -> Any:
    """``argv`` parsed (``--config`` filtered), then the groups built (each checks itself); a parse
    error is one line naming the flag."""
    from jsonargparse import ArgumentError

    from ragen_lightning.data.settings import renamed_flag_error

    try:
        cfg = parser.parse_args(filtered_configs(parser, argv))
        return (
            parser.instantiate(cfg)
            if hasattr(parser, "instantiate")
            else parser.instantiate_classes(cfg)
        )
    except ArgumentError as e:
        raise ConfigError(renamed_flag_error(str(e)) or _one_line(str(e))) from None
    except ConfigError:
        raise
    except (TypeError, ValueError) as e:  # jsonargparse wraps a group's own check
        cause = e.__cause__ or e.__context__
        if isinstance(cause, ConfigError):
            raise cause from None
        raise ConfigError(_one_line(str(e))) from None


def _one_line(message: str) -> str:
    import re

    text = re.sub(r"<class '(?:[\w]+\.)*(\w+)'>", r"\1", message)
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    if lines and (m := re.match(r'^Parser key "([^"]+)":\s*(.*)$', lines[0])):
        return f"--{m.group(1)}: " + "; ".join([m.group(2)] if m.group(2) else lines[1:3])
    return "; ".join(lines[:2])
