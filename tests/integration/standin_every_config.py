"""One RL iteration of every task config on the Qwen2.5 stand-in (``--model.model tiny:qwen``), one
line per config.

    python tests/integration/standin_every_config.py [TASK ...] [-- FLAG ...]  # all task configs when none is named
    python tests/integration/standin_every_config.py searchqa webshop --
    --data.episode.action_format tool_call

The flags are the suite's task-config smoke test's (``test_configs.py::test_task_config_fit_smoke``:
2 groups of 2, 2 turns of at most 12 tokens, no warm start, one iteration and its validation), with
the stand-in as the model, so every config runs through Qwen2.5's tokenizer, chat template and
151,936-row vocabulary with the config's own engine (``auto``: vLLM where installed). 20-35 s per
config on 2 cores, ~8 min in all: too slow for the suite, which runs three of them
(``test_qwen_standin_fits.py``). Prints a table and exits 1 if any config failed.
"""

from __future__ import annotations

import math
import os
import sys
import tempfile
import time
import traceback
from pathlib import Path
from unittest import mock

ROOT = Path(__file__).resolve().parents[2]
COLUMNS = (
    "rollout/generated_tokens",
    "train/format_error_rate",
    "train/score",
    "rollout/token_drift_rate",
    "actor/grad_norm",
    "val/success",
)


def standin_args(task: str, *more: str) -> list[str]:
    """``main.py fit`` arguments of one stand-in iteration of ``configs/<task>.yaml`` (``more``:
    further flags)."""
    from tests.integration.test_configs import backend_args, update_args

    return [
        "fit",
        "--config",
        str(ROOT / "configs" / f"{task}.yaml"),
        *backend_args(task),
        *update_args(task),
        "--model.model",
        "tiny:qwen",
        "--validate_first",
        "false",
        "--trainer.logger",
        "false",
        "--trainer.callbacks",
        "[]",
        "--trainer.enable_checkpointing",
        "false",
        "--model.warm_start",
        "false",
        "--trainer.max_steps",
        "2",
        "--data.training.num_iterations",
        "1",
        "--data.training.num_groups",
        "2",
        "--data.training.group_size",
        "2",
        "--data.episode.max_new_tokens",
        "12",
        "--data.episode.max_turns",
        "2",
        "--data.validation.num_groups",
        "2",
        "--trainer.val_check_interval",
        "1",
        "--model.update.mini_batch_size",
        "4",
        "--model.update.micro_batch_size",
        "2",
        "--trainer.enable_model_summary",
        "false",
        "--trainer.enable_progress_bar",
        "false",
        *more,
    ]


def run(task: str, *more: str) -> dict[str, float]:
    """The logged metrics of one stand-in iteration of ``task`` (run in a fresh temporary
    folder)."""
    from main import main
    from ragen_lightning.rollout.runner import RolloutRunner

    # tools each runner offered (the tool_call format), read when the data module closes it
    offered: list[int] = []
    close = RolloutRunner.close

    def recording_close(runner: RolloutRunner) -> None:
        offered.append(len(runner.tools))
        close(runner)

    cwd = os.getcwd()
    with (
        tempfile.TemporaryDirectory() as tmp,
        mock.patch.object(RolloutRunner, "close", recording_close),
    ):
        os.chdir(tmp)
        try:
            cli = main(standin_args(task, *more))
        finally:
            os.chdir(cwd)
    metrics = {k: float(v) for k, v in cli.trainer.callback_metrics.items()}
    metrics["global_step"] = float(cli.trainer.global_step)
    metrics["vocab"] = float(cli.model.actor.config.vocab_size)
    metrics["tools"] = float(max(offered, default=0))
    return metrics


def main_script(tasks: list[str], more: list[str]) -> int:
    failed = []
    print(
        f"{'config':<22} {'s':>5} {'steps':>5} "
        + " ".join(f"{c.split('/')[-1][:16]:>16}" for c in COLUMNS)
    )
    for task in tasks:
        t0 = time.perf_counter()
        try:
            m = run(task, *more)
            ok = (
                m["global_step"] >= 1
                and m["vocab"] == 151936
                and math.isfinite(m.get("actor/pg_loss", math.nan))
            )
        except Exception:  # noqa: BLE001  (a failing config is reported and the others still run)
            traceback.print_exc()
            m, ok = {}, False
        if not ok:
            failed.append(task)
        cells = " ".join(f"{m[c]:>16.4g}" if c in m else f"{'-':>16}" for c in COLUMNS)
        print(
            f"{task:<22} {time.perf_counter() - t0:>5.0f} {int(m.get('global_step', 0)):>5} {cells}"
            f"{'' if ok else '  FAILED'}",
            flush=True,
        )
    print(
        f"{len(tasks) - len(failed)}/{len(tasks)} task configs trained one iteration on tiny:qwen"
        + (f"; failed: {', '.join(failed)}" if failed else "")
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from tests.integration.test_configs import TASKS

    args = sys.argv[1:]
    split = args.index("--") if "--" in args else len(args)
    sys.exit(main_script(args[:split] or [p.stem for p in TASKS], args[split + 1 :]))
