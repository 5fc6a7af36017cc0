"""Run a snippet in a fresh interpreter under a hard wall-clock limit, so a regression to a hang
fails the test.

A signal-based timeout cannot interrupt a single C call (``Fraction("1e999999999")`` spends minutes
inside one big integer power), so the snippet runs in a subprocess that is killed at the limit. The
snippet times the judged part itself and prints one JSON line last; interpreter start and imports
are not part of that figure.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]


def run_bounded(code: str, limit_s: float = 60.0):
    """The value of the JSON line ``code`` prints last; ``pytest.fail`` when it runs past
    ``limit_s`` or fails."""
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    try:
        done = subprocess.run(
            [sys.executable, "-"],
            input=textwrap.dedent(code),
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=limit_s,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"still running after {limit_s} s (killed)")
    if done.returncode != 0:
        pytest.fail(f"snippet failed (rc {done.returncode}):\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])
