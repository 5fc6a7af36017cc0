"""The sandbox contains hostile candidate code: reading or writing outside its directory, opening
sockets, forking without bound, looping forever and allocating without bound are each scored 0 by
the DeepCoder judge within the limits, and leave the host as it was (the file outside untouched, no
process left behind).

Limits are small (1 CPU second, 3 s wall clock, 256 MiB) so each case takes at most a few seconds on
a loaded machine. These tests need bubblewrap (the README's first line installs it; CI runs as
root).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
from pathlib import Path

import pytest

from envs.tools.code import sandbox as sandbox_module
from envs.tools.code.env import judge
from envs.tools.code.problems import Problem
from envs.tools.code.sandbox import MISSING_BWRAP, Limits, Sandbox, SandboxUnavailable

LIMITS = Limits(cpu_seconds=1, wall_seconds=3.0, memory_bytes=256 * 2**20, max_processes=8)
# seconds beyond the wall-clock limit for starting and tearing down a run on a loaded machine
SLACK = 3.0


@pytest.fixture(scope="module")
def box() -> Sandbox:
    assert sandbox_module.bwrap_path() is not None, (
        "bubblewrap is not installed: apt-get install bubblewrap"
    )
    return Sandbox(LIMITS)


def problem(expected_return: object, inputs: tuple = ((),)) -> Problem:
    """A one-test function problem: ``f()`` must return ``expected_return``."""
    return Problem(
        "return it", "function", "f", inputs, (json.dumps(expected_return),) * len(inputs), None
    )


def processes_with(marker: str) -> list[int]:
    """Host pids whose command line contains ``marker``."""
    found = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                if marker.encode() in Path(entry.path, "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def test_a_correct_candidate_passes_and_sees_only_its_directory(box):
    code = "import os\ndef f():\n    return sorted(os.listdir('.'))\n"
    # the harness's own files are all it finds: solution, harness (main.py), arguments, function
    # name, results
    verdict = judge(
        problem(["cases.json", "fn.json", "main.py", "results.jsonl", "solution.py"]), code, box
    )
    assert (verdict.passed, verdict.total) == (1, 1)


def test_reading_a_host_file_is_contained(box, tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("hunter2")
    code = f"def f():\n    return open({str(secret)!r}).read()\n"
    verdict = judge(problem("hunter2"), code, box)  # it would pass if it could read the file
    assert verdict.passed == 0 and "FileNotFoundError" in verdict.note
    # the host's project files are not there either
    code = "def f():\n    return open('/work/main/README.md').read()[:1]\n"
    assert judge(problem("#"), code, box).passed == 0


def test_writing_outside_is_contained_and_the_host_file_is_untouched(box, tmp_path):
    target = tmp_path / "keep.txt"
    target.write_text("original")
    before = target.stat().st_mtime_ns
    code = (
        f"def f():\n    for p in ({str(target)!r}, '/usr/evil.txt', '/keep.txt'):\n"
        "        try:\n            open(p, 'w').write('pwned')\n        except OSError:\n            pass\n"
        "    return 'wrote'\n"
    )
    verdict = judge(problem("nothing"), code, box)
    assert verdict.passed == 0  # returned 'wrote', which is not the expected value
    assert target.read_text() == "original" and target.stat().st_mtime_ns == before
    assert not Path("/usr/evil.txt").exists() and not Path("/keep.txt").exists()


def test_a_socket_reaches_nothing(box):
    # a host server on loopback: the sandbox's loopback is its own (new network namespace), so
    # nothing arrives
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    server.setblocking(False)
    port = server.getsockname()[1]
    code = (
        f"import socket\ndef f():\n    s = socket.socket()\n    s.settimeout(1)\n"
        f"    s.connect(('127.0.0.1', {port}))\n    return 'connected'\n"
    )
    try:
        verdict = judge(problem("connected"), code, box)
        assert verdict.passed == 0 and "ConnectionRefusedError" in verdict.note
        with pytest.raises(BlockingIOError):  # no connection ever reached the host's server
            server.accept()
        code = "import socket\ndef f():\n    return socket.create_connection(('1.1.1.1', 53), timeout=1) and 'out'\n"
        assert judge(problem("out"), code, box).passed == 0  # no route outside either
    finally:
        server.close()


def test_an_unbounded_fork_is_contained_and_leaves_no_process(box):
    marker = f"4242.{os.getpid()}{time.monotonic_ns() % 10**6}"
    code = (
        "import os\ndef f():\n    n = 0\n    while True:\n        try:\n            pid = os.fork()\n"
        "        except OSError:\n            return n\n"
        f"        if pid == 0:\n            os.execv('/usr/bin/sleep', ['sleep', '{marker}'])\n"
        "        n += 1\n"
    )
    start = time.monotonic()
    verdict = judge(problem(10**6), code, box)
    assert time.monotonic() - start < LIMITS.wall_seconds + SLACK
    assert verdict.passed == 0
    assert processes_with(marker) == []  # every sleeper died with the run


def test_a_run_returns_only_once_its_namespace_init_is_dead(tmp_path):
    # bubblewrap exits with the run's first process while the namespace's init may still be killing
    # the rest (seen in CI: sleepers still alive when judge() returned); the run then kills and
    # awaits the init it was told of
    sleeper = subprocess.Popen(["sleep", "60"])
    namespace = int(os.readlink(f"/proc/{sleeper.pid}/ns/pid")[len("pid:[") : -1])
    status = tmp_path / "status.json"
    try:
        # another namespace under that pid (a reused pid): left alone
        status.write_text(
            json.dumps({"child-pid": sleeper.pid, "pid-namespace": namespace + 1}) + "\n"
        )
        sandbox_module._await_namespace_end(status)
        assert sleeper.poll() is None
        # the init it names: killed, dead on return, and reaped when it is this process's child (as
        # orphans are of a container's PID 1): no zombie left
        status.write_text(
            json.dumps({"child-pid": sleeper.pid, "pid-namespace": namespace})
            + "\n"
            + json.dumps({"exit-code": 0})
            + "\n"
        )
        sandbox_module._await_namespace_end(status)
        assert not Path(f"/proc/{sleeper.pid}").exists()
    finally:
        sleeper.kill()
        sleeper.wait()
    status.write_text("")  # bubblewrap failed before starting the run: nothing to wait for
    sandbox_module._await_namespace_end(status)
    sandbox_module._await_namespace_end(tmp_path / "missing.json")


def test_a_run_that_cannot_start_leaves_no_descriptor_open(box, tmp_path, monkeypatch):
    # the status file is opened for bubblewrap before the start; a start that fails must not leak
    # its descriptor
    (tmp_path / "stdin").write_bytes(b"")

    def refuse(*args, **kwargs):
        raise OSError(24, "Too many open files")

    monkeypatch.setattr(sandbox_module.subprocess, "Popen", refuse)
    before = sorted(os.listdir("/proc/self/fd"))
    with pytest.raises(OSError, match="Too many open files"):
        box._execute(
            ["bwrap", "--", "true"],
            str(tmp_path),
            str(tmp_path),
            str(tmp_path),
            None,
            (),
            None,
            isolated=True,
        )
    assert sorted(os.listdir("/proc/self/fd")) == before
    assert (tmp_path / "status.json").exists()  # it was opened (and closed again)


def test_the_fork_count_stops_at_max_processes(box):
    # the candidate reports how many children it could start: max_processes - 1 (the main program
    # counts too)
    code = (
        "import os, time\ndef f():\n    n = 0\n    while n < 100:\n        try:\n            pid = os.fork()\n"
        "        except OSError:\n            return n\n        if pid == 0:\n            time.sleep(30)\n"
        "            os._exit(0)\n        n += 1\n    return n\n"
    )
    result = box.run("exec(open('solution.py').read())\nprint(f())\n", files={"solution.py": code})
    assert result.returncode == 0, result.stderr
    assert int(result.stdout) == LIMITS.max_processes - 1


def test_an_endless_loop_is_stopped_within_its_limits(box):
    code = "def f():\n    while True:\n        pass\n"
    start = time.monotonic()
    verdict = judge(problem(1), code, box)
    assert time.monotonic() - start < LIMITS.wall_seconds + SLACK
    assert verdict.passed == 0 and "did not finish" in verdict.note
    # a loop blocked without using CPU is stopped by the wall clock
    result = box.run("import time\ntime.sleep(60)\n")
    assert (
        result.timed_out
        and result.returncode is None
        and result.seconds < LIMITS.wall_seconds + SLACK
    )


def test_unbounded_allocation_fails_inside_the_limit(box):
    code = "def f():\n    hoard = []\n    while True:\n        hoard.append(bytearray(2**20))\n"
    verdict = judge(problem(1), code, box)
    assert verdict.passed == 0 and (
        "MemoryError" in verdict.note or "did not finish" in verdict.note
    )
    result = box.run("x = bytearray(300 * 2**20)\n")  # above the 256 MiB address-space limit
    assert result.returncode != 0 and "MemoryError" in result.stderr


def test_a_huge_file_or_output_is_cut_at_the_file_size_limit(box):
    result = box.run("open('big', 'wb').write(b'x' * (2 * 2**20))\n", outputs=("big",))
    assert result.returncode != 0 and "File too large" in result.stderr
    result = box.run("import sys\nwhile True:\n    sys.stdout.write('y' * 65536)\n")
    assert result.returncode != 0 and len(result.stdout) <= LIMITS.file_size_bytes


def test_missing_bubblewrap_is_refused_unless_allowed(monkeypatch, tmp_path):
    monkeypatch.setattr(sandbox_module, "bwrap_path", lambda: None)
    with pytest.raises(SandboxUnavailable) as caught:
        Sandbox(LIMITS).run("print(1)")
    message = str(caught.value)
    assert message == MISSING_BWRAP and "\n" not in message
    assert "allow_unsandboxed: true" in message and "apt-get install bubblewrap" in message
    # allowed: the limits still apply, without isolation
    result = Sandbox(LIMITS, allow_unsandboxed=True).run("print(sum(range(10)))")
    assert (result.returncode, result.stdout) == (0, "45\n")
    result = Sandbox(LIMITS, allow_unsandboxed=True).run("x = bytearray(300 * 2**20)\n")
    assert "MemoryError" in result.stderr


def test_the_run_directory_is_removed(box, monkeypatch):
    made: list[str] = []
    real = sandbox_module.tempfile.mkdtemp

    def recording_mkdtemp(**kwargs):
        made.append(real(**kwargs))
        return made[-1]

    monkeypatch.setattr(sandbox_module.tempfile, "mkdtemp", recording_mkdtemp)
    result = box.run("import os\nprint(os.getcwd())\nopen('left', 'w').write('x')\n")
    assert result.stdout == "/sandbox\n" and len(made) == 1
    assert not os.path.exists(made[0])


def test_bad_file_names_and_limits_are_refused(box):
    with pytest.raises(ValueError, match="plain names"):
        box.run("print(1)", files={"../escape.py": ""})
    with pytest.raises(ValueError, match="Limits: cpu_seconds"):
        Limits(cpu_seconds=0)
    with pytest.raises(ValueError, match="Limits.memory_bytes"):
        Limits(memory_bytes=2**20)


ESCAPES = """import ctypes, errno, os, subprocess
libc = ctypes.CDLL(None, use_errno=True)
def call(nr, *args):
    r = libc.syscall(ctypes.c_long(nr), *[ctypes.c_long(a) for a in args])
    if r == 0 and nr == 56:
        os._exit(0)  # a clone that worked: the child leaves at once
    return errno.errorcode.get(ctypes.get_errno(), '?') if r == -1 else 'allowed'
print('unshare', call(272, 0x10000000))  # unshare(CLONE_NEWUSER)
print('clone', call(56, 0x10000000 | 17, 0, 0, 0, 0))  # clone(CLONE_NEWUSER | SIGCHLD)
print('ptrace', call(101, 0, 0, 0, 0))  # ptrace(PTRACE_TRACEME)
print('keyctl', call(250, 0, -1, 0))  # keyctl(KEYCTL_GET_KEYRING_ID, thread keyring)
print('perf', call(298, 0, 0, -1, -1, 0))
print('tool', subprocess.run(['unshare', '--user', 'true'], capture_output=True).returncode != 0)
print('fork', subprocess.run(['true']).returncode)
print([l.split()[1] for l in open('/proc/self/status') if l.startswith('Seccomp:')][0])
"""


def test_nested_user_namespaces_ptrace_and_the_keyring_are_refused(box):
    result = box.run(ESCAPES)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.split("\n")
    assert lines[:5] == [
        "unshare EPERM",
        "clone EPERM",
        "ptrace EPERM",
        "keyctl EPERM",
        "perf EPERM",
    ]
    # the unshare tool fails too, an ordinary child process still runs, and the filter is on (mode
    # 2)
    assert lines[5:8] == ["tool True", "fork 0", "2"]


def test_the_run_writes_at_most_disk_bytes_in_total():
    box = Sandbox(
        Limits(cpu_seconds=2, wall_seconds=3.0, memory_bytes=256 * 2**20, disk_bytes=4 * 2**20)
    )
    code = (
        "import errno\nfor where in ('.', '/tmp'):\n    n = 0\n    try:\n        for i in range(50):\n"
        "            open(f'{where}/f{i}', 'wb').write(b'x' * (2**20 - 1))\n            n += 1\n"
        "    except OSError as e:\n        print(where, n, errno.errorcode[e.errno])\n"
    )
    result = box.run(code)
    # 4 x (1 MiB - 1) fit, result.stderr
    assert result.stdout.split("\n")[:2] == [". 4 ENOSPC", "/tmp 4 ENOSPC"]
    with pytest.raises(ValueError, match="Limits: disk_bytes"):
        Limits(disk_bytes=0)
