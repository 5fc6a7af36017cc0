"""TrajectoryLogger: JSONL and HTML content, boards, and the page rendered by headless Chromium."""

from __future__ import annotations

import json
import re
import shutil
import subprocess

import pytest

from callbacks import TrajectoryLogger
from callbacks.trajectories import board_image, boards, segments
from ragen_lightning.rollout.tokens import ChatTokens
from ragen_lightning.types import Sample, Trajectory

BOARD_1 = "#####\n#_P_#\n#_X_#\n#####"
BOARD_2 = "#####\n#___#\n#_P_#\n#####"


def _traj(chat, group_id, states, bodies, rewards):
    conv = chat.start(
        "You're a helpful assistant.", f"\nTurn 1:\nState:\n{states[0]}\nYou have 5 actions left."
    )
    for t, body in enumerate(bodies):
        if t:
            chat.add_user(
                conv,
                f"Reward:\n{rewards[t - 1]}\n\nTurn {t + 1}:\nState:\n{states[t]}\n"
                "You have 4 actions left.",
            )
        chat.add_response(conv, chat.encode(body) + [chat.eos_id], None)
    return Trajectory(
        env_index=group_id * 2,
        group_id=group_id,
        seed=100 + group_id,
        turn_rewards=list(rewards),
        num_turns=len(bodies),
        samples=[Sample(conv, list(rewards))],
        success=group_id == 1,
    )


@pytest.fixture()
def trajectories(tiny_tokenizer):
    chat = ChatTokens(tiny_tokenizer)
    return [
        _traj(
            chat,
            0,
            [BOARD_1, BOARD_2],
            ["Up.</think><answer>Up</answer>", "Down.</think><answer>Down</answer>"],
            [0.0, 1.0],
        ),
        _traj(chat, 1, ["arm A or arm B"], ["A.</think><answer>A</answer>"], [0.5]),
    ]


def test_segments_alternate_with_the_loss_mask(trajectories, tiny_tokenizer):
    conv = trajectories[0].samples[0].conversation
    segs = segments(conv.input_ids, conv.loss_mask, tiny_tokenizer)
    # context, turn 1 response, context (glue + turn 2 user + <think>), turn 2 response
    assert [s["trained"] for s in segs] == [False, True, False, True]
    assert segs[0]["text"].endswith("<think>") and segs[1]["text"].startswith(
        "Up.</think><answer>Up</answer>"
    )
    assert "".join(s["text"] for s in segs) == tiny_tokenizer.decode(
        conv.input_ids, skip_special_tokens=False
    )
    assert boards(conv.messages) == [BOARD_1, BOARD_2]


def test_jsonl_and_html_content(trajectories, tiny_tokenizer, tmp_path):
    logger = TrajectoryLogger(num_trajectories=4)
    logger.write(trajectories, tiny_tokenizer, 7, tmp_path)
    rows = [json.loads(line) for line in (tmp_path / "trajectories.jsonl").read_text().splitlines()]
    assert [(r["iteration"], r["group_id"], r["turn_rewards"], r["success"]) for r in rows] == [
        (7, 0, [0.0, 1.0], False),
        (7, 1, [0.5], True),
    ]
    assert rows[0]["boards"] == [BOARD_1, BOARD_2] and rows[1]["boards"] == ["arm A or arm B"]
    assert rows[0]["score"] == 1.0 and len(rows[0]["samples"][0]) == 4
    page = (tmp_path / "iteration_7.html").read_text()
    assert "http" not in page  # self-contained: no external resources
    # trajectory 0: context, turn, context, turn; trajectory 1: context, turn -> 3 trained and 3
    # context spans; the grid boards as tables, the bandit text as <pre>
    assert len(re.findall(r"<span class='trained'>", page)) == 3
    assert len(re.findall(r"<span class='context'>", page)) == 3
    assert page.count('<table class="board">') == 2 and "<pre>arm A or arm B</pre>" in page
    assert "<td>2</td><td>1</td>" in page  # turn 2 reward 1 in the rewards table
    # a second logged iteration appends to the JSONL
    logger.write(trajectories[:1], tiny_tokenizer, 8, tmp_path)
    assert len((tmp_path / "trajectories.jsonl").read_text().splitlines()) == 3
    assert logger.written == [
        str(tmp_path / "iteration_7.html"),
        str(tmp_path / "iteration_8.html"),
    ]


def test_html_shows_the_format_penalty_that_makes_score_differ_from_reward(
    trajectories, tiny_tokenizer, tmp_path
):
    # a bandit episode: reward 0 on its only turn, charged the -0.1 format penalty -> score -0.1
    traj = trajectories[1]
    traj.turn_rewards, traj.penalty, traj.num_format_errors = [0.0], -0.1, 1
    traj.turn_info = [
        {"actions": [], "format_ok": False, "penalty": -0.1, "reward": 0.0, "info": {}}
    ]
    TrajectoryLogger().write([traj], tiny_tokenizer, 3, tmp_path)
    page = (tmp_path / "iteration_3.html").read_text()
    assert "score -0.1 = env return 0 + format penalty -0.1, success True" in page
    assert (
        "<tr><th>turn</th><th>reward</th><th>format penalty</th></tr><tr><td>1</td><td>0</td><td>-0.1</td></tr>"
        "<tr><th>total</th><td>0</td><td>-0.1</td></tr>" in page
    )
    # without per-turn records (turn_info), the totals still explain the score
    TrajectoryLogger().write(trajectories[:1], tiny_tokenizer, 4, tmp_path)
    page = (tmp_path / "iteration_4.html").read_text()
    assert (
        "score 1 = env return 1 + format penalty 0" in page
        and "<tr><td>2</td><td>1</td><td></td></tr>" in page
    )


def test_pick_spreads_over_groups_and_board_image():
    assert TrajectoryLogger.pick(list(range(16)), 4) == [0, 4, 8, 12]
    assert TrajectoryLogger.pick([1, 2], 4) == [1, 2]
    img = board_image("#_\nP#", cell=2)
    assert (
        img.shape == (4, 4, 3)
        and img[0, 0].tolist() == [0x55, 0x55, 0x55]
        and img[2, 0].tolist() == [0x5B, 0x8D, 0xEF]
    )
    assert board_image("not a grid") is None


@pytest.mark.slow
def test_html_renders_in_headless_chromium_with_the_loss_mask(
    trajectories, tiny_tokenizer, tmp_path
):
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    assert chromium, (
        "chromium is not installed: the README's install line installs it (apt-get install chromium)"
    )
    TrajectoryLogger().write(trajectories, tiny_tokenizer, 3, tmp_path)
    page = tmp_path / "iteration_3.html"
    proc = subprocess.run(
        [
            chromium,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--no-first-run",
            f"--user-data-dir={tmp_path / 'profile'}",
            "--dump-dom",
            page.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    dom = proc.stdout
    # the page's script ran in the browser: it marked the body and counted the mask spans into the
    # legend
    assert 'data-mask-rendered="yes"' in dom
    assert (
        "3 trained segments (loss mask 1, highlighted), 3 context segments (loss mask 0, grey)"
        in dom
    )
    assert dom.count('<span class="trained">') == 3 and "Up.&lt;/think&gt;&lt;answer&gt;Up" in dom


@pytest.mark.slow
def test_wandb_table_with_board_images(trajectories, tiny_tokenizer, tmp_path, monkeypatch):
    from types import SimpleNamespace

    from lightning.pytorch.loggers import WandbLogger

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    logger = WandbLogger(offline=True, save_dir=str(tmp_path), project="t")
    records = TrajectoryLogger().write(trajectories, tiny_tokenizer, 2, tmp_path / "out")
    TrajectoryLogger._wandb(SimpleNamespace(loggers=[logger]), records, 2)
    logger.experiment.log({}, commit=True)
    logger.experiment.finish()
    (table,) = tmp_path.rglob("media/table/trajectories_*.table.json")
    data = json.loads(table.read_text())
    assert data["columns"] == [
        "iteration",
        "env_index",
        "group_id",
        "score",
        "penalty",
        "success",
        "turn_rewards",
        "board",
        "text",
    ]
    assert [row[2] for row in data["data"]] == [0, 1] and data["data"][0][6] == "[0.0, 1.0]"
    # the grid board of trajectory 0 became an image; the bandit-like text state has none
    assert data["data"][0][7] is not None and data["data"][1][7] is None


def test_validation_episodes_are_exported_in_evaluates_format(trajectories, tmp_path):
    from types import SimpleNamespace

    from ragen_lightning.data.suite import SuiteEntry
    from ragen_lightning.rollout.records import episode_record, read_jsonl

    logger = TrajectoryLogger(dirpath=str(tmp_path))
    batch = SimpleNamespace(trajectories=trajectories)
    # a single env's validation: untagged episodes
    entry = SuiteEntry("ragen/Sokoban-v0", {"dim_room": [5, 5]}, 2)
    trainer = SimpleNamespace(
        sanity_checking=True,
        is_global_zero=True,
        datamodule=SimpleNamespace(iteration=8, val_entries=[entry]),
    )
    logger.on_validation_batch_end(trainer, None, None, batch, 0)  # the sanity check writes nothing
    assert not (tmp_path / "validation.jsonl").exists()
    trainer.sanity_checking = False
    logger.on_validation_batch_end(trainer, None, None, batch, 0)
    logger.on_validation_batch_end(
        trainer, None, None, SimpleNamespace(trajectories=trajectories[:1]), 0
    )
    rows = read_jsonl(tmp_path / "validation.jsonl")
    # every episode of each validation, appended; the one writer evaluate uses, with evaluate's
    # entry keys, plus iteration and pass
    assert rows == [
        episode_record(
            t,
            tag="ragen/Sokoban-v0",
            env_id="ragen/Sokoban-v0",
            env_kwargs={"dim_room": [5, 5]},
            iteration=8,
            **{"pass": "validation"},
        )
        for t in trajectories + trajectories[:1]
    ]
    assert list(rows[0])[:5] == ["tag", "env_id", "env_kwargs", "iteration", "pass"]
    first = rows[0]
    assert [m["role"] for m in first["messages"]] == [
        "system",
        "user",
        "assistant",
        "user",
        "assistant",
    ]
    assert first["messages"][2]["content"] == "<think>Up.</think><answer>Up</answer>"
    assert (first["seed"], first["turn_rewards"], first["success"]) == (100, [0.0, 1.0], False)
    assert (
        TrajectoryLogger(validation=False, dirpath=str(tmp_path / "off")).on_validation_batch_end(
            trainer, None, None, batch, 0
        )
        is None
        and not (tmp_path / "off").exists()
    )


def test_a_mixtures_validation_entries_can_be_told_apart(trajectories, tmp_path):
    from types import SimpleNamespace

    from ragen_lightning.data.suite import SuiteEntry
    from ragen_lightning.rollout.records import read_jsonl

    # two entries of one env id, told apart only by their tags and kwargs (a mixture /
    # --data.validation.suite)
    entries = [
        SuiteEntry("ragen/Sokoban-v0", {"dim_room": [5, 5]}, 1, tag="small"),
        SuiteEntry("ragen/Sokoban-v0", {"dim_room": [7, 7]}, 1, tag="large"),
    ]
    trajectories[0].tag, trajectories[1].tag = "large", "small"
    trainer = SimpleNamespace(
        sanity_checking=False,
        is_global_zero=True,
        datamodule=SimpleNamespace(iteration=3, val_entries=entries),
    )
    TrajectoryLogger(dirpath=str(tmp_path)).on_validation_batch_end(
        trainer, None, None, SimpleNamespace(trajectories=trajectories), 0
    )
    rows = read_jsonl(tmp_path / "validation.jsonl")
    assert [(r["tag"], r["env_id"], r["env_kwargs"], r["seed"]) for r in rows] == [
        ("large", "ragen/Sokoban-v0", {"dim_room": [7, 7]}, 100),
        ("small", "ragen/Sokoban-v0", {"dim_room": [5, 5]}, 101),
    ]
