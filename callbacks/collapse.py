"""CollapseMonitor: RAGEN-2's MI diagnostics on a schedule, early-warning rules, and actions that
close the loop.

Rules (RAGEN v1's echo-trap signals and RAGEN-2's template-collapse signal;
RAGEN's trainer and collapse_metrics):

* ``reward_std``: in-group reward std (``rollout/in_group_reward_std``) below ``reward_std_ratio`` x
  its baseline for ``window`` iterations in a row (low reward variance = weak task gradient,
  RAGEN-2);
* ``entropy``: token entropy (``actor/entropy``) below ``entropy_ratio`` x its baseline for
  ``window`` iterations;
* ``mi``: the first-turn MI estimate below ``mi_ratio`` x its baseline for ``mi_window``
  measurements in a row (template collapse, invisible to entropy);
* ``grad_spike``: the actor grad norm above ``grad_spike_factor`` x the median of its previous
  ``grad_median_window`` values (needs ``baseline_window`` previous values).

A ratio rule's baseline is the mean of the first ``baseline_window`` values of its key
(``mi_baseline_window`` for MI); a baseline <= 0 (for MI: <= ``mi_min_baseline``) leaves the rule
silent (a fraction of nothing is no signal). After a rule fires its streak restarts, so a persisting
condition fires again every ``window`` iterations.

Every firing is logged (``collapse_monitor/warning/<rule>`` = 1, a warning message,
``collapse_monitor/warnings`` total) and triggers the configured ``actions`` (each logged as
``collapse_monitor/action/<action>`` = 1): ``log`` (nothing more), ``checkpoint``
(``trainer.save_checkpoint`` into ``dirpath``), ``stop`` (``trainer.should_stop``),
``adjust_filter`` (the data module's ``filter.value`` x ``filter_value_factor``, floored at
``filter_value_min``: a tighter reward-variance filter raises the signal-to-noise ratio, RAGEN-2's
fix) and ``adjust_entropy`` (the module's ``entropy_coeff`` x ``entropy_coeff_factor``, capped at
``entropy_coeff_max``; 0 becomes ``entropy_coeff_start``). The current filter value and entropy
coefficient are logged every iteration. Adjusted values are part of the callback state and are
re-applied when a run resumes.

Multi-process runs: the rules read each rank's own logged values and the MI is computed on each
rank's own trajectories, so ranks can disagree; ``stop`` then stops only the ranks that fired and
``checkpoint`` (a collective) could hang, and ``adjust_*`` would give ranks different settings. Use
``log`` there until the inputs are all-reduced (not done yet).
"""

from __future__ import annotations

import statistics
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch
from lightning.pytorch.callbacks import Callback

from callbacks._common import advance, log_values, on_schedule
from ragen_lightning.errors import ConfigError
from ragen_lightning.metrics.cross import (
    ReasoningFinder,
    first_turn_pairs,
    mi_diagnostics,
    score_pairs,
    thinking_flags,
    trajectory_pairs,
    trajectory_turns,
)
from ragen_lightning.metrics.functional import valid_thinking_rate

Action = Literal["log", "checkpoint", "stop", "adjust_filter", "adjust_entropy"]
ACTIONS = ("log", "checkpoint", "stop", "adjust_filter", "adjust_entropy")
MI_KEY = "collapse/first_turn/mi"


@dataclass
class RatioRule:
    """Fires when ``key`` stays below ``ratio`` x its baseline (mean of its first ``baseline_n``
    values) for ``window`` consecutive values."""

    key: str
    ratio: float
    baseline_n: int
    window: int
    min_baseline: float = 0.0  # a baseline at or below this leaves the rule silent
    history: list[float] = field(default_factory=list)
    streak: int = 0

    @property
    def baseline(self) -> float | None:
        return (
            sum(self.history) / len(self.history) if len(self.history) >= self.baseline_n else None
        )

    def update(self, value: float) -> bool:
        base = self.baseline
        if base is None:
            self.history.append(value)
            return False
        if base <= max(self.min_baseline, 0.0) or value >= self.ratio * base:
            self.streak = 0
            return False
        self.streak += 1
        if self.streak >= self.window:
            self.streak = 0
            return True
        return False


@dataclass
class SpikeRule:
    """Fires when ``key`` exceeds ``factor`` x the median of its previous ``median_window`` values
    (once at least ``min_history`` are known)."""

    key: str
    factor: float
    median_window: int
    min_history: int
    history: list[float] = field(default_factory=list)

    def update(self, value: float) -> bool:
        fired = len(self.history) >= self.min_history and value > self.factor * statistics.median(
            self.history
        )
        self.history = (self.history + [value])[-self.median_window :]
        return fired


def _check_settings(
    actions: list[str],
    compute_freq: int,
    filter_value_factor: float,
    entropy_coeff_factor: float,
    counts: dict[str, int],
) -> None:
    """:class:`CollapseMonitor`'s argument checks, a :class:`ConfigError` naming the first bad one
    (``counts``: the arguments that must be >= 1, in the order they are checked)."""
    bad = [a for a in actions if a not in ACTIONS]
    if bad:
        raise ConfigError(f"CollapseMonitor actions must be among {list(ACTIONS)}, got {bad}")
    for name, value in counts.items():
        if value < 1:
            raise ConfigError(f"CollapseMonitor {name} must be >= 1, got {value}")
    if compute_freq < 0:
        raise ConfigError(f"CollapseMonitor compute_freq must be >= 0, got {compute_freq}")
    if not 0 < filter_value_factor <= 1 or entropy_coeff_factor < 1:
        raise ConfigError(
            "CollapseMonitor filter_value_factor must be in (0, 1] and entropy_coeff_factor >= 1"
        )


class CollapseMonitor(Callback):
    """Watches a StarPO run for collapse and acts on it; also computes the MI diagnostics (module
    docstring).

    Args:
        actions: what a warning does, any of ``log``, ``checkpoint``, ``stop``, ``adjust_filter``,
            ``adjust_entropy`` (``[log]``: warn and log only).
        baseline_window: iterations whose mean is a ratio rule's baseline (and grad-norm values
        needed before the
            spike rule is armed).
        window: consecutive iterations below the threshold that fire ``reward_std`` / ``entropy``.
        reward_std_ratio: ``reward_std`` threshold as a fraction of the baseline (0 disables the
        rule). reward_std_key: the logged key of the in-group reward std. entropy_ratio: ``entropy``
        threshold as a fraction of the baseline (0 disables the rule). entropy_key: the logged key
        of the token entropy. mi_ratio: ``mi`` threshold as a fraction of the baseline MI (0
        disables the rule). mi_baseline_window: MI measurements whose mean is the MI baseline.
        mi_window: consecutive MI measurements below the threshold that fire ``mi``.
        mi_min_baseline: an MI baseline (nats) at or below this leaves the ``mi`` rule silent: the
        reasoning never
            depended on the prompt, so there is no drop to detect (and a fraction of noise is noise).
        grad_spike_factor: ``grad_spike`` threshold as a multiple of the running median (0 disables
        the rule). grad_median_window: values in the running median. grad_norm_key: the logged key
        of the actor grad norm. compute_freq: compute the MI diagnostics at iteration 1 and every
        ``compute_freq`` iterations (0: never). first_turn: compute the first-turn matrix
        (``collapse/first_turn/*``). trajectory: compute the trajectory-uniform matrix
        (``collapse/trajectory/*``). num_samples: first-turn rows at most (drawn without
        replacement) and trajectory-uniform draws. micro_batch_size: sequences per teacher-forcing
        forward pass. ema_decay: decay of the EMA of the marginal std in ``mi_zscore_ema``. seed:
        seed of the row sampling (combined with the iteration). dirpath: folder of the
        ``checkpoint`` action (default ``<trainer.default_root_dir>/collapse_checkpoints``).
        filter_value_factor: ``adjust_filter`` multiplies the filter value by this.
        filter_value_min: ``adjust_filter`` never goes below this value. entropy_coeff_factor:
        ``adjust_entropy`` multiplies the entropy coefficient by this. entropy_coeff_start:
        ``adjust_entropy`` sets a zero coefficient to this. entropy_coeff_max: ``adjust_entropy``
        never goes above this.
    """

    def __init__(
        self,
        actions: list[Action] | None = None,
        baseline_window: int = 5,
        window: int = 3,
        reward_std_ratio: float = 0.3,
        reward_std_key: str = "rollout/in_group_reward_std",
        entropy_ratio: float = 0.5,
        entropy_key: str = "actor/entropy",
        mi_ratio: float = 0.3,
        mi_baseline_window: int = 2,
        mi_window: int = 2,
        mi_min_baseline: float = 0.01,
        grad_spike_factor: float = 5.0,
        grad_median_window: int = 20,
        grad_norm_key: str = "actor/grad_norm",
        compute_freq: int = 5,
        first_turn: bool = True,
        trajectory: bool = True,
        num_samples: int = 32,
        micro_batch_size: int = 32,
        ema_decay: float = 0.9,
        seed: int = 0,
        dirpath: str | None = None,
        filter_value_factor: float = 0.8,
        filter_value_min: float = 0.1,
        entropy_coeff_factor: float = 2.0,
        entropy_coeff_start: float = 1e-3,
        entropy_coeff_max: float = 0.05,
    ):
        self.actions = list(actions) if actions is not None else ["log"]
        _check_settings(
            self.actions,
            compute_freq,
            filter_value_factor,
            entropy_coeff_factor,
            {
                "baseline_window": baseline_window,
                "window": window,
                "mi_window": mi_window,
                "mi_baseline_window": mi_baseline_window,
                "grad_median_window": grad_median_window,
                "num_samples": num_samples,
                "micro_batch_size": micro_batch_size,
            },
        )
        self.rules: dict[str, RatioRule | SpikeRule] = {}
        if reward_std_ratio > 0:
            self.rules["reward_std"] = RatioRule(
                reward_std_key, reward_std_ratio, baseline_window, window
            )
        if entropy_ratio > 0:
            self.rules["entropy"] = RatioRule(entropy_key, entropy_ratio, baseline_window, window)
        if mi_ratio > 0:
            self.rules["mi"] = RatioRule(
                MI_KEY, mi_ratio, mi_baseline_window, mi_window, mi_min_baseline
            )
        if grad_spike_factor > 0:
            self.rules["grad_spike"] = SpikeRule(
                grad_norm_key, grad_spike_factor, grad_median_window, baseline_window
            )
        self.compute_freq, self.first_turn, self.trajectory = compute_freq, first_turn, trajectory
        self.num_samples, self.micro_batch_size, self.ema_decay, self.seed = (
            num_samples,
            micro_batch_size,
            ema_decay,
            seed,
        )
        self.dirpath = dirpath
        self.filter_value_factor, self.filter_value_min = filter_value_factor, filter_value_min
        self.entropy_coeff_factor, self.entropy_coeff_start = (
            entropy_coeff_factor,
            entropy_coeff_start,
        )
        self.entropy_coeff_max = entropy_coeff_max
        self.iterations = 0
        self.fired: list[tuple[int, str]] = []  # (iteration, rule)
        # filter_value / entropy_coeff set by actions (re-applied on resume)
        self.adjusted: dict[str, float] = {}
        self.ema: dict[str, dict[str, torch.Tensor]] = {}
        self._finder: ReasoningFinder | None = None

    # -- rules -------------------------------------------------------------------------------------
    def observe(self, values: dict[str, float]) -> list[str]:
        """Feed one iteration's values; returns the rules that fired (no side effects beyond the
        rules' state)."""
        return [
            name
            for name, rule in self.rules.items()
            if rule.key in values and rule.update(float(values[rule.key]))
        ]

    # -- actions -----------------------------------------------------------------------------------
    def act(
        self, trainer: Any, pl_module: Any, iteration: int, fired: list[str]
    ) -> dict[str, float]:
        """Carry out the configured actions for the rules in ``fired``; returns the values to
        log."""
        out: dict[str, float] = {}
        if not fired:
            return out
        for rule in fired:
            self.fired.append((iteration, rule))
            out[f"collapse_monitor/warning/{rule}"] = 1.0
            warnings.warn(
                f"CollapseMonitor: {rule} rule fired at iteration {iteration} "
                f"({self._describe(rule)}); actions: {self.actions}",
                stacklevel=2,
            )
        for action in self.actions:
            out[f"collapse_monitor/action/{action}"] = 1.0
            if action == "stop":
                trainer.should_stop = True
            elif action == "checkpoint":
                root = self.dirpath or str(
                    Path(getattr(trainer, "default_root_dir", ".")) / "collapse_checkpoints"
                )
                path = Path(root) / f"collapse-{'-'.join(fired)}-iter{iteration}.ckpt"
                trainer.save_checkpoint(str(path))
            elif action == "adjust_filter":
                value = trainer.datamodule.filter.value * self.filter_value_factor
                self._set_filter_value(trainer, max(self.filter_value_min, value))
            elif action == "adjust_entropy":
                coeff = pl_module.loss.entropy_coeff
                coeff = (
                    self.entropy_coeff_start if coeff == 0 else coeff * self.entropy_coeff_factor
                )
                pl_module.set_entropy_coeff(min(coeff, self.entropy_coeff_max))
                self.adjusted["entropy_coeff"] = pl_module.loss.entropy_coeff
        return out

    def _set_filter_value(self, trainer: Any, value: float) -> None:
        """Replace the data module's filter settings by a copy with ``value``, checked like the
        flag (``FilterSettings.with_value``); a value the strategy refuses (a fraction for
        ``top_k_abs``) is a warning, and the filter stays as it was."""
        try:
            trainer.datamodule.filter = trainer.datamodule.filter.with_value(value)
        except ConfigError as e:
            warnings.warn(
                f"CollapseMonitor adjust_filter left the filter as it was: {e}", stacklevel=2
            )
            return
        self.adjusted["filter_value"] = trainer.datamodule.filter.value

    def _describe(self, rule: str) -> str:
        r = self.rules[rule]
        if isinstance(r, RatioRule):
            base = "unknown" if r.baseline is None else f"{r.baseline:.4g}"
            return f"{r.key} below {r.ratio} x baseline {base} for {r.window} values"
        return f"{r.key} above {r.factor} x running median"

    def _apply_adjusted(self, trainer: Any, pl_module: Any) -> None:
        if "filter_value" in self.adjusted and getattr(trainer, "datamodule", None) is not None:
            self._set_filter_value(trainer, self.adjusted["filter_value"])
        if "entropy_coeff" in self.adjusted:
            pl_module.set_entropy_coeff(self.adjusted["entropy_coeff"])

    # -- MI diagnostics ----------------------------------------------------------------------------
    def mi_values(
        self, pl_module: Any, trajectories: list[Any], iteration: int
    ) -> dict[str, float]:
        """Score the first-turn and trajectory-uniform matrices of ``trajectories`` and return the
        logged values."""
        if self._finder is None:
            self._finder = ReasoningFinder(pl_module.tokenizer)
        turns = trajectory_turns(trajectories, self._finder)
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + iteration)
        out: dict[str, float] = {}
        flags = thinking_flags(turns)
        if flags.numel():
            out["collapse/valid_thinking_rate"] = float(valid_thinking_rate(flags))
        jobs = []
        if self.first_turn:
            jobs.append(("first_turn", first_turn_pairs(turns, self.num_samples, gen)))
        if self.trajectory:
            jobs.append(("trajectory", trajectory_pairs(turns, self.num_samples, gen)))
        pad = pl_module.tokenizer.pad_token_id or 0
        for label, pairs in jobs:
            scores = score_pairs(pl_module.actor, pairs, self.micro_batch_size, pad_token_id=pad)
            out.update(
                mi_diagnostics(
                    pairs,
                    scores,
                    f"collapse/{label}",
                    self.ema.setdefault(label, {}),
                    self.ema_decay,
                )
            )
        return out

    # -- hooks -------------------------------------------------------------------------------------
    def on_train_start(self, trainer, pl_module) -> None:
        self._apply_adjusted(trainer, pl_module)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        step = advance(self, pl_module)
        if step is None:
            return
        rollout, values, iteration = step
        logged: dict[str, float] = {}
        if on_schedule(iteration, self.compute_freq) and rollout.trajectories:
            logged.update(self.mi_values(pl_module, rollout.trajectories, iteration))
        values.update(logged)
        logged.update(self.act(trainer, pl_module, iteration, self.observe(values)))
        logged["collapse_monitor/warnings"] = float(len(self.fired))
        logged["collapse_monitor/entropy_coeff"] = float(pl_module.loss.entropy_coeff)
        if getattr(trainer, "datamodule", None) is not None and hasattr(
            trainer.datamodule, "filter"
        ):
            logged["collapse_monitor/filter_value"] = float(trainer.datamodule.filter.value)
        log_values(trainer, logged)

    # -- resume ------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {
            "iterations": self.iterations,
            "fired": [list(f) for f in self.fired],
            "adjusted": dict(self.adjusted),
            "rules": {name: asdict(rule) for name, rule in self.rules.items()},
            "ema": {label: {k: float(v) for k, v in s.items()} for label, s in self.ema.items()},
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.iterations = int(state_dict.get("iterations", 0))
        self.fired = [(int(i), str(r)) for i, r in state_dict.get("fired", [])]
        self.adjusted = dict(state_dict.get("adjusted", {}))
        for name, saved in state_dict.get("rules", {}).items():
            if name in self.rules:  # keep this run's thresholds; restore the observed history
                self.rules[name].history = list(saved.get("history", []))
                if isinstance(self.rules[name], RatioRule):
                    self.rules[name].streak = int(saved.get("streak", 0))
        self.ema = {
            label: {k: torch.tensor(v) for k, v in s.items()}
            for label, s in state_dict.get("ema", {}).items()
        }
