"""ragen_lightning command line: ``python main.py fit --config configs/sokoban.yaml``."""

import os

# Before torch loads: its C++ log prints a WARNING per vLLM CPU engine start ("NUMA binding: Using
# MEMBIND policy"), which says nothing actionable; errors still print, and
# TORCH_CPP_LOG_LEVEL=WARNING (or INFO, e.g. to debug collectives) shows everything again.
os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")

import envs  # noqa: E402, F401  (registers the ragen/* gymnasium ids the configs name)
from ragen_lightning.cli import main  # noqa: E402

if __name__ == "__main__":
    main()
