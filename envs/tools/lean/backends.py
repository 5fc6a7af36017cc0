"""Proof checking for ``ragen/Lean-v0`` behind one small protocol, with two real backends.

A :class:`ProofChecker` takes a whole Lean 4 file (imports, statement, tactic proof) and returns a
:class:`CheckResult`: the Lean messages, the number of ``sorry`` s, and a status. The env decides acceptance and
success from it (:attr:`CheckResult.accepted`, :attr:`CheckResult.complete`: RAGEN's rules).

* :class:`KiminaChecker`: an HTTP client for a Kimina Lean server
  (``project-numina/kimina-lean-server``), the backend RAGEN uses. Contract relied on (the server's
  ``CheckRequest`` / ``CheckResponse`` models):

  - ``POST {url}/api/check`` with the JSON body ``{"snippets": [{"id": str, "code": str}],
    "timeout": int, "debug": bool, "reuse": bool, "infotree": null}`` (``timeout``: seconds the
    server gives Lean for the snippet); an API key, when the server has one, travels as
    ``Authorization: Bearer <key>`` (the server answers 401 "Missing API key" without it).
  - Answer ``{"results": [{"id": str, "time": float, "error": str?, "response": {...}?,
    "diagnostics": {...}?}]}`` with exactly one of ``error`` (a server-level failure; a Lean timeout
    reads ``"Lean REPL command timed out in 30.0 seconds"``) and ``response``. ``response`` is the
    Lean REPL's answer: either ``{"message": str}`` (the REPL itself failed) or a command response
    ``{"env"?: int, "messages"?: [{"severity": "trace" | "info" | "warning" | "error", "pos":
    {"line": int, "column": int}, "endPos"?: {...} | null, "data": str}], "sorries"?: [{"pos",
    "endPos", "goal"}], ...}``. Fields the server leaves out when null may be absent.

  Connection errors, HTTP timeouts, 429 and 5xx answers are retried ``max_retries`` times with
  exponential backoff (``backoff_s * 2**attempt``, capped at ``max_backoff_s``), like RAGEN's client
  (tenacity, 3 attempts); other 4xx answers and malformed bodies raise at once. A timed-out
  request's connections are closed at once (the client's pool is replaced), not left to the garbage
  collector. When the retries run out, :class:`LeanBackendError` is raised: an unreachable server
  says nothing about the tactic (RAGEN scored it as a rejected tactic, -1.1, and logged once), so
  the episode fails as an env error instead of teaching the policy a penalty it did not earn.

* :class:`ReplChecker`: the Lean REPL (``leanprover-community/repl``) as a local subprocess, driven
  over stdin with its JSON protocol: one command per request (``{"cmd": str, "env"?: int}``, ended
  by a blank line), one JSON answer per command (ended by a blank line). Like the Kimina server, the
  import header of a file is run once and its environment reused for every proof with the same
  header (importing Mathlib takes seconds to minutes). The command is ``lake env repl`` run inside a
  Lake project that depends on the REPL (and on Mathlib, for miniF2F), or any command given as
  ``repl_command``. A command that does not answer within ``timeout_s`` is a Lean timeout (the
  process is killed, its pipes and stderr file closed, and a new one started at the next check), as
  with the server.

Both bound what they read (``max_response_bytes``) and check every field they use, naming the
culprit. httpx is imported only when a server client is built (like
:mod:`envs.tools.search.retrieval`), so the env package stays light.
"""

from __future__ import annotations

import json
import os
import queue
import random
import shutil
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from envs.base import bounded_int

SEVERITIES = ("trace", "info", "warning", "error")
STATUSES = ("valid", "sorry", "lean_error", "repl_error", "timeout", "server_error")
# 16 MiB: a long list of messages (info trees are not requested)
DEFAULT_MAX_RESPONSE_BYTES = 16 << 20


class LeanBackendError(RuntimeError):
    """A proof checker failed for reasons that say nothing about the proof: server unreachable after
    the retries, a refused request, a malformed answer, a REPL process that died."""


class SchemaError(ValueError):
    """An answer (or a data row) outside the schema it must follow; the message names the field."""


class LeanBackendUnavailable(RuntimeError):
    """No proof checker is configured or can be started here (one line naming the options)."""


@dataclass(frozen=True)
class LeanMessage:
    """One Lean message: severity, text and (1-based line, 0-based column) positions when Lean gave
    them."""

    severity: str
    data: str
    pos: tuple[int, int] | None = None
    end_pos: tuple[int, int] | None = None

    @property
    def unsolved_goals(self) -> bool:
        """An "unsolved goals" error: the proof so far is fine but not finished (RAGEN does not
        count it against a tactic)."""
        return self.severity == "error" and "unsolved goals" in self.data.lower()


@dataclass(frozen=True)
class CheckResult:
    """The answer of a proof checker for one file.

    Attributes:
        status: ``"valid"`` (no error, no sorry), ``"sorry"``, ``"lean_error"`` (some message of severity error),
            ``"repl_error"`` (the REPL rejected the command), ``"timeout"`` (Lean ran out of time),
            or ``"server_error"`` (the server answered with an error that is not a timeout):
            Kimina's statuses.
        messages: Lean's messages (for a REPL error, timeout or server error: one error message with
        its text). sorries: how many ``sorry`` s Lean reported. time: seconds Lean took, as reported
        (0.0 when unknown).
    """

    status: str
    messages: tuple[LeanMessage, ...] = ()
    sorries: int = 0
    time: float = 0.0

    @property
    def accepted(self) -> bool:
        """RAGEN's acceptance of the last tactic: Lean answered, with no error other than "unsolved
        goals" and no sorry."""
        if self.status in ("repl_error", "timeout", "server_error"):
            return False
        blocking = any(m.severity == "error" and not m.unsolved_goals for m in self.messages)
        return not blocking and self.sorries == 0

    @property
    def complete(self) -> bool:
        """RAGEN's success: no error at all (unsolved goals included) and no sorry: the theorem is
        proved."""
        return self.accepted and not any(m.severity == "error" for m in self.messages)


class ProofChecker(Protocol):
    """What the Lean env needs from a backend: check one whole Lean file, and release resources."""

    def check(self, code: str) -> CheckResult: ...

    def close(self) -> None: ...


# --------------------------------------------------------------------------------------------------
# Parsing the REPL's JSON (shared by both backends: the server forwards the REPL's answer)
# --------------------------------------------------------------------------------------------------


def _pos(value: Any, where: str) -> tuple[int, int] | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise SchemaError(f"{where} must be an object {{line, column}}, got {type(value).__name__}")
    line, column = value.get("line"), value.get("column")
    for name, v in (("line", line), ("column", column)):
        if isinstance(v, bool) or not isinstance(v, int):
            raise SchemaError(f"{where}.{name} must be an int, got {v!r}")
    return line, column


def parse_command_response(response: Any, where: str, time_s: float = 0.0) -> CheckResult:
    """A :class:`CheckResult` from the REPL's answer to one command (``{"message"}`` or a command
    response).

    Raises ``ValueError`` naming ``where`` and the field for anything outside the REPL's schema.
    """
    if not isinstance(response, dict):
        raise SchemaError(f"{where} must be an object, got {type(response).__name__}")
    if "message" in response and "messages" not in response:
        message = response["message"]
        if not isinstance(message, str):
            raise SchemaError(f"{where}.message must be a string, got {type(message).__name__}")
        return CheckResult(
            "repl_error",
            (LeanMessage("error", message, _pos(response.get("pos"), f"{where}.pos")),),
            time=time_s,
        )
    raw_messages = response.get("messages") or []
    if not isinstance(raw_messages, list):
        raise SchemaError(f"{where}.messages must be a list, got {type(raw_messages).__name__}")
    messages = []
    for i, m in enumerate(raw_messages):
        at = f"{where}.messages[{i}]"
        if not isinstance(m, dict):
            raise SchemaError(f"{at} must be an object, got {type(m).__name__}")
        severity, data = m.get("severity"), m.get("data")
        if severity not in SEVERITIES:
            raise SchemaError(
                f"{at}.severity must be one of {', '.join(SEVERITIES)}; got {severity!r}"
            )
        if not isinstance(data, str):
            raise SchemaError(f"{at}.data must be a string, got {type(data).__name__}")
        messages.append(
            LeanMessage(
                severity,
                data,
                _pos(m.get("pos"), f"{at}.pos"),
                _pos(m.get("endPos"), f"{at}.endPos"),
            )
        )
    sorries = response.get("sorries") or []
    if not isinstance(sorries, list):
        raise SchemaError(f"{where}.sorries must be a list, got {type(sorries).__name__}")
    if any(m.severity == "error" for m in messages):
        status = "lean_error"
    else:
        status = "sorry" if sorries else "valid"
    return CheckResult(status, tuple(messages), len(sorries), time_s)


def error_result(error: str, time_s: float = 0.0) -> CheckResult:
    """The result of a server-level ``error`` string: a timeout when it says "timed out" (Kimina's
    rule)."""
    status = "timeout" if "timed out" in error.lower() else "server_error"
    return CheckResult(status, (LeanMessage("error", error),), time=time_s)


def parse_repl_result(result: Any, snippet_id: str, where: str) -> CheckResult:
    """A :class:`CheckResult` from one entry of a Kimina ``/api/check`` answer's ``results``."""
    if not isinstance(result, dict):
        raise SchemaError(f"{where} must be an object, got {type(result).__name__}")
    if result.get("id") != snippet_id:
        raise SchemaError(
            f"{where}.id is {result.get('id')!r}, expected the snippet sent ({snippet_id!r})"
        )
    time_s = result.get("time", 0.0)
    if isinstance(time_s, bool) or not isinstance(time_s, (int, float)):
        raise SchemaError(f"{where}.time must be a number, got {time_s!r}")
    error, response = result.get("error"), result.get("response")
    if (error is None) == (response is None):
        raise SchemaError(f"{where} must hold exactly one of 'error' and 'response'")
    if error is not None:
        if not isinstance(error, str):
            raise SchemaError(f"{where}.error must be a string, got {type(error).__name__}")
        return error_result(error, float(time_s))
    return parse_command_response(response, f"{where}.response", float(time_s))


# --------------------------------------------------------------------------------------------------
# Kimina Lean server over HTTP
# --------------------------------------------------------------------------------------------------


class KiminaChecker:
    """Client of a Kimina Lean server's ``POST /api/check`` (contract in the module docstring).

    Args:
        url: the server's base URL, e.g. ``http://127.0.0.1:8000``.
        timeout_s: seconds the server gives Lean for one proof (the request's ``timeout``; RAGEN's
            ``request_timeout`` 30).
        http_timeout_s: seconds to connect and between bytes of the answer before a request counts
        as timed out
            (RAGEN's ``http_timeout`` 60; must exceed ``timeout_s``).
        max_retries: retries of one request after a connection error, HTTP timeout, 429 or 5xx.
        backoff_s, max_backoff_s: first wait before a retry (doubles each retry, jittered by up to
        +25 %) and its cap. api_key_env: the name of an environment variable holding the server's
        API key (never the key itself in a
            config), sent as ``Authorization: Bearer <key>``; None sends none.
        max_response_bytes: answers larger than this are refused.
        sleep: how to wait between retries (tests pass a recorder).
    """

    def __init__(
        self,
        url: str,
        *,
        timeout_s: float = 30.0,
        http_timeout_s: float = 60.0,
        max_retries: int = 3,
        backoff_s: float = 1.0,
        max_backoff_s: float = 10.0,
        api_key_env: str | None = None,
        max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES,
        sleep: Callable[[float], None] = time.sleep,
    ):
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise ValueError(f"server_url must be an http(s) URL, got {url!r}")
        max_retries = bounded_int("KiminaChecker", "max_retries", max_retries, 0)
        if timeout_s <= 0 or http_timeout_s <= 0 or backoff_s < 0 or max_backoff_s < backoff_s:
            raise ValueError(
                f"KiminaChecker needs timeout_s > 0, http_timeout_s > 0 and "
                f"0 <= backoff_s <= max_backoff_s; got {timeout_s}, {http_timeout_s}, "
                f"{backoff_s}, {max_backoff_s}"
            )

        headers = {}
        if api_key_env:
            key = os.environ.get(api_key_env)
            if not key:
                raise ValueError(f"api_key_env names ${api_key_env}, which is not set")
            headers["Authorization"] = f"Bearer {key}"
        self.url = url.rstrip("/")
        self.timeout_s, self.http_timeout_s, self.max_retries = (
            timeout_s,
            http_timeout_s,
            max_retries,
        )
        self.backoff_s, self.max_backoff_s, self.max_response_bytes = (
            backoff_s,
            max_backoff_s,
            max_response_bytes,
        )
        self._sleep = sleep
        self._headers = headers
        self._client = self._new_client()
        self.stats = {"requests": 0, "retries": 0}

    def _new_client(self) -> Any:
        import httpx

        return httpx.Client(
            headers=self._headers, timeout=httpx.Timeout(self.http_timeout_s), trust_env=False
        )

    def check(self, code: str) -> CheckResult:
        snippet_id = f"ragen-{uuid.uuid4().hex}"
        body = {
            "snippets": [{"id": snippet_id, "code": code}],
            "timeout": max(1, round(self.timeout_s)),
            "debug": False,
            "reuse": True,
            "infotree": None,
        }
        answer = self._post(f"{self.url}/api/check", body)
        where = f"Kimina server {self.url}: answer"
        try:
            if not isinstance(answer, dict) or not isinstance(answer.get("results"), list):
                raise SchemaError(f"{where} must be an object with a 'results' list")
            if len(answer["results"]) != 1:
                raise SchemaError(
                    f"{where}.results holds {len(answer['results'])} entries for 1 snippet"
                )
            return parse_repl_result(answer["results"][0], snippet_id, f"{where}.results[0]")
        except ValueError as e:
            raise LeanBackendError(str(e)) from None

    def _post(self, url: str, body: dict) -> Any:
        """The JSON answer of one request, with retries (class docstring)."""
        import httpx

        reason = ""
        for attempt in range(self.max_retries + 1):
            self.stats["requests"] += 1
            self.stats["retries"] += attempt > 0
            try:
                response = self._client.post(url, json=body)
            except httpx.TimeoutException:
                reason = f"timed out (http_timeout_s={self.http_timeout_s})"
                # its connections now, not when the garbage collector gets to them
                self._client.close()
                self._client = self._new_client()
            except httpx.TransportError as e:
                reason = f"{type(e).__name__}: {e}"
            else:
                if len(response.content) > self.max_response_bytes:
                    raise LeanBackendError(
                        f"Kimina server {self.url}: answer of {len(response.content)} bytes "
                        f"exceeds max_response_bytes={self.max_response_bytes}"
                    )
                status = response.status_code
                if status == 200:
                    try:
                        return response.json()
                    except ValueError:
                        raise LeanBackendError(
                            f"Kimina server {self.url}: answer is not JSON: {response.text[:200]!r}"
                        ) from None
                if status != 429 and status < 500:
                    raise LeanBackendError(
                        f"Kimina server {self.url}: HTTP {status} for POST /api/check: "
                        f"{response.text[:200]}"
                    )
                reason = f"HTTP {status}"
            if attempt < self.max_retries:
                wait = min(self.backoff_s * 2**attempt, self.max_backoff_s) * (
                    1 + 0.25 * random.random()
                )
                self._sleep(wait)
        raise LeanBackendError(
            f"Kimina server {self.url}: POST /api/check failed: {reason} "
            f"(max_retries={self.max_retries})"
        )

    def close(self) -> None:
        self._client.close()


# --------------------------------------------------------------------------------------------------
# Local Lean REPL over stdin
# --------------------------------------------------------------------------------------------------


def split_header(code: str) -> tuple[str, str]:
    """``(header, body)``: the leading ``import`` lines (blank lines and comments between them
    included) and the rest. The REPL runs the header once per distinct header (imports must come
    first in a Lean file)."""
    lines = code.splitlines(keepends=True)
    cut = 0
    for i, line in enumerate(lines):
        stripped = line.strip()
        if stripped.startswith("import "):
            cut = i + 1
        elif stripped and not stripped.startswith("--"):
            break
    return "".join(lines[:cut]), "".join(lines[cut:])


class ReplChecker:
    """The Lean REPL as a subprocess, one JSON command at a time over stdin (module docstring).

    Args:
        command: the argv that starts the REPL, e.g. ``["lake", "env", "repl"]``.
        cwd: where to run it (the Lake project with the REPL and Mathlib).
        timeout_s: seconds per proof before it counts as a Lean timeout.
        header_timeout_s: seconds for an import header (a first Mathlib import is slow).
        max_response_bytes: an answer longer than this is refused.
    """

    def __init__(
        self,
        command: Sequence[str],
        cwd: str | os.PathLike | None = None,
        *,
        timeout_s: float = 30.0,
        header_timeout_s: float = 600.0,
        max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES,
    ):
        command = list(command)
        if not command or not all(isinstance(c, str) and c for c in command):
            raise ValueError(f"repl_command must be a non-empty list of strings, got {command!r}")
        if shutil.which(command[0], path=os.environ.get("PATH")) is None and not os.path.isfile(
            command[0]
        ):
            raise LeanBackendUnavailable(
                f"repl_command {command[0]!r} is not an executable on PATH"
            )
        if cwd is not None and not os.path.isdir(cwd):
            raise ValueError(f"lean_project {str(cwd)!r} is not a directory")
        self.command, self.cwd = command, cwd
        self.timeout_s, self.header_timeout_s, self.max_response_bytes = (
            timeout_s,
            header_timeout_s,
            max_response_bytes,
        )
        self._proc: subprocess.Popen | None = None
        self._stderr: Any = None
        self._pump_thread: threading.Thread | None = None
        self._lines: queue.Queue[str | None] = queue.Queue()
        self._envs: dict[str, int | None] = {}  # import header -> the REPL env that holds it
        self._lock = threading.Lock()

    def _start(self) -> subprocess.Popen:
        if self._proc is None or self._proc.poll() is not None:
            # a REPL that exited since the last check: its pipes and stderr file closed
            self._kill()
            # stderr into a file: a pipe nobody reads could fill up and stall the REPL
            self._stderr = tempfile.TemporaryFile(mode="w+", encoding="utf-8")  # noqa: SIM115 - lives with the process
            self._proc = subprocess.Popen(
                self.command,
                cwd=self.cwd,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=self._stderr,
                text=True,
                encoding="utf-8",
                bufsize=1,
            )
            self._lines = queue.Queue()
            self._envs = {}
            self._pump_thread = threading.Thread(
                target=self._pump, args=(self._proc, self._lines), daemon=True
            )
            self._pump_thread.start()
        return self._proc

    @staticmethod
    def _pump(proc: subprocess.Popen, lines: queue.Queue) -> None:
        for line in proc.stdout:
            lines.put(line)
        lines.put(None)  # end of output: the process exited
        proc.stdout.close()  # the reader owns the pipe: closed here, where no read can be in flight

    def _stop(self) -> subprocess.Popen | None:
        """Kill the REPL and close its pipes (stdin here, stdout by its reader at the end of
        output); returns the process (None when none ran). A timed-out or crashed REPL leaves
        nothing open for the garbage collector."""
        proc, self._proc = self._proc, None
        self._envs = {}
        if proc is None:
            return None
        proc.kill()
        proc.wait()
        try:
            proc.stdin.close()
        except OSError:  # a flush into the dead process's pipe
            pass
        if self._pump_thread is not None:
            self._pump_thread.join(timeout=5.0)
        return proc

    def _close_stderr(self) -> None:
        if self._stderr is not None:
            self._stderr.close()
            self._stderr = None

    def _kill(self) -> None:
        self._stop()
        self._close_stderr()

    def _send(self, command: dict, timeout_s: float) -> dict | None:
        """The REPL's answer to ``command``, or None when it did not answer in time (the process is
        then killed)."""
        proc = self._start()
        try:
            proc.stdin.write(json.dumps(command, ensure_ascii=False) + "\n\n")
            proc.stdin.flush()
        except (BrokenPipeError, OSError):
            raise LeanBackendError(
                f"Lean REPL {self.command} exited: {self._stderr_tail()}"
            ) from None
        deadline = time.monotonic() + timeout_s
        text, size = [], 0
        while True:
            try:
                line = self._lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                self._kill()
                return None
            if line is None:
                raise LeanBackendError(f"Lean REPL {self.command} exited: {self._stderr_tail()}")
            if not line.strip():
                if text:
                    break
                continue
            text.append(line)
            size += len(line)
            if size > self.max_response_bytes:
                self._kill()
                raise LeanBackendError(
                    f"Lean REPL answer exceeds max_response_bytes={self.max_response_bytes}"
                )
        try:
            answer = json.loads("".join(text))
        except json.JSONDecodeError:
            self._kill()
            raise LeanBackendError(
                f"Lean REPL answered with text that is not JSON: {''.join(text)[:200]!r}"
            ) from None
        if not isinstance(answer, dict):
            raise LeanBackendError(
                f"Lean REPL answered with {type(answer).__name__}, expected an object"
            )
        return answer

    def _stderr_tail(self) -> str:
        proc = self._stop()
        if proc is None:
            return "(not started)"
        self._stderr.seek(0)
        err = self._stderr.read()[-500:]
        self._close_stderr()
        return f"exit code {proc.returncode}; stderr: {err.strip() or '(empty)'}"

    def check(self, code: str) -> CheckResult:
        header, body = split_header(code)
        with self._lock:
            self._start()
            if header and header not in self._envs:
                start = time.monotonic()
                answer = self._send({"cmd": header}, self.header_timeout_s)
                if answer is None:
                    return error_result(
                        f"Lean REPL header command timed out in {self.header_timeout_s} seconds"
                    )
                result = self._parse(answer, time.monotonic() - start)
                if result.status in ("lean_error", "repl_error"):
                    return result  # a broken header: nothing to check the proof in
                env = answer.get("env")
                if isinstance(env, bool) or not isinstance(env, int):
                    raise LeanBackendError(
                        f"Lean REPL answered the header without an int 'env': {env!r}"
                    )
                self._envs[header] = env
            command: dict[str, Any] = {"cmd": body}
            if header:
                command["env"] = self._envs[header]
            start = time.monotonic()
            answer = self._send(command, self.timeout_s)
            if answer is None:
                return error_result(
                    f"Lean REPL command timed out in {self.timeout_s} seconds", self.timeout_s
                )
            return self._parse(answer, time.monotonic() - start)

    @staticmethod
    def _parse(answer: dict, time_s: float) -> CheckResult:
        try:
            return parse_command_response(answer, "Lean REPL answer", time_s)
        except ValueError as e:
            raise LeanBackendError(str(e)) from None

    def close(self) -> None:
        with self._lock:
            self._kill()


__all__ = [
    "CheckResult",
    "KiminaChecker",
    "LeanBackendError",
    "LeanBackendUnavailable",
    "LeanMessage",
    "ProofChecker",
    "ReplChecker",
    "SchemaError",
    "error_result",
    "parse_command_response",
    "parse_repl_result",
    "split_header",
]
