"""Serve a registered env over HTTP for ``ragen/Remote-v0`` clients (:mod:`envs.serving.remote`
documents the protocol).

    python -m envs.serving.serve ragen/Sokoban-v0 --env-kwargs '{"dim_room": [6, 6]}' --port 8765
    RAGEN_ENV_SECRET=... python -m envs.serving.serve ragen/Sokoban-v0 --host 0.0.0.0 --port 8765 \
        --secret-env RAGEN_ENV_SECRET

It listens on loopback unless ``--host`` says otherwise, and refuses a non-loopback address without a shared secret
(an env may run code, e.g. a coding env's sandbox) unless ``--insecure``. Each client session gets its own env
instance (``gymnasium.make(env_id, **{--env-kwargs, client env_kwargs})``). The operator's ``--env-kwargs`` bound
what a client may ask for: a client may set only the keys ``--client-kwargs`` lists (default none but
``render_mode``), each within the operator's value (a ceiling for numbers, else fixed), and never a safety key (the
sandbox switch and limits, paths, commands, URLs, timeouts: HTTP 403 naming the key;
:mod:`envs.serving.limits`). Sessions idle for ``--idle-timeout-s`` are closed, and at most
``--max-sessions`` live at once; a connection silent for ``--connection-timeout-s`` is closed and at
most ``--max-connections`` are open at once (more get HTTP 503). Requests larger than
``--max-request-bytes`` are refused unread (HTTP 413). The standard library's threading HTTP server
is enough here (one thread per connection, a lock per session; env calls release the GIL when they
wait), so serving adds no dependency. Prints ``serving <env_id> on http://host:port`` once it
listens (``--port 0`` picks a free port).
"""

from __future__ import annotations

import argparse
import hmac
import ipaddress
import json
import logging
import os
import re
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import gymnasium as gym

from envs.base import bounded_int
from envs.serving.limits import (
    DEFAULT_CONNECTION_TIMEOUT_S,
    DEFAULT_MAX_CONNECTIONS,
    BoundedConnections,
    KwargsRefused,
    check_allowed_keys,
    check_client_kwargs,
)
from envs.serving.remote import (
    ALLOWED_CALLS,
    DEFAULT_MAX_REQUEST_BYTES,
    space_to_json,
    spec_to_json,
    to_json,
)

log = logging.getLogger("envs.serving.serve")
_SESSION_PATH = re.compile(r"^/sessions/([0-9A-Za-z_-]{8,64})(?:/(reset|step|call))?$")


class HTTPError(Exception):
    def __init__(self, status: int, message: str, **extra: Any):
        super().__init__(message)
        self.status, self.message, self.extra = status, message, extra


class _Session:
    def __init__(self, env: gym.Env, create: dict[str, Any]):
        self.env, self.create = env, create
        self.lock = threading.Lock()
        self.last_seq, self.last_answer = 0, None  # the last answered request, replayed for a retry
        self.touched = time.monotonic()


class EnvServer(BoundedConnections):
    """The HTTP server: holds the sessions of one env id.

    Args:
        address: ``(host, port)`` to listen on.
        env_id: the registered env id served (clients asking for another are refused). env_kwargs:
        keyword arguments every session's env gets; they bound a client's ``env_kwargs`` (module
            docstring).
        client_kwargs: the keys a client may set (``render_mode`` always; safety keys never).
        secret: shared secret clients must send as ``Authorization: Bearer <secret>`` (None: no
        check). max_sessions: live sessions at most. max_request_bytes: largest request body read.
        idle_timeout_s: a session untouched this long is closed (checked when a session is created).
        connection_timeout_s: a connection silent this long is closed. max_connections: open
        connections at most (one more is answered 503 and closed).
    """

    allow_reuse_address = True

    def __init__(
        self,
        address: tuple[str, int],
        env_id: str,
        env_kwargs: dict[str, Any] | None = None,
        *,
        secret: str | None = None,
        max_sessions: int = 256,
        max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
        idle_timeout_s: float = 3600.0,
        client_kwargs: list[str] | tuple[str, ...] = (),
        connection_timeout_s: float = DEFAULT_CONNECTION_TIMEOUT_S,
        max_connections: int = DEFAULT_MAX_CONNECTIONS,
    ):
        self.client_kwargs = check_allowed_keys(client_kwargs)
        # an unknown id or bad kwargs fail now, not at the first client
        make(env_id, env_kwargs or {}).close()
        self.env_id, self.env_kwargs = env_id, dict(env_kwargs or {})
        self.secret = secret
        self.max_sessions = bounded_int("EnvServer", "max_sessions", max_sessions, 1)
        self.max_request_bytes = bounded_int("EnvServer", "max_request_bytes", max_request_bytes, 1)
        self.idle_timeout_s = idle_timeout_s
        self.sessions: dict[str, _Session] = {}
        self.sessions_lock = threading.Lock()
        super().__init__(
            address,
            _Handler,
            connection_timeout_s=connection_timeout_s,
            max_connections=max_connections,
        )

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host}:{port}"

    # -- sessions ----------------------------------------------------------------------------------
    def create(self, sid: str, body: dict[str, Any]) -> dict[str, Any]:
        if body.get("env_id") != self.env_id:
            raise HTTPError(400, f"this server hosts {self.env_id!r}, not {body.get('env_id')!r}")
        kwargs = body.get("env_kwargs") or {}
        if not isinstance(kwargs, dict):
            raise HTTPError(400, f"env_kwargs must be a JSON object, got {type(kwargs).__name__}")
        try:
            merged = check_client_kwargs(kwargs, self.env_kwargs, self.client_kwargs)
        except KwargsRefused as e:
            raise HTTPError(e.status, str(e)) from None
        create = {"env_id": self.env_id, "env_kwargs": kwargs}
        with self.sessions_lock:
            self._expire()
            existing = self.sessions.get(sid)
            # a retried creation: the same session if it asks for the same env
            if existing is not None:
                if existing.create != create:
                    raise HTTPError(409, f"session {sid} exists with other settings")
                return describe(existing.env)
            if len(self.sessions) >= self.max_sessions:
                raise HTTPError(
                    503, f"too many sessions (--max-sessions {self.max_sessions}); close some"
                )
        try:
            env = make(self.env_id, merged)
        except Exception as e:  # noqa: BLE001 - the client's kwargs are bad input: say so
            raise HTTPError(
                422, f"gymnasium.make({self.env_id!r}) failed: {type(e).__name__}: {e}"
            ) from None
        with self.sessions_lock:
            self.sessions[sid] = _Session(env, create)
        return describe(env)

    def _expire(self) -> None:
        now = time.monotonic()
        for sid in [s for s, x in self.sessions.items() if now - x.touched > self.idle_timeout_s]:
            log.warning("closing session %s: idle for more than %g s", sid, self.idle_timeout_s)
            self._close(self.sessions.pop(sid))

    @staticmethod
    def _close(session: _Session) -> None:
        try:
            session.env.close()
        except Exception as e:  # noqa: BLE001 - closing must not take the server down
            log.warning("closing an env failed: %s", e)

    def delete(self, sid: str) -> dict[str, Any]:
        with self.sessions_lock:
            session = self.sessions.pop(sid, None)
        if session is None:
            raise HTTPError(404, f"unknown session {sid}", unknown_session=True)
        with session.lock:
            self._close(session)
        return {"closed": True}

    def act(self, sid: str, what: str, body: dict[str, Any]) -> dict[str, Any]:
        with self.sessions_lock:
            session = self.sessions.get(sid)
        if session is None:
            raise HTTPError(
                404,
                f"unknown session {sid} (closed, idled out, or the server restarted)",
                unknown_session=True,
            )
        seq = body.get("seq")
        if isinstance(seq, bool) or not isinstance(seq, int):
            raise HTTPError(400, f"seq must be an integer, got {seq!r}")
        with session.lock:
            session.touched = time.monotonic()
            if seq == session.last_seq and session.last_answer is not None:
                # a retry of the request just answered: never run a step twice
                answer = session.last_answer
            elif seq <= session.last_seq:
                raise HTTPError(
                    409,
                    f"out-of-order request {seq} (the last one answered was {session.last_seq})",
                )
            else:  # numbers only grow; gaps are requests that never arrived
                try:
                    answer = run(session.env, what, body)
                except HTTPError as e:
                    answer = e
                session.last_seq, session.last_answer = seq, answer
        if isinstance(answer, HTTPError):
            raise answer
        return answer


def make(env_id: str, kwargs: dict[str, Any]) -> gym.Env:
    return gym.make(env_id, disable_env_checker=True, **kwargs)


def describe(env: gym.Env) -> dict[str, Any]:
    """What a client needs to mirror ``env``: spaces, flags, prompt spec and action names."""
    core = env.unwrapped
    return {
        "observation_space": space_to_json(env.observation_space, "observation space"),
        "action_space": space_to_json(env.action_space, "action space"),
        "transition_seeded": bool(getattr(core, "transition_seeded", False)),
        "has_expert": callable(getattr(core, "expert_turn", None)),
        **prompt_fields(env),
    }


def prompt_fields(env: gym.Env) -> dict[str, Any]:
    core = env.unwrapped
    return {
        "prompt_spec": spec_to_json(core.prompt_spec()),
        "action_names": [str(a) for a in (getattr(core, "action_names", ()) or ())],
    }


def run(env: gym.Env, what: str, body: dict[str, Any]) -> dict[str, Any]:
    """Execute one reset/step/call; an exception of the env is the client's 422 (its message, its
    type)."""
    try:
        if what == "reset":
            seed, options = body.get("seed"), body.get("options")
            if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
                raise HTTPError(400, f"seed must be an integer or null, got {seed!r}")
            if options is not None and not isinstance(options, dict):
                raise HTTPError(
                    400, f"options must be a JSON object or null, got {type(options).__name__}"
                )
            obs, info = env.reset(seed=seed, options=options)
            return {
                "obs": to_json(obs, "observation"),
                "info": to_json(info, "info"),
                **prompt_fields(env),
            }
        if what == "step":
            if "action" not in body:
                raise HTTPError(400, "step needs an action")
            obs, reward, terminated, truncated, info = env.step(body["action"])
            return {
                "obs": to_json(obs, "observation"),
                "reward": float(reward),
                "terminated": bool(terminated),
                "truncated": bool(truncated),
                "info": to_json(info, "info"),
            }
        method, args = body.get("method"), body.get("args") or []
        if method not in ALLOWED_CALLS or not isinstance(args, list):
            raise HTTPError(
                400,
                f"call needs a method in {list(ALLOWED_CALLS)} and a list of args, got {method!r}",
            )
        target = env.render if method == "render" else getattr(env.unwrapped, method, None)
        if not callable(target):
            raise HTTPError(404, f"the env has no {method}")
        return {"result": to_json(target(*args), f"{method}()")}
    except HTTPError:
        raise
    except Exception as e:  # noqa: BLE001 - the env's exception goes back to its client
        log.warning(
            "env %s raised in %s: %s: %s", type(env.unwrapped).__name__, what, type(e).__name__, e
        )
        raise HTTPError(
            422, f"the env raised {type(e).__name__}: {e}", env_error=type(e).__name__
        ) from None


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: a client's connection serves all its requests
    server: EnvServer

    def log_message(self, format: str, *args: Any) -> None:
        log.debug(format, *args)

    def do_GET(self) -> None:
        self._handle(lambda: self._get())

    def do_PUT(self) -> None:
        self._handle(lambda: self.server.create(self._session()[0], self._body()))

    def do_POST(self) -> None:
        def post():
            sid, what = self._session()
            if what is None:
                raise HTTPError(404, f"no such endpoint: POST {self.path}")
            return self.server.act(sid, what, self._body())

        self._handle(post)

    def do_DELETE(self) -> None:
        self._handle(lambda: self.server.delete(self._session()[0]))

    def _get(self) -> dict[str, Any]:
        if self.path != "/health":
            raise HTTPError(404, f"no such endpoint: GET {self.path}")
        return {"ok": True, "env_id": self.server.env_id, "sessions": len(self.server.sessions)}

    def _session(self) -> tuple[str, str | None]:
        match = _SESSION_PATH.match(self.path)
        if not match:
            raise HTTPError(404, f"no such endpoint: {self.command} {self.path}")
        return match.group(1), match.group(2)

    def _body(self) -> dict[str, Any]:
        length = self.headers.get("Content-Length")
        if length is None or not length.isdigit():
            raise HTTPError(411, "a request body needs a Content-Length")
        if int(length) > self.server.max_request_bytes:
            self.close_connection = True  # the body stays unread
            raise HTTPError(
                413,
                f"request of {length} bytes exceeds --max-request-bytes "
                f"{self.server.max_request_bytes}",
            )
        raw = self.rfile.read(int(length))
        try:
            body = json.loads(raw) if raw else {}
        except ValueError as e:
            raise HTTPError(400, f"the request body is not JSON: {e}") from None
        if not isinstance(body, dict):
            raise HTTPError(
                400, f"the request body must be a JSON object, got {type(body).__name__}"
            )
        return body

    def _authorised(self) -> bool:
        if self.server.secret is None:
            return True
        sent = self.headers.get("Authorization", "")
        return hmac.compare_digest(sent.encode(), f"Bearer {self.server.secret}".encode())

    def _handle(self, action) -> None:
        try:
            if not self._authorised():
                self.close_connection = True
                raise HTTPError(401, "missing or wrong shared secret (Authorization: Bearer ...)")
            status, out = 200, action()
        # the client went silent mid-request: handle_one_request closes the connection
        except TimeoutError:
            raise
        except HTTPError as e:
            status, out = e.status, {"error": e.message, **e.extra}
        except Exception as e:  # a server bug: answer, log, keep serving
            log.exception("internal error on %s %s", self.command, self.path)
            status, out = 500, {"error": f"internal server error: {type(e).__name__}: {e}"}
        try:
            data = json.dumps(out).encode()
        except (TypeError, ValueError) as e:
            status, data = (
                500,
                json.dumps({"error": f"the answer cannot be sent as JSON: {e}"}).encode(),
            )
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(data)


def serve_until_interrupted(server: ThreadingHTTPServer) -> None:
    """Serve requests until Ctrl-C, then close the listening socket (both of the project's servers'
    main loop)."""
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _json_flag(parser: argparse.ArgumentParser, name: str, value: str, kind: type) -> Any:
    try:
        out = json.loads(value)
    except ValueError as e:
        parser.error(f"{name} is not JSON: {e}")
    if not isinstance(out, kind):
        parser.error(f"{name} must be a JSON {'object' if kind is dict else 'list'}")
    return out


def add_connection_flags(parser: argparse.ArgumentParser) -> None:
    """``--connection-timeout-s`` and ``--max-connections`` (both servers)."""
    parser.add_argument(
        "--connection-timeout-s",
        type=float,
        default=DEFAULT_CONNECTION_TIMEOUT_S,
        help="close a connection silent this long (seconds)",
    )
    parser.add_argument(
        "--max-connections",
        type=int,
        default=DEFAULT_MAX_CONNECTIONS,
        help="open connections at most (more are answered 503)",
    )


def secret_and_host(parser: argparse.ArgumentParser, args: argparse.Namespace) -> str | None:
    """The shared secret named by ``--secret-env`` (None without it), after refusing a non-loopback
    ``--host`` without one unless ``--insecure`` (then warn)."""
    secret = None
    if args.secret_env is not None:
        secret = os.environ.get(args.secret_env)
        if not secret:
            parser.error(f"--secret-env names {args.secret_env!r}, which is not set or empty")
    refuse_public_host(parser, args.host, secret is not None, args.insecure)
    return secret


def refuse_public_host(
    parser: argparse.ArgumentParser, host: str, secured: bool, insecure: bool
) -> None:
    """Refuse a non-loopback ``host`` without a shared secret unless ``--insecure`` (then warn)."""
    if _is_loopback(host) or secured:
        return
    if not insecure:
        parser.error(
            f"--host {host} is reachable from other machines: set --secret-env (or --insecure)"
        )
    print(
        f"WARNING: --insecure: anyone who can reach {host} can use this server without a secret",
        file=sys.stderr,
        flush=True,
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m envs.serving.serve", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "env_id", help="a registered gymnasium id (e.g. ragen/Sokoban-v0) or module:id"
    )
    parser.add_argument(
        "--env-kwargs", default="{}", help="JSON object of gymnasium.make keyword arguments"
    )
    parser.add_argument(
        "--host", default="127.0.0.1", help="address to listen on (default: loopback only)"
    )
    parser.add_argument("--port", type=int, default=8765, help="port (0: a free one, printed)")
    parser.add_argument(
        "--secret-env", default=None, help="environment variable holding the shared secret"
    )
    parser.add_argument(
        "--insecure", action="store_true", help="allow a non-loopback --host without a secret"
    )
    parser.add_argument("--max-sessions", type=int, default=256)
    parser.add_argument("--max-request-bytes", type=int, default=DEFAULT_MAX_REQUEST_BYTES)
    parser.add_argument("--idle-timeout-s", type=float, default=3600.0)
    parser.add_argument(
        "--client-kwargs",
        default="[]",
        help="JSON list of the env_kwargs keys a client may set "
        "(within --env-kwargs' values; never the safety keys)",
    )
    add_connection_flags(parser)
    args = parser.parse_args(argv)
    kwargs, allowed = (
        _json_flag(parser, name, value, kind)
        for name, value, kind in (
            ("--env-kwargs", args.env_kwargs, dict),
            ("--client-kwargs", args.client_kwargs, list),
        )
    )
    try:
        check_allowed_keys(allowed)
    except ValueError as e:
        parser.error(str(e))
    secret = secret_and_host(parser, args)
    import envs  # noqa: F401 - registers the project's ids

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    server = EnvServer(
        (args.host, args.port),
        args.env_id,
        kwargs,
        secret=secret,
        max_sessions=args.max_sessions,
        max_request_bytes=args.max_request_bytes,
        idle_timeout_s=args.idle_timeout_s,
        client_kwargs=allowed,
        connection_timeout_s=args.connection_timeout_s,
        max_connections=args.max_connections,
    )
    print(f"serving {args.env_id} on {server.url}", flush=True)
    serve_until_interrupted(server)


if __name__ == "__main__":
    sys.exit(main())
