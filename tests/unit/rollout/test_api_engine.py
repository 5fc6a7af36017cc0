"""APIEngine against a loopback OpenAI-compatible mock server (stdlib ``http.server`` in a thread, a
free port): success, retries on 429 / 5xx with Retry-After and backoff, timeouts, malformed
responses, the key header, the concurrency limit, and a rollout through the runner whose
trajectories the training batch refuses."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from ragen_lightning.data.batching import build_batch
from ragen_lightning.rollout.api_engine import APIEngine, APIError, parse_retry_after
from ragen_lightning.rollout.engine import SamplingParams
from ragen_lightning.rollout.runner import RolloutRunner
from ragen_lightning.rollout.settings import EpisodeSettings
from ragen_lightning.rollout.tokens import ChatTokens

MESSAGES = [{"role": "system", "content": "sys"}, {"role": "user", "content": "hello"}]


def completion(content, finish="stop", usage=(7, 3)):
    return {
        "id": "x",
        "object": "chat.completion",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": content},
                "finish_reason": finish,
            }
        ],
        "usage": {"prompt_tokens": usage[0], "completion_tokens": usage[1]},
    }


class MockServer:
    """Answers POST /v1/chat/completions with ``reply(body, n) -> (status, headers, body bytes or
    dict, delay_s)`` (``n``: 0-based count of requests so far); records every request's JSON body
    and headers, and the most requests in flight at once."""

    def __init__(self, reply):
        self.reply, self.requests, self.headers = reply, [], []
        self.in_flight = self.max_in_flight = 0
        self.lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # keep the test output clean
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with server.lock:
                    n = len(server.requests)
                    server.requests.append(body)
                    server.headers.append(dict(self.headers))
                    server.in_flight += 1
                    server.max_in_flight = max(server.max_in_flight, server.in_flight)
                try:
                    status, headers, payload, delay = server.reply(body, n)
                    time.sleep(delay)
                    data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
                    self.send_response(status)
                    for k, v in headers.items():
                        self.send_header(k, v)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):  # the client gave up (timeout test)
                    pass
                finally:
                    with server.lock:
                        server.in_flight -= 1

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.base_url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def serve():
    servers = []

    def start(reply):
        servers.append(MockServer(reply))
        return servers[-1]

    yield start
    for s in servers:
        s.close()


def engine_for(server, tok, **kw):
    kw.setdefault("backoff_s", 0.0)
    kw.setdefault("max_backoff_s", 0.0)
    engine = APIEngine("mock-model", tok, base_url=server.base_url, **kw)
    engine.waits = []
    engine._sleep = engine.waits.append  # record the waits instead of sleeping
    return engine


GREEDY = SamplingParams(temperature=0.0, max_new_tokens=16)


def one(engine, params=GREEDY, seed=None):
    return engine.generate([[1]], params, None if seed is None else [seed], messages=[MESSAGES])[0]


def test_success_sends_the_chat_and_settings_and_returns_the_text_reencoded(
    serve, tiny_tokenizer, monkeypatch
):
    monkeypatch.setenv("MY_KEY", "sekret")
    server = serve(lambda body, n: (200, {}, completion("<think>go</think><answer>Up</answer>"), 0))
    engine = engine_for(server, tiny_tokenizer, api_key_env="MY_KEY")
    out = one(
        engine,
        SamplingParams(temperature=0.7, top_p=0.9, max_new_tokens=12, stop=("</answer>",)),
        seed=5,
    )
    (body,) = server.requests
    assert body == {
        "model": "mock-model",
        "messages": MESSAGES,
        "max_tokens": 12,
        "temperature": 0.7,
        "top_p": 0.9,
        "seed": 5,
        "stop": ["</answer>"],
    }
    assert server.headers[0]["Authorization"] == "Bearer sekret"
    # the primed prefix <think> is removed (the runner shows it in front of the text); a stop ends
    # with eos
    assert out.finish_reason == "stop" and out.token_ids[-1] == tiny_tokenizer.eos_token_id
    assert tiny_tokenizer.decode(out.token_ids[:-1]) == "go</think><answer>Up</answer>"
    assert out.logprobs == [0.0] * len(out.token_ids)
    assert engine.stats == {"requests": 1, "retries": 0, "prompt_tokens": 7, "completion_tokens": 3}


def test_greedy_request_has_no_seed_and_length_finish_has_no_eos(
    serve, tiny_tokenizer, monkeypatch
):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    server = serve(lambda body, n: (200, {}, completion("<think>abc", finish="length"), 0))
    out = one(engine_for(server, tiny_tokenizer), seed=5)
    assert "seed" not in server.requests[0] and server.requests[0]["temperature"] == 0.0
    # no key in the environment: no header (a local server)
    assert "Authorization" not in server.headers[0]
    assert out.finish_reason == "length" and tiny_tokenizer.decode(out.token_ids) == "abc"


def test_429_is_retried_after_the_servers_retry_after(serve, tiny_tokenizer):
    replies = [
        (429, {"Retry-After": "3"}, {"error": "slow down"}, 0),
        (200, {}, completion("ok"), 0),
    ]
    server = serve(lambda body, n: replies[n])
    engine = engine_for(server, tiny_tokenizer)
    out = one(engine)
    assert len(server.requests) == 2 and engine.waits == [3.0]
    assert tiny_tokenizer.decode(out.token_ids[:-1]) == "ok" and engine.stats["retries"] == 1


def test_5xx_backs_off_exponentially_then_gives_up_naming_the_endpoint(serve, tiny_tokenizer):
    server = serve(lambda body, n: (503, {}, {"error": "down"}, 0))
    engine = engine_for(server, tiny_tokenizer, max_retries=3, backoff_s=0.5, max_backoff_s=1.5)
    with pytest.raises(
        APIError, match=r"127\.0\.0\.1.*/v1/chat/completions: HTTP 503; gave up after 4 attempt"
    ):
        one(engine)
    assert len(server.requests) == 4
    # 0.5, 1.0, then capped at 1.5; each jittered by up to +25 %
    for wait, base in zip(engine.waits, [0.5, 1.0, 1.5], strict=True):
        assert base <= wait <= base * 1.25


def test_timeout_is_retried_then_reported(serve, tiny_tokenizer):
    server = serve(lambda body, n: (200, {}, completion("late"), 1.0))
    engine = engine_for(server, tiny_tokenizer, timeout_s=0.1, max_retries=1)
    t0 = time.perf_counter()
    with pytest.raises(
        APIError, match=r"/v1/chat/completions: timed out \(timeout_s=0.1\); gave up after 2"
    ):
        one(engine)
    assert time.perf_counter() - t0 < 0.9 and len(server.requests) == 2


def test_an_unusable_200_body_is_retried_like_a_5xx_then_succeeds(serve, tiny_tokenizer):
    replies = [
        (200, {}, b"<html>502 Bad Gateway</html>", 0),
        (200, {}, {"object": "error", "message": "nope"}, 0),
        (200, {}, completion("ok"), 0),
    ]
    server = serve(lambda body, n: replies[n])
    engine = engine_for(server, tiny_tokenizer, max_retries=2)
    out = one(engine)
    assert tiny_tokenizer.decode(out.token_ids[:-1]) == "ok"
    assert len(server.requests) == 3 and len(engine.waits) == 2 and engine.stats["retries"] == 2


def test_an_unusable_200_body_after_the_retry_budget_is_one_line_quoting_the_body(
    serve, tiny_tokenizer
):
    # a proxy's error page, longer than 200 characters
    page = b"<html>\n<body>" + b"x" * 300 + b"</body></html>"
    server = serve(lambda body, n: (200, {}, page, 0))
    engine = engine_for(server, tiny_tokenizer, max_retries=1)
    with pytest.raises(APIError) as info:
        one(engine)
    message = str(info.value)
    assert len(server.requests) == 2 and "\n" not in message  # the budget of a 5xx, and one line
    quoted = repr(page.decode()[:200])
    assert message == (
        f"{server.base_url}/chat/completions: HTTP 200 with a body that is not JSON: {quoted}; "
        "gave up after 2 attempt(s) (max_retries=1)"
    )


def test_json_without_choices_is_retried_then_reported(serve, tiny_tokenizer):
    server = serve(lambda body, n: (200, {}, {"object": "error", "message": "nope"}, 0))
    with pytest.raises(
        APIError,
        match=r"chat/completions: HTTP 200 with a body without choices\[0\]\.message: "
        r"'\{\"object\": \"error\".*gave up after 1 attempt",
    ):
        one(engine_for(server, tiny_tokenizer, max_retries=0))
    assert len(server.requests) == 1


def test_unauthorised_is_not_retried_and_names_the_key_variable(serve, tiny_tokenizer, monkeypatch):
    monkeypatch.delenv("EVAL_KEY", raising=False)
    server = serve(lambda body, n: (401, {}, {"error": "bad key"}, 0))
    with pytest.raises(
        APIError, match=r"HTTP 401: .*bad key.*read from \$EVAL_KEY, which is not set"
    ):
        one(engine_for(server, tiny_tokenizer, api_key_env="EVAL_KEY"))
    assert len(server.requests) == 1


def test_connection_refused_is_retried_then_reported(serve, tiny_tokenizer):
    server = serve(lambda body, n: (200, {}, completion("x"), 0))
    server.close()  # nothing listens on the port any more
    engine = engine_for(server, tiny_tokenizer, max_retries=2)
    with pytest.raises(APIError, match=r"connection error \(ConnectError.*gave up after 3 attempt"):
        one(engine)
    assert len(engine.waits) == 2


def test_concurrency_limit_and_order_of_results(serve, tiny_tokenizer):
    server = serve(lambda body, n: (200, {}, completion(body["messages"][-1]["content"]), 0.15))
    engine = engine_for(server, tiny_tokenizer, max_concurrency=2)
    msgs = [[{"role": "user", "content": f"m{i}"}] for i in range(6)]
    outs = engine.generate([[1]] * 6, SamplingParams(temperature=0.0), messages=msgs)
    assert [tiny_tokenizer.decode(o.token_ids[:-1]) for o in outs] == [f"m{i}" for i in range(6)]
    assert server.max_in_flight == 2


def test_requests_without_messages_and_bad_settings_are_refused(serve, tiny_tokenizer):
    server = serve(lambda body, n: (200, {}, completion("x"), 0))
    engine = engine_for(server, tiny_tokenizer)
    with pytest.raises(ValueError, match="text-in/text-out: it needs the chat messages"):
        engine.generate([[1]], SamplingParams())
    with pytest.raises(ValueError, match="base_url must start with http"):
        APIEngine("m", tiny_tokenizer, base_url="localhost:8000/v1")
    with pytest.raises(ValueError, match="max_concurrency >= 1"):
        APIEngine("m", tiny_tokenizer, max_concurrency=0)


def test_parse_retry_after():
    assert (
        parse_retry_after("7") == 7.0
        and parse_retry_after(None) is None
        and parse_retry_after("soon") is None
    )
    # an HTTP date, 10 s on
    assert parse_retry_after("Wed, 21 Oct 2015 07:28:10 GMT", now=1445412480.0) == 10.0
    # clamped to [0, 600]
    assert parse_retry_after("-5") == 0.0 and parse_retry_after("1e9") == 600.0


def first_action_reply(body, n):
    """A policy: answer the first action the system message lists."""
    system = body["messages"][0]["content"]
    first = system.split("Your available actions are:\n")[1].split("\n")[0].split(", ")[0]
    return 200, {}, completion(f"<think>try {first}</think><answer>{first}</answer>"), 0


def test_rollout_through_the_runner_is_marked_untrainable_and_refused_by_training(
    serve, tiny_tokenizer
):
    import envs  # noqa: F401  (registers ragen/*)

    server = serve(first_action_reply)
    engine = engine_for(server, tiny_tokenizer)
    episode = EpisodeSettings(
        max_turns=2, max_actions_per_turn=1, max_actions_per_episode=2, max_new_tokens=32
    )
    runner = RolloutRunner("ragen/FrozenLake-v0", None, ChatTokens(tiny_tokenizer), engine, episode)
    try:
        trajs = runner.run([3, 4], 1, SamplingParams(temperature=0.0, max_new_tokens=32))
    finally:
        runner.close()
    assert all(not t.trainable for t in trajs) and all(t.num_format_errors == 0 for t in trajs)
    # every turn executed the answered action; a two-turn episode's second request carries the first
    # answer
    assert [info["format_ok"] for t in trajs for info in t.turn_info] == [True] * sum(
        t.num_turns for t in trajs
    )
    second = next(b for b in server.requests if len(b["messages"]) == 4)
    assert [m["role"] for m in second["messages"]] == ["system", "user", "assistant", "user"]
    assert (
        second["messages"][2]["content"].startswith("<think>try ")
        and "</answer>" in second["messages"][2]["content"]
    )
    with pytest.raises(
        ValueError, match="text-in/text-out engine \\(an API model\\).*cannot be trained on"
    ):
        build_batch(trajs, pad_token_id=tiny_tokenizer.pad_token_id)
