"""CLI config adjustments that need no model: a run shorter than the validation interval validates
at its end."""

from jsonargparse import Namespace

from ragen_lightning.cli import _fit_validation_into_run


def config(interval, iterations):
    return Namespace(
        trainer=Namespace(val_check_interval=interval),
        data=Namespace(training=Namespace(num_iterations=iterations)),
    )


def test_short_run_validates_once_at_its_end():
    c = config(8, 1)
    _fit_validation_into_run(c)
    assert c.trainer.val_check_interval == 1


def test_interval_within_the_run_and_fractions_are_kept():
    for interval, iterations in ((8, 24), (8, 8), (0.5, 1), (1.0, 3)):
        c = config(interval, iterations)
        _fit_validation_into_run(c)
        assert c.trainer.val_check_interval == interval


def test_a_resumed_fit_gets_one_more_epoch_per_finished_one_and_nothing_left_is_refused():
    import pytest

    from ragen_lightning.cli import resume_epochs
    from ragen_lightning.errors import ConfigError

    # mid-run (epoch 1 under way): the default single epoch
    assert resume_epochs("a.ckpt", 0, 3, 8) == 1
    # a finished 6-iteration run extended to 8: one more epoch
    assert resume_epochs("a.ckpt", 1, 6, 8) == 2
    # a plain Lightning checkpoint: nothing known
    assert resume_epochs("a.ckpt", None, None, 8) is None
    with pytest.raises(
        ConfigError,
        match=r"^--ckpt_path a.ckpt has trained 6 iterations already, "
        r"--data.training.num_iterations 6 asks for no more: "
        r"raise --data.training.num_iterations",
    ):
        resume_epochs("a.ckpt", 1, 6, 6)
