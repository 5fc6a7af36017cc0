"""Lean: the Kimina HTTP client against a loopback fake server replaying answers in the real
server's schema (success, Lean errors, unsolved goals, sorry, a Lean timeout, a REPL error; retries,
HTTP timeouts, refusals), RAGEN's reward sequence on scripted episodes, the renderer, theorem files,
the one-line refusal without a backend, the local REPL driver against a stand-in process speaking
the REPL's stdin protocol, and (only where a Lean toolchain is installed) the driver against the
real REPL.

The real-REPL test is skipped on machines without ``lake`` and a ``$RAGEN_LEAN_PROJECT`` (no Lean
toolchain can be installed on the build machines): the REPL backend is a real feature, its protocol
handling is tested here against ``tests/fixtures/lean/fake_repl.py``, and the HTTP path is the one
tested end to end.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import sys
from pathlib import Path

import gymnasium as gym
import pytest

import envs  # noqa: F401  (registers the ids)
from envs.tools.lean.backends import (
    CheckResult,
    KiminaChecker,
    LeanBackendError,
    LeanBackendUnavailable,
    LeanMessage,
    ReplChecker,
    SchemaError,
    parse_repl_result,
    split_header,
)
from envs.tools.lean.env import DEFAULT_DATA, LeanEnv, load_theorems, make_checker, split_formal
from tests.fixtures.lean.fake_kimina import THEOREMS, FakeKimina

FAKE_REPL = Path(__file__).resolve().parents[2] / "fixtures" / "lean" / "fake_repl.py"
LINEAR, AND, MOD = 0, 1, 2  # rows of tests/fixtures/lean/theorems.jsonl


@pytest.fixture(scope="module")
def fake():
    with FakeKimina() as server:
        yield server


@pytest.fixture()
def env(fake) -> LeanEnv:
    fake.http_script.clear()
    fake.delay_s.clear()
    return LeanEnv(data_path=str(THEOREMS), server_url=fake.url, render_mode="ansi")


def run(env: LeanEnv, index: int, tactics: list[str]) -> list[tuple[float, bool, bool, dict]]:
    env.reset(seed=0, options={"index": index})
    out = []
    for tactic in tactics:
        _, reward, terminated, truncated, info = env.step(tactic)
        out.append((reward, terminated, truncated, info))
    return out


# --------------------------------------------------------------------------------------------------
# The HTTP client on each recorded answer
# --------------------------------------------------------------------------------------------------


def test_client_on_each_recorded_answer(fake):
    checker = KiminaChecker(fake.url, timeout_s=20)
    cases = {  # tactic -> (status, accepted, complete, sorries, first message)
        "linarith": ("valid", True, True, 0, None),
        "simp": ("lean_error", True, False, 0, "unsolved goals"),
        "nlinarith": ("lean_error", False, False, 0, "linarith failed to find a contradiction"),
        "sorry": ("sorry", False, False, 1, "declaration uses 'sorry'"),
        "decide": ("timeout", False, False, 0, "Lean REPL command timed out in 30.0 seconds"),
        "#repl_error": ("repl_error", False, False, 0, "unknown environment."),
        # not in the table: the default answer
        "foo bar": ("lean_error", False, False, 0, "unknown tactic"),
    }
    for tactic, (status, accepted, complete, sorries, first) in cases.items():
        result = checker.check(f"import Mathlib\n\ntheorem t : True := by\n  {tactic}\n")
        assert (result.status, result.accepted, result.complete, result.sorries) == (
            status,
            accepted,
            complete,
            sorries,
        ), tactic
        if first is not None:
            assert result.messages[0].data.startswith(first), tactic
    # positions and times are read from the answer: the linarith failure at 4:2 -> 4:10, 0.951 s
    result = checker.check("theorem t : True := by\n  nlinarith\n")
    assert (result.messages[0].pos, result.messages[0].end_pos, result.time) == (
        (4, 2),
        (4, 10),
        0.951,
    )
    # the request follows the server's CheckRequest: one snippet with our code, the Lean timeout, no
    # info tree
    body = fake.requests[-1]
    assert set(body) == {"snippets", "timeout", "debug", "reuse", "infotree"}
    assert body["timeout"] == 20 and body["infotree"] is None and body["reuse"] is True
    assert body["snippets"][0]["code"] == "theorem t : True := by\n  nlinarith\n"
    assert checker.stats == {"requests": 8, "retries": 0}


def test_retries_on_5xx_then_success_and_gives_up_after_max_retries(fake):
    sleeps: list[float] = []
    checker = KiminaChecker(fake.url, max_retries=2, backoff_s=1.0, sleep=sleeps.append)
    fake.http_script[:] = [503, 429]
    assert checker.check("x := by\n  linarith").status == "valid"
    # backoff 1, 2 (+25 % jitter)
    assert len(sleeps) == 2 and 1.0 <= sleeps[0] <= 1.25 and 2.0 <= sleeps[1] <= 2.5
    assert checker.stats == {"requests": 3, "retries": 2}
    fake.http_script[:] = [502, 502, 502]
    with pytest.raises(
        LeanBackendError, match=r"POST /api/check failed: HTTP 502 \(max_retries=2\)$"
    ):
        checker.check("x := by\n  linarith")


def test_client_errors_are_not_retried_and_name_the_server(fake):
    sleeps: list[float] = []
    os.environ["LEAN_TEST_KEY"] = "s3cret"
    try:
        fake.api_key = "right"
        checker = KiminaChecker(fake.url, api_key_env="LEAN_TEST_KEY", sleep=sleeps.append)
        with pytest.raises(
            LeanBackendError, match=rf"^Kimina server {fake.url}: HTTP 401 .*Invalid API key"
        ):
            checker.check("x := by\n  linarith")
        fake.api_key = "s3cret"  # the key travels as Authorization: Bearer
        assert checker.check("x := by\n  linarith").status == "valid"
        # a keyless client
        with pytest.raises(LeanBackendError, match=r"HTTP 401 .*Missing API key"):
            KiminaChecker(fake.url, sleep=sleeps.append).check("x := by\n  linarith")
    finally:
        fake.api_key = None
        del os.environ["LEAN_TEST_KEY"]
    assert sleeps == []
    with pytest.raises(ValueError, match=r"\$NO_SUCH_LEAN_KEY, which is not set"):
        KiminaChecker(fake.url, api_key_env="NO_SUCH_LEAN_KEY")


def test_http_timeout_and_refused_connection_are_retried_then_raise(fake):
    fake.delay_s["slow"] = 1.0
    try:
        checker = KiminaChecker(fake.url, http_timeout_s=0.1, max_retries=1, sleep=lambda s: None)
        with pytest.raises(
            LeanBackendError, match=r"timed out \(http_timeout_s=0.1\) \(max_retries=1\)"
        ):
            checker.check("x := by\n  slow")
        assert checker.stats == {"requests": 2, "retries": 1}
    finally:
        fake.delay_s.clear()
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    checker = KiminaChecker(f"http://127.0.0.1:{port}", max_retries=1, sleep=lambda s: None)
    with pytest.raises(LeanBackendError, match=r"ConnectError"):
        checker.check("x := by\n  linarith")


def test_a_timed_out_request_closes_its_connection_at_once():
    import gc
    import threading

    # a server that accepts and reads the request, then never answers
    listener = socket.create_server(("127.0.0.1", 0))
    accepted: list[socket.socket] = []

    def stall() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:  # the listener was closed: the test is over
                return
            conn.recv(65536)
            accepted.append(conn)

    threading.Thread(target=stall, daemon=True).start()
    checker = KiminaChecker(
        f"http://127.0.0.1:{listener.getsockname()[1]}",
        http_timeout_s=0.2,
        max_retries=1,
        sleep=lambda s: None,
    )
    gc.disable()  # nothing may rely on the garbage collector to close a connection
    try:
        with pytest.raises(LeanBackendError, match=r"timed out \(http_timeout_s=0.2\)"):
            checker.check("x := by\n  linarith")
        assert len(accepted) == 2  # the first try and its retry, each on its own connection
        # the client hung up: the server reads the end of the stream (a timeout raises)
        for conn in accepted:
            conn.settimeout(2.0)
            while conn.recv(65536):  # the rest of the request
                pass
    finally:
        gc.enable()
        checker.close()
        listener.close()
        for conn in accepted:
            conn.close()


@pytest.mark.parametrize(
    ("result", "message"),
    [
        (
            {"id": "other", "response": {}},
            r"results\[0\]\.id is 'other', expected the snippet sent \('s'\)",
        ),
        ({"id": "s", "error": "x", "response": {}}, r"exactly one of 'error' and 'response'"),
        ({"id": "s"}, r"exactly one of 'error' and 'response'"),
        (
            {"id": "s", "response": {"messages": [{"severity": "fatal", "data": "x"}]}},
            r"response\.messages\[0\]\.severity must be one of trace, info, warning, error; got 'fatal'",
        ),
        (
            {
                "id": "s",
                "response": {
                    "messages": [
                        {"severity": "error", "data": "x", "pos": {"line": "4", "column": 0}}
                    ]
                },
            },
            r"messages\[0\]\.pos\.line must be an int, got '4'",
        ),
        (
            {"id": "s", "response": {"sorries": {"n": 1}}},
            r"response\.sorries must be a list, got dict",
        ),
        ({"id": "s", "time": "fast", "response": {}}, r"\.time must be a number, got 'fast'"),
    ],
)
def test_answers_outside_the_schema_are_named(result, message):
    with pytest.raises(SchemaError, match=message):
        parse_repl_result(result, "s", "answer.results[0]")


def test_acceptance_and_success_rules_by_hand():
    unsolved = LeanMessage("error", "unsolved goals\n⊢ x = 3")
    # only unsolved goals: accepted, not complete
    assert CheckResult("lean_error", (unsolved,)).accepted
    assert not CheckResult("lean_error", (unsolved,)).complete
    assert not CheckResult("lean_error", (unsolved, LeanMessage("error", "type mismatch"))).accepted
    warning = LeanMessage("warning", "unused variable `h`")
    assert CheckResult("valid", (warning,)).complete  # warnings do not block
    assert not CheckResult("sorry", (), sorries=1).accepted
    assert not CheckResult("timeout", (LeanMessage("error", "timed out"),)).accepted


# --------------------------------------------------------------------------------------------------
# RAGEN's rewards on scripted episodes
# --------------------------------------------------------------------------------------------------


def test_ragen_reward_sequence_on_a_scripted_episode(env, fake):
    # error, another error, success: -0.1 - 1 = -1.1 twice, then -0.1 + 1 + 10 = 10.9 and the
    # episode ends
    steps = run(env, LINEAR, ["omega", "positivity", "linarith"])
    assert [s[0] for s in steps] == pytest.approx([-1.1, -1.1, 10.9], abs=1e-12)
    assert [(s[1], s[2]) for s in steps] == [(False, False), (False, False), (True, False)]
    assert [(s[3]["success"], s[3]["action_is_valid"], s[3]["status"]) for s in steps] == [
        (False, False, "lean_error"),
        (False, False, "lean_error"),
        (True, True, "valid"),
    ]
    assert env.tactics == ["linarith"]  # rejected tactics never join the proof
    # what reached the server: the statement with the accepted tactics and the new one, indented two
    # spaces
    assert fake.requests[-1]["snippets"][0]["code"].endswith(
        "theorem fixture_linear (x : ℝ) (h₀ : 3 * x + 2 = 11) :\n    x = 3 := by\n  linarith\n"
    )


def test_ragen_rewards_for_accepted_unfinished_timeout_and_sorry(env):
    # unsolved goals: accepted (-0.1 + 1 = 0.9); Lean timeout: rejected and penalised (-0.1 - 1 - 1
    # = -2.1); sorry: rejected (-1.1); then success after the accepted simp (10.9)
    steps = run(env, LINEAR, ["simp", "decide", "sorry", "norm_num"])
    assert [s[0] for s in steps] == pytest.approx([0.9, -2.1, -1.1, 10.9], abs=1e-12)
    assert [s[3]["timed_out"] for s in steps] == [False, True, False, False]
    assert [s[3]["accepted"] for s in steps] == [True, False, False, True]
    assert [s[1] for s in steps] == [False, False, False, True]
    assert env.tactics == ["simp", "norm_num"]


def test_max_steps_truncates_with_its_penalty_and_the_end_is_sticky(fake):
    env = LeanEnv(data_path=str(THEOREMS), server_url=fake.url, max_steps=2, success_reward=5.0)
    steps = run(env, LINEAR, ["omega", "simp"])
    # second step: accepted (-0.1 + 1) and the limit (-2): -1.1; truncated, not terminated
    assert [s[0] for s in steps] == pytest.approx([-1.1, -1.1], abs=1e-12)
    assert [(s[1], s[2]) for s in steps] == [(False, False), (False, True)]
    n = len(fake.requests)
    _, reward, terminated, truncated, info = env.step("linarith")
    assert (reward, terminated, truncated, info["action_is_valid"]) == (0.0, False, True, False)
    assert len(fake.requests) == n  # nothing sent after the end
    steps = run(env, LINEAR, ["linarith"])  # a changed success reward: -0.1 + 1 + 5
    assert steps[0][0] == pytest.approx(5.9, abs=1e-12)


def test_empty_blank_overlong_and_non_string_tactics_are_rejected_without_a_check(fake):
    env = LeanEnv(data_path=str(THEOREMS), server_url=fake.url, max_tactic_chars=10)
    n = len(fake.requests)
    steps = run(env, AND, ["", "   \n ", "x" * 11, None])
    assert [s[0] for s in steps] == pytest.approx([-1.1] * 4, abs=1e-12)
    assert [s[3]["status"] for s in steps] == ["invalid"] * 4
    assert steps[0][3]["messages"] == ("01. [ERROR] Empty tactic is not allowed.",)
    assert steps[2][3]["messages"] == (
        "01. [ERROR] Tactic longer than 10 characters is not allowed.",
    )
    assert len(fake.requests) == n


# --------------------------------------------------------------------------------------------------
# Renderer, proof text, data files
# --------------------------------------------------------------------------------------------------


def test_render_matches_ragens_layout(env):
    env.reset(seed=0, options={"index": AND})
    env.step("omega")
    obs, *_ = env.step("constructor")
    expected = [
        "Steps taken: 2/100 | accepted tactics: 1",
        "",
        "Informal statement:",
        "  If p and q hold, then p and q holds.",
        "",
        "Proof transcript:",
        "    1 | import Mathlib",
        "    2 | import Aesop",
        "    3 | set_option maxHeartbeats 0",
        "    4 | open BigOperators Real Nat Topology Rat",
        "    5 | ",
        "    6 | theorem fixture_and (p q : Prop) (hp : p) (hq : q) : p ∧ q := by",
        "    7 |   constructor",
        "",
        "Proof log (latest 5 steps):",
        "  01. omega [✗ rejected]",
        "  02. constructor [✓ accepted]",
        "",
        "Last Lean feedback:",
        "  accepted: True",
        "  messages:",
        "01. [UNSOLVED GOALS 2:20 → 3:8] unsolved goals",
        "x : ℝ",
        "h₀ : 3 * x + 2 = 11",
        "⊢ x = 3",
    ]
    assert obs == "\n".join(expected)
    assert env.render() == obs


def test_render_bounds_the_log_transcript_and_messages(fake):
    env = LeanEnv(
        data_path=str(THEOREMS), server_url=fake.url, message_truncate_limit=20, render_mode="ansi"
    )
    env.reset(seed=0, options={"index": AND})
    for _ in range(40):
        env.step("simp")  # accepted each time (unsolved goals): 40 tactic lines
    obs, *_ = env.step("omega")
    assert "  ... (36 earlier steps omitted)\n  37. simp [✓ accepted]" in obs
    assert "  ... (6 earlier lines omitted)\n    7 |   simp" in obs and "   46 |   simp" in obs
    assert obs.endswith("01. [ERROR 4:2 → 4:7] omega could not p...")  # 17 characters + "..."
    # characters outside the observation space are replaced, so observations stay in it
    assert env._clean("a\u4e2db") == "a\ufffdb" and env.observation_space.contains(obs)


def test_multi_line_tactics_are_indented_line_by_line(env):
    env.reset(seed=0, options={"index": MOD})
    text = env.proof_text(["have h : 2 = 2 := by\n  rfl", "norm_num"])
    assert text == (
        "import Mathlib\n\nopen Nat\n\ntheorem fixture_mod : (100 : ℕ) % 7 = 2 := by\n"
        "  have h : 2 = 2 := by\n    rfl\n  norm_num\n"
    )
    assert split_header(text) == ("import Mathlib\n", text[len("import Mathlib\n") :])


def test_theorem_files_follow_ragens_split_and_minif2f_headers():
    linear, conj, mod = load_theorems(THEOREMS)
    # a miniF2F header supplies the imports and the opens; the doc comment stays in the preamble;
    # sorry removed
    assert linear.imports == "import Mathlib\nimport Aesop"
    assert linear.preamble == (
        "set_option maxHeartbeats 400000\n\nopen BigOperators Real Nat Topology Rat\n"
        "/-- If 3x + 2 = 11, then x = 3. -/"
    )
    assert linear.statement.endswith("x = 3 := by") and linear.informal.startswith("If 3x + 2 = 11")
    assert (conj.imports, conj.statement[-11:], conj.proof) == (
        None,
        "p ∧ q := by",
        ("constructor", "exact hp", "exact hq"),
    )
    assert (mod.name, mod.imports, mod.preamble, mod.proof) == (
        "fixture_mod",
        "import Mathlib",
        "open Nat",
        ("norm_num",),
    )
    assert split_formal("import A\n\nopen B\ntheorem t : x := by\n  simp") == (
        "import A",
        "open B",
        "theorem t : x := by\n  simp",
    )
    assert len(load_theorems(DEFAULT_DATA)) == 17 and all(
        t.proof for t in load_theorems(DEFAULT_DATA)
    )


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ({"name": "x"}, r"'formal_statement' must be a non-empty string"),
        ({"formal_statement": "open Nat"}, r"has no theorem/lemma/example line"),
        ({"formal_statement": "theorem t : True := trivial"}, r"must end in ':= by'"),
        (
            {"formal_statement": "theorem t : True := by", "proof": [""]},
            r"'proof' must be a list of tactics",
        ),
        ({"formal_statement": "theorem t : True := by", "header": 3}, r"'header' must be a string"),
    ],
)
def test_bad_theorem_rows_name_file_and_line(tmp_path, row, message):
    path = tmp_path / "t.jsonl"
    path.write_text(
        json.dumps({"formal_statement": "theorem ok : True := by"}) + "\n" + json.dumps(row) + "\n"
    )
    with pytest.raises(ValueError, match=rf"t\.jsonl:2: .*{message}"):
        load_theorems(path)


# --------------------------------------------------------------------------------------------------
# Backend choice and the refusal
# --------------------------------------------------------------------------------------------------


def test_without_a_backend_the_env_refuses_in_one_line(monkeypatch):
    monkeypatch.delenv("RAGEN_LEAN_SERVER_URL", raising=False)
    monkeypatch.delenv("RAGEN_LEAN_PROJECT", raising=False)
    with pytest.raises(LeanBackendUnavailable) as caught:
        gym.make("ragen/Lean-v0")
    text = str(caught.value)
    assert "\n" not in text
    for option in (
        "server_url",
        "$RAGEN_LEAN_SERVER_URL",
        "lean_project",
        "$RAGEN_LEAN_PROJECT",
        "repl_command",
    ):
        assert option in text
    with pytest.raises(
        LeanBackendUnavailable, match=r"^repl_command 'no-such-lean-repl' is not an executable"
    ):
        LeanEnv(repl_command=["no-such-lean-repl"])
    monkeypatch.setenv("PATH", "")  # no lake: a project alone cannot be run
    with pytest.raises(
        LeanBackendUnavailable,
        match=r"^lean_project '/p' is run with `lake env repl`, but `lake` is "
        r"not on PATH .* or pass server_url",
    ):
        LeanEnv(lean_project="/p")


def test_the_server_url_may_come_from_the_environment(fake, monkeypatch):
    monkeypatch.setenv("RAGEN_LEAN_SERVER_URL", fake.url)
    env = gym.make("ragen/Lean-v0").unwrapped
    assert isinstance(env.checker, KiminaChecker) and env.checker.url == fake.url
    with pytest.raises(
        ValueError, match=r"server_url must be an http\(s\) URL, got 'localhost:8000'"
    ):
        make_checker("localhost:8000")


def test_the_expert_proves_the_fixture_theorem_through_the_server(env):
    env.reset(seed=0, options={"index": AND})
    rewards = []
    while True:
        _, actions = env.expert_turn(1)
        _, reward, terminated, truncated, info = env.step(actions[0])
        rewards.append(reward)
        if terminated or truncated:
            break
    assert info["success"] and rewards == pytest.approx([0.9, 0.9, 10.9], abs=1e-12)
    assert env.expert_turn.__doc__ and env.tactics == ["constructor", "exact hp", "exact hq"]


# --------------------------------------------------------------------------------------------------
# The local REPL driver
# --------------------------------------------------------------------------------------------------


def fake_repl(tmp_path, monkeypatch, timeout_s: float = 5.0) -> tuple[ReplChecker, Path]:
    log = tmp_path / "commands.jsonl"
    monkeypatch.setenv("FAKE_REPL_LOG", str(log))
    return ReplChecker([sys.executable, str(FAKE_REPL)], timeout_s=timeout_s), log


def test_repl_driver_runs_the_header_once_and_reuses_its_env(tmp_path, monkeypatch):
    checker, log = fake_repl(tmp_path, monkeypatch)
    try:
        head = "import Mathlib\n\ntheorem t (x : ℝ) : x = 3 := by\n"
        assert checker.check(head + "  linarith\n").complete
        unsolved = checker.check(head + "  simp\n")
        assert unsolved.accepted and not unsolved.complete and unsolved.messages[0].pos == (1, 20)
        assert checker.check(head + "  foo\n").status == "lean_error"
        sent = [json.loads(line) for line in log.read_text().splitlines()]
        assert sent[0] == {"cmd": "import Mathlib\n"}  # the header alone, once
        assert [c.get("env") for c in sent[1:]] == [0, 0, 0] and sent[1]["cmd"].startswith(
            "\ntheorem t"
        )
    finally:
        checker.close()


def test_repl_driver_times_out_restarts_and_reports_a_crash(tmp_path, monkeypatch):
    checker, log = fake_repl(tmp_path, monkeypatch, timeout_s=0.5)
    try:
        head = "import Mathlib\ntheorem t : True := by\n"
        assert checker.check(head + "  linarith\n").complete
        proc, stderr = checker._proc, checker._stderr
        result = checker.check(head + "  sleep\n")
        assert (result.status, result.accepted) == ("timeout", False)
        assert result.messages[0].data == "Lean REPL command timed out in 0.5 seconds"
        # the timed-out REPL is gone and nothing of it is left open for the garbage collector
        assert (
            proc.returncode is not None
            and proc.stdin.closed
            and proc.stdout.closed
            and stderr.closed
        )
        # a fresh process: the header runs again
        assert checker.check(head + "  linarith\n").complete
        assert [json.loads(line)["cmd"] for line in log.read_text().splitlines()].count(
            "import Mathlib\n"
        ) == 2
        proc, stderr = checker._proc, checker._stderr
        with pytest.raises(
            LeanBackendError, match=r"exited: exit code 3; stderr: fake repl: crashed on purpose"
        ):
            checker.check(head + "  crash\n")
        assert proc.stdin.closed and proc.stdout.closed and stderr.closed
    finally:
        checker.close()


@pytest.mark.skipif(
    shutil.which("lake") is None or not os.environ.get("RAGEN_LEAN_PROJECT"),
    reason="needs a Lean toolchain (lake) and $RAGEN_LEAN_PROJECT, a Lake project with the REPL",
)
def test_real_lean_repl_checks_a_core_lean_proof(tmp_path):
    rows = [
        {
            "name": "and_swap",
            "formal_statement": "theorem and_swap (p q : Prop) (hp : p) (hq : q) : q ∧ p := by",
            "proof": ["constructor", "exact hq", "exact hp"],
        }
    ]
    path = tmp_path / "core.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    env = LeanEnv(
        data_path=str(path),
        lean_project=os.environ["RAGEN_LEAN_PROJECT"],
        imports="",
        request_timeout=120,
    )
    try:
        steps = run(env, 0, ["exact hp", "constructor", "exact hq", "exact hp"])
        assert [s[3]["accepted"] for s in steps] == [False, True, True, True]
        assert [s[0] for s in steps] == pytest.approx([-1.1, 0.9, 0.9, 10.9], abs=1e-12) and steps[
            -1
        ][1]
    finally:
        env.close()
