"""The seccomp filter of a sandbox run (:mod:`envs.tools.code.sandbox`): a classic BPF program, as
bubblewrap's ``--seccomp FD`` reads it (an array of ``struct sock_filter``), assembled here with
:mod:`struct` so no libseccomp is needed.

On x86_64 it answers ``EPERM`` to the system calls a candidate has no use for and that widen the
kernel's attack surface or undo the isolation: new namespaces (``unshare``, ``setns``, ``clone``
with ``CLONE_NEWUSER``), mounts, ``ptrace`` and cross-process memory access, the kernel keyring,
``bpf``, ``perf_event_open``, ``userfaultfd``, ``io_uring``, module and kexec loading,
``open_by_handle_at``; ``clone3`` (whose flags a filter cannot read) gets ``ENOSYS``, so the C
library falls back to ``clone``, which the filter checks. A system call of another architecture (the
arch field) kills the process, and x32 system call numbers get ``EPERM``. Other architectures get no
filter (:func:`program` returns None); bubblewrap's namespaces and the resource limits still apply.

This module imports only the standard library.
"""

from __future__ import annotations

import errno
import platform
import struct

AUDIT_ARCH_X86_64 = 0xC000003E
CLONE_NEWUSER = 0x10000000
X32_SYSCALL_BIT = 0x40000000
# x86_64 system call numbers (arch/x86/entry/syscalls/syscall_64.tbl)
DENIED_X86_64 = {
    "ptrace": 101,
    "pivot_root": 155,
    "chroot": 161,
    "mount": 165,
    "umount2": 166,
    "init_module": 175,
    "delete_module": 176,
    "kexec_load": 246,
    "add_key": 248,
    "request_key": 249,
    "keyctl": 250,
    "unshare": 272,
    "perf_event_open": 298,
    "open_by_handle_at": 304,
    "setns": 308,
    "process_vm_readv": 310,
    "process_vm_writev": 311,
    "finit_module": 313,
    "kexec_file_load": 320,
    "bpf": 321,
    "userfaultfd": 323,
    "io_uring_setup": 425,
    "io_uring_enter": 426,
    "io_uring_register": 427,
    "open_tree": 428,
    "move_mount": 429,
    "fsopen": 430,
    "fsconfig": 431,
    "fsmount": 432,
    "fspick": 433,
    "mount_setattr": 442,
}
CLONE, CLONE3 = 56, 435

_LD_W_ABS, _JEQ, _JGE, _JSET, _RET = 0x20, 0x15, 0x35, 0x45, 0x06
_RET_KILL_PROCESS, _RET_ALLOW, _RET_ERRNO = 0x80000000, 0x7FFF0000, 0x00050000
_NR, _ARCH, _ARG0 = 0, 4, 16  # offsets in struct seccomp_data (arg0's low 32 bits on little-endian)


def program(machine: str | None = None) -> bytes | None:
    """The filter for ``machine`` (default: this one's), None where none is defined (not x86_64)."""
    if (machine or platform.machine()) != "x86_64":
        return None
    deny, enosys, allow = "deny", "enosys", "allow"
    code: list[tuple[int, int | str, int | str, int]] = [
        (_LD_W_ABS, 0, 0, _ARCH),
        (_JEQ, 1, 0, AUDIT_ARCH_X86_64),
        (_RET, 0, 0, _RET_KILL_PROCESS),
        (_LD_W_ABS, 0, 0, _NR),
        (_JGE, deny, 0, X32_SYSCALL_BIT),
        *[(_JEQ, deny, 0, nr) for nr in sorted(DENIED_X86_64.values())],
        (_JEQ, enosys, 0, CLONE3),
        (_JEQ, 0, allow, CLONE),
        (_LD_W_ABS, 0, 0, _ARG0),
        (_JSET, deny, allow, CLONE_NEWUSER),
    ]
    labels = {allow: len(code), deny: len(code) + 1, enosys: len(code) + 2}
    code += [
        (_RET, 0, 0, _RET_ALLOW),
        (_RET, 0, 0, _RET_ERRNO | errno.EPERM),
        (_RET, 0, 0, _RET_ERRNO | errno.ENOSYS),
    ]

    def offset(i: int, target: int | str) -> int:
        return target if isinstance(target, int) else labels[target] - i - 1

    return b"".join(
        struct.pack("<HBBI", op, offset(i, jt), offset(i, jf), k)
        for i, (op, jt, jf, k) in enumerate(code)
    )
