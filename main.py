"""ragen_lightning command line: ``python main.py fit --config configs/sokoban.yaml``."""

import envs  # noqa: F401  (registers the ragen/* gymnasium ids the configs name)
from ragen_lightning.cli import main

if __name__ == "__main__":
    main()
