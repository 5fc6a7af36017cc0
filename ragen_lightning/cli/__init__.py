"""The command line: ``python main.py fit|validate --config configs/<task>.yaml [--config
overlay.yaml] [--flag v]``.

A thin LightningCLI subclass: the module and data module signatures are the configuration, values
that must agree are declared once and linked (the rollout temperature is what the trainer's
log-probs are computed at).
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

import torch
from jsonargparse import ArgumentError
from lightning.pytorch.callbacks import ProgressBar
from lightning.pytorch.cli import LightningCLI

from ragen_lightning.cli import preflight, progress
from ragen_lightning.data.datamodule import RolloutDataModule
from ragen_lightning.data.sampler import renamed_filter_flag_error
from ragen_lightning.data.settings import renamed_flag_error as renamed_data_flag_error
from ragen_lightning.errors import (
    ConfigError,
    TrainingStopped,
    filter_harmless_warnings,
)
from ragen_lightning.parallel import checkpointing
from ragen_lightning.starpo.module import StarPOModule
from ragen_lightning.starpo.settings import renamed_flag_error

_SEED_LOG = logging.getLogger("lightning.fabric.utilities.seed")


class StarPOCLI(LightningCLI):
    def __init__(self, *args, **kwargs) -> None:
        # no generic --optimizer / --lr_scheduler flags: the module builds its own optimizers
        # (--model.optim.*), and LightningCLI's would be ignored or crash ("empty parameter list");
        # preflight.removed_flag_error answers them
        kwargs.setdefault("auto_configure_optimizers", False)
        super().__init__(*args, **kwargs)

    def instantiate_trainer(self, **kwargs):
        """LightningCLI's, plus :class:`~ragen_lightning.cli.progress.IterationLines` when stderr is
        not a terminal (Lightning's bar writes nothing readable to a log file) and no other progress
        bar is set or disabled."""
        trainer = self._get(self.config_init, "trainer", default={}) or {}
        callbacks = trainer.get("callbacks") or []
        bars = [
            c
            for c in (callbacks if isinstance(callbacks, list) else [callbacks])
            if isinstance(c, ProgressBar)
        ]
        if (
            progress.plain_lines_wanted()
            and trainer.get("enable_progress_bar") is not False
            and not bars
        ):
            extra = self.trainer_defaults.get("callbacks") or []
            self.trainer_defaults = {
                **self.trainer_defaults,
                "callbacks": [*extra, progress.IterationLines()],
            }
        return super().instantiate_trainer(**kwargs)

    def add_arguments_to_parser(self, parser) -> None:
        parser.link_arguments("data.sampling.temperature", "model.temperature")
        parser.add_argument(
            "--torch_threads",
            type=int | None,
            default=None,
            help="CPU threads for torch (null: torch's default). Small models on few cores run fastest with 1: "
            "per-op threading overhead dominates and stalls badly when another process holds a core.",
        )
        parser.add_argument(
            "--memory_plan",
            type=bool,
            default=False,
            help="print the estimated peak GPU memory of this configuration and exit",
        )
        parser.add_argument(
            "--gpu_memory_gb",
            type=float | None,
            default=None,
            help="the GPU's memory in GiB: fit refuses to start when the memory plan's peak exceeds it",
        )
        parser.add_argument(
            "--validate_first",
            type=bool,
            default=False,
            help="fit: validate the starting model before the first update, so the run's validation "
            "curve starts at iteration 0 (not with a resumed --ckpt_path)",
        )
        parser.add_argument(
            "--allow_changed_settings",
            type=bool,
            default=False,
            help="with --ckpt_path: continue with model settings that differ from the checkpoint's "
            "(refused by default, naming them)",
        )

    def _before_run(self) -> None:
        # Lightning resolved "auto" devices by now
        self.datamodule.check_world_size(self.trainer.world_size)
        if (seed := self.config.get(f"{self.subcommand}.seed_everything")) not in (None, False):
            # deferred from _set_seed: a refused setting prints one line
            _SEED_LOG.info(f"Seed set to {seed}")
        self._check_resume()
        for logger in self.trainer.loggers:  # before the lazy wandb.init of the first log
            init = getattr(logger, "_wandb_init", None)
            if isinstance(init, dict) and init.get("anonymous") is None:
                # Lightning's WandbLogger always passes anonymous=None, which wandb answers with a
                # deprecation WARNING ("The anonymous setting has no effect") on every run; leaving
                # the key out changes nothing
                init.pop("anonymous", None)
            # else wandb warns "git root <dir> does not exist"
            if isinstance(init, dict) and init.get("dir"):
                Path(init["dir"]).mkdir(parents=True, exist_ok=True)

    before_validate = _before_run

    def before_fit(self) -> None:
        self._before_run()
        _checkpoint_after_validations(self.trainer, self.datamodule)
        config = self.config[self.subcommand]
        if config.get("validate_first") and not config.get("ckpt_path"):
            loop = self.trainer.validate_loop
            # a vLLM engine built under inference
            previous, loop.inference_mode = loop.inference_mode, False
            # part of the fit (callbacks.BestActorExport counts it)
            self.model.validating_first = True
            # mode holds inference tensors, which the first weight sync of the fit may not update in
            # place
            try:
                self.trainer.validate(self.model, datamodule=self.datamodule, verbose=False)
            finally:
                loop.inference_mode, self.model.validating_first = previous, False

    def _set_seed(self) -> None:
        level = _SEED_LOG.level
        _SEED_LOG.setLevel(logging.WARNING)
        try:
            super()._set_seed()
        finally:
            _SEED_LOG.setLevel(level)

    # -- checkpoints (ragen_lightning.parallel.checkpointing): verified load, resumes keep the model settings ---------
    def _parse_ckpt_path(self) -> None:
        """Replaces LightningCLI's, which ``torch.load``s the file unchecked (a bare ``EOFError``
        for an empty one) and silently puts the checkpoint's model settings over the given flags:
        here the file is verified (one line naming it) and the settings are compared in
        :meth:`_check_resume` instead."""
        self._ckpt_hparams, self._ckpt_progress = None, None
        if not self.config.get("subcommand"):
            return
        path = self.config[self.config.subcommand].get("ckpt_path")
        # else "last", "best"
        if path and ("://" in str(path) or Path(path).exists() or Path(path).suffix == ".ckpt"):
            ckpt = checkpointing.load_resume_info(path)
            self._ckpt_hparams = (path, ckpt.get("hyper_parameters", {}))
            fit_loop = (ckpt.get("loops") or {}).get("fit_loop") or {}
            processed = fit_loop.get("epoch_progress", {}).get("current", {}).get("processed")
            batches = fit_loop.get("epoch_loop.batch_progress", {})
            # saved after the last iteration's validation:
            if processed is not None and batches.get("is_last_batch"):
                # the epoch (the run) is over, though Lightning counts it processed only at its end
                processed += 1
            done = (ckpt.get(RolloutDataModule.__qualname__) or {}).get("iteration")
            self._ckpt_progress = (path, processed, done)

    def _check_resume(self) -> None:
        if self._ckpt_hparams is not None:
            allow = self.config[self.subcommand].get("allow_changed_settings", False)
            checkpointing.check_resume_settings(
                self.model.hparams, *self._ckpt_hparams, allow=bool(allow)
            )
        if self.subcommand == "fit" and self._ckpt_progress is not None:
            iterations = self.datamodule.settings.training.num_iterations
            epochs = resume_epochs(*self._ckpt_progress, iterations)
            if epochs is not None:
                self.trainer.fit_loop.max_epochs = max(
                    self.trainer.fit_loop.max_epochs or 1, epochs
                )

    def parse_arguments(self, parser, args) -> None:
        """Parse, then check every setting (:mod:`ragen_lightning.cli.preflight`) before the seed is
        set, any class is built or anything is written. A parse error is one line naming the flag,
        not jsonargparse's usage dump."""
        for p in _parsers(parser):
            p.exit_on_error = False
        try:
            super().parse_arguments(parser, args)
        except ArgumentError as e:
            message = str(e)
            raise ConfigError(
                renamed_flag_error(message)
                or renamed_data_flag_error(message)
                or renamed_filter_flag_error(message)
                or preflight.removed_flag_error(message)
                or preflight.parse_error_line(message)
            ) from None
        subcommand = self.config.get("subcommand")
        config = self.config[subcommand] if subcommand else self.config
        preflight.check_settings(config, run=subcommand is not None)
        # needs no download
        if config.get("memory_plan") or config.get("gpu_memory_gb") is not None:
            from ragen_lightning.cli.memory_check import check_memory

            check_memory(
                config,
                print_plan=bool(config.get("memory_plan")),
                refuse=subcommand in (None, "fit"),
            )
        if subcommand is not None:
            preflight.check_run(config)
        preflight.check_output_dirs(config)
        if warning := preflight.wandb_offline_fallback(config):
            preflight.warn(warning)

    def before_instantiate_classes(self) -> None:
        config = self.config[self.subcommand] if self.subcommand else self.config
        _fit_validation_into_run(config)
        threads = config.get("torch_threads")
        if threads is not None:
            torch.set_num_threads(threads)


# ``python main.py <name> ...`` besides LightningCLI's fit / validate / test / predict: jsonargparse
# commands over the same settings groups (ragen_lightning.data.shared_flags), each "module:function"
# taking argv, returning a status
SIDE_COMMANDS = {
    "evaluate": "ragen_lightning.evaluate:main",
    "warm_start": "ragen_lightning.sft.warm_start:main",
}


DESCRIPTION = (
    "StarPO training: fit / validate / test / predict (LightningCLI), and "
    "`python main.py evaluate --help`, `python main.py warm_start --help` over the "
    "same --data.env / --data.episode / --data.engine settings"
)


def run_side_command(name: str, argv: list[str]) -> int:
    """Run side command ``name`` (:data:`SIDE_COMMANDS`) on ``argv``; its exit status."""
    import importlib

    module, _, function = SIDE_COMMANDS[name].partition(":")
    return getattr(importlib.import_module(module), function)(argv)


def main(args: list[str] | None = None) -> StarPOCLI:
    """Run the CLI. From the shell (``args`` None) a configuration error prints one line and exits
    with 2; called from Python it raises :class:`~ragen_lightning.errors.ConfigError`. ``evaluate``
    and ``warm_start`` run their own commands (:data:`SIDE_COMMANDS`) and exit with their status."""
    argv = sys.argv[1:] if args is None else args
    if argv and argv[0] in SIDE_COMMANDS:
        raise SystemExit(run_side_command(argv[0], list(argv[1:])))
    # the tiny model is local; hub models must be cached already
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    filter_harmless_warnings()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    # vLLM logs ~15 WARNING lines per engine start on CPU, every one about a choice this project
    # makes on purpose (eager mode, no chunked prefill, in-process engine, no sleep mode on CPU, no
    # tcmalloc preload) or about weightless rotary buffers during a weight push; errors still print.
    # VLLM_LOGGING_LEVEL=INFO shows them.
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    try:
        return StarPOCLI(
            StarPOModule,
            RolloutDataModule,
            args=args,
            save_config_kwargs={"overwrite": True},
            parser_kwargs={"description": DESCRIPTION},
            trainer_defaults={"max_epochs": 1, "num_sanity_val_steps": 0},
        )
    # the non-finite guard gave up (ragen_lightning.starpo.optim.SkipGuard)
    except TrainingStopped as e:
        if args is not None:
            raise
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(1) from None
    except Exception as e:
        error = _config_error(e)
        if error is None or args is not None:
            raise
        print(f"error: {error}", file=sys.stderr)
        raise SystemExit(2) from None


def resume_epochs(
    path: str, processed: int | None, done: int | None, num_iterations: int
) -> int | None:
    """The ``max_epochs`` a fit resumed from checkpoint ``path`` needs: the run is one epoch of
    ``num_iterations`` batches, so a finished run (its epoch processed) extended to more iterations
    trains the rest in one more epoch (the stream yields the iterations left); None when the
    checkpoint says nothing. A checkpoint that has done ``num_iterations`` already is a
    :class:`ConfigError` (Lightning would exit having trained nothing)."""
    if processed is None or done is None:
        return None
    if done >= num_iterations:
        raise ConfigError(
            f"--ckpt_path {path} has trained {done} iterations already, "
            f"--data.training.num_iterations {num_iterations} asks for no more: "
            "raise --data.training.num_iterations to extend the run"
        )
    return int(processed) + 1


def _config_error(e: BaseException) -> ConfigError | None:
    """``e`` or the ConfigError that caused it (jsonargparse wraps errors raised while it builds
    nested settings)."""
    seen: set[int] = set()
    while e is not None and id(e) not in seen:
        if isinstance(e, ConfigError):
            return e
        seen.add(id(e))
        e = e.__cause__ or e.__context__
    return None


def _checkpoint_after_validations(trainer, datamodule) -> None:
    """``--trainer.val_check_interval 1`` (validate after every iteration) with validation on:
    Lightning's ModelCheckpoint takes the integer 1 for "once an epoch" (``1 == 1.0``) and saves
    only at the end of the epoch, which here is the end of the run, so a run stopped by a preemption
    had no checkpoint to resume. Checkpoints are taken after each validation instead, as with any
    other interval (a callback that sets ``save_on_train_epoch_end`` keeps its choice)."""
    interval = trainer.val_check_interval
    settings = getattr(datamodule, "settings", None)
    validates = trainer.limit_val_batches != 0 and (
        settings is None or settings.validation.num_groups
    )
    if not (isinstance(interval, int) and interval == 1 and validates):
        return
    for callback in trainer.checkpoint_callbacks:
        if getattr(callback, "_save_on_train_epoch_end", False) is None:
            callback._save_on_train_epoch_end = False


def _parsers(parser) -> list:
    """``parser`` and its subcommands' parsers."""
    action = getattr(parser, "_subcommands_action", None)
    subs = list(action._name_parser_map.values()) if action is not None else []
    return [parser, *(q for sub in subs for q in _parsers(sub))]


def _fit_validation_into_run(config) -> None:
    """A run shorter than ``--trainer.val_check_interval`` iterations validates once, at its end
    (Lightning refuses an integer interval larger than the epoch's batch count; here an epoch is the
    whole run)."""
    trainer, data = config.get("trainer") or {}, config.get("data") or {}
    interval = trainer.get("val_check_interval")
    iterations = (data.get("training") or {}).get("num_iterations")
    if (
        isinstance(interval, int)
        and not isinstance(interval, bool)
        and isinstance(iterations, int)
        and 0 < iterations < interval
    ):
        trainer["val_check_interval"] = iterations
