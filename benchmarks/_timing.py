"""What the benchmark scripts share: timing a command with its children's CPU, and a free loopback port."""

from __future__ import annotations

import os
import socket
import subprocess
import time
from pathlib import Path


def run_timed(cmd: list[str], cwd: Path, env: dict[str, str]) -> tuple[float, float]:
    """(wall s, CPU s of the command and its waited-for descendants); a failed command stops the benchmark."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    if os.waitstatus_to_exitcode(status) != 0:
        err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
        raise SystemExit(f"{' '.join(cmd)} failed:\n{err[-3000:]}")
    return wall, usage.ru_utime + usage.ru_stime


TICK = os.sysconf("SC_CLK_TCK")


def _stat(pid: int) -> list[str]:
    """/proc/<pid>/stat's fields after the command name (field 3 of proc(5) is index 0)."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def proc_cpu(pid: int) -> float:
    """User + system CPU seconds of a running process (its threads included)."""
    f = _stat(pid)
    return (int(f[11]) + int(f[12])) / TICK


def tree_cpu(pid: int) -> float:
    """CPU seconds of a running process and all its descendants, live and reaped (a server's workers)."""
    children: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                children.setdefault(int(_stat(int(d.name))[1]), []).append(int(d.name))
            except (OSError, IndexError, ValueError):
                pass  # gone meanwhile
    tree, todo = [], [pid]
    while todo:
        tree.append(todo.pop())
        todo.extend(children.get(tree[-1], ()))
    total = 0.0
    for p in tree:
        try:
            f = _stat(p)
        except OSError:
            continue
        total += sum(int(x) for x in f[11:15]) / TICK  # utime, stime, and its reaped children's
    return total


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
