"""A seccomp filter for judged programs: the system calls a program never needs are refused.

A classic BPF program, built once per worker and installed in every program child (after
no_new_privs, as the last step before the program runs) with `prctl(PR_SET_SECCOMP)`
through ctypes: no dependency, and a few microseconds a child. Refused with EPERM:
changing mounts or the root, other namespaces (unshare, setns, and clone with a CLONE_NEW*
flag; clone3, whose flags a filter cannot read, says ENOSYS so libc falls back to clone),
looking into other processes (ptrace, process_vm_*, pidfd_getfd, kcmp), kernel keyrings,
bpf, perf events, io_uring, userfaultfd, modules, kexec, swap, reboot, accounting, quotas,
the kernel log, file handles and POSIX message queues (they would outlive the program in
the worker's IPC namespace, where nothing lists them). A system call of another ABI (i386 or x32 on x86_64) ends
the process. Everything else a Python program does (threads, fork, files, pipes,
signals, mmap) is allowed.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import struct

from .contain import ContainError, _libc

PR_SET_SECCOMP = 22
SECCOMP_MODE_FILTER = 2
RET_ALLOW = 0x7FFF0000
RET_ERRNO = 0x00050000
RET_KILL_PROCESS = 0x80000000
CLONE_NEW = 0x7E020000  # NEWNS | NEWCGROUP | NEWUTS | NEWIPC | NEWUSER | NEWPID | NEWNET

_DENIED = (
    "mount umount2 pivot_root chroot open_tree move_mount fsopen fsconfig fsmount fspick mount_setattr "
    "unshare setns ptrace process_vm_readv process_vm_writev pidfd_getfd kcmp "
    "keyctl add_key request_key bpf perf_event_open userfaultfd io_uring_setup io_uring_enter io_uring_register "
    "init_module finit_module delete_module kexec_load kexec_file_load swapon swapoff reboot acct quotactl "
    "syslog name_to_handle_at open_by_handle_at mq_open"
).split()

# (AUDIT_ARCH, syscall numbers, clone, clone3)
_ARCHES: dict[str, tuple[int, dict[str, int], int, int]] = {
    "x86_64": (
        0xC000003E,
        {
            "mount": 165,
            "umount2": 166,
            "pivot_root": 155,
            "chroot": 161,
            "open_tree": 428,
            "move_mount": 429,
            "fsopen": 430,
            "fsconfig": 431,
            "fsmount": 432,
            "fspick": 433,
            "mount_setattr": 442,
            "unshare": 272,
            "setns": 308,
            "ptrace": 101,
            "process_vm_readv": 310,
            "process_vm_writev": 311,
            "pidfd_getfd": 438,
            "kcmp": 312,
            "keyctl": 250,
            "add_key": 248,
            "request_key": 249,
            "bpf": 321,
            "perf_event_open": 298,
            "userfaultfd": 323,
            "io_uring_setup": 425,
            "io_uring_enter": 426,
            "io_uring_register": 427,
            "init_module": 175,
            "finit_module": 313,
            "delete_module": 176,
            "kexec_load": 246,
            "kexec_file_load": 320,
            "swapon": 167,
            "swapoff": 168,
            "reboot": 169,
            "acct": 163,
            "quotactl": 179,
            "syslog": 103,
            "name_to_handle_at": 303,
            "open_by_handle_at": 304,
            "mq_open": 240,
        },
        56,
        435,
    ),
    "aarch64": (
        0xC00000B7,
        {
            "mount": 40,
            "umount2": 39,
            "pivot_root": 41,
            "chroot": 51,
            "open_tree": 428,
            "move_mount": 429,
            "fsopen": 430,
            "fsconfig": 431,
            "fsmount": 432,
            "fspick": 433,
            "mount_setattr": 442,
            "unshare": 97,
            "setns": 268,
            "ptrace": 117,
            "process_vm_readv": 270,
            "process_vm_writev": 271,
            "pidfd_getfd": 438,
            "kcmp": 272,
            "keyctl": 219,
            "add_key": 217,
            "request_key": 218,
            "bpf": 280,
            "perf_event_open": 241,
            "userfaultfd": 282,
            "io_uring_setup": 425,
            "io_uring_enter": 426,
            "io_uring_register": 427,
            "init_module": 105,
            "finit_module": 273,
            "delete_module": 106,
            "kexec_load": 104,
            "kexec_file_load": 294,
            "swapon": 224,
            "swapoff": 225,
            "reboot": 142,
            "acct": 89,
            "quotactl": 60,
            "syslog": 116,
            "name_to_handle_at": 264,
            "open_by_handle_at": 265,
            "mq_open": 180,
        },
        220,
        435,
    ),
}

# classic BPF opcodes
_LD_ABS = 0x20  # BPF_LD | BPF_W | BPF_ABS
_JEQ = 0x15  # BPF_JMP | BPF_JEQ | BPF_K
_JGE = 0x35  # BPF_JMP | BPF_JGE | BPF_K
_JSET = 0x45  # BPF_JMP | BPF_JSET | BPF_K
_RET = 0x06  # BPF_RET | BPF_K
_OFF_NR, _OFF_ARCH, _OFF_ARG0 = 0, 4, 16  # struct seccomp_data (arg0's low word: little-endian)


def _insn(code: int, jt: int, jf: int, k: int) -> bytes:
    return struct.pack("=HBBI", code, jt, jf, k)


def build(machine: str | None = None) -> bytes | None:
    """The filter for this machine's architecture as raw sock_filter entries; None where unknown."""
    arch = _ARCHES.get(machine or platform.machine())
    if arch is None:
        return None
    audit, numbers, clone, clone3 = arch
    eperm = RET_ERRNO | errno.EPERM
    prog = [
        _insn(_LD_ABS, 0, 0, _OFF_ARCH),
        _insn(_JEQ, 1, 0, audit),
        _insn(_RET, 0, 0, RET_KILL_PROCESS),
        _insn(_LD_ABS, 0, 0, _OFF_NR),
        _insn(_JGE, 0, 1, 0x40000000),  # x32 numbers on x86_64
        _insn(_RET, 0, 0, RET_KILL_PROCESS),
    ]
    for name in _DENIED:
        prog.append(_insn(_JEQ, 0, 1, numbers[name]))
        prog.append(_insn(_RET, 0, 0, eperm))
    prog += [
        _insn(_JEQ, 0, 1, clone3),
        _insn(_RET, 0, 0, RET_ERRNO | errno.ENOSYS),
        _insn(_JEQ, 0, 3, clone),
        _insn(_LD_ABS, 0, 0, _OFF_ARG0),
        _insn(_JSET, 0, 1, CLONE_NEW),
        _insn(_RET, 0, 0, eperm),
        _insn(_RET, 0, 0, RET_ALLOW),
    ]
    return b"".join(prog)


class _Fprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


class Filter:
    """A built filter, kept in the worker's memory so each child only makes one prctl."""

    def __init__(self, raw: bytes) -> None:
        self._buf = ctypes.create_string_buffer(raw, len(raw))
        self._prog = _Fprog(len(raw) // 8, ctypes.cast(self._buf, ctypes.c_void_p))

    def install(self) -> None:
        """Install in this process (needs no_new_privs first); inherited by everything it starts."""
        if _libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.addressof(self._prog), 0, 0) != 0:
            e = ctypes.get_errno()
            raise ContainError(e, f"seccomp filter: {os.strerror(e)}")
