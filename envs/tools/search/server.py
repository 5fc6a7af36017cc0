"""A retrieval server speaking RAGEN's HTTP contract (``GET /health``, ``POST /retrieve {query,
top_k}``), standard library only, over the BM25 index of a corpus file or of the SearchQA env's
generated encyclopaedia.

    python -m envs.tools.search.server              # the world_seed 0 encyclopaedia on 127.0.0.1:8000
    python -m envs.tools.search.server --corpus passages.jsonl --port 8001
    # then: gymnasium.make("ragen/SearchQA-v0", retrieval_url="http://127.0.0.1:8000")

It listens on loopback unless ``--host`` says otherwise, and, like ``envs.serving.serve``, refuses a
non-loopback address without a shared secret (``--secret-env``; clients send ``Authorization: Bearer
<secret>``, the SearchQA env's ``retrieval_secret_env``) unless ``--insecure`` (then it warns). A
connection silent for ``--connection-timeout-s`` is closed and at most ``--max-connections`` are
open at once. Requests are bounded: a body of at most 64 KiB, ``query`` a string of at most 2000
characters, ``top_k`` an int in [1, 50]; anything else is a 400 with ``{"error": "..."}`` naming the
field. Each request is handled on its own thread (``ThreadingHTTPServer``).
"""

from __future__ import annotations

import argparse
import hmac
import json
import threading
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from envs.base import bounded_int
from envs.serving.limits import (
    DEFAULT_CONNECTION_TIMEOUT_S,
    DEFAULT_MAX_CONNECTIONS,
    BoundedConnections,
)
from envs.tools.search.retrieval import (
    MAX_QUERY_CHARS,
    MAX_TOP_K,
    BM25Retriever,
    Retriever,
    load_corpus,
)

MAX_BODY_BYTES = 64 * 1024


class _Handler(BaseHTTPRequestHandler):
    retriever: Retriever  # set on the subclass made by make_server
    secret: str | None = None  # likewise; None: no check
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args) -> None:
        pass  # quiet: a rollout makes thousands of requests

    def _send(self, status: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _authorised(self) -> bool:
        if self.secret is None:
            return True
        if hmac.compare_digest(
            self.headers.get("Authorization", "").encode(), f"Bearer {self.secret}".encode()
        ):
            return True
        self.close_connection = True
        self._send(
            HTTPStatus.UNAUTHORIZED,
            {"error": "missing or wrong shared secret (Authorization: Bearer ...)"},
        )
        return False

    def do_GET(self) -> None:
        if not self._authorised():
            return
        if self.path == "/health":
            self._send(HTTPStatus.OK, {"status": "ok"})
        else:
            self._send(HTTPStatus.NOT_FOUND, {"error": f"no such path {self.path[:100]!r}"})

    def do_POST(self) -> None:
        if not self._authorised():
            return
        if self.path != "/retrieve":
            self._send(HTTPStatus.NOT_FOUND, {"error": f"no such path {self.path[:100]!r}"})
            return
        try:
            length = int(self.headers.get("Content-Length", ""))
        except ValueError:
            self._send(HTTPStatus.LENGTH_REQUIRED, {"error": "Content-Length is required"})
            return
        if not 0 <= length <= MAX_BODY_BYTES:
            self.close_connection = True  # the body is not read
            self._send(
                HTTPStatus.REQUEST_ENTITY_TOO_LARGE, {"error": f"body over {MAX_BODY_BYTES} bytes"}
            )
            return
        try:
            body = json.loads(self.rfile.read(length))
        except (json.JSONDecodeError, UnicodeDecodeError):
            self._send(HTTPStatus.BAD_REQUEST, {"error": "body is not JSON"})
            return
        error = _check_request(body)
        if error:
            self._send(HTTPStatus.BAD_REQUEST, {"error": error})
            return
        docs = self.retriever.search(body["query"], body.get("top_k", 5))
        self._send(
            HTTPStatus.OK,
            {"results": [{"id": d.id, "content": d.content, "score": d.score} for d in docs]},
        )


def _check_request(body: object) -> str:
    """'' when ``body`` is a valid retrieve request, else what is wrong with it."""
    if not isinstance(body, dict):
        return "body must be a JSON object {query, top_k}"
    query = body.get("query")
    if not isinstance(query, str) or len(query) > MAX_QUERY_CHARS:
        return f"query must be a string of at most {MAX_QUERY_CHARS} characters"
    top_k = body.get("top_k", 5)
    try:
        bounded_int("retrieval server", "top_k", top_k, 1, MAX_TOP_K)
    except ValueError as exc:
        return str(exc)[:200]
    return ""


def make_server(
    retriever: Retriever,
    host: str = "127.0.0.1",
    port: int = 8000,
    *,
    secret: str | None = None,
    connection_timeout_s: float = DEFAULT_CONNECTION_TIMEOUT_S,
    max_connections: int = DEFAULT_MAX_CONNECTIONS,
) -> ThreadingHTTPServer:
    """A server (not yet serving) answering from ``retriever``; ``port=0`` picks a free port
    (``server.server_address[1]``); ``secret``: the Bearer secret clients must send (None: none)."""
    handler = type("RetrievalHandler", (_Handler,), {"retriever": retriever, "secret": secret})
    return BoundedConnections(
        (host, port),
        handler,
        connection_timeout_s=connection_timeout_s,
        max_connections=max_connections,
    )


def serve_in_thread(
    retriever: Retriever, host: str = "127.0.0.1", port: int = 0
) -> tuple[ThreadingHTTPServer, str]:
    """Start a server on a daemon thread; returns it (``shutdown()`` stops it) and its base URL."""
    server = make_server(retriever, host, port)
    threading.Thread(target=server.serve_forever, daemon=True, name="retrieval-server").start()
    return server, f"http://{host}:{server.server_address[1]}"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m envs.tools.search.server", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "--corpus",
        default=None,
        help="a .jsonl/.parquet passage file (default: the generated "
        "encyclopaedia of --world-seed)",
    )
    parser.add_argument("--world-seed", type=int, default=0, help="the SearchQA env's world_seed")
    parser.add_argument("--num-people", type=int, default=48, help="the SearchQA env's num_people")
    parser.add_argument(
        "--host", default="127.0.0.1", help="interface to listen on (default: loopback only)"
    )
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument(
        "--secret-env", default=None, help="environment variable holding the shared secret"
    )
    parser.add_argument(
        "--insecure", action="store_true", help="allow a non-loopback --host without a secret"
    )
    from envs.serving.serve import (
        add_connection_flags,
        secret_and_host,
        serve_until_interrupted,
    )

    add_connection_flags(parser)
    args = parser.parse_args(argv)
    secret = secret_and_host(parser, args)
    if args.corpus is not None:
        documents = load_corpus(args.corpus)
    else:
        from envs.tools.search.encyclopedia import build_world

        documents = build_world(args.world_seed, num_people=args.num_people).documents()
    server = make_server(
        BM25Retriever(list(documents)),
        args.host,
        args.port,
        secret=secret,
        connection_timeout_s=args.connection_timeout_s,
        max_connections=args.max_connections,
    )
    print(
        f"retrieval server: {len(documents)} passages on http://{args.host}:{server.server_address[1]}",
        flush=True,
    )
    serve_until_interrupted(server)


if __name__ == "__main__":
    main()
