"""RolloutThroughput: tokens per second and where an iteration's time goes (rollout vs update,
generation vs env).

Reads what the data module and the module already log (``timing_s/rollout`` with its
``timing_s/rollout_generate`` and ``timing_s/rollout_env`` parts, ``rollout/generated_tokens``,
``timing_s/update``) plus its own wall clock from ``on_train_batch_start`` to
``on_train_batch_end``, and logs ``throughput/*``:

* ``generate_tokens_per_s`` = generated tokens / generation time (the engine's decode speed);
* ``rollout_tokens_per_s`` = generated tokens / rollout time (includes env steps and prompt
  building);
* ``update_tokens_per_s`` = trained-batch tokens (attention mask sum) / update time;
* ``iteration_s``, and the fractions of it spent in ``rollout``, ``update``, ``env`` and ``other``
  (logging, callbacks; ``1 - rollout - update``);
* ``total_generated_tokens`` and ``total_s`` over the run (kept in the checkpoint, so they continue
  on resume).
"""

from __future__ import annotations

import time
from typing import Any

from lightning.pytorch.callbacks import Callback

from callbacks._common import iteration_data, log_values


def throughput_values(
    logs: dict[str, float], trained_tokens: float, iteration_s: float
) -> dict[str, float]:
    """The per-iteration ``throughput/*`` values from the logged timings (see the module
    docstring)."""
    out: dict[str, float] = {"throughput/iteration_s": iteration_s}
    tokens = logs.get("rollout/generated_tokens", 0.0)
    gen, rollout = logs.get("timing_s/rollout_generate", 0.0), logs.get("timing_s/rollout", 0.0)
    update, env = logs.get("timing_s/update", 0.0), logs.get("timing_s/rollout_env", 0.0)
    if gen > 0:
        out["throughput/generate_tokens_per_s"] = tokens / gen
    if rollout > 0:
        out["throughput/rollout_tokens_per_s"] = tokens / rollout
    if update > 0:
        out["throughput/update_tokens_per_s"] = trained_tokens / update
    if iteration_s > 0:
        out["throughput/rollout_fraction"] = rollout / iteration_s
        out["throughput/update_fraction"] = update / iteration_s
        out["throughput/env_fraction"] = env / iteration_s
        out["throughput/other_fraction"] = max(0.0, 1.0 - (rollout + update) / iteration_s)
    return out


class RolloutThroughput(Callback):
    """Logs tokens/s and the rollout / update / env time split of every iteration (module
    docstring)."""

    def __init__(self):
        self.total_tokens = 0.0
        self.total_s = 0.0
        self._t0: float | None = None

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self._t0 = time.perf_counter()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        data = iteration_data(pl_module)
        if data is None or self._t0 is None:
            return
        rollout, logs = data
        iteration_s = time.perf_counter() - self._t0
        trained = float(rollout.attention_mask.sum()) if len(rollout) else 0.0
        values = throughput_values(logs, trained, iteration_s)
        self.total_tokens += logs.get("rollout/generated_tokens", 0.0)
        self.total_s += iteration_s
        values["throughput/total_generated_tokens"] = self.total_tokens
        values["throughput/total_s"] = self.total_s
        log_values(trainer, values)

    def state_dict(self) -> dict[str, Any]:
        return {"total_tokens": self.total_tokens, "total_s": self.total_s}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.total_tokens = float(state_dict.get("total_tokens", 0.0))
        self.total_s = float(state_dict.get("total_s", 0.0))
