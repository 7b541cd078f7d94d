"""Solving across forked helper processes (`processes=`): same records as one process,
python_exec served by the main process's sandbox, a dead helper costs only its problems.
Both ways helpers come to be are covered: forked by the preloader (a single-cell command)
and forked by the main process itself (a sweep's cell, a library call)."""

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

from apps_bench.solving import helper_count
from conftest import cli_env, fresh_store, run_cli

CORES = len(os.sched_getaffinity(0))


# ------------------------------------------------------------------------------- how many


@pytest.mark.parametrize(
    ("setting", "concurrency", "n", "framework", "helpers"),
    [
        ("1", 16, 100, "langgraph", 0),
        (1, 16, 100, "langgraph", 0),
        ("3", 16, 100, "langgraph", 2),
        ("3", 2, 100, "langgraph", 1),  # never more solvers than problems in flight
        ("3", 16, 2, "openai", 1),  # nor than problems to run
        ("3", 16, 100, "crewai", 2),
        ("3", 16, 100, "autogen", 2),
        ("3", 16, 100, "some_new_framework", 0),  # not checked to be fork-safe: main process only
        ("auto", 64, 100, "langgraph", CORES - 1),
        ("AUTO", 1, 100, "langgraph", 0),
    ],
)
def test_helper_count(setting, concurrency, n, framework, helpers):
    assert helper_count(setting, concurrency=concurrency, n_problems=n, framework=framework) == helpers


@pytest.mark.parametrize("bad", ["0", "-2", "many", "", None])
def test_helper_count_rejects_bad_settings(bad):
    with pytest.raises(ValueError, match="processes must be 'auto' or a positive integer"):
        helper_count(bad, concurrency=4, n_problems=10, framework="langgraph")


def test_bad_processes_setting_fails_the_cell_with_its_fix(tmp_path: Path, mlflow_template: Path):
    fresh_store(mlflow_template, tmp_path / "outputs" / "mlflow.db")
    r = run_cli(["processes=lots", "progress=false"], tmp_path)
    assert r.returncode == 2
    assert "processes=lots: auto (one per CPU core) or a whole number >= 1. Fix: processes=auto" in r.stderr
    assert not (tmp_path / "outputs" / "cells").exists()


def test_a_helper_holds_no_pipe_of_the_main_process():
    """A pipe the main process owns (e.g. the exec-status pipe of a subprocess another thread
    is starting at the moment of the fork) reaches EOF when the main process closes it: the
    helper dropped its copy. (Holding it deadlocked a cell: Popen waited for that EOF.)"""
    import select

    from apps_bench.solving import SolverProcesses, Solved
    from apps_bench.types import Usage

    async def solve(problem, pool, connections):  # never called: no problem is handed over
        return Solved(attempt=None, usage=Usage())

    r, w = os.pipe()
    procs = SolverProcesses.fork(1, ["p"], solve, threads=2)
    try:
        time.sleep(0.5)  # the helper is up, and has had its chance to drop what it inherited
        os.close(w)
        assert select.select([r], [], [], 10)[0], "no EOF: a helper still holds the pipe's write end"
        assert os.read(r, 1) == b""
    finally:
        procs.close()
        os.close(r)


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
def test_helpers_give_the_records_one_process_gives(tmp_path: Path, apps_data_dir: Path, mlflow_template: Path):
    base = ["dataset=apps", _mini(apps_data_dir), "dataset.split=train", "limit=12", "concurrency=4",
            "model.latency_ms=100", "model.wrong_fraction=0.3", "progress=false"]  # fmt: skip
    runs = {}
    # one process; two preloaded helpers (the main process only coordinates); a sweep's cell:
    # the main process imports the framework, solves, and forks one helper itself
    for label, extra in (("one", ["processes=1"]), ("preloaded", ["processes=2"]), ("in-process", ["-m", "processes=2"])):
        cwd = tmp_path / label
        cwd.mkdir()
        fresh_store(mlflow_template, cwd / "outputs" / "mlflow.db")
        r = run_cli([*extra, *base], cwd)
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
        runs[label] = _cell(cwd)
    recs = {k: sorted(_records(v), key=lambda x: x["key"]) for k, v in runs.items()}
    assert len({v.name for v in runs.values()}) == 1  # `processes` is run-only: the same cell
    assert {x["solver"] for x in recs["one"]} == {"main"}
    assert {x["solver"] for x in recs["preloaded"]} == {"helper-1", "helper-2"}
    assert {x["solver"] for x in recs["in-process"]} == {"main", "helper-1"}
    one = recs["one"]
    assert not any(x["error"] for v in recs.values() for x in v)
    for label in ("preloaded", "in-process"):  # the same answers, verdicts and usage wherever solved
        for a, b in zip(one, recs[label], strict=True):
            assert a["key"] == b["key"] and a["program"] == b["program"] and a["passed"] == b["passed"]
            assert [t["outcome"] for t in a["verdict"]["results"]] == [t["outcome"] for t in b["verdict"]["results"]]
            counts = lambda u: {k: v for k, v in u.items() if k != "tool_s"}  # noqa: E731 - tool_s is a wall time
            assert counts(a["usage"]) == counts(b["usage"]) and b["usage"]["tool_s"] > 0
        # the helpers' python_exec calls ran in the main process's sandbox and came back
        trans = _transcripts(runs[label])
        for key in (x["key"] for x in recs[label] if x["solver"].startswith("helper-")):
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
    """Alive and not a zombie (a dead helper of a killed parent is reaped by init)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _solver_pids(cli_pid: int) -> tuple[int, list[int]]:
    """(the preloader, its helpers): processes running the CLI's own command line (sandbox
    workers and the MLflow helper do not), a child of the CLI and the child's children."""
    own = (Path(f"/proc/{cli_pid}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip())
    [preloader] = [pid for pid, cmd in _children(cli_pid) if cmd == own]
    return preloader, [pid for pid, cmd in _children(preloader) if cmd == own]


def _wait_for_helpers(cli_pid: int, n: int, timeout: float = 60) -> tuple[int, list[int]]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            pre, helpers = _solver_pids(cli_pid)
        except ValueError:
            pre, helpers = 0, []
        if len(helpers) == n:
            return pre, helpers
        time.sleep(0.05)
    pytest.fail(f"no {n} solver helpers appeared")


def _two_process_cell(apps_data_dir: Path, n: int) -> list[str]:
    """A cell of `n` real rows solved by two preloaded helpers."""
    return ["dataset=apps", _mini(apps_data_dir), "dataset.split=train", f"limit={n}", "concurrency=4",
            "processes=2", "progress=false"]  # fmt: skip


def _start(args: list[str], cwd: Path, *, ctrl_c: bool = False) -> subprocess.Popen:
    """The CLI in its own process group; `ctrl_c`: SIGINT acts as from a terminal (not ignored as in a background job)."""
    return subprocess.Popen(
        [sys.executable, "-m", "apps_bench", *args], cwd=cwd, env=cli_env(cwd), stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
        preexec_fn=(lambda: signal.signal(signal.SIGINT, signal.SIG_DFL)) if ctrl_c else None,
    )  # fmt: skip


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


def _kill_helpers_mid_cell(
    cwd: Path, apps_data_dir: Path, mlflow_template: Path, n: int, which: Callable[[list[int]], list[int]]
) -> tuple[list[str], Path]:
    """Run a two-helper cell of `n` rows, SIGKILL `which(helpers)` once 2 problems are
    recorded, and check the cell ends recorded but incomplete: (its args, its folder)."""
    args = _two_process_cell(apps_data_dir, n)
    fresh_store(mlflow_template, cwd / "outputs" / "mlflow.db")
    proc = _start([*args, "model.latency_ms=700"], cwd)
    _, helpers = _wait_for_helpers(proc.pid, 2)
    _wait_for_records(proc, cwd, 2)
    for pid in which(helpers):
        os.kill(pid, signal.SIGKILL)
    out = proc.communicate(timeout=240)[0].decode()
    assert proc.returncode == 3, out[-3000:]  # recorded, incomplete: the dead helpers' problems are errors
    return args, _cell(cwd)


@pytest.mark.slow
def test_a_dead_helper_costs_only_its_problems(tmp_path: Path, apps_data_dir: Path, mlflow_template: Path):
    n = 16
    args, cell = _kill_helpers_mid_cell(tmp_path, apps_data_dir, mlflow_template, n, lambda helpers: helpers[:1])
    recs = _records(cell)
    assert len(recs) == n and len({x["key"] for x in recs}) == n
    lost = [x for x in recs if x["error"]]
    [dead] = {x["solver"] for x in lost}
    assert lost and all(f"solver process {dead}" in x["error"] for x in lost)
    assert len(lost) <= 2  # at most what the helper held (concurrency 4 over two solvers)
    assert all(x["passed"] for x in recs if not x["error"])  # the rest was solved
    later = [x for x in recs if x["completed_at"] > max(y["completed_at"] for y in lost)]
    assert later and {x["solver"] for x in later} == {"helper-1", "helper-2"} - {dead}  # by the other helper

    r = run_cli(args, tmp_path)  # the rerun retries exactly the lost problems
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert f"{len(lost)} to run ({len(lost)} retried after errors)" in r.stderr
    recs = _records(cell)
    assert len({x["key"] for x in recs}) == n and not any(x["error"] for x in recs)
    assert all(x["passed"] for x in recs)


@pytest.mark.slow
def test_when_every_preloaded_helper_dies_the_main_process_solves_the_rest(
    tmp_path: Path, apps_data_dir: Path, mlflow_template: Path
):
    """The main process has not imported the framework: it does so then, and goes on alone."""
    n = 12
    _, cell = _kill_helpers_mid_cell(tmp_path, apps_data_dir, mlflow_template, n, lambda helpers: helpers)
    recs = _records(cell)
    assert len(recs) == n and len({x["key"] for x in recs}) == n
    lost = [x for x in recs if x["error"]]
    # what the helpers held, plus what was handed to the second in the instant before its
    # death was noticed; every other problem is solved
    assert 1 <= len(lost) < n - 2 and all("solver process helper-" in x["error"] for x in lost)
    assert all(x["passed"] for x in recs if not x["error"])
    later = [x for x in recs if x["completed_at"] > max(y["completed_at"] for y in lost)]
    assert later and {x["solver"] for x in later} == {"main"}


@pytest.mark.slow
def test_helpers_die_with_a_killed_cell(tmp_path: Path, apps_data_dir: Path, mlflow_template: Path):
    args = [*_two_process_cell(apps_data_dir, 12), "model.latency_ms=700"]
    fresh_store(mlflow_template, tmp_path / "outputs" / "mlflow.db")
    proc = _start(args, tmp_path)
    preloader, helpers = _wait_for_helpers(proc.pid, 2)
    _wait_for_records(proc, tmp_path, 1)
    os.kill(proc.pid, signal.SIGKILL)  # only the main process: no solver process may outlive it
    proc.wait(timeout=30)
    proc.stdout.close()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(_running(p) for p in (preloader, *helpers)):
        time.sleep(0.05)
    alive = [p for p in (preloader, *helpers) if _running(p)]
    os.killpg(proc.pid, signal.SIGKILL)  # clean up the rest of the group (sandbox, MLflow helper)
    assert not alive, f"solver processes {alive} outlived their killed cell (preloader {preloader})"


@pytest.mark.slow
def test_ctrl_c_stops_the_cell_keeps_its_records_and_the_rerun_resumes(tmp_path: Path, apps_data_dir: Path, mlflow_template: Path):
    n = 12
    args = _two_process_cell(apps_data_dir, n)
    fresh_store(mlflow_template, tmp_path / "outputs" / "mlflow.db")
    proc = _start([*args, "model.latency_ms=700"], tmp_path, ctrl_c=True)
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
