"""The command line end to end: fit writes metrics and a checkpoint, validate reloads it, the actor
exports."""

from __future__ import annotations

import csv
import json
import os
from pathlib import Path

import pytest
import torch

import envs  # noqa: F401
from ragen_lightning import models
from ragen_lightning.cli import main
from tests.integration.inprocess import isolated_process_state, run_main

pytestmark = pytest.mark.slow
CONFIGS = Path(__file__).resolve().parents[2] / "configs"
SMALL_RUN = [
    "--data.training.num_groups",
    "2",
    "--data.training.group_size",
    "4",
    "--data.episode.max_new_tokens",
    "12",
    "--data.validation.num_groups",
    "2",
    "--model.update.mini_batch_size",
    "8",
    "--model.update.micro_batch_size",
    "4",
    "--data.training.num_iterations",
    "1",
]


@pytest.fixture
def in_process(tmp_path):
    """main() runs in this process: in ``tmp_path``, with the process state it may change (the
    environment, warnings filters, loggers, torch flags, random states, ...) put back afterwards
    (tests/integration/inprocess.py)."""
    with isolated_process_state(tmp_path):
        yield


def test_fit_validate_and_export(tmp_path, in_process):
    common = [
        "--config",
        str(CONFIGS / "bandit.yaml"),
        "--model.warm_start",
        "false",
        "--trainer.logger",
        "lightning.pytorch.loggers.CSVLogger",
        "--trainer.logger.save_dir",
        "logs",
        "--data.training.num_groups",
        "2",
        "--data.training.group_size",
        "4",
        "--data.episode.max_new_tokens",
        "12",
        "--data.validation.num_groups",
        "4",
        "--model.update.mini_batch_size",
        "8",
        "--model.update.micro_batch_size",
        "4",
    ]
    best_export = [
        "--trainer.callbacks+",
        '{"class_path": "callbacks.BestActorExport", "init_args": {"dirpath": "best"}}',
    ]
    main(
        [
            "fit",
            *common,
            "--data.training.num_iterations",
            "2",
            "--trainer.val_check_interval",
            "2",
            "--model.export_dir",
            "exported",
            "--validate_first",
            "true",
            *best_export,
        ]
    )
    ckpt = tmp_path / "outputs" / "bandit" / "checkpoints" / "last.ckpt"
    assert ckpt.is_file()
    rows = list(csv.DictReader(open(next((tmp_path / "logs").rglob("metrics.csv")))))
    trained = [r for r in rows if r.get("train/batch_size")]
    assert len(trained) == 2 and all(float(r["train/batch_size"]) == 8.0 for r in trained)
    # --validate_first: the starting model at step 0, then the interval's validation after the
    # updates (the rollout engine built by the first validation still takes the fit's weight syncs)
    validated = [int(r["step"]) for r in rows if r.get("val/success")]
    assert validated[0] == 0 and len(validated) == 2 and validated[1] > 0

    # the exported folder loads without this package and holds the trained actor
    from transformers import AutoModelForCausalLM

    exported = AutoModelForCausalLM.from_pretrained(tmp_path / "exported")
    state = torch.load(ckpt, map_location="cpu", weights_only=False)["state_dict"]
    for name, p in exported.named_parameters():
        torch.testing.assert_close(p, state[f"actor.{name}"])

    # callbacks.BestActorExport: the folder holds the actor of the best validation (ties: the
    # earlier, here the starting model at iteration 0), with its record
    successes = [float(r["val/success"]) for r in rows if r.get("val/success")]
    record = json.loads((tmp_path / "best" / "best.json").read_text())
    best_at = 0 if successes[0] >= successes[1] else 1
    assert (
        record["value"] == pytest.approx(successes[best_at])
        and record["iteration"] == [0, 2][best_at]
    )
    best = AutoModelForCausalLM.from_pretrained(tmp_path / "best")
    start = (
        AutoModelForCausalLM.from_pretrained(models.resolve_model_path("tiny"))
        if best_at == 0
        else exported
    )
    for (name, p), q in zip(best.named_parameters(), start.parameters(), strict=True):
        torch.testing.assert_close(p, q, msg=name)
    stamp = (tmp_path / "best" / "best.json").stat().st_mtime_ns

    cli = main(["validate", *common, *best_export, "--ckpt_path", str(ckpt)])
    # validate alone never exports
    assert (tmp_path / "best" / "best.json").stat().st_mtime_ns == stamp
    results = cli.trainer.callback_metrics
    assert "val/success" in results and 0.0 <= float(results["val/success"]) <= 1.0
    assert float(results["val/num_turns"]) == 1.0  # bandit is single-turn


BAD_END_TO_END = [
    (
        ["--model.advantage.estimator", "grpo", "--data.training.group_size", "1"],
        "error: --data.training.group_size must be >= 2",
    ),
    (
        ["--data.episode.max_model_len", "64"],
        "error: --data.episode.max_model_len=64 is too small for the first prompt",
    ),
    (["--data.env.id", "ragen/Nope-v0"], "error: --data.env.id: unknown env id 'ragen/Nope-v0'"),
    (
        ["--model.update.micro_batch_size", "64"],
        "error: --model.update.micro_batch_size (64) must be <=",
    ),
    # checked before any process is launched
    (
        ["--trainer.devices", "3", "--data.training.num_groups", "4"],
        "error: --data.training.num_groups (4) must be divisible by the number of processes (3)",
    ),
    # each of these was a traceback, a crash after training started or a usage dump (issue 15)
    (
        ["--data.episode.max_turns", "0"],
        "error: --data.episode.max_turns must be an integer >= 1, got 0",
    ),
    (
        ["--data.engine.max_batch_size", "0"],
        "error: --data.engine.max_batch_size must be an integer >= 1, got 0",
    ),
    (["--model.model", "/nonexistent"], "error: --model.model '/nonexistent': no such folder"),
    (
        ["--data.training.num_groups", "many"],
        "error: --data.training.num_groups: expected int, got many",
    ),
    (["--model.bogus_flag", "1"], "error: unrecognized arguments: --model.bogus_flag 1"),
    (
        [
            "--config",
            str(CONFIGS / "fsdp.yaml"),
            "--trainer.devices",
            "2",
            "--model.lora",
            "{rank: 8, shared_base: true}",
        ],
        "error: --model.lora.shared_base is not supported with FSDP2",
    ),
    (
        ["--trainer.default_root_dir", "/proc/nope"],
        "error: --trainer.default_root_dir '/proc/nope': cannot write in /proc",
    ),
    # the settings groups: a flat flag of earlier versions names its new spelling; a group's own
    # value check
    (
        ["--model.adv_estimator", "grpo"],
        "error: --model.adv_estimator was renamed: use --model.advantage.estimator",
    ),
    (
        ["--model.use_kl_loss", "true"],
        "error: --model.use_kl_loss was renamed: use --model.loss.kl_coef (a KL loss is on when its coefficient is > 0)",
    ),
    (
        ["--model.loss", "{clip_low: 1.0}"],
        "error: --model.loss.clip_low must be a finite number in [0, 1), got 1.0",
    ),
    # accepted silently, or a traceback after the run's folders were written (issue "Runs you can
    # trust")
    (
        ["--optimizer", "torch.optim.SGD"],
        "error: --optimizer is not a flag of this command line: use --model.optim.actor_optimizer",
    ),
    (
        ["--model.optim.actor_optimizer", "{class_path: torch.optim.SGD, init_args: {lr: -1.0}}"],
        "error: --model.optim.actor_optimizer torch.optim.SGD: Invalid learning rate: -1.0",
    ),
    (
        ["--seed_everything", "-1"],
        "error: --seed_everything must be null or an integer in [0, 4294967295], got -1",
    ),
    (
        ["--data.episode.max_model_len", "10000000000"],
        "error: --data.episode.max_model_len must be an integer in [1, 1048576], got 10000000000",
    ),
    (
        ["--data.episode.max_model_len", "8192"],
        "error: --data.episode.max_model_len 8192 exceeds the 4096 positions",
    ),
]


BANDIT_FIT = ["fit", "--config", str(CONFIGS / "bandit.yaml"), "--model.warm_start", "false"]


@pytest.mark.parametrize("case", range(len(BAD_END_TO_END)), ids=[m for _, m in BAD_END_TO_END])
def test_bad_config_is_one_line_and_writes_nothing(case, tmp_path, capfd):
    """``main.py fit`` run in this process (tests/integration/inprocess.py: main() as main.py calls
    it, so the refusal is printed and exits as from the shell), in an empty folder. A fresh
    interpreter's stderr is checked once below."""
    flags, message = BAD_END_TO_END[case]
    capfd.readouterr()
    code = run_main([*BANDIT_FIT, *flags], cwd=tmp_path).code
    err = capfd.readouterr().err
    assert code == 2, err[-2000:]
    # exactly one line
    assert err.strip().splitlines() == [err.strip()], err[-2000:]
    assert err.startswith(message)
    assert list(tmp_path.iterdir()) == []  # no config, logs or checkpoints written


def test_a_bad_config_in_a_fresh_interpreter_is_one_line_on_stderr_with_exit_2(tmp_path):
    """The refusal as a real ``python main.py`` process prints it: its whole stderr is the one line
    (no import-time warning or log line of torch, Lightning, transformers or vLLM before it), exit
    status 2, nothing written. The case loads the tokenizer and renders the env's first prompt, the
    furthest a refusal gets before anything is built."""
    import subprocess
    import sys

    flags, message = BAD_END_TO_END[1]
    assert message.startswith("error: --data.episode.max_model_len=64 is too small")
    proc = subprocess.run(
        [sys.executable, str(CONFIGS.parent / "main.py"), *BANDIT_FIT, *flags],
        check=False,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.strip().splitlines() == [proc.stderr.strip()], proc.stderr[-2000:]
    assert proc.stderr.startswith(message) and proc.stderr.endswith("\n")
    assert list(tmp_path.iterdir()) == []


def test_unreachable_wandb_server_logs_offline_within_seconds(tmp_path):
    """An online WandbLogger with no server to reach: one warning line, the run goes on offline
    (wandb itself blocked for ~100 s and then failed the run)."""
    import socket
    import subprocess
    import sys

    # a loopback port that was free a moment ago: connections are refused
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "WANDB_BASE_URL": f"http://127.0.0.1:{port}", "WANDB_API_KEY": "x" * 40}
    env.pop("WANDB_MODE", None)
    online = tmp_path / "online.yaml"
    online.write_text(
        "trainer:\n  logger:\n    - class_path: lightning.pytorch.loggers.WandbLogger\n"
        "      init_args: {project: ragen_lightning, save_dir: outputs/bandit, offline: false}\n"
    )
    main_py = Path(__file__).resolve().parents[2] / "main.py"
    # no wall-clock bound here (a loaded machine fails it): the probe's deadline is unit-tested
    # (tests/unit/test_preflight.py); the subprocess timeout is the hang guard
    proc = subprocess.run(
        [
            sys.executable,
            str(main_py),
            "fit",
            "--config",
            str(CONFIGS / "bandit.yaml"),
            "--config",
            str(online),
            "--model.warm_start",
            "false",
            "--data.engine.name",
            "hf",
            *SMALL_RUN,
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    warning = f"warning: wandb server http://127.0.0.1:{port} unreachable (Connection refused): logging offline"
    assert proc.stderr.startswith(warning), proc.stderr[:2000]
    assert list((tmp_path / "outputs" / "bandit" / "wandb").glob("offline-run-*"))
    # stderr is a pipe, not a terminal: one plain line per iteration (ragen_lightning.cli.progress)
    lines = [line for line in proc.stderr.splitlines() if line.startswith("iteration ")]
    total = int(SMALL_RUN[SMALL_RUN.index("--data.training.num_iterations") + 1])
    assert [line.split(" | ")[0] for line in lines] == [
        f"iteration {i}/{total}" for i in range(1, total + 1)
    ]
