"""Episodes as JSON lines: the chat in OpenAI's messages format plus rewards and per-turn records.

One writer for every export of whole episodes (``python -m ragen_lightning.evaluate`` and the
validation export of ``callbacks.TrajectoryLogger``), so a file from either reads the same way::

    {"messages": [{"role": "system", "content": ...}, {"role": "user", ...}, {"role": "assistant", ...}, ...],
     "turns": [{"reward": 0.0, "penalty": 0.0, "format_ok": true, "actions": ["Up"], "info": {...}}, ...],
     "success": false, "env_return": 0.0, "penalty": 0.0, "score": 0.0, "num_turns": 2, ..., <caller's fields>}

``messages`` is what the model saw and answered, turn by turn: the system message, then each turn's
user message and the assistant's answer (the generation prefix, e.g. ``<think>``, included: the
model was primed with it). In the ``full`` context mode that is the episode's conversation; in the
windowed modes each turn's user message is the one of that turn's prompt (with ``single_turn``, the
summary of earlier turns it carried).

Writes are append-only and whole-line: all lines of one call go out in one ``write`` on a file
opened for appending, then are flushed to disk. A crash in the middle of a write can only leave a
torn last line without its newline;
:func:`read_jsonl` skips it and :func:`append_jsonl` cuts it off before appending, so the file never holds a broken
line in its middle.
"""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ragen_lightning.types import Trajectory


def episode_messages(traj: Trajectory) -> list[dict[str, str]]:
    """The episode's chat in OpenAI's messages format (module docstring)."""
    convs = [s.conversation for s in traj.samples]
    if len(convs) <= 1:
        return [dict(m) for m in convs[0].messages] if convs else []
    out = [dict(convs[0].messages[0])]  # the system message
    # windowed modes: one sample per turn, ending with that turn's user message and answer
    for conv in convs:
        out.extend(dict(m) for m in conv.messages[-2:])
    return out


def episode_record(traj: Trajectory, **fields: Any) -> dict[str, Any]:
    """The JSON-able record of one episode; ``fields`` (tag, pass, iteration, ...) come first."""
    return {
        **fields,
        "seed": traj.seed,
        "group_id": traj.group_id,
        "env_index": traj.env_index,
        "success": bool(traj.success),
        "env_return": traj.env_return,
        "penalty": traj.penalty,
        "score": traj.score,
        "num_turns": traj.num_turns,
        "num_actions": traj.num_actions,
        "num_format_errors": traj.num_format_errors,
        "response_tokens": traj.response_tokens,
        "terminated": traj.terminated,
        "truncated": traj.truncated,
        "context_truncated": traj.context_truncated,
        "trainable": traj.trainable,
        "turn_rewards": list(traj.turn_rewards),
        "info": dict(traj.info),
        "turns": [dict(t) for t in traj.turn_info],
        "messages": episode_messages(traj),
    }


def _cut_torn_tail(path: Path) -> None:
    """Drop a last line that has no newline (a write cut short by a crash); warn with the file's
    name."""
    with open(path, "rb+") as f:
        f.seek(0, os.SEEK_END)
        size = f.tell()
        if size == 0:
            return
        f.seek(size - 1)
        if f.read(1) == b"\n":
            return
        # find the last newline before the torn line
        keep, block = 0, 1 << 16
        pos = size
        while pos > 0:
            start = max(0, pos - block)
            f.seek(start)
            chunk = f.read(pos - start)
            i = chunk.rfind(b"\n")
            if i >= 0:
                keep = start + i + 1
                break
            pos = start
        f.truncate(keep)
    warnings.warn(
        f"{path}: dropped a torn last line ({size - keep} bytes without a newline, an interrupted write)",
        stacklevel=3,
    )


def append_jsonl(path: str | Path, records: Iterable[dict[str, Any]]) -> int:
    """Append ``records`` as whole JSON lines (one ``write``, then fsync); returns how many were
    written."""
    lines = [json.dumps(r, allow_nan=False) + "\n" for r in records]
    if not lines:
        return 0
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists():
        _cut_torn_tail(path)
    data = "".join(lines).encode("utf-8")
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        view = memoryview(data)
        # a regular file takes the whole buffer in one write; loop only for a short write
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)
    return len(lines)


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    """Every whole record of ``path`` ([] when it does not exist); a torn last line is skipped, a
    broken line elsewhere is an error naming the file and line."""
    path = Path(path)
    if not path.exists():
        return []
    raw = path.read_bytes()
    lines = raw.split(b"\n")
    torn = lines.pop()  # b"" when the file ends with a newline
    out = []
    for n, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except ValueError as e:
            raise ValueError(
                f"{path}: line {n} is not a JSON record ({e}); the file was not written by this "
                "tool or was edited"
            ) from None
        if not isinstance(value, dict):
            raise ValueError(f"{path}: line {n} is not a JSON object")  # noqa: TRY004 (a bad file, as above)
        out.append(value)
    if torn.strip():
        warnings.warn(
            f"{path}: skipping a torn last line ({len(torn)} bytes without a newline)", stacklevel=2
        )
    return out
