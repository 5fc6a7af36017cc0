"""The servers bound their clients: the operator's --env-kwargs cap a client's env_kwargs, safety
keys are the operator's alone, silent connections are closed, open connections are capped, a public
host needs a secret."""

from __future__ import annotations

import socket
import threading
import time

import gymnasium as gym
import pytest

import envs
from envs.serving.limits import check_allowed_keys
from envs.serving.remote import RemoteEnvError
from envs.serving.serve import EnvServer, HTTPError
from envs.tools.search.retrieval import BM25Retriever, HTTPRetriever, RetrievalError
from envs.tools.search.server import main as retrieval_main
from envs.tools.search.server import make_server


def served(server):
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def stop(server):
    server.shutdown()
    server.server_close()


def test_a_client_cannot_switch_the_sandbox_off_or_raise_its_limits():
    server = served(EnvServer(("127.0.0.1", 0), "ragen/DeepCoder-v0"))
    try:
        for key, value in (
            ("allow_unsandboxed", True),
            ("wall_seconds", 1e9),
            ("memory_mb", 10**6),
            ("max_processes", 10**5),
        ):
            with pytest.raises(
                RemoteEnvError, match=f"HTTP 403: env_kwargs '{key}' is a safety setting"
            ):
                gym.make(
                    envs.REMOTE_ID,
                    url=server.url,
                    env_id="ragen/DeepCoder-v0",
                    env_kwargs={key: value},
                )
        assert server.sessions == {}
    finally:
        stop(server)
    with pytest.raises(
        ValueError, match="--client-kwargs lists 'allow_unsandboxed', a safety setting"
    ):
        EnvServer(("127.0.0.1", 0), "ragen/DeepCoder-v0", client_kwargs=["allow_unsandboxed"])


def test_the_operator_kwargs_bound_the_client_kwargs():
    server = EnvServer(
        ("127.0.0.1", 0),
        "ragen/Sokoban-v0",
        {"dim_room": [7, 7], "num_boxes": 1},
        client_kwargs=["dim_room", "max_steps"],
    )
    try:
        with pytest.raises(HTTPError, match=r"'dim_room'=120 exceeds the server's limit 7") as e:
            server.create(
                "a" * 16, {"env_id": "ragen/Sokoban-v0", "env_kwargs": {"dim_room": [120, 120]}}
            )
        assert e.value.status == 403
        with pytest.raises(
            HTTPError, match="'num_boxes' is not among the keys this server lets clients set"
        ):
            server.create("b" * 16, {"env_id": "ragen/Sokoban-v0", "env_kwargs": {"num_boxes": 2}})
        server.create(
            "c" * 16,
            {"env_id": "ragen/Sokoban-v0", "env_kwargs": {"dim_room": [6, 5], "max_steps": 3}},
        )
        core = server.sessions["c" * 16].env.unwrapped
        assert (core.dim_room, core.max_steps, core.num_boxes) == ((6, 5), 3, 1)
        # nothing allowed by default: a client's kwargs are refused
        plain = EnvServer(("127.0.0.1", 0), "ragen/FrozenLake-v0", {"size": 4})
        with pytest.raises(HTTPError, match="'size' is not among the keys"):
            plain.create("d" * 16, {"env_id": "ragen/FrozenLake-v0", "env_kwargs": {"size": 4}})
        plain.server_close()
    finally:
        server.server_close()
    assert check_allowed_keys([]) == {"render_mode"}


def test_a_silent_connection_is_closed_and_connections_are_capped():
    server = served(
        EnvServer(
            ("127.0.0.1", 0), "ragen/FrozenLake-v0", connection_timeout_s=0.3, max_connections=2
        )
    )
    host, port = server.server_address[:2]
    try:
        silent = [socket.create_connection((host, port), timeout=5) for _ in range(2)]
        time.sleep(0.1)
        # over the cap: refused at once
        with socket.create_connection((host, port), timeout=5) as third:
            assert third.recv(4096).startswith(b"HTTP/1.1 503")
        start = time.monotonic()
        for s in silent:  # the server hangs up on a client that sends nothing
            assert s.recv(10) == b""
            s.close()
        assert time.monotonic() - start < 3
        time.sleep(0.1)
        with socket.create_connection((host, port), timeout=5) as again:
            again.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n")
            assert again.recv(4096).startswith(b"HTTP/1.1 200")
    finally:
        stop(server)


def test_the_retrieval_server_refuses_a_public_host_without_a_secret(capsys, monkeypatch):
    with pytest.raises(SystemExit) as e:
        retrieval_main(["--host", "0.0.0.0"])
    assert e.value.code == 2
    assert (
        "--host 0.0.0.0 is reachable from other machines: set --secret-env"
        in capsys.readouterr().err
    )
    server = served(
        make_server(
            BM25Retriever([("a", "red apple")]),
            "127.0.0.1",
            0,
            secret="s3cret",
            connection_timeout_s=0.3,
        )
    )
    url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        with pytest.raises(RetrievalError, match="health answered 401"):
            HTTPRetriever(url)
        monkeypatch.setenv("RETRIEVAL_TEST_SECRET", "s3cret")
        client = HTTPRetriever(url, secret_env="RETRIEVAL_TEST_SECRET")
        assert [d.id for d in client.search("apple", 1)] == ["a"]
        client.close()
        with socket.create_connection(server.server_address[:2], timeout=5) as silent:
            assert silent.recv(10) == b""
    finally:
        stop(server)
