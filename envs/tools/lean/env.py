"""Lean 4 theorem proving one tactic at a time (RAGEN's ``lean`` env), checked by a real Lean
backend.

RAGEN proves miniF2F statements (``CoderBak/minif2f``) through a Kimina Lean server. Neither Lean
nor Mathlib nor the dataset can be fetched on the build machines, so this env ships no prover of its
own: it needs a backend (:mod:`envs.tools.lean.backends`), and refuses at construction, in one line
naming the options, when none is configured:

* ``server_url`` (or ``$RAGEN_LEAN_SERVER_URL``): a Kimina Lean server (``POST /api/check``),
  RAGEN's backend;
* ``lean_project`` (or ``$RAGEN_LEAN_PROJECT``): a Lake project that depends on the Lean REPL (and
  Mathlib), run locally as ``lake env repl`` over stdin; or ``repl_command``, any command that
  starts the REPL.

Theorems come from ``data_path`` (jsonl/parquet, e.g. miniF2F exported by the user; schema below).
The default is ``envs/tools/lean/data/lean_theorems.jsonl``: 17 short competition-style statements
written for this project (Mathlib syntax, each with a tactic proof for the warm-start expert;
neither is machine-checked here, where no Lean runs).

RAGEN's rules, kept: each action is one tactic; the candidate proof is the imports, the preamble,
the statement and the accepted tactics plus the new one, each indented two spaces; the tactic is
accepted when Lean reports no error except "unsolved goals" and no ``sorry``; the proof succeeds
when there is no error at all and no ``sorry``. Reward per step: ``step_penalty`` (-0.1) +
``valid_step_reward`` (+1) or ``invalid_step_reward`` (-1), + ``success_reward`` (+10) on success, +
``timeout_penalty`` (-1) when Lean timed out, + ``max_steps_penalty`` (-2) when the step limit ends
the episode unsolved. The observation is RAGEN's render (step counters, informal statement, numbered
proof transcript of the last 40 lines, the last 5 steps with accepted/rejected marks, the last Lean
feedback).

Departures (each a RAGEN quirk): a blank tactic (whitespace only) is rejected like an empty one
without a check (RAGEN sent it, Lean saw the unchanged proof, and the blank "tactic" was accepted
for +0.9); every line of a multi-line tactic is indented (RAGEN indented only the first, which
breaks ``calc`` blocks and ``·`` cases); a statement ending in ``sorry`` has it removed and one
ending in ``:=`` gets ``by`` (RAGEN appended tactics after the ``sorry``); tactics longer than
``max_tactic_chars`` are rejected without a check; Lean messages shown in the observation are cut to
``message_truncate_limit`` characters (300; RAGEN's default 0 shows them whole) and at most 20 are
listed, so observations stay bounded; the step limit ends the episode as a truncation (Gymnasium's
time-limit flag; RAGEN's ``done``); an unreachable server raises
(:class:`envs.tools.lean.backends.LeanBackendError`: the runner ends that episode as an env error)
instead of scoring the tactic as rejected. Kept as RAGEN has it: a tactic that changes nothing
(``skip``) is accepted and earns +0.9, a reward a policy can farm until ``max_steps``.

Data file schema (one theorem per row):

* ``formal_statement`` (str, required): the Lean statement ending in ``:= by`` (or ``:= by sorry``,
  or ``:=``); leading ``import`` lines and a preamble (``open ...``, ``set_option ...``) are split
  off as RAGEN does.
* ``natural_language_statement`` or ``informal_statement`` (str, optional): shown in the
  observation.
* ``header`` / ``imports`` (str, optional): the import lines (miniF2F exports call it ``header``);
  otherwise the env's ``imports`` (default RAGEN's: Mathlib, Aesop, ``maxHeartbeats 0``, ``open
  BigOperators Real Nat Topology Rat``). ``preamble`` (str, optional).
* ``name`` or ``id`` (str, optional); ``proof`` (list of tactics or a string of tactic lines,
  optional): the expert's.
"""

from __future__ import annotations

import functools
import os
import shutil
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gymnasium import spaces

from envs.base import PromptSpec, TextEnv, bounded_int, check_file, read_rows, text_space
from envs.tools.lean.backends import (
    CheckResult,
    KiminaChecker,
    LeanBackendUnavailable,
    LeanMessage,
    ProofChecker,
    ReplChecker,
    SchemaError,
)

INSTRUCTION = (
    "You are a Lean theorem prover. Given a Lean theorem statement, propose a sequence of tactics that completes "
    "the proof. Think step by step about which tactics to apply next. Provide tactics separated by '||', for "
    "example <answer>intro || simp || rfl</answer>."
)
DEFAULT_IMPORTS = "import Mathlib\nimport Aesop\nset_option maxHeartbeats 0\nopen BigOperators Real Nat Topology Rat"
DEFAULT_DATA = Path(__file__).with_name("data") / "lean_theorems.jsonl"
SERVER_URL_VAR = "RAGEN_LEAN_SERVER_URL"
PROJECT_VAR = "RAGEN_LEAN_PROJECT"
MAX_MESSAGES = 20
PROOF_LINES = 40
LOG_STEPS = 5

# Characters a Lean observation may hold besides printable ASCII: the blocks Lean and Mathlib print
# (Latin-1, Greek, sub/superscripts, letterlike symbols, arrows, mathematical operators and symbols,
# the renderer's marks); any other character of a Lean message is shown as U+FFFD so observations
# stay inside the declared space.
_BLOCKS = (
    (0x00A0, 0x00FF),
    (0x0370, 0x03FF),
    (0x1D00, 0x1DBF),
    (0x2000, 0x206F),
    (0x2070, 0x209F),
    (0x2100, 0x214F),
    (0x2190, 0x21FF),
    (0x2200, 0x22FF),
    (0x2300, 0x23FF),
    (0x2500, 0x257F),
    (0x25A0, 0x25FF),
    (0x2700, 0x27BF),
    (0x27C0, 0x27EF),
    (0x27F0, 0x27FF),
    (0x2900, 0x297F),
    (0x2980, 0x29FF),
    (0x2A00, 0x2AFF),
    (0x1D400, 0x1D7FF),
)
LEAN_CHARS = "".join(chr(c) for lo, hi in _BLOCKS for c in range(lo, hi + 1)) + "\ufffd"
_PREAMBLE_KEYWORDS = ("theorem", "lemma", "def", "example", "instance")


@dataclass(frozen=True)
class Theorem:
    """One theorem: its Lean text in parts (as RAGEN splits it), the informal statement and an
    optional proof."""

    name: str
    imports: str | None  # None: the env's imports
    preamble: str
    statement: str
    informal: str = ""
    proof: tuple[str, ...] = ()


def split_formal(text: str) -> tuple[str, str, str]:
    """``(imports, preamble, body)`` of a Lean snippet: leading ``import`` lines, what precedes the
    first ``theorem``/``lemma``/``def``/``example``/``instance`` line, and the rest (RAGEN's
    split)."""
    imports, preamble, body = [], [], []
    for line in text.splitlines():
        stripped = line.strip()
        if body:
            body.append(line)
        elif stripped.startswith("import") and not preamble:
            imports.append(line)
        elif stripped.startswith(_PREAMBLE_KEYWORDS):
            body.append(line)
        elif stripped or preamble:
            preamble.append(line)
    return "\n".join(imports).strip(), "\n".join(preamble).strip(), "\n".join(body).strip()


def normalise_statement(body: str, where: str) -> str:
    """The statement ready for tactics: a trailing ``sorry`` removed, ``:=`` completed to ``:=
    by``."""
    text = body.rstrip()
    if text.endswith("sorry"):
        text = text[: -len("sorry")].rstrip()
    if text.endswith(":="):
        text += " by"
    if not text.endswith("by"):
        raise ValueError(
            f"{where}: formal_statement must end in ':= by' (a tactic proof), got ...{text[-40:]!r}"
        )
    return text


def _optional_str(row: dict, key: str, where: str) -> str | None:
    value = row.get(key)
    if value is not None and not isinstance(value, str):
        raise ValueError(f"{where}: {key!r} must be a string, got {type(value).__name__}")
    return value


def _row_to_theorem(row: Any, index: int, where: str) -> Theorem:
    if not isinstance(row, dict):
        raise SchemaError(f"{where}: expected an object, got {type(row).__name__}")
    formal = row.get("formal_statement")
    if not isinstance(formal, str) or not formal.strip():
        raise ValueError(f"{where}: 'formal_statement' must be a non-empty string")
    imports, preamble, body = split_formal(formal)
    if not body:
        raise ValueError(f"{where}: formal_statement has no theorem/lemma/example line")
    header = _optional_str(row, "header", where) or _optional_str(row, "imports", where)
    if header:  # a miniF2F-style header may hold opens too: split it the same way
        h_imports, h_preamble, _ = split_formal(header)
        imports = "\n".join(x for x in (h_imports, imports) if x)
        preamble = "\n".join(x for x in (h_preamble, preamble) if x)
    extra = _optional_str(row, "preamble", where)
    if extra:
        preamble = "\n".join(x for x in (preamble, extra.strip()) if x)
    informal = (
        _optional_str(row, "natural_language_statement", where)
        or _optional_str(row, "informal_statement", where)
        or ""
    )
    name = row.get("name", row.get("id", f"theorem_{index}"))
    proof = row.get("proof")
    if proof is None:
        proof = ()
    elif isinstance(proof, str):
        proof = tuple(line.strip() for line in proof.splitlines() if line.strip())
    elif isinstance(proof, list) and all(isinstance(t, str) and t.strip() for t in proof):
        proof = tuple(t.strip() for t in proof)
    else:
        raise ValueError(f"{where}: 'proof' must be a list of tactics or a string of tactic lines")
    return Theorem(
        str(name),
        imports or None,
        preamble,
        normalise_statement(body, where),
        informal.strip(),
        proof,
    )


@functools.lru_cache(maxsize=8)
def _load_cached(path: str, mtime_ns: int, size: int) -> tuple[Theorem, ...]:
    theorems = tuple(
        _row_to_theorem(row, i, where) for i, (row, where) in enumerate(read_rows(path))
    )
    if not theorems:
        raise ValueError(f"{path}: no theorems found")
    return theorems


def load_theorems(path: str | os.PathLike) -> tuple[Theorem, ...]:
    """Theorems from a ``.jsonl``/``.parquet`` file in the module docstring's schema (cached per
    path and modification time); errors name the file and line."""
    path = check_file(path, "data_path")
    stat = os.stat(path)
    return _load_cached(os.path.abspath(path), stat.st_mtime_ns, stat.st_size)


def make_checker(
    server_url: str | None = None,
    lean_project: str | os.PathLike | None = None,
    repl_command: Sequence[str] | None = None,
    *,
    request_timeout: float = 30.0,
    http_timeout: float = 60.0,
    max_retries: int = 3,
    api_key_env: str | None = None,
) -> ProofChecker:
    """The configured backend: a Kimina server when a URL is given (argument or
    ``$RAGEN_LEAN_SERVER_URL``), else a local REPL (``repl_command``, or ``lake env repl`` in
    ``lean_project`` / ``$RAGEN_LEAN_PROJECT``). Raises
    :class:`LeanBackendUnavailable` (one line naming the options) when there is none."""
    server_url = server_url or os.environ.get(SERVER_URL_VAR) or None
    if server_url:
        return KiminaChecker(
            server_url,
            timeout_s=request_timeout,
            http_timeout_s=http_timeout,
            max_retries=max_retries,
            api_key_env=api_key_env,
        )
    lean_project = lean_project or os.environ.get(PROJECT_VAR) or None
    if repl_command is not None or lean_project is not None:
        if repl_command is None and shutil.which("lake") is None:
            raise LeanBackendUnavailable(
                f"lean_project {os.fspath(lean_project)!r} is run with `lake env repl`, but `lake` is not on PATH "
                f"(install Lean with elan), or pass server_url (or set ${SERVER_URL_VAR}) for a Kimina Lean server"
            )
        command = list(repl_command) if repl_command is not None else ["lake", "env", "repl"]
        return ReplChecker(command, lean_project, timeout_s=request_timeout)
    raise LeanBackendUnavailable(
        f"ragen/Lean-v0 needs a Lean backend and has none: pass server_url (or set ${SERVER_URL_VAR}) for a Kimina "
        f"Lean server, or lean_project (or set ${PROJECT_VAR}) for a Lake project with the Lean REPL run by "
        f"`lake env repl`, or repl_command for any command that starts the REPL"
    )


class _TacticActions(spaces.Text):
    """The action space: a tactic. ``sample()`` draws at most 24 random characters (random tactics
    only need to be judged; thousands of characters per sample would slow random-agent tests
    down)."""

    def sample(self, mask: Any = None, probability: Any = None) -> str:
        if mask is None and probability is None:
            mask = (int(self.np_random.integers(0, 25)), None)
        return super().sample(mask=mask, probability=probability)


def _truncate(text: str, limit: int) -> str:
    text = text.strip()
    return text if limit <= 0 or len(text) <= limit else text[: limit - 3] + "..."


class LeanEnv(TextEnv):
    """Prove a Lean 4 theorem tactic by tactic; a Lean backend checks every candidate proof.

    ## Description At reset the seed draws a theorem of ``data_path`` (or ``options={"index": i}``
    picks one). Each step sends the whole file (imports, preamble, statement, accepted tactics, the
    new tactic) to the backend; an accepted tactic joins the proof, a rejected one does not.

    ## Action Space ``Text`` (printable ASCII plus Lean's symbols, up to ``max_tactic_chars``): one
    tactic. ``action_names`` is empty.

    ## Observation Space
    ``Text``: RAGEN's render (module docstring), e.g.::

        Steps taken: 1/100 | accepted tactics: 0
        <blank>
        Informal statement:
          Show that 2 + 2 = 4.
        <blank>
        Proof transcript:
            1 | import Mathlib
          ...
        Proof log (latest 5 steps):
          01. linarith [✗ rejected]
        <blank>
        Last Lean feedback:
          accepted: False
          messages:
        01. [ERROR 7:2 → 7:10] linarith failed to find a contradiction

    ## Rewards RAGEN's: -0.1 per step, +1 accepted / -1 rejected, +10 proof complete, -1 Lean
    timeout, -2 at ``max_steps`` unsolved (all settable).

    ## Episode End Terminated when the proof is complete; truncated after ``max_steps`` tactics.
    Stepping after the end returns the last observation, reward 0.0, the same flags and
    ``action_is_valid=False``.

    ## Info ``success`` (proof complete), ``action_is_valid`` and ``action_is_effective`` (the
    tactic was accepted, RAGEN's), ``accepted``, ``timed_out``, ``status`` (the backend's: valid,
    sorry, lean_error, repl_error, timeout, server_error, or ``invalid`` for a tactic rejected
    unchecked), ``messages`` (the formatted Lean messages), ``lean_time`` (seconds Lean reported).

    ## Arguments
    - ``data_path``: theorem file (module docstring); default
      ``envs/tools/lean/data/lean_theorems.jsonl``.
    - ``server_url``, ``lean_project``, ``repl_command``, ``api_key_env``: the backend (module
      docstring,
      :func:`make_checker`); ``checker``: a ready :class:`~envs.tools.lean.backends.ProofChecker`
      instead.
    - ``request_timeout`` (30 s of Lean per proof), ``http_timeout`` (60 s), ``max_retries`` (3):
      RAGEN's.
    - ``max_steps`` (100), ``step_penalty``, ``valid_step_reward``, ``invalid_step_reward``,
      ``success_reward``, ``timeout_penalty``, ``max_steps_penalty``: RAGEN's defaults.
    - ``imports``: the import header for theorems without one (RAGEN's ``default_imports``).
    - ``message_truncate_limit`` (300; 0 keeps messages whole), ``max_tactic_chars`` (2000).
    - ``render_mode``: ``None`` or ``"ansi"``.
    """

    def __init__(
        self,
        data_path: str | os.PathLike | None = None,
        server_url: str | None = None,
        lean_project: str | os.PathLike | None = None,
        repl_command: Sequence[str] | None = None,
        api_key_env: str | None = None,
        checker: ProofChecker | None = None,
        request_timeout: float = 30.0,
        http_timeout: float = 60.0,
        max_retries: int = 3,
        max_steps: int = 100,
        step_penalty: float = -0.1,
        valid_step_reward: float = 1.0,
        invalid_step_reward: float = -1.0,
        success_reward: float = 10.0,
        timeout_penalty: float = -1.0,
        max_steps_penalty: float = -2.0,
        imports: str = DEFAULT_IMPORTS,
        message_truncate_limit: int = 300,
        max_tactic_chars: int = 2000,
        render_mode: str | None = None,
    ):
        super().__init__(render_mode=render_mode)
        max_steps = bounded_int("LeanEnv", "max_steps", max_steps, 1)
        max_tactic_chars = bounded_int("LeanEnv", "max_tactic_chars", max_tactic_chars, 1)
        message_truncate_limit = bounded_int(
            "LeanEnv", "message_truncate_limit", message_truncate_limit, 0
        )
        self.theorems = load_theorems(DEFAULT_DATA if data_path is None else data_path)
        self.checker = (
            checker
            if checker is not None
            else make_checker(
                server_url,
                lean_project,
                repl_command,
                request_timeout=request_timeout,
                http_timeout=http_timeout,
                max_retries=max_retries,
                api_key_env=api_key_env,
            )
        )
        self.max_steps, self.max_tactic_chars, self.message_truncate_limit = (
            max_steps,
            max_tactic_chars,
            message_truncate_limit,
        )
        self.step_penalty, self.valid_step_reward, self.invalid_step_reward = (
            step_penalty,
            valid_step_reward,
            invalid_step_reward,
        )
        self.success_reward, self.timeout_penalty, self.max_steps_penalty = (
            success_reward,
            timeout_penalty,
            max_steps_penalty,
        )
        self.imports = imports
        self._charset = text_space(LEAN_CHARS).character_set
        data_chars = "".join(
            sorted(
                {
                    c
                    for t in self.theorems
                    for c in t.statement + t.informal + t.preamble + (t.imports or "")
                }
                - set(self._charset)
            )
        )
        self.observation_space = text_space(LEAN_CHARS + data_chars, max_length=1 << 17)
        self._charset = self.observation_space.character_set
        self.action_space = _TacticActions(
            min_length=0, max_length=max_tactic_chars, charset=text_space().character_set
        )
        self.theorem: Theorem | None = None
        self.tactics: list[str] = []
        self.proof_log: list[tuple[str, bool]] = []
        self.last: CheckResult | None = None
        self.num_steps = 0
        self._done = (False, False)

    def prompt_spec(self) -> PromptSpec:
        return PromptSpec(instruction=INSTRUCTION)

    # ----------------------------------------------------------------------------------------------
    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str, dict]:
        super().reset(seed=seed)
        options = self._reset_options(options, ("index",))
        index = options.get("index")
        if index is None:
            index = int(self.np_random.integers(len(self.theorems)))
        else:
            index = bounded_int("LeanEnv", "options['index']", index, 0, len(self.theorems) - 1)
        self.theorem = self.theorems[index]
        self.tactics, self.proof_log, self.last = [], [], None
        self.num_steps = 0
        self._done = (False, False)
        return self._render_text(), {
            "success": False,
            "action_is_valid": True,
            "action_is_effective": False,
        }

    def proof_text(self, tactics: Sequence[str] | None = None) -> str:
        """The Lean file for ``tactics`` (default: the accepted ones): imports, preamble, statement,
        indented tactics."""
        t = self.theorem
        parts = [t.imports if t.imports is not None else self.imports, t.preamble]
        lines = [line for part in parts if part for line in (*part.strip().splitlines(), "")]
        lines += t.statement.splitlines()
        for tactic in self.tactics if tactics is None else tactics:
            lines += ["  " + line if line.strip() else "" for line in tactic.splitlines()]
        return "\n".join(lines) + "\n"

    def step(self, action: Any) -> tuple[str, float, bool, bool, dict]:
        if self.theorem is None:
            raise RuntimeError("LeanEnv: call reset() before step()")
        if any(self._done):
            return (
                self._render_text(),
                0.0,
                *self._done,
                {"success": False, "action_is_valid": False, "action_is_effective": False},
            )
        tactic = textwrap.dedent(action).strip() if isinstance(action, str) else ""
        result, status = self._check(tactic)
        accepted, success = (
            status != "invalid" and result.accepted,
            status != "invalid" and result.complete,
        )
        timed_out = status == "timeout"
        self.last = result
        self.num_steps += 1
        if accepted:
            self.tactics.append(tactic)
        self.proof_log.append((tactic if isinstance(action, str) else repr(action)[:80], accepted))
        truncated = not success and self.num_steps >= self.max_steps
        reward = self._reward(accepted, success, timed_out, truncated)
        self._done = (success, truncated)
        info = {
            "success": success,
            "action_is_valid": accepted,
            "action_is_effective": accepted,
            "accepted": accepted,
            "timed_out": timed_out,
            "status": status,
            "messages": tuple(self._format_messages(result.messages, "")),
            "lean_time": float(result.time),
        }
        return self._render_text(), float(reward), success, truncated, info

    def _check(self, tactic: str) -> tuple[CheckResult, str]:
        """The checker's answer for the proof so far followed by ``tactic``, and its status;
        ``"invalid"`` without asking the checker when the tactic is empty or longer than
        ``max_tactic_chars``."""
        if not tactic:
            message = "Empty tactic is not allowed."
        elif len(tactic) > self.max_tactic_chars:
            message = f"Tactic longer than {self.max_tactic_chars} characters is not allowed."
        else:
            result = self.checker.check(self.proof_text([*self.tactics, tactic]))
            return result, result.status
        return CheckResult("invalid", (LeanMessage("error", message),)), "invalid"

    def _reward(self, accepted: bool, success: bool, timed_out: bool, truncated: bool) -> float:
        """One step's reward: the step penalty, the valid or invalid step reward, and the success
        reward, timeout penalty and max-steps penalty when they apply."""
        reward = self.step_penalty + (
            self.valid_step_reward if accepted else self.invalid_step_reward
        )
        if success:
            reward += self.success_reward
        if timed_out:
            reward += self.timeout_penalty
        if truncated:
            reward += self.max_steps_penalty
        return reward

    # ----------------------------------------------------------------------------------------------
    def _clean(self, text: str) -> str:
        """``text`` with characters outside the observation space shown as U+FFFD."""
        return "".join(c if c in self._charset else "\ufffd" for c in text)

    def _format_messages(self, messages: Sequence[LeanMessage], indent: str = "  ") -> list[str]:
        """RAGEN's ``NN. [SEVERITY line:col → line:col] data`` lines ("UNSOLVED GOALS" for unsolved
        goals)."""
        if not messages:
            return [f"{indent}(no Lean messages)"]
        lines = []
        for i, m in enumerate(messages[:MAX_MESSAGES], start=1):
            severity = "UNSOLVED GOALS" if m.unsolved_goals else m.severity.upper()
            where = " → ".join(f"{p[0]}:{p[1]}" for p in (m.pos, m.end_pos) if p is not None)
            head = f"{indent}{i:02d}. [{severity}{' ' + where if where else ''}]"
            lines.append(f"{head} {_truncate(m.data, self.message_truncate_limit)}".rstrip())
        if len(messages) > MAX_MESSAGES:
            lines.append(f"{indent}... ({len(messages) - MAX_MESSAGES} more messages)")
        return lines

    def _render_text(self) -> str:
        if self.theorem is None:
            return "Lean environment not initialised."
        lines = [
            f"Steps taken: {self.num_steps}/{self.max_steps} | accepted tactics: {len(self.tactics)}",
            "",
            "Informal statement:",
        ]
        informal = textwrap.wrap(self.theorem.informal, width=88)
        lines += [f"  {line}" for line in informal] or ["  (not provided)"]
        lines += ["", "Proof transcript:"]
        proof = self.proof_text().rstrip("\n").splitlines()
        start = max(0, len(proof) - PROOF_LINES)
        width = max(3, len(str(len(proof))))
        if start:
            lines.append(f"  ... ({start} earlier lines omitted)")
        lines += [f"  {start + i + 1:>{width}} | {line}" for i, line in enumerate(proof[start:])]
        if self.proof_log:
            lines += ["", f"Proof log (latest {LOG_STEPS} steps):"]
            first = max(0, len(self.proof_log) - LOG_STEPS)
            if first:
                lines.append(f"  ... ({first} earlier steps omitted)")
            for i, (tactic, ok) in enumerate(self.proof_log[first:], start=first + 1):
                shown = _truncate(tactic.replace("\n", " "), 200)
                lines.append(f"  {i:02d}. {shown} [{'✓ accepted' if ok else '✗ rejected'}]")
        if self.last is not None:
            accepted = self.last.status != "invalid" and self.last.accepted
            lines += ["", "Last Lean feedback:", f"  accepted: {accepted}", "  messages:"]
            lines += self._format_messages(self.last.messages, "")
        return self._clean("\n".join(lines))

    # ----------------------------------------------------------------------------------------------
    def expert_turn(self, max_actions: int) -> tuple[str, tuple[str, ...]]:
        """The warm start's expert: the next tactics of the theorem's ``proof`` (after those already
        accepted)."""
        if self.theorem is None or not self.theorem.proof:
            raise ValueError(
                "LeanEnv: this theorem has no 'proof' in the data file, so there is no expert answer"
            )
        done = len(self.tactics)
        if tuple(self.tactics) != self.theorem.proof[:done] or done >= len(self.theorem.proof):
            raise ValueError(
                "LeanEnv: the accepted tactics left the data file's proof; the expert cannot continue"
            )
        nxt = self.theorem.proof[done : done + max(1, max_actions)]
        return f"{done} tactics accepted; next {nxt[0].split()[0]}", nxt

    def close(self) -> None:
        self.checker.close()


__all__ = [
    "DEFAULT_IMPORTS",
    "INSTRUCTION",
    "LeanEnv",
    "Theorem",
    "load_theorems",
    "make_checker",
    "normalise_statement",
    "split_formal",
]
