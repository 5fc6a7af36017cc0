"""A user's own advantage estimator (with its own option) and filter strategy: one file each,
outside the library, selected from a YAML config by ``module:name`` and trained through ``main.py
fit``'s CLI; no launcher script."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

import envs  # noqa: F401  (the ids configs/bandit.yaml names, as main.py imports them)
from tests.integration.inprocess import run_main
from tests.unit.test_registry import make_user_package

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
SMALL_RUN = [
    "--model.warm_start",
    "false",
    "--data.training.num_groups",
    "2",
    "--data.training.group_size",
    "4",
    "--data.episode.max_new_tokens",
    "12",
    "--data.validation.num_groups",
    "2",
    "--model.update.mini_batch_size",
    "4",
    "--model.update.micro_batch_size",
    "4",
    "--data.training.num_iterations",
    "1",
    "--trainer.logger",
    "lightning.pytorch.loggers.CSVLogger",
    "--trainer.logger.save_dir",
    "logs",
    # what is checked is the estimator's and the filter's effect on the batch, not how the episodes
    # were generated: the HF engine (no vLLM start-up and shut-down, ~4 s)
    "--data.engine.name",
    "hf",
]
USER_CONFIG = """\
model:
  advantage:
    estimator: userpkg.every_token:every_token
    options: {weight: 0.25}
data:
  filter:
    strategy: userpkg.keep_last:keep_last
    options: {count: 1}
"""


@pytest.fixture
def user_package(tmp_path, monkeypatch):
    yield from make_user_package(tmp_path, monkeypatch)


def test_a_user_estimator_and_filter_from_yaml_train_one_iteration(tmp_path, user_package, capfd):
    (tmp_path / "user.yaml").write_text(USER_CONFIG)
    outcome = run_main(
        [
            "fit",
            "--config",
            str(ROOT / "configs" / "bandit.yaml"),
            "--config",
            "user.yaml",
            *SMALL_RUN,
        ],
        cwd=tmp_path,
    )
    assert outcome.code == 0, capfd.readouterr().err[-2000:]
    cli = outcome.cli
    assert cli.model.advantage.estimator_options.weight == 0.25 and cli.model.critic is None
    rows = list(csv.DictReader(open(next((tmp_path / "logs").rglob("metrics.csv")))))
    m = next(r for r in rows if r.get("train/batch_size"))
    # keep_last (count 1) keeps the last of the 2 groups: its 4 episodes train
    assert (
        float(m["rollout/filter_kept_count"]) == 1.0
        and float(m["rollout/filter_kept_ratio"]) == 0.5
    )
    assert float(m["train/batch_size"]) == 4.0
    # every_token: advantage = return = weight 0.25 (the YAML's option) on every trained token
    assert float(m["train/advantage_mean"]) == 0.25 and float(m["train/return_mean"]) == 0.25
    assert float(m["train/every_token_weight"]) == 0.25


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (
            ["--model.advantage.rft_threshold", "1.5"],
            "error: --model.advantage.rft_threshold was renamed: use "
            "--model.advantage.options.threshold (an option of --model.advantage.estimator rft)",
        ),
        (
            ["--data.filter.top_p_mode", "softmax"],
            "error: --data.filter.top_p_mode was renamed: use --data.filter.options.mode "
            "(an option of --data.filter.strategy top_p)",
        ),
        (
            ["--config", "user.yaml", "--model.advantage.options.weight", "7"],
            "error: --model.advantage.options.weight must be a finite number in [-1, 1], got 7.0",
        ),
        (
            ["--config", "user.yaml", "--data.filter.options.counts", "2"],
            "error: --data.filter.options.counts is not an option of "
            "--data.filter.strategy keep_last; its options: count",
        ),
    ],
)
def test_old_and_bad_options_are_one_line_with_exit_2(
    tmp_path, user_package, capfd, flags, message
):
    """``main.py fit`` in this process (tests/integration/inprocess.py: main() as main.py calls it,
    so the refusal is printed and exits as from the shell), the user's package importable as it was
    from ``PYTHONPATH``."""
    (tmp_path / "user.yaml").write_text(USER_CONFIG)
    capfd.readouterr()
    code = run_main(
        [
            "fit",
            "--config",
            str(ROOT / "configs" / "bandit.yaml"),
            "--model.warm_start",
            "false",
            *flags,
        ],
        cwd=tmp_path,
    ).code
    err = capfd.readouterr().err
    assert code == 2, err[-2000:]
    assert err.strip() == message
