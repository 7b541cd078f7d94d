"""A cell killed under its workers (#43 point 6), through the real CLI: `kill -9` of the cell while its sandbox
workers are still setting up (held stopped until the cell is gone). They end quietly: no traceback reaches the
terminal the cell printed to."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from conftest import cli_env

SANDBOX_WORKER = "apps_bench.sandbox.worker import main"


def _descendants(root: int) -> list[int]:
    parents: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parents[int(stat.parent.name)] = int(fields[1])
    found, todo = [], [root]
    while todo:
        parent = todo.pop()
        kids = [pid for pid, ppid in parents.items() if ppid == parent]
        found += kids
        todo += kids
    return found


def _sandbox_workers(root: int) -> list[int]:
    out = []
    for pid in _descendants(root):
        try:
            if SANDBOX_WORKER in Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode():
                out.append(pid)
        except OSError:
            pass
    return out


def test_sandbox_workers_whose_cell_is_killed_while_they_start_end_quietly(tmp_path: Path):
    proc = subprocess.Popen([sys.executable, "-m", "apps_bench", "tracking=none", "progress=false"], cwd=tmp_path,
                            env=cli_env(tmp_path), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)  # fmt: skip
    stopped: list[int] = []
    try:
        deadline = time.monotonic() + 120  # a bound on a hang only: the events are the processes seen
        while not stopped and proc.poll() is None and time.monotonic() < deadline:
            for pid in _sandbox_workers(proc.pid):  # as soon as one exists, before it says it is ready
                os.kill(pid, signal.SIGSTOP)
                stopped.append(pid)
        assert stopped, "no sandbox worker started"
        proc.kill()  # kill -9 of the cell while its workers set up
        proc.wait()
        for pid in stopped:
            os.kill(pid, signal.SIGCONT)  # they find their cell gone
        out, err = proc.communicate(timeout=120)  # the pipes close once every worker has ended
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == -signal.SIGKILL
    assert "Traceback" not in err and "Error" not in err, err[-3000:]
    assert all(not Path(f"/proc/{pid}").exists() for pid in stopped)  # they ended, not lingering
