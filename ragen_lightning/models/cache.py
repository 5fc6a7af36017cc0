"""Where built models live (the tiny model, its Qwen2.5-tokenizer variant, warm starts): one folder
for all."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

CACHE_ENV_VAR = "RAGEN_LIGHTNING_CACHE"


def cache_root() -> Path:
    """Where built models live: ``$RAGEN_LIGHTNING_CACHE`` or ``~/.cache/ragen_lightning``."""
    return Path(os.environ.get(CACHE_ENV_VAR) or Path.home() / ".cache" / "ragen_lightning")


def build_folder(final: Path, write: Callable[[Path], None], marker: str) -> Path:
    """``final``, written by ``write(folder)`` into a temporary folder beside it and renamed into
    place, so an interrupted build never leaves a half-written folder; a concurrent builder that won
    the race (its folder holds ``marker``) is kept: the two are identical."""
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".building-", dir=final.parent))
    try:
        write(tmp)
        try:
            os.replace(tmp, final)
        except OSError:
            if not (final / marker).is_file():
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return final
