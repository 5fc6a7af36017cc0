"""The plain progress lines of a run whose stderr is not a terminal
(ragen_lightning.cli.progress)."""

from __future__ import annotations

import io
from types import SimpleNamespace

from ragen_lightning.cli.progress import IterationLines, plain_lines_wanted


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _trainer(metrics: dict[str, float], fn: str = "fit", total: int = 80):
    return SimpleNamespace(
        callback_metrics=metrics,
        sanity_checking=False,
        state=SimpleNamespace(fn=fn),
        num_training_batches=total,
        max_epochs=1,
        max_steps=-1,
        global_step=0,
        is_global_zero=True,
    )


def test_one_line_per_iteration_with_rate_eta_reward_success():
    out, clock = io.StringIO(), _Clock()
    bar = IterationLines(stream=out, clock=clock)
    trainer = _trainer({"train/score": 0.5123, "train/success": 0.25, "train/other": 9.0})
    bar.setup(trainer, None, "fit")
    bar.on_train_epoch_start(trainer, None)
    bar.on_train_batch_start(trainer, None, None, 0)
    clock.now += 12.0
    bar.on_train_batch_end(trainer, None, None, None, 0)
    bar.on_train_batch_start(trainer, None, None, 1)
    clock.now += 18.0  # 30 s for 2 iterations: 15 s each, 78 left -> 1170 s = 19:30
    bar.on_train_batch_end(trainer, None, None, None, 1)
    assert out.getvalue().splitlines() == [
        # 12 s x 79 = 948 s
        "iteration 1/80 | 12.0 s/it | ETA 15:48 | reward 0.5123 | success 0.25",
        "iteration 2/80 | 15.0 s/it | ETA 19:30 | reward 0.5123 | success 0.25",
    ]


def test_a_resumed_run_times_only_the_iterations_it_trains():
    out, clock = io.StringIO(), _Clock()
    bar = IterationLines(stream=out, clock=clock)
    trainer = _trainer({}, total=10)
    bar.setup(trainer, None, "fit")
    bar.on_train_epoch_start(trainer, None)
    # iterations 0-5 were trained before the resume
    bar.on_train_batch_start(trainer, None, None, 6)
    clock.now += 5.0
    bar.on_train_batch_end(trainer, None, None, None, 6)
    assert out.getvalue() == "iteration 7/10 | 5.0 s/it | ETA 0:15\n"  # 3 left x 5 s


def test_validation_lines_name_the_iteration_in_a_fit_and_skip_sanity_checks():
    out = io.StringIO()
    bar = IterationLines(stream=out, clock=_Clock())
    trainer = _trainer({"val/success": 0.4141, "val/score": 0.8})
    bar.setup(trainer, None, "fit")
    bar.on_train_epoch_start(trainer, None)
    for i in range(20):
        bar.on_train_batch_start(trainer, None, None, i)
        bar.on_train_batch_end(trainer, None, None, None, i)
    out.seek(0), out.truncate()
    bar.on_validation_end(trainer, None)
    trainer.sanity_checking = True
    bar.on_validation_end(trainer, None)
    standalone = _trainer({"val/success": 0.3}, fn="validate")
    bar.setup(standalone, None, "validate")
    bar.on_validation_end(standalone, None)
    assert out.getvalue().splitlines() == [
        "validation at iteration 20: success 0.4141 | reward 0.8",
        "validation: success 0.3",
    ]


def test_disabled_and_non_zero_ranks_write_nothing():
    out = io.StringIO()
    bar = IterationLines(stream=out, clock=_Clock())
    trainer = _trainer({"train/success": 1.0})
    trainer.is_global_zero = False
    bar.setup(trainer, None, "fit")  # Lightning's ProgressBar.setup disables the bar on other ranks
    bar.on_train_epoch_start(trainer, None)
    bar.on_train_batch_start(trainer, None, None, 0)
    bar.on_train_batch_end(trainer, None, None, None, 0)
    assert out.getvalue() == ""


def test_plain_lines_only_when_stderr_is_not_a_terminal():
    class _Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    assert plain_lines_wanted(io.StringIO()) is True
    assert plain_lines_wanted(_Tty()) is False


def test_a_validation_line_carries_the_paired_gain_where_it_was_logged():
    out = io.StringIO()
    bar = IterationLines(stream=out, clock=_Clock())
    gain = {"val/success_gain": 0.1094, "val/success_gain_lo": 0.031, "val/success_gain_hi": 0.1875}
    trainer = _trainer({"val/success": 0.7734, **gain}, fn="validate")
    bar.setup(trainer, None, "validate")
    bar.on_validation_end(trainer, None)
    partial = _trainer({"val/success": 0.5, "val/success_gain": 0.1}, fn="validate")
    bar.on_validation_end(partial, None)  # without its interval: no gain printed
    assert out.getvalue().splitlines() == [
        "validation: success 0.7734 | gain +0.109 [+0.031, +0.188]",
        "validation: success 0.5",
    ]
