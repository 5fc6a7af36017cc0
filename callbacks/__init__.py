"""Optional observers and controllers of a StarPO run, reached from YAML by ``class_path``
(``callbacks.X``).

Each is independent of the others and of their order, reads the iteration's data the module keeps
(``StarPOModule.last_rollout`` / ``last_logs``) in ``on_train_batch_end``, and saves its state in
checkpoints (``state_dict`` / ``load_state_dict``), so a resumed run continues where it stopped.

- :class:`CollapseMonitor`: MI diagnostics on a schedule and early-warning rules with actions (log,
  checkpoint, stop, adjust the filter value or the entropy coefficient).
- :class:`TrajectoryLogger`: sampled trajectories as JSONL, a self-contained HTML page and a wandb
  Table.
- :class:`GradientAnalysis`: gradient norms of the policy / entropy / KL terms bucketed by group
  reward std.
- :class:`RolloutThroughput`: tokens/s and the rollout / update / env time split.
- :class:`PeakMemory`: each iteration's peak memory (CUDA allocator and device; process RSS on CPU).
- :class:`RolloutStatistics`: TorchMetrics (pass@k, reasoning length, valid-thinking rate) of the
  kept rollouts.
- :class:`BestActorExport`: the actor of the best validation so far, kept as a model folder (model
  selection).
- :class:`ValidationGain`: each validation's success gain over the first validation, paired over the
  same levels, with its 95 % interval.
"""

from callbacks.best_actor import BestActorExport
from callbacks.collapse import CollapseMonitor
from callbacks.gradients import GradientAnalysis
from callbacks.memory import PeakMemory
from callbacks.stats import RolloutStatistics
from callbacks.throughput import RolloutThroughput
from callbacks.trajectories import TrajectoryLogger
from callbacks.validation_gain import ValidationGain

__all__ = [
    "BestActorExport",
    "CollapseMonitor",
    "GradientAnalysis",
    "PeakMemory",
    "RolloutStatistics",
    "RolloutThroughput",
    "TrajectoryLogger",
    "ValidationGain",
]
