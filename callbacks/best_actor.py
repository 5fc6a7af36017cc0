"""BestActorExport: keep the actor of the best validation so far as a model folder (model selection
on validation).

RL runs on small models often climb and then drift back (docs/learning.md); the last weights are
then not the best ones the run produced. This callback exports the actor
(``StarPOModule.export_actor``: a HF folder, or a LoRA adapter) to ``dirpath`` each time the
monitored validation metric reaches a new best, and writes ``dirpath/best.json`` (``monitor``,
``value``, ``iteration``: the number of training iterations behind the weights, 0 for the starting
model validated by ``--validate_first``, ``global_step``). Evaluate the folder on episodes that are
not the validation seeds (``benchmarks/learning.py --select best`` uses held-out evaluation seeds),
else the reported success is biased upward by the selection.

The folder is replaced whole: the export goes to a temporary sibling that is renamed over
``dirpath``, so a crash never leaves a half-written best actor. The best value and its iteration are
kept in checkpoints, so a resumed run only replaces the folder with a better one. ``main.py
validate`` (a checkpoint on its own) never exports.

    trainer:
      callbacks:
        - class_path: callbacks.BestActorExport
          init_args: {dirpath: outputs/sokoban/best_actor, monitor: val_success}
"""

from __future__ import annotations

import json
import math
import os
import shutil
from pathlib import Path
from typing import Any, Literal

from lightning.pytorch.callbacks import Callback

from callbacks._common import iteration_data, iteration_number, logged_step
from ragen_lightning.errors import ConfigError


def improves(value: float, best: float | None, mode: str, min_delta: float) -> bool:
    """``value`` beats ``best`` by more than ``min_delta`` in the direction of ``mode`` (any value
    beats None)."""
    if best is None:
        return True
    return value > best + min_delta if mode == "max" else value < best - min_delta


class BestActorExport(Callback):
    """Exports the actor to ``dirpath`` whenever validation's ``monitor`` reaches a new best (module
    docstring).

    Args:
        dirpath: the model folder to keep the best actor in (replaced whole on each new best).
        monitor: a validation metric the module logs (``val_success``, ``val/score``, ...). mode:
        ``max`` (success, score) or ``min``. min_delta: a new value must beat the best by more than
        this; ties keep the earlier (less trained) actor.
    """

    def __init__(
        self,
        dirpath: str,
        monitor: str = "val_success",
        mode: Literal["max", "min"] = "max",
        min_delta: float = 0.0,
    ):
        if mode not in ("max", "min"):
            raise ConfigError(f"BestActorExport: mode must be 'max' or 'min', got {mode!r}")
        if not (
            isinstance(min_delta, (int, float)) and math.isfinite(min_delta) and min_delta >= 0
        ):
            raise ConfigError(
                f"BestActorExport: min_delta must be a finite number >= 0, got {min_delta!r}"
            )
        if not str(dirpath).strip():
            raise ConfigError("BestActorExport: dirpath must name a folder")
        self.dirpath, self.monitor, self.mode, self.min_delta = (
            Path(dirpath),
            monitor,
            mode,
            float(min_delta),
        )
        self.best: float | None = None
        self.best_iteration: int | None = None

    def on_validation_end(self, trainer, pl_module) -> None:
        fitting = trainer.state.fn == "fit" or getattr(pl_module, "validating_first", False)
        if trainer.sanity_checking or not fitting:
            return
        if self.monitor not in trainer.callback_metrics:
            known = ", ".join(sorted(k for k in trainer.callback_metrics if "val" in k)) or "none"
            raise ConfigError(
                f"BestActorExport: monitor {self.monitor!r} was not logged by validation "
                f"(validation logged: {known})"
            )
        value = float(trainer.callback_metrics[self.monitor])
        if not math.isfinite(value) or not improves(value, self.best, self.mode, self.min_delta):
            return
        data = iteration_data(pl_module)
        iteration = 0 if data is None else iteration_number(data[1], trainer.global_step)
        self.best, self.best_iteration = value, iteration
        self._export(
            trainer,
            pl_module,
            {
                "monitor": self.monitor,
                "value": value,
                "iteration": iteration,
                "global_step": int(trainer.global_step),
            },
        )

    def _export(self, trainer, pl_module, record: dict[str, Any]) -> None:
        rank = trainer.global_rank
        tmp = self.dirpath.with_name(f".{self.dirpath.name}.tmp")
        if rank == 0 and tmp.exists():
            shutil.rmtree(tmp)
        trainer.strategy.barrier()
        sharded = pl_module.device_mesh is not None  # FSDP2: every rank gathers
        if rank == 0 or sharded:
            pl_module.export_actor(tmp)
        if rank == 0:
            (tmp / "best.json").write_text(json.dumps(record, indent=1) + "\n")
            old = self.dirpath.with_name(f".{self.dirpath.name}.old")
            if old.exists():
                shutil.rmtree(old)
            if self.dirpath.exists():
                os.replace(self.dirpath, old)
            os.replace(tmp, self.dirpath)
            shutil.rmtree(old, ignore_errors=True)
        trainer.strategy.barrier()
        for logger in trainer.loggers:
            logger.log_metrics(
                {f"best/{self.monitor}": record["value"], "best/iteration": record["iteration"]},
                step=logged_step(trainer),
            )

    def state_dict(self) -> dict[str, Any]:
        return {"best": self.best, "best_iteration": self.best_iteration}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.best, self.best_iteration = state_dict.get("best"), state_dict.get("best_iteration")
