"""Resumes that used to end silently or in a traceback (slow: fits on the tiny model, a few seconds
each): a finished run extended with a larger --data.training.num_iterations trains the added
iterations; one resumed with no iterations left is refused in one line; a critic (gae) run resumed
mid-way with a critic-free estimator drops the critic with a warning; a mid-run resume does not warn
that the dataloader is not resumable."""

from __future__ import annotations

import warnings

import pytest

import envs  # noqa: F401
from ragen_lightning.cli import main
from ragen_lightning.errors import ConfigError
from tests.integration.inprocess import in_process  # noqa: F401  (autouse: main() in this process)
from tests.integration.test_checkpoint_safety import (
    COMMON,  # a short Bandit fit on the HF engine
)

pytestmark = pytest.mark.slow


def test_a_finished_run_extends_and_a_run_with_nothing_left_is_refused(tmp_path):
    first = main(["fit", *COMMON, "--data.training.num_iterations", "2"])
    # two optimizer steps per iteration (8 samples, mini-batches of 8, 2 nets)
    steps = first.trainer.global_step
    ckpt = tmp_path / "outputs" / "bandit" / "checkpoints" / "last.ckpt"
    # Before: Lightning found the epoch (the whole run) processed and exited 0 having trained
    # nothing.
    more = main(["fit", *COMMON, "--data.training.num_iterations", "3", "--ckpt_path", str(ckpt)])
    assert more.datamodule.iteration == 3 and more.trainer.global_step == steps + steps // 2
    with pytest.raises(ConfigError) as err:
        main(["fit", *COMMON, "--data.training.num_iterations", "3", "--ckpt_path", str(ckpt)])
    assert str(err.value) == (
        f"--ckpt_path {ckpt} has trained 3 iterations already, --data.training.num_iterations 3 asks "
        "for no more: raise --data.training.num_iterations to extend the run"
    )


def test_a_critic_run_resumed_without_a_critic_drops_it_and_no_resumability_warning(tmp_path):
    # stops after iteration 1
    main(["fit", *COMMON, "--data.training.num_iterations", "2", "--trainer.max_steps", "2"])
    ckpt = tmp_path / "outputs" / "bandit" / "checkpoints" / "last.ckpt"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        # Before: "Unexpected key(s) in state_dict: critic...." traceback after the run's folders
        # were written.
        cli = main(
            [
                "fit",
                *COMMON,
                "--data.training.num_iterations",
                "2",
                "--ckpt_path",
                str(ckpt),
                "--model.advantage.estimator",
                "grpo",
                "--allow_changed_settings",
                "true",
            ]
        )
    messages = [str(w.message) for w in caught]
    assert cli.model.critic is None and cli.datamodule.iteration == 2
    assert (
        "the checkpoint's critic is not used with --model.advantage.estimator grpo: its weights and optimizer "
        "state are dropped"
    ) in messages
    assert not [m for m in messages if "not resumable" in m]
