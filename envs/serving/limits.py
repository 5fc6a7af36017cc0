"""What a client of the project's HTTP servers (``envs.serving.serve``,
``envs.tools.search.server``) may ask for.

* :func:`check_client_kwargs`: the operator's ``--env-kwargs`` bound a client's ``env_kwargs``. A
  client may set only the keys the operator lists in ``--client-kwargs`` (``render_mode`` always);
  where the operator also gave a value, that value is the ceiling (a number, or a list of numbers
  element by element) or, for anything else, the only value allowed. Safety keys
  (:data:`SAFETY_KWARGS`: the sandbox switch and its limits, files, commands, URLs, secrets and
  timeouts) are the operator's alone: a client sending one is refused (HTTP 403) whatever
  ``--client-kwargs`` says.
* :class:`BoundedConnections`: a thread-per-connection server with a socket timeout per connection
  (a client that sends nothing for ``connection_timeout_s`` is disconnected) and at most
  ``max_connections`` open at once (one more gets an immediate HTTP 503 and is closed), so stalled
  clients cannot hold an unbounded number of threads.

This module imports only the standard library and :mod:`envs.base`.
"""

from __future__ import annotations

import math
import socket
import threading
from http.server import ThreadingHTTPServer
from typing import Any

from envs.base import bounded_int

SAFETY_KWARGS = frozenset(
    {
        # the coding sandbox
        "allow_unsandboxed",
        "cpu_seconds",
        "wall_seconds",
        "memory_mb",
        "max_processes",
        # files and programs on the server
        "data_path",
        "corpus_path",
        "lean_project",
        "repl_command",
        "checker",
        # where the server connects, its secrets
        "url",
        "server_url",
        "retrieval_url",
        "secret_env",
        "api_key_env",
        "retrieval_secret_env",
        # how long a server thread may wait
        "request_timeout",
        "http_timeout",
        "timeout_s",
        "retrieval_timeout",
    }
)
ALWAYS_ALLOWED = frozenset({"render_mode"})
DEFAULT_CONNECTION_TIMEOUT_S = 300.0
DEFAULT_MAX_CONNECTIONS = 512


class KwargsRefused(ValueError):
    """A client's env_kwargs the operator does not allow; ``status`` is the HTTP status to
    answer."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


def check_allowed_keys(allowed: list[str] | tuple[str, ...]) -> frozenset[str]:
    """The operator's ``--client-kwargs`` list as a set; a safety key in it is refused (ValueError
    naming it)."""
    if not isinstance(allowed, (list, tuple)) or not all(isinstance(k, str) for k in allowed):
        raise ValueError(f"--client-kwargs must be a JSON list of keyword names, got {allowed!r}")
    unsafe = sorted(set(allowed) & SAFETY_KWARGS)
    if unsafe:
        raise ValueError(
            f"--client-kwargs lists {unsafe[0]!r}, a safety setting only --env-kwargs may set"
        )
    return frozenset(allowed) | ALWAYS_ALLOWED


def _is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _within(key: str, value: Any, ceiling: Any) -> None:
    if _is_number(ceiling):
        if not _is_number(value) or not math.isfinite(value) or value > ceiling:
            raise KwargsRefused(
                403, f"env_kwargs {key!r}={value!r} exceeds the server's limit {ceiling!r}"
            )
    elif isinstance(ceiling, (list, tuple)) and ceiling and all(_is_number(c) for c in ceiling):
        if not isinstance(value, (list, tuple)) or len(value) != len(ceiling):
            raise KwargsRefused(
                403,
                f"env_kwargs {key!r} must be a list of {len(ceiling)} numbers each at most "
                f"the server's {list(ceiling)!r}, got {value!r}",
            )
        for v, c in zip(value, ceiling):
            _within(key, v, c)
    elif value != ceiling:
        raise KwargsRefused(
            403, f"env_kwargs {key!r} is fixed by the server to {ceiling!r}, got {value!r}"
        )


def check_client_kwargs(
    client: dict[str, Any], operator: dict[str, Any], allowed: frozenset[str]
) -> dict[str, Any]:
    """The kwargs a session's env gets: the operator's, with the client's allowed keys within the
    operator's bounds. Raises :class:`KwargsRefused` naming the first key refused (safety keys
    first)."""
    for key in sorted(client):
        if key in SAFETY_KWARGS:
            raise KwargsRefused(
                403,
                f"env_kwargs {key!r} is a safety setting of the server operator (--env-kwargs); "
                "a client may not set it",
            )
    for key in sorted(client):
        if key not in allowed:
            raise KwargsRefused(
                403,
                f"env_kwargs {key!r} is not among the keys this server lets clients set "
                f"(--client-kwargs {sorted(allowed)})",
            )
        if key in operator and key not in ALWAYS_ALLOWED:
            _within(key, client[key], operator[key])
    return {**operator, **client}


class BoundedConnections(ThreadingHTTPServer):
    """A :class:`ThreadingHTTPServer` with a per-connection socket timeout and a cap on open
    connections (module docstring). Its handler must be a ``StreamRequestHandler`` (it reads
    ``server.connection_timeout_s``)."""

    daemon_threads = True
    block_on_close = False

    def __init__(
        self,
        address: tuple[str, int],
        handler: type,
        *,
        connection_timeout_s: float = DEFAULT_CONNECTION_TIMEOUT_S,
        max_connections: int = DEFAULT_MAX_CONNECTIONS,
    ):
        if not (_is_number(connection_timeout_s) and 0 < connection_timeout_s < math.inf):
            raise ValueError(
                f"connection_timeout_s must be a finite number > 0, got {connection_timeout_s!r}"
            )
        max_connections = bounded_int("BoundedConnections", "max_connections", max_connections, 1)
        self.connection_timeout_s, self.max_connections = (
            float(connection_timeout_s),
            max_connections,
        )
        self._slots = threading.BoundedSemaphore(max_connections)
        handler = type(handler.__name__, (handler,), {"timeout": self.connection_timeout_s})
        super().__init__(address, handler)

    def process_request(self, request: socket.socket, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            _refuse(request, self.max_connections)
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request: socket.socket, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()


def _refuse(request: socket.socket, cap: int) -> None:
    """Answer 503 on a connection over the cap without reading it (a short write that fits the
    socket buffer)."""
    body = f'{{"error": "too many open connections (at most {cap}); retry later"}}'.encode()
    head = (
        f"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        "Connection: close\r\n\r\n"
    ).encode()
    try:
        request.settimeout(1.0)
        request.sendall(head + body)
    except OSError:
        pass
