"""Run untrusted Python (a model's candidate code) in a fresh interpreter, isolated and bounded.

Every :meth:`Sandbox.run` starts a new interpreter in a new temporary directory and removes the
directory afterwards. The isolation comes from bubblewrap (``bwrap``, Debian package
``bubblewrap``): new mount, PID, network, IPC and UTS namespaces, a root file system that holds only
the system's ``/usr`` (and ``/lib*``, ``/bin``), the interpreter's own prefix, read-only, and
``/sandbox`` as the run's directory: a private tmpfs of at most ``disk_bytes`` holding the run's
input files (read-only) and its requested output files (each bound to a host file, so at most
``file_size_bytes`` each reach the host's disk); ``/tmp`` is another tmpfs of at most
``disk_bytes``. So the code sees none of the host's files, has no network interface but loopback,
and cannot signal or even see a host process. ``--die-with-parent`` and the PID namespace make the
kernel kill every process of the run when the run ends: when the run's first process exits, is
killed by a limit or by the wall-clock timeout. bubblewrap itself exits as soon as the first process
does, while the namespace's init may still be taking the others down, so a run returns only once its
namespace is empty (its init, named by ``--json-status-fd``, is dead). Nested user namespaces are
refused (``--disable-userns`` when bubblewrap makes one) and, on x86_64, a seccomp filter
(:mod:`envs.tools.code._seccomp`) answers EPERM to namespace, mount, ptrace, keyring, bpf and perf
system calls.

Resource limits (``setrlimit``, per process, inherited by children): CPU seconds (``RLIMIT_CPU``:
SIGXCPU then SIGKILL), address space (``RLIMIT_AS``: an allocation without bound gets
``MemoryError``), file size (``RLIMIT_FSIZE``: SIGXFSZ; this also bounds stdout and stderr, which go
to files), open files and processes (``RLIMIT_NPROC``). ``RLIMIT_NPROC`` counts every process of the
calling user and the kernel does not apply it to root at all, so when the host runs as root (CI
does) each run gets a user id of its own (an unused id above 1,500,000,000): the candidate runs as
that unprivileged user with no capabilities, and the limit counts exactly the run's processes (a
fork bomb stops at ``max_processes``). As another user, bubblewrap also unshares the user namespace
and the limit is that user's current process count plus ``max_processes`` (approximate: other
processes of the user come and go). A wall-clock limit kills whatever is left (a loop blocked in
``sleep`` uses no CPU).

Without ``bwrap`` on the PATH, :class:`Sandbox` refuses to run unless it was built with
``allow_unsandboxed=True``; the candidate then runs in a plain subprocess with the same resource
limits in its own temporary directory, but it can read the host's files and use the network (for
trusted code and machines without bubblewrap only).

This module imports only the standard library and :mod:`envs.base`.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from envs.base import bounded_int
from envs.tools.code import _seccomp

BWRAP = "bwrap"
SANDBOX_DIR = "/sandbox"
UNSANDBOXED_FLAG = "allow_unsandboxed"
MISSING_BWRAP = (
    f"refusing to run candidate code unsandboxed: bubblewrap ('{BWRAP}') is not on the PATH; install "
    f"it (apt-get install bubblewrap) or set {UNSANDBOXED_FLAG}: true to run without isolation"
)
# Per-run user ids when the host is root: far above any real account, one per run of this process.
_UID_BASE = 1_500_000_000
_uid_counter = itertools.count()
_uid_lock = threading.Lock()


class SandboxUnavailable(RuntimeError):
    """bubblewrap is missing and unsandboxed runs were not allowed."""


@dataclass(frozen=True)
class Limits:
    """Resource limits of one run.

    Args:
        cpu_seconds: CPU time of each process (``RLIMIT_CPU``, whole seconds, at least 1).
        wall_seconds: wall-clock time of the whole run; then every process of the run is killed.
        memory_bytes: address space of each process (``RLIMIT_AS``).
        max_processes: processes (and threads) the run may have at once, its main program included
            (``RLIMIT_NPROC``, see the module docstring).
        file_size_bytes: largest file a process may write, stdout and stderr included
        (``RLIMIT_FSIZE``). open_files: file descriptors per process (``RLIMIT_NOFILE``).
        disk_bytes: size of each of the run's tmpfs file systems (``/sandbox`` and ``/tmp``), which
        bounds what
            the run may write in total (they live in memory); sandboxed runs only.
    """

    cpu_seconds: int = 2
    wall_seconds: float = 4.0
    memory_bytes: int = 512 * 2**20
    max_processes: int = 16
    file_size_bytes: int = 2**20
    open_files: int = 64
    disk_bytes: int = 64 * 2**20

    def __post_init__(self) -> None:
        for name in (
            "cpu_seconds",
            "max_processes",
            "open_files",
            "memory_bytes",
            "file_size_bytes",
            "disk_bytes",
        ):
            object.__setattr__(self, name, bounded_int("Limits", name, getattr(self, name), 1))
        if not (
            isinstance(self.wall_seconds, (int, float)) and 0 < self.wall_seconds < float("inf")
        ):
            raise ValueError(
                f"Limits.wall_seconds must be a finite number > 0, got {self.wall_seconds!r}"
            )
        if self.memory_bytes < 64 * 2**20:
            raise ValueError(
                f"Limits.memory_bytes must be >= 64 MiB (an interpreter needs it), got {self.memory_bytes}"
            )


@dataclass(frozen=True)
class RunResult:
    """What one run left behind.

    Attributes:
        returncode: the interpreter's exit status (negative: killed by that signal; bubblewrap reports a signal
            death as ``128 + signal``), None when the wall-clock limit killed the run.
        stdout, stderr: what the program wrote (at most ``file_size_bytes`` each), decoded as UTF-8
        with replacement. timed_out: the wall-clock limit was reached. files: the text of the
        requested output files the run left in its directory (missing ones are absent). seconds:
        wall-clock duration.
    """

    returncode: int | None
    stdout: str
    stderr: str
    timed_out: bool
    files: dict[str, str]
    seconds: float


def bwrap_path() -> str | None:
    """The bubblewrap executable, or None."""
    return shutil.which(BWRAP)


def _interpreter() -> tuple[str, str]:
    """``(python executable, its installation prefix)`` with symbolic links resolved (a venv's
    ``bin/python`` is a link to the base interpreter; the sandbox gets the base installation, not
    the venv)."""
    exe = os.path.realpath(sys.executable)
    prefix = os.path.realpath(sys.base_prefix)
    return exe, prefix


def _system_mounts(prefix: str) -> list[str]:
    """bwrap arguments giving the sandbox the system's programs and libraries, read-only
    (merged-/usr layouts keep ``/bin`` and ``/lib*`` as links into ``/usr``)."""
    args = ["--ro-bind", "/usr", "/usr"]
    for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        if os.path.islink(top):
            args += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            args += ["--ro-bind", top, top]
    if not (prefix == "/usr" or prefix.startswith("/usr/")):
        # bwrap would create the prefix's parents with the host's modes (/root is 0700): make them
        # traversable
        parents = [p for p in Path(prefix).parents if str(p) != "/"]
        for parent in reversed(parents):
            args += ["--perms", "0755", "--dir", str(parent)]
        args += ["--ro-bind", prefix, prefix]
    return args


def _user_process_count(uid: int) -> int:
    """Processes (thread groups) owned by ``uid`` right now, from /proc."""
    count = 0
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                if os.stat(entry.path).st_uid == uid:
                    count += 1
            except OSError:
                continue
    return count


def _kill_uid(uid: int) -> None:
    """SIGKILL every process of ``uid`` (a per-run id: only the run's own processes). A safety net:
    the PID namespace normally takes them down with the run."""
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                if os.stat(entry.path).st_uid == uid:
                    os.kill(int(entry.name), signal.SIGKILL)
            except (OSError, ValueError):
                continue


def _await_namespace_end(status: Path, seconds: float = 10.0) -> None:
    """Return once the run's PID namespace is empty. ``status`` holds bubblewrap's
    ``--json-status-fd`` documents; the first names the namespace's init (its host pid) and the
    namespace. bubblewrap has exited by now; its init is killed (``--die-with-parent`` already sends
    it SIGKILL, which may still be on its way) and awaited: the kernel empties a PID namespace
    before its init becomes a zombie. Nothing to wait for when bubblewrap failed before starting the
    run."""
    try:
        first = json.loads(status.read_text().split("\n", 1)[0])
        pid, link = int(first["child-pid"]), f"pid:[{int(first['pid-namespace'])}]"
    except (OSError, ValueError, KeyError, TypeError):
        return
    deadline = time.monotonic() + seconds
    while True:
        try:  # the namespace link guards against a reused pid
            if os.readlink(f"/proc/{pid}/ns/pid") != link:
                return
            if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] in ("Z", "X"):
                _reap_if_ours(pid)
                return
            os.kill(pid, signal.SIGKILL)
        except (OSError, IndexError):
            return  # gone (or reaped) already
        # the kernel has not run the kill yet (an uninterruptible wait)
        if time.monotonic() > deadline:
            warnings.warn(
                f"the sandbox's PID namespace (init pid {pid}) did not end within {seconds:g} s of its "
                "run; returning with it still ending",
                RuntimeWarning,
                stacklevel=3,
            )
            return
        time.sleep(0.002)


def _reap_if_ours(pid: int) -> None:
    """Reap the dead init when it was reparented to this process: it is when this process is PID 1
    (``python main.py fit`` as a container's command) or a child subreaper; otherwise nobody here
    would, and each run would leave a zombie holding a pid."""
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


# The first program of a run (trusted, ours): it sets the resource limits, drops to the run's user
# id when the host is root (the process limit already set, so the candidate can never exceed it),
# and replaces itself with the interpreter running the candidate. Limits are set here rather than in
# a ``preexec_fn``, which is unsafe in a process with threads (the rollout may step envs from a
# thread pool).
_LAUNCHER = (
    "import json,os,resource as r,sys\n"
    "c=json.loads(sys.argv[1])\n"
    "for k,v in (('CPU',c['cpu']),('AS',c['mem']),('FSIZE',c['fsize']),('NOFILE',c['nofile']),('CORE',0)):\n"
    " r.setrlimit(getattr(r,'RLIMIT_'+k),(v,v+1 if k=='CPU' else v))\n"
    "r.setrlimit(r.RLIMIT_NPROC,(c['nproc'],c['nproc']))\n"
    "if c['uid'] is not None:\n"
    " os.setgroups([]);os.setgid(c['uid']);os.setuid(c['uid'])\n"
    "os.execv(sys.argv[2],sys.argv[2:])\n"
)


def _stage_files(
    host: str,
    sandboxed: bool,
    program: str,
    stdin: str,
    files: dict[str, str],
    outputs: tuple[str, ...],
) -> tuple[str, str, int | None]:
    """Lay a run's files out under its temporary directory ``host`` and return ``(work, out,
    uid)``: ``work`` holds ``main.py`` (``program``) and ``files``, ``host/stdin`` the standard
    input; sandboxed, each of ``outputs`` is an empty file in ``out`` (bound into the sandbox), and
    when the host runs as root the run gets a user id of its own (module docstring) that owns
    ``work`` and the output files. Unsandboxed, ``out`` is ``work`` and ``uid`` None."""
    # the candidate's directory; stdin/stdout/stderr live beside it
    work = os.path.join(host, "work")
    # sandboxed: the output files bound in
    out = os.path.join(host, "out") if sandboxed else work
    os.mkdir(work)
    os.makedirs(out, exist_ok=True)
    for name, text in {"main.py": program, **files}.items():
        Path(work, name).write_text(text, encoding="utf-8")
    Path(host, "stdin").write_text(stdin, encoding="utf-8")
    uid = None
    if os.geteuid() == 0 and sandboxed:
        with _uid_lock:
            uid = _UID_BASE + (os.getpid() % 2_000_000) * 1000 + next(_uid_counter) % 1000
        os.chown(work, uid, uid)
    for name in outputs if sandboxed else ():
        Path(out, name).touch()
        if uid is not None:
            os.chown(Path(out, name), uid, uid)
    return work, out, uid


def _sandbox_binds(
    work: str,
    out: str,
    files: dict[str, str],
    outputs: tuple[str, ...],
    seccomp_fd: int | None,
) -> list[str]:
    """bubblewrap's arguments that put a run's files into :data:`SANDBOX_DIR`: ``main.py`` and
    ``files`` read-only, each of ``outputs`` writable (bound to its host file in ``out``), and the
    seccomp filter read from ``seccomp_fd`` when there is one."""
    return [
        *(
            a
            for name in ["main.py", *files]
            for a in ("--ro-bind", f"{work}/{name}", f"{SANDBOX_DIR}/{name}")
        ),
        *(a for name in outputs for a in ("--bind", f"{out}/{name}", f"{SANDBOX_DIR}/{name}")),
        *(["--seccomp", str(seccomp_fd)] if seccomp_fd is not None else []),
    ]


class Sandbox:
    """Runs Python programs under :class:`Limits`, isolated by bubblewrap (see the module
    docstring).

    Args:
        limits: the resource limits of each run.
        allow_unsandboxed: run without bubblewrap when it is missing (resource limits only; no
        isolation from the
            host's files or network). False (default): such a run raises :class:`SandboxUnavailable`.
    """

    def __init__(self, limits: Limits | None = None, allow_unsandboxed: bool = False):
        self.limits = limits or Limits()
        self.allow_unsandboxed = bool(allow_unsandboxed)
        self.python, self.prefix = _interpreter()

    @property
    def isolated(self) -> bool:
        """True when runs are isolated by bubblewrap."""
        return bwrap_path() is not None

    def run(
        self,
        program: str,
        *,
        stdin: str = "",
        files: Mapping[str, str] | None = None,
        outputs: tuple[str, ...] = (),
    ) -> RunResult:
        """Run ``program`` (Python source) as ``__main__`` in a fresh interpreter.

        Args:
            program: the source of the main program.
            stdin: text on its standard input.
            files: more files to place in its directory (name -> text), e.g. a candidate module.
            outputs: names of files to read back from its directory after the run (each at most
                ``file_size_bytes``).

        Raises :class:`SandboxUnavailable` when bubblewrap is missing and unsandboxed runs are not
        allowed.
        """
        bwrap = bwrap_path()
        if bwrap is None and not self.allow_unsandboxed:
            raise SandboxUnavailable(MISSING_BWRAP)
        files = dict(files or {})
        for name in [*files, *outputs]:
            if not name or "/" in name or name.startswith(".") or name == "main.py":
                raise ValueError(
                    f"sandbox file names are plain names other than main.py, got {name!r}"
                )
        host = tempfile.mkdtemp(prefix="ragen-sandbox-")
        seccomp = None
        try:
            if bwrap is not None and (program_bytes := _seccomp.program()) is not None:
                # bubblewrap reads the filter from this pipe (it fits the pipe's buffer)
                seccomp = os.pipe()
                os.write(seccomp[1], program_bytes)
                os.close(seccomp[1])
            return self._run_in(host, bwrap, program, stdin, files, outputs, seccomp and seccomp[0])
        finally:
            if seccomp is not None:
                os.close(seccomp[0])
            shutil.rmtree(host, ignore_errors=True)

    def _run_in(
        self,
        host: str,
        bwrap: str | None,
        program: str,
        stdin: str,
        files: dict[str, str],
        outputs: tuple[str, ...],
        seccomp_fd: int | None,
    ) -> RunResult:
        """Run ``program`` with its temporary directory ``host``: lay the run's files out
        (:func:`_stage_files`), build the launcher's command line (:meth:`_command`), wrap it in
        bubblewrap unless ``bwrap`` is None, and execute it (:meth:`_execute`)."""
        work, out, uid = _stage_files(host, bwrap is not None, program, stdin, files, outputs)
        command = self._command(uid)
        # unsandboxed: the host's view of the files (so no drop to an id that could read none of
        # them)
        argv = (
            command
            if bwrap is None
            else self._bwrap_argv(
                bwrap,
                os.geteuid() == 0,
                work,
                command,
                _sandbox_binds(work, out, files, outputs, seccomp_fd),
            )
        )
        return self._execute(
            argv, host, work, out, uid, outputs, seccomp_fd, isolated=bwrap is not None
        )

    def _command(self, uid: int | None) -> list[str]:
        """The command line of a run: the launcher (:data:`_LAUNCHER`, given the resource limits
        and the user id to drop to as JSON) as the main program, which then runs ``main.py``."""
        limits = self.limits
        # isolated mode: no user site, no PYTHON* variables; no .pyc
        interpreter = [self.python, "-I", "-B"]
        # the launcher becomes the main program; bwrap's init runs as root
        nproc = limits.max_processes
        if uid is None:  # the limit counts every process of the user (see the module docstring)
            nproc += _user_process_count(os.getuid())
        config = json.dumps(
            {
                "cpu": limits.cpu_seconds,
                "mem": limits.memory_bytes,
                "fsize": limits.file_size_bytes,
                "nofile": limits.open_files,
                "nproc": nproc,
                "uid": uid,
            }
        )
        return [*interpreter, "-S", "-c", _LAUNCHER, config, *interpreter, "main.py"]

    def _execute(
        self,
        argv: list[str],
        host: str,
        work: str,
        out: str,
        uid: int | None,
        outputs: tuple[str, ...],
        seccomp_fd: int | None,
        *,
        isolated: bool,
    ) -> RunResult:
        """Start ``argv``, wait at most the wall-clock limit, kill what is left (:meth:`_terminate`,
        then the namespace: :func:`_await_namespace_end`) and read the run's outputs back."""
        limits = self.limits
        start = time.monotonic()
        timed_out = False
        with (
            open(Path(host, "stdin"), "rb") as fin,
            open(Path(host, "stdout"), "wb") as fout,
            open(Path(host, "stderr"), "wb") as ferr,
        ):
            # bubblewrap names the namespace's init in this file (see _await_namespace_end); only
            # the child keeps it
            status_fd = (
                os.open(Path(host, "status.json"), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                if isolated
                else None
            )
            try:
                if status_fd is not None:
                    argv = [argv[0], "--json-status-fd", str(status_fd), *argv[1:]]
                passed = tuple(fd for fd in (seccomp_fd, status_fd) if fd is not None)
                proc = subprocess.Popen(
                    argv,
                    stdin=fin,
                    stdout=fout,
                    stderr=ferr,
                    cwd=work,
                    start_new_session=True,
                    close_fds=True,
                    pass_fds=passed,
                    env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"},
                )
            finally:
                if status_fd is not None:
                    os.close(status_fd)
            try:
                returncode: int | None = proc.wait(timeout=limits.wall_seconds)
            except subprocess.TimeoutExpired:
                timed_out = True
                returncode = None
            finally:
                self._terminate(proc, uid)
                if isolated:
                    _await_namespace_end(Path(host, "status.json"))
        seconds = time.monotonic() - start
        cap = limits.file_size_bytes
        read = {name: _read_capped(Path(out, name), cap) for name in outputs}
        return RunResult(
            returncode=returncode,
            stdout=_read_capped(Path(host, "stdout"), cap) or "",
            stderr=_read_capped(Path(host, "stderr"), cap) or "",
            timed_out=timed_out,
            files={k: v for k, v in read.items() if v is not None},
            seconds=seconds,
        )

    def _bwrap_argv(
        self, bwrap: str, as_root: bool, work: str, command: list[str], binds: list[str]
    ) -> list[str]:
        """The bubblewrap command line that runs ``command`` in :data:`SANDBOX_DIR` (module
        docstring: the namespaces, the read-only system mounts, size-bounded tmpfs ``/sandbox`` and
        ``/tmp``, ``binds`` (the run's files, the seccomp filter), a clean environment)."""
        if as_root:
            # no user namespace: the launcher must really setuid (kernel-counted processes of a real
            # uid)
            ns = [
                "--unshare-ipc",
                "--unshare-pid",
                "--unshare-net",
                "--unshare-uts",
                "--unshare-cgroup-try",
                "--cap-add",
                "CAP_SETUID",
                "--cap-add",
                "CAP_SETGID",
            ]
        else:
            ns = ["--unshare-all", "--unshare-user", "--disable-userns"]
        size = str(self.limits.disk_bytes)
        return [
            bwrap,
            *ns,
            "--die-with-parent",
            "--new-session",
            *_system_mounts(self.prefix),
            "--proc",
            "/proc",
            "--dev",
            "/dev",
            "--size",
            size,
            "--perms",
            "01777",
            "--tmpfs",
            "/tmp",
            "--size",
            size,
            "--perms",
            "01777",
            "--tmpfs",
            SANDBOX_DIR,
            *binds,
            "--chdir",
            SANDBOX_DIR,
            "--hostname",
            "sandbox",
            "--clearenv",
            "--setenv",
            "PATH",
            "/usr/bin:/bin",
            "--setenv",
            "HOME",
            SANDBOX_DIR,
            "--setenv",
            "LANG",
            "C.UTF-8",
            "--",
            *command,
        ]

    @staticmethod
    def _terminate(proc: subprocess.Popen, uid: int | None) -> None:
        """Kill what is left of a run: bwrap's process group (its sandbox dies with it), then the
        run's user id."""
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()
        else:
            try:  # an unsandboxed run's children may outlive their parent in its session
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        if uid is not None:
            _kill_uid(uid)


def _read_capped(path: Path, cap: int) -> str | None:
    """The text of ``path`` (at most ``cap`` bytes, UTF-8 with replacement), None when it is missing
    or not a regular file (a candidate may leave a link or a directory under an output's name)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        with os.fdopen(fd, "rb", closefd=False) as f:
            return f.read(cap).decode("utf-8", errors="replace")
    finally:
        os.close(fd)
