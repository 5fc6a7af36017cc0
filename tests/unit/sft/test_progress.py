"""The progress reporter line by line on a fake clock (plain lines and an in-place terminal line,
rank 0 only), and its callers: the warm start (demonstrations, steps, cache hit), the chunked
demonstrations, evaluate's episodes."""

from __future__ import annotations

import io
import json
import re

import pytest

import envs  # noqa: F401  (registers the ragen/* ids)
from ragen_lightning.rollout.settings import EpisodeSettings
from ragen_lightning.sft import progress as pg
from ragen_lightning.sft.progress import Progress, duration, note, rate


class Clock:
    def __init__(self):
        self.now = 100.0  # any origin: only differences count

    def __call__(self):
        return self.now


@pytest.fixture
def single_process(monkeypatch):
    for name in pg.RANK_ENV_VARS:
        monkeypatch.delenv(name, raising=False)


def reporter(stream, clock, total=10, **kwargs):
    kwargs.setdefault("tty", False)
    return Progress("warm start", total, stream=stream, clock=clock, every=10.0, **kwargs)


def test_plain_lines_at_most_every_interval_then_the_end_line(single_process):
    out, clock = io.StringIO(), Clock()
    p = reporter(out, clock)
    for step, loss in enumerate([2.0, 1.5, 1.25, 1.0, 0.75, 0.5, 0.4, 0.3, 0.2, 0.1], 1):
        clock.now += 4.0  # 4 s a step: reports at 12 s (step 3) and 24 s (step 6), not in between
        p.update(step, loss=loss)
    clock.now += 1.0
    p.close()
    assert out.getvalue().splitlines() == [
        "warm start: 0/10 steps (0%)",
        # 12 s / 3 steps = 4.00 s/step; 7 steps left -> 28 s
        "warm start: 3/10 steps (30%) | 4.00 s/step | ETA 0:28 | loss 1.25",
        "warm start: 6/10 steps (60%) | 4.00 s/step | ETA 0:16 | loss 0.5",
        # 36 s / 9 steps; 1 step left -> 4 s
        "warm start: 9/10 steps (90%) | 4.00 s/step | ETA 0:04 | loss 0.2",
        # the last step is reported by close() only; 41 s / 10 = 4.10 s/step
        "warm start: 10/10 steps (100%) | 4.10 s/step | 0:41 total | loss 0.1",
    ]


def test_terminal_rewrites_one_line_and_blanks_a_longer_one(single_process):
    out, clock = io.StringIO(), Clock()
    p = Progress("demos", 200, unit="episode", stream=out, clock=clock, every=1.0, tty=True)
    clock.now += 2.0
    p.update(150, loss=0.123456, entry="sokoban greedy")  # 75 episodes/s; 50 left -> 0.67 s -> 0:01
    clock.now += 0.5
    p.update(160)  # 0.5 s after the last report: none
    clock.now += 1.5
    # the loss kept from before; 45 episodes/s; 20 left -> 0.44 s -> 0:00
    p.update(180, entry="lake")
    p.close()
    first = "demos: 0/200 episodes (0%)"
    second = "demos: 150/200 episodes (75%) | 75.0 episodes/s | ETA 0:01 | loss 0.1235 | entry sokoban greedy"
    third = "demos: 180/200 episodes (90%) | 45.0 episodes/s | ETA 0:00 | loss 0.1235 | entry lake"
    end = "demos: 180/200 episodes (90%) | 45.0 episodes/s | 0:04 total | loss 0.1235 | entry lake"
    # the third line is 10 characters shorter than the second: 10 spaces blank the rest of it; the
    # end line is longer
    assert (
        out.getvalue() == "\r" + first + "\r" + second + "\r" + third + " " * 10 + "\r" + end + "\n"
    )
    p.close()  # once only
    assert out.getvalue().endswith(end + "\n") and out.getvalue().count("\n") == 1


def test_an_error_inside_the_block_ends_the_terminal_line_without_an_end_report(single_process):
    out, clock = io.StringIO(), Clock()
    with pytest.raises(KeyError), Progress("x", 3, stream=out, clock=clock, tty=True):
        raise KeyError("boom")
    assert out.getvalue() == "\rx: 0/3 steps (0%)\n"
    plain = io.StringIO()
    with pytest.raises(KeyError), Progress("x", 3, stream=plain, clock=clock, tty=False):
        raise KeyError("boom")
    assert plain.getvalue() == "x: 0/3 steps (0%)\n"


def test_a_resumed_run_counts_only_its_own_units_in_the_rate(single_process):
    out, clock = io.StringIO(), Clock()
    p = Progress(
        "evaluate", 100, unit="episode", stream=out, clock=clock, every=5.0, tty=False, initial=60
    )
    clock.now += 10.0
    # 20 episodes in 10 s = 2.0/s (not 80 in 10 s); 20 left -> 10 s
    p.update(80, entry="sokoban greedy")
    assert out.getvalue().splitlines() == [
        "evaluate: 60/100 episodes (60%)",
        "evaluate: 80/100 episodes (80%) | 2.0 episodes/s | ETA 0:10 | entry sokoban greedy",
    ]


def test_formats_by_hand():
    assert duration(0) == "0:00" and duration(59.4) == "0:59" and duration(59.6) == "1:00"
    assert duration(3599) == "59:59" and duration(3600) == "1:00:00" and duration(3725) == "1:02:05"
    assert rate(0, 5.0, "step") == "-" and rate(3, 0.0, "step") == "-"
    assert rate(4, 6.0, "step") == "1.50 s/step" and rate(3, 3.0, "step") == "1.00 s/step"
    assert rate(30, 4.0, "episode") == "7.5 episodes/s"
    with pytest.raises(ValueError, match="'warm start': total must be >= 0, got -1"):
        Progress("warm start", -1, stream=io.StringIO())


def test_a_zero_total_has_no_percentage(single_process):
    out = io.StringIO()
    with Progress("export", 0, stream=out, clock=Clock(), tty=False):
        pass
    assert out.getvalue().splitlines() == ["export: 0/0 steps", "export: 0/0 steps | 0:00 total"]


@pytest.mark.parametrize(
    ("env", "prints"),
    [
        ({}, True),
        ({"RANK": "0"}, True),
        ({"RANK": "1"}, False),
        ({"LOCAL_RANK": "2"}, False),
        ({"RANK": "0", "LOCAL_RANK": "1"}, True),  # the global rank wins
        ({"SLURM_PROCID": "3"}, False),
        ({"RANK": ""}, True),
    ],
)
def test_only_rank_zero_prints(monkeypatch, single_process, env, prints):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    out = io.StringIO()
    assert pg.is_rank_zero() is prints
    note("warm start: found in the cache, /x", stream=out)
    with Progress("warm start", 2, stream=out, clock=Clock(), tty=False) as p:
        p.update(1)
    expected = [
        "warm start: found in the cache, /x",
        "warm start: 0/2 steps (0%)",
        "warm start: 1/2 steps (50%) | 0:00 total",
    ]
    assert out.getvalue().splitlines() == (expected if prints else [])


def test_a_terminal_stream_is_detected_and_refreshes_faster(single_process):
    class Terminal(io.StringIO):
        def isatty(self):
            return True

    p, q = Progress("a", 1, stream=Terminal()), Progress("a", 1, stream=io.StringIO())
    assert (p.tty, p.every) == (True, pg.TTY_EVERY_S) and (q.tty, q.every) == (
        False,
        pg.LOG_EVERY_S,
    )


# -- the callers -----------------------------------------------------------------------------------
class Recorder:
    """Stands in for a Progress: records every update."""

    def __init__(self):
        self.done, self.seen = 0, []

    def update(self, done, **values):
        self.done = done
        self.seen.append(done)


def test_demonstrations_in_chunks_are_the_unchunked_ones_and_advance_the_progress(tiny_tokenizer):
    from ragen_lightning.rollout.seeds import episode_seeds
    from ragen_lightning.sft.module import build_demonstrations

    seeds = episode_seeds(0, 7, "train")
    whole, whole_stats = build_demonstrations(
        "ragen/SimpleSokoban-v0", tiny_tokenizer, seeds, chunk=100
    )
    shown = Recorder()
    parts, stats = build_demonstrations(
        "ragen/SimpleSokoban-v0", tiny_tokenizer, seeds, chunk=3, progress=shown
    )
    assert parts == whole and stats == whole_stats and len(whole) >= 7
    assert shown.seen == [3, 6, 7]
    with pytest.raises(ValueError, match="chunk must be >= 1, got 0"):
        build_demonstrations("ragen/SimpleSokoban-v0", tiny_tokenizer, seeds, chunk=0)


SMALL = {"steps": 3, "num_episodes": 4, "batch_size": 2}
EPISODE = EpisodeSettings(max_turns=1, max_actions_per_turn=1, max_actions_per_episode=1)
RATE = r"[0-9.]+ (s/step|steps/s|s/episode|episodes/s)"


def test_warm_start_reports_demonstrations_steps_and_a_cache_hit(
    tiny_path, tmp_path, capsys, single_process
):
    from ragen_lightning.sft import warm_start as ws

    folder = ws.warm_start(
        str(tiny_path),
        "ragen/Bandit-v0",
        None,
        ws.WarmStartSettings(**SMALL, cache_dir=str(tmp_path)),
        episode=EPISODE,
    )
    losses = json.loads((folder / ws.META_FILE).read_text())["losses"]
    lines = capsys.readouterr().err.splitlines()
    assert lines[0] == (
        f"warm start: {folder.name} is not in the cache; building it (solver demonstrations, then 3 "
        "SFT steps)"
    )
    assert lines[1] == "warm start: demonstrations: 0/4 episodes (0%)"
    assert re.fullmatch(
        rf"warm start: demonstrations: 4/4 episodes \(100%\) \| {RATE} \| 0:0\d total", lines[2]
    )
    assert lines[3] == "warm start: 0/3 steps (0%)"
    assert re.fullmatch(
        rf"warm start: 3/3 steps \(100%\) \| {RATE} \| 0:\d\d total \| loss {losses[-1]:.4g}",
        lines[4],
    )
    assert (
        re.fullmatch(rf"warm start: saved {re.escape(str(folder))} \(\d+ s\)", lines[5])
        and len(lines) == 6
    )
    assert (
        ws.warm_start(
            str(tiny_path),
            "ragen/Bandit-v0",
            None,
            ws.WarmStartSettings(**SMALL, cache_dir=str(tmp_path)),
            episode=EPISODE,
        )
        == folder
    )
    assert capsys.readouterr().err.splitlines() == [f"warm start: found in the cache, {folder}"]


def test_evaluate_reports_its_episodes(tiny_path, tmp_path, capsys, single_process):
    from ragen_lightning import evaluate as ev
    from ragen_lightning import models
    from ragen_lightning.data.suite import SuiteEntry
    from ragen_lightning.rollout.engine import HFEngine
    from ragen_lightning.rollout.tokens import ChatTokens

    tok, net = models.load_tokenizer(tiny_path), models.load_causal_lm(tiny_path).eval()
    engine, chat = HFEngine(net, [tok.eos_token_id], tok.pad_token_id), ChatTokens(tok)
    entries = [
        SuiteEntry("ragen/Bandit-v0", num_episodes=3, tag="bandit", episode={"max_turns": 1})
    ]
    greedy, episode = ev.EvalSettings(passes=("greedy",)), EpisodeSettings(max_new_tokens=8)
    jsonl = tmp_path / "t.jsonl"
    assert ev.run_suite(engine, chat, entries, greedy, episode, jsonl, chunk_seeds=1) == 3
    lines = capsys.readouterr().err.splitlines()
    assert lines[0] == "evaluate: 0/3 episodes (0%)" and len(lines) == 2
    assert re.fullmatch(
        rf"evaluate: 3/3 episodes \(100%\) \| {RATE} \| 0:\d\d total \| entry bandit greedy",
        lines[1],
    )
    # all done: no rate, nothing ran
    assert ev.run_suite(engine, chat, entries, greedy, episode, jsonl) == 0
    assert capsys.readouterr().err.splitlines() == [
        "evaluate: 3/3 episodes (100%)",
        "evaluate: 3/3 episodes (100%) | 0:00 total",
    ]
    ev.run_suite(engine, chat, entries, greedy, episode, jsonl, progress=False)
    assert capsys.readouterr().err == ""
