"""A cell killed under its workers (#43 point 6), through the real CLI: `kill -9` of the cell while its sandbox
workers are still setting up (held stopped until the cell is gone); and a multi-process cell stopped while its
solver workers wait in model calls: Ctrl-C to the group (also of a joblib sweep), SIGTERM to the cell, `kill -9`
of the cell, also with the replies released after it is gone (results sent to a cell that is gone). They end
quietly: no traceback reaches the terminal the cell printed to."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Callable

import pytest
from conftest import cli_env
from faults.http_proxy import DyingProxy, Request
from faults.process_group import own_group

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
    proc = subprocess.Popen(
        [sys.executable, "-m", "apps_bench", "tracking=none", "progress=false"],
        cwd=tmp_path,
        env=cli_env(tmp_path),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
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


ROWS = Path(__file__).resolve().parents[1] / "fixtures" / "apps" / "train_mini150.jsonl"
SOLVING = 2  # solver processes, each held in a model call when the cell is stopped


def _model_calls_held(n: int) -> tuple[Callable[[Request], bool], threading.Event]:
    """A proxy's `holds`: every model call is held; the event is set once `n` are."""
    seen, lock, held = [0], threading.Lock(), threading.Event()

    def holds(request: Request) -> bool:
        if not request.path.endswith("/chat/completions"):
            return False
        with lock:
            seen[0] += 1
            if seen[0] >= n:
                held.set()
        return True

    return holds, held


def _gone(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"  # ended, not yet reaped
    except OSError:
        return True


STOPS = {  # how the cell is stopped -> (its extra overrides, the exit code it ends with)
    "sigint_to_the_group": ([], 130),  # a terminal's Ctrl-C
    "sigterm_to_the_cell": ([], -signal.SIGTERM),
    "kill9_while_workers_wait": ([], -signal.SIGKILL),
    "kill9_then_results_sent": ([], -signal.SIGKILL),  # the held replies released once the cell is gone
    "sigint_to_a_joblib_sweep": (["-m", "hydra/launcher=local_parallel", "hydra.launcher.n_jobs=2", "seed=0,1"], 130),
}


@pytest.mark.slow
@pytest.mark.parametrize("stop", STOPS)
def test_solver_workers_of_a_stopped_cell_end_quietly(tmp_path: Path, stop: str):
    """#43 point 6: a multi-process cell (processes=2) stopped while its solver workers wait in model calls (held by
    a proxy in front of a real gold server): nothing of theirs reaches the terminal, and none lingers."""
    from apps_bench.models.gold import GoldServer, load_rows

    extra, code = STOPS[stop]
    holds, held = _model_calls_held(SOLVING)
    server = GoldServer(load_rows(str(ROWS), "train")).start()
    try:
        with DyingProxy(server.base_url.removesuffix("/v1"), holds=holds).running() as proxy:
            args = [
                sys.executable,
                "-m",
                "apps_bench",
                *extra,
                "model=gold",
                f"model.base_url={proxy.url}/v1",
                "dataset=apps",
                f"dataset.path={ROWS}",
                "dataset.split=train",
                "limit=6",
                f"processes={SOLVING}",
                "concurrency=4",
                "allow_any_cell=true",
                "progress=false",
            ]
            with own_group(args, tmp_path, cli_env(tmp_path)) as proc:
                assert held.wait(300), "the solver workers never called the model"
                workers = _descendants(proc.pid)
                if stop.startswith("sigint"):
                    os.killpg(proc.pid, signal.SIGINT)
                elif stop == "sigterm_to_the_cell":
                    proc.terminate()
                else:
                    proc.kill()
                    if stop == "kill9_then_results_sent":
                        proc.wait()
                        proxy.release.set()  # the workers get their replies and send results to a cell that is gone
                _, err = proc.communicate(timeout=300)  # the pipes close once every process of the cell has ended
    finally:
        server.stop()
    assert proc.returncode == code, err[-3000:]
    for noise in ("Traceback", "EOFError", "BrokenPipeError", "Error"):
        assert noise not in err, err[-3000:]
    if code == 130:
        assert err.rstrip().splitlines()[-1].startswith("apps-bench: interrupted."), err[-3000:]
    assert all(_gone(pid) for pid in workers), [pid for pid in workers if not _gone(pid)]
