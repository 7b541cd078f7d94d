"""Solving in worker processes from the forkserver (`processes=`): the same records as one
process on every path (a single cell, a sweep's cell), python_exec served by the cell's own
sandbox, a dead worker costs only its problems and is replaced, no worker outlives its cell."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

import pytest
from conftest import cli_env, compose_cell, fresh_store, run_cli

from apps_bench.cell.cpus import usable_cpus
from apps_bench.cell.solver_pool import solver_count
from apps_bench.config.schema import typed_config

CPUS = usable_cpus()


# ------------------------------------------------------------------------------- how many


@pytest.mark.parametrize(
    ("setting", "concurrency", "n", "workers"),
    [
        ("1", 16, 100, 0),  # 1: the cell's own process alone, no extra process
        (1, 16, 100, 0),
        ("3", 16, 100, 3),
        ("3", 2, 100, 2),  # never more solvers than problems in flight
        ("3", 16, 2, 2),  # nor than problems to run
        ("3", 16, 1, 0),  # one problem: no process to start for it
        ("auto", 64, 100, CPUS if CPUS > 1 else 0),
        ("AUTO", 1, 100, 0),
    ],
)
def test_solver_count(setting, concurrency, n, workers):
    assert solver_count(setting, concurrency=concurrency, n_problems=n) == workers


@pytest.mark.parametrize("bad", ["0", "-2", "many", "", None])
def test_solver_count_rejects_bad_settings(bad):
    with pytest.raises(ValueError, match="processes must be 'auto' or a positive integer"):
        solver_count(bad, concurrency=4, n_problems=10)


def test_auto_follows_the_cpus_this_process_may_use():
    """Under SLURM/Ray/taskset a cell is given fewer CPUs than the host has: `auto` counts those."""
    code = (
        "import os; os.sched_setaffinity(0, {0}); from apps_bench.cell.solver_pool import solver_count; "
        "print(solver_count('auto', concurrency=64, n_problems=100))"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "0"  # one CPU: solved in the cell's own process


def test_bad_processes_setting_fails_the_cell_with_its_fix(tmp_path: Path, mlflow_template: Path):
    fresh_store(mlflow_template, tmp_path / "outputs" / "mlflow.db")
    r = run_cli(["processes=lots", "progress=false"], tmp_path)
    assert r.returncode == 2
    assert "processes=lots: auto (one per CPU core) or a whole number >= 1. Fix: processes=auto" in r.stderr
    assert not (tmp_path / "outputs" / "cells").exists()


def test_a_worker_holds_no_pipe_of_the_cell_process():
    """A pipe the cell's process owns (e.g. the exec-status pipe of a subprocess another
    thread is starting) reaches EOF when the cell closes it: workers come from the
    forkserver, never from the cell's process, so none holds a copy. (Holding one
    deadlocked a cell: Popen waited for that EOF.)"""
    import select

    from apps_bench.cell.solver_pool import SolverPool, start_forkserver

    r, w = os.pipe()
    os.set_inheritable(w, True)
    cfg = typed_config(compose_cell())
    ctx = start_forkserver(cfg.topology)
    workers = SolverPool.start(ctx, 1, cfg=cfg, threads=2, timeout_s=60)
    try:
        assert workers.workers[0].process.is_alive()
        os.close(w)
        assert select.select([r], [], [], 10)[0], "no EOF: a worker holds the pipe's write end"
        assert os.read(r, 1) == b""
    finally:
        workers.close()
        os.close(r)
    assert not workers.workers[0].process.is_alive()


# ------------------------------------------------------------------------------- end to end


def _mini(d: Path) -> str:
    return f"dataset.path={d / 'train_mini150.jsonl'}"


def _cell(cwd: Path) -> Path:
    [cell] = sorted(p for p in (cwd / "outputs" / "cells").iterdir() if p.is_dir())
    return cell


def _records(cell: Path) -> list[dict]:
    return [json.loads(x) for x in (cell / "records.jsonl").read_text().splitlines() if x.strip()]


def _transcripts(cell: Path) -> dict[str, list[dict]]:
    out = {}
    for line in (cell / "transcripts.jsonl").read_text().splitlines():
        if line.strip():
            t = json.loads(line)
            out[t["key"]] = t["events"]
    return out


@pytest.mark.slow
def test_workers_give_the_records_one_process_gives(tmp_path: Path, apps_data_dir: Path, mlflow_template: Path):
    base = [
        "dataset=apps",
        _mini(apps_data_dir),
        "dataset.split=train",
        "limit=12",
        "concurrency=4",
        "model.gold.latency_ms=100",
        "model.gold.wrong_fraction=0.3",
        "progress=false",
    ]
    runs = {}
    # one process; two workers (the cell's process only coordinates, judges and records);
    # a sweep's cell (the same code: workers from the forkserver)
    for label, extra in (("one", ["processes=1"]), ("workers", ["processes=2"]), ("sweep", ["-m", "processes=2"])):
        cwd = tmp_path / label
        cwd.mkdir()
        fresh_store(mlflow_template, cwd / "outputs" / "mlflow.db")
        r = run_cli([*extra, *base], cwd)
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
        runs[label] = _cell(cwd)
    recs = {k: sorted(_records(v), key=lambda x: x["key"]) for k, v in runs.items()}
    assert len({v.name for v in runs.values()}) == 1  # `processes` is run-only: the same cell
    assert {x["solver"] for x in recs["one"]} == {"main"}
    assert {x["solver"] for x in recs["workers"]} == {"solver-1", "solver-2"}
    assert {x["solver"] for x in recs["sweep"]} == {"solver-1", "solver-2"}
    one = recs["one"]
    assert not any(x["error"] for v in recs.values() for x in v)
    for label in ("workers", "sweep"):  # the same answers, verdicts and usage wherever solved
        for a, b in zip(one, recs[label], strict=True):
            assert a["key"] == b["key"] and a["program"] == b["program"] and a["passed"] == b["passed"]
            assert [t["outcome"] for t in a["verdict"]["results"]] == [t["outcome"] for t in b["verdict"]["results"]]
            counts = lambda u: {k: v for k, v in u.items() if k != "tool_s"}  # noqa: E731 - tool_s is a wall time
            assert counts(a["usage"]) == counts(b["usage"]) and b["usage"]["tool_s"] > 0
        # the workers' python_exec calls ran in the cell process's sandbox and came back
        trans = _transcripts(runs[label])
        for key in (x["key"] for x in recs[label] if x["solver"].startswith("solver-")):
            results = [e["content"] for e in trans[key] if e["kind"] == "tool_result"]
            assert results and results[0].startswith("exit code: 0"), results
    assert 0 < sum(x["passed"] for x in one) < 12  # wrong_fraction: some answers are wrong, on purpose


def _children(pid: int) -> list[tuple[int, str]]:
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
        except (OSError, IndexError, ValueError):
            continue
        if ppid == pid:
            out.append((int(d.name), cmd))
    return out


def _running(pid: int) -> bool:
    """Alive and not a zombie (a dead worker of a killed parent is reaped by init)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _solver_pids(cli_pid: int) -> tuple[int, list[int]]:
    """(the forkserver, its workers): the CLI's child running multiprocessing's forkserver, and
    its children (the sandbox workers are the CLI's own children, not the forkserver's)."""
    [server] = [pid for pid, cmd in _children(cli_pid) if "multiprocessing.forkserver" in cmd]
    return server, [pid for pid, _ in _children(server)]


def _wait_for_workers(cli_pid: int, n: int, timeout: float = 60) -> tuple[int, list[int]]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            server, workers = _solver_pids(cli_pid)
        except ValueError:
            server, workers = 0, []
        if len(workers) == n:
            return server, workers
        time.sleep(0.05)
    pytest.fail(f"no {n} solver workers appeared")


def _two_process_cell(apps_data_dir: Path, n: int) -> list[str]:
    """A cell of `n` real rows solved by two workers."""
    return [
        "dataset=apps",
        _mini(apps_data_dir),
        "dataset.split=train",
        f"limit={n}",
        "concurrency=4",
        "processes=2",
        "progress=false",
    ]


def _start(args: list[str], cwd: Path) -> subprocess.Popen:
    """The CLI in its own process group (SIGINT as from a terminal: conftest's `_ctrl_c_as_from_a_terminal`)."""
    return subprocess.Popen(
        [sys.executable, "-m", "apps_bench", *args],
        cwd=cwd,
        env=cli_env(cwd),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def _wait_for_records(proc: subprocess.Popen, cwd: Path, n: int, timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        cells = cwd / "outputs" / "cells"
        dirs = sorted(p for p in cells.iterdir() if p.is_dir()) if cells.exists() else []
        if dirs and (dirs[0] / "records.jsonl").exists() and len(_records(dirs[0])) >= n:
            return
        if proc.poll() is not None:
            pytest.fail("cell ended early:\n" + proc.stdout.read().decode()[-3000:])
        time.sleep(0.1)
    pytest.fail("no records appeared")


def _kill_workers_mid_cell(
    cwd: Path, apps_data_dir: Path, mlflow_template: Path, n: int, which: Callable[[list[int]], list[int]]
) -> tuple[list[str], Path]:
    """Run a two-worker cell of `n` rows, SIGKILL `which(workers)` once 2 problems are
    recorded, and check the cell ends recorded but incomplete: (its args, its folder)."""
    args = _two_process_cell(apps_data_dir, n)
    fresh_store(mlflow_template, cwd / "outputs" / "mlflow.db")
    proc = _start([*args, "model.gold.latency_ms=700"], cwd)
    _, workers = _wait_for_workers(proc.pid, 2)
    _wait_for_records(proc, cwd, 2)
    for pid in which(workers):
        os.kill(pid, signal.SIGKILL)
    out = proc.communicate(timeout=240)[0].decode()
    assert proc.returncode == 3, out[-3000:]  # recorded, incomplete: the dead workers' problems are errors
    return args, _cell(cwd)


@pytest.mark.slow
def test_a_dead_worker_costs_only_its_problems(tmp_path: Path, apps_data_dir: Path, mlflow_template: Path):
    n = 16
    args, cell = _kill_workers_mid_cell(tmp_path, apps_data_dir, mlflow_template, n, lambda workers: workers[:1])
    recs = _records(cell)
    assert len(recs) == n and len({x["key"] for x in recs}) == n
    lost = [x for x in recs if x["error"]]
    [dead] = {x["solver"] for x in lost}
    assert lost and all(f"solver process {dead}" in x["error"] for x in lost)
    assert len(lost) <= 2  # at most what the worker held (concurrency 4 over two solvers)
    assert all(x["passed"] for x in recs if not x["error"])  # the rest was solved
    # problems whose solving started after the death was noticed (a problem the dead worker
    # answered just before it died can finish judging later) went to the other worker or its replacement
    died_at = max(y["completed_at"] for y in lost)
    later = [x for x in recs if x["completed_at"] - x["latency_s"] > died_at]
    assert later and {x["solver"] for x in later} <= {"solver-1", "solver-2", "solver-3"} - {dead}

    r = run_cli(args, tmp_path)  # the rerun retries exactly the lost problems
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert f"{len(lost)} to run ({len(lost)} retried after errors)" in r.stderr
    recs = _records(cell)
    assert len({x["key"] for x in recs}) == n and not any(x["error"] for x in recs)
    assert all(x["passed"] for x in recs)


@pytest.mark.slow
def test_when_every_worker_dies_new_ones_solve_the_rest(tmp_path: Path, apps_data_dir: Path, mlflow_template: Path):
    n = 12
    _, cell = _kill_workers_mid_cell(tmp_path, apps_data_dir, mlflow_template, n, lambda workers: workers)
    recs = _records(cell)
    assert len(recs) == n and len({x["key"] for x in recs}) == n
    lost = [x for x in recs if x["error"]]
    # what the workers held; every other problem is solved by their replacements
    assert 1 <= len(lost) <= 4 and all("solver process solver-" in x["error"] for x in lost)
    assert all(x["passed"] for x in recs if not x["error"])
    # problems whose solving started after the deaths were noticed went to the replacements (one a dead
    # worker answered just before it died can finish judging after the lost problems were recorded)
    died_at = max(y["completed_at"] for y in lost)
    later = [x for x in recs if x["completed_at"] - x["latency_s"] > died_at]
    assert later and {x["solver"] for x in later} <= {"solver-3", "solver-4"}


@pytest.mark.slow
def test_workers_die_with_a_killed_cell(tmp_path: Path, apps_data_dir: Path, mlflow_template: Path):
    args = [*_two_process_cell(apps_data_dir, 12), "model.gold.latency_ms=700"]
    fresh_store(mlflow_template, tmp_path / "outputs" / "mlflow.db")
    proc = _start(args, tmp_path)
    server, workers = _wait_for_workers(proc.pid, 2)
    _wait_for_records(proc, tmp_path, 1)
    os.kill(proc.pid, signal.SIGKILL)  # only the cell's process: no solver process may outlive it
    proc.wait(timeout=30)
    proc.stdout.close()
    deadline = time.monotonic() + 120  # bounds a hang only: they die on their parent's death (no timing asserted)
    while time.monotonic() < deadline and any(_running(p) for p in (server, *workers)):
        time.sleep(0.05)
    alive = [p for p in (server, *workers) if _running(p)]
    os.killpg(proc.pid, signal.SIGKILL)  # clean up the rest of the group (sandbox)
    assert not alive, f"solver processes {alive} outlived their killed cell (forkserver {server})"


@pytest.mark.slow
def test_ctrl_c_stops_the_cell_keeps_its_records_and_the_rerun_resumes(
    tmp_path: Path, apps_data_dir: Path, mlflow_template: Path
):
    n = 12
    args = _two_process_cell(apps_data_dir, n)
    fresh_store(mlflow_template, tmp_path / "outputs" / "mlflow.db")
    proc = _start([*args, "model.gold.latency_ms=700"], tmp_path)
    _wait_for_records(proc, tmp_path, 2)
    os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C reaches the whole foreground group
    out = proc.communicate(timeout=60)[0].decode()
    assert proc.returncode == 130, out[-3000:]
    assert "interrupted. Every problem recorded so far is kept" in out and "Traceback" not in out.split("interrupted.")[-1]
    kept = _records(_cell(tmp_path))
    assert 2 <= len(kept) < n and len({x["key"] for x in kept}) == len(kept)
    r = run_cli(args, tmp_path)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert f"{len(kept)} already recorded, {n - len(kept)} to run" in r.stderr
    recs = _records(_cell(tmp_path))
    assert len(recs) == n and len({x["key"] for x in recs}) == n and all(x["passed"] for x in recs)
