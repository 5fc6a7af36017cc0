"""The command line: ``python main.py fit|validate --config configs/<task>.yaml [--config overlay.yaml] [--flag v]``.

A thin LightningCLI subclass: the module and data module signatures are the configuration, values that must agree
are declared once and linked (the rollout temperature is what the trainer's log-probs are computed at).
"""

from __future__ import annotations

import os

from lightning.pytorch.cli import LightningCLI

from ragen_lightning.data.datamodule import RolloutDataModule
from ragen_lightning.module import StarPOModule


class StarPOCLI(LightningCLI):
    def add_arguments_to_parser(self, parser) -> None:
        parser.link_arguments("data.temperature", "model.temperature")


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
