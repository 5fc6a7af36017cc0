"""``ragen/Remote-v0``: a gymnasium env whose episodes run in another process or on another machine,
over HTTP.

The other side is ``python -m envs.serving.serve <env_id>`` (:mod:`envs.serving.serve`), which hosts
any registered env. This client is an ordinary :class:`gymnasium.Env` (``check_env`` passes), so the
trainer, the warm start and the evaluation use it like a local env: ``--data.env.id ragen/Remote-v0
--data.env.kwargs '{"url": "http://host:8765", "env_id": "ragen/Sokoban-v0"}'``.

What travels: ``reset(seed, options)`` and ``step(action)`` with their results (observation text,
reward, flags, the info dict as JSON: numpy scalars arrive as Python numbers), the env's
``prompt_spec()`` and ``action_names`` after every reset (what the prompt builder needs), its
``transition_seeded`` flag, spaces (``Text`` and ``Discrete``) and, when the env has one, its expert
(``expert_turn``) and ``render``.

Protocol (JSON bodies; the client makes up the session id, so creating a session is idempotent too):

* ``GET /health`` -> ``{"ok": true, "env_id": ..., "sessions": n}``
* ``PUT /sessions/<id>`` ``{"env_id", "env_kwargs"}`` -> the env's description (one env instance per
  session)
* ``POST /sessions/<id>/reset`` ``{"seq", "seed", "options"}``, ``.../step`` ``{"seq", "action"}``,
  ``.../call`` ``{"seq", "method", "args"}`` (``expert_turn`` / ``render``); ``DELETE
  /sessions/<id>``

Every reset/step/call carries a per-session sequence number that only grows, and the server keeps
its last answer (an env exception's included), so a request that is retried after a lost connection
is answered from that record instead of being executed twice (a step is not idempotent). Connection
errors are retried with exponential backoff (``retries`` times); HTTP 4xx answers (bad request,
unknown session, env exception) and timeouts are not retried. Requests and responses are bounded
(``max_request_bytes``, ``max_response_bytes``), and a shared secret (``secret_env`` names the
environment variable that holds it; never the secret itself in a config) is sent as a bearer token.
"""

from __future__ import annotations

import http.client
import json
import math
import os
import secrets
import time
from typing import Any
from urllib.parse import urlsplit

import numpy as np
from gymnasium import spaces

from envs.base import PromptSpec, TextEnv, bounded_int

DEFAULT_MAX_REQUEST_BYTES = 1 << 20  # 1 MiB: an action or reset options
DEFAULT_MAX_RESPONSE_BYTES = 16 << 20  # 16 MiB: an observation and its info
ALLOWED_CALLS = ("expert_turn", "render")


class RemoteEnvError(RuntimeError):
    """A remote env request failed: connection lost after the retries, timeout, refusal, or the
    env's own error."""


def to_json(value: Any, where: str = "value") -> Any:
    """``value`` as plain JSON types (numpy scalars and arrays, tuples); a clear TypeError for
    anything else."""
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, (int, float)):
        return value
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, (list, tuple)):
        return [to_json(v, where) for v in value]
    if isinstance(value, dict):
        return {str(k): to_json(v, f"{where}[{k!r}]") for k, v in value.items()}
    raise TypeError(f"{where} of type {type(value).__name__} cannot be sent as JSON")


def space_to_json(space: spaces.Space, name: str) -> dict[str, Any]:
    """A ``Text`` or ``Discrete`` space as JSON (the spaces the project's envs use)."""
    if isinstance(space, spaces.Text):
        return {
            "type": "Text",
            "min_length": int(space.min_length),
            "max_length": int(space.max_length),
            "charset": space.characters,
        }
    if isinstance(space, spaces.Discrete):
        return {"type": "Discrete", "n": int(space.n), "start": int(space.start)}
    raise TypeError(
        f"the {name} {type(space).__name__} cannot be mirrored by a remote env (Text and Discrete can)"
    )


def space_from_json(data: Any, name: str) -> spaces.Space:
    try:
        if data["type"] == "Text":
            return spaces.Text(
                min_length=int(data["min_length"]),
                max_length=int(data["max_length"]),
                charset=str(data["charset"]),
            )
        if data["type"] == "Discrete":
            return spaces.Discrete(int(data["n"]), start=int(data["start"]))
    except (KeyError, TypeError, ValueError) as e:
        raise RemoteEnvError(f"the server described the {name} badly: {data!r} ({e})") from None
    raise RemoteEnvError(f"the server described an unsupported {name}: {data!r}")


def spec_to_json(spec: Any) -> dict[str, Any]:
    """A ``PromptSpec`` (or any object with its attributes) as JSON."""
    return {
        "instruction": str(spec.instruction),
        "action_names": [str(a) for a in spec.action_names],
        "symbols": [[str(s), str(m)] for s, m in spec.symbols],
    }


def spec_from_json(data: dict[str, Any]) -> PromptSpec:
    return PromptSpec(
        instruction=str(data["instruction"]),
        action_names=tuple(data["action_names"]),
        symbols=tuple((str(s), str(m)) for s, m in data["symbols"]),
    )


class RemoteEnv(TextEnv):
    """A client of ``python -m envs.serving.serve``: every reset/step is a round trip to one env
    instance on the server.

    Args:
        url: the server, e.g. ``http://127.0.0.1:8765`` (a path prefix is kept; ``https`` works too).
        env_id: the env id the server hosts (it refuses any other). env_kwargs: keyword arguments
        for the server's ``gymnasium.make`` (over the server's ``--env-kwargs``). timeout_s: seconds
        to wait for a connection or an answer (a slow env step must fit in it); not retried.
        retries: extra attempts after a connection error (refused, reset, dropped), with backoff 0.2
        s, 0.4 s, ...
            (at most 5 s each).
        secret_env: name of the environment variable holding the server's shared secret (None: no
        secret). max_request_bytes: largest request body sent. max_response_bytes: largest response
        body accepted. render_mode: ``"ansi"`` renders on the server.
    """

    def __init__(
        self,
        url: str = "http://127.0.0.1:8765",
        env_id: str = "ragen/Sokoban-v0",
        env_kwargs: dict[str, Any] | None = None,
        timeout_s: float = 60.0,
        retries: int = 3,
        secret_env: str | None = None,
        max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
        max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES,
        render_mode: str | None = None,
    ):
        super().__init__(render_mode)
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"url must look like http://host:port, got {url!r}")
        if not timeout_s > 0 or not math.isfinite(timeout_s):
            raise ValueError(f"timeout_s must be a finite number > 0, got {timeout_s!r}")
        retries = bounded_int("RemoteEnv", "retries", retries, 0)
        self.url, self.env_id, self.timeout_s, self.retries = url, env_id, float(timeout_s), retries
        self.max_request_bytes = bounded_int("RemoteEnv", "max_request_bytes", max_request_bytes, 1)
        self.max_response_bytes = bounded_int(
            "RemoteEnv", "max_response_bytes", max_response_bytes, 1
        )
        self._scheme, self._host, self._port = parts.scheme, parts.hostname, parts.port
        self._prefix = parts.path.rstrip("/")
        self._headers = {"Content-Type": "application/json"}
        if secret_env is not None:
            secret = os.environ.get(secret_env)
            if not secret:
                raise ValueError(
                    f"secret_env names {secret_env!r}, which is not set in this process's environment"
                )
            self._headers["Authorization"] = f"Bearer {secret}"
        self._conn: http.client.HTTPConnection | None = None
        self._seq = 0
        self.session = secrets.token_hex(16)
        kwargs = dict(env_kwargs or {})
        if render_mode is not None:
            kwargs["render_mode"] = render_mode
        self._create = {"env_id": env_id, "env_kwargs": to_json(kwargs, "env_kwargs")}
        self._describe(self._request("PUT", f"/sessions/{self.session}", self._create))

    # -- what the server tells about its env -------------------------------------------------------
    def _describe(self, info: dict[str, Any]) -> None:
        try:
            self.observation_space = space_from_json(info["observation_space"], "observation space")
            self.action_space = space_from_json(info["action_space"], "action space")
            self.transition_seeded = bool(info["transition_seeded"])
            self._has_expert = bool(info["has_expert"])
            self._update(info)
        except KeyError as e:
            raise RemoteEnvError(
                f"{self.url}: the server's session description lacks {e}"
            ) from None

    def _update(self, info: dict[str, Any]) -> None:
        self._spec = spec_from_json(info["prompt_spec"])
        self.action_names = tuple(str(a) for a in info["action_names"])

    def prompt_spec(self) -> PromptSpec:
        return self._spec

    @property
    def expert_turn(self):
        """The server env's expert (``expert_turn(max_actions)``); an AttributeError when it has
        none, so the trainer's "has an expert" check sees the remote env as it is."""
        if not self._has_expert:
            raise AttributeError(f"the env {self.env_id} served at {self.url} has no expert_turn")

        def expert_turn(max_actions: int) -> tuple[str, tuple[str, ...]]:
            reasoning, actions = self._call("expert_turn", [int(max_actions)])
            return str(reasoning), tuple(str(a) for a in actions)

        return expert_turn

    # -- gymnasium API -----------------------------------------------------------------------------
    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str, dict]:
        super().reset(seed=seed)
        body = {"seed": None if seed is None else int(seed), "options": to_json(options, "options")}
        try:
            out = self._session_request("reset", body)
        # the server restarted or expired the session: a reset may start afresh
        except _UnknownSession:
            self._describe(self._request("PUT", f"/sessions/{self.session}", self._create))
            self._seq = 0
            out = self._session_request("reset", body)
        self._update(out)
        return str(out["obs"]), dict(out["info"])

    def step(self, action: Any) -> tuple[str, float, bool, bool, dict]:
        out = self._session_request("step", {"action": to_json(action, "action")})
        return (
            str(out["obs"]),
            float(out["reward"]),
            bool(out["terminated"]),
            bool(out["truncated"]),
            dict(out["info"]),
        )

    def render(self) -> str | None:
        return self._call("render", []) if self.render_mode == "ansi" else None

    def close(self) -> None:
        """End the server's session (best effort: a server that is gone has nothing to free) and the
        connection."""
        if self._conn is not None or self._seq:
            try:
                self._request("DELETE", f"/sessions/{self.session}", None, retries=0)
            except RemoteEnvError:
                pass
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    # -- transport ---------------------------------------------------------------------------------
    def _call(self, method: str, args: list[Any]) -> Any:
        return self._session_request("call", {"method": method, "args": args})["result"]

    def _session_request(self, what: str, body: dict[str, Any]) -> dict[str, Any]:
        self._seq += 1  # a new number per request (gaps are fine); its retries reuse it
        return self._request("POST", f"/sessions/{self.session}/{what}", {**body, "seq": self._seq})

    def _connection(self) -> http.client.HTTPConnection:
        if self._conn is None:
            cls = (
                http.client.HTTPSConnection
                if self._scheme == "https"
                else http.client.HTTPConnection
            )
            self._conn = cls(self._host, self._port, timeout=self.timeout_s)
        return self._conn

    def _drop_connection(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def _request(
        self, method: str, path: str, body: dict[str, Any] | None, retries: int | None = None
    ) -> Any:
        data = b"" if body is None else json.dumps(body).encode()
        if len(data) > self.max_request_bytes:
            raise RemoteEnvError(
                f"{self.url}: {method} {path} would send {len(data)} bytes, more than "
                f"max_request_bytes={self.max_request_bytes}"
            )
        retries = self.retries if retries is None else retries
        for attempt in range(retries + 1):
            try:
                conn = self._connection()
                conn.request(method, self._prefix + path, body=data, headers=self._headers)
                response = conn.getresponse()
                status, payload = response.status, self._read(response)
            except TimeoutError:
                self._drop_connection()
                raise RemoteEnvError(
                    f"{self.url}: no answer to {method} {path} within timeout_s={self.timeout_s:g}"
                ) from None
            except (ConnectionError, http.client.HTTPException, OSError) as e:
                self._drop_connection()
                if attempt < retries:
                    time.sleep(min(0.2 * 2**attempt, 5.0))
                    continue
                raise RemoteEnvError(
                    f"{self.url}: {method} {path} failed after {attempt + 1} attempt(s): "
                    f"{type(e).__name__}: {e}"
                ) from None
            return self._answer(method, path, status, payload)
        raise AssertionError("unreachable")  # pragma: no cover

    def _read(self, response: http.client.HTTPResponse) -> bytes:
        length = response.getheader("Content-Length")
        size = int(length) if length is not None and length.isdigit() else None
        if size is None or size <= self.max_response_bytes:
            payload = response.read(self.max_response_bytes + 1)
            size = len(payload)
        if size > self.max_response_bytes:
            # an unread body would poison the next request on this connection
            self._drop_connection()
            raise RemoteEnvError(
                f"{self.url}: a response of {size} bytes exceeds max_response_bytes="
                f"{self.max_response_bytes}"
            )
        return payload

    def _answer(self, method: str, path: str, status: int, payload: bytes) -> Any:
        try:
            out = json.loads(payload) if payload else {}
        except ValueError:
            raise RemoteEnvError(
                f"{self.url}: {method} {path} answered HTTP {status} with a body that is not JSON: "
                f"{payload[:200]!r}"
            ) from None
        if 200 <= status < 300:
            return out
        message = out.get("error", "") if isinstance(out, dict) else str(out)[:200]
        if status == 404 and isinstance(out, dict) and out.get("unknown_session"):
            raise _UnknownSession(
                f"{self.url}: session {self.session} is unknown to the server: {message}"
            )
        raise RemoteEnvError(f"{self.url}: {method} {path} answered HTTP {status}: {message}")


class _UnknownSession(RemoteEnvError):
    """The server does not know the session (restarted, or the session idled out)."""
