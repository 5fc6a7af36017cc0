"""Lint as part of the suite: ``ruff check`` with the rules of pyproject.toml, and the share of long
lines."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LINE_LENGTH = 100  # [tool.ruff] line-length
# Lines over LINE_LENGTH among the non-blank lines of tracked Python files: 16.5 % when the limit came in
# (the code was hand-wrapped to 120), 1.5 % after ``ruff format`` and rewrapping comments and docstrings
# to 100. What is left is long string literals and URLs. A ratchet under the 5 % goal: it may only go down.
MAX_LONG_SHARE = 0.02


def _tracked_python() -> list[Path]:
    out = subprocess.run(
        ["git", "ls-files", "*.py"], cwd=ROOT, capture_output=True, text=True, check=False
    )
    if out.returncode != 0:
        pytest.skip("not a git checkout: the tracked files are unknown")
    return [ROOT / name for name in out.stdout.split()]


def long_share(paths: list[Path], limit: int = LINE_LENGTH) -> tuple[int, int]:
    """``(lines over limit, non-blank lines)`` of ``paths``."""
    long = total = 0
    for path in paths:
        for line in path.read_text().splitlines():
            if line.strip():
                total += 1
                long += len(line) > limit
    return long, total


def test_long_share_counts_non_blank_lines_over_the_limit(tmp_path):
    f = tmp_path / "a.py"
    f.write_text("x = 1\n\n" + "y = '" + "a" * 100 + "'\n" + " " * 200 + "\n")
    assert long_share([f]) == (1, 2)  # the blank (all-space) line counts as neither


def test_ruff_check_passes():
    proc = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--no-cache", "--output-format", "concise", "."],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-1000:]


def test_ruff_format_check_passes():
    """The code is as ``ruff format`` writes it (line length 100, pyproject.toml): no style debates in
    review, and a diff shows only what changed."""
    proc = subprocess.run(
        [sys.executable, "-m", "ruff", "format", "--check", "--no-cache", "."],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-1000:]


def test_long_lines_do_not_grow():
    long, total = long_share(_tracked_python())
    assert long / total <= MAX_LONG_SHARE, f"{long} of {total} lines over {LINE_LENGTH} characters"
