"""Same seed, same run; kill -9 and resume, same run (slow: real fits of a shortened
configs/bandit.yaml).

Both use the config's own settings: two micro-batch threads (four micro-batches a step, so the order
their gradients are added in matters), the critic's steps in the background, a validation after
every iteration (it starts while the critic is stepping). docs/reproducibility.md says what this
covers and what it does not.
"""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from ragen_lightning.rollout.vllm_engine import vllm_installed
from tests.integration.determinism_script import SHORT, fingerprint, is_clock

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
SCRIPT = Path(__file__).with_name("determinism_script.py")
# a reference fit and two repeats, each compared with it (6 comparisons over the 3 variants)
REPEATS = 3


def _script(out: Path, *variants: str) -> dict[str, list[dict]]:
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=str(ROOT))
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), str(out), str(REPEATS), *variants],
        capture_output=True,
        text=True,
        timeout=900,
        env=env,
        check=False,
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT_JSON ")]
    assert proc.returncode == 0 and lines, proc.stderr[-4000:]
    return json.loads(lines[-1][len("RESULT_JSON ") :])


def test_seeded_fits_repeat_bit_for_bit(tmp_path):
    """The config's settings (vLLM when installed, as `engine: auto` picks), the HF engine, and the
    warm start rebuilt from an empty cache: every fit's checkpoint and logged values equal the
    reference fit's."""
    variants = ["hf", "warm_start", *(["config"] if vllm_installed() else [])]
    result = _script(tmp_path, *variants)
    assert sorted(result) == sorted(variants)
    for variant, fits in result.items():
        assert (
            len(fits) == REPEATS and fits[0]["global_step"] == 6 and fits[0]["metric_rows"] > 3
        ), variant
        for i, fit in enumerate(fits[1:], 1):
            differ = sorted(k for k in fit if fit[k] != fits[0][k])
            assert not differ, f"{variant}: fit {i} differs from fit 0 in {differ}"
    # the fingerprint sees the weights: the warm-started fits end elsewhere than the fits from the
    # base model
    assert result["warm_start"][0]["state_dict"] != result["hf"][0]["state_dict"]


def _rows(path: Path) -> dict[int, dict[str, str]]:
    """The logged rows of a metrics.csv by step, clock readings left out (train rows; validation
    rows merged)."""
    rows: dict[int, dict[str, str]] = {}
    with path.open() as f:
        for row in csv.DictReader(f):
            values = {k: v for k, v in row.items() if v != "" and not is_clock(k)}
            rows.setdefault(int(values["step"]), {}).update(values)
    return rows


@pytest.mark.parametrize("rollouts", ["synchronous", "async"])
def test_kill_9_mid_run_and_resume_gives_the_uninterrupted_run(tmp_path, rollouts):
    """SIGKILL a little after the run's first checkpoint (somewhere in the rollout, update or
    validation of a later iteration), resume from last.ckpt: weights, optimizer states, data-module
    (seed stream) state, counters and every value logged after the resume equal the uninterrupted
    run's bit for bit, including the critic's metrics of the checkpoint's iteration (logged with the
    next one: the checkpoint carries them). With one-step-off-policy rollouts the checkpoint carries
    the rollout that was in flight (sampled with weights no checkpoint holds)."""
    flags = [
        "fit",
        *SHORT,
        "--data.engine.name",
        "hf",
        "--data.training.num_iterations",
        "8",
        # the untrained model fails the format (success 0): no early stop for low validation
        # success
        "--model.early_stop.low_val_success_patience",
        "0",
        "--model.early_stop.rv_collapse_window",
        "0",
        *(
            ["--data.training.async_level", "1", "--model.loss.tis_cap", "2.0"]
            if rollouts == "async"
            else []
        ),
    ]
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=str(ROOT))

    def fit(root: Path, *more: str, background: bool = False):
        root.mkdir(exist_ok=True)
        cmd = [sys.executable, str(ROOT / "main.py"), *flags, *more]
        if background:
            return subprocess.Popen(
                cmd, cwd=root, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
            )
        proc = subprocess.run(
            cmd, cwd=root, env=env, capture_output=True, text=True, timeout=600, check=False
        )
        assert proc.returncode == 0, proc.stderr[-4000:]
        return None

    full, part = tmp_path / "full", tmp_path / "part"
    fit(full)
    last = part / "outputs" / "bandit" / "checkpoints" / "last.ckpt"
    proc = fit(part, background=True)
    deadline = time.monotonic() + 300
    # saved atomically
    while time.monotonic() < deadline and proc.poll() is None and not last.exists():
        time.sleep(0.02)
    time.sleep(0.4)
    assert proc.poll() is None, "the run ended before it was killed"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    saved = torch.load(last, map_location="cpu", weights_only=False)
    killed_at = saved["global_step"]
    # 2 optimizer steps (critic, actor) an iteration: killed before the end of 8
    assert 2 <= killed_at < 16
    if rollouts == "async":  # the next iteration's rollout, finished before the save
        assert saved["RolloutDataModule"]["ahead"]["iteration"] == killed_at // 2

    fit(part, "--ckpt_path", str(last))
    a, b = fingerprint(full), fingerprint(part)
    for key in (
        "state_dict",
        "optimizer_states",
        "lr_schedulers",
        "RolloutDataModule",
        "starpo",
        "global_step",
    ):
        assert a[key] == b[key], key
    full_rows = _rows(next((full / "logs" / "csv").glob("version_*/metrics.csv")))
    # the resumed run's version
    resumed = _rows(max((part / "logs" / "csv").glob("version_*/metrics.csv")))
    done = killed_at // 2  # iterations in the checkpoint; the logged step is the iteration
    assert sorted(resumed) == [s for s in sorted(full_rows) if s >= done]
    assert "critic/vf_loss" in resumed[done]  # the critic's metrics of the checkpoint's iteration
    for step, row in resumed.items():
        assert row == full_rows[step], step
