"""rollout/records.py: the chat of an episode in every context mode, whole-line appends, torn
tails."""

from __future__ import annotations

import json

import pytest

from ragen_lightning.rollout.records import (
    append_jsonl,
    episode_messages,
    episode_record,
    read_jsonl,
)
from ragen_lightning.types import Conversation, Sample, Trajectory


def msgs(*pairs):
    return [{"role": r, "content": c} for r, c in pairs]


def test_full_mode_is_the_conversation_and_windowed_modes_are_stitched_per_turn():
    full = Conversation(
        messages=msgs(
            ("system", "S"),
            ("user", "u1"),
            ("assistant", "a1"),
            ("user", "u2"),
            ("assistant", "a2"),
        )
    )
    t = Trajectory(
        0, 0, 7, samples=[Sample(full, [0.0, 1.0])], turn_rewards=[0.0, 1.0], num_turns=2
    )
    assert episode_messages(t) == full.messages
    # limited window of 2: turn 2's sample replays turn 1 (u1, a1) before its own (u2, a2)
    turn1 = Conversation(messages=msgs(("system", "S"), ("user", "u1"), ("assistant", "a1")))
    turn2 = Conversation(
        messages=msgs(
            ("system", "S"),
            ("user", "u1"),
            ("assistant", "a1"),
            ("user", "u2"),
            ("assistant", "a2"),
        )
    )
    turn3 = Conversation(
        messages=msgs(
            ("system", "S"),
            ("user", "u2"),
            ("assistant", "a2"),
            ("user", "u3"),
            ("assistant", "a3"),
        )
    )
    windowed = Trajectory(
        0, 0, 7, samples=[Sample(c, [0.0]) for c in (turn1, turn2, turn3)], num_turns=3
    )
    assert episode_messages(windowed) == msgs(
        ("system", "S"),
        ("user", "u1"),
        ("assistant", "a1"),
        ("user", "u2"),
        ("assistant", "a2"),
        ("user", "u3"),
        ("assistant", "a3"),
    )
    assert episode_messages(Trajectory(0, 0, 7)) == []  # no turn generated (context too small)
    record = episode_record(t, tag="x", iteration=3)
    assert (
        list(record)[:2] == ["tag", "iteration"] and record["score"] == 1.0 and record["seed"] == 7
    )


def test_appends_whole_lines_and_a_torn_tail_is_cut_before_the_next_append(tmp_path):
    path = tmp_path / "sub" / "e.jsonl"
    assert append_jsonl(path, [{"a": 1}, {"a": 2}]) == 2 and append_jsonl(path, []) == 0
    with open(path, "a") as f:
        f.write('{"a": 3, "b"')  # a write cut short by a crash
    with pytest.warns(UserWarning, match="skipping a torn last line"):
        assert read_jsonl(path) == [{"a": 1}, {"a": 2}]
    with pytest.warns(UserWarning, match="dropped a torn last line"):
        append_jsonl(path, [{"a": 4}])
    assert path.read_text() == '{"a": 1}\n{"a": 2}\n{"a": 4}\n'
    # NaN is not JSON: refused before writing
    with pytest.raises(ValueError, match="Out of range float values"):
        append_jsonl(path, [{"a": float("nan")}])
    assert (
        read_jsonl(path) == [{"a": 1}, {"a": 2}, {"a": 4}]
        and read_jsonl(tmp_path / "none.jsonl") == []
    )


def test_a_broken_line_in_the_middle_is_an_error_naming_file_and_line(tmp_path):
    path = tmp_path / "e.jsonl"
    path.write_text(json.dumps({"a": 1}) + "\nnot json\n" + json.dumps({"a": 2}) + "\n")
    with pytest.raises(ValueError, match=f"{path}: line 2 is not a JSON record"):
        read_jsonl(path)
    path.write_text("[1, 2]\n")
    with pytest.raises(ValueError, match="line 1 is not a JSON object"):
        read_jsonl(path)
