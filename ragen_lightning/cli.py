"""The command line: ``python main.py fit|validate --config configs/<task>.yaml [--config overlay.yaml] [--flag v]``.

A thin LightningCLI subclass: the module and data module signatures are the configuration, values that must agree
are declared once and linked (the rollout temperature is what the trainer's log-probs are computed at).
"""

from __future__ import annotations

import os
from typing import Optional

import torch
from lightning.pytorch.cli import LightningCLI

from ragen_lightning.data.datamodule import RolloutDataModule
from ragen_lightning.module import StarPOModule


class StarPOCLI(LightningCLI):
    def add_arguments_to_parser(self, parser) -> None:
        parser.link_arguments("data.temperature", "model.temperature")
        parser.add_argument(
            "--torch_threads", type=Optional[int], default=None,
            help="CPU threads for torch (null: torch's default). Small models on few cores run fastest with 1: "
                 "per-op threading overhead dominates and stalls badly when another process holds a core.",
        )

    def before_instantiate_classes(self) -> None:
        config = self.config[self.subcommand] if self.subcommand else self.config
        threads = config.get("torch_threads")
        if threads is not None:
            if threads < 1:
                raise ValueError(f"--torch_threads must be >= 1, got {threads}")
            torch.set_num_threads(threads)


def main(args: list[str] | None = None) -> StarPOCLI:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the tiny model is local; hub models must be cached already
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    return StarPOCLI(
        StarPOModule,
        RolloutDataModule,
        args=args,
        save_config_kwargs={"overwrite": True},
        trainer_defaults={"max_epochs": 1, "num_sanity_val_steps": 0},
    )
