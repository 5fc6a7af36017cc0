"""Where built models live (the tiny model, its Qwen2.5-tokenizer variant, warm starts): one folder for all."""

from __future__ import annotations

import os
from pathlib import Path

CACHE_ENV_VAR = "RAGEN_LIGHTNING_CACHE"


def cache_root() -> Path:
    """Where built models live: ``$RAGEN_LIGHTNING_CACHE`` or ``~/.cache/ragen_lightning``."""
    return Path(os.environ.get(CACHE_ENV_VAR) or Path.home() / ".cache" / "ragen_lightning")
