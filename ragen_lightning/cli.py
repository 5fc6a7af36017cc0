"""The command line: ``python main.py fit|validate --config configs/<task>.yaml [--config overlay.yaml] [--flag v]``.

A thin LightningCLI subclass: the module and data module signatures are the configuration, values that must agree
are declared once and linked (the rollout temperature is what the trainer's log-probs are computed at).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Optional

import torch
from lightning.pytorch.cli import LightningCLI

from ragen_lightning import checkpointing, models
from ragen_lightning.data.datamodule import RolloutDataModule
from ragen_lightning.errors import ConfigError, TrainingStopped
from ragen_lightning.parallel import check_strategy
from ragen_lightning.starpo.module import StarPOModule


class StarPOCLI(LightningCLI):
    def add_arguments_to_parser(self, parser) -> None:
        parser.link_arguments("data.temperature", "model.temperature")
        parser.add_argument(
            "--torch_threads", type=Optional[int], default=None,
            help="CPU threads for torch (null: torch's default). Small models on few cores run fastest with 1: "
                 "per-op threading overhead dominates and stalls badly when another process holds a core.",
        )
        parser.add_argument("--memory_plan", type=bool, default=False,
                            help="print the estimated peak GPU memory of this configuration and exit")
        parser.add_argument("--gpu_memory_gb", type=float | None, default=None,
                            help="the GPU's memory in GiB: fit refuses to start when the memory plan's peak exceeds it")
        parser.add_argument("--allow_changed_settings", type=bool, default=False,
                            help="with --ckpt_path: continue with model settings that differ from the checkpoint's "
                                 "(refused by default, naming them)")

    def _preflight(self) -> None:
        """Checks that need the tokenizer, before the trainer writes anything (config, logs, checkpoints)."""
        self.model.check_data(self.datamodule)
        if self.model.hparams.get("warm_start"):  # an env without an expert fails here, not after the tiny build
            from ragen_lightning.sft.experts import require_expert

            require_expert(self.datamodule.hparams.env_id, self.datamodule.hparams.env_kwargs)
        self.datamodule.check_world_size(self.trainer.world_size)  # before the launcher starts the processes
        self.datamodule.check_prompt_budget(models.load_tokenizer(self.model.hparams.model))
        self._check_resume()

    before_fit = before_validate = _preflight

    # -- checkpoints (ragen_lightning.checkpointing): verified load, resumes keep the model settings ----------------
    def _parse_ckpt_path(self) -> None:
        """Replaces LightningCLI's, which ``torch.load``s the file unchecked (a bare ``EOFError`` for an empty one)
        and silently puts the checkpoint's model settings over the given flags: here the file is verified (one line
        naming it) and the settings are compared in :meth:`_check_resume` instead."""
        self._ckpt_hparams = None
        if not self.config.get("subcommand"):
            return
        path = self.config[self.config.subcommand].get("ckpt_path")
        if path and (Path(path).exists() or Path(path).suffix == ".ckpt"):  # else "last", "best", a URL: Lightning's
            ckpt = checkpointing.load_verified(path, map_location="cpu", weights_only=True)
            self._ckpt_hparams = (path, ckpt.get("hyper_parameters", {}))

    def _check_resume(self) -> None:
        if self._ckpt_hparams is not None:
            allow = self.config[self.subcommand].get("allow_changed_settings", False)
            checkpointing.check_resume_settings(self.model.hparams, *self._ckpt_hparams, allow=bool(allow))

    def instantiate_classes(self) -> None:
        config = self.config[self.subcommand] if self.subcommand else self.config
        trainer = config.get("trainer") or {}
        check_strategy(trainer.get("strategy"), trainer.get("accelerator"))  # before Lightning's generic error
        super().instantiate_classes()

    def before_instantiate_classes(self) -> None:
        config = self.config[self.subcommand] if self.subcommand else self.config
        _fit_validation_into_run(config)
        threads = config.get("torch_threads")
        if threads is not None:
            if threads < 1:
                raise ConfigError(f"--torch_threads must be >= 1, got {threads}")
            torch.set_num_threads(threads)
        if config.get("memory_plan") or config.get("gpu_memory_gb") is not None:
            from ragen_lightning.models.memory import check_memory

            check_memory(config, print_plan=bool(config.get("memory_plan")), refuse=self.subcommand in (None, "fit"))


def main(args: list[str] | None = None) -> StarPOCLI:
    """Run the CLI. From the shell (``args`` None) a configuration error prints one line and exits with 2; called
    from Python it raises :class:`~ragen_lightning.errors.ConfigError`."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the tiny model is local; hub models must be cached already
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    try:
        return StarPOCLI(
            StarPOModule,
            RolloutDataModule,
            args=args,
            save_config_kwargs={"overwrite": True},
            trainer_defaults={"max_epochs": 1, "num_sanity_val_steps": 0},
        )
    except ConfigError as e:
        if args is not None:
            raise
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    except TrainingStopped as e:  # the non-finite guard gave up (ragen_lightning.starpo.optim.SkipGuard)
        if args is not None:
            raise
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(1) from None


def _fit_validation_into_run(config) -> None:
    """A run shorter than ``--trainer.val_check_interval`` iterations validates once, at its end (Lightning refuses
    an integer interval larger than the epoch's batch count; here an epoch is the whole run)."""
    trainer, data = config.get("trainer") or {}, config.get("data") or {}
    interval, iterations = trainer.get("val_check_interval"), data.get("num_iterations")
    if isinstance(interval, int) and not isinstance(interval, bool) and isinstance(iterations, int) \
            and 0 < iterations < interval:
        trainer["val_check_interval"] = iterations
