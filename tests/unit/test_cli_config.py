"""CLI config adjustments that need no model: a run shorter than the validation interval validates at its end."""

from jsonargparse import Namespace

from ragen_lightning.cli import _fit_validation_into_run


def config(interval, iterations):
    return Namespace(trainer=Namespace(val_check_interval=interval), data=Namespace(num_iterations=iterations))


def test_short_run_validates_once_at_its_end():
    c = config(8, 1)
    _fit_validation_into_run(c)
    assert c.trainer.val_check_interval == 1


def test_interval_within_the_run_and_fractions_are_kept():
    for interval, iterations in ((8, 24), (8, 8), (0.5, 1), (1.0, 3)):
        c = config(interval, iterations)
        _fit_validation_into_run(c)
        assert c.trainer.val_check_interval == interval
