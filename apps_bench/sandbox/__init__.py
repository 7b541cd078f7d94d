"""The sandbox: warm, contained workers that run untrusted programs for the judge
and for the agents' `python_exec` tool. See pool.py (API), contain.py (containment),
worker.py (worker loop) and harness.py (what runs inside the program's process).

A guard that only removes functions (APPS' reliability guard, applied to call-based
code) is not a security boundary; the boundary is the process containment: PID/net/
IPC/mount namespaces, read-only filesystem view, pids cgroup, unprivileged uid and
rlimits. Stronger options on Linux: gVisor (runsc), nsjail/bubblewrap with seccomp
filters, or a throw-away VM/container per run.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .api import ExecResult, RawRun, RunRequest, decode_value

if TYPE_CHECKING:  # pragma: no cover
    from .pool import SandboxPool

__all__ = ["SandboxPool", "RunRequest", "RawRun", "ExecResult", "decode_value"]


def __getattr__(name: str) -> object:
    # The pool (subprocess, logging, queue, ...) is imported on first use, not with the
    # package: every sandbox worker imports this package, and each module it holds makes
    # its start-up and every fork of it dearer.
    if name == "SandboxPool":
        from .pool import SandboxPool

        return SandboxPool
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
