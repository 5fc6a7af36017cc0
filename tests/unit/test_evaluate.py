"""``python -m ragen_lightning.evaluate``: a two-env suite on the embedded tiny model writes the
report and the JSONL, a run interrupted mid-way completes only its missing episodes, greedy runs
repeat exactly, statistics by hand, suites and settings checked, a fit's checkpoint loads as
trained."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import envs  # noqa: F401  (registers ragen/*)
from ragen_lightning import evaluate as ev
from ragen_lightning.data.shared_flags import parse
from ragen_lightning.data.suite import SuiteEntry, as_entry, check_suite, load_suite
from ragen_lightning.errors import ConfigError
from ragen_lightning.metrics import intervals
from ragen_lightning.rollout.engine import HFEngine
from ragen_lightning.rollout.records import read_jsonl
from ragen_lightning.rollout.settings import EpisodeSettings
from ragen_lightning.rollout.tokens import ChatTokens

SUITE = """suite:
  - {env_id: ragen/Bandit-v0, num_episodes: 3, episode: {max_turns: 1}}
  - {env_id: ragen/FrozenLake-v0, num_episodes: 2, tag: lake, episode: {max_turns: 2}}
"""
EPISODE = EpisodeSettings(max_new_tokens=12)
SETTINGS = ev.EvalSettings(samples=2)
# greedy: 3 + 2 episodes; sampled: 2 per seed
TOTAL = (3 + 2) * (1 + 2)


@pytest.fixture(scope="module")
def policy(tiny_path):
    from ragen_lightning import models

    tok = models.load_tokenizer(tiny_path)
    net = models.load_causal_lm(tiny_path).eval()
    return net, tok


def engine_of(policy):
    net, tok = policy
    return HFEngine(net, [tok.eos_token_id], tok.pad_token_id), ChatTokens(tok)


def suite(tmp_path):
    path = tmp_path / "suite.yaml"
    path.write_text(SUITE)
    return load_suite(path)


def key(r):
    return r["tag"], r["pass"], r["seed"], r["sample"]


def test_cli_two_env_suite_writes_report_and_jsonl(tmp_path, tiny_path, capsys):
    (tmp_path / "suite.yaml").write_text(SUITE)
    out = tmp_path / "out"
    args = [
        "--model.model",
        str(tiny_path),
        "--suite",
        str(tmp_path / "suite.yaml"),
        "--out",
        str(out),
        "--eval.samples",
        "2",
        "--data.episode",
        "{max_new_tokens: 12}",
        "--progress",
        "false",
        "--device",
        "cpu",
    ]
    assert ev.main(args) == 0
    records = read_jsonl(out / "trajectories.jsonl")
    assert len(records) == TOTAL and len({key(r) for r in records}) == TOTAL
    assert {(r["tag"], r["pass"]) for r in records} == {
        (t, p) for t in ("ragen/Bandit-v0", "lake") for p in ("greedy", "sampled")
    }
    for r in records:  # OpenAI chat messages: system, then a user message and an answer per turn
        roles = [m["role"] for m in r["messages"]]
        assert roles == ["system"] + ["user", "assistant"] * r["num_turns"]
        assert all(
            m["content"].startswith("<think>") for m in r["messages"] if m["role"] == "assistant"
        )
        assert len(r["turns"]) == r["num_turns"] and r["turn_rewards"] == [
            t["reward"] for t in r["turns"]
        ]
        assert (
            r["num_format_errors"] == sum(t["penalty"] != 0 for t in r["turns"]) and r["trainable"]
        )
    # the entry's episode override
    assert max(r["num_turns"] for r in records if r["tag"] == "ragen/Bandit-v0") == 1
    # the report's numbers are those of the records
    rows = list(__import__("csv").DictReader((out / "report.csv").open()))
    assert [(r["tag"], r["pass"], r["episodes"], r["k"]) for r in rows] == [
        ("ragen/Bandit-v0", "greedy", "3", "1"),
        ("ragen/Bandit-v0", "sampled", "6", "2"),
        ("lake", "greedy", "2", "1"),
        ("lake", "sampled", "4", "2"),
    ]
    lake_sampled = [r for r in records if r["tag"] == "lake" and r["pass"] == "sampled"]
    assert float(rows[3]["turns"]) == pytest.approx(sum(r["num_turns"] for r in lake_sampled) / 4)
    assert float(rows[3]["return"]) == pytest.approx(sum(r["env_return"] for r in lake_sampled) / 4)
    md = (out / "report.md").read_text()
    assert "| lake | sampled | 4 |" in md and "pass@2" in md and md in capsys.readouterr().out
    # a re-run with the same settings has nothing left to do; with other settings it is refused
    assert ev.main(args) == 0 and len(read_jsonl(out / "trajectories.jsonl")) == TOTAL
    assert ev.main(args + ["--eval.temperature", "0.5"]) == 2
    assert "holds a run with other settings (settings differ" in capsys.readouterr().err


class Interrupted(RuntimeError):
    pass


class CountingEngine:
    """Wraps an engine; counts prompts sent; raises after ``fail_after`` generate calls."""

    def __init__(self, inner, fail_after=None):
        self.inner, self.fail_after, self.calls, self.prompts = inner, fail_after, 0, 0

    def generate(self, prompts, params, seeds=None):
        if self.fail_after is not None and self.calls >= self.fail_after:
            raise Interrupted("killed")
        self.calls += 1
        self.prompts += len(prompts)
        return self.inner.generate(prompts, params, seeds)

    def sync_weights(self):
        return None

    def clear_cache(self):
        self.inner.clear_cache()


def test_rerun_after_an_interruption_completes_only_the_missing_episodes(tmp_path, policy):
    entries = suite(tmp_path)
    engine, chat = engine_of(policy)
    reference = tmp_path / "ref.jsonl"
    assert (
        ev.run_suite(
            engine, chat, entries, SETTINGS, EPISODE, reference, chunk_seeds=2, progress=False
        )
        == TOTAL
    )

    jsonl = tmp_path / "resumed.jsonl"
    # one seed per chunk; the bandit is one turn (one call per chunk): killed during the third chunk
    with pytest.raises(Interrupted):
        ev.run_suite(
            CountingEngine(engine, fail_after=2),
            chat,
            entries,
            SETTINGS,
            EPISODE,
            jsonl,
            chunk_seeds=1,
            progress=False,
        )
    first = read_jsonl(jsonl)
    assert len(first) == 2  # two greedy bandit seeds were written whole before the kill
    with open(jsonl, "a") as f:  # and a crash in the middle of a write leaves a torn line
        f.write('{"tag": "ragen/Bandit-v0", "pass": "gre')
    counting = CountingEngine(engine)
    with pytest.warns(UserWarning, match="torn last line"):
        ran = ev.run_suite(
            counting, chat, entries, SETTINGS, EPISODE, jsonl, chunk_seeds=2, progress=False
        )
    assert ran == TOTAL - 2
    done = read_jsonl(jsonl)
    assert [key(r) for r in done[:2]] == [key(r) for r in first]  # appended to, never rewritten
    # exactly the episodes and the contents an uninterrupted run gives (generation seeds follow seed
    # positions)
    assert sorted(map(json.dumps, done)) == sorted(map(json.dumps, read_jsonl(reference)))
    assert ev.run_suite(counting, chat, entries, SETTINGS, EPISODE, jsonl, progress=False) == 0


def test_greedy_runs_are_deterministic_whatever_the_chunking(tmp_path, policy):
    entries = suite(tmp_path)
    engine, chat = engine_of(policy)
    greedy = ev.EvalSettings(passes=("greedy",))
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    ev.run_suite(engine, chat, entries, greedy, EPISODE, a, chunk_seeds=8, progress=False)
    ev.run_suite(engine, chat, entries, greedy, EPISODE, b, chunk_seeds=1, progress=False)
    assert a.read_bytes() == b.read_bytes() and len(read_jsonl(a)) == 5


def rec(tag, pass_, seed, sample, success, ret, turns, errors):
    return {
        "tag": tag,
        "pass": pass_,
        "seed": seed,
        "sample": sample,
        "success": success,
        "env_return": ret,
        "num_turns": turns,
        "num_format_errors": errors,
    }


def test_summary_statistics_by_hand():
    settings = ev.EvalSettings(samples=2)
    records = [
        rec("t", "greedy", 1, 0, True, 1.0, 2, 0),
        rec("t", "greedy", 2, 0, False, 0.0, 4, 2),
        rec("t", "sampled", 1, 0, True, 1.0, 1, 0),
        rec("t", "sampled", 1, 1, False, 0.0, 3, 1),
        rec("t", "sampled", 2, 0, False, 0.0, 2, 0),
        rec("t", "sampled", 2, 1, False, 0.0, 2, 0),
    ]
    greedy, sampled = ev.summarize(records, [SuiteEntry("e", tag="t")], settings)
    # greedy: success 1/2 over 2 seeds, Wilson: centre (0.5 + 3.8416/4) / (1 + 1.9208) = 0.5,
    # half 1.96 * sqrt(0.125 + 3.8416/16) / 2.9208 = 0.40548
    assert (greedy["success"], greedy["success_lo"], greedy["success_hi"]) == pytest.approx(
        (0.5, 0.09452, 0.90548), abs=1e-5
    )
    assert greedy["pass_at_k"] == 0.5 and greedy["k"] == 1 and greedy["episodes"] == 2
    # format-valid per seed: 1 - 0/2 = 1, 1 - 2/4 = 0.5 -> mean 0.75, Wilson on 1.5 of 2: p = 0.75,
    # centre (0.75 + 0.9604) / 2.9208 = 0.585593, half 1.96 * sqrt(0.09375 + 0.2401) / 2.9208 =
    # 0.387731
    assert (
        greedy["format_valid"],
        greedy["format_valid_lo"],
        greedy["format_valid_hi"],
    ) == pytest.approx((0.75, 0.197862, 0.973324), abs=1e-5)
    # returns per seed 1, 0: bootstrap means are 0, 0.5, 1 with probabilities 1/4, 1/2, 1/4, so the
    # 2.5 % and 97.5 % quantiles are 0 and 1 (the normal interval said 0.5 +- 0.98 = [-0.48, 1.48],
    # outside [0, 1])
    assert (greedy["return"], greedy["return_lo"], greedy["return_hi"]) == (0.5, 0.0, 1.0)
    # sampled: per-seed success 0.5 and 0 -> mean 0.25, Wilson on 0.5 of 2: centre (0.25 + 0.9604) /
    # 2.9208 = 0.414407, half 0.387731 (the normal interval said [-0.24, 0.74])
    assert (sampled["success"], sampled["success_lo"], sampled["success_hi"]) == pytest.approx(
        (0.25, 0.026676, 0.802138), abs=1e-5
    )
    # pass@2: seed 1 has a success, seed 2 none -> 1/2 with Wilson's interval; turns 2 and 2 -> zero
    # width
    assert (sampled["pass_at_k"], sampled["pass_at_k_lo"], sampled["k"]) == pytest.approx(
        (0.5, 0.09452, 2), abs=1e-5
    )
    assert (sampled["turns"], sampled["turns_lo"], sampled["turns_hi"]) == (2.0, 2.0, 2.0)
    assert sampled["format_valid"] == pytest.approx((3 / 4 + 1) / 2)


def test_intervals_stay_inside_the_value_range_by_hand(tmp_path):
    # values 0, 0, 0, 1: a resample's mean is 0 with probability (3/4)^4 = 32 % (> 2.5 %: the lower
    # end is 0), 1 with 1/256 = 0.4 % and >= 0.75 with 13/256 = 5.1 % (so the 97.5 % quantile is
    # 0.75); the same seed, the same interval
    assert (
        intervals.bootstrap([0.0, 0.0, 0.0, 1.0])
        == (0.0, 0.75)
        == intervals.bootstrap([0.0, 0.0, 0.0, 1.0])
    )
    assert intervals.bootstrap([0.25] * 5) == (0.25, 0.25)
    # the case: a mean return of 0.133 over 15 seeds, returns in [0, 1]: normal said
    # [-0.016, 0.282]
    returns = [0.0] * 11 + [0.5, 0.5, 0.5, 0.5]
    mean, lo, hi = intervals.interval(returns)
    assert mean == pytest.approx(0.13333, abs=1e-5) and 0.0 <= lo < mean < hi <= 0.5
    # Wilson's for [0, 1] values: 2 of 15 -> never below 0
    assert intervals.interval([1.0, 1.0] + [0.0] * 13, unit=True)[1] > 0.0
    rows = ev.summarize(
        [rec("t", "greedy", s, 0, False, r, 1, 0) for s, r in enumerate(returns)],
        [SuiteEntry("e", tag="t")],
        ev.EvalSettings(passes=("greedy",)),
    )
    _, md = ev.write_report(rows, tmp_path, "x")
    text = md.read_text()
    assert "Wilson's score interval for success, format-valid and pass@k" in text
    assert (
        "percentile bootstrap of the mean for return and turns (2000 resamples of the seeds, seed 0)"
        in text
    )
    assert f"0.133 [{lo:.3f}, {hi:.3f}]" in text and "-0." not in text


def test_suite_entries_are_checked_naming_the_culprit(tmp_path):
    assert as_entry({"env_id": "ragen/Bandit-v0"}).tag == "ragen/Bandit-v0"
    entry = as_entry({"env_id": "x", "episode": {"max_turns": 1}})
    assert entry.episode_settings(
        EpisodeSettings(max_turns=5, max_new_tokens=7)
    ) == EpisodeSettings(max_turns=1, max_new_tokens=7)
    with pytest.raises(ConfigError, match=r"entry 3: unknown key\(s\) \['episodes'\]"):
        as_entry({"env_id": "x", "episodes": 3}, "entry 3")
    with pytest.raises(ConfigError, match="num_episodes must be an integer >= 1, got 0"):
        as_entry({"env_id": "x", "num_episodes": 0})
    with pytest.raises(ConfigError, match=r"unknown episode setting\(s\) \['turns'\]"):
        as_entry({"env_id": "x", "episode": {"turns": 1}})
    with pytest.raises(ConfigError, match="suite entry 'x': episode: .*max_turns must be"):
        as_entry({"env_id": "x", "episode": {"max_turns": 0}}).episode_settings(EpisodeSettings())
    with pytest.raises(ConfigError, match="entries 0 and 1 share the tag 'a'"):
        check_suite([SuiteEntry("x", tag="a"), SuiteEntry("y", tag="a")])
    bad = tmp_path / "bad.yaml"
    bad.write_text("suite: {env_id: x}\n")
    with pytest.raises(ConfigError, match=f"--suite {bad}: expected a list of entries"):
        load_suite(bad)
    with pytest.raises(ConfigError, match="cannot read it"):
        load_suite(tmp_path / "missing.yaml")


def test_bad_flags_exit_2_with_one_line(tmp_path, capsys):
    assert (
        ev.main(
            [
                "--ckpt",
                "a.ckpt",
                "--api.model",
                "m",
                "--entry",
                "{env_id: ragen/Bandit-v0}",
                "--out",
                str(tmp_path),
            ]
        )
        == 2
    )
    assert "give one policy" in capsys.readouterr().err
    assert ev.main(["--model.model", "tiny", "--out", str(tmp_path / "o")]) == 2
    assert "the suite is empty" in capsys.readouterr().err
    assert (
        ev.main(
            [
                "--model.model",
                "tiny",
                "--entry",
                "{env_id: ragen/Bandit-v0}",
                "--data.episode",
                "{max_turns: 0}",
                "--out",
                str(tmp_path / "p"),
            ]
        )
        == 2
    )
    assert (
        capsys.readouterr().err
        == "error: --data.episode.max_turns must be an integer >= 1, got 0\n"
    )


def test_a_fit_checkpoint_loads_the_trained_actor(tmp_path, tiny_path):
    from ragen_lightning.parallel import checkpointing
    from ragen_lightning.starpo.module import StarPOModule

    # as the CLI passes it
    module = StarPOModule(model=str(tiny_path), advantage={"estimator": "grpo"})
    module.configure_model()
    with torch.no_grad():
        for p in module.actor.parameters():
            p.add_(0.01)  # a "trained" actor differs from the folder it started from
    path = tmp_path / "last.ckpt"
    checkpointing.save_atomic(
        {
            "state_dict": module.state_dict(),
            "hyper_parameters": dict(module.hparams),
            "starpo": {"model_path": str(tiny_path)},
        },
        path,
    )
    actor, tokenizer = ev.load_checkpoint_actor(path)
    trained = module.actor.state_dict()
    assert all(torch.equal(v, trained[k]) for k, v in actor.state_dict().items())
    assert tokenizer.eos_token_id == module.tokenizer.eos_token_id


def test_cli_evaluates_an_openai_compatible_endpoint(tmp_path, tiny_path, monkeypatch):
    from tests.conftest import load_script

    api = load_script("tests/unit/rollout/test_api_engine.py", "api_engine_tests")
    server = api.MockServer(api.first_action_reply)
    monkeypatch.setenv("MOCK_KEY", "k")
    try:
        code = ev.main(
            [
                "--api.model",
                "mock-model",
                "--api.base_url",
                server.base_url,
                "--api.key_env",
                "MOCK_KEY",
                "--api.tokenizer",
                str(tiny_path),
                "--entry",
                "{env_id: ragen/Bandit-v0, num_episodes: 2}",
                "--data.episode",
                "{max_turns: 1}",
                "--eval.samples",
                "2",
                "--out",
                str(tmp_path),
                "--progress",
                "false",
            ]
        )
    finally:
        server.close()
    assert code == 0
    records = read_jsonl(tmp_path / "trajectories.jsonl")
    assert (
        len(records) == 2 + 4
        and len(server.requests) == 6
        and not any(r["trainable"] for r in records)
    )
    # the mock answers the first listed arm in format: every turn is format-valid and acts
    assert all(r["num_format_errors"] == 0 and r["num_actions"] == 1 for r in records)
    sampled = [b for b in server.requests if b["temperature"] == 1.0]
    assert len(sampled) == 4 and all("seed" in b for b in sampled)
    assert server.headers[0]["Authorization"] == "Bearer k"


def test_wilson_by_hand():
    from ragen_lightning.metrics.intervals import wilson

    # k = 5, n = 10, z = 1.96: centre = (0.5 + 0.19208) / 1.38416 = 0.5; half = 1.96 sqrt(0.025 +
    # 0.009604) / 1.38416
    #   = 1.96 * 0.186022 / 1.38416 = 0.263411
    lo, hi = wilson(5, 10)
    assert lo == pytest.approx(0.5 - 0.263411, abs=1e-6) and hi == pytest.approx(
        0.5 + 0.263411, abs=1e-6
    )
    lo0, hi0 = wilson(0, 10)  # never below 0, unlike the normal interval
    assert lo0 == pytest.approx(0.0, abs=1e-12) and hi0 == pytest.approx(3.8416 / 13.8416)


def test_a_config_without_suite_evaluates_its_val_suite_else_mixture_else_env(tmp_path):
    """A fit's ``--config`` alone: its held-out ``validation.suite`` entries (``num_groups`` ->
    seeds, the others ``--num_episodes``), else its training ``env.mixture``, else its single env; a
    bad entry names its place."""

    def read(data):
        path = tmp_path / "run.yaml"
        path.write_text(__import__("yaml").safe_dump({"data": data, "trainer": {"max_epochs": 1}}))
        return ev.read_suite(parse(ev.parser(), ["--config", str(path), "--num_episodes", "5"]))

    mix = [{"env_id": "ragen/Bandit-v0", "tag": "bandit", "num_groups": 4}]
    val = [
        {"env_id": "ragen/BanditTest-v0", "tag": "test", "episode": {"max_turns": 1}},
        {"env_id": "ragen/FrozenLake-v0", "num_groups": 3},
    ]
    got = read({"env": {"mixture": mix}, "validation": {"suite": val}})
    assert got == [
        SuiteEntry("ragen/BanditTest-v0", None, 5, "test", {"max_turns": 1}),
        SuiteEntry("ragen/FrozenLake-v0", None, 3, "ragen/FrozenLake-v0"),
    ]
    assert read({"env": {"mixture": mix}}) == [SuiteEntry("ragen/Bandit-v0", None, 4, "bandit")]
    assert read({"env": {"id": "ragen/Bandit-v0", "kwargs": {"a": 1}}}) == [
        SuiteEntry("ragen/Bandit-v0", {"a": 1}, 5)
    ]
    with pytest.raises(
        ConfigError, match=r"--data.validation.suite\[0\]: unknown key\(s\) \['num_episodes'\]"
    ):
        read({"validation": {"suite": [{"env_id": "x", "num_episodes": 2}]}})
    with pytest.raises(ConfigError, match="the suite is empty"):
        read({})


class _Payload:
    """A pickle that runs code when unpickled: it writes ``marker`` (an attacker's checkpoint)."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (Path.write_text, (Path(self.marker), "pwned"))


def test_a_checkpoint_that_would_run_pickled_code_is_refused_before_anything_is_written(
    tmp_path, capsys
):
    from ragen_lightning.parallel import checkpointing

    marker, out = tmp_path / "marker", tmp_path / "out"
    evil = tmp_path / "evil.ckpt"
    # a digest added by the attacker (save_atomic) makes the file verify: the loading itself must
    # refuse the code
    checkpointing.save_atomic(
        {"state_dict": {}, "hyper_parameters": {"model": _Payload(marker)}}, evil
    )
    assert (
        ev.main(
            [
                "--ckpt",
                str(evil),
                "--entry",
                "{env_id: ragen/Bandit-v0, num_episodes: 1}",
                "--out",
                str(out),
                "--progress",
                "false",
                "--device",
                "cpu",
            ]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert not marker.exists() and not out.exists()  # no code ran, no run.json, not even the folder
    assert (
        err.startswith(
            f"error: --ckpt {evil}: refused: it holds pickled objects other than tensors"
        )
        and err.count("\n") == 1
    )


@pytest.mark.parametrize("by", ["name", "folder"])
def test_the_qwen_standin_evaluates_by_name_or_folder(tmp_path, qwen_standin_path, by):
    """``--model tiny:qwen`` (or its folder): the conversations are Qwen2.5's chat template around
    the env's system message, and the report is written."""
    from transformers import AutoTokenizer

    out = tmp_path / "out"
    model = "tiny:qwen" if by == "name" else str(qwen_standin_path)
    args = [
        "--model.model",
        model,
        "--entry",
        "{env_id: ragen/Bandit-v0, num_episodes: 2, episode: {max_turns: 1}}",
        "--out",
        str(out),
        "--eval.samples",
        "1",
        "--data.episode",
        "{max_new_tokens: 6}",
        "--progress",
        "false",
        "--device",
        "cpu",
    ]
    assert ev.main(args) == 0
    records = read_jsonl(out / "trajectories.jsonl")
    assert (
        sorted((r["pass"], r["seed"]) for r in records)
        == sorted((p, s) for p in ("greedy", "sampled") for s in {r["seed"] for r in records})
        and len(records) == 4
    )
    tok = AutoTokenizer.from_pretrained(qwen_standin_path)
    for r in records:
        assert [m["role"] for m in r["messages"]] == ["system", "user", "assistant"]
        # the env's system message replaces Qwen's default one: the prompt renders as Qwen2.5
        # renders it
        prompt = tok.apply_chat_template(
            r["messages"][:2], tokenize=False, add_generation_prompt=True
        )
        assert prompt.startswith(
            "<|im_start|>system\n" + r["messages"][0]["content"] + "<|im_end|>\n"
        )
        assert "You are Qwen" not in prompt
    rows = list(__import__("csv").DictReader((out / "report.csv").open()))
    assert [(r["tag"], r["pass"], r["episodes"]) for r in rows] == [
        ("ragen/Bandit-v0", "greedy", "2"),
        ("ragen/Bandit-v0", "sampled", "2"),
    ]
    assert (out / "report.md").is_file() and (out / "run.json").is_file()
