"""ValidationGain: every validation's success against the run's first validation, paired over the
same levels, with its 95 % interval.

A run validates on fixed levels (the same reset seeds every time), so each level's outcome at a
later validation pairs with its outcome at the first one (iteration 0 with ``--validate_first``):
the gain ``d = mean(s_now - s_first)`` has the standard error ``sd(s_now - s_first) / sqrt(n)``,
tighter than two independent proportions (``ragen_lightning.metrics.intervals.paired_difference``). Logged
as ``val/success_gain``, ``val/success_gain_lo`` and ``val/success_gain_hi``; the plain progress
lines print ``gain +0.109 [+0.031, +0.187]``. The first validation's outcomes are kept in
checkpoints, so a resumed run keeps comparing with the same start. ``main.py validate`` (a
checkpoint on its own) compares nothing.

    trainer:
      callbacks:
        - class_path: callbacks.ValidationGain
"""

from __future__ import annotations

from typing import Any

from lightning.pytorch.callbacks import Callback

from ragen_lightning.metrics.intervals import paired_difference

KEYS = ("val/success_gain", "val/success_gain_lo", "val/success_gain_hi")


def outcomes(trajectories: list[Any]) -> dict[str, int]:
    """``{"<reset seed>/<env index>": 0 or 1}``: each validation episode's success, keyed by what
    makes it the same episode at every validation."""
    return {f"{t.seed}/{t.env_index}": int(bool(t.success)) for t in trajectories}


class ValidationGain(Callback):
    """Logs each validation's paired success gain over the first validation (module docstring)."""

    def __init__(self) -> None:
        self.first: dict[str, int] | None = None

    def on_validation_batch_end(
        self, trainer, pl_module, outputs, batch, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        fitting = trainer.state.fn == "fit" or getattr(pl_module, "validating_first", False)
        if trainer.sanity_checking or not fitting:
            return
        now = outcomes(list(getattr(batch, "trajectories", None) or []))
        if not now:
            return
        if self.first is None:
            self.first = now
            return
        keys = sorted(self.first.keys() & now.keys())
        if len(keys) < 2:
            return
        gain = paired_difference([now[k] for k in keys], [self.first[k] for k in keys])
        pl_module.log_dict(dict(zip(KEYS, gain, strict=True)), on_epoch=True, batch_size=1)

    def state_dict(self) -> dict[str, Any]:
        return {"first": self.first}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.first = state_dict.get("first")
